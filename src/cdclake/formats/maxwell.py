"""Maxwell's daemon JSON (``maxwell-json``): MySQL binlog rows as one flat JSON object per row.

Spec: ``shared/formats/maxwell-ogg.md`` section 1::

    {"database", "table", "type": insert|update|delete|bootstrap-*|table-*|database-*, "ts", "xid", "xoffset",
     "commit": true, "position": "mysql-bin.000012:81234", "primary_key_columns": [..], "data": {..}, "old": {..},
     "sql": ".." (DDL)}

Choices where the spec is silent:

* Maxwell carries no column types: they are inferred from the JSON value kinds
  (``_json_images.inferred_image_stages``): integers -> ``bigint``, fractions -> ``double`` (canonical text keeps
  the exact digits), strings -> ``string`` (DATETIME text, and BLOB base64 too: a binary column cannot be told from text
  without a catalog), booleans -> ``boolean``, SET arrays and JSON -> ``string`` holding JSON text.
* A JSON null says nothing about the column's type: it takes the type the column has in the table's other messages
  of the batch, and a column NULL in all of them is left out (``_json_images.type_nulls_in_batch``), so that a
  NULL never makes a ``string`` lake column.
* ``commit: true`` marks the last row of a transaction (spec section 1): the message yields its row event and a
  second event ``TXN_END`` (``sub_index`` 1, ``vendor_op`` ``commit``), unless the message cannot be decoded (one
  message, one dead letter). Every DML event carries ``txn_id`` = ``xid``.
* ``position`` ``binlog-file:offset`` sorts by the file's numeric suffix, the offset, then ``xoffset`` (rows of one
  transaction); null (Kafka order) when Maxwell was not configured to output it.
"""

from __future__ import annotations

from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdclake import model
from cdclake.formats import register
from cdclake.formats._json_images import inferred_image_stages, type_nulls_in_batch
from cdclake.formats.base import (
    DUPLICATE_KEY,
    MESSAGE_VALUE,
    CdcFormat,
    FormatOptions,
    epoch_timestamp,
    finish,
    first_error,
    op_from_code,
    with_unique_keys,
)
from cdclake.model import Op

NAME: Final = "maxwell-json"

RAW_SCHEMA: Final = """
    `database` STRING, `table` STRING, type STRING, ts BIGINT, xid STRING, xoffset STRING, `commit` BOOLEAN,
    position STRING, gtid STRING, server_id BIGINT, primary_key_columns ARRAY<STRING>,
    data MAP<STRING, VARIANT>, old MAP<STRING, VARIANT>, `sql` STRING, _corrupt_record STRING
"""

DDL_TYPES: Final = tuple(f"{what}-{verb}" for what in ("database", "table") for verb in ("create", "alter", "drop"))

# maxwell-ogg.md 1 "Canonical".
OPERATIONS: Final = {
    "insert": Op.INSERT,
    "update": Op.UPDATE,
    "delete": Op.DELETE,
    "bootstrap-insert": Op.UPSERT,
    "bootstrap-start": Op.OTHER,
    "bootstrap-complete": Op.OTHER,
    **dict.fromkeys(DDL_TYPES, Op.DDL),
    "commit": Op.TXN_END,
}
_MESSAGE_OPS: Final = {k: v for k, v in OPERATIONS.items() if k != "commit"}


def _position(position: Column, xoffset: Column) -> Column:
    """``mysql-bin.000012:81234`` (+ ``xoffset``) -> sortable text; null when absent or not of that shape."""
    file_number = F.regexp_extract(position, r"^(?:.*\.)?(\d+):\d+$", 1)
    offset = F.regexp_extract(position, r":(\d+)$", 1)
    pieces = (
        model.sortable_decimal(file_number, 12),
        model.sortable_decimal(offset, 20),
        model.sortable_decimal(F.coalesce(xoffset, F.lit("0")), 10),
    )
    return F.when(pieces[0].isNotNull() & pieces[1].isNotNull() & pieces[2].isNotNull(), F.concat_ws(":", *pieces))


def _before(vendor_op: Column, data: Column, old: Column) -> Column:
    overlaid = F.map_concat(F.map_filter(data, lambda k, _v: ~F.map_contains_key(old, k)), old)
    return F.when(vendor_op == "update", F.coalesce(overlaid, data)).when(vendor_op == "delete", data)


def decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """Maxwell JSON messages -> canonical events (two for a transaction's last row: the row, then TXN_END)."""
    del options  # the format has none
    text = F.col(MESSAGE_VALUE).cast("string")
    parsed = with_unique_keys(
        messages, F.from_json(text, RAW_SCHEMA, {"columnNameOfCorruptRecord": "_corrupt_record"}), "_m"
    )
    m = F.col("_m")
    vendor_op = m["type"]
    op = op_from_code(vendor_op, _MESSAGE_OPS)
    is_row = op.isin(*(o.value for o in model.ROW_OPS))
    data, old = m["data"], m["old"]
    # maxwell-ogg.md 1: `old` holds the previous values of the changed columns only; the full before image of an
    # update is `data` overlaid with `old`. A delete's `data` is the row before deletion.
    before = _before(vendor_op, data, old)
    after = F.when(vendor_op != "delete", data)
    payload = F.struct(before.alias("before"), after.alias("after"))
    staged = inferred_image_stages(parsed.select("*", payload.alias("_p")), F.col("_p"))
    position = _position(m["position"], m["xoffset"])
    is_ddl = op == Op.DDL.value
    error = first_error(
        (F.col(MESSAGE_VALUE).isNull(), "empty message (null Kafka value)"),
        (F.col(DUPLICATE_KEY).isNotNull(), F.col(DUPLICATE_KEY)),
        (m.isNull() | m["_corrupt_record"].isNotNull(), "malformed JSON (or a field of the wrong kind)"),
        (vendor_op.isNull(), "missing type: not a Maxwell message"),
        (op.isNull(), F.format_string("unknown Maxwell type '%s'", vendor_op)),
        (is_row & data.isNull(), F.format_string("%s without data", vendor_op)),
        (is_ddl & m["sql"].isNull(), "DDL record without sql"),
        (
            m["position"].isNotNull() & position.isNull(),
            F.format_string("position '%s' is not binlog-file:offset", m["position"]),
        ),
    )
    # maxwell-ogg.md 1: DML `ts` is in epoch seconds, DDL records' `ts` in milliseconds.
    event_time = F.when(is_ddl, epoch_timestamp(m["ts"], "ms")).otherwise(epoch_timestamp(m["ts"], "s"))
    # A message that cannot be decoded is one dead letter: its commit flag yields no TXN_END of its own.
    commit = F.coalesce(m["commit"], F.lit(False)) & is_row & F.col("_error").isNull()
    decoded = staged.select("*", error.alias("_error")).select(
        "*",
        F.explode(F.when(commit, F.array(F.lit(0), F.lit(1))).otherwise(F.array(F.lit(0)))).alias(model.SUB_INDEX),
    )
    txn_end = F.col(model.SUB_INDEX) == 1
    row = is_row & ~txn_end
    decoded = decoded.select(
        "*",
        F.when(txn_end, F.lit(Op.TXN_END.value)).otherwise(op).alias(model.OP),
        F.when(txn_end, F.lit("commit")).otherwise(vendor_op).alias(model.VENDOR_OP),
        F.lit("MySQL").alias(model.DB_TYPE),
        F.when(~txn_end, m["database"]).alias(model.DATABASE),
        F.when(~txn_end, m["table"]).alias(model.TABLE),
        F.when(row, F.coalesce(m["primary_key_columns"], F.array().cast("array<string>"))).alias(model.KEY_COLUMNS),
        F.when(row, F.col("_before_text")).alias(model.BEFORE),
        F.when(row, F.col("_after_text")).alias(model.AFTER),
        F.when(row, F.col("_columns")).alias(model.COLUMNS),
        position.alias(model.POSITION),
        event_time.alias(model.EVENT_TIME),
        F.when(~is_ddl, m["xid"]).alias(model.TXN_ID),
        F.when(is_ddl, m["sql"]).alias(model.DDL),
    )
    error = F.col("_error")
    return finish(decoded, NAME, error)


def sniff(message: Any) -> bool:
    """README "Recognition": ``database`` + ``table`` + ``type`` (lower-case words) + ``ts``."""
    if not isinstance(message, dict) or "op_type" in message:
        return False
    kind = message.get("type")
    return (
        isinstance(kind, str)
        and kind in _MESSAGE_OPS
        and {"database", "ts"} <= message.keys()
        and ("table" in message or kind.startswith("database-"))
    )


FORMAT: Final = register(
    CdcFormat(
        name=NAME,
        description="Maxwell's daemon JSON (MySQL binlog): DML, bootstrap snapshot, DDL records, commit markers",
        decode=decode,
        # `data` is always the full row.
        batch_step=lambda events: type_nulls_in_batch(events, changed_only=F.lit(False)),
        operations=OPERATIONS,
        sniff=sniff,
        examples=("maxwell.jsonl",),
    )
)
