"""Oracle GoldenGate for Big Data, JSON formatter, operation-modeled (``ogg-json``).

Spec: ``shared/formats/maxwell-ogg.md`` section 2::

    {"table": "SCHEMA.TABLE", "op_type": "I"|"U"|"D"|"T", "op_ts": "yyyy-MM-dd HH:mm:ss.ffffff" (UTC),
     "current_ts": "..T..", "pos": "00000000070000012345", "primary_keys": [..], "tokens": {..},
     "before": {..}, "after": {..}}

Choices where the spec is silent:

* Column types are inferred from the JSON value kinds (``_json_images.inferred_image_stages``): integers ->
  ``bigint``, fractions -> ``double`` (the canonical text keeps the exact digits), strings -> ``string`` (dates
  too, and every value with ``treatAllColumnsAsStrings``), booleans -> ``boolean``. An Oracle NUMBER column whose
  values are sometimes whole and sometimes fractional is therefore declared ``bigint`` by one message and
  ``double`` by another: configure such tables (or use string values) before go-live.
* Every update's after image is partial (spec section 2, "Compressed updates"): the trail holds only the key and
  the changed columns unless the source runs NOCOMPRESSUPDATES, which the message does not say. Absent columns
  keep their stored values; a column present with JSON null is set to NULL.
* A JSON null says nothing about the column's type: it takes the type the column has in the table's other messages
  of the batch. A column NULL in all of them is left out of the images where that changes nothing (inserts,
  deletes, and updates whose before image has it NULL too); an update to NULL from a value the message does not
  show stays declared ``string`` (``_json_images.type_nulls_in_batch``).
* ``table`` with three parts is ``catalog.schema.table`` (database, schema, table); with two, ``schema.table``,
  and the schema is also reported as the database (the lake path is ``<schema>/<table>`` either way).
"""

from __future__ import annotations

from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdclake import model
from cdclake.formats import register
from cdclake.formats._json_images import inferred_image_stages, type_nulls_in_batch
from cdclake.formats.base import MESSAGE_VALUE, CdcFormat, FormatOptions, finish, first_error, op_from_code
from cdclake.model import Op

NAME: Final = "ogg-json"

RAW_SCHEMA: Final = """
    `table` STRING, op_type STRING, op_ts STRING, current_ts STRING, pos STRING, primary_keys ARRAY<STRING>,
    tokens MAP<STRING, STRING>, before MAP<STRING, VARIANT>, after MAP<STRING, VARIANT>, csn STRING, xid STRING,
    _corrupt_record STRING
"""

# maxwell-ogg.md 2: I/U/D/T; the letters are configurable at the source (insertOpKey, updateOpKey, ...).
OPERATIONS: Final = {"I": Op.INSERT, "U": Op.UPDATE, "D": Op.DELETE, "T": Op.TRUNCATE}
OPTIONS: Final = {
    "insert_op_key": "op_type letter for inserts (gg.handler.*.format.insertOpKey, default I)",
    "update_op_key": "op_type letter for updates (updateOpKey, default U)",
    "delete_op_key": "op_type letter for deletes (deleteOpKey, default D)",
    "truncate_op_key": "op_type letter for truncates (truncateOpKey, default T)",
}

MISSING_SUFFIX: Final = "_isMissing"


def _present(image: Column) -> Column:
    """maxwell-ogg.md 2 ``<col>_isMissing``: drops the flag entries, and the columns they flag as missing (not in
    the trail: unknown, not NULL). An empty object (``"before": {}``, FLINK-32712) is no image."""
    suffix = len(MISSING_SUFFIX)

    def is_flag(k: Column) -> Column:
        return k.endswith(MISSING_SUFFIX) & F.map_contains_key(image, F.substring(k, F.lit(1), F.length(k) - suffix))

    def flagged_missing(k: Column) -> Column:
        # Looked up per entry: a list of the missing columns built outside the lambda would be rebuilt per entry.
        return F.coalesce(F.try_variant_get(image[F.concat(k, F.lit(MISSING_SUFFIX))], "$", "boolean"), F.lit(False))

    kept = F.map_filter(image, lambda k, _v: ~is_flag(k) & ~flagged_missing(k))
    return F.when(F.size(image) > 0, kept)


def _flags_ok(image: Column) -> Column:
    """Flags must be booleans."""
    return F.forall(
        F.map_entries(image),
        lambda e: (
            ~e["key"].endswith(MISSING_SUFFIX)
            | F.try_variant_get(e["value"], "$", "boolean").isNotNull()
            | ~F.map_contains_key(image, F.substring(e["key"], F.lit(1), F.length(e["key"]) - len(MISSING_SUFFIX)))
        ),
    )


def decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """OGG JSON (operation-modeled) messages -> canonical events (one per message)."""
    letters = {
        options.get("insert_op_key", "I"): Op.INSERT,
        options.get("update_op_key", "U"): Op.UPDATE,
        options.get("delete_op_key", "D"): Op.DELETE,
        options.get("truncate_op_key", "T"): Op.TRUNCATE,
    }
    text = F.col(MESSAGE_VALUE).cast("string")
    parsed = messages.select(
        "*", F.from_json(text, RAW_SCHEMA, {"columnNameOfCorruptRecord": "_corrupt_record"}).alias("_m")
    )
    m = F.col("_m")
    payload = F.struct(_present(m["before"]).alias("before"), _present(m["after"]).alias("after"))
    staged = parsed.select("*", payload.alias("_p"))
    p = F.col("_p")
    vendor_op = m["op_type"]
    op = op_from_code(vendor_op, letters)
    staged = inferred_image_stages(staged, p)
    is_row = op.isin(*(o.value for o in model.ROW_OPS))
    parts = F.split(m["table"], r"\.")
    three = F.size(parts) == 3
    # A two-part name has no catalog: the Oracle schema is the namespace, so it is the database too (base.finish
    # rejects row events without a database).
    database = F.when(three, F.get(parts, 0)).when(F.size(parts) == 2, F.get(parts, 0))
    schema = F.when(three, F.get(parts, 1)).when(F.size(parts) == 2, F.get(parts, 0))
    table = F.get(parts, F.size(parts) - 1)
    # maxwell-ogg.md 2: op_ts is the commit time in UTC, `yyyy-MM-dd HH:mm:ss.ffffff` (read as a UTC instant,
    # independent of the session time zone).
    iso = F.regexp_replace(F.trim(m["op_ts"]), " ", "T")
    event_time = F.when(
        iso.rlike(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?$"), F.concat(iso, F.lit("Z")).try_cast("timestamp")
    )
    # maxwell-ogg.md 2: pos = trail file sequence number + RBA, zero-padded digits; compare numerically.
    position = model.sortable_decimal(m["pos"], 30)
    is_update = op == Op.UPDATE.value
    decoded = staged.select(
        "*",
        op.alias(model.OP),
        vendor_op.alias(model.VENDOR_OP),
        F.lit("Oracle").alias(model.DB_TYPE),
        database.alias(model.DATABASE),
        schema.alias(model.SCHEMA),
        table.alias(model.TABLE),
        F.when(is_row, F.coalesce(m["primary_keys"], F.array().cast("array<string>"))).alias(model.KEY_COLUMNS),
        F.when(is_row, F.col("_before_text")).alias(model.BEFORE),
        F.when(is_row & (op != Op.DELETE.value), F.col("_after_text")).alias(model.AFTER),
        # maxwell-ogg.md 2 "Compressed updates": absent columns are unknown, not NULL.
        (is_update & m["after"].isNotNull()).alias(model.AFTER_IS_PARTIAL),
        F.when(is_row, F.col("_columns")).alias(model.COLUMNS),
        position.alias(model.POSITION),
        event_time.alias(model.EVENT_TIME),
        m["xid"].alias(model.TXN_ID),
    )
    error = first_error(
        (F.col(MESSAGE_VALUE).isNull(), "empty message (null Kafka value)"),
        (m.isNull() | m["_corrupt_record"].isNotNull(), "malformed JSON (or a field of the wrong kind)"),
        (vendor_op.isNull(), "missing op_type: not an OGG JSON message"),
        (op.isNull(), F.format_string("unknown OGG op_type '%s'", vendor_op)),
        (m["table"].isNull(), "missing table"),
        (F.size(parts) > 3, F.format_string("table '%s' has more than three parts", m["table"])),
        (m["pos"].isNotNull() & position.isNull(), F.format_string("pos '%s' is not a decimal number", m["pos"])),
        (
            m["op_ts"].isNotNull() & event_time.isNull(),
            F.format_string("op_ts '%s' is not yyyy-MM-dd HH:mm:ss[.ffffff]", m["op_ts"]),
        ),
        (
            ~F.coalesce(_flags_ok(m["before"]), F.lit(True)) | ~F.coalesce(_flags_ok(m["after"]), F.lit(True)),
            "a _isMissing flag is not a boolean",
        ),
        ((op == Op.INSERT.value) & F.col("_p")["after"].isNull(), "insert without an after image"),
        ((op == Op.UPDATE.value) & F.col("_p")["after"].isNull(), "update without an after image"),
        ((op == Op.DELETE.value) & F.col("_p")["before"].isNull(), "delete without a before image"),
    )
    return finish(decoded, NAME, error)


def sniff(message: Any) -> bool:
    """README "Recognition": ``op_type`` + ``op_ts`` + ``table``."""
    return isinstance(message, dict) and {"op_type", "op_ts", "table"} <= message.keys()


FORMAT: Final = register(
    CdcFormat(
        name=NAME,
        description="Oracle GoldenGate for Big Data JSON (operation-modeled), compressed updates, _isMissing flags",
        decode=decode,
        # Every update is read as compressed (see the module doc).
        batch_step=lambda events: type_nulls_in_batch(events, changed_only=F.col(model.OP) == Op.UPDATE.value),
        operations=OPERATIONS,
        options=OPTIONS,
        sniff=sniff,
        examples=("ogg-json.jsonl",),
    )
)
