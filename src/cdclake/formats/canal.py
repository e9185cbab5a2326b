"""Canal flat message (``canal-json``), its DTS look-alike (``dts-canal-json``), and the shared Canal-family decoder.

Specs: ``shared/formats/canal.md`` (open-source Canal), ``shared/formats/dts.md`` section 2 (DTS Canal JSON),
``shared/formats/drs.md`` sections 2-4 (DRS JSON, JSON-C; they reuse :func:`make_decoder` from ``drs_json``).
One JSON object per binlog rows event or DDL::

    {"id", "database", "table", "pkNames", "isDdl", "type", "es", "ts", "sql", "sqlType": {col: code},
     "mysqlType": {col: type}, "data": [{col: text}, ..], "old": [{col: text}, ..], "gtid"}

A message holds several rows (``data[i]`` pairs with ``old[i]``): one canonical event per row, ``sub_index`` = row
index. What ``data`` / ``old`` mean differs per dialect (:class:`Dialect`); values are JSON strings or null in every
dialect, decoded with the declared column type. DTS and DRS have no TRUNCATE type: a DDL message whose ``sql`` is a
``TRUNCATE`` of the message's own table becomes a TRUNCATE event (:func:`truncates_table`). The Canal family cannot
be told apart from one message (README, "Recognition"): these formats have no sniff rule and must be configured per
topic.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdclake import model
from cdclake.formats import register
from cdclake.formats.base import (
    DUPLICATE_KEY,
    EXACT_TEXT_IMAGE,
    EXACT_TEXT_IMAGES,
    MESSAGE_VALUE,
    CdcFormat,
    DecodeFn,
    FormatOptions,
    epoch_timestamp,
    finish,
    first_error,
    op_from_code,
    values_in_key_order,
    with_missing_as_null,
    with_unique_keys,
)
from cdclake.model import Op

RAW_SCHEMA: Final = """
    id STRING,
    database STRING,
    table STRING,
    schema STRING,
    dbType STRING,
    pkNames ARRAY<STRING>,
    isDdl BOOLEAN,
    type STRING,
    opType STRING,
    es BIGINT,
    ts BIGINT,
    sql STRING,
    sqlType MAP<STRING, STRING>,
    mysqlType MAP<STRING, STRING>,
    columnType MAP<STRING, STRING>,
    data ARRAY<MAP<STRING, VARIANT>>,
    old ARRAY<MAP<STRING, VARIANT>>,
    gtid STRING,
    _corrupt_record STRING
"""
"""Union of the keys of every Canal-family dialect. Row images are ``MAP<STRING, VARIANT>`` so that a value sent as
an unquoted JSON number (not expected: every dialect quotes values) keeps its exact text (base.exact_text_image)."""

TIMEZONE_OPTION: Final = "source_timezone"
"""Zone of timestamps that are rendered as wall-clock text (Canal MySQL TIMESTAMP, DRS JSON-C TIMESTAMP,
timestamptz without offset). A region id (``Asia/Shanghai``) or offset (``+08:00``); default ``UTC``."""

# canal.md section 2 (open-source Canal EventType names).
CANAL_OPERATIONS: Final = {
    "INSERT": Op.INSERT,
    "UPDATE": Op.UPDATE,
    "DELETE": Op.DELETE,
    "CREATE": Op.DDL,
    "ALTER": Op.DDL,
    "ERASE": Op.DDL,
    "RENAME": Op.DDL,
    "CINDEX": Op.DDL,
    "DINDEX": Op.DDL,
    "QUERY": Op.DDL,
    "TRUNCATE": Op.TRUNCATE,
    "GTID": Op.OTHER,
    "XACOMMIT": Op.OTHER,
    "XAROLLBACK": Op.OTHER,
    "MHEARTBEAT": Op.HEARTBEAT,
}

# dts.md section 2: "Canonical ops: INSERT, UPDATE, DELETE, DDL, INIT->UPSERT. No heartbeat/transaction records."
DTS_OPERATIONS: Final = {
    "INSERT": Op.INSERT,
    "UPDATE": Op.UPDATE,
    "DELETE": Op.DELETE,
    "DDL": Op.DDL,
    "INIT": Op.UPSERT,
}

_ROW_OPS: Final = tuple(o.value for o in model.ROW_OPS)
_INTEGERS: Final = ("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "bool", "boolean", "year")
_DECIMALS: Final = ("decimal", "numeric", "dec", "fixed")
_FLOATS: Final = ("float", "double", "real", "double precision")
_STRINGS: Final = (
    "char",
    "varchar",
    "tinytext",
    "text",
    "mediumtext",
    "longtext",
    "enum",
    "set",
    "json",
    "time",
    "character",
    "character varying",
    "nchar",
    "nvarchar",
)
_BINARIES: Final = (
    "binary",
    "varbinary",
    "tinyblob",
    "blob",
    "mediumblob",
    "longblob",
    "geometry",
    "point",
    "linestring",
    "polygon",
    "multipoint",
    "multilinestring",
    "multipolygon",
    "geometrycollection",
    "geomcollection",
)


@dataclass(frozen=True)
class Dialect:
    """What differs between the Canal-family formats.

    Attributes:
        name: registry name.
        operations: ``type`` value -> canonical op.
        old_is_changed_only: open-source Canal: ``old[i]`` holds only the changed columns (canal.md section 1);
            otherwise ``old[i]`` is the full before row.
        delete_row_in: where a DELETE's row is: ``data`` (Canal, DTS current, DRS JSON-C), ``old`` (DRS JSON).
        swap_option: name of the option that selects the pre-2022-03-20 DTS semantics (dts.md section 2), if any.
        types: ``mysql`` (``mysqlType``) or ``relational`` (DRS ``columnType``, drs.md section 4).
        bit_type: Spark type of MySQL BIT columns.
        binary_encoding: ``latin1`` (Canal, canal.md section 3), ``bytelist`` (DRS, drs.md section 2), ``hex``
            (DRS relational bytea, drs.md section 4).
        timestamp_encoding: ``text`` (wall clock in ``source_timezone``) or ``epoch_seconds`` (DRS JSON,
            ``"1624614713.201"``).
        position_from_id: ``id`` is a monotonic sequence (DRS) -> ordering position; else null (Kafka order).
        wrong_delete_hint: error text for a DELETE whose row is in the other array (DRS JSON vs JSON-C).
    """

    name: str
    operations: Mapping[str, Op]
    old_is_changed_only: bool = False
    delete_row_in: Literal["data", "old"] = "data"
    swap_option: str | None = None
    swap_aliases: tuple[str, ...] = ()
    types: Literal["mysql", "relational"] = "mysql"
    bit_type: str = "bigint"
    binary_encoding: Literal["latin1", "bytelist", "hex"] = "latin1"
    timestamp_encoding: Literal["text", "epoch_seconds"] = "text"
    position_from_id: bool = False
    wrong_delete_hint: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------------------------
# Types


def mysql_spark_types(vendor_types: Column, bit_type: str) -> Column:
    """Spark types for a map of MySQL column types as ``mysqlType`` spells them: with length/sign (Canal, ``bigint(20)
    unsigned``, ``decimal(10,2)``) or bare (DTS, DRS: ``bigint``, ``decimal``). Null for an unknown type.

    Integers -> bigint, BIGINT UNSIGNED -> decimal(20,0) (canal.md section 3: unsigned values are printed
    unsigned); DECIMAL(p,s) -> decimal(p,s) when p <= 38, else (and bare ``decimal``, whose scale is unknown)
    string, so that the exact text is kept; DATETIME -> timestamp_ntz (a wall clock); TIMESTAMP -> timestamp (an
    instant); TIME -> string (may be negative or >= 24h); JSON/ENUM/SET -> string.

    The bare type name is worked out in a step of its own: tested inside the same lambda, each test would run its
    regular expressions again (Spark does not share subexpressions inside lambdas).
    """
    spelled = F.transform_values(vendor_types, lambda _k, v: F.lower(F.trim(v)))
    parts = F.transform_values(spelled, lambda _k, t: F.struct(t.alias("t"), _mysql_base_type(t).alias("base")))
    return F.transform_values(parts, lambda _k, p: _mysql_spark_type(p["t"], p["base"], bit_type))


def _mysql_base_type(t: Column) -> Column:
    """``decimal(10,2) unsigned zerofill`` -> ``decimal`` (``t`` lower-cased and trimmed)."""
    base = F.trim(F.regexp_replace(F.regexp_replace(t, r"\(.*?\)", ""), r"\b(unsigned|signed|zerofill)\b", ""))
    return F.regexp_replace(base, r"\s+", " ")


def _mysql_spark_type(t: Column, base: Column, bit_type: str) -> Column:
    unsigned = t.rlike(r"\bunsigned\b")
    precision = F.regexp_extract(t, r"\(\s*(\d+)\s*(,\s*(\d+)\s*)?\)", 1)
    scale = F.regexp_extract(t, r"\(\s*(\d+)\s*,\s*(\d+)\s*\)", 2)
    # try_cast: a digit run no int holds (`decimal(99999999999,2)`) makes a string column, not a failed batch.
    digits = precision.try_cast("int")
    decimal = F.when(
        (digits <= 38) & (digits >= 1),
        F.format_string("decimal(%s,%s)", digits, F.coalesce(F.nullif(scale, F.lit("")), F.lit("0"))),
    ).otherwise(F.lit("string"))
    return (
        F.when((base == "bigint") & unsigned, F.lit("decimal(20,0)"))
        .when(base.isin(*_INTEGERS), F.lit("bigint"))
        .when(base.isin(*_DECIMALS), decimal)
        .when(base.isin(*_FLOATS), F.lit("double"))
        .when(base.isin(*_STRINGS), F.lit("string"))
        .when(base.isin(*_BINARIES), F.lit("binary"))
        .when(base == "bit", F.lit(bit_type))
        .when(base == "date", F.lit("date"))
        .when(base == "datetime", F.lit("timestamp_ntz"))
        .when(base == "timestamp", F.lit("timestamp"))
    )


def relational_spark_types(vendor_types: Column) -> Column:
    """Spark types for a map of DRS ``columnType`` values (drs.md section 4: PostgreSQL/GaussDB names without length;
    empty for Oracle and SQL Server). Types without precision (numeric) and every type not listed -> string (exact
    text). The spelling is normalised in a step of its own (see :func:`mysql_spark_types`)."""
    spelled = F.transform_values(vendor_types, lambda _k, v: F.regexp_replace(F.lower(F.trim(v)), r"\s+", " "))
    return F.transform_values(spelled, lambda _k, t: _relational_spark_type(t))


def _relational_spark_type(t: Column) -> Column:
    return (
        F.when(t.isin("smallint", "integer", "bigint", "int", "int2", "int4", "int8", "tinyint"), F.lit("bigint"))
        .when(t.isin("real", "float4", "double precision", "float8", "float"), F.lit("double"))
        .when(t.isin("boolean", "bool"), F.lit("boolean"))
        .when(t == "bytea", F.lit("binary"))
        .when(t == "date", F.lit("date"))
        .when(t.isin("timestamp without time zone", "timestamp"), F.lit("timestamp_ntz"))
        .when(t.isin("timestamp with time zone", "timestamptz"), F.lit("timestamp"))
        .otherwise(F.lit("string"))
    )


# ----------------------------------------------------------------------------------------------------------------
# Values -> canonical text


def _invalid(what: str, text: Column) -> Column:
    """Text that fails every non-string type check, naming the problem (the shared check reports it)."""
    return F.concat(F.lit(f"invalid {what}: "), text)


def latin1_bytes(text: Column) -> Column:
    """canal.md section 3: BINARY/VARBINARY/BLOB bytes are mapped 1:1 to chars (ISO-8859-1) -> base64."""
    # A char above U+00FF cannot come from a byte; Spark's encode would fail the batch on it.
    return F.when(~text.rlike(r"[^\x{00}-\x{FF}]"), F.base64(F.encode(text, "ISO-8859-1"))).otherwise(
        _invalid("ISO-8859-1 byte text", text)
    )


def byte_list_bytes(text: Column) -> Column:
    """drs.md section 2: ``"[106, 103, 111]"`` (``"[]"`` empty) -> base64. Values may be signed (Java
    ``Arrays.toString(byte[])``: -128..127) or unsigned (0..255): both accepted, masked ``& 0xFF``."""
    inner = F.regexp_extract(text, r"^\[\s*(.*?)\s*\]$", 1)
    items = F.when(inner == "", F.array().cast("array<string>")).otherwise(F.split(inner, r"\s*,\s*"))
    valid = text.rlike(r"^\[\s*(-?\d{1,3}(\s*,\s*-?\d{1,3})*)?\s*\]$") & F.forall(
        items, lambda x: (x.cast("int") >= -128) & (x.cast("int") <= 255)
    )
    hex_text = F.concat_ws("", F.transform(items, lambda x: F.lpad(F.hex(x.cast("int").bitwiseAND(255)), 2, "0")))
    return F.when(valid, F.base64(F.unhex(hex_text))).otherwise(_invalid("byte list", text))


def hex_bytes(text: Column) -> Column:
    """drs.md section 4: bytea as bare lowercase hex (``"deadbeef00"``; a ``\\x`` prefix is tolerated) -> base64."""
    bare = F.regexp_replace(text, r"^\\x", "")
    valid = bare.rlike(r"^([0-9a-fA-F]{2})*$")
    return F.when(valid, F.base64(F.unhex(bare))).otherwise(_invalid("hex bytes", text))


def epoch_seconds_micros(text: Column) -> Column:
    """drs.md section 2: DRS JSON TIMESTAMP ``"1624614713.201"`` (epoch seconds with fraction) -> epoch µs, exact."""
    valid = text.rlike(r"^-?\d{1,12}(\.\d{0,6})?$")
    micros = (text.cast("decimal(19,6)") * F.lit(1_000_000)).cast("decimal(25,0)").cast("string")
    return F.when(valid, micros).otherwise(_invalid("epoch seconds", text))


_HAS_ZONE: Final = r"(Z|[+-]\d{2}(:?\d{2}(:?\d{2})?)?|\s+[A-Za-z][A-Za-z0-9_+\-/]*)$"


def wall_clock_micros(text: Column, zone: str) -> Column:
    """A ``yyyy-MM-dd HH:mm:ss[.f]`` wall-clock text in ``zone`` (or with its own offset) -> epoch µs.

    The zone is written into the text, so the result never depends on the Spark session time zone.
    """
    zoned = F.when(text.rlike(_HAS_ZONE), text).otherwise(F.concat(text, F.lit(f" {zone}")))
    micros = F.unix_micros(zoned.try_cast("timestamp")).cast("string")
    return F.coalesce(micros, _invalid("timestamp text", text))


def _zero_date_to_null(text: Column) -> Column:
    """MySQL zero dates (``0000-00-00``, ``0000-00-00 00:00:00``) are not representable: they become NULL."""
    return F.when(~text.startswith("0000-00-00"), text)


def canonical_value(dialect: Dialect, spark_type: Column, text: Column, zone: str) -> Column:
    """Canonical text (cdclake.model) for one value of the dialect, given its column's Spark type."""
    if dialect.binary_encoding == "latin1":
        binary = latin1_bytes(text)
    elif dialect.binary_encoding == "bytelist":
        binary = byte_list_bytes(text)
    else:
        binary = hex_bytes(text)
    if dialect.timestamp_encoding == "epoch_seconds":
        instant = epoch_seconds_micros(text)
    else:
        instant = wall_clock_micros(_zero_date_to_null(text), zone)
    boolean = F.lower(F.trim(text))
    return (
        F.when(text.isNull(), F.lit(None).cast("string"))
        .when(spark_type == "binary", binary)
        .when(spark_type == "timestamp", instant)
        .when(spark_type.isin("date", "timestamp_ntz"), _zero_date_to_null(text))
        .when(
            spark_type == "boolean",
            F.when(boolean.isin("true", "t", "1"), F.lit("true"))
            .when(boolean.isin("false", "f", "0"), F.lit("false"))
            .otherwise(text),
        )
        .otherwise(text)
    )


# ----------------------------------------------------------------------------------------------------------------
# Decoder

_NAME_PART: Final = r'(?:`[^`]+`|"[^"]+"|[A-Za-z0-9_$]+)'
_TRUNCATE_STATEMENT: Final = rf"(?is)^\s*truncate\s+(?:table\s+)?((?:{_NAME_PART}\s*\.\s*){{0,2}}{_NAME_PART})\s*;?\s*$"


def truncates_table(sql: Column, table: Column, database: Column, schema: Column) -> Column:
    """Whether ``sql`` is ``TRUNCATE [TABLE] [db.][schema.]name`` of exactly this table: ``name`` (unquoted from
    backticks or double quotes) equals ``table`` and every qualifier equals the database or the schema. Names are
    compared exactly: a statement that does not clearly name this table stays a recorded DDL, never a truncate."""
    name = F.regexp_extract(F.coalesce(sql, F.lit("")), _TRUNCATE_STATEMENT, 1)
    parts = F.transform(
        F.regexp_extract_all(name, F.lit(_NAME_PART), 0), lambda p: F.regexp_replace(p, r'^[`"]|[`"]$', "")
    )
    qualifiers = F.slice(parts, 1, F.greatest(F.size(parts) - 1, F.lit(0)))
    return F.coalesce(
        (name != "")
        & (F.element_at(parts, -1) == table)
        & (
            F.size(F.array_except(qualifiers, F.array(F.coalesce(database, F.lit("")), F.coalesce(schema, F.lit("")))))
            == 0
        ),
        F.lit(False),
    )


def _overlay(base: Column, changed: Column) -> Column:
    """``base`` with the entries of ``changed`` replacing its own (map_concat would reject duplicate keys)."""
    kept = F.map_filter(base, lambda k, _v: ~F.map_contains_key(changed, k))
    return F.when(base.isNotNull() & changed.isNotNull(), F.map_concat(kept, changed)).otherwise(base)


def _timezone(options: FormatOptions) -> str:
    zone = options.get(TIMEZONE_OPTION, "UTC")
    if re.fullmatch(r"[+-]\d{2}:\d{2}", zone):
        return zone
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"format option {TIMEZONE_OPTION}={zone!r} is not a time zone id or +hh:mm offset") from None
    return zone


def _flag(options: FormatOptions, names: tuple[str, ...]) -> bool:
    values = [options[n] for n in names if n in options]
    for value in values:
        if value.strip().lower() not in ("true", "false"):
            raise ValueError(f"format option {names[0]} must be true or false, not {value!r}")
    return any(v.strip().lower() == "true" for v in values)


def _options(dialect: Dialect, options: FormatOptions) -> tuple[str, bool]:
    """The source's time zone and whether DTS's images are swapped; ValueError for a value that is neither."""
    zone = _timezone(options)
    swapped = dialect.swap_option is not None and _flag(options, (dialect.swap_option, *dialect.swap_aliases))
    return zone, swapped


def _check_options(dialect: Dialect, options: FormatOptions) -> None:
    _options(dialect, options)


def make_decoder(dialect: Dialect) -> DecodeFn:
    """The ``decode`` function of one Canal-family dialect."""

    def decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
        return _decode(messages, dialect, *_options(dialect, options))

    decode.__doc__ = f"{dialect.name} messages -> canonical events (one per row of a message)."
    return decode


def _decode(messages: DataFrame, dialect: Dialect, zone: str, swapped: bool) -> DataFrame:
    msg = F.from_json(F.col(MESSAGE_VALUE).cast("string"), RAW_SCHEMA, {"columnNameOfCorruptRecord": "_corrupt_record"})
    m = F.col("_m")
    # drs.md section 4: relational DRS messages also carry the op as `opType` (same value as `type`).
    vendor_op = F.coalesce(m["type"], m["opType"])
    table = F.nullif(m["table"], F.lit(""))
    schema = F.nullif(m["schema"], F.lit(""))
    # drs.md section 4: `database` is empty for Oracle; DRS JSON-C fills it with the schema (vendor page, table 5),
    # and so do we (the shared checks require a database for row events).
    database = F.coalesce(F.nullif(m["database"], F.lit("")), schema)
    op = op_from_code(vendor_op, dialect.operations)
    # DTS (dts.md section 2) and DRS (drs.md sections 2, 4) have no TRUNCATE type: a TRUNCATE TABLE reaches Kafka
    # as a DDL message with the statement in `sql`. When it names the message's own table it is applied as one.
    op = F.when(
        (op == Op.DDL.value) & truncates_table(m["sql"], table, database, schema), F.lit(Op.TRUNCATE.value)
    ).otherwise(op)
    data = m["data"].cast(EXACT_TEXT_IMAGES)  # each row's exact_text_image
    old = m["old"].cast(EXACT_TEXT_IMAGES)
    is_delete = op == Op.DELETE.value
    if dialect.delete_row_in == "old":
        # drs.md section 2: DRS JSON puts the deleted row in `old` (data null).
        rows = F.when(is_delete, old).otherwise(data)
    elif dialect.swap_option is not None:
        # dts.md section 2: DELETE rows are in `data` (current) or `old` (pre-2022-03-20). The place is unambiguous,
        # so a DELETE is read from whichever array holds its row; without the swap option one in `old` is a dead
        # letter all the same (see legacy_delete below).
        rows = F.when(is_delete, F.coalesce(data, old)).otherwise(data)
    else:
        rows = data
    parsed = with_unique_keys(messages, msg, "_m")

    if dialect.types == "mysql":
        vendor_types = m["mysqlType"]
        spark_types = mysql_spark_types(vendor_types, dialect.bit_type)
        declared_types = vendor_types
        type_name = "MySQL"
    else:
        # drs.md section 4: columnType is empty for Oracle and SQL Server; the columns are then the keys of sqlType
        # (DRS-internal codes, not JDBC) and every value is kept as exact text (string).
        has_column_type = F.size(F.coalesce(m["columnType"], F.create_map())) > 0
        declared_types = F.when(has_column_type, m["columnType"]).otherwise(
            F.transform_values(m["sqlType"], lambda _k, code: F.concat(F.lit("sqlType "), code))
        )
        spark_types = F.when(has_column_type, relational_spark_types(m["columnType"])).otherwise(
            F.transform_values(m["sqlType"], lambda _k, _t: F.lit("string"))
        )
        vendor_types = declared_types
        type_name = "column"
    # Staged as columns: the row images look a column's type up once per value, inside lambdas, where Spark would
    # otherwise evaluate the whole type map (a dozen regular expressions per column) again for every value.
    parsed = parsed.select(
        "*",
        data.alias("_data"),
        old.alias("_old"),
        op.alias("_op"),
        vendor_op.alias("_vendor_op"),
        rows.alias("_rows"),
        declared_types.alias("_declared_types"),
        spark_types.alias("_spark_types"),
        vendor_types.alias("_vendor_types"),
    )
    op, vendor_op, data, old, rows = (F.col(c) for c in ("_op", "_vendor_op", "_data", "_old", "_rows"))
    declared_types, spark_types, vendor_types = (
        F.col("_declared_types"),
        F.col("_spark_types"),
        F.col("_vendor_types"),
    )
    is_row = op.isin(*_ROW_OPS)
    is_delete = op == Op.DELETE.value
    names = F.coalesce(F.map_keys(declared_types), F.array().cast("array<string>"))
    unknown_types = F.filter(names, lambda n: spark_types[n].isNull())
    # The type maps share their keys, in the same order (spark_types is built with transform_values), so the columns
    # are the maps zipped: no lambda, and no map lookup per name.
    columns = F.coalesce(
        F.arrays_zip(F.map_keys(declared_types), F.map_values(declared_types), F.map_values(spark_types)).cast(
            f"array<{model.COLUMN_TYPE.simpleString()}>"
        ),
        F.array().cast(f"array<{model.COLUMN_TYPE.simpleString()}>"),
    )
    identifier = m["id"]
    position = model.sortable_decimal(identifier) if dialect.position_from_id else F.lit(None).cast("string")
    size_data, size_old = F.size(F.coalesce(data, F.array())), F.size(F.coalesce(old, F.array()))
    # These checks read the message only: they run once per message, before its rows are exploded (the row checks
    # below come after them, in the order they had in one list).
    message_checks: list[tuple[Column, str | Column]] = [
        (F.col(MESSAGE_VALUE).isNull(), "empty message (null Kafka value)"),
        (F.col(DUPLICATE_KEY).isNotNull(), F.col(DUPLICATE_KEY)),
        (m.isNull() | m["_corrupt_record"].isNotNull(), "malformed JSON (or a field of the wrong JSON type)"),
        (vendor_op.isNull(), f"missing type: not a {dialect.name} message"),
        (op.isNull(), F.format_string(f"unknown {dialect.name} type '%s'", vendor_op)),
        (
            is_row & F.coalesce(m["isDdl"], F.lit(False)),
            F.format_string("isDdl is true but type '%s' is a row operation", vendor_op),
        ),
    ]
    if dialect.position_from_id:
        message_checks += [
            (identifier.isNull(), "missing id (the DRS event sequence number)"),
            (position.isNull(), F.format_string("id '%s' is not a decimal sequence number", identifier)),
        ]
    if dialect.wrong_delete_hint is not None:
        other = old if dialect.delete_row_in == "data" else data
        message_checks.append((is_delete & rows.isNull() & other.isNotNull(), dialect.wrong_delete_hint))
    if dialect.swap_option is not None and not swapped:
        # dts.md section 2: "a DELETE with data == null and old != null proves legacy ... alarm on a proving DELETE".
        # Without the option that topic's UPDATEs are read the current way round, so they land their before values:
        # the DELETE that proves it is a dead letter naming the option, where `status` and `dlq list` show it.
        legacy_delete = is_delete & data.isNull() & old.isNotNull()
        message_checks.append(
            (
                legacy_delete,
                f"DELETE with its row in `old` and `data` null: the layout of DTS instances created before "
                f"2022-03-20, whose UPDATEs hold their before image in `data` (dts.md 2). Set {dialect.swap_option}: "
                f"true for this topic (until then its UPDATEs land their old values), then replay this message",
            )
        )
    row_array = "old" if dialect.delete_row_in == "old" else "data"
    message_checks += [
        (
            is_row & (F.size(F.coalesce(rows, F.array())) == 0),
            F.format_string(
                "%s message without rows in `%s`",
                vendor_op,
                F.when(is_delete, F.lit(row_array)).otherwise(F.lit("data")),
            ),
        ),
        (is_row & table.isNull(), "row event without table"),
        (
            is_row & (F.size(names) == 0),
            f"row event without {'mysqlType' if dialect.types == 'mysql' else 'columnType/sqlType'}",
        ),
        (
            # The type map has one entry per declared name: a null value is an unknown type (no lambda, no lookups).
            is_row & (F.size(F.array_compact(F.map_values(spark_types))) < F.size(spark_types)),
            F.format_string(
                f"unknown {type_name} type '%s' of column %s", vendor_types[unknown_types[0]], unknown_types[0]
            ),
        ),
        (
            (op == Op.UPDATE.value) & old.isNotNull() & (size_old != size_data),
            F.format_string("UPDATE with %d rows in data but %d in old (they pair by index)", size_data, size_old),
        ),
    ]
    # Each row with its `data` and `old` entries (they pair by index; a missing entry is null), as many as the rows.
    row_entries = F.slice(
        F.arrays_zip(F.coalesce(rows, F.array()), F.coalesce(data, F.array()), F.coalesce(old, F.array())),
        1,
        F.size(F.coalesce(rows, F.array())),
    ).cast(f"array<struct<row:{EXACT_TEXT_IMAGE},data:{EXACT_TEXT_IMAGE},old:{EXACT_TEXT_IMAGE}>>")
    # Read once per message: after the explode each row carries these and its own entries, never the parsed message
    # or its row arrays, which Spark would copy into every one of its rows (a message of n rows cost O(n^2)).
    per_message = parsed.select(
        *messages.columns,
        op.alias(model.OP),
        vendor_op.alias(model.VENDOR_OP),
        F.nullif(m["dbType"], F.lit("")).alias(model.DB_TYPE),
        database.alias(model.DATABASE),
        schema.alias(model.SCHEMA),
        table.alias(model.TABLE),
        F.when(is_row, F.coalesce(m["pkNames"], F.array().cast("array<string>"))).alias(model.KEY_COLUMNS),
        F.when(is_row, columns).alias(model.COLUMNS),
        position.alias(model.POSITION),
        epoch_timestamp(m["es"], "ms").alias(model.EVENT_TIME),
        F.nullif(m["gtid"], F.lit("")).alias(model.TXN_ID),
        F.when(op.isin(Op.DDL.value, Op.TRUNCATE.value), m["sql"]).alias(model.DDL),
        spark_types.alias("_spark_types"),
        names.alias("_names"),
        old.isNull().alias("_old_is_null"),
        first_error(*message_checks).alias("_message_error"),
        row_entries.alias("_row_entries"),
    )
    exploded = per_message.select(
        *(c for c in per_message.columns if c != "_row_entries"),
        F.posexplode_outer("_row_entries").alias("_pos", "_entry"),
    )

    op, spark_types, names, pos = F.col(model.OP), F.col("_spark_types"), F.col("_names"), F.col("_pos")
    row_i, data_i, old_i = F.col("_entry.row"), F.col("_entry.data"), F.col("_entry.old")
    is_row = op.isin(*_ROW_OPS)
    is_delete = op == Op.DELETE.value

    def image(full: Column) -> Column:
        """Canonical values of a staged row (with its missing columns): each value's rule needs its column's type,
        and a map lookup per value (several, as the rule tests the type) is the slow part. Rows usually list their
        columns in the order of the type map (Canal builds both from one column list): then the types are the
        type map's values as they stand; otherwise each key is looked up once."""
        keys = F.map_keys(full)
        types = values_in_key_order(spark_types, keys)
        values = F.zip_with(F.map_values(full), types, lambda v, t: canonical_value(dialect, t, v, zone))
        return F.map_from_arrays(keys, values)

    if dialect.old_is_changed_only:
        # canal.md section 1: old[i] = previous values of the CHANGED columns; before = data[i] overlaid with old[i].
        # Without old[i] the before image is unknown (null), not the after image.
        update_before, update_after = F.when(old_i.isNotNull(), _overlay(data_i, old_i)), data_i
    elif swapped:
        # dts.md section 2: instances created before 2022-03-20: UPDATE data = before, old = after.
        update_before, update_after = data_i, old_i
    else:
        update_before, update_after = old_i, data_i
    before = F.when(op == Op.UPDATE.value, update_before).when(is_delete, row_i)
    after = F.when(
        op.isin(Op.INSERT.value, Op.UPSERT.value, Op.UPDATE.value),
        F.when(op == Op.UPDATE.value, update_after).otherwise(row_i),
    )

    # Staged as columns: image() reads a row several times (and Spark evaluates an expression inside a lambda once
    # per element), so the overlaid before image would otherwise be rebuilt for every declared column.
    exploded = exploded.select("*", before.alias("_before_row"), after.alias("_after_row"))
    # canal.md section 1: a missing key is NULL.
    exploded = exploded.select(
        "*",
        with_missing_as_null(F.col("_before_row"), names).alias("_before_full"),
        with_missing_as_null(F.col("_after_row"), names).alias("_after_full"),
    )
    before, after = F.col("_before_full"), F.col("_after_full")
    decoded = exploded.select(
        "*",
        F.when(is_row, image(before)).alias(model.BEFORE),
        F.when(is_row, image(after)).alias(model.AFTER),
        F.coalesce(pos, F.lit(0)).alias(model.SUB_INDEX),
    )
    row_checks: list[tuple[Column, str | Column]] = [
        (
            is_row & row_i.isNull(),
            F.format_string("row %d of the message is null", F.coalesce(pos, F.lit(0))),
        ),
    ]
    if not dialect.old_is_changed_only:
        row_checks.append(
            (
                (op == Op.UPDATE.value) & (F.col("_old_is_null") | old_i.isNull()),
                "UPDATE without its full row in `old`",
            )
        )
    return finish(decoded, dialect.name, F.coalesce(F.col("_message_error"), first_error(*row_checks)))


def format_for(dialect: Dialect, description: str, examples: tuple[str, ...]) -> CdcFormat:
    """Registers one dialect (the Canal family has no sniff rule: README "Recognition")."""
    options = {TIMEZONE_OPTION: "zone of TIMESTAMP values rendered as wall-clock text (default UTC)"}
    options.update(dialect.options)
    mysql = dialect.types == "mysql"
    return register(
        CdcFormat(
            name=dialect.name,
            description=description,
            decode=make_decoder(dialect),
            operations=dialect.operations,
            options=options,
            option_aliases={alias: dialect.swap_option for alias in dialect.swap_aliases if dialect.swap_option},
            validate_options=functools.partial(_check_options, dialect),
            sniff=None,
            examples=examples,
            ddl_types=functools.partial(mysql_spark_types, bit_type=dialect.bit_type) if mysql else None,
            ddl_dialect="MySQL" if mysql else None,
        )
    )


CANAL: Final = Dialect(name="canal-json", operations=CANAL_OPERATIONS, old_is_changed_only=True)

DTS_SWAP_OPTION: Final = "legacy_old_data_swap"

DTS_CANAL: Final = Dialect(
    name="dts-canal-json",
    operations=DTS_OPERATIONS,
    swap_option=DTS_SWAP_OPTION,
    swap_aliases=("legacy_swap",),
    options={
        DTS_SWAP_OPTION: "true for DTS instances created before 2022-03-20 and never restarted: UPDATE data = "
        "before and old = after (alias: legacy_swap). DELETEs are then read from whichever of data/old holds the row; "
        "without it a DELETE with its row in old (which proves the old layout) is a dead letter naming this option.",
    },
)

FORMAT: Final = format_for(
    CANAL, "Alibaba Canal flat message JSON (canal.mq.flatMessage=true), multi-row", ("canal-flat.jsonl",)
)
DTS_FORMAT: Final = format_for(
    DTS_CANAL,
    "Alibaba DTS Canal JSON (old = full before row; option for pre-2022-03-20 swapped old/data)",
    ("dts-canal-json.jsonl",),
)
