"""A lake table's own CHECK constraints, checked on the change events before they reach the table. Sink-agnostic.

The lake's owner may add CHECK constraints to a lake table (Delta: ``ALTER TABLE t ADD CONSTRAINT name CHECK
(condition)``). The table format enforces them on every write: a single row that does not meet one fails the whole
MERGE, so the whole batch, and again after every restart. cdclake therefore evaluates each condition on the row
events' after images first (:func:`violation_reason`); an event whose row would not meet it goes to the dead letters
with the constraint named, and the rest of the batch lands. As Delta does, a condition that evaluates to NULL is not
met. What an image cannot settle (a partial image keeps stored values; a condition over cdclake's own columns) is
checked on the rows a MERGE would write (:func:`unmet_on_rows`, over the sink's ``rows_written``).

Conditions come from the lake table, not from a message: they are the owner's Spark SQL. cdclake only rewrites
their column references (:func:`condition_on_image`) so that they read the event's after image, typed as the table
column; sqlglot does the rewriting, so names are quoted by its Spark generator.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Final

import sqlglot
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType
from sqlglot import exp
from sqlglot.errors import SqlglotError

from cdclake import model


def columns_used(condition: str, table_columns: Sequence[tuple[str, str]]) -> list[str]:
    """The table columns (their lake spelling) that ``condition`` reads. A condition sqlglot cannot parse reads, for
    safety, every column whose name occurs in its text as a word."""
    by_lower = {name.lower(): name for name, _ in table_columns}
    try:
        tree = sqlglot.parse_one(condition, read="spark")
    except SqlglotError:
        words = {word.lower() for word in re.findall(r"\w+", condition)}
        return [name for name, _ in table_columns if name.lower() in words]
    used = {by_lower[column.name.lower()] for column in tree.find_all(exp.Column) if column.name.lower() in by_lower}
    return [name for name, _ in table_columns if name in used]


def _typed_after_value(name: str, spark_type: str) -> exp.Expr:
    """Spark SQL for the event's after-image value of column ``name`` as ``spark_type``: the text form of
    :func:`cdclake.model.typed_value`."""
    text = f"`{model.AFTER}`[{exp.Literal.string(name).sql(dialect='spark')}]"
    if spark_type == "binary":
        sql = f"TRY_TO_BINARY({text}, 'base64')"
    elif spark_type == "timestamp":
        sql = f"TIMESTAMP_MICROS(TRY_CAST({text} AS BIGINT))"
    else:
        sql = f"TRY_CAST({text} AS {spark_type})"
    return sqlglot.parse_one(sql, read="spark")


def condition_on_image(condition: str, table_columns: Sequence[tuple[str, str]]) -> str | None:
    """``condition`` with every column reference replaced by the event's after-image value of that column, typed as
    the table column; None when cdclake cannot evaluate it that way (a reference that is not a table column, a
    column type without canonical text, or text sqlglot cannot parse). Such a constraint is checked on the rows a
    MERGE would write instead (:func:`unmet_on_rows`)."""
    types = {name.lower(): (name, spark_type) for name, spark_type in table_columns}
    try:
        tree = sqlglot.parse_one(condition, read="spark")
    except SqlglotError:
        return None
    references = list(tree.find_all(exp.Column))
    if any(column.table or column.name.lower() not in types for column in references):
        return None
    if any(not model.is_supported_spark_type(types[column.name.lower()][1]) for column in references):
        return None

    def on_image(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column):
            return _typed_after_value(*types[node.name.lower()])
        return node

    return tree.transform(on_image).sql(dialect="spark")


NOT_NULL_PREFIX: Final = "NOT NULL "
"""How the checks name a lake table column's NOT NULL (``NOT NULL <column>``): a column that may not hold NULL is
checked as the condition ``<column> IS NOT NULL``."""

LENGTH_PREFIX: Final = "TYPE "
"""How the checks name the length limit of a ``CHAR(n)``/``VARCHAR(n)`` column (``TYPE varchar(n) <column>``):
checked as Delta's invariant on a MERGE is, ``<column> IS NULL OR length(<column>) <= n`` (trailing blanks count). A
CHECK constraint's name has no blank, so none of these clash with one."""

_CHAR_VARCHAR: Final = "__CHAR_VARCHAR_TYPE_STRING"
"""The metadata key under which Spark keeps a STRING column's declared ``char(n)``/``varchar(n)``."""


def declared_checks(schema: StructType, skipped: Collection[str] = ()) -> dict[str, str]:
    """What the columns of a lake table's ``schema`` (but ``skipped``: cdclake's own) declare that a write checks,
    as checks (name -> condition): NOT NULL (:data:`NOT_NULL_PREFIX`) and the length of ``char(n)``/``varchar(n)``
    (:data:`LENGTH_PREFIX`). A table made by hand before the first run may have them (cdclake creates nullable
    STRING columns), and Delta or Iceberg refuse the whole MERGE that writes one value breaking them."""
    checks: dict[str, str] = {}
    for field in schema.fields:
        if field.name in skipped:
            continue
        column = model.quote(field.name)
        if not field.nullable:
            checks[f"{NOT_NULL_PREFIX}{field.name}"] = f"{column} IS NOT NULL"
        declared = str(field.metadata.get(_CHAR_VARCHAR, ""))
        if limit := re.fullmatch(r"(?:var)?char\((\d+)\)", declared.lower()):
            checks[f"{LENGTH_PREFIX}{declared} {field.name}"] = f"{column} IS NULL OR length({column}) <= {limit[1]}"
    return checks


def _named(name: str, condition: str) -> tuple[str, str]:
    """What a check ``name`` (a CHECK constraint's, or one of :func:`declared_checks`) is, for a dead letter's reason,
    and how its owner changes it."""
    if name.startswith(NOT_NULL_PREFIX):
        column = name.removeprefix(NOT_NULL_PREFIX)
        return (
            f"the NOT NULL of column {column}",
            f"allow NULL in the column (ALTER TABLE ... ALTER COLUMN {column} DROP NOT NULL)",
        )
    if name.startswith(LENGTH_PREFIX):
        declared, column = name.removeprefix(LENGTH_PREFIX).split(" ", 1)
        return (
            f"the {declared} type of column {column}",
            f"widen the column (ALTER TABLE ... ALTER COLUMN {column} TYPE STRING)",
        )
    return f"CHECK constraint {name} ({condition})", f"change the constraint (ALTER TABLE ... DROP CONSTRAINT {name})"


def violation_reason(
    constraints: Mapping[str, str],
    table_columns: Sequence[tuple[str, str]],
    table: str,
    events: DataFrame,
    defaulted: Collection[str] = (),
) -> tuple[Column | None, list[str]]:
    """Per event of ``events`` of one table: why its row would not meet one of the table's CHECK ``constraints``
    (name -> condition), null when it meets them all or carries no row to check; and the names of the constraints
    that cannot be checked here (:func:`condition_on_image`, or a rewritten condition Spark does not accept over
    ``events``).

    Only events with an after image are checked (inserts, updates, snapshot rows): a delete writes no row. A partial
    image that lacks a column the condition reads is not checked here: the row keeps that column's stored value, which
    the event does not carry (:func:`unmet_on_rows` checks the row). Nor is an image that lacks one of the
    ``defaulted`` columns (with a DEFAULT, which the MERGE then fills in) that the condition reads: such a
    constraint is also returned as unchecked, so that the rows are checked.
    """
    after = F.col(model.AFTER)
    with_row = F.col(model.OP).isin(model.Op.INSERT.value, model.Op.UPDATE.value, model.Op.UPSERT.value)
    with_row = with_row & after.isNotNull()
    reason: Column | None = None
    unchecked: list[str] = []
    for name, condition in sorted(constraints.items()):
        on_image = condition_on_image(condition, table_columns)
        met = None if on_image is None else _accepted(on_image, events)
        if met is None:
            unchecked.append(name)
            continue
        used = columns_used(condition, table_columns)
        has_all: Column = F.lit(True)
        for column in used:
            has_all = has_all & F.map_contains_key(after, F.lit(column))
        checked = with_row & (~F.coalesce(F.col(model.AFTER_IS_PARTIAL), F.lit(False)) | has_all)
        if reads_default := [column for column in used if column in defaulted]:
            # An image without the column gets its DEFAULT or keeps the stored value: checked on the rows.
            for column in reads_default:
                checked = checked & F.map_contains_key(after, F.lit(column))
            unchecked.append(name)
        not_met = checked & ~F.coalesce(met, F.lit(False))
        what, change = _named(name, condition)
        message = F.lit(
            f"the row does not meet {what} of lake table {table}: correct it at the source, or {change}, then replay "
            "this dead letter"
        )
        reason = F.when(not_met, message) if reason is None else reason.when(not_met, message)
    return reason, unchecked


def unmet_on_rows(constraints: Mapping[str, str], rows: DataFrame) -> tuple[Column | None, list[str]]:
    """Per row of ``rows`` (rows as a write would leave them in the lake table, with its columns: the sink's
    ``rows_written``): the name of the first of the table's CHECK ``constraints`` (name -> condition, by name) that
    it does not meet, null when it meets them all; and the names of the constraints Spark does not accept over
    ``rows`` (left to the table format). The conditions are evaluated as the owner wrote them, so this also checks
    what :func:`violation_reason` cannot: the stored values a partial image keeps, and cdclake's own columns."""
    first_unmet: Column | None = None
    unchecked: list[str] = []
    for name, condition in sorted(constraints.items()):
        met = _accepted(condition, rows)
        if met is None:
            unchecked.append(name)
            continue
        not_met = ~F.coalesce(met, F.lit(False))
        first_unmet = F.when(not_met, F.lit(name)) if first_unmet is None else first_unmet.when(not_met, F.lit(name))
    return first_unmet, unchecked


def row_not_met(name: str, condition: str, table: str) -> str:
    """The dead letters' reason for the events of a key whose row, as written (:func:`unmet_on_rows`), would not
    meet CHECK constraint ``name``."""
    what, change = _named(name, condition)
    return (
        f"the row that the batch's changes of this key write (the stored row with them applied) does not meet {what} "
        f"of lake table {table}: correct it at the source, or {change}, then replay these dead letters"
    )


def _accepted(condition: str, events: DataFrame) -> Column | None:
    """``condition`` as a boolean column over ``events``, or None when Spark does not accept it there (sqlglot wrote
    something Spark parses otherwise): analysed once on the driver, so that it cannot fail the batch."""
    try:
        met = F.expr(condition)
        events.select(met.alias("met")).schema  # noqa: B018 - analyses the expression, runs nothing
    except (AnalysisException, ParseException):
        return None
    return met
