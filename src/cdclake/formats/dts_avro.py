"""Alibaba Cloud DTS Avro (``dts-avro``): the default format of DTS sync tasks and subscription channels.

Spec: ``shared/formats/dts.md`` section 1; schema ``shared/formats/dts-record.avsc`` (embedded below, identical
field order, types, union branch order and full names). Kafka value = plain Avro binary of one
``com.alibaba.dts.formats.avro.Record`` (1.1): no container header, no Confluent or single-object framing.

Decisions where the spec leaves room (documented for users):

* Column types come from the value's union branch, refined by ``dataTypeNumber`` (1.7): Integer -> ``bigint``, or
  ``decimal(20,0)`` for 8-byte integers outside PostgreSQL (MySQL BIGINT UNSIGNED exceeds int64, 1.6); Decimal ->
  ``decimal(p,s)`` from the value's precision/scale when Spark can hold it, else exact text (``string``); DateTime
  -> ``date`` / ``timestamp_ntz`` / ``int`` (YEAR) / ``string`` (TIME) by MySQL code or PG OID, else by which parts
  are set; TimestampWithTimeZone -> ``timestamp`` (the instant); PG ``bool`` TextObject -> ``boolean``; PG
  ``jsonb`` BinaryObject -> ``string``. A column that is NULL in every image of the message falls back to a type
  from its ``dataTypeNumber`` (MySQL / PG), else ``string``; except that a column the message holds no value for
  (``NONE`` everywhere), and a MySQL TEXT/BLOB column (codes 249-252, either type) NULL everywhere in a message
  with keys and a full after image, is left out of the columns and images (see ``_untyped_columns``).
* ``EmptyObject.NONE`` (value not logged, 1.6 "inferred"): the column is left out of the image and the image is
  marked partial, so the stored value is kept.
* Keys: ``tags.pk_uk_info`` ``PRIMARY``; else the first unique index listed; else none (1.5, 1.8).
* Table names: PolarDB-X/DRDS logical names ``tags.l_db_name`` / ``l_tb_name`` win over the physical shard (1.4).
* Position: MySQL ``off@file`` -> ``M<file:12><off:20>#<id:20>``; PostgreSQL LSN ``X/Y`` ->
  ``P<X:8 hex><Y:8 hex>#<id:20>``; a plain number (Oracle SCN) -> ``S<n:24>#<id:20>``;
  anything else -> null (Kafka order, which is the primary order anyway, 1.8).
"""

from __future__ import annotations

import functools
import json
from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from cdclake import model
from cdclake.formats import _avro_images as av
from cdclake.formats import register
from cdclake.formats.base import (
    MESSAGE_VALUE,
    CdcFormat,
    FormatOptions,
    analysed_with_java_charsets,
    epoch_timestamp,
    finish,
    first_error,
    op_from_code,
)
from cdclake.model import Op

NAME: Final = "dts-avro"
_NS: Final = "com.alibaba.dts.formats.avro"


def _record(name: str, fields: list[tuple[str, Any]]) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}


_OPT_INT: Final = ["null", "int"]
_DATETIME: Final = {
    "type": "record",
    "name": "DateTime",
    "fields": [
        {"name": part, "type": _OPT_INT, "default": None}
        for part in ("year", "month", "day", "hour", "minute", "second", "millis")
    ],
}
_VALUE_BRANCHES: Final[list[Any]] = [
    "null",
    _record("Integer", [("precision", "int"), ("value", "string")]),
    _record("Character", [("charset", "string"), ("value", "bytes")]),
    _record("Decimal", [("value", "string"), ("precision", "int"), ("scale", "int")]),
    _record("Float", [("value", "double"), ("precision", "int"), ("scale", "int")]),
    _record("Timestamp", [("timestamp", "long"), ("millis", "int")]),
    _DATETIME,
    _record("TimestampWithTimeZone", [("value", "DateTime"), ("timezone", "string")]),
    _record("BinaryGeometry", [("type", "string"), ("value", "bytes")]),
    _record("TextGeometry", [("type", "string"), ("value", "string")]),
    _record("BinaryObject", [("type", "string"), ("value", "bytes")]),
    _record("TextObject", [("type", "string"), ("value", "string")]),
    {"type": "enum", "name": "EmptyObject", "symbols": ["NULL", "NONE"]},
]
_SOURCE_TYPES: Final = [
    "MySQL", "Oracle", "SQLServer", "PostgreSQL", "MongoDB", "Redis", "DB2", "PPAS", "DRDS", "HBASE", "HDFS",
    "FILE", "OTHER",
]  # fmt: skip
_OPERATIONS: Final = [
    "INSERT", "UPDATE", "DELETE", "DDL", "BEGIN", "COMMIT", "ROLLBACK", "ABORT", "HEARTBEAT", "CHECKPOINT",
    "COMMAND", "FILL", "FINISH", "CONTROL", "RDB", "NOOP", "INIT",
]  # fmt: skip

AVRO_SCHEMA: Final = json.dumps(
    {
        "type": "record",
        "name": "Record",
        "namespace": _NS,
        "fields": [
            {"name": "version", "type": "int"},
            {"name": "id", "type": "long"},
            {"name": "sourceTimestamp", "type": "long"},
            {"name": "sourcePosition", "type": "string"},
            {"name": "safeSourcePosition", "type": "string", "default": ""},
            {"name": "sourceTxid", "type": "string", "default": ""},
            {
                "name": "source",
                "type": _record(
                    "Source",
                    [
                        ("sourceType", {"type": "enum", "name": "SourceType", "symbols": _SOURCE_TYPES}),
                        ("version", "string"),
                    ],
                ),
            },
            {"name": "operation", "type": {"type": "enum", "name": "Operation", "symbols": _OPERATIONS}},
            {"name": "objectName", "type": ["null", "string"], "default": None},
            {"name": "processTimestamps", "type": ["null", {"type": "array", "items": "long"}], "default": None},
            {"name": "tags", "type": {"type": "map", "values": "string"}, "default": {}},
            {
                "name": "fields",
                "type": [
                    "null",
                    "string",
                    {"type": "array", "items": _record("Field", [("name", "string"), ("dataTypeNumber", "int")])},
                ],
                "default": None,
            },
            {
                "name": "beforeImages",
                "type": ["null", "string", {"type": "array", "items": _VALUE_BRANCHES}],
                "default": None,
            },
            {
                "name": "afterImages",
                "type": [
                    "null",
                    "string",
                    {"type": "array", "items": ["null", *(f"{_NS}.{b['name']}" for b in _VALUE_BRANCHES[1:])]},
                ],
                "default": None,
            },
            {"name": "bornTimestamp", "type": "long", "default": 0},
        ],
    },
    separators=(",", ":"),
)
"""The DTS record schema (``shared/formats/dts-record.avsc`` without its docs)."""

# dts.md 1.3: the Operation enum -> canonical.
OPERATIONS: Final = {
    "INSERT": Op.INSERT,
    "UPDATE": Op.UPDATE,
    "DELETE": Op.DELETE,
    "DDL": Op.DDL,
    "BEGIN": Op.TXN_BEGIN,
    "COMMIT": Op.TXN_END,
    "ROLLBACK": Op.OTHER,
    "ABORT": Op.OTHER,
    "HEARTBEAT": Op.HEARTBEAT,
    "CHECKPOINT": Op.OTHER,
    "COMMAND": Op.DDL,  # MongoDB command; the DTS SDK maps it to DDL
    "FILL": Op.OTHER,
    "FINISH": Op.OTHER,
    "CONTROL": Op.OTHER,
    "RDB": Op.OTHER,
    "NOOP": Op.OTHER,
    "INIT": Op.UPSERT,
}

NOOP_MAX_BYTES: Final = 48
"""dts.md 1.1: values of at most this many bytes are offset-advancing placeholders: skipped (OTHER), not errors."""

# dts.md 1.7: MySQL binlog type codes -> Spark type, used when every image of the message holds NULL for the column.
MYSQL_TYPES: Final = {
    1: "bigint", 2: "bigint", 3: "bigint", 9: "bigint", 8: "decimal(20,0)", 16: "decimal(20,0)",
    4: "double", 5: "double", 7: "timestamp", 17: "timestamp", 10: "date", 14: "date", 12: "timestamp_ntz",
    18: "timestamp_ntz", 13: "int", 11: "string", 19: "string", 15: "string", 253: "string", 254: "string",
    245: "string", 247: "string", 248: "string", 255: "binary",
}  # fmt: skip
# dts.md 1.7: PostgreSQL type OIDs.
PG_TYPES: Final = {
    16: "boolean", 17: "binary", 20: "bigint", 21: "bigint", 23: "bigint", 25: "string", 700: "double",
    701: "double", 1043: "string", 1082: "date", 1083: "string", 1114: "timestamp_ntz", 1184: "timestamp",
    3802: "string", 114: "string",
}  # fmt: skip
PG_BOOL_OID: Final = 16
PG_JSONB_OID: Final = 3802


def _code_map(mapping: dict[int, str]) -> Column:
    pairs: list[Column] = []
    for code, spark in mapping.items():
        pairs += [F.lit(code), F.lit(spark)]
    return F.create_map(*pairs)


def _datetime_kind(parts: Column, dtn: Column, is_mysql: Column, is_pg: Column) -> Column:
    """date | timestamp_ntz | int (YEAR) | string (TIME), dts.md 1.6 ("only the parts of the SQL type are set")."""
    by_code = (
        F.when(is_mysql & dtn.isin(10, 14), F.lit("date"))
        .when(is_mysql & dtn.isin(7, 12, 17, 18), F.lit("timestamp_ntz"))
        .when(is_mysql & dtn.isin(11, 19), F.lit("string"))
        .when(is_mysql & (dtn == 13), F.lit("int"))
        .when(is_pg & (dtn == 1082), F.lit("date"))
        .when(is_pg & (dtn == 1114), F.lit("timestamp_ntz"))
        .when(is_pg & dtn.isin(1083, 1266), F.lit("string"))
    )
    has_date = parts["year"].isNotNull() & parts["month"].isNotNull() & parts["day"].isNotNull()
    by_parts = (
        F.when(has_date & parts["hour"].isNotNull(), F.lit("timestamp_ntz"))
        .when(has_date, F.lit("date"))
        .when(parts["year"].isNotNull(), F.lit("int"))
        .otherwise(F.lit("string"))
    )
    return F.coalesce(by_code, by_parts)


def _fraction_micros(parts: Column, nanos: Column) -> Column:
    # dts.md 1.6: DateTime.millis is microseconds for MySQL and PostgreSQL, nanoseconds for the others.
    raw = F.coalesce(parts["millis"], F.lit(0)).cast("bigint")
    return F.when(nanos, F.floor(raw / 1000)).otherwise(raw).cast("bigint")


def _datetime(parts: Column, kind: Column, nanos: Column) -> Column:
    micros = _fraction_micros(parts, nanos)
    h, mi, s = (F.coalesce(parts[p], F.lit(0)) for p in ("hour", "minute", "second"))
    ymd = F.format_string("%04d-%02d-%02d", parts["year"], parts["month"], parts["day"])
    time = F.concat(
        F.format_string("%02d:%02d:%02d", h, mi, s),
        F.when(micros != 0, F.format_string(".%06d", micros)).otherwise(F.lit("")),
    )
    text = (
        F.when(kind == "date", ymd)
        .when(
            kind == "timestamp_ntz", F.concat(ymd, F.lit(" "), F.format_string("%02d:%02d:%02d.%06d", h, mi, s, micros))
        )
        .when(kind == "int", parts["year"].cast("string"))
        .otherwise(time)
    )
    return av.value(text, kind)


# Zone offsets as java.time.ZoneId.of reads them, alone or after UTC/GMT/UT, within its +-18:00.
_ZONE_OFFSET: Final = r"^(?:UTC|GMT|UT)?[+-](?:(?:0?\d|1[0-7])(?::?[0-5]\d){0,2}|18(?::?00){0,2})$"


@functools.cache
def _zone_ids() -> tuple[str, ...]:
    """The region and short zone IDs the driver's JVM knows (``ZoneId.getAvailableZoneIds``, ``Z``)."""
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    assert session is not None, "decoders are built in a Spark session"
    jvm = session._jvm  # the JVM's own zone list, which Spark's zone parsing uses
    assert jvm is not None
    return ("Z", *sorted(str(zone) for zone in jvm.java.time.ZoneId.getAvailableZoneIds()))


def _known_zone(zone: Column) -> Column:
    """``zone`` where Spark can read it, else NULL: ``make_timestamp`` fails the whole batch on an unknown zone
    (INVALID_TIMEZONE; its try_ form too), which one corrupt or odd record's ``timezone`` must not do."""
    return F.when(zone.rlike(_ZONE_OFFSET) | zone.isin(*_zone_ids()), zone)


def _timestamp_tz(member: Column, nanos: Column) -> Column:
    parts = member["value"]
    micros = _fraction_micros(parts, nanos)
    seconds = F.coalesce(parts["second"], F.lit(0)).cast("decimal(16,6)") + micros.cast("decimal(16,6)") / 1_000_000
    instant = F.try_make_timestamp(
        parts["year"],
        parts["month"],
        parts["day"],
        F.coalesce(parts["hour"], F.lit(0)),
        F.coalesce(parts["minute"], F.lit(0)),
        seconds.cast("decimal(16,6)"),
        _known_zone(member["timezone"]),
    )
    return av.value(
        F.unix_micros(instant),
        "timestamp",
        F.when(instant.isNull(), F.format_string("invalid TimestampWithTimeZone in zone '%s'", member["timezone"])),
    )


def _convert(dtn: Column, item: Column, ctx: dict[str, Column]) -> Column:
    """One element of before/afterImages (the 13-branch union, dts.md 1.6) -> :data:`av.VALUE_TYPE`."""
    is_mysql, is_pg, nanos = ctx["is_mysql"], ctx["is_pg"], ctx["nanos"]
    integer_type = (
        F.when(is_pg, F.lit("bigint"))
        .when((item["member0"]["precision"] >= 8) | (is_mysql & dtn.isin(8, 16)), F.lit("decimal(20,0)"))
        .otherwise(F.lit("bigint"))
    )
    datetime = item["member5"]
    text_object, binary_object = item["member10"], item["member9"]
    pg_bool = is_pg & ((dtn == PG_BOOL_OID) | (F.upper(text_object["type"]) == "BOOL"))
    bool_text = F.lower(text_object["value"])
    jsonb = (is_pg & (dtn == PG_JSONB_OID)) | (F.upper(binary_object["type"]) == "JSONB")
    jsonb_text = binary_object["value"].cast("string")
    empty = item["member11"]
    return F.when(item.isNull(), av.null_value()).otherwise(
        av.choose(
            [
                (item["member0"], av.integer(item["member0"], integer_type)),
                (item["member1"], av.character(item["member1"])),
                (item["member2"], av.decimal(item["member2"])),
                (item["member3"], av.double(item["member3"])),
                (item["member4"], av.epoch_micros(item["member4"]["timestamp"], item["member4"]["millis"])),
                (datetime, _datetime(datetime, _datetime_kind(datetime, dtn, is_mysql, is_pg), nanos)),
                (item["member6"], _timestamp_tz(item["member6"], nanos)),
                (item["member7"], av.binary(item["member7"])),
                (item["member8"], av.text(item["member8"])),
                (
                    binary_object,
                    F.when(
                        jsonb,
                        av.value(
                            jsonb_text,
                            "string",
                            F.when(~F.is_valid_utf8(jsonb_text), F.lit("jsonb bytes are not UTF-8")),
                        ),
                    ).otherwise(av.binary(binary_object)),
                ),
                (
                    text_object,
                    F.when(
                        pg_bool,
                        av.value(
                            F.when(bool_text.isin("t", "true"), F.lit("true")).when(
                                bool_text.isin("f", "false"), F.lit("false")
                            ),
                            "boolean",
                            F.when(
                                ~bool_text.isin("t", "true", "f", "false"),
                                F.format_string("bool value '%s'", text_object["value"]),
                            ),
                        ),
                    ).otherwise(av.text(text_object)),
                ),
                # EmptyObject: NULL is SQL NULL; NONE = not logged -> absent (keep the stored value).
                (empty, av.value(F.lit(None), None, absent=empty == "NONE")),
            ]
        )
    )


MYSQL_TEXT_OR_BLOB: Final = (249, 250, 251, 252)
"""dts.md 1.7: TINY/MEDIUM/LONG/BLOB codes, shared by TEXT (Character values) and BLOB (BinaryObject values)."""


def _untyped_columns(
    fields: Column, before: Column, after: Column, is_mysql: Column, *, has_keys: Column, full: Column
) -> Column:
    """Names of the columns the message cannot type and leaves out of ``columns`` and its images.

    The type of a column comes from its value's union branch; NULL and ``EmptyObject.NONE`` have none. For most
    codes the fallback (``MYSQL_TYPES`` / ``PG_TYPES``) is the type, but TEXT and BLOB share the MySQL codes
    249-252 (dts.md 1.7), so any guess is wrong for one of them, and the message that creates a lake table fixes
    its column types: a BLOB guessed as ``string`` would hold base64 text for good. So a column is left out when
    no image holds a value for it (NONE everywhere: nothing to write either), and a TEXT/BLOB column that is NULL
    everywhere is left out when the message has keys and a full after image: a column missing from a full image is
    written as NULL, which is what the NULL says. (Without keys the declared columns are the row identity, and with
    a partial image a missing column keeps its stored value: there the fallback type stays.)"""

    def untyped(field: Column, i: Column) -> Column:
        after_value, before_value = F.get(after, i)["value"], F.get(before, i)["value"]
        no_type = F.coalesce(after_value["spark_type"], before_value["spark_type"]).isNull()
        not_logged = (
            (after.isNull() | after_value["absent"])
            & (before.isNull() | before_value["absent"])
            & (after.isNotNull() | before.isNotNull())
        )
        text_or_blob = is_mysql & field["dataTypeNumber"].isin(*MYSQL_TEXT_OR_BLOB)
        return F.coalesce(no_type & (not_logged | (text_or_blob & has_keys & full)), F.lit(False))

    names = F.transform(fields, lambda f, i: F.when(untyped(f, i), f["name"]))
    return F.filter(names, lambda name: name.isNotNull())


def _object_name(object_name: Column) -> tuple[Column, Column, Column, Column]:
    """dts.md 1.4: split on '.', then unescape the literal ``\\u002E``; 1 part db, 2 db.table, 3 db.schema.table."""
    parts = F.transform(F.split(object_name, r"\."), lambda p: F.replace(p, F.lit("\\u002E"), F.lit(".")))
    n = F.size(parts)
    database = F.when(n >= 1, F.get(parts, 0))
    schema = F.when(n == 3, F.get(parts, 1))
    table = F.when(n == 2, F.get(parts, 1)).when(n == 3, F.get(parts, 2))
    return database, schema, table, (object_name.isNotNull() & (n > 3))


def _position(source_position: Column, record_id: Column) -> Column:
    """dts.md 1.2/1.8: MySQL ``<offset>@<fileNumber>`` ordered by file then offset, ``id`` as tiebreak."""
    mysql = F.regexp_extract(source_position, r"^(\d+)@(\d+)$", 0) != ""
    offset = F.regexp_extract(source_position, r"^(\d+)@(\d+)$", 1)
    file_number = F.regexp_extract(source_position, r"^(\d+)@(\d+)$", 2)
    lsn = F.regexp_extract(source_position, r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$", 0) != ""
    lsn_hi = F.upper(F.regexp_extract(source_position, r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$", 1))
    lsn_lo = F.upper(F.regexp_extract(source_position, r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$", 2))
    scn = model.sortable_decimal(source_position)  # Oracle and other sources with a plain log sequence number
    tiebreak = F.concat(F.lit("#"), model.sortable_decimal(F.when(record_id >= 0, record_id.cast("string")), 20))
    return (
        F.when(
            mysql,
            F.concat(F.lit("M"), model.sortable_decimal(file_number, 12), model.sortable_decimal(offset, 20), tiebreak),
        )
        .when(lsn, F.concat(F.lit("P"), F.lpad(lsn_hi, 8, "0"), F.lpad(lsn_lo, 8, "0"), tiebreak))
        .when(scn.isNotNull(), F.concat(F.lit("S"), scn, tiebreak))
    )


def _record_fields(r: Column) -> Column:
    """The record's field list (name, type code); empty when the record has none."""
    return F.coalesce(r["fields"]["member1"], F.array().cast("array<struct<name:string,dataTypeNumber:int>>"))


@functools.cache
def _aligned_images() -> tuple[Column, Column]:
    """``_before`` and ``_after``: each field of the staged record ``_r`` with its converted image value. Built once
    per process (no Column argument: see cdclake.formats.base's module doc); the conversion is the largest
    expression of the decoder."""
    r, is_mysql, is_pg = F.col("_r"), F.col("_is_mysql"), F.col("_is_pg")
    ctx = {"is_mysql": is_mysql, "is_pg": is_pg, "nanos": ~(is_mysql | is_pg)}
    fields = _record_fields(r)

    def aligned(items: Column) -> Column:
        return av.align(fields, items, lambda f, item: _convert(f["dataTypeNumber"], item, ctx))

    return (
        aligned(r["beforeImages"]["member1"]).alias("_before"),
        aligned(r["afterImages"]["member1"]).alias("_after"),
    )


@analysed_with_java_charsets
def decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """DTS Avro messages -> canonical events (one per message)."""
    del options  # the format has none
    raw = F.col(MESSAGE_VALUE)
    parsed = messages.withColumn("_r", from_avro(raw, AVRO_SCHEMA, {"mode": "PERMISSIVE"}))
    r = F.col("_r")
    # PERMISSIVE from_avro yields a struct of nulls for undecodable bytes; `operation` is a required enum.
    decoded_ok = r.isNotNull() & r["operation"].isNotNull()
    placeholder = raw.isNotNull() & (F.length(raw) <= NOOP_MAX_BYTES)  # dts.md 1.1: skip, not an error
    vendor_op = F.when(placeholder, F.coalesce(F.when(decoded_ok, r["operation"]), F.lit("NOOP"))).otherwise(
        r["operation"]
    )
    op = F.when(placeholder, F.lit(Op.OTHER.value)).otherwise(op_from_code(vendor_op, OPERATIONS))
    source_type = r["source"]["sourceType"]
    is_mysql = F.coalesce(source_type == "MySQL", F.lit(False))
    is_pg = F.coalesce(source_type == "PostgreSQL", F.lit(False)) & ~F.coalesce(
        r["sourcePosition"].contains("<->"), F.lit(False)
    )
    # dts.md 1.2: a sourcePosition with `<->` is a PG physical-log reader, treated as PPAS (nanosecond fractions).
    # Staged as columns (referenced more than once, so the optimizer keeps them): every value conversion reads the
    # source flags and every field's type check reads the key lists, and an expression used inside a lambda is
    # evaluated again for every element (Spark does not hoist it out of the loop).
    parsed = parsed.select(
        "*",
        is_mysql.alias("_is_mysql"),
        is_pg.alias("_is_pg"),
        F.from_json(r["tags"]["pk_uk_info"], "MAP<STRING, ARRAY<STRING>>").alias("_uniques"),
    )
    is_mysql, is_pg = F.col("_is_mysql"), F.col("_is_pg")
    fields = _record_fields(r)
    before_items, after_items = r["beforeImages"]["member1"], r["afterImages"]["member1"]
    with_images = parsed.select("*", *_aligned_images())
    before, after = F.col("_before"), F.col("_after")
    mysql_types, pg_types = _code_map(MYSQL_TYPES), _code_map(PG_TYPES)

    def fallback_type(code: Column) -> Column:
        return F.when(is_mysql, F.try_element_at(mysql_types, code)).when(is_pg, F.try_element_at(pg_types, code))

    tags = r["tags"]
    database, schema, table, too_many_parts = _object_name(r["objectName"])
    database = F.coalesce(tags["l_db_name"], database)
    table = F.when(table.isNotNull(), F.coalesce(tags["l_tb_name"], table))
    uniques = F.col("_uniques")
    keys = F.coalesce(
        uniques["PRIMARY"],
        F.get(F.map_values(uniques), 0),
        F.array().cast("array<string>"),
    )
    is_row = op.isin(Op.INSERT.value, Op.UPDATE.value, Op.DELETE.value, Op.UPSERT.value)
    is_ddl = op == Op.DDL.value

    def has_absent(items: Column) -> Column:
        # No lambda: this runs inside the per-field lambda of _untyped_columns.
        return F.array_contains(F.coalesce(items, F.array())["value"]["absent"], True)

    untyped_names = _untyped_columns(
        fields, before, after, is_mysql, has_keys=F.size(keys) > 0, full=~has_absent(after)
    )
    with_images = with_images.select("*", untyped_names.alias("_untyped"))
    untyped_names = F.col("_untyped")
    columns = F.filter(
        av.declared_columns(fields, before, after, fallback_type), lambda c: ~F.array_contains(untyped_names, c["name"])
    )

    def image(aligned_image: Column, items: Column) -> Column:
        return F.map_filter(
            av.image(aligned_image, items.isNotNull()), lambda k, _v: ~F.array_contains(untyped_names, k)
        )

    txid = r["sourceTxid"]
    position = _position(r["sourcePosition"], r["id"])
    decoded = with_images.select(
        "*",
        op.alias(model.OP),
        vendor_op.alias(model.VENDOR_OP),
        F.when(decoded_ok, source_type).alias(model.DB_TYPE),
        F.when(decoded_ok & ~placeholder, database).alias(model.DATABASE),
        F.when(decoded_ok & ~placeholder & is_row, schema).alias(model.SCHEMA),
        F.when(decoded_ok & ~placeholder & is_row, table).alias(model.TABLE),
        F.when(is_row, keys).alias(model.KEY_COLUMNS),
        F.when(is_row, image(before, before_items)).alias(model.BEFORE),
        F.when(is_row, image(after, after_items)).alias(model.AFTER),
        (is_row & has_absent(after)).alias(model.AFTER_IS_PARTIAL),
        F.when(is_row, columns).alias(model.COLUMNS),
        F.when(decoded_ok, position).alias(model.POSITION),
        F.when(decoded_ok, epoch_timestamp(r["sourceTimestamp"], "s")).alias(model.EVENT_TIME),
        F.when(decoded_ok & ~txid.isin("", "0"), txid).alias(model.TXN_ID),
        F.when(is_ddl, r["afterImages"]["member0"]).alias(model.DDL),
    )
    names = fields["name"]

    after_error = av.first_value_error(after, "afterImages")
    before_error = av.first_value_error(before, "beforeImages")
    error = F.when(placeholder, F.lit(None).cast("string")).otherwise(
        first_error(
            (raw.isNull(), "empty message (null Kafka value)"),
            (~decoded_ok, "malformed DTS Avro record (not decodable with the DTS Record schema)"),
            (op.isNull(), F.format_string("unknown DTS operation '%s'", vendor_op)),
            (too_many_parts, F.format_string("objectName '%s' has more than 3 parts", r["objectName"])),
            (is_row & r["objectName"].isNull(), "row event without objectName"),
            (is_row & table.isNull(), F.format_string("row event objectName '%s' names no table", r["objectName"])),
            *av.image_shape_checks(is_row, fields, names, before_items, after_items),
            (
                tags["pk_uk_info"].isNotNull() & (tags["pk_uk_info"] != "") & uniques.isNull(),
                F.format_string("tags.pk_uk_info is not a JSON object of name lists: %s", tags["pk_uk_info"]),
            ),
            (is_row & after_error.isNotNull(), after_error),
            (is_row & before_error.isNotNull(), before_error),
        )
    )
    return finish(decoded, NAME, error)


FORMAT: Final = register(
    CdcFormat(
        name=NAME,
        description="Alibaba Cloud DTS Avro (sync tasks and subscription channels; plain Avro binary Record)",
        decode=decode,
        encoding="binary",
        operations=OPERATIONS,
        sniff=None,  # README "Recognition": binary; DTS's leading 0x00 collides with Confluent framing
        examples=("dts-avro.jsonl",),
    )
)
