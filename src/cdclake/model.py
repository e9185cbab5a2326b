"""The canonical change event: what every format decodes into, and what the apply engine reads.

A decoded micro-batch is a Spark DataFrame with exactly the columns of :data:`CANONICAL_SCHEMA`, one row per
source change (or control event). Each column is documented once, below, next to its name constant.

Row images are kept as ``MAP<STRING, STRING>`` because one Kafka topic usually carries many tables with different
columns. Every value is *canonical text*, an encoding that :func:`typed_value` turns into the column's Spark type
without loss and without depending on the session time zone:

=================  =====================================================================================
Spark type         canonical text
=================  =====================================================================================
boolean            ``true`` / ``false``
tinyint .. bigint  decimal digits with optional ``-`` (exact; never passes through a double)
decimal(p,s)       plain decimal text, e.g. ``-12.3400``
float, double      Spark's cast syntax, incl. ``NaN``, ``Infinity``
string             the text itself
binary             base64 (standard alphabet, padded)
date               ``yyyy-MM-dd``
timestamp          microseconds since the Unix epoch, decimal digits (an instant: UTC, never local time)
timestamp_ntz      ``yyyy-MM-dd HH:mm:ss[.ffffff]`` (a wall-clock time without zone)
=================  =====================================================================================

SQL NULL is a map entry whose value is null. A column that is *absent* from the map was not captured by the
event (partial image): the apply engine keeps the current value instead of writing NULL.

This module imports nothing from the rest of cdclake and knows no sink, source or format.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Final, Literal, TypeAlias

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)


class Op(StrEnum):
    """Canonical operation of a change event."""

    INSERT = "INSERT"
    """A new row (after image only)."""
    UPDATE = "UPDATE"
    """A changed row: after image, and the before image when the format carries it. An UPDATE with a before
    image and no after image is the first half of a split update (DataWorks ``UPDATE_BEFOR``)."""
    DELETE = "DELETE"
    """A removed row (before image, at least its key)."""
    UPSERT = "UPSERT"
    """A snapshot / full-load row: insert or replace (DTS INIT, DRS INIT, Qlik REFRESH, Debezium ``r``)."""
    TRUNCATE = "TRUNCATE"
    """All rows of the table are removed at this position."""
    DDL = "DDL"
    """A schema change; the statement is in ``ddl``."""
    HEARTBEAT = "HEARTBEAT"
    """The source is alive and caught up to ``event_time``; no row change."""
    TXN_BEGIN = "TXN_BEGIN"
    """A source transaction starts."""
    TXN_END = "TXN_END"
    """A source transaction commits."""
    OTHER = "OTHER"
    """Anything else the format defines (GTID, XA end, checkpoints): counted, never applied."""


ROW_OPS: Final = frozenset({Op.INSERT, Op.UPDATE, Op.DELETE, Op.UPSERT})
"""Operations that change one row."""

# ----------------------------------------------------------------------------------------------------------------
# Canonical columns. Each constant is a column name of CANONICAL_SCHEMA.

FORMAT: Final = "format"
"""Registry name of the format that decoded the message, e.g. ``dataworks-json``."""
OP: Final = "op"
"""Canonical operation, a value of :class:`Op`."""
VENDOR_OP: Final = "vendor_op"
"""The operation exactly as the message spells it (for counting and alerting on OTHER/unknown ops)."""
DB_TYPE: Final = "db_type"
"""Source database product as the message names it (``MySQL``, ``Oracle``...), or null."""
DATABASE: Final = "database"
"""Source database (catalog) name, or null when the format has none."""
SCHEMA: Final = "schema"
"""Source schema name (Oracle, PostgreSQL, SQL Server...), or null."""
TABLE: Final = "table"
"""Source table name; null for stream-level events (heartbeats, transaction markers)."""
KEY_COLUMNS: Final = "key_columns"
"""Names of the columns that identify a row, in key order; empty when the format carries none (the pipeline
may then use configured keys, or a row-identity column the format found, see ROW_ID_COLUMN)."""
BEFORE: Final = "before"
"""Before image, column name -> canonical text; null when the event carries none."""
AFTER: Final = "after"
"""After image, column name -> canonical text; null when the event carries none. Keys present = columns captured."""
AFTER_IS_PARTIAL: Final = "after_is_partial"
"""True when the after image holds only some columns (changed-only updates, masks, ``$set``); columns absent from
``after`` then keep their current value. False for full images."""
COLUMNS: Final = "columns"
"""Column types of the table as the message describes them, in table order:
``ARRAY<STRUCT<name, vendor_type, spark_type>>``; ``spark_type`` is a Spark SQL type name (see module doc)."""
POSITION: Final = "position"
"""Ordering position: a string whose lexicographic order is the source commit order of the changes of one row
(built from the vendor's sequence with :func:`sortable_decimal`). Null when the format has none; the pipeline then
falls back to the Kafka order."""
EVENT_TIME: Final = "event_time"
"""When the change happened at the source (or, for heartbeats, how far the source has been read)."""
TXN_ID: Final = "txn_id"
"""Source transaction id, or null."""
DDL: Final = "ddl"
"""DDL statement text for DDL and TRUNCATE events, else null. Never executed: parsed and validated first."""
TOPIC: Final = "topic"
"""Kafka topic of the message (for file replays: the file it came from)."""
PARTITION: Final = "partition"
"""Kafka partition of the message."""
OFFSET: Final = "offset"
"""Kafka offset of the message (for file replays: its line number, counting across files in order)."""
MESSAGE_COORDINATES: Final = (TOPIC, PARTITION, OFFSET)
"""The columns that identify one message (in events, dead letters, held messages and ``schema_changes`` rows)."""
SUB_INDEX: Final = "sub_index"
"""Position of the event inside its message, for formats that pack several rows into one message; else 0."""
KAFKA_TIMESTAMP: Final = "kafka_timestamp"
"""Kafka record timestamp, or null."""
KafkaOrder: TypeAlias = Literal["partition", "timestamp"]
"""How events whose format carries no position are ordered (:func:`kafka_position`): by Kafka partition, then offset
(exact within a partition only), or by the record's timestamp, then partition and offset."""
ERROR: Final = "error"
"""Why the message could not be decoded; null for good events. Rows with an error go to the dead letters."""
RAW_KEY: Final = "raw_key"
"""The Kafka key bytes as received (kept for dead letters)."""
RAW_VALUE: Final = "raw_value"
"""The Kafka value bytes as received (kept for dead letters)."""
RAW_HEADERS: Final = "raw_headers"
"""The Kafka record headers as received, in order (``ARRAY<STRUCT<key, value>>``), or null when the source has none
(kept with held messages and dead letters, so that a message decoded again reads the same headers)."""

HEADERS_TYPE: Final = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
"""Type of :data:`RAW_HEADERS`: Spark's Kafka source's ``headers`` column."""

COLUMN_TYPE = StructType(
    [
        StructField("name", StringType()),
        StructField("vendor_type", StringType()),
        StructField("spark_type", StringType()),
    ]
)
"""Element type of :data:`COLUMNS`."""

_IMAGE = MapType(StringType(), StringType(), valueContainsNull=True)

CANONICAL_SCHEMA: Final = StructType(
    [
        StructField(FORMAT, StringType(), False),
        StructField(OP, StringType()),
        StructField(VENDOR_OP, StringType()),
        StructField(DB_TYPE, StringType()),
        StructField(DATABASE, StringType()),
        StructField(SCHEMA, StringType()),
        StructField(TABLE, StringType()),
        StructField(KEY_COLUMNS, ArrayType(StringType())),
        StructField(BEFORE, _IMAGE),
        StructField(AFTER, _IMAGE),
        StructField(AFTER_IS_PARTIAL, BooleanType()),
        StructField(COLUMNS, ArrayType(COLUMN_TYPE)),
        StructField(POSITION, StringType()),
        StructField(EVENT_TIME, TimestampType()),
        StructField(TXN_ID, StringType()),
        StructField(DDL, StringType()),
        StructField(TOPIC, StringType()),
        StructField(PARTITION, IntegerType()),
        StructField(OFFSET, LongType()),
        StructField(SUB_INDEX, IntegerType()),
        StructField(KAFKA_TIMESTAMP, TimestampType()),
        StructField(ERROR, StringType()),
        StructField(RAW_KEY, BinaryType()),
        StructField(RAW_VALUE, BinaryType()),
        StructField(RAW_HEADERS, HEADERS_TYPE),
    ]
)
"""Schema of a decoded batch, in this column order."""

CANONICAL_COLUMNS: Final = tuple(CANONICAL_SCHEMA.fieldNames())

ROW_ID_COLUMN: Final = "_cdc_row_id"
"""Row identity of a key-less table, taken from a hidden source column (MySQL RDS ``#alibaba_rds_row_id#``,
Oracle ``rowid``...). Formats put it into the images under this name and list it as the only key column."""

METADATA_PREFIX: Final = "_cdc_"
"""Prefix of every column cdclake adds to user tables; source columns may not start with it."""

# ----------------------------------------------------------------------------------------------------------------
# Spark types and canonical text.

SIMPLE_SPARK_TYPES: Final = frozenset(
    {
        "boolean",
        "tinyint",
        "smallint",
        "int",
        "bigint",
        "float",
        "double",
        "string",
        "binary",
        "date",
        "timestamp",
        "timestamp_ntz",
    }
)
_DECIMAL = re.compile(r"decimal\((\d{1,2}),(\d{1,2})\)")


def is_supported_spark_type(spark_type: str) -> bool:
    """Whether ``spark_type`` is one of the Spark types canonical text can carry."""
    if spark_type in SIMPLE_SPARK_TYPES:
        return True
    match = _DECIMAL.fullmatch(spark_type)
    return match is not None and 0 <= int(match.group(2)) <= int(match.group(1)) <= 38


def decimal_scale(spark_type: str) -> int | None:
    """The scale of a supported ``decimal(p,s)`` type name, on the driver; None for any other name."""
    match = _DECIMAL.fullmatch(spark_type)
    return int(match.group(2)) if match is not None and is_supported_spark_type(spark_type) else None


def typed_value(text: Column, spark_type: str) -> Column:
    """Converts canonical text to ``spark_type``. Invalid text yields null (see :func:`text_is_valid`).

    Args:
        text: a column of canonical text.
        spark_type: a Spark SQL type name accepted by :func:`is_supported_spark_type`.
    """
    if spark_type == "binary":
        return F.try_to_binary(text, F.lit("base64"))
    if spark_type == "timestamp":
        return F.timestamp_micros(text.try_cast("bigint"))
    if not is_supported_spark_type(spark_type):
        raise ValueError(f"unsupported Spark type for canonical text: {spark_type!r}")
    return text.try_cast(spark_type)


def _wall_clock_epoch() -> Column:
    """The Unix epoch as a wall clock: differences from it and sums with it involve no time zone (a ``datetime``
    literal would be read in the session's)."""
    return F.lit("1970-01-01 00:00:00").cast("timestamp_ntz")


_TIMESTAMP_KINDS: Final = {"timestamp_ntz": "timestamp", "timestamp": "timestamp_ntz"}


def converts_to(declared: str, stored: str) -> bool:
    """Whether a value declared ``declared`` is written into a column of type ``stored`` by
    :func:`converted_text`: a wall clock (``timestamp_ntz``: MySQL DATETIME, SQL Server DATETIME2) into an instant
    (``timestamp``) column and the reverse, both at UTC."""
    return _TIMESTAMP_KINDS.get(declared) == stored


def converted_text(text: Column, declared: str, stored: str) -> Column:
    """Canonical text of ``declared`` as canonical text of ``stored`` (:func:`converts_to`). A wall clock is taken as
    UTC, as Debezium's ``io.debezium.time.Timestamp`` takes a MySQL DATETIME, and an instant becomes its UTC wall
    clock; neither depends on the session time zone."""
    if declared == "timestamp_ntz" and stored == "timestamp":
        micros = F.timestamp_diff("MICROSECOND", _wall_clock_epoch(), typed_value(text, "timestamp_ntz"))
        return micros.cast("string")
    if declared == "timestamp" and stored == "timestamp_ntz":
        wall_clock = F.timestamp_add("MICROSECOND", text.try_cast("bigint"), _wall_clock_epoch())
        return canonical_text(wall_clock, "timestamp_ntz")
    raise ValueError(f"no conversion of {declared} values to {stored}")


def quote(identifier: str) -> str:
    """Backtick-quotes an identifier for Spark SQL text or ``F.col`` (backticks inside are doubled): names come from
    messages."""
    return "`" + identifier.replace("`", "``") + "`"


def canonical_text(value: Column, spark_type: str) -> Column:
    """The inverse of :func:`typed_value`: a typed column as canonical text (a row that is already typed, such as a
    lake table's, becoming an event again). ``typed_value(canonical_text(v, t), t)`` is ``v``.

    The text is the canonical form of the value: a source may have sent another spelling of it (``12.3`` for
    ``decimal(10,2)``, whose canonical text here is ``12.30``).
    """
    if spark_type == "binary":
        return F.base64(value)
    if spark_type == "timestamp":
        return F.unix_micros(value).cast("string")
    if not is_supported_spark_type(spark_type):
        raise ValueError(f"unsupported Spark type for canonical text: {spark_type!r}")
    # Spark casts decimals to plain text (no exponent), doubles to its own cast syntax, dates to yyyy-MM-dd and
    # wall-clock timestamps to yyyy-MM-dd HH:mm:ss[.ffffff]: each is the canonical text of its type.
    return value.cast("string")


def canonical_image(columns: Sequence[tuple[str, str]], value_of: Callable[[str], Column]) -> Column:
    """A typed row as an image: each of ``columns`` (name, Spark type) -> its value (``value_of(name)``) as
    canonical text (:func:`canonical_text`)."""
    return F.map_from_arrays(
        F.array(*(F.lit(name) for name, _ in columns)),
        F.array(*(canonical_text(value_of(name), spark_type) for name, spark_type in columns)),
    )


# The order text_is_valid tests the declared type in: the most common types first, then the rest. A CASE tests its
# conditions one after the other for every value, and the types are distinct, so the order changes only the cost.
_COMMON_TYPES: Final = ("string", "bigint", "int", "double", "timestamp")
_VALIDATION_ORDER: Final = (*_COMMON_TYPES, *sorted(SIMPLE_SPARK_TYPES - set(_COMMON_TYPES)))


def text_is_valid(text: Column, spark_type: Column) -> Column:
    """Boolean column: whether ``text`` is valid canonical text for the (data-dependent) ``spark_type``.

    Null text is valid (SQL NULL). Unknown types are invalid. Used by the decoder so that a value that does not
    fit its declared type sends the message to the dead letters instead of silently becoming NULL. Never null.
    """
    branches = F.when(text.isNull(), F.lit(True))
    for name in _VALIDATION_ORDER:
        valid = F.lit(True) if name == "string" else typed_value(text, name).isNotNull()
        branches = branches.when(spark_type == name, valid)
    decimal_type = r"^decimal\(\d{1,2},\d{1,2}\)$"
    return branches.when(
        spark_type.rlike(decimal_type), decimal_text_fits(text, *decimal_parameters(spark_type))
    ).otherwise(F.lit(False))


def decimal_parameters(spark_type: Column) -> tuple[Column, Column]:
    """(precision, scale) of a ``decimal(p,s)`` type name, as ints; what they are for another name is undefined (the
    caller tests the name). Without a regular expression: this runs per value."""
    precision = F.substring_index(F.substring_index(spark_type, "(", -1), ",", 1).cast("int")
    scale = F.substring_index(F.substring_index(spark_type, ",", -1), ")", 1).cast("int")
    return precision, scale


_DECIMAL_TEXT: Final = r"^[+-]?(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d{1,9}))?$"


def decimal_text_fits(text: Column, precision: Column, scale: Column) -> Column:
    """Whether decimal text (``-12.50``, ``.5``, ``1.5E3``) is a value of ``decimal(precision, scale)`` exactly: its
    digits before the point, leading zeros aside, fit ``precision - scale`` and those after it, trailing zeros aside,
    fit ``scale``. Null text is not decimal text (the caller decides what a NULL means).

    A cast would not tell: Spark rounds extra fraction digits (``1.005`` -> ``1.01`` in ``decimal(10,2)``) and makes
    an overflow NULL, and the type is data-dependent here. Plain text is matched by one regular expression built from
    the type (``^[+-]?0*\\d{0,p-s}(\\.\\d{0,s}0*)?$`` with a digit somewhere), compiled once per type: this runs for
    every decimal value, and counting digits with several expressions made DTS Avro decoding 3 times slower. Text
    with an exponent (rare) counts its digits with the exponent moving the point."""
    plain = F.concat(
        F.lit(r"^(?=\D*\d)[+-]?0*\d{0,"),
        (precision - scale).cast("string"),
        F.lit(r"}(?:\.\d{0,"),
        scale.cast("string"),
        F.lit(r"}0*)?$"),
    )
    has_exponent = text.contains("e") | text.contains("E")
    return F.when(has_exponent, _exponent_decimal_fits(text, precision, scale)).otherwise(F.rlike(text, plain))


def _exponent_decimal_fits(text: Column, precision: Column, scale: Column) -> Column:
    """:func:`decimal_text_fits` for any decimal text, an exponent included: all digits in a row with leading zeros
    stripped, the point ``len(integer part) + exponent - leading zeros`` digits in, trailing zeros stripped after it.
    Zero always fits."""
    integer = F.regexp_extract(text, _DECIMAL_TEXT, 1)
    fraction = F.regexp_extract(text, _DECIMAL_TEXT, 2)
    exponent = F.regexp_extract(text, _DECIMAL_TEXT, 3)
    digits = F.concat(integer, fraction)
    significant = F.regexp_replace(digits, r"^0+", "")
    point = (
        F.length(integer) + F.coalesce(exponent.try_cast("int"), F.lit(0)) - (F.length(digits) - F.length(significant))
    )
    significant = F.regexp_replace(significant, r"0+$", "")
    integer_digits = F.greatest(point, F.lit(0))
    fraction_digits = F.greatest(F.length(significant) - point, F.lit(0))
    return (
        text.rlike(_DECIMAL_TEXT)
        & (digits != "")
        & ((significant == "") | ((integer_digits <= precision - scale) & (fraction_digits <= scale)))
    )


def sortable_decimal(digits: Column, width: int = 24) -> Column:
    """Ordering position from a non-negative integer given as decimal text (e.g. a vendor sequence id).

    Left-pads to ``width`` so that string order equals numeric order. Text that is not all digits, or is longer
    than ``width``, yields null (the decoder reports it).
    """
    # Not F.ltrim(digits, "0"): Spark 4 logs a deprecation warning for the two-argument form on every resolution.
    trimmed = F.regexp_replace(digits, r"^0+", "")
    clean = F.when(trimmed == "", F.lit("0")).otherwise(trimmed)
    return F.when(digits.rlike(r"^\d+$") & (F.length(clean) <= width), F.lpad(clean, width, "0"))


def kafka_position(
    partition: Column, offset: Column, *, timestamp: Column | None = None, before_vendor_positions: bool = False
) -> Column:
    """Fallback ordering position from the Kafka coordinates, for events whose format carries none.

    Starts with ``~`` so that it sorts after every vendor position (digits, letters): an event without a vendor
    position is treated as newer than any event with one. With ``before_vendor_positions`` it starts with ``!``
    and sorts before all of them instead (full-load rows that precede the change stream, e.g. Qlik REFRESH).

    Without ``timestamp`` the order is the partition, then the offset (``~pppppp:oooo...``): exact within a partition,
    arbitrary across partitions. With ``timestamp`` (the Kafka record's, ``kafka_order: timestamp``) it is the
    record's time in milliseconds, then partition and offset (``~@ttttttttttttt:pppppp:oooo...``; ``@`` sorts after
    every digit, so each such position is newer than every position of the first form, which a lake switched to
    the timestamp order may hold). A record without a timestamp (or with Kafka's -1) keeps the first form.
    """
    prefix = "!" if before_vendor_positions else "~"
    coordinates = F.concat(F.lpad(partition.cast("string"), 6, "0"), F.lit(":"), F.lpad(offset.cast("string"), 20, "0"))
    by_partition = F.concat(F.lit(prefix), coordinates)
    if timestamp is None:
        return by_partition
    millis = F.unix_millis(timestamp)
    by_time = F.concat(F.lit(prefix + "@"), F.lpad(millis.cast("string"), 13, "0"), F.lit(":"), coordinates)
    return F.when(millis >= 0, by_time).otherwise(by_partition)
