"""Qlik Replicate / Qlik Talend Data Integration JSON (``qlik-json``): atMSG envelope (DT + MD) or bare DT.

Spec: ``shared/formats/qlik.md``. Enveloped (1)::

    {"magic": "atMSG", "type": "DT"|"MD", "headers": null, "messageSchemaId", "messageSchema", "message": {..}}

Bare data messages (1, "un-wrapped") are the DT ``message`` alone: ``{"data", "beforeData", "headers": {..}}``.

Choices where the spec leaves room (documented for users):

* **Column types.** Types live in MD messages, which a per-message decoder cannot join to DT messages. Every
  column is therefore ``string`` holding the exact JSON value text (numbers exactly as sent, NUMERIC/UINT8 strings
  as they are, dates and times as Replicate's text, BYTES as Replicate's hex digits), except JSON booleans, which
  are ``boolean``. MD messages become DDL events that declare the same Spark types, with the Replicate type
  (``NUMERIC(10,2)``, ``BYTES(2000)``...) as ``vendor_type`` so that typed views can be built on top.
* **Masks** (4): ordinals are the 1-based positions of the columns in ``data`` (Replicate writes them in table
  order, the order of the MD ``dataSchema``). A column whose ``columnMask`` bit is 0 was not captured: it is left
  out of the images and the after image is partial, so the stored value is kept. Bit ``n`` of the mask is in byte
  ``n div 8`` (first two hex digits = ordinals 1-8), least significant bit first. A null mask (REFRESH) = all
  captured. ``changeMask`` is not needed to apply (``columnMask`` decides what is a real value).
* **Keys** are not in DT messages: configure them (MD ``primaryKeyPosition`` is reported on the DDL event).
* **Table**: ``message.schema``/``message.table`` when present, else the Kafka key ``SCHEMA+TABLE``, else the
  format options ``database``/``table``, else no database and the topic as table; the Qlik schema is the
  canonical ``database``.
* **Position**: ``changeSequence`` (35 digits, string order). REFRESH rows have none: they get ``!`` + Kafka
  coordinates, which sorts before every change sequence (the full load precedes the changes captured after it).
* **Transactions**: a DT with ``transactionLastEvent`` true yields its row event and a TXN_END event (sub_index 1).
"""

from __future__ import annotations

from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdclake import model
from cdclake.formats import register
from cdclake.formats.base import (
    MESSAGE_KEY,
    MESSAGE_VALUE,
    CdcFormat,
    FormatOptions,
    exact_text_image,
    finish,
    first_error,
    op_from_code,
)
from cdclake.model import Op

NAME: Final = "qlik-json"
MAGIC: Final = "atMSG"

_HEADERS: Final = """STRUCT<operation: STRING, changeSequence: STRING, timestamp: STRING, streamPosition: STRING,
    transactionId: STRING, changeMask: STRING, columnMask: STRING, transactionEventCounter: BIGINT,
    transactionLastEvent: BOOLEAN, externalSchemaId: STRING>"""
_COLUMN: Final = """STRUCT<ordinal: INT, type: STRING, length: BIGINT, precision: INT, scale: INT,
    primaryKeyPosition: INT, nullable: BOOLEAN>"""
RAW_SCHEMA: Final = f"""
    magic STRING, type STRING, messageSchemaId STRING,
    message STRUCT<
        data: MAP<STRING, VARIANT>, beforeData: MAP<STRING, VARIANT>, headers: {_HEADERS},
        schema: STRING, table: STRING,
        schemaId: STRING,
        lineage: STRUCT<server: STRING, task: STRING, schema: STRING, table: STRING, tableVersion: BIGINT,
                        timestamp: STRING>,
        tableStructure: STRUCT<tableColumns: MAP<STRING, {_COLUMN}>>>,
    data MAP<STRING, VARIANT>, beforeData MAP<STRING, VARIANT>, headers {_HEADERS}, schema STRING, table STRING,
    _corrupt_record STRING
"""

# qlik.md 3: operation -> canonical; transaction ends come from transactionLastEvent, DDL from MD messages.
OPERATIONS: Final = {
    "INSERT": Op.INSERT,
    "UPDATE": Op.UPDATE,
    "DELETE": Op.DELETE,
    "REFRESH": Op.UPSERT,
    "MD": Op.DDL,
    "transactionLastEvent": Op.TXN_END,
}
_ROW_OPERATIONS: Final = {k: v for k, v in OPERATIONS.items() if k in ("INSERT", "UPDATE", "DELETE", "REFRESH")}


def mask_bit(mask: Column, ordinal: Column) -> Column:
    """qlik.md 4: whether the bit of 1-based ``ordinal`` is set in the hex ``mask`` (first byte = ordinals 1-8,
    least significant bit first). Bits beyond the mask's length are 0."""
    index = ordinal - 1
    byte_hex = F.substring(mask, (F.floor(index / 8) * 2 + 1).cast("int"), 2)
    byte = F.conv(byte_hex, 16, 10).cast("int")
    return F.coalesce(F.getbit(byte, (index % 8).cast("int")) == 1, F.lit(False))


def _captured(image: Column, mask: Column) -> Column:
    """The image without the columns whose columnMask bit is 0 (ordinal = position in ``data``)."""
    names = F.map_keys(image)
    kept = F.filter(
        F.transform(names, lambda n, i: F.struct(n.alias("k"), mask_bit(mask, i + 1).alias("on"))),
        lambda e: mask.isNull() | e["on"],
    )
    return F.map_filter(image, lambda k, _v: F.exists(kept, lambda e: e["k"] == k))


def _spark_type_of(value: Column) -> Column:
    """DT value -> Spark type inferable from the message alone: JSON booleans, else exact text."""
    return F.when(F.schema_of_variant(value) == "BOOLEAN", F.lit("boolean")).otherwise(F.lit("string"))


def _vendor_type(c: Column) -> Column:
    return (
        F.when(c["type"] == "NUMERIC", F.format_string("NUMERIC(%d,%d)", c["precision"], c["scale"]))
        .when(c["length"] > 0, F.format_string("%s(%d)", c["type"], c["length"]))
        .otherwise(c["type"])
    )


def position_and_time(
    headers: Column, op: Column, is_row: Column
) -> tuple[Column, Column, list[tuple[Column, Column]]]:
    """Ordering position, event time and their error checks from the data-message headers (JSON and Avro alike).

    ``changeSequence`` (35 digits) orders changes. Full-load (REFRESH) rows carry none: they get a Kafka-order
    position that sorts before every change, since the full load precedes the change stream.
    """
    sequence = headers["changeSequence"]
    sequence_ok = sequence.rlike(r"^\d{35}$")
    refresh = model.kafka_position(F.col("partition"), F.col("offset"), before_vendor_positions=True)
    position = F.when(sequence_ok, sequence).when(op == Op.UPSERT.value, refresh)
    stamp = headers["timestamp"]
    event_time = F.when(
        stamp != "", F.concat(F.replace(stamp, F.lit(" "), F.lit("T")), F.lit("Z")).try_cast("timestamp")
    )
    checks = [
        (
            is_row & (op != Op.UPSERT.value) & ~F.coalesce(sequence_ok, F.lit(False)),
            F.format_string("changeSequence '%s' is not 35 digits", sequence),
        ),
        (
            stamp.isNotNull() & (stamp != "") & event_time.isNull(),
            F.format_string("timestamp '%s' is not a UTC time", stamp),
        ),
    ]
    return position, event_time, checks


def decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """Qlik JSON messages -> canonical events (one per message, two for a transaction's last event)."""
    msg = F.from_json(F.col(MESSAGE_VALUE).cast("string"), RAW_SCHEMA, {"columnNameOfCorruptRecord": "_corrupt_record"})
    m = F.col("_m")
    enveloped = m["magic"].isNotNull() | m["type"].isNotNull()
    inner = m["message"]
    # qlik.md 1: enveloped DT -> `message`; un-wrapped -> the DT message at top level.
    data = F.when(enveloped, inner["data"]).otherwise(m["data"])
    before_data = F.when(enveloped, inner["beforeData"]).otherwise(m["beforeData"])
    headers = F.when(enveloped, inner["headers"]).otherwise(m["headers"])
    is_md = enveloped & (m["type"] == "MD")
    vendor_op = F.when(is_md, F.lit("MD")).otherwise(headers["operation"])
    op = op_from_code(vendor_op, {**_ROW_OPERATIONS, "MD": Op.DDL})
    column_mask = headers["columnMask"]
    # qlik.md 3: DELETE row in `data` (Replicate) or in `beforeData` (some producers): data ?? beforeData.
    is_delete = op == Op.DELETE.value
    row_image = F.when(is_delete, F.coalesce(data, before_data)).otherwise(data)
    after_raw = F.when(~is_delete, row_image)
    before_raw = F.when(is_delete, row_image).otherwise(before_data)
    after = exact_text_image(_captured(after_raw, column_mask))
    before = exact_text_image(_captured(before_raw, column_mask))
    after_dropped = F.size(F.map_keys(after_raw)) > F.size(F.map_keys(after))
    all_columns = F.coalesce(row_image, before_data)
    columns = F.transform(
        F.map_entries(all_columns),
        lambda e: F.struct(
            e["key"].alias("name"),
            F.lit("json").alias("vendor_type"),
            _spark_type_of(F.coalesce(e["value"], before_data[e["key"]], data[e["key"]])).alias("spark_type"),
        ),
    )
    # MD (qlik.md 2): table columns by ordinal; the DDL text is the tableStructure JSON as sent.
    md_columns = F.transform(
        F.array_sort(
            F.transform(
                F.map_entries(inner["tableStructure"]["tableColumns"]),
                lambda e: F.struct(
                    e["value"]["ordinal"].alias("ordinal"), e["key"].alias("name"), e["value"].alias("c")
                ),
            )
        ),
        lambda x: F.struct(
            x["name"].alias("name"),
            _vendor_type(x["c"]).alias("vendor_type"),
            F.when(x["c"]["type"] == "BOOLEAN", F.lit("boolean")).otherwise(F.lit("string")).alias("spark_type"),
        ),
    )
    # Table identity (see the module doc).
    key_text = F.col(MESSAGE_KEY).cast("string")
    key_parts = F.split(key_text, r"\+")
    key_ok = key_text.isNotNull() & (F.size(key_parts) == 2)
    fallback_db = F.lit(options["database"]) if options.get("database") else F.lit(None).cast("string")
    fallback_table = F.lit(options["table"]) if options.get("table") else F.col("topic")
    msg_schema = F.when(enveloped, inner["schema"]).otherwise(m["schema"])
    msg_table = F.when(enveloped, inner["table"]).otherwise(m["table"])
    database = (
        F.when(is_md, inner["lineage"]["schema"])
        .when(msg_table.isNotNull(), msg_schema)
        .when(key_ok, F.get(key_parts, 0))
        .otherwise(fallback_db)
    )
    table = (
        F.when(is_md, inner["lineage"]["table"])
        .when(msg_table.isNotNull(), msg_table)
        .when(key_ok, F.get(key_parts, 1))
        .otherwise(fallback_table)
    )
    txn_id = F.when(headers["transactionId"] != "", headers["transactionId"])
    is_row = op.isin(*(o.value for o in model.ROW_OPS))
    position, event_time, header_checks = position_and_time(headers, op, is_row)
    last_event = F.coalesce(is_row & headers["transactionLastEvent"], F.lit(False))
    parsed = messages.withColumn("_m", msg)
    exploded = parsed.select(
        "*", F.explode(F.when(last_event, F.array(F.lit(0), F.lit(1))).otherwise(F.array(F.lit(0)))).alias("_sub")
    )
    txn_end = F.col("_sub") == 1
    decoded = exploded.select(
        "*",
        F.when(txn_end, F.lit(Op.TXN_END.value)).otherwise(op).alias(model.OP),
        F.when(txn_end, F.lit("transactionLastEvent")).otherwise(vendor_op).alias(model.VENDOR_OP),
        F.when(~txn_end, database).alias(model.DATABASE),
        F.when(~txn_end, table).alias(model.TABLE),
        F.when(is_md & ~txn_end, md_columns).when(is_row & ~txn_end, columns).alias(model.COLUMNS),
        F.when(is_row & ~txn_end, F.array().cast("array<string>")).alias(model.KEY_COLUMNS),
        F.when(is_row & ~txn_end, before).alias(model.BEFORE),
        F.when(is_row & ~txn_end, after).alias(model.AFTER),
        (is_row & ~txn_end & F.coalesce(after_dropped, F.lit(False))).alias(model.AFTER_IS_PARTIAL),
        position.alias(model.POSITION),
        event_time.alias(model.EVENT_TIME),
        txn_id.alias(model.TXN_ID),
        F.when(is_md, F.get_json_object(F.col(MESSAGE_VALUE).cast("string"), "$.message.tableStructure")).alias(
            model.DDL
        ),
        F.col("_sub").alias(model.SUB_INDEX),
    )
    hex_mask = r"^([0-9A-Fa-f]{2})*$"
    error = first_error(
        (F.col(MESSAGE_VALUE).isNull(), "empty message (null Kafka value)"),
        (m.isNull() | m["_corrupt_record"].isNotNull(), "malformed JSON"),
        (
            enveloped & (F.coalesce(m["magic"], F.lit("")) != MAGIC),
            F.format_string("magic '%s' is not atMSG", m["magic"]),
        ),
        (
            enveloped & ~F.coalesce(m["type"].isin("DT", "MD"), F.lit(False)),
            F.format_string("unknown message type '%s'", m["type"]),
        ),
        (is_md & inner["lineage"]["table"].isNull(), "MD message without lineage.table"),
        (~is_md & headers.isNull(), "data message without headers: not a Qlik message"),
        (~is_md & vendor_op.isNull(), "data message without headers.operation"),
        (op.isNull(), F.format_string("unknown Qlik operation '%s'", vendor_op)),
        (is_row & (op != Op.DELETE.value) & data.isNull(), F.format_string("%s without data", vendor_op)),
        (is_delete & row_image.isNull(), "DELETE without data or beforeData"),
        (
            column_mask.isNotNull() & ~column_mask.rlike(hex_mask),
            F.format_string("columnMask '%s' is not hex bytes", column_mask),
        ),
        (
            headers["changeMask"].isNotNull() & ~headers["changeMask"].rlike(hex_mask),
            F.format_string("changeMask '%s' is not hex bytes", headers["changeMask"]),
        ),
        *header_checks,
    )
    return finish(decoded, NAME, error)


def sniff(message: Any) -> bool:
    """README "Recognition": ``magic == "atMSG"``, or un-wrapped ``headers.operation`` + ``data``/``beforeData``."""
    if not isinstance(message, dict):
        return False
    if message.get("magic") == MAGIC:
        return True
    headers = message.get("headers")
    return isinstance(headers, dict) and "operation" in headers and ("data" in message or "beforeData" in message)


FORMAT: Final = register(
    CdcFormat(
        name=NAME,
        description="Qlik Replicate / Talend Data Integration JSON (atMSG envelope with DT + MD, or bare DT)",
        decode=decode,
        operations=OPERATIONS,
        options={
            "database": "database (Qlik schema) when neither the message nor the Kafka key names it (default: none)",
            "table": "table when neither the message nor the Kafka key names it (default: the topic)",
        },
        sniff=sniff,
        examples=("qlik-json.jsonl",),
    )
)
