"""Qlik Replicate Avro without a schema registry (``qlik-avro``).

Spec: ``shared/formats/qlik.md`` sections 1 ("Avro"), 3, 4, 5. Value = Avro binary of ``MessageEnvelope``
(``magic`` fixed(5) ``atMSG``, ``type``, ``headers``, ``messageSchemaId``, ``messageSchema``, ``message`` bytes);
``message`` is the Avro binary of the data record whose schema is the ``dataSchema`` of the table's MD message.

A per-message Spark decoder cannot cache MD messages, so the data schemas are **configured** (format options):

* ``data_schema``: the ``dataSchema`` JSON text (from the table's MD message) used for every DT message, or
* ``data_schemas``: a JSON object ``{"<schemaId>": "<dataSchema JSON text>", ...}`` chosen by ``messageSchemaId``.

A DT message whose schema is not configured is a dead letter naming its ``messageSchemaId`` (configure it and
replay the dead letters). MD messages become DDL events (``vendor_op`` MD) without a statement: their inner
metadata record would need the Qlik metadata schema, which is only in each message's ``messageSchema``.

Values (5, logical types on or off): ``int``/``long`` -> ``bigint``; ``float``/``double`` -> ``double``;
``boolean``; ``string``; ``bytes`` -> ``binary``; ``decimal(p,s)`` bytes -> ``decimal(p,s)``; ``date`` ->
``date``; ``timestamp-micros``/``timestamp-millis`` -> ``timestamp``; ``time-millis``/``time-micros`` ->
``HH:mm:ss.fff[fff]`` text; any other type -> its JSON text. Masks are ``bytes`` here (4): same bit layout as
the JSON hex text. Table identity,
position, transactions and REFRESH handling are those of ``qlik-json`` (see its module doc); DT Avro records
carry no schema/table names, so the options ``database`` (default: none) and ``table`` (default: the topic)
name the table.
"""

from __future__ import annotations

import json
from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from cdclake import model
from cdclake.formats import register
from cdclake.formats.base import MESSAGE_VALUE, CdcFormat, FormatOptions, finish, first_error, op_from_code
from cdclake.formats.qlik import MAGIC, OPERATIONS, mask_bit, position_and_time
from cdclake.model import Op

NAME: Final = "qlik-avro"

ENVELOPE_SCHEMA: Final = json.dumps(
    {
        "type": "record",
        "name": "MessageEnvelope",
        "fields": [
            {"name": "magic", "type": {"type": "fixed", "name": "Magic", "size": 5}},
            {"name": "type", "type": "string"},
            {"name": "headers", "type": ["null", {"type": "map", "values": "string"}]},
            {"name": "messageSchemaId", "type": ["null", "string"]},
            {"name": "messageSchema", "type": ["null", "string"]},
            {"name": "message", "type": "bytes"},
        ],
    },
    separators=(",", ":"),
)
"""qlik.md 1 "Avro": the envelope schema."""

_ROW_OPERATIONS: Final = {k: v for k, v in OPERATIONS.items() if k in ("INSERT", "UPDATE", "DELETE", "REFRESH")}


def _branch(avro_type: Any) -> Any:
    """The non-null branch of ``["null", T]`` (or T itself)."""
    if isinstance(avro_type, list):
        rest = [t for t in avro_type if t != "null"]
        return rest[0] if len(rest) == 1 else avro_type
    return avro_type


def _time_text(value: Column, per_second: int) -> Column:
    """Avro time-millis / time-micros -> ``HH:mm:ss.fff[fff]`` (a wall-clock time of day as text)."""
    seconds = F.floor(value / per_second)
    digits = len(str(per_second)) - 1
    return F.format_string(
        f"%02d:%02d:%02d.%0{digits}d",
        F.floor(seconds / 3600),
        F.floor(seconds / 60) % 60,
        seconds % 60,
        F.pmod(value, F.lit(per_second)),
    )


def _converter(avro_type: Any) -> tuple[str, Any]:
    """(spark_type, value -> canonical text) for one data field (qlik.md 5)."""
    t = _branch(avro_type)
    logical = t.get("logicalType") if isinstance(t, dict) else None
    base = t.get("type") if isinstance(t, dict) else t
    if logical == "decimal" and isinstance(t, dict):
        precision, scale = int(t.get("precision", 38)), int(t.get("scale", 0))
        if 1 <= precision <= 38 and 0 <= scale <= precision:
            return f"decimal({precision},{scale})", lambda v: v.cast("string")
        return "string", lambda v: v.cast("string")
    if logical == "date":
        return "date", lambda v: F.date_format(v, "yyyy-MM-dd")
    if logical in ("timestamp-micros", "timestamp-millis"):
        return "timestamp", lambda v: F.unix_micros(v).cast("string")
    if base in ("int", "long") and logical is None:
        return "bigint", lambda v: v.cast("string")
    if base in ("float", "double"):
        return "double", lambda v: v.cast("string")
    if base == "boolean":
        return "boolean", lambda v: v.cast("string")
    if base == "string":
        return "string", lambda v: v
    if base == "bytes" and logical is None:
        return "binary", lambda v: F.base64(v)
    if logical in ("time-millis", "time-micros"):
        return "string", lambda v: _time_text(v, 1000 if logical == "time-millis" else 1_000_000)
    if base in ("int", "long"):  # unknown logical types: the number as text
        return "string", lambda v: v.cast("string")
    return "string", lambda v: F.to_json(v)


def _data_fields(schema_text: str) -> tuple[list[tuple[str, Any]], set[str]]:
    """(data fields in ordinal order, header field names) of a dataSchema."""
    schema = json.loads(schema_text)
    by_name = {field["name"]: field for field in schema["fields"]}
    if "data" not in by_name or "headers" not in by_name:
        raise ValueError("a Qlik dataSchema needs the record fields 'data' and 'headers'")
    data = _branch(by_name["data"]["type"])
    headers = _branch(by_name["headers"]["type"])
    return [(f["name"], f["type"]) for f in data["fields"]], {f["name"] for f in headers["fields"]}


_HEADER_FIELDS: Final = (
    ("operation", "string"),
    ("changeSequence", "string"),
    ("timestamp", "string"),
    ("transactionId", "string"),
    ("transactionLastEvent", "boolean"),
    ("columnMask", "binary"),
)
HEADERS_TYPE: Final = "struct<" + ",".join(f"{n}:{t}" for n, t in _HEADER_FIELDS) + ">"


def _headers(record: Column, present: set[str]) -> Column:
    """The headers this decoder reads, as one struct type whatever the schema version (older ones lack some)."""
    return F.when(
        record.isNotNull(),
        F.struct(
            *((record["headers"][n] if n in present else F.lit(None)).cast(t).alias(n) for n, t in _HEADER_FIELDS)
        ),
    ).cast(HEADERS_TYPE)


def _schemas(options: FormatOptions) -> dict[str, str]:
    """schemaId ('*' = any) -> dataSchema text, from the options; invalid options fail loudly (a config error)."""
    schemas: dict[str, str] = {}
    if options.get("data_schemas"):
        for schema_id, text in json.loads(options["data_schemas"]).items():
            schemas[str(schema_id).upper()] = text if isinstance(text, str) else json.dumps(text)
    if options.get("data_schema"):
        schemas["*"] = options["data_schema"]
    return schemas


def _image(record: Column, fields: list[tuple[str, Any]], mask: Column) -> tuple[Column, Column]:
    """(image of the captured columns, whether some column was not captured) for one data record column."""
    entries: list[Column] = []
    dropped: list[Column] = []
    for ordinal, (name, avro_type) in enumerate(fields, start=1):
        _spark, convert = _converter(avro_type)
        captured = mask.isNull() | mask_bit(F.hex(mask), F.lit(ordinal))
        entries.append(F.when(captured, F.struct(F.lit(name).alias("k"), convert(record[name]).alias("v"))))
        dropped.append(~captured)
    kept = F.filter(F.array(*entries), lambda e: e.isNotNull())
    image = F.when(record.isNotNull(), F.map_from_entries(kept))
    return image, F.exists(F.array(*dropped), lambda d: d)


def decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """Qlik Avro envelopes -> canonical events (one per message, two for a transaction's last event)."""
    raw = F.col(MESSAGE_VALUE)
    parsed = messages.withColumn("_e", from_avro(raw, ENVELOPE_SCHEMA, {"mode": "PERMISSIVE"}))
    e = F.col("_e")
    envelope_ok = e.isNotNull() & e["type"].isNotNull() & (e["magic"] == F.lit(MAGIC.encode()))
    is_md = e["type"] == "MD"
    schema_id = F.upper(e["messageSchemaId"])
    schemas = _schemas(options)
    empty_image = F.lit(None).cast("map<string,string>")
    after_raw: Column = empty_image
    before_raw: Column = empty_image
    partial: Column = F.lit(False)
    columns: Column = F.lit(None).cast(f"array<{model.COLUMN_TYPE.simpleString()}>")
    headers: Column = F.lit(None).cast(HEADERS_TYPE)
    matched: Column = F.lit(False)
    decoded_ok: Column = F.lit(False)
    for index, (sid, text) in enumerate(sorted(schemas.items())):
        fields, header_names = _data_fields(text)
        picked = F.lit(True) if sid == "*" else (schema_id == sid)
        name = f"_d{index}"
        parsed = parsed.withColumn(name, F.when(~is_md & picked, from_avro(e["message"], text, {"mode": "PERMISSIVE"})))
        d = F.col(name)
        d_headers = _headers(d, header_names)
        mask = d_headers["columnMask"]
        after_i, dropped_i = _image(d["data"], fields, mask)
        before_i, _ = _image(d["beforeData"], fields, mask)
        columns_i = F.array(
            *(
                F.struct(
                    F.lit(n).alias("name"),
                    F.lit(json.dumps(_branch(t))).alias("vendor_type"),
                    F.lit(_converter(t)[0]).alias("spark_type"),
                )
                for n, t in fields
            )
        )
        use = ~matched & picked
        after_raw = F.when(use, after_i).otherwise(after_raw)
        before_raw = F.when(use, before_i).otherwise(before_raw)
        partial = F.when(use, dropped_i).otherwise(partial)
        columns = F.when(use, columns_i).otherwise(columns)
        headers = F.when(use, d_headers).otherwise(headers)
        decoded_ok = F.when(use, d.isNotNull() & d_headers["operation"].isNotNull()).otherwise(decoded_ok)
        matched = matched | picked
    vendor_op = F.when(is_md, F.lit("MD")).otherwise(headers["operation"])
    op = op_from_code(vendor_op, {**_ROW_OPERATIONS, "MD": Op.DDL})
    is_row = op.isin(*(o.value for o in model.ROW_OPS))
    is_delete = op == Op.DELETE.value
    # qlik.md 3: DELETE row in data, or in beforeData: data ?? beforeData.
    after = F.when(is_row & ~is_delete, after_raw)
    before = F.when(is_delete, F.coalesce(after_raw, before_raw)).when(is_row, before_raw)
    position, event_time, header_checks = position_and_time(headers, op, is_row)
    last_event = F.coalesce(is_row & headers["transactionLastEvent"], F.lit(False))
    database = F.lit(options["database"]) if options.get("database") else F.lit(None).cast("string")
    table = F.lit(options["table"]) if options.get("table") else F.col("topic")
    exploded = parsed.select(
        "*", F.explode(F.when(last_event, F.array(F.lit(0), F.lit(1))).otherwise(F.array(F.lit(0)))).alias("_sub")
    )
    txn_end = F.col("_sub") == 1
    decoded = exploded.select(
        "*",
        F.when(txn_end, F.lit(Op.TXN_END.value)).otherwise(op).alias(model.OP),
        F.when(txn_end, F.lit("transactionLastEvent")).otherwise(vendor_op).alias(model.VENDOR_OP),
        F.when(~txn_end & ~is_md, database).alias(model.DATABASE),  # MD: the table is inside the metadata record
        F.when(~txn_end & ~is_md, table).alias(model.TABLE),
        F.when(is_row & ~txn_end, columns).alias(model.COLUMNS),
        F.when(is_row & ~txn_end, F.array().cast("array<string>")).alias(model.KEY_COLUMNS),
        F.when(~txn_end, before).alias(model.BEFORE),
        F.when(~txn_end, after).alias(model.AFTER),
        (is_row & ~is_delete & ~txn_end & F.coalesce(partial, F.lit(False))).alias(model.AFTER_IS_PARTIAL),
        position.alias(model.POSITION),
        event_time.alias(model.EVENT_TIME),
        F.when(headers["transactionId"] != "", headers["transactionId"]).alias(model.TXN_ID),
        F.col("_sub").alias(model.SUB_INDEX),
    )
    error = first_error(
        (raw.isNull(), "empty message (null Kafka value)"),
        (~envelope_ok, "malformed Qlik Avro envelope (not an atMSG MessageEnvelope)"),
        (~e["type"].isin("DT", "MD"), F.format_string("unknown message type '%s'", e["type"])),
        (
            ~is_md & ~matched,
            F.format_string("no data schema configured for messageSchemaId '%s' (option data_schemas)", schema_id),
        ),
        (~is_md & ~decoded_ok, "data message not decodable with the configured data schema"),
        (op.isNull(), F.format_string("unknown Qlik operation '%s'", vendor_op)),
        (is_row & ~is_delete & after_raw.isNull(), F.format_string("%s without data", vendor_op)),
        (is_delete & before.isNull(), "DELETE without data or beforeData"),
        *header_checks,
    )
    return finish(decoded, NAME, error)


FORMAT: Final = register(
    CdcFormat(
        name=NAME,
        description="Qlik Replicate Avro (atMSG MessageEnvelope; data schemas configured from the MD messages)",
        decode=decode,
        encoding="binary",
        operations=OPERATIONS,
        options={
            "data_schema": "the MD dataSchema (Avro JSON) of the topic's table, used for every DT message",
            "data_schemas": 'JSON object {"<schemaId>": "<dataSchema>"} chosen by messageSchemaId',
            "database": "database (Qlik schema) of the data messages (default: none)",
            "table": "table of the data messages (default: the topic)",
        },
        sniff=None,  # binary; README "Recognition": the value starts with the bytes atMSG
        examples=(),
    )
)
