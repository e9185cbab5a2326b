"""From canonical events to one final change per row key: the sink-agnostic half of applying a batch.

Steps, all Spark SQL:

1. :func:`row_changes` turns each row event into keyed changes: ``UPSERT`` (insert or replace, possibly a partial
   image) or ``DELETE``. An UPDATE whose key changed becomes a DELETE of the old key and an UPSERT of the new one.
   The first half of a split update (DataWorks ``UPDATE_BEFOR``: before image only) retires its key, ordered just
   before the second half at the same source position, so that the pair, in one batch or across two, ends as the
   after image; a late duplicate of such a half never deletes the row, because the row's recorded order is the
   second half's.
2. :func:`fold` reduces all changes of a key in a batch, in order, to one change: the last full image or delete,
   with later partial images overlaid column by column (columns absent from a partial image keep their value).
3. The sink then gates each folded change against the row's recorded order and the key's tombstone, so that
   replays and re-sent older messages never regress a row, and applies it in one MERGE per table.

Ordering: ``order`` is the canonical position (or the Kafka fallback, see :func:`cdclake.model.kafka_position`)
followed by ``/0`` for a split update's first half and ``/1`` otherwise. Equal orders are broken by Kafka
partition, offset and position inside the message.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from cdclake import model
from cdclake.model import Op
from cdclake.tables import PerTable, Value, glob_regex, is_pattern

log = logging.getLogger(__name__)

TABLE_ID: Final = "table_id"
"""Identity of a target table inside one batch: ``database``/``schema``/``table`` joined by ``\\x1f``."""
ROW_KEY: Final = "row_key"
"""The key values of a row as JSON text (a JSON array in key-column order)."""
ORDER: Final = "order"
"""Sortable order of a change, see the module doc; stored in user tables as ``_cdc_position``."""
KIND: Final = "kind"
"""``UPSERT`` or ``DELETE``."""
IMAGE: Final = "image"
"""Row image of the change (canonical text); for deletes, the before image."""
PARTIAL: Final = "partial"
"""True when ``image`` lacks some columns that must keep their current values."""

MOVED_FROM: Final = "moved_from"
"""The old row key of an UPSERT that an UPDATE of the row's key made from a partial after image (else NULL): the
columns its image lacks are the old key's row's (:func:`moves_made_whole`), not the new key's."""

UPSERT: Final = "UPSERT"
DELETE: Final = "DELETE"

_SEP: Final = "\x1f"


def table_id(database: Column, schema: Column, table: Column) -> Column:
    """Batch-local identity of a source table (null parts become empty strings)."""
    return F.concat_ws(_SEP, F.coalesce(database, F.lit("")), F.coalesce(schema, F.lit("")), table)


def table_id_of(database: str | None, schema: str | None, table: str) -> str:
    """:func:`table_id` of one table, on the driver."""
    return _SEP.join(part or "" for part in (database, schema, table))


def split_table_id(value: str) -> tuple[str | None, str | None, str]:
    """Inverse of :func:`table_id` on the driver."""
    database, schema, table = value.split(_SEP, 2)
    return database or None, schema or None, table


def event_position() -> Column:
    """Each event's position: the format's, or the Kafka fallback (:func:`cdclake.model.kafka_position`)."""
    return F.coalesce(F.col(model.POSITION), model.kafka_position(F.col(model.PARTITION), F.col(model.OFFSET)))


def effective_order(events: DataFrame) -> Column:
    """The ``order`` of each event: position (or the Kafka fallback) and the split-update half."""
    position = event_position()
    first_half = (F.col(model.OP) == Op.UPDATE) & F.col(model.AFTER).isNull()
    return F.concat(position, F.when(first_half, F.lit("/0")).otherwise(F.lit("/1")))


SEQUENCE_SEPARATOR: Final = "|"
"""Between the value key and the position in the order of a row change of a ``sequence_by`` table (:func:`sequenced`).
No position holds it (they are digits, letters and ``~!#:/``); a value key may."""


NULL_SEQUENCE_KEY: Final = "\u0000"
"""The value key of a NULL in a ``sequence_by`` column (:func:`sequenced`): below the first character of every
:func:`sequence_key` (U+0001 at the lowest, of a text key), so that a NULL sorts before every value. Until December
2026 it was the empty key, and ``|position`` sorted after every value (``|`` is above digits): a change that gave
the column its first value was taken as older than the row with NULL and dropped. Such stored orders are read with
:func:`comparable_order`."""


def comparable_order(order: Column) -> Column:
    """A stored ``order`` as it compares with new ones: one written with the empty NULL key (``|position``, before
    :data:`NULL_SEQUENCE_KEY`) as a NULL's. Only orders of ``sequence_by`` row changes can start with ``|``."""
    return F.when(order.startswith(SEQUENCE_SEPARATOR), F.concat(F.lit(NULL_SEQUENCE_KEY), order)).otherwise(order)


def comparable_order_sql(order: str) -> str:
    """:func:`comparable_order` of the SQL expression ``order``, as SQL text (``char(0)`` is U+0000)."""
    return f"CASE WHEN startswith({order}, '{SEQUENCE_SEPARATOR}') THEN concat(char(0), {order}) ELSE {order} END"


def log_order(order: Column) -> Column:
    """The part of an ``order`` that places a change in the source's log: the position after the last
    :data:`SEQUENCE_SEPARATOR` of a ``sequence_by`` row change's order, any other order whole. A TRUNCATE is ordered
    by its position only, and voids what the log wrote before it, whatever the versions of the rows: its own order
    compared with a whole ``value|position`` order put a row before or after it by the row's value."""
    return F.substring_index(order, SEQUENCE_SEPARATOR, -1)


def reordered(
    order: Column, ordering: str, columns: Sequence[tuple[str, str]], value_of: Callable[[str], Column]
) -> Column:
    """A row's ``order`` in the ``ordering`` its lake table records (``cdclake.sequenceBy``: the lower-case column, or
    empty for the format's position), for rows that move into a table ordered otherwise than the one they were
    ordered in: a renamed table's rows (``RENAME TABLE``, as an online schema change's cut-over makes the copy table
    the table), and the versions that start there in the new name's SCD2 table. Left as they were, such orders
    compared as text with the other ordering's: the next change of a moved row was dropped as older, or an older
    one applied, without a word.

    For the format's position: the log part of the order alone (:func:`log_order`). For a column: the key of the
    row's value (``value_of(name)``: the typed value of one of the row's ``columns``, name and Spark type; NULL's
    key when the row lacks the column), ``|`` and that log part, as :func:`sequenced` orders a change that brings
    the row."""
    position = log_order(order)
    if not ordering:
        return position
    found = next(((name, spark_type) for name, spark_type in columns if name.lower() == ordering), None)
    value, spark_type = F.lit(None).cast("string"), "string"
    if found is not None:
        value, spark_type = model.canonical_text(value_of(found[0]), found[1]), found[1]
    key = F.coalesce(sequence_key(value, F.lit(spark_type)), F.lit(NULL_SEQUENCE_KEY))
    return F.concat(key, F.lit(SEQUENCE_SEPARATOR), position)


_INTEGRAL_TYPES: Final = ("tinyint", "smallint", "int", "bigint", "timestamp")
_SEQUENCE_COLUMN: Final = "_sequence_by_column"


_RETYPED_COLUMN: Final = "_cdc_column_types"
_MARKED_COLUMN: Final = "_cdc_marked_columns"
_RETYPED_LIST: Final = "_cdc_retyped_columns"
# The text forms ``column_types`` takes (README "Formats") where model.text_is_valid takes more: Spark's cast reads
# `2024-03-01 10:15:31` as a date, `...+08:00` and a 7th fraction digit as a wall-clock time, and drops what it
# cannot hold; and integer text other than digits (` 7`, `+7`) would make another row key than `7`.
_RETYPED_FORMS: Final = {
    "date": r"^\d{4}-\d{2}-\d{2}$",
    "timestamp_ntz": r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,6})?$",
    **dict.fromkeys(("tinyint", "smallint", "int", "bigint"), r"^-?\d+$"),
}


def retyped(events: DataFrame, column_types: Mapping[str, Mapping[str, str]]) -> DataFrame:
    """Declares the columns that ``column_types`` names (table name or pattern -> column -> Spark type, see
    :class:`cdclake.tables.PerTable`; column names compared case-insensitively) with that type in each row event of
    their table, for the formats whose messages do not carry it (DTS Canal JSON and DRS JSON spell DECIMAL bare, and
    SharePlex and Oracle sources carry text only).

    A value that is not valid canonical text of its new type (:func:`cdclake.model.text_is_valid`, and the strict
    forms of :data:`_RETYPED_FORMS`) makes its event a dead letter that names the setting, as a format's own type
    does: never a NULL, a rounded or a truncated value. Events that are dead letters already keep their reason.
    ``events`` is returned as it is when nothing is configured.
    """
    if not column_types:
        return events
    entries = tuple(
        (table, tuple(sorted((column.lower(), spark_type) for column, spark_type in columns.items())))
        for table, columns in column_types.items()
    )
    is_row = F.col(model.OP).isin(*(o.value for o in model.ROW_OPS)) & F.col(model.ERROR).isNull()
    # Staged, step by step: Spark evaluates an expression again wherever it occurs, inside a lambda once per element.
    # One lambda looks each column's name up; the checks then run over the few retyped columns only.
    staged = events.withColumn(_RETYPED_COLUMN, F.when(is_row, _column_types_column(entries)))
    configured = F.col(_RETYPED_COLUMN)
    marked = F.transform(
        F.col(model.COLUMNS),
        lambda c: F.struct(
            c["name"].alias("name"),
            c["vendor_type"].alias("vendor_type"),
            F.coalesce(configured[F.lower(c["name"])], c["spark_type"]).alias("spark_type"),
            configured[F.lower(c["name"])].isNotNull().alias("retyped"),
        ),
    )
    staged = staged.withColumn(_MARKED_COLUMN, F.when(configured.isNotNull(), marked))
    marked_columns = F.col(_MARKED_COLUMN)
    # The columns with their new types: the marked ones' fields zipped back (generated code, not a lambda).
    declared = F.arrays_zip(marked_columns["name"], marked_columns["vendor_type"], marked_columns["spark_type"]).cast(
        f"array<{model.COLUMN_TYPE.simpleString()}>"
    )
    staged = staged.select(
        *(
            F.coalesce(declared, F.col(model.COLUMNS)).alias(c) if c == model.COLUMNS else F.col(c)
            for c in events.columns
        ),
        F.filter(marked_columns, lambda c: c["retyped"]).alias(_RETYPED_LIST),
    )
    retyped_list = F.col(_RETYPED_LIST)

    def fits(text: Column, spark_type: Column) -> Column:
        form: Column | None = None
        for name, pattern in _RETYPED_FORMS.items():
            matches = text.rlike(pattern)
            form = F.when(spark_type == name, matches) if form is None else form.when(spark_type == name, matches)
        assert form is not None
        return model.text_is_valid(text, spark_type) & F.coalesce(form.otherwise(F.lit(True)), F.lit(True))

    def misfits_of(image_name: str) -> Column:
        image = F.col(image_name)
        return F.filter(retyped_list, lambda c: ~fits(image[c["name"]], c["spark_type"]))

    misfit_columns = {image: f"_cdc_misfits_{image}" for image in (model.AFTER, model.BEFORE)}
    staged = staged.select("*", *(misfits_of(image).alias(column) for image, column in misfit_columns.items()))

    def first_misfit(image_name: str) -> Column:
        misfits = F.col(misfit_columns[image_name])
        bad = misfits[0]
        return F.when(
            F.size(misfits) > 0,
            F.format_string(
                f"{image_name} value %s of column %s is not a valid %s (column_types; declared %s)",
                F.substring(F.col(image_name)[bad["name"]], 1, 80),
                bad["name"],
                bad["spark_type"],
                bad["vendor_type"],
            ),
        )

    error = F.coalesce(F.col(model.ERROR), first_misfit(model.AFTER), first_misfit(model.BEFORE))
    checked = [error.alias(c) if c == model.ERROR else F.col(c) for c in events.columns]
    scales = sorted({s for _, columns in entries for _, t in columns if (s := model.decimal_scale(t)) is not None})
    if not scales:
        return staged.select(*checked)
    column_scales = F.map_from_entries(
        F.transform(
            F.filter(retyped_list, lambda c: c["spark_type"].startswith("decimal(")),
            lambda c: F.struct(c["name"], model.decimal_parameters(c["spark_type"])[1]),
        )
    )
    staged = staged.select(*checked, column_scales.alias(_DECIMAL_SCALES))
    respelt = {image: _decimals_respelt(F.col(image), scales).alias(image) for image in (model.AFTER, model.BEFORE)}
    return staged.select(*(respelt.get(c, F.col(c)) for c in events.columns))


_DECIMAL_SCALES: Final = "_cdc_decimal_scales"


def _decimals_respelt(image: Column, scales_configured: Sequence[int]) -> Column:
    """The image with each value of a column that ``column_types`` made a decimal in its canonical text, ``1.50`` for
    ``1.5`` and ``1.500`` in ``decimal(12,2)``, as a format that declares the type sends it. A key column's text is
    the row key (:func:`key_of`): two spellings of one value were two keys of one row, two source rows matching one
    lake row in the MERGE. Only the retyped columns of valid events are touched, and their values already fit the
    type exactly, so the cast to ``decimal(38, scale)`` changes the spelling only (one branch per scale that
    ``scales_configured`` holds)."""
    scales = F.col(_DECIMAL_SCALES)

    def respelt(value: Column, scale: Column) -> Column:
        spelt: Column | None = None
        for digits in scales_configured:
            text = value.try_cast(f"decimal(38,{digits})").cast("string")
            spelt = F.when(scale == digits, text) if spelt is None else spelt.when(scale == digits, text)
        assert spelt is not None
        return F.coalesce(spelt, value)

    return F.when(
        (F.size(scales) > 0) & F.col(model.ERROR).isNull() & image.isNotNull(),
        F.transform_values(
            image, lambda name, value: F.when(scales[name].isNull(), value).otherwise(respelt(value, scales[name]))
        ),
    ).otherwise(image)


@functools.cache
def _column_types_column(entries: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]) -> Column:
    def type_map(columns: tuple[tuple[str, str], ...]) -> Column:
        return F.create_map(*(F.lit(part) for pair in columns for part in pair))

    return per_table(PerTable(entries), type_map, F.lit(None).cast("map<string,string>"))


def sequenced(events: DataFrame, sequence_by: Mapping[str, str]) -> DataFrame:
    """Replaces the ordering position of row events of the listed tables by a user-chosen column (``sequence_by``:
    table name or pattern -> column name, see :class:`cdclake.tables.PerTable`), with the format's position (or
    the Kafka fallback) after it to break ties.

    The column's value is taken from the after image (the before image for deletes, and for updates whose partial
    after image lacks it), by its name in any case: the
    messages of a table may spell it otherwise than the setting or than each other (the lake keeps one column).
    An event whose value is NULL sorts before every event with a value. The value becomes text whose order is the
    value's (:func:`sequence_key`; :data:`NULL_SEQUENCE_KEY` for NULL), then ``|`` and the position.
    """
    if not sequence_by:
        return events
    # Staged: the column name is read inside a lambda below, which Spark evaluates again for each element.
    events = events.withColumn(_SEQUENCE_COLUMN, _sequence_by_column(tuple(sequence_by.items())))
    column = F.lower(F.col(_SEQUENCE_COLUMN))
    after, before = _images_by_lower_name()
    # A partial after image without the column left it unchanged: the before image has its value, if any (the
    # pipeline makes dead letters of the changes that carry it nowhere: unordered_change).
    value = F.when(F.map_contains_key(after, column), after[column]).otherwise(before[column])
    declared = F.get(F.filter(F.col(model.COLUMNS), lambda c: F.lower(c["name"]) == column), 0)["spark_type"]
    key = sequence_key(value, declared)
    base = event_position()
    rows = F.col(model.OP).isin(*(o.value for o in model.ROW_OPS)) & column.isNotNull()
    return events.withColumn(
        model.POSITION,
        F.when(rows, F.concat(F.coalesce(key, F.lit(NULL_SEQUENCE_KEY)), F.lit(SEQUENCE_SEPARATOR), base)).otherwise(
            base
        ),
    ).drop(_SEQUENCE_COLUMN)


def unordered_change(in_after: Column, in_before: Column) -> Column:
    """Whether a row event lacks its table's ``sequence_by`` column where :func:`sequenced` reads it, given whether
    its after and before images have the column (null: no such image): a DELETE whose before image does not have
    it, or an UPDATE whose partial after image and before image (if any) do not. Its order would be a NULL's, before
    every stored version, so the MERGE would pass it over as old: an OGG table's every delete by default
    (maxwell-ogg.md section 2, "Compressed updates/deletes": key columns only). The pipeline makes it a dead letter.
    An image that is whole and lacks the column says the value is NULL (formats that leave NULL cells out)."""
    op, after = F.col(model.OP), F.col(model.AFTER)
    in_after, in_before = F.coalesce(in_after, F.lit(False)), F.coalesce(in_before, F.lit(False))
    partial = F.coalesce(F.col(model.AFTER_IS_PARTIAL), F.lit(False))
    return ((op == Op.DELETE.value) & ~in_before) | (
        (op == Op.UPDATE.value) & after.isNotNull() & partial & ~in_after & ~in_before
    )


def carries_sequence_column(sequence_by: Mapping[str, str]) -> tuple[Column, Column]:
    """Whether each event's after and before images have its table's ``sequence_by`` column, in any case, as
    :func:`sequenced` reads it (null where the image or the setting is; for :func:`unordered_change`)."""
    column = F.lower(_sequence_by_column(tuple(sequence_by.items())))
    after, before = (F.map_contains_key(image, column) for image in _images_by_lower_name())
    return after, before


def _images_by_lower_name() -> tuple[Column, Column]:
    """The after and before images with their column names lower-cased: the ``sequence_by`` column is matched in
    any case (:func:`sequenced` and :func:`carries_sequence_column` must find the same one)."""
    after, before = (F.transform_keys(F.col(image), lambda k, _v: F.lower(k)) for image in (model.AFTER, model.BEFORE))
    return after, before


def sequence_key(value: Column, spark_type: Column) -> Column:
    """Text whose order (Spark's, by UTF-8 bytes) is the order of the canonical ``value`` of ``spark_type``, and of
    which no key is a prefix of another, so that text appended after it (``sequenced``: ``|`` and the position)
    only breaks ties. Null for NULL.

    * Integers and timestamps (microseconds): shifted by 10^20 and zero-padded to 24 digits, so negative values
      sort too.
    * Decimals, floats and doubles: :func:`_number_key`. As text, ``9`` sorted after ``10`` (a MySQL ``BIGINT
      UNSIGNED`` version column is ``decimal(20,0)``) and ``-2`` after ``-1``.
    * ``timestamp_ntz``: its text with the fraction padded to six digits. ``10:00:00`` sorted after ``10:00:00.5``,
      because the ``|`` that follows it is above ``.``.
    * Dates: their text (``yyyy-MM-dd``, one width).
    * Anything else (strings, booleans, base64 binaries): :func:`_text_key`, their code point order.
    """
    shift = F.lit(str(10**20)).cast("decimal(38,0)")  # Py4J cannot pass a Python int beyond 64 bits
    integral = F.lpad((value.try_cast("decimal(38,0)") + shift).cast("string"), 24, "0")
    wall_clock = F.rpad(F.when(value.contains("."), value).otherwise(F.concat(value, F.lit("."))), 26, "0")
    return (
        F.when(spark_type.isin(*_INTEGRAL_TYPES), integral)
        .when(spark_type.isin("double", "float") | spark_type.startswith("decimal("), _number_key(value))
        .when(spark_type == "timestamp_ntz", wall_clock)
        .when(spark_type == "date", value)
        .otherwise(_text_key(value))
    )


_EXPONENT_OFFSET: Final = 10**10
"""Added to a number's decimal exponent so that it is positive and 11 digits wide for any exponent that decimal text
can spell (``model.decimal_text_fits`` allows 9 exponent digits; doubles span 10^-324 to 10^308)."""


def _number_key(text: Column) -> Column:
    """Sortable text of a decimal or floating-point value (``-12.50``, ``1.5E-7``, ``NaN``, ``-Infinity``), exact at
    any precision and exponent, as ``value * 10^k`` casts are not: ``/`` for -Infinity; ``0``, then the complemented
    exponent and digits, then ``~`` for a negative number; ``1`` for zero (``-0.0`` too); ``2``, the exponent and the
    significant digits, then ``!`` for a positive number; ``3`` for Infinity; ``4`` for NaN (Spark's own order).

    The digits, without leading and trailing zeros, are ``0.d1d2...`` times 10 to the exponent, so a larger exponent
    is a larger magnitude and, at equal exponents, the digits compare as text (``15!`` before ``151!``: ``!`` is below
    every digit). A negative number complements both (``9 - d``) and ends with ``~``, above every digit, so that its
    order is reversed."""
    double = text.try_cast("double")
    int_part = F.regexp_extract(text, r"^[+-]?(\d*)", 1)
    digits = F.concat(int_part, F.regexp_extract(text, r"^[+-]?\d*\.(\d*)", 1))
    without_leading = F.regexp_replace(digits, r"^0+", "")
    significant = F.regexp_replace(without_leading, r"0+$", "")
    exponent = (
        F.length(int_part)
        - (F.length(digits) - F.length(without_leading))
        + F.coalesce(F.regexp_extract(text, r"[eE]([+-]?\d{1,9})$", 1).try_cast("bigint"), F.lit(0))
    )
    width = len(str(_EXPONENT_OFFSET)) + 1
    positive = F.concat(F.lit("2"), F.lpad((exponent + _EXPONENT_OFFSET).cast("string"), width, "0"), significant)
    negative = F.concat(
        F.lit("0"),
        F.lpad((F.lit(_EXPONENT_OFFSET) - exponent).cast("string"), width, "0"),
        F.translate(significant, "0123456789", "9876543210"),
    )
    return (
        F.when(double.isNull(), F.lit(None).cast("string"))
        .when(F.isnan(double), F.lit("4"))
        .when(double == F.lit("Infinity").cast("double"), F.lit("3"))
        .when(double == F.lit("-Infinity").cast("double"), F.lit("/"))
        .when(significant == "", F.lit("1"))
        .when(text.startswith("-"), F.concat(negative, F.lit("~")))
        .otherwise(F.concat(positive, F.lit("!")))
    )


def _text_key(text: Column) -> Column:
    """Text in code point order that no other key starts with: the text, then U+0001. Inside it, U+0000 and U+0001
    become U+0001 followed by U+FFFE or U+FFFF, which sort above the ASCII that follows an ended key and keep
    their own order."""
    escaped = F.regexp_replace(F.regexp_replace(text, "\\x01", "\u0001\uffff"), "\\x00", "\u0001\ufffe")
    return F.concat(escaped, F.lit("\u0001"))


def key_of(image: Column, keys: Column) -> Column:
    """The row key of an image as JSON text: the key columns' values in key order, or, for a table without key
    columns (``keys`` empty), the image's non-NULL ``[column, value]`` pairs sorted by lower-cased column name.

    The key-less identity leaves NULLs out on purpose: messages of one table declare different column lists (a
    column added later, formats that omit NULL cells), and the row {a: 1, b: NULL} must be the same row whether or
    not its message declares ``b``. The sink matches such rows on every column with NULL-safe equality.
    """
    by_value = F.to_json(F.transform(keys, lambda k: image[k]))
    present = F.map_filter(F.transform_keys(image, lambda k, _v: F.lower(k)), lambda _k, v: v.isNotNull())
    whole_row = F.to_json(F.array_sort(F.map_entries(present)))
    return F.when(F.size(keys) > 0, by_value).otherwise(whole_row)


def effective_keys(events: DataFrame, configured: Mapping[str, Sequence[str]]) -> Column:
    """Key columns of each event: configured keys (table name or pattern, see :class:`cdclake.tables.PerTable`)
    win, then the message's own. An empty array means the table has no key: the whole row is its identity (see
    :func:`key_of`)."""
    return _keys_column(tuple((name, tuple(keys)) for name, keys in configured.items()))


# Built once per process and setting, as the decoders' constant expressions are (cdclake.formats.base): building a
# per-table column is two Py4J calls or more per entry and candidate name, and a batch builds its keys two or three
# times (plan, fold, history). 200 `keys` entries: 0.9 s per build. The Columns name columns only, so they belong
# to no DataFrame.
@functools.cache
def _keys_column(entries: tuple[tuple[str, tuple[str, ...]], ...]) -> Column:
    from_message = F.coalesce(F.col(model.KEY_COLUMNS), F.array().cast("array<string>"))
    return per_table(PerTable(entries), lambda keys: F.array(*(F.lit(k) for k in keys)), from_message)


@functools.cache
def _sequence_by_column(entries: tuple[tuple[str, str], ...]) -> Column:
    return per_table(PerTable(entries), F.lit, F.lit(None).cast("string"))


def _candidate_names() -> list[Column]:
    """An event's table names as a per-table setting may use them: ``table``, ``db.table`` (the schema when there
    is no database), ``schema.table``, ``db.schema.table`` (the names of :func:`cdclake.tables.table_names`, as
    columns; NULL parts make a name NULL, which matches nothing)."""
    database, schema, table = F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE)
    dot = F.lit(".")
    return [
        table,
        F.concat(F.coalesce(database, schema), dot, table),
        F.concat(schema, dot, table),
        F.concat(database, dot, schema, dot, table),
    ]


def _matches_pattern(pattern: str, candidates: Sequence[Column]) -> Column:
    """Whether one of an event's ``candidates`` (:func:`_candidate_names`) matches the table ``pattern`` whole."""
    # rlike finds a match anywhere: anchored at both ends of the input (\z: not before a final line break).
    regex = f"(?s)\\A(?:{glob_regex(pattern)})\\z"
    result = candidates[0].rlike(regex)
    for candidate in candidates[1:]:
        result = result | candidate.rlike(regex)
    return F.coalesce(result, F.lit(False))


def per_table(setting: PerTable[Value], value: Callable[[Value], Column], otherwise: Column) -> Column:
    """Each event's value of a per-table setting (the most specific matching entry's, as
    :meth:`cdclake.tables.PerTable.value_for` picks on the driver), else ``otherwise``.

    The entries' ranks (:attr:`~cdclake.tables.PerTable.ranked`, the winner first) decide: the names without
    wildcards are looked up in one map literal, name -> rank, once per candidate name of the event, and the lowest
    rank found wins (ranks put more name parts first, then listing order); only when none is found are the patterns
    tried, in rank order. Before, every entry was a test of the four candidate names in one CASE chain, whose cost
    per event grew with the entries (python -m benchmarks.shards' capture, 40,000 messages of 16 routed shards in 4
    batches, 2 cores, warm repeats: 10.7-13.3 s without ``keys``; with the 16 shard names in ``keys`` 13.9-16.6 s
    before, 11.0-13.3 s now; with 200 names 68 s before, 14-16 s now, the build cached as well, see
    :func:`_keys_column`).
    """
    ranked = setting.ranked
    if not ranked:
        return otherwise
    ranks: dict[str, int] = {}
    for rank, (name, _entry) in enumerate(ranked):
        if not is_pattern(name):
            ranks.setdefault(name, rank)  # of two entries of one name, the first ranked wins
    candidates = _candidate_names()
    rank_of: Column = F.lit(None).cast("int")
    if ranks:
        lookup = F.create_map(*(part for name, rank in ranks.items() for part in (F.lit(name), F.lit(rank))))
        found = [lookup[candidate] for candidate in candidates]
        rank_of = F.least(*found)
    patterns = [(rank, name) for rank, (name, _entry) in enumerate(ranked) if is_pattern(name)]
    if patterns:
        by_pattern: Column = F.lit(None).cast("int")
        for rank, name in reversed(patterns):
            by_pattern = F.when(_matches_pattern(name, candidates), F.lit(rank)).otherwise(by_pattern)
        rank_of = F.coalesce(rank_of, by_pattern)
    values = F.array(*(value(entry) for _name, entry in ranked))
    return F.when(rank_of.isNotNull(), values[rank_of]).otherwise(otherwise)


def row_changes(events: DataFrame, configured_keys: Mapping[str, Sequence[str]] | None = None) -> DataFrame:
    """Row events (INSERT, UPDATE, DELETE, UPSERT) -> keyed changes.

    Output columns: table_id, row_key, kind, image, partial, order, partition, offset, sub_index, event_time,
    key_columns, moved_from.
    """
    keys = effective_keys(events, configured_keys or {})
    before, after = F.col(model.BEFORE), F.col(model.AFTER)
    op = F.col(model.OP)
    key_before, key_after = key_of(before, keys), key_of(after, keys)
    key_changed = key_before != key_after
    if configured_keys:
        # A before image without a value of a configured key column cannot name the old row (a Debezium key change
        # carries the source key's columns only): the update is applied to the row its after image keys, and no
        # DELETE of a NULL key is made up (plan_tables counts those that changed the source's key; the pipeline warns).
        key_changed &= ~lacks_key_value(keys, before)
    delete_old_key = F.when(
        (op == Op.DELETE) | ((op == Op.UPDATE) & before.isNotNull() & (after.isNull() | key_changed)),
        F.struct(
            F.lit(DELETE).alias(KIND),
            key_before.alias(ROW_KEY),
            before.alias(IMAGE),
            F.lit(False).alias(PARTIAL),
            F.lit(0).alias("half"),
        ),
    )
    after_is_partial = F.coalesce(F.col(model.AFTER_IS_PARTIAL), F.lit(False))
    # A partial after image of an UPDATE that changed the key lacks columns the row keeps; the row that holds them is
    # the old key's, which the DELETE above retires. The before image gives what it has of them here, the old key's
    # row in the batch or the lake the rest (moves_made_whole).
    moved_partial = (op == Op.UPDATE) & after_is_partial & before.isNotNull() & key_changed
    upsert_new = F.when(
        op.isin(Op.INSERT.value, Op.UPSERT.value) | ((op == Op.UPDATE) & after.isNotNull()),
        F.struct(
            F.lit(UPSERT).alias(KIND),
            key_after.alias(ROW_KEY),
            F.when(moved_partial, _overlaid(before, after)).otherwise(after).alias(IMAGE),
            after_is_partial.alias(PARTIAL),
            F.lit(1).alias("half"),
            F.when(moved_partial, key_before).alias(MOVED_FROM),
        ),
    )
    delete_old_key = delete_old_key.withField(MOVED_FROM, F.lit(None).cast("string"))
    changes = F.filter(F.array(delete_old_key, upsert_new), lambda c: c.isNotNull())
    exploded = events.where(op.isin(*(o.value for o in model.ROW_OPS))).select(
        table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE)).alias(TABLE_ID),
        effective_order(events).alias(ORDER),
        F.col(model.PARTITION),
        F.col(model.OFFSET),
        F.col(model.SUB_INDEX),
        F.col(model.EVENT_TIME),
        keys.alias(model.KEY_COLUMNS),
        F.explode(changes).alias("c"),
    )
    return exploded.select(
        TABLE_ID,
        F.col("c")[ROW_KEY].alias(ROW_KEY),
        F.col("c")[KIND].alias(KIND),
        F.col("c")[IMAGE].alias(IMAGE),
        F.col("c")[PARTIAL].alias(PARTIAL),
        ORDER,
        model.PARTITION,
        model.OFFSET,
        (F.col(model.SUB_INDEX) * 2 + F.col("c")["half"]).alias(model.SUB_INDEX),
        model.EVENT_TIME,
        model.KEY_COLUMNS,
        F.col("c")[MOVED_FROM].alias(MOVED_FROM),
    )


def _overlaid(image: Column, on_top: Column) -> Column:
    """``image`` with the values of ``on_top`` in place of its own (both maps of column name to value)."""
    return F.map_concat(F.map_filter(image, lambda k, _v: ~F.map_contains_key(on_top, k)), on_top)


def fold(changes: DataFrame) -> DataFrame:
    """One change per (table_id, row_key): the changes of a key applied in order.

    A DELETE or a full image replaces what came before; a partial image is overlaid on the previous image of the
    batch, and stays partial (relies on the stored row) only if no full image or delete precedes it in the batch.
    After a DELETE, a partial image starts from nothing: the columns it lacks are NULL. ``moved_from``: an old key
    of a key change from a partial image among the key's changes, which :func:`moves_made_whole` must make whole
    first (NULL when there is none).
    """
    items = F.collect_list(
        F.struct(
            _rank().alias("rank"),
            F.col(KIND),
            F.col(IMAGE),
            F.col(PARTIAL),
            F.col(ORDER),
            F.col(model.EVENT_TIME),
            F.col(model.KEY_COLUMNS),
        )
    )
    ordered = F.array_sort(
        items,
        lambda left, right: F.when(left["rank"] < right["rank"], -1).when(left["rank"] > right["rank"], 1).otherwise(0),
    )

    def step(acc: Column, item: Column) -> Column:
        is_partial_on_upsert = item[PARTIAL] & (acc[KIND] == UPSERT)
        image = F.when(is_partial_on_upsert, _overlaid(acc[IMAGE], item[IMAGE])).otherwise(item[IMAGE])
        partial = (
            F.when(~item[PARTIAL], F.lit(False))
            .when(acc[KIND].isNull(), F.lit(True))
            .when(acc[KIND] == DELETE, F.lit(False))
            .otherwise(acc[PARTIAL])
        )
        return F.struct(
            item[KIND].alias(KIND),
            image.alias(IMAGE),
            partial.alias(PARTIAL),
            item[ORDER].alias(ORDER),
            item[model.EVENT_TIME].alias(model.EVENT_TIME),
            item[model.KEY_COLUMNS].alias(model.KEY_COLUMNS),
        )

    empty = F.struct(
        F.lit(None).cast("string").alias(KIND),
        F.create_map().cast("map<string,string>").alias(IMAGE),
        F.lit(True).alias(PARTIAL),
        F.lit(None).cast("string").alias(ORDER),
        F.lit(None).cast("timestamp").alias(model.EVENT_TIME),
        F.lit(None).cast("array<string>").alias(model.KEY_COLUMNS),
    )
    folded = changes.groupBy(TABLE_ID, ROW_KEY).agg(
        F.aggregate(ordered, empty, step).alias("f"), F.max(MOVED_FROM).alias(MOVED_FROM)
    )
    return folded.select(
        TABLE_ID,
        ROW_KEY,
        *(F.col("f")[name].alias(name) for name in (KIND, IMAGE, PARTIAL, ORDER, model.EVENT_TIME, model.KEY_COLUMNS)),
        MOVED_FROM,
    )


@dataclass(frozen=True)
class StoredRows:
    """A lake table's rows as a key change reads them (:func:`moves_made_whole`): ``rows`` (typed; None when the
    table has none yet), its key columns, its columns with their Spark types, and the column of ``rows`` that holds
    each row's order."""

    rows: DataFrame | None
    key_columns: Sequence[str]
    columns: Sequence[tuple[str, str]]
    order_column: str


MAX_MOVE_ROUNDS: Final = 32
"""Rounds of :func:`moves_made_whole`'s pointer jumping: each round halves every chain of key changes still waiting
on an earlier one, so a batch would have to move one row through 2**32 keys in a row to have any left after them
(those then take their parents' images as far as the batch and the lake go)."""


def moves_made_whole(
    changes: DataFrame,
    tables: Mapping[str, StoredRows],
    keep: Callable[[DataFrame], None],
    *,
    warn_unfound: bool = True,
) -> tuple[DataFrame, DataFrame | None]:
    """The batch's row changes (:func:`row_changes`), with each UPSERT of a key change from a partial image
    (``moved_from``) made whole from the old key's row as it was when the key changed: the columns the image lacks
    take the values of the old key's earlier changes in the batch (folded up to the key change) and, where those are
    partial or absent, of the old key's row in the lake table (``tables``, by table id). The UPSERT is then a full
    image: a column that neither has is NULL, as after a DELETE, not the value a stale row of the new key may hold.

    A row moved several times in one batch (``a -> b``, then ``b -> c``, both partial) makes a chain: the second
    move's old row is the first move's row, overlaid with the old key's changes between them. Each move is first
    made whole as far as the batch and the lake go, and keeps what it lacks from the key change it waits on
    (``_parent``: the last one into its old key, when nothing since gave that key a full image or deleted it). Then
    pointer jumping: each round, a move that still waits takes its parent's image (when that one waits on nothing)
    or its parent's wait and the columns its parent adds, so a chain of n moves takes about log2(n) rounds of the
    moves alone, and the lake is read once. Each round takes a local checkpoint (``keep`` receives it, for the
    caller to release).

    A copy of a key change sent again (a failover's re-send) must not take the old key's row as it is by then (the
    key may hold another row since): a copy whose new key's stored row is at least as new starts from that row, so
    it writes what it wrote the first time; copies in the same batch are not each other's earlier changes.

    A key change that finds no row of its old key, in the batch or the lake, leaves the columns its image lacks
    NULL; with ``warn_unfound``, a warning per table says how many (:func:`_warn_unfound`: the lake's history may
    start after the row's insert, or the row was deleted before the change).

    Returns the changes, and the UPSERTs made whole among them (None when there was none), which the history
    tables take in place of the batch's partial ones (:func:`with_moves_made_whole`).
    """
    if not tables:
        return changes, None
    pending = changes.where(F.col(MOVED_FROM).isNotNull()).select(
        "*",
        _change_id().alias("_move"),
        F.col(ORDER).alias("_move_order"),
        F.col(model.PARTITION).alias("_move_partition"),
        F.col(model.OFFSET).alias("_move_offset"),
        F.col(model.SUB_INDEX).alias("_move_sub_index"),
    )
    pending = pending.localCheckpoint(eager=True)
    keep(pending)
    if pending.isEmpty():
        return changes, None
    earlier = (
        changes.alias("c")
        .join(
            pending.select(
                F.col(TABLE_ID).alias("_table"),
                F.col(MOVED_FROM).alias("_old_key"),
                "_move",
                "_move_order",
                "_move_partition",
                "_move_offset",
                "_move_sub_index",
            ),
            (F.col(f"c.{TABLE_ID}") == F.col("_table")) & (F.col(f"c.{ROW_KEY}") == F.col("_old_key")),
        )
        # Ordered before the key change; of its own message, only what comes before its DELETE of the old key
        # (one sub_index below its UPSERT). Other messages at the same order are copies of it.
        .where(
            (F.col(ORDER) < F.col("_move_order"))
            | (
                (F.col(ORDER) == F.col("_move_order"))
                & (F.col(model.PARTITION) == F.col("_move_partition"))
                & (F.col(model.OFFSET) == F.col("_move_offset"))
                & (F.col(model.SUB_INDEX) < F.col("_move_sub_index") - 1)
            )
        )
        .select(
            TABLE_ID,
            F.col("_move").alias(ROW_KEY),
            *(c for c in changes.columns if c not in (TABLE_ID, ROW_KEY)),
            _rank().alias("_rank"),
            # A key change into the old key, which this one waits on when it is the last (made whole not yet).
            F.when(F.col(MOVED_FROM).isNotNull(), _change_id()).alias("_into"),
        )
    )
    last_into = F.max(F.when(F.col("_into").isNotNull(), F.col("_rank"))).over(Window.partitionBy(ROW_KEY))
    earlier = earlier.select("*", last_into.alias("_last_into"))
    parents = earlier.where(F.col("_rank") == F.col("_last_into")).select(
        F.col(ROW_KEY).alias("_move"), F.col("_into").alias("_parent")
    )
    since = earlier.where(F.col("_last_into").isNull() | (F.col("_rank") > F.col("_last_into")))
    # The old key's changes since the last key change into it, folded: what the move lays over its parent's row.
    old_row = fold(since.select(*changes.columns)).select(
        F.col(ROW_KEY).alias("_move"),
        F.col(KIND).alias("_old_kind"),
        F.col(IMAGE).alias("_old_image"),
        F.col(PARTIAL).alias("_old_partial"),
    )
    joined = pending.join(old_row, "_move", "left").join(parents, "_move", "left")
    # A full image or a delete of the old key since its last key change in: the move waits on nothing.
    needs_base = F.col("_old_kind").isNull() | ((F.col("_old_kind") == UPSERT) & F.col("_old_partial"))
    joined = joined.withColumn("_parent", F.when(needs_base, F.col("_parent")))
    moves = functools.reduce(
        DataFrame.unionByName,
        [_made_whole(joined.where(F.col(TABLE_ID) == table), stored) for table, stored in tables.items()],
    )
    columns = [*changes.columns, "_move", "_parent", "_delta"]
    moves = moves.select(*columns, "_unfound").localCheckpoint(eager=True)
    keep(moves)
    if warn_unfound:
        _warn_unfound(moves.where(F.col("_unfound")))
    moves = moves.select(*columns)
    for round_number in range(1, MAX_MOVE_ROUNDS + 1):
        waiting = moves.where(F.col("_parent").isNotNull())
        if waiting.isEmpty():
            break
        parent = moves.select(
            F.col("_move").alias("_p_move"),
            F.col("_parent").alias("_p_parent"),
            F.col(IMAGE).alias("_p_image"),
            F.col("_delta").alias("_p_delta"),
        )
        stepped = waiting.join(parent, F.col("_parent") == F.col("_p_move"), "left")
        # The last round takes the parent's image as far as the batch and the lake go, done or not.
        parent_done = F.lit(True) if round_number == MAX_MOVE_ROUNDS else F.col("_p_parent").isNull()
        image = F.when(F.col("_p_move").isNull(), F.col(IMAGE)).otherwise(_overlaid(F.col("_p_image"), F.col("_delta")))
        # New names first: a lambda in a select may read an alias made earlier in it for a column of that name
        # (see _made_whole).
        stepped = stepped.select(
            *(c for c in changes.columns if c != IMAGE),
            "_move",
            F.when(parent_done, image).otherwise(F.col(IMAGE)).alias("_next_image"),
            F.when(~parent_done, F.col("_p_parent")).alias("_next_parent"),
            F.when(parent_done, F.col("_delta"))
            .otherwise(_overlaid(F.col("_p_delta"), F.col("_delta")))
            .alias("_next_delta"),
        ).withColumnsRenamed({"_next_image": IMAGE, "_next_parent": "_parent", "_next_delta": "_delta"})
        moves = moves.where(F.col("_parent").isNull()).unionByName(stepped.select(*columns))
        moves = moves.localCheckpoint(eager=True)
        keep(moves)
    whole = moves.select(*changes.columns)
    changes = with_moves_made_whole(changes, whole).localCheckpoint(eager=True)
    keep(changes)
    return changes, whole


def with_moves_made_whole(changes: DataFrame, whole: DataFrame) -> DataFrame:
    """``changes`` (:func:`row_changes`) with the UPSERTs that :func:`moves_made_whole` made whole (``whole``) in place
    of the same changes as they came; ``whole``'s changes of other tables are left out."""
    done = whole.select(_change_id().alias("_done"))
    kept = changes.join(done, _change_id() == F.col("_done"), "left_anti")
    tables = changes.select(F.col(TABLE_ID).alias("_table")).distinct()
    of_these = whole.join(tables, F.col(TABLE_ID) == F.col("_table"), "left_semi")
    return kept.unionByName(of_these.select(*changes.columns))


def _rank() -> Column:
    """The order of a row change among a batch's (:func:`row_changes`): its order, then Kafka partition, offset and
    position in the message."""
    return F.struct(F.col(ORDER), F.col(model.PARTITION), F.col(model.OFFSET), F.col(model.SUB_INDEX))


def _change_id() -> Column:
    """One row change's identity in its batch (:func:`row_changes`): its table, key and rank."""
    return F.to_json(F.struct(F.col(TABLE_ID), F.col(ROW_KEY), _rank()))


def _made_whole(moves: DataFrame, stored: StoredRows) -> DataFrame:
    """Key changes of one table (:func:`moves_made_whole`'s pending ones, with their old row's folded changes since
    the last key change into it, and that one's id as ``_parent``) as full images over the old row as far as the
    batch and the lake go, with ``_delta``: what the move lays over its parent's row. A copy the lake table already
    holds waits on no parent."""
    empty = F.create_map().cast("map<string,string>")
    batch_image = F.when(F.col("_old_kind") == UPSERT, F.col("_old_image")).otherwise(empty)
    base = batch_image
    parent = F.col("_parent")
    # Nothing to take the missing columns from: no full image of the old key in the batch, no key change into it to
    # wait on, and (below) no stored row of it from before the change, nor of the new key from at least as late.
    unfound = parent.isNull() & ~F.coalesce((F.col("_old_kind") == UPSERT) & ~F.col("_old_partial"), F.lit(False))
    index_of = {name.lower(): i for i, (name, _) in enumerate(stored.columns)}
    keyed = [stored.columns[index_of[k.lower()]] for k in stored.key_columns if k.lower() in index_of]
    if stored.rows is not None and keyed and len(keyed) == len(stored.key_columns):
        # The old key's earlier changes in the batch lie over its stored row, unless they start from a full image.
        needs_stored = F.col("_old_kind").isNull() | ((F.col("_old_kind") == UPSERT) & F.col("_old_partial"))

        def stored_rows(prefix: str) -> DataFrame:
            assert stored.rows is not None
            return stored.rows.select(
                *(F.col(model.quote(name)).alias(f"{prefix}_k{i}") for i, (name, _) in enumerate(keyed)),
                comparable_order(F.col(model.quote(stored.order_column))).alias(f"{prefix}_order"),
                model.canonical_image(stored.columns, lambda name: F.col(model.quote(name))).alias(f"{prefix}_image"),
            )

        def on_key(prefix: str, key: Column) -> Column:
            values = F.from_json(key, "array<string>")
            return functools.reduce(
                lambda a, b: a & b,
                (F.col(f"{prefix}_k{i}") == model.typed_value(values[i], t) for i, (_, t) in enumerate(keyed)),
            )

        moves = moves.join(stored_rows("_from"), on_key("_from", F.col(MOVED_FROM)), "left")
        moves = moves.join(stored_rows("_to"), on_key("_to", F.col(ROW_KEY)), "left")
        # The old key's stored row as it was before the key change (a newer one is another row, written since).
        before_move = needs_stored & F.coalesce(F.col("_from_order") < F.col(ORDER), F.lit(False))
        from_old = _overlaid(F.when(before_move, F.col("_from_image")).otherwise(empty), batch_image)
        # A copy of a key change the lake table already holds (or a newer change of the new key): from that row.
        applied = F.coalesce(F.col("_to_order") >= F.col(ORDER), F.lit(False))
        base = F.when(applied, F.col("_to_image")).otherwise(from_old)
        parent = F.when(~applied, parent)
        unfound = unfound & ~applied & ~before_move
    # Before the select that makes IMAGE anew: Spark 4.1 resolves a name inside a lambda (here _overlaid's) to an
    # alias made earlier in the same select (a lateral column alias) before the input column of that name.
    moves = moves.withColumn("_delta", _overlaid(batch_image, F.col(IMAGE)))
    return moves.select(
        TABLE_ID,
        ROW_KEY,
        KIND,
        _overlaid(base, F.col(IMAGE)).alias(IMAGE),
        F.lit(False).alias(PARTIAL),
        ORDER,
        model.PARTITION,
        model.OFFSET,
        model.SUB_INDEX,
        model.EVENT_TIME,
        model.KEY_COLUMNS,
        F.lit(None).cast("string").alias(MOVED_FROM),
        "_move",
        parent.alias("_parent"),
        "_delta",
        unfound.alias("_unfound"),
    )


def _warn_unfound(moves: DataFrame) -> None:
    """Logs a warning per table of the key changes in ``moves`` (:func:`moves_made_whole`'s, made whole as far as
    they go) that found no row of their old key. One small job, in the batches with such key changes only."""
    for row in moves.groupBy(TABLE_ID).count().orderBy(TABLE_ID).collect():
        log.warning(
            "%d key change(s) of %s from a partial image found no row of their old key, in the batch or the lake "
            "table: the columns their image lacks are NULL in the new key's row (the lake's history may start after "
            "the row's insert, or the row was deleted before the change: by the batch, a truncate, or by hand)",
            row["count"],
            ".".join(part for part in split_table_id(row[TABLE_ID]) if part),
        )


def latest_per_key(folded: DataFrame) -> DataFrame:
    """Folded changes of several source tables that share a lake table (one MERGE for them all): per row key, the
    latest by order. Their keys should not overlap; when they do, the latest change wins, as it would if each
    table's changes were merged in turn (the MERGE keeps the row of the highest order)."""
    latest = Window.partitionBy(ROW_KEY).orderBy(F.col(ORDER).desc(), F.col(TABLE_ID).desc())
    return folded.withColumn("_rank", F.row_number().over(latest)).where(F.col("_rank") == 1).drop("_rank")


@dataclass
class TablePlan:
    """What a batch needs from one target table, gathered on the driver (one small row per table)."""

    table_id: str
    database: str | None
    schema: str | None
    table: str
    columns: list[tuple[str, str]]
    """(name, spark_type) in table order: the newest message's columns, then older ones it lacks."""
    key_columns: list[str]
    truncate_order: str | None = None
    """Order of the newest TRUNCATE in the batch, if any."""
    sequence_column: str | None = None
    """The column ``sequence_by`` names for the table, as the setting spells it; None when the format's position
    orders it. The sink records it on the lake table it creates (``DeltaSink.ordering_conflict``)."""
    first_order: str | None = None
    """Order of the oldest row event in the batch, if any, or the log part of an order (:func:`log_order`) when that
    is lower: every change the batch applies to the table is ordered at or after it, and so is the log part of its
    order (the tombstone gate reads only the tombstones from there on, ``DeltaSink.gate``)."""
    ddl_count: int = 0
    row_events: int = 0
    partial_events: int = 0
    """Row events whose after image is partial (``model.AFTER_IS_PARTIAL``): the rows they write keep stored values."""
    null_key_events: int = 0
    """Row events whose identifying image (:func:`identifying_image`) holds no value for one of their key columns:
    they cannot be told apart from each other (``Pipeline`` makes them dead letters)."""
    unknown_old_key_events: int = 0
    """UPDATEs that changed the source's key (the message's own key columns) but whose before image holds no value of
    a configured key column, so the old row's key under ``keys`` is unknown (a Debezium key change's before image is
    the old source key alone): each is applied to the row its after image keys, and if it changed a configured key
    column too, the old key's row stays. Counted only when ``keys`` are configured; ``Pipeline`` warns."""
    declared_types: dict[str, set[str]] = field(default_factory=dict)
    """Lower-cased column name -> every Spark type the batch's messages declare for it along with a value (usually
    one). A type declared only next to NULLs may be a vendor's guess (dts.md 1.7: TEXT and BLOB share their codes),
    and must not retype a column (cdclake.evolve.SchemaEvolution.reconcile_types)."""
    declared_names: set[str] = field(default_factory=set)
    """Every column name the batch's messages declare, exactly as they spell it (images hold their columns by these
    names; a lake table that already has a column keeps its own spelling)."""

    @property
    def ordered_by_column(self) -> bool:
        """Whether ``sequence_by`` names a column for the table: its rows are ordered by ``value|position``, and a
        TRUNCATE compares their log part (:func:`log_order`). Only then, since Delta and Iceberg cannot skip or drop
        whole files by such a condition (Iceberg then marks every row deleted instead of dropping the files)."""
        return self.sequence_column is not None


def _valued_columns() -> Column:
    """Names of the declared columns that have a value (not NULL) in the event's before or after image.

    From the images' own entries, not a lookup of each declared name in them: Spark finds a map key by scanning the
    keys, so a lookup per column costs the square of the width. 3 DataWorks tables of 208 columns, 12,525 events:
    the batch summary (:func:`plan_tables`) took 4.73 s with lookups, 1.23 s like this (best of 5, alternated); with
    8 columns 0.24 s either way.
    """

    def valued_names(image: Column) -> Column:
        valued = F.map_keys(F.map_filter(image, lambda _name, value: value.isNotNull()))
        return F.coalesce(valued, F.array().cast("array<string>"))

    after, before = F.col(model.AFTER), F.col(model.BEFORE)
    return F.array_intersect(F.col(model.COLUMNS)["name"], F.array_union(valued_names(after), valued_names(before)))


def identifying_image() -> Column:
    """The image of a row event whose key values identify its row: a DELETE's before image, else the after image
    (the before image of an UPDATE that has none)."""
    before, after = F.col(model.BEFORE), F.col(model.AFTER)
    return F.when(F.col(model.OP) == Op.DELETE.value, before).otherwise(F.coalesce(after, before))


def lacks_key_value(keys: Column, identifying: Column) -> Column:
    """Whether an event's ``identifying`` image (:func:`identifying_image`, staged as a column: the lambda reads it
    per key) holds no value for one of its ``keys``; never null, false for an event without that image."""
    missing = F.coalesce(F.exists(keys, lambda k: identifying[k].isNull()), F.lit(False))
    return identifying.isNotNull() & missing


def sequence_column(sequence_by: PerTable[str], ident: tuple[str | None, str | None, str]) -> str | None:
    """The column ``sequence_by`` names for the table ``ident`` (``TablePlan.sequence_column``), or None."""
    entry = sequence_by.entry_for(*ident)
    return None if entry is None else entry[1]


def plan_tables(
    events: DataFrame,
    configured_keys: Mapping[str, Sequence[str]] | None = None,
    sequence_by: Mapping[str, str] | None = None,
) -> list[TablePlan]:
    """Summarises, per table, the column lists, keys and truncates of a batch (a handful of rows to the driver);
    ``sequence_by`` as the pipeline's (``TablePlan.ordered_by_column``)."""
    op = F.col(model.OP)
    relevant = events.where(op.isin(*(o.value for o in model.ROW_OPS), Op.TRUNCATE.value, Op.DDL.value))
    relevant = relevant.where(F.col(model.TABLE).isNotNull())
    keys = effective_keys(relevant, configured_keys or {})
    is_row = op.isin(*(o.value for o in model.ROW_OPS))
    staged = relevant.select(
        model.DATABASE,
        model.SCHEMA,
        model.TABLE,
        op.alias("op"),
        effective_order(relevant).alias(ORDER),
        F.col(model.COLUMNS),
        keys.alias("keys"),
        _valued_columns().alias("valued"),
        F.coalesce(F.col(model.AFTER_IS_PARTIAL), F.lit(False)).alias("partial"),
        F.when(is_row, identifying_image()).alias("identifying"),
        (old_key_unknown(keys) if configured_keys else F.lit(False)).alias("unknown_old_key"),
    )
    # A NULL key value would make every such row of the table one row (their keys are equal): counted here, in the
    # summary's own job, so that only a batch that has some pays for finding them (Pipeline._misfit_reason).
    summary = (
        staged.select("*", lacks_key_value(F.col("keys"), F.col("identifying")).alias("null_key"))
        .groupBy(model.DATABASE, model.SCHEMA, model.TABLE, model.COLUMNS)
        .agg(
            F.array_distinct(F.flatten(F.collect_list("valued"))).alias("valued"),
            F.max(F.when(F.col("op").isin(*(o.value for o in model.ROW_OPS)), F.col(ORDER))).alias("last_order"),
            # The lowest of the orders and of their log parts: tombstones of keys compare with the one, those of
            # truncates with the other (DeltaSink.gate).
            F.min(
                F.when(
                    F.col("op").isin(*(o.value for o in model.ROW_OPS)), F.least(F.col(ORDER), log_order(F.col(ORDER)))
                )
            ).alias("first_order"),
            F.max_by(F.col("keys"), F.when(F.col("op").isin(*(o.value for o in model.ROW_OPS)), F.col(ORDER))).alias(
                "keys"
            ),
            F.max(F.when(F.col("op") == Op.TRUNCATE, F.col(ORDER))).alias("truncate_order"),
            F.sum(F.when(F.col("op") == Op.DDL, 1).otherwise(0)).alias("ddl_count"),
            F.sum(F.when(F.col("op").isin(*(o.value for o in model.ROW_OPS)), 1).otherwise(0)).alias("row_events"),
            F.sum(F.when(F.col("partial"), 1).otherwise(0)).alias("partial_events"),
            F.sum(F.when(F.col("null_key"), 1).otherwise(0)).alias("null_key_events"),
            F.sum(F.when(F.col("unknown_old_key"), 1).otherwise(0)).alias("unknown_old_key_events"),
        )
        .collect()
    )
    plans: dict[tuple[str | None, str | None, str], TablePlan] = {}
    ordered = PerTable.of(sequence_by or {})
    # Per table, the columns whose type so far comes only from messages without a value for them: a type declared
    # with a value wins over it (the newest message may carry a NULL typed by a vendor's fallback, e.g. DTS's
    # TEXT/BLOB codes, dts.md 1.7).
    unvalued: dict[tuple[str | None, str | None, str], set[str]] = {}
    newest_first = sorted(summary, key=lambda r: r["last_order"] or "", reverse=True)
    for row in newest_first:
        ident = (row[model.DATABASE], row[model.SCHEMA], row[model.TABLE])
        plan = plans.get(ident)
        if plan is None:
            plan = TablePlan(
                table_id=table_id_of(*ident),
                database=ident[0],
                schema=ident[1],
                table=ident[2],
                columns=[],
                key_columns=list(row["keys"] or []),
                sequence_column=sequence_column(ordered, ident),
            )
            plans[ident] = plan
        known = {name.lower(): index for index, (name, _) in enumerate(plan.columns)}
        valued = {name.lower() for name in row["valued"] or []}
        guessed = unvalued.setdefault(ident, set())
        for column in row[model.COLUMNS] or []:
            name, spark_type, lower = column["name"], column["spark_type"], column["name"].lower()
            plan.declared_names.add(name)
            if lower not in known:
                known[lower] = len(plan.columns)
                plan.columns.append((name, spark_type))
                if lower not in valued:
                    guessed.add(lower)
            elif lower in guessed and lower in valued:
                plan.columns[known[lower]] = (plan.columns[known[lower]][0], spark_type)
                guessed.discard(lower)
            if lower in valued:
                plan.declared_types.setdefault(lower, set()).add(spark_type)
        if not plan.key_columns and row["keys"]:
            plan.key_columns = list(row["keys"])
        if row["truncate_order"] and (plan.truncate_order or "") < row["truncate_order"]:
            plan.truncate_order = row["truncate_order"]
        if row["first_order"] is not None and (plan.first_order is None or row["first_order"] < plan.first_order):
            plan.first_order = row["first_order"]
        plan.ddl_count += row["ddl_count"]
        plan.row_events += row["row_events"]
        plan.partial_events += row["partial_events"]
        plan.null_key_events += row["null_key_events"]
        plan.unknown_old_key_events += row["unknown_old_key_events"]
    return list(plans.values())


def old_key_unknown(keys: Column) -> Column:
    """Whether an event is an UPDATE that changed its source key (the message's own key columns, all valued in the
    before image, differ between its images) while its before image has no value of one of ``keys``
    (:func:`effective_keys`, other columns): the old row is unknown under them (``TablePlan.unknown_old_key_events``).
    Never null."""
    before, after = F.col(model.BEFORE), F.col(model.AFTER)
    source_keys = F.coalesce(F.col(model.KEY_COLUMNS), F.array().cast("array<string>"))
    # Spark evaluates `&` left to right and stops at the first false: the lambdas (key_of, lacks_key_value) run only
    # for the updates of tables keyed otherwise than their messages.
    unknown = (
        (F.col(model.OP) == Op.UPDATE.value)
        & after.isNotNull()
        & (F.size(source_keys) > 0)
        & (keys != source_keys)
        & (key_of(before, source_keys) != key_of(after, source_keys))
        & ~lacks_key_value(source_keys, before)
        & lacks_key_value(keys, before)
    )
    return F.coalesce(unknown, F.lit(False))
