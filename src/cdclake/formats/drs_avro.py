"""Huawei Cloud DRS Avro (``drs-avro``).

Spec: ``shared/formats/drs.md`` section 1; schema ``shared/formats/drs-record.avsc`` (embedded below). Not related
to the Alibaba DTS schema despite the shared type names.

Decisions where the spec leaves room (documented for users):

* Framing (1.1): a value starting with ``C3 01`` is Avro single-object encoding: the 8 fingerprint bytes must be
  ``4E 9E A3 09 40 AC 78 CC`` (else a dead letter) and 10 bytes are skipped; any other value is plain Avro binary.
* Keys are not carried (1.2): ``key_columns`` is empty; the pipeline uses configured keys, else the full image.
* ``tableName`` (1.2) may be quoted (``"db"."tbl"``): quotes are removed; 1 part = table, 2 = database.table,
  3 = database.schema.table. A one-part name takes the database from the format option ``database`` (else none).
* Types follow the union branch, refined by ``dataTypeNumber`` (JDBC codes + 94 = DATETIME): Integer -> ``bigint``,
  ``decimal(20,0)`` for JDBC BIGINT (-5: MySQL BIGINT UNSIGNED exceeds int64); Decimal -> ``decimal(p,s)`` or
  exact text; Float -> ``double``; Timestamp -> ``timestamp`` (epoch seconds + microseconds, as DTS; a
  ``timestamp`` beyond 1e11 is taken as milliseconds); Date -> ``timestamp_ntz`` (``date`` for JDBC DATE 91,
  ``string`` for TIME 92); Bit -> ``boolean`` for BIT(1), else its text; BinaryObject -> ``binary``.
* DDL text location is unknown (1.2, no string branch): the first Character value of ``afterImages`` is taken
  as the statement, else ``ddl`` is null.
"""

from __future__ import annotations

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
    div,
    epoch_timestamp,
    finish,
    first_error,
    op_from_code,
)
from cdclake.model import Op

NAME: Final = "drs-avro"


def _record(name: str, fields: list[tuple[str, Any]]) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}


_VALUE_BRANCHES: Final[list[Any]] = [
    "null",
    _record("Integer", [("precision", "int"), ("value", "string")]),
    _record("Character", [("charset", "string"), ("value", "bytes")]),
    _record("Decimal", [("value", "string"), ("precision", "int"), ("scale", "int")]),
    _record("Float", [("value", "double"), ("precision", "int"), ("scale", "int")]),
    _record("Timestamp", [("timestamp", "long"), ("millis", "int")]),
    _record("Date", [("value", "string")]),
    _record("Bit", [("precision", "int"), ("value", "string")]),
    _record("BinaryObject", [("type", "string"), ("value", "bytes")]),
]

AVRO_SCHEMA: Final = json.dumps(
    {
        "type": "record",
        "name": "Record",
        "namespace": "com.huawei.hwclouds.drs.avro",
        "fields": [
            {"name": "version", "type": "string"},
            {"name": "seqno", "type": "long"},
            {"name": "shardId", "type": "long"},
            {"name": "eventid", "type": "string"},
            {"name": "updateTimestamp", "type": "long"},
            {"name": "tableName", "type": ["null", "string"], "default": None},
            {"name": "operation", "type": "string"},
            {"name": "columnCount", "type": "long"},
            {
                "name": "fields",
                "type": [
                    "null",
                    {"type": "array", "items": _record("Field", [("name", "string"), ("dataTypeNumber", "int")])},
                ],
                "default": None,
            },
            {"name": "beforeImages", "type": ["null", {"type": "array", "items": _VALUE_BRANCHES}], "default": None},
            {
                "name": "afterImages",
                "type": ["null", {"type": "array", "items": ["null", *(b["name"] for b in _VALUE_BRANCHES[1:])]}],
                "default": None,
            },
        ],
    },
    separators=(",", ":"),
)
"""The DRS record schema (``shared/formats/drs-record.avsc`` without its docs)."""

FINGERPRINT: Final = bytes.fromhex("4E9EA30940AC78CC")
"""drs.md 1.1: CRC-64-AVRO of the schema's canonical form, little-endian, as written after ``C3 01``."""

# drs.md 1.2: operation is a plain string.
OPERATIONS: Final = {"INSERT": Op.INSERT, "UPDATE": Op.UPDATE, "DELETE": Op.DELETE, "DDL": Op.DDL}

# drs.md 1.2: dataTypeNumber ~ JDBC codes (+ 94 = DATETIME); the type of a column that is NULL in every image.
JDBC_TYPES: Final = {
    -7: "boolean", 16: "boolean", -6: "bigint", 5: "bigint", 4: "bigint", -5: "decimal(20,0)", 6: "double",
    7: "double", 8: "double", 91: "date", 92: "string", 93: "timestamp", 94: "timestamp_ntz", -2: "binary",
    -3: "binary", -4: "binary", 2004: "binary", 1: "string", 12: "string", -1: "string", 2005: "string",
}  # fmt: skip
JDBC_BIGINT: Final = -5
JDBC_DATE: Final = 91
JDBC_TIME: Final = 92
SECONDS_LIMIT: Final = 100_000_000_000
"""A Timestamp.timestamp at or beyond this is taken as epoch milliseconds (the unit is unconfirmed, drs.md 1.2)."""


def _timestamp(member: Column) -> Column:
    stamp = member["timestamp"]
    # Not abs(): abs of the smallest long overflows, and under ANSI that fails the batch, not the message.
    as_ms = (stamp >= SECONDS_LIMIT) | (stamp <= -SECONDS_LIMIT)
    seconds = F.when(as_ms, div(stamp, 1000)).otherwise(stamp)
    micros = F.when(as_ms, F.pmod(stamp, F.lit(1000)) * 1000).otherwise(F.lit(0)) + F.coalesce(
        member["millis"], F.lit(0)
    )
    return av.epoch_micros(seconds, micros)


def _date(member: Column, dtn: Column) -> Column:
    text = F.trim(member["value"])
    kind = F.when(dtn == JDBC_DATE, F.lit("date")).when(dtn == JDBC_TIME, F.lit("string"))
    return av.value(text, F.coalesce(kind, F.lit("timestamp_ntz")))


def _bit(member: Column) -> Column:
    text = F.trim(member["value"])
    as_bool = F.when(text.isin("1", "true"), F.lit("true")).when(text.isin("0", "false"), F.lit("false"))
    return F.when(
        member["precision"] == 1,
        av.value(as_bool, "boolean", F.when(as_bool.isNull(), F.format_string("BIT(1) value '%s'", text))),
    ).otherwise(av.value(text, "string"))


def _convert(dtn: Column, item: Column) -> Column:
    """One element of before/afterImages (the 9-branch union, drs.md 1.2) -> :data:`av.VALUE_TYPE`."""
    integer_type = F.when(dtn == JDBC_BIGINT, F.lit("decimal(20,0)")).otherwise(F.lit("bigint"))
    return F.when(item.isNull(), av.null_value()).otherwise(
        av.choose(
            [
                (item["member0"], av.integer(item["member0"], integer_type)),
                (item["member1"], av.character(item["member1"])),
                (item["member2"], av.decimal(item["member2"])),
                (item["member3"], av.double(item["member3"])),
                (item["member4"], _timestamp(item["member4"])),
                (item["member5"], _date(item["member5"], dtn)),
                (item["member6"], _bit(item["member6"])),
                (item["member7"], av.binary(item["member7"])),
            ]
        )
    )


def _table_name(name: Column) -> tuple[Column, Column, Column, Column]:
    """drs.md 1.2: ``tableName`` may arrive quoted (``"db"."tbl"``); Huawei's sample strips the quotes."""
    parts = F.transform(
        F.regexp_extract_all(name, F.lit(r'("[^"]*"|[^."]+)'), 1),
        lambda p: F.regexp_replace(p, r'^"|"$', ""),
    )
    n = F.size(parts)
    database = F.when(n >= 2, F.get(parts, 0))
    schema = F.when(n == 3, F.get(parts, 1))
    table = F.when(n == 1, F.get(parts, 0)).when(n == 2, F.get(parts, 1)).when(n == 3, F.get(parts, 2))
    return database, schema, table, name.isNotNull() & ((n == 0) | (n > 3))


@analysed_with_java_charsets
def decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """DRS Avro messages (plain or single-object encoded) -> canonical events (one per message)."""
    default_database = options.get("database")
    raw = F.col(MESSAGE_VALUE)
    body, framing_error = av.strip_single_object_header(raw, FINGERPRINT)
    parsed = messages.withColumn("_r", from_avro(body, AVRO_SCHEMA, {"mode": "PERMISSIVE"}))
    r = F.col("_r")
    decoded_ok = r.isNotNull() & r["operation"].isNotNull()  # PERMISSIVE: a struct of nulls when undecodable
    vendor_op = r["operation"]
    op = op_from_code(vendor_op, OPERATIONS)
    empty_fields = F.array().cast("array<struct<name:string,dataTypeNumber:int>>")
    fields = F.coalesce(r["fields"], empty_fields)
    before_items, after_items = r["beforeImages"], r["afterImages"]

    def aligned(items: Column) -> Column:
        return av.align(fields, items, lambda f, item: _convert(f["dataTypeNumber"], item))

    with_images = parsed.select("*", aligned(before_items).alias("_before"), aligned(after_items).alias("_after"))
    before, after = F.col("_before"), F.col("_after")
    jdbc = F.create_map(*(x for code, spark in JDBC_TYPES.items() for x in (F.lit(code), F.lit(spark))))
    columns = av.declared_columns(fields, before, after, lambda code: F.try_element_at(jdbc, code))
    database, schema, table, bad_name = _table_name(r["tableName"])
    if default_database:
        database = F.coalesce(database, F.lit(default_database))
    is_row = op.isin(Op.INSERT.value, Op.UPDATE.value, Op.DELETE.value)
    ddl_text = F.filter(F.coalesce(after_items, F.array()), lambda item: item["member1"].isNotNull())
    ddl = av.character(F.get(ddl_text, 0)["member1"])
    position = model.sortable_decimal(r["seqno"].cast("string"))
    decoded = with_images.select(
        "*",
        op.alias(model.OP),
        vendor_op.alias(model.VENDOR_OP),
        database.alias(model.DATABASE),
        schema.alias(model.SCHEMA),
        table.alias(model.TABLE),
        F.when(is_row, F.array().cast("array<string>")).alias(model.KEY_COLUMNS),
        F.when(is_row, av.image(before, before_items.isNotNull())).alias(model.BEFORE),
        F.when(is_row, av.image(after, after_items.isNotNull())).alias(model.AFTER),
        F.when(is_row, columns).alias(model.COLUMNS),
        F.when(decoded_ok, position).alias(model.POSITION),
        F.when(decoded_ok, epoch_timestamp(r["updateTimestamp"], "ms")).alias(model.EVENT_TIME),
        F.when(op == Op.DDL.value, ddl["text"]).alias(model.DDL),
    )
    names = fields["name"]

    after_error = av.first_value_error(after, "afterImages")
    before_error = av.first_value_error(before, "beforeImages")
    error = first_error(
        (raw.isNull(), "empty message (null Kafka value)"),
        (framing_error.isNotNull(), framing_error),
        (~decoded_ok, "malformed DRS Avro record (not decodable with the DRS Record schema)"),
        (op.isNull(), F.format_string("unknown DRS operation '%s'", vendor_op)),
        (bad_name, F.format_string("tableName '%s' is not [db.][schema.]table", r["tableName"])),
        (is_row & table.isNull(), "row event without tableName"),
        *av.image_shape_checks(is_row, fields, names, before_items, after_items),
        (is_row & after_error.isNotNull(), after_error),
        (is_row & before_error.isNotNull(), before_error),
        (position.isNull() & decoded_ok, F.format_string("negative seqno %d", r["seqno"])),
        ((op == Op.DDL.value) & ddl["error"].isNotNull(), F.concat(F.lit("DDL text: "), ddl["error"])),
    )
    return finish(decoded, NAME, error)


FORMAT: Final = register(
    CdcFormat(
        name=NAME,
        description="Huawei Cloud DRS Avro (plain Avro binary or single-object encoded Record)",
        decode=decode,
        encoding="binary",
        operations=OPERATIONS,
        options={"database": "database name for messages whose tableName has no database part"},
        sniff=None,  # README "Recognition": binary formats are configured per topic
        examples=("drs-avro.jsonl",),
    )
)
