"""How lake tables are partitioned (the ``partition_by`` setting): per source table name or pattern, a list of
partition fields, each a column name (its values partition the table) or, for Iceberg tables, a transform of one:
``years(c)``, ``months(c)``, ``days(c)``, ``hours(c)``, ``bucket(N, c)`` (Iceberg's hidden partitioning; Delta
partitions by column values only). Iceberg's ``truncate(N, c)`` is not offered: Spark's DataFrame writer, which
creates a lake table with its first rows, cannot declare it.

A table gets its partitioning when cdclake creates it; an existing table keeps the one it has (a change would
rewrite every file). cdclake's rewrites (a dropped, renamed or retyped column) keep it, under a renamed column's new
name, without a dropped column's fields. Partitioning changes where rows are stored, not how cdclake finds them:
its MERGEs match rows by key, so an update that moves a row to another partition and a delete that carries only
the key apply as on any table.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from pyspark.sql import Column, DataFrameWriterV2
from pyspark.sql import functions as F

from cdclake.exceptions import ConfigError
from cdclake.model import quote

Transform = Literal["identity", "years", "months", "days", "hours", "bucket"]

_TIMESTAMPS: Final = ("timestamp", "timestamp_ntz")
_TIME_TRANSFORMS: Final = ("years", "months", "days", "hours")

_FIELD: Final = re.compile(
    r"""\s*(?:
        (?P<time>years|months|days|hours)\s*\(\s*(?P<time_column>[^(),]+?)\s*\)
      | (?P<width_transform>bucket)\s*\(\s*(?P<width>\d+)\s*,\s*(?P<width_column>[^(),]+?)\s*\)
      | (?P<column>[^(),]+?)
    )\s*""",
    re.VERBOSE | re.IGNORECASE,
)

_ICEBERG_TRANSFORMS: Final = {"year": "years", "month": "months", "day": "days", "hour": "hours"}
"""Iceberg's names of its time transforms (``PartitionSpec`` fields) -> the ``partition_by`` spelling."""


@dataclass(frozen=True)
class PartitionField:
    """One partition field: ``transform`` of ``column`` (``width``: the number of buckets of ``bucket``)."""

    column: str
    transform: Transform = "identity"
    width: int | None = None

    def __str__(self) -> str:
        return self.sql(lambda column: column)

    def sql(self, quote: Callable[[str], str]) -> str:
        """The field in Spark SQL's ``PARTITIONED BY`` clause (the setting's spelling), the column quoted with
        ``quote``."""
        if self.transform == "identity":
            return quote(self.column)
        if self.width is not None:
            return f"{self.transform}({self.width}, {quote(self.column)})"
        return f"{self.transform}({quote(self.column)})"

    def writer_column(self) -> Column:
        """The field as a column of ``DataFrameWriterV2.partitionedBy``.

        Spark turns the column back into text and parses that as an identifier, quoting it only when it holds a dot
        (``UnresolvedAttribute.name``): ``Order Date`` or ``price(usd)`` fails to parse (PARSE_SYNTAX_ERROR). Such a
        name is handed over quoted twice, so that the text Spark parses is the name quoted once."""
        name = self.column
        needs_quotes = "." not in name and re.search(r"[^A-Za-z0-9_]", name) is not None
        column = F.col(quote(quote(name)) if needs_quotes else quote(name))
        if self.transform == "identity":
            return column
        if self.transform == "bucket":
            assert self.width is not None
            return F.partitioning.bucket(self.width, column)
        return getattr(F.partitioning, self.transform)(column)  # type: ignore[no-any-return]

    def problem_with(self, spark_type: str, table_format: str) -> str | None:
        """Why this field cannot partition a ``table_format`` table whose column is of ``spark_type`` (Spark's
        ``simpleString``), or None."""
        base = spark_type.split("(")[0].split("<")[0].lower()
        if base in ("array", "map", "struct"):
            return f"{self.column} is of type {spark_type}, which cannot partition a table"
        if table_format != "iceberg" or self.transform == "identity":
            return None
        if self.transform in ("years", "months", "days") and base not in (*_TIMESTAMPS, "date"):
            return f"{self} needs a date or timestamp column, and {self.column} is {spark_type}"
        if self.transform == "hours" and base not in _TIMESTAMPS:
            return f"{self} needs a timestamp column, and {self.column} is {spark_type}"
        if self.transform == "bucket" and base in ("boolean", "float", "double"):
            return f"Iceberg does not bucket {spark_type} values ({self})"
        return None

    def renamed(self, column: str) -> PartitionField:
        return PartitionField(column, self.transform, self.width)


Partitioning = tuple[PartitionField, ...]
"""A table's partition fields, in order; empty for an unpartitioned table."""

PartitionBy = Mapping[str, Sequence[str]]
"""The ``partition_by`` setting: table name or pattern (as in cdclake.tables.PerTable) -> partition fields (text)."""


def parse_field(text: str) -> PartitionField | None:
    """The partition field that ``text`` names (``region``, ``days(created_at)``, ``bucket(16, id)``), or None."""
    found = _FIELD.fullmatch(text)
    if found is None or not text.strip():
        return None
    if found["time"]:
        return PartitionField(found["time_column"], found["time"].lower())  # type: ignore[arg-type]
    if found["width_transform"]:
        width = int(found["width"])
        if width < 1:
            return None
        return PartitionField(found["width_column"], found["width_transform"].lower(), width)  # type: ignore[arg-type]
    return PartitionField(found["column"])


def from_iceberg(transform: str, column: str) -> PartitionField | None:
    """The field of an Iceberg ``PartitionSpec`` field (``transform().toString()``: ``identity``, ``day``,
    ``bucket[16]``...) of source column ``column``; None for one that cdclake does not write (``void``, ``truncate[N]``
    of a table partitioned by hand)."""
    if transform == "identity":
        return PartitionField(column)
    if transform in _ICEBERG_TRANSFORMS:
        return PartitionField(column, _ICEBERG_TRANSFORMS[transform])  # type: ignore[arg-type]
    found = re.fullmatch(r"bucket\[(\d+)\]", transform)
    if found is None:
        return None
    return PartitionField(column, "bucket", int(found[1]))


def check_partition_by(partition_by: PartitionBy, table_format: str) -> dict[str, Partitioning]:
    """The ``partition_by`` setting parsed; raises :class:`ConfigError` naming the entry for a field that is not a
    column or a transform of one, a column listed twice, or a transform ``table_format`` cannot partition by."""
    parsed: dict[str, Partitioning] = {}
    for pattern, fields in partition_by.items():
        location = f"partition_by.{pattern}"
        if isinstance(fields, str) or not fields:
            raise ConfigError(location, "expected a list of columns", 'e.g. `partition_by: {"shop.orders": [region]}`')
        table: list[PartitionField] = []
        for text in fields:
            field = parse_field(text)
            if field is None:
                raise ConfigError(
                    location,
                    f"{text!r} is not a partition field",
                    "name a column (`region`), or for Iceberg a transform of one: years(c), months(c), days(c), "
                    "hours(c), bucket(N, c)",
                )
            if field.column.lower().startswith("_cdc_"):
                raise ConfigError(
                    location,
                    f"{field.column} is one of cdclake's own columns, which change with every write of a row",
                    "partition by a source column",
                )
            if table_format != "iceberg" and field.transform != "identity":
                raise ConfigError(
                    location,
                    f"{field} is an Iceberg transform: Delta tables are partitioned by column values",
                    "name a column whose values partition the table (e.g. a date column), or use "
                    "`table_format: iceberg`",
                )
            if any(str(f).lower() == str(field).lower() for f in table):
                raise ConfigError(location, f"{field} is listed twice", "list each partition field once")
            if field.transform in _TIME_TRANSFORMS and any(
                f.transform in _TIME_TRANSFORMS and f.column.lower() == field.column.lower() for f in table
            ):
                raise ConfigError(
                    location,
                    f"{field.column} has two time transforms (Iceberg refuses such redundant fields)",
                    "keep one of them",
                )
            table.append(field)
        parsed[pattern] = tuple(table)
    return parsed


def on_columns(
    partitioning: Partitioning, columns: Sequence[str], renamed: Mapping[str, str] | None = None
) -> Partitioning:
    """The fields of ``partitioning`` that a table with user columns ``columns`` can have, each column spelt as
    ``columns`` spell it: a ``renamed`` column's (old -> new name) under its new name, none of a column that is
    not there (a rewrite that drops it)."""
    present = {name.lower(): name for name in columns}
    moved = {old.lower(): new for old, new in (renamed or {}).items()}
    kept = []
    for field in partitioning:
        name = moved.get(field.column.lower(), field.column)
        if name.lower() in present:
            kept.append(field.renamed(present[name.lower()]))
    return tuple(kept)


def fitting(partitioning: Partitioning, types: Mapping[str, str], table_format: str) -> tuple[Partitioning, list[str]]:
    """The fields of ``partitioning`` that take their column's type in ``types`` (lower-cased column name -> Spark's
    ``simpleString``) in ``table_format`` (:meth:`PartitionField.problem_with`), and why each other one does not."""
    fit: list[PartitionField] = []
    problems: list[str] = []
    for field in partitioning:
        problem = field.problem_with(types[field.column.lower()], table_format)
        if problem is None:
            fit.append(field)
        else:
            problems.append(problem)
    return tuple(fit), problems


def missing_columns(partitioning: Partitioning, columns: Sequence[str]) -> list[str]:
    """The partition columns of ``partitioning`` that are not among ``columns`` (in any case)."""
    present = {name.lower() for name in columns}
    return [field.column for field in partitioning if field.column.lower() not in present]


def described(partitioning: Partitioning) -> str:
    """``partitioning`` as a reader of a log line or report sees it: ``(region, days(created_at))``."""
    return "(" + ", ".join(str(field) for field in partitioning) + ")" if partitioning else "(none)"


def partitioned(writer: DataFrameWriterV2, partitioning: Partitioning) -> DataFrameWriterV2:
    """``writer`` (a ``DataFrameWriterV2`` that creates or replaces a table) partitioned by ``partitioning``; as it is
    without fields."""
    return writer.partitionedBy(*(field.writer_column() for field in partitioning)) if partitioning else writer
