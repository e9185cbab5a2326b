"""Alibaba DTS SharePlex JSON (``dts-shareplex-json``), Oracle-style sources.

Spec: ``shared/formats/dts.md`` section 3 (and the DTS vendor page). One JSON message per row change::

    {"meta": {"time", "userid", "op", "scn", "rowid", "trans", "seq", "size", "table": "OWNER.TABLE", "idx",
              "posttime"},
     "data": {col: text}, "key": {col: text}}

* ``ins``: ``data`` = new row -> INSERT. ``del``: ``data`` = before image -> DELETE.
* ``upd``: ``data`` = ONLY the changed columns (new values), ``key`` = before values that locate the row -> a
  partial UPDATE: before = ``key``, after = ``key`` overlaid with ``data`` (``after_is_partial``), so that columns
  in neither keep their stored values.
* Any other ``meta.op`` (TRUNCATE, DROP COLUMN, UPDATE BEFORE/AFTER have undocumented spellings) -> OTHER, with the
  spelling kept in ``vendor_op`` for alerting (section 3).

Choices where the spec is silent: the message carries no types, so every column is a ``string`` (the exact text);
the message carries no primary key, so ``meta.rowid`` (Oracle ROWID) is the row identity when present (column
``_cdc_row_id``, the only key column; configured keys win over it); without it the pipeline falls back to configured
keys. Position = ``meta.scn``, then ``meta.trans``, then ``meta.seq`` (section 3: "order by (scn, trans, seq)"; the
seq of ``meta.idx`` = ``"seq/size"`` when ``meta.seq`` is absent), null without ``scn`` (Kafka order). Every meta key
is optional (section 3).
"""

from __future__ import annotations

from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdclake import model
from cdclake.formats import register
from cdclake.formats.base import (
    DUPLICATE_KEY,
    MESSAGE_VALUE,
    CdcFormat,
    FormatOptions,
    exact_text_image,
    finish,
    first_error,
    op_from_code,
    with_unique_keys,
)
from cdclake.model import Op

NAME: Final = "dts-shareplex-json"

RAW_SCHEMA: Final = """
    meta STRUCT<time: STRING, userid: STRING, op: STRING, scn: STRING, rowid: STRING, trans: STRING, seq: STRING,
                size: STRING, table: STRING, idx: STRING, posttime: STRING>,
    data MAP<STRING, VARIANT>,
    key MAP<STRING, VARIANT>,
    _corrupt_record STRING
"""

# dts.md section 3: observed wire values; everything else -> OTHER.
OPERATIONS: Final = {"ins": Op.INSERT, "upd": Op.UPDATE, "del": Op.DELETE}


def _with_row_id(image: Column, row_id: Column) -> Column:
    without = F.map_filter(image, lambda k, _v: k != model.ROW_ID_COLUMN)
    return F.when(
        row_id.isNotNull() & image.isNotNull(),
        F.map_concat(without, F.create_map(F.lit(model.ROW_ID_COLUMN), row_id)),
    ).otherwise(image)


def _overlay(base: Column, changed: Column) -> Column:
    kept = F.map_filter(base, lambda k, _v: ~F.map_contains_key(changed, k))
    return F.when(base.isNull(), changed).when(changed.isNull(), base).otherwise(F.map_concat(kept, changed))


def decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """SharePlex JSON messages -> canonical events (one per message)."""
    del options  # the format has none
    msg = F.from_json(F.col(MESSAGE_VALUE).cast("string"), RAW_SCHEMA, {"columnNameOfCorruptRecord": "_corrupt_record"})
    parsed = with_unique_keys(messages, msg, "_m")
    m = F.col("_m")
    meta = m["meta"]
    vendor_op = meta["op"]
    op = F.coalesce(op_from_code(vendor_op, OPERATIONS), F.when(vendor_op.isNotNull(), F.lit(Op.OTHER.value)))
    # Staged as columns, here and for the images below: the overlay's lambda reads `data` once per key, and each
    # image occurs several times in _with_row_id; left as expressions, Spark would evaluate them again each time.
    parsed = parsed.select(
        "*",
        op.alias("_op"),
        exact_text_image(m["data"]).alias("_data"),
        exact_text_image(m["key"]).alias("_key"),
        F.nullif(meta["rowid"], F.lit("")).alias("_row_id"),
    )
    op, data, key, row_id = F.col("_op"), F.col("_data"), F.col("_key"), F.col("_row_id")
    is_row = op.isin(Op.INSERT.value, Op.UPDATE.value, Op.DELETE.value)

    before = F.when(op == Op.DELETE.value, data).when(op == Op.UPDATE.value, key)
    after = F.when(op == Op.INSERT.value, data).when(op == Op.UPDATE.value, _overlay(key, data))
    parsed = parsed.select("*", before.alias("_before"), after.alias("_after"))
    before, after = _with_row_id(F.col("_before"), row_id), _with_row_id(F.col("_after"), row_id)
    names = F.array_distinct(
        F.concat(
            F.coalesce(F.map_keys(data), F.array().cast("array<string>")),
            F.coalesce(F.map_keys(key), F.array().cast("array<string>")),
            F.when(row_id.isNotNull(), F.array(F.lit(model.ROW_ID_COLUMN))).otherwise(F.array().cast("array<string>")),
        )
    )
    columns = F.transform(
        names,
        lambda n: F.struct(
            n.alias("name"),
            F.when(n == model.ROW_ID_COLUMN, F.lit("ROWID")).otherwise(F.lit("text")).alias("vendor_type"),
            F.lit("string").alias("spark_type"),
        ),
    )
    key_columns = F.when(row_id.isNotNull(), F.array(F.lit(model.ROW_ID_COLUMN))).otherwise(
        F.array().cast("array<string>")
    )

    # meta.table is OWNER.TABLE (dts.md section 3).
    table_parts = F.split(meta["table"], r"\.", 2)
    has_owner = F.size(table_parts) == 2
    # The owner is the Oracle schema; it is also the database (the shared checks require one for row events, and
    # the lake path is <database>/<table>).
    schema = F.when(has_owner, table_parts[0])
    table = F.when(has_owner, table_parts[1]).otherwise(meta["table"])

    # Order by (scn, trans, seq) (dts.md section 3); each part padded so that text order = numeric order.
    scn, trans = meta["scn"], meta["trans"]
    # meta.idx is "seq/size" (section 3): its seq orders a message that omits meta.seq ("treat all as optional").
    seq_of_idx = F.regexp_extract(meta["idx"], r"^\s*(\d+)\s*/", 1)
    seq = F.coalesce(meta["seq"], F.when(seq_of_idx != "", seq_of_idx))
    trans_ok = trans.isNull() | trans.rlike(r"^\d{1,10}(\.\d{1,10})*$")
    trans_key = F.coalesce(
        F.concat_ws(".", F.transform(F.split(trans, r"\."), lambda p: F.lpad(p, 10, "0"))), F.lit("")
    )
    seq_key = F.coalesce(model.sortable_decimal(seq, 10), F.lit(""))
    position = F.when(scn.isNotNull(), F.concat_ws(":", model.sortable_decimal(scn), trans_key, seq_key))
    # meta.time: commit time UTC, yyyy-MM-ddTHH:mm:ss (the doc says with a trailing Z; samples have none).
    event_time = F.concat(F.regexp_replace(meta["time"], "Z$", ""), F.lit("Z")).try_cast("timestamp")

    decoded = parsed.select(
        "*",
        op.alias(model.OP),
        vendor_op.alias(model.VENDOR_OP),
        schema.alias(model.DATABASE),
        schema.alias(model.SCHEMA),
        table.alias(model.TABLE),
        F.when(is_row, key_columns).alias(model.KEY_COLUMNS),
        F.when(is_row, before).alias(model.BEFORE),
        F.when(is_row, after).alias(model.AFTER),
        (op == Op.UPDATE.value).alias(model.AFTER_IS_PARTIAL),
        F.when(is_row, columns).alias(model.COLUMNS),
        position.alias(model.POSITION),
        event_time.alias(model.EVENT_TIME),
        trans.alias(model.TXN_ID),
    )
    error = first_error(
        (F.col(MESSAGE_VALUE).isNull(), "empty message (null Kafka value)"),
        (F.col(DUPLICATE_KEY).isNotNull(), F.col(DUPLICATE_KEY)),
        (m.isNull() | m["_corrupt_record"].isNotNull(), "malformed JSON (or a field of the wrong JSON type)"),
        (vendor_op.isNull(), "missing meta.op: not a SharePlex JSON message"),
        (is_row & F.coalesce(table, F.lit("")).eqNullSafe(""), "row event without meta.table"),
        (is_row & schema.isNull(), F.format_string("meta.table '%s' is not OWNER.TABLE", meta["table"])),
        (
            F.coalesce(F.map_contains_key(m["data"], model.ROW_ID_COLUMN), F.lit(False))
            | F.coalesce(F.map_contains_key(m["key"], model.ROW_ID_COLUMN), F.lit(False)),
            f"column name {model.ROW_ID_COLUMN} is reserved for the row identity (meta.rowid)",
        ),
        ((op != Op.UPDATE.value) & is_row & m["data"].isNull(), F.format_string("'%s' without data", vendor_op)),
        (
            (op == Op.UPDATE.value) & m["data"].isNull(),
            "'upd' without data (the changed columns)",
        ),
        (
            (op == Op.UPDATE.value) & m["key"].isNull() & row_id.isNull(),
            "'upd' with neither key nor meta.rowid: the row cannot be located",
        ),
        (
            scn.isNotNull() & model.sortable_decimal(scn).isNull(),
            F.format_string("meta.scn '%s' is not a decimal number", scn),
        ),
        (~trans_ok, F.format_string("meta.trans '%s' is not dot-separated numbers", trans)),
        (
            seq.isNotNull() & model.sortable_decimal(seq, 10).isNull(),
            F.format_string("meta.seq '%s' is not a decimal number", seq),
        ),
    )
    return finish(decoded, NAME, error)


def sniff(message: Any) -> bool:
    """README "Recognition": ``meta.op`` + ``data`` -> DTS SharePlex JSON."""
    if not isinstance(message, dict) or "data" not in message:
        return False
    meta = message.get("meta")
    return isinstance(meta, dict) and isinstance(meta.get("op"), str)


FORMAT: Final = register(
    CdcFormat(
        name=NAME,
        description="Alibaba DTS SharePlex JSON (Oracle sources; updates carry only the changed columns)",
        decode=decode,
        operations=OPERATIONS,
        sniff=sniff,
        examples=("dts-shareplex-json.jsonl",),
    )
)
