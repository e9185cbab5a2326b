"""Debezium JSON (``debezium-json``) and Alibaba Lindorm's Debezium-like subscription format (``lindorm-debezium``).

Specs: ``shared/formats/debezium.md`` and ``shared/formats/lindorm-debezium.md``. Both carry a Debezium envelope
``{before, after, source, op, ts_ms}``, optionally wrapped in a Kafka Connect ``{"schema", "payload"}`` pair. The
two formats share the image helpers of ``_json_images`` (value conversion by Connect type, type inference from
JSON value kinds); they differ in keys, ordering, partial images and the control topics.

Choices where the specs are silent (documented here once):

* Without a Connect schema (``schemas.enable=false``, or Lindorm's ``"schema": {}``) column types are inferred from
  the JSON value kinds: integers -> ``bigint``, numbers with a fraction or exponent -> ``double`` (the canonical
  text keeps the exact digits), strings -> ``string``, booleans -> ``boolean``, objects and arrays -> ``string``
  (JSON text). Logical types (Decimal bytes, epoch days...) cannot be recognised without the schema: such values
  arrive as what their JSON kind says. A JSON null says nothing about the type: it takes the type the column has
  in the table's other messages of the batch; a column NULL in all of them is left out of the images
  (``_json_images.type_nulls_in_batch``; a column NULL in a changed-only image without a before value stays
  ``string``).
* Times of day (``io.debezium.time.Time/MicroTime/NanoTime``, Connect ``Time``) have no canonical Spark type: they
  become ``string`` ``[-]HH:mm:ss.ffffff`` (MySQL TIME may be negative or exceed 24 hours).
* ``Timestamp``/``MicroTimestamp``/``NanoTimestamp`` (wall-clock DATETIME encoded "as if UTC", debezium.md 6) and
  ``ZonedTimestamp`` all become ``timestamp`` instants without any shift; nanoseconds are truncated to microseconds.
* ``Decimal`` becomes ``decimal(p,s)`` (``p`` from ``connect.decimal.precision``, else 38); precisions above 38 and
  PostgreSQL ``VariableScaleDecimal`` become ``string`` holding the exact decimal text.
* Debezium keys come from the Kafka key (debezium.md 4); a key that is not a JSON object gives no key columns.
* A tombstone (null value) is ``OTHER`` with ``vendor_op`` ``tombstone``; transaction records are ``TXN_BEGIN`` /
  ``TXN_END`` (``vendor_op`` = status, ``txn_id`` = ``id``); a value with only ``ts_ms`` is ``HEARTBEAT``
  (``vendor_op`` ``heartbeat``); schema-change records (``ddl`` or ``historyRecord``) are ``DDL`` (``vendor_op``
  ``ddl``). ``m`` messages are ``OTHER``. ``t`` is ``TRUNCATE`` without DDL text (Debezium carries none).
* Ordering (``debezium_position``): PostgreSQL ``lsn``; MySQL binlog file number, ``pos``, ``row``; Oracle
  ``commit_scn`` (``scn`` for snapshot rows) then ``scn``; SQL Server ``commit_lsn``, ``change_lsn``,
  ``event_serial_no``. MySQL GTID-only sources and other connectors get no position (Kafka order).
* A primary-key update (debezium.md 2): the ``c`` with the ``__debezium.oldkey`` header is an UPDATE from the old
  key (the header's key columns are its before image), and the ``d`` with ``__debezium.newkey`` is an OTHER event
  (not applied: the UPDATE retires the old key, and the new key's row takes what the ``c`` lacks from the old row),
  in whatever order and batches they come. Without the headers (a capture without them, a header converter that
  does not write JSON), a ``c`` with unavailable values is paired with its ``d`` by table and position in the batch
  and becomes such an UPDATE (:func:`key_changes_rejoined`), PostgreSQL and MySQL only; one left unpaired stays an
  insert lacking those columns, with a warning naming its table.
* Lindorm: no position (lindorm-debezium.md "Ordering": the Kafka order is the order); SQL tables carry no key
  (configure ``keys``); HBase tables (recognised by a ``ROW`` column) declare every column ``binary`` and are keyed
  by the hex text of ``ROW`` in ``model.ROW_ID_COLUMN`` (see :func:`with_row_id`).
"""

from __future__ import annotations

import base64
import functools
import logging
from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdclake import model
from cdclake.formats import register
from cdclake.formats._json_images import (
    CONNECT_SCHEMA,
    fields_columns,
    fields_errors,
    image_stages,
    inferred_fields,
    inferred_kinds,
    schema_fields,
    texts,
    type_nulls_in_batch,
    variant_schema_fields,
)
from cdclake.formats.base import (
    DUPLICATE_KEY,
    MESSAGE_HEADERS,
    MESSAGE_KEY,
    MESSAGE_VALUE,
    CdcFormat,
    FormatOptions,
    div,
    epoch_timestamp,
    finish,
    first_error,
    header_text,
    op_from_code,
    with_missing_as_null,
    with_unique_keys,
)
from cdclake.model import Op

log = logging.getLogger(__name__)

NAME: Final = "debezium-json"
LINDORM_NAME: Final = "lindorm-debezium"

PLACEHOLDER: Final = "__debezium_unavailable_value"
"""debezium.md 6: default ``unavailable.value.placeholder``."""

OLD_KEY_HEADER: Final = "__debezium.oldkey"
"""debezium.md 2: the Kafka header of the ``c`` half of a primary-key update, holding the row's old key."""
NEW_KEY_HEADER: Final = "__debezium.newkey"
"""debezium.md 2: the Kafka header of the ``d`` half of a primary-key update, holding the row's new key."""

# debezium.md 2, "Canonical mapping".
OPERATIONS: Final = {
    "c": Op.INSERT,
    "u": Op.UPDATE,
    "d": Op.DELETE,
    "r": Op.UPSERT,
    "t": Op.TRUNCATE,
    "m": Op.OTHER,
    "BEGIN": Op.TXN_BEGIN,
    "END": Op.TXN_END,
    "heartbeat": Op.HEARTBEAT,
    "ddl": Op.DDL,
    "tombstone": Op.OTHER,
}
_DATA_OPS: Final = {k: v for k, v in OPERATIONS.items() if len(k) == 1}

# lindorm-debezium.md "Operations": c/u/d, r reserved ("not produced yet").
LINDORM_OPERATIONS: Final = {"c": Op.INSERT, "u": Op.UPDATE, "d": Op.DELETE, "r": Op.UPSERT}

_SOURCE: Final = (
    "STRUCT<version: STRING, connector: STRING, name: STRING, ts_ms: BIGINT, ts_us: BIGINT, ts_ns: STRING, "
    "snapshot: STRING, db: STRING, sequence: STRING, `schema`: STRING, `table`: STRING, file: STRING, pos: STRING, "
    "`row`: STRING, gtid: STRING, txId: STRING, lsn: STRING, scn: STRING, commit_scn: STRING, change_lsn: STRING, "
    "commit_lsn: STRING, event_serial_no: STRING, namespace: STRING>"
)


def _envelope(image: str) -> list[tuple[str, str]]:
    return [
        ("op", "STRING"),
        ("before", f"MAP<STRING, {image}>"),
        ("after", f"MAP<STRING, {image}>"),
        ("source", _SOURCE),
        ("ts_ms", "BIGINT"),
        ("transaction", "STRUCT<id: STRING, total_order: BIGINT, data_collection_order: BIGINT>"),
        ("status", "STRING"),
        ("id", "STRING"),
        ("databaseName", "STRING"),
        ("schemaName", "STRING"),
        ("ddl", "STRING"),
        ("historyRecord", "STRING"),
        ("message", "STRUCT<prefix: STRING, content: STRING>"),
    ]


def _raw_schema(image: str, schema: str) -> str:
    fields = _envelope(image)
    inner = ", ".join(f"`{n}`: {t}" for n, t in fields)
    top = ", ".join(f"`{n}` {t}" for n, t in fields)
    return f"`schema` {schema}, payload STRUCT<{inner}>, {top}, _corrupt_record STRING"


PAYLOAD_SCHEMA: Final = "STRUCT<" + ", ".join(f"`{n}`: {t}" for n, t in _envelope("VARIANT")) + ">"
"""The envelope (``_p`` of :func:`parse`) as a type: what a Debezium value's payload is read as."""

RAW_SCHEMA: Final = _raw_schema("VARIANT", CONNECT_SCHEMA)
"""Images as MAP<STRING, VARIANT>: exact numbers (base.exact_text_image); the Connect schema typed
(CONNECT_SCHEMA)."""
ANY_SCHEMA: Final = _raw_schema("VARIANT", "VARIANT")
""":data:`RAW_SCHEMA` with the Connect schema as a VARIANT, for the messages whose schema RAW_SCHEMA cannot read."""


def _key_columns(key: Column) -> Column:
    """debezium.md 4: the Kafka key is a JSON struct of the key columns, with or without the Connect schema."""
    # Values as text (an object's is its JSON text): only the names are needed, and the wrapped key's payload is a
    # few bytes to parse again, while a VARIANT parse would build one of the key's schema too.
    bare = F.from_json(key.cast("string"), "MAP<STRING, STRING>")
    payload_names = F.map_keys(F.from_json(bare["payload"], "MAP<STRING, STRING>"))
    is_wrapped = F.map_contains_key(bare, "schema") & payload_names.isNotNull()
    keys = F.when(is_wrapped, payload_names).otherwise(F.map_keys(bare))
    return F.coalesce(keys, F.array().cast("array<string>"))


@functools.cache
def _key_header_image(name: str) -> Column:
    """The key columns in header ``name`` as a raw image (``MAP<STRING, VARIANT>``, as ``_p.before``), or null when
    the message has no such header or it is not a JSON object. Debezium writes the key there as the worker's header
    converter renders it: Kafka Connect's default (``SimpleHeaderConverter``) writes a key struct as a JSON object,
    the ``JsonConverter`` with or without the Connect schema (``payload``) around it."""
    read = F.from_json(header_text(name), "MAP<STRING, VARIANT>")
    payload = F.try_variant_get(read["payload"], "$", "MAP<STRING, VARIANT>")
    image = F.when(F.map_contains_key(read, "schema") & payload.isNotNull(), payload).otherwise(read)
    return F.when(F.size(image) > 0, image)


def _binlog_number(file: Column) -> Column:
    """debezium.md 2 (MySQL ``file``): ``mysql-bin.000003`` -> its numeric suffix, sortable."""
    return model.sortable_decimal(F.regexp_extract(file, r"\.(\d+)$", 1), 12)


def debezium_position(source: Column) -> Column:
    """debezium.md 2 "source block": a string in source order, by whichever connector fields are present.

    PostgreSQL ``lsn``; MySQL/MariaDB (``file`` numeric suffix, ``pos``, ``row``); Oracle (``commit_scn`` or, for
    snapshot rows, ``scn``; then ``scn``); SQL Server/Db2 (``commit_lsn``, ``change_lsn``, ``event_serial_no``: the
    LSNs are fixed-width hex text that already sorts). Null when none is present.
    """
    pg = model.sortable_decimal(source["lsn"], 20)
    mysql = F.concat_ws(
        ":",
        _binlog_number(source["file"]),
        model.sortable_decimal(source["pos"], 20),
        model.sortable_decimal(F.coalesce(source["row"], F.lit("0")), 10),
    )
    oracle = F.concat_ws(
        ":",
        model.sortable_decimal(F.coalesce(source["commit_scn"], source["scn"]), 24),
        model.sortable_decimal(F.coalesce(source["scn"], source["commit_scn"]), 24),
    )
    sqlserver = F.concat_ws(
        ":",
        source["commit_lsn"],
        F.coalesce(source["change_lsn"], F.lit("")),
        model.sortable_decimal(F.coalesce(source["event_serial_no"], F.lit("0")), 10),
    )
    return (
        F.when(source["lsn"].isNotNull(), F.when(pg.isNotNull(), pg))
        .when(
            source["file"].isNotNull(),
            F.when(
                _binlog_number(source["file"]).isNotNull()
                & model.sortable_decimal(source["pos"], 20).isNotNull()
                & model.sortable_decimal(F.coalesce(source["row"], F.lit("0")), 10).isNotNull(),
                mysql,
            ),
        )
        .when(
            source["scn"].isNotNull() | source["commit_scn"].isNotNull(),
            F.when(
                model.sortable_decimal(F.coalesce(source["commit_scn"], source["scn"]), 24).isNotNull()
                & model.sortable_decimal(F.coalesce(source["scn"], source["commit_scn"]), 24).isNotNull(),
                oracle,
            ),
        )
        .when(
            source["commit_lsn"].isNotNull(),
            F.when(
                model.sortable_decimal(F.coalesce(source["event_serial_no"], F.lit("0")), 10).isNotNull(), sqlserver
            ),
        )
    )


def _has_position_fields(source: Column) -> Column:
    return (
        source["lsn"].isNotNull()
        | source["file"].isNotNull()
        | source["scn"].isNotNull()
        | source["commit_scn"].isNotNull()
        | source["commit_lsn"].isNotNull()
    )


def _event_time(source: Column, fallback_ms: Column) -> Column:
    """debezium.md 2: ``source.ts_us``/``ts_ns`` (2.6+) when present, else ``source.ts_ms``, else the envelope's."""
    return F.coalesce(
        F.timestamp_micros(source["ts_us"]),
        F.timestamp_micros(div(source["ts_ns"].try_cast("bigint"), 1000)),
        epoch_timestamp(source["ts_ms"], "ms"),
        epoch_timestamp(fallback_ms, "ms"),
    )


def parse(messages: DataFrame) -> DataFrame:
    """Raw messages + ``_m`` (parsed value), ``_schema_fields`` (the fields its Connect schema declares), ``_p`` (the
    envelope: ``payload`` or the value itself) and ``_inferred_kinds`` (the images' JSON kinds, for type inference,
    when the message declares no fields: ``_json_images.inferred_kinds``)."""
    options = {"columnNameOfCorruptRecord": "_corrupt_record"}
    text = F.col(MESSAGE_VALUE).cast("string")
    parsed = with_unique_keys(messages, F.from_json(text, RAW_SCHEMA, options), "_typed")
    typed = F.col("_typed")
    # A schema the typed parse cannot read (CONNECT_SCHEMA) is read again as a VARIANT, for such messages only; a
    # value that is not JSON is malformed either way.
    parsed = parsed.withColumn(
        "_any", F.when(typed["_corrupt_record"].isNotNull(), F.from_json(text, ANY_SCHEMA, options))
    )
    anything = F.col("_any")
    parsed = parsed.select(
        *messages.columns,
        DUPLICATE_KEY,
        F.when(anything.isNull(), typed)
        .otherwise(anything.withField("schema", F.lit(None).cast(CONNECT_SCHEMA)))
        .alias("_m"),
        F.when(anything.isNull(), schema_fields(typed["schema"]))
        .otherwise(variant_schema_fields(anything["schema"]))
        .alias("_schema_fields"),
    )
    m = F.col("_m")
    # debezium.md 1: "if the value has payload and schema keys use value.payload, else value".
    wrapped = m["payload"].isNotNull()
    payload = F.when(wrapped, m["payload"]).otherwise(F.struct(*(m[n].alias(n) for n, _ in _envelope("VARIANT"))))
    parsed = parsed.select("*", payload.alias("_p"))
    p = F.col("_p")
    # Types are inferred only for the messages that declare no fields.
    kinds = F.when(F.col("_schema_fields").isNull(), inferred_kinds(p["before"], p["after"]))
    return parsed.select("*", kinds.alias("_inferred_kinds"))


def declared_or_inferred_fields() -> Column:
    return F.coalesce(F.col("_schema_fields"), inferred_fields(F.col("_inferred_kinds")))


# ----------------------------------------------------------------------------------------------------------------
# debezium-json


def decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """Debezium JSON messages (data, transaction, heartbeat and schema-change topics; tombstones) -> events."""
    return decode_parsed(parse(messages), options, NAME)


def decode_parsed(
    parsed: DataFrame,
    options: FormatOptions,
    format_name: str,
    *,
    key: Column | None = None,
    format_error: Column | None = None,
) -> DataFrame:
    """Debezium envelopes -> events: the messages with the columns :func:`parse` adds (``_m``, ``_schema_fields``,
    ``_p``, ``_inferred_kinds``), however they were read (``debezium-avro`` builds them from Avro records).

    Args:
        key: the Kafka key as JSON text (default: the message key); its object's names are the key columns.
        format_error: the reading's own error (an undecodable Avro value...), which wins over Debezium's checks.
    """
    placeholder = options.get("unavailable_value_placeholder", PLACEHOLDER)
    # debezium.md 6 "Unavailable values": the placeholder (or, for bytes columns, its base64) never overwrites a
    # stored value: such columns are left out of the images, and the after image becomes partial.
    unavailable = (placeholder, base64.b64encode(placeholder.encode()).decode())
    m, p = F.col("_m"), F.col("_p")
    source = p["source"]
    # debezium.md 2: a primary-key update is a ``d`` of the old key with the ``__debezium.newkey`` header and a ``c``
    # of the new key with ``__debezium.oldkey``. Their Kafka keys differ, so they may come in either order, in
    # different batches. The ``c`` is the UPDATE from the old key (its before image), which retires the old key's
    # row and moves it: the new key's row takes what the ``c`` lacks (unavailable values) from it
    # (``apply.moves_made_whole``). So the ``d`` must not delete that row first: it is an OTHER event, not applied.
    # Headers unreadable as a JSON object leave both as they look (a delete and an insert).
    if MESSAGE_HEADERS in parsed.columns:
        parsed = parsed.select(
            "*",
            F.when(p["op"] == "c", _key_header_image(OLD_KEY_HEADER)).alias("_old_key"),
            F.coalesce((p["op"] == "d") & _key_header_image(NEW_KEY_HEADER).isNotNull(), F.lit(False)).alias(
                "_moved_away"
            ),
        )
        moved, moved_away = F.col("_old_key").isNotNull(), F.col("_moved_away")
        payload = p.withField("before", F.coalesce(F.col("_old_key"), p["before"]))
    else:
        moved, moved_away, payload = F.lit(False), F.lit(False), p
    staged = image_stages(parsed, payload, declared_or_inferred_fields(), unavailable)
    staged = staged.select("*", debezium_position(source).alias("_position"))
    tombstone = F.col(MESSAGE_VALUE).isNull()
    is_data = p["op"].isNotNull()
    is_txn = ~is_data & p["status"].isNotNull()
    is_ddl = ~is_data & ~is_txn & (p["ddl"].isNotNull() | p["historyRecord"].isNotNull())
    # debezium.md 3: heartbeat values carry only ts_ms.
    is_heartbeat = (
        ~is_data
        & ~is_txn
        & ~is_ddl
        & p["ts_ms"].isNotNull()
        & source.isNull()
        & p["before"].isNull()
        & p["after"].isNull()
        & p["id"].isNull()
    )
    vendor_op = (
        F.when(tombstone, F.lit("tombstone"))
        .when(is_data, p["op"])
        .when(is_txn, p["status"])
        .when(is_ddl, F.lit("ddl"))
        .when(is_heartbeat, F.lit("heartbeat"))
    )
    # debezium.md 2 "Canonical mapping": a tombstone (null value after a delete) is an OTHER event, never an error
    # and never applied: the delete before it already removed the row.
    op = (
        F.when(tombstone, F.lit(Op.OTHER.value))
        .when(is_data & moved, F.lit(Op.UPDATE.value))
        .when(is_data & moved_away, F.lit(Op.OTHER.value))
        .when(is_data, op_from_code(p["op"], _DATA_OPS))
        .when(is_txn, op_from_code(p["status"], {"BEGIN": Op.TXN_BEGIN, "END": Op.TXN_END}))
        .when(is_ddl, F.lit(Op.DDL.value))
        .when(is_heartbeat, F.lit(Op.HEARTBEAT.value))
    )
    is_row = op.isin(*(o.value for o in model.ROW_OPS))
    position = F.col("_position")
    ddl_text = F.coalesce(p["ddl"], F.get_json_object(p["historyRecord"], "$.ddl"))
    with_table = is_row | (op == Op.TRUNCATE.value) | is_ddl | moved_away
    decoded = staged.select(
        "*",
        op.alias(model.OP),
        vendor_op.alias(model.VENDOR_OP),
        F.when(~tombstone, source["connector"]).alias(model.DB_TYPE),
        F.when(with_table, F.coalesce(p["databaseName"], source["db"])).alias(model.DATABASE),
        F.when(with_table, F.coalesce(p["schemaName"], source["schema"])).alias(model.SCHEMA),
        F.when(with_table, F.nullif(source["table"], F.lit(""))).alias(model.TABLE),
        F.when(is_row, _key_columns(F.col(MESSAGE_KEY) if key is None else key)).alias(model.KEY_COLUMNS),
        F.when(is_row, texts(F.col("_before_pairs"))).alias(model.BEFORE),
        F.when(is_row, texts(F.col("_after_pairs"))).alias(model.AFTER),
        (is_row & F.col("_partial")).alias(model.AFTER_IS_PARTIAL),
        F.when(is_row, fields_columns(F.col("_fields"))).alias(model.COLUMNS),
        F.when(with_table, position).alias(model.POSITION),
        F.when(~tombstone, _event_time(F.when(~is_txn & ~is_heartbeat, source), p["ts_ms"])).alias(model.EVENT_TIME),
        F.when(is_txn, p["id"]).otherwise(p["transaction"]["id"]).alias(model.TXN_ID),
        F.when(is_ddl, ddl_text).alias(model.DDL),
    )
    # A JSON value whose objects repeat a key (base.with_unique_keys; debezium-avro's records have none).
    duplicate_key = F.col(DUPLICATE_KEY) if DUPLICATE_KEY in staged.columns else F.lit(None).cast("string")
    error = first_error(
        *(() if format_error is None else ((format_error.isNotNull(), format_error),)),
        (duplicate_key.isNotNull(), duplicate_key),
        (~tombstone & (m.isNull() | m["_corrupt_record"].isNotNull()), "malformed JSON (or a field of the wrong kind)"),
        (~tombstone & vendor_op.isNull(), "not a Debezium message: no op, transaction status, ddl or heartbeat ts_ms"),
        (is_data & op.isNull(), F.format_string("unknown Debezium op '%s'", p["op"])),
        (is_txn & op.isNull(), F.format_string("unknown transaction status '%s'", p["status"])),
        (is_txn & p["id"].isNull(), "transaction record without id"),
        *fields_errors(is_row),
        (
            with_table & _has_position_fields(source) & position.isNull(),
            F.format_string(
                "source position cannot be ordered (lsn %s, file %s, pos %s, scn %s, commit_lsn %s)",
                source["lsn"],
                source["file"],
                source["pos"],
                F.coalesce(source["commit_scn"], source["scn"]),
                source["commit_lsn"],
            ),
        ),
    )
    return finish(decoded, format_name, error)


ROW_POSITION_CONNECTORS: Final = ("postgresql", "mysql")
"""Connectors whose position (:func:`debezium_position`) is one row change's own: PostgreSQL's ``lsn``, MySQL's
``file``, ``pos`` and ``row``. Oracle's ``commit_scn`` and ``scn`` may be shared by several rows' changes."""


def key_changes_rejoined(events: DataFrame) -> DataFrame:
    """debezium.md 2: an update of the primary key arrives as a ``d`` of the old key, then a ``c`` of the new one,
    both at the update's position. When the log left unchanged columns out (section 6, unavailable values: a
    PostgreSQL TOASTed column, a MySQL ``binlog_row_image=NOBLOB`` BLOB), the ``c`` has a partial image: alone, an
    insert without those columns, whose values are the old key's row's. Such a ``c`` becomes the UPDATE it was, with
    the ``d``'s before image (the old key) as its own, so that the new key's row takes the missing columns from the
    old key's (``apply.moves_made_whole``); its ``vendor_op`` stays ``c``.

    Paired by table and position, for the connectors whose position is one row's (:data:`ROW_POSITION_CONNECTORS`),
    where the batch holds one old key (``d`` before image) and one new row (``c`` after image) at that position
    (re-sent copies are the same). A ``d`` and a ``c`` in different batches are not paired: the ``c`` stays an
    insert. A batch step: it reads the whole batch, from a local checkpoint, and only a batch with such a ``c`` pays
    for the join. Only for messages without the key headers: with them, the decoder made the pair already.

    A ``c`` with unavailable values left unpaired (its ``d`` in another batch, or a connector whose position is not
    one row's) is applied as the insert it looks like, and its row lacks those columns' values: a warning per batch
    names its tables (:func:`_warn_unpaired`), so that the loss is not silent."""
    events = events.localCheckpoint(eager=True)
    row_positioned = F.col(model.DB_TYPE).isin(*ROW_POSITION_CONNECTORS) & F.col(model.POSITION).isNotNull()
    any_partial_create = (
        (F.col(model.VENDOR_OP) == "c")
        & (F.col(model.OP) == Op.INSERT.value)
        & F.col(model.AFTER_IS_PARTIAL)
        & F.col(model.ERROR).isNull()
    )
    if events.where(any_partial_create).isEmpty():
        return events
    partial_create = any_partial_create & row_positioned
    at = [model.DB_TYPE, model.DATABASE, model.SCHEMA, model.TABLE, model.POSITION]
    pair_ops = (
        F.col(model.VENDOR_OP).isin("c", "d")
        & F.col(model.OP).isin(Op.INSERT.value, Op.DELETE.value)
        & row_positioned
        & F.col(model.ERROR).isNull()
    )
    deleted = F.when(F.col(model.VENDOR_OP) == "d", F.to_json(F.col(model.BEFORE)))
    created = F.when(F.col(model.VENDOR_OP) == "c", F.to_json(F.col(model.AFTER)))
    pairs = (
        events.where(pair_ops)
        .groupBy(*at)
        .agg(
            F.count_distinct(deleted).alias("_old_rows"),
            F.count_distinct(created).alias("_new_rows"),
            # A NULL in a d's before image may be a column the log left out (PostgreSQL's default replica identity
            # logs the key only); the c's image lies over this one, where it would clear the old row's values.
            F.first(
                F.when(F.col(model.VENDOR_OP) == "d", F.map_filter(F.col(model.BEFORE), lambda _k, v: v.isNotNull())),
                ignorenulls=True,
            ).alias("_old"),
        )
        .where((F.col("_old_rows") == 1) & (F.col("_new_rows") == 1) & F.col("_old").isNotNull())
        .select(*(F.col(c).alias(f"_at_{c}") for c in at), "_old")
    )
    matched = [F.col(c).eqNullSafe(F.col(f"_at_{c}")) for c in at]
    joined = events.join(pairs, functools.reduce(lambda a, b: a & b, matched) & partial_create, "left")
    rejoined = F.col("_old").isNotNull()
    replaced = {
        model.OP: F.when(rejoined, F.lit(Op.UPDATE.value)).otherwise(F.col(model.OP)),
        model.BEFORE: F.when(rejoined, F.col("_old")).otherwise(F.col(model.BEFORE)),
    }
    rejoined_events = joined.select(*(replaced.get(c, F.col(c)).alias(c) for c in events.columns))
    _warn_unpaired(rejoined_events.where(any_partial_create))
    return rejoined_events


def _warn_unpaired(creates: DataFrame) -> None:
    """Logs a warning per table of the ``c`` events with unavailable values that stay inserts (see
    :func:`key_changes_rejoined`): how many, and what their rows lack. One small job, in the batches that hold such
    a ``c`` only."""
    table = [model.DB_TYPE, model.DATABASE, model.SCHEMA, model.TABLE]
    for row in creates.groupBy(*table).count().orderBy(*table).collect():
        name = ".".join(part for part in (row[model.DATABASE], row[model.SCHEMA], row[model.TABLE]) if part)
        log.warning(
            "%d Debezium create(s) of %s carry unavailable values (the second half of a primary-key update) without "
            "the delete of their old key at the same position in this batch: applied as inserts, so those columns "
            "keep what the new key's lake row holds (NULL in a new row) instead of the old row's values. A key "
            "change is made whole when the create has the __debezium.oldkey header, or else when both halves are in "
            "one batch at one PostgreSQL or MySQL position (connector: %s)",
            row["count"],
            name,
            row[model.DB_TYPE],
        )


def sniff(message: Any) -> bool:
    """README "Recognition": Debezium with schema (``payload.op`` one letter), without schema (top-level ``op`` +
    ``source``), transaction topic (``status`` BEGIN/END + ``id``), heartbeat (only ``ts_ms``), tombstone (null);
    anything with ``source.namespace`` is Lindorm's."""
    if message is None:
        return True
    if not isinstance(message, dict):
        return False
    body = message.get("payload") if {"schema", "payload"} <= message.keys() else message
    if not isinstance(body, dict):
        return False
    source = body.get("source")
    if isinstance(source, dict) and "namespace" in source and "connector" not in source:
        return False
    if body.get("op") in _DATA_OPS and isinstance(source, dict):
        return True
    if body.get("status") in ("BEGIN", "END") and "id" in body:
        return True
    if "ddl" in body and isinstance(source, dict):
        return True
    return set(body) == {"ts_ms"}


FORMAT: Final = register(
    CdcFormat(
        name=NAME,
        description="Debezium JSON change events (with or without the Connect schema), transaction, heartbeat "
        "and schema-change topics, tombstones",
        decode=decode,
        batch_step=lambda events: type_nulls_in_batch(
            key_changes_rejoined(events), changed_only=F.col(model.AFTER_IS_PARTIAL)
        ),
        operations=OPERATIONS,
        options={
            "unavailable_value_placeholder": f"the connector's unavailable.value.placeholder (default {PLACEHOLDER})"
        },
        sniff=sniff,
        examples=("debezium.jsonl",),
    )
)


# ----------------------------------------------------------------------------------------------------------------
# lindorm-debezium

HBASE_ROW: Final = "ROW"
"""lindorm-debezium.md "HBase tables": the row key column; every other column is ``<family>_<qualifier>``."""


def _row_id_columns(is_hbase: Column) -> Column:
    column = F.struct(
        F.lit(model.ROW_ID_COLUMN).alias("name"),
        F.lit("hbase row key (hex)").alias("vendor_type"),
        F.lit("string").alias("spark_type"),
    )
    return F.when(is_hbase, F.array(column)).otherwise(F.array().cast(f"array<{model.COLUMN_TYPE.simpleString()}>"))


def with_row_id(image: Column, is_hbase: Column) -> Column:
    """lindorm-debezium.md "HBase tables": the key is the ``ROW`` bytes. They stay in the binary column ``ROW``;
    the key is their lower-case hex text in ``model.ROW_ID_COLUMN``, because the Delta sink keeps statistics on key
    columns and Delta has none for binary columns."""
    row_id = F.lower(F.hex(F.try_to_binary(image[HBASE_ROW], F.lit("base64"))))
    # An image that has a column of that name already is a dead letter (lindorm_decode); map_concat would fail the
    # whole batch on it (DUPLICATED_MAP_KEY).
    return F.when(
        is_hbase & image.isNotNull() & ~F.map_contains_key(image, model.ROW_ID_COLUMN),
        F.map_concat(image, F.create_map(F.lit(model.ROW_ID_COLUMN), row_id)),
    ).otherwise(image)


def _hbase_fields(before: Column, after: Column) -> Column:
    """lindorm-debezium.md "HBase tables": every value is base64 of raw bytes, without type information."""
    names = F.array_distinct(
        F.concat(
            F.coalesce(F.map_keys(after), F.array().cast("array<string>")),
            F.coalesce(F.map_keys(before), F.array().cast("array<string>")),
        )
    )
    return F.transform(
        names,
        lambda n: F.struct(
            n.alias("field"),
            F.lit("bytes").alias("type"),
            F.lit("hbase bytes").alias("name"),
            F.create_map().cast("map<string,string>").alias("parameters"),
        ),
    )


def lindorm_decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """Lindorm subscription messages (Debezium-like v2.0, SQL and HBase tables) -> events (one per message)."""
    del options  # the format has none
    parsed = parse(messages)
    p = F.col("_p")
    is_hbase = F.coalesce(
        F.map_contains_key(p["after"], HBASE_ROW) | F.map_contains_key(p["before"], HBASE_ROW), F.lit(False)
    )
    fields = F.when(is_hbase, _hbase_fields(p["before"], p["after"])).otherwise(declared_or_inferred_fields())
    m, source = F.col("_m"), p["source"]
    staged = image_stages(parsed, p, fields)
    vendor_op = p["op"]
    op = op_from_code(vendor_op, LINDORM_OPERATIONS)
    is_row = op.isin(*(o.value for o in model.ROW_OPS))
    # Staged: the full after image reads `after` several times.
    staged = staged.select("*", with_row_id(texts(F.col("_after_pairs")), is_hbase).alias("_after_text"))
    after = F.col("_after_text")
    before = with_row_id(texts(F.col("_before_pairs")), is_hbase)
    # lindorm-debezium.md "Column deletion": a column missing from `after` (present in `before`, or declared by the
    # schema) was deleted: `after` is a full image, and the missing columns are written as NULL explicitly.
    # ROW_ID_COLUMN is always in `after`. A field without a name (a dead letter for its column names, the shared
    # checks) is no map key: map_from_arrays failed the whole batch on it (NULL_MAP_KEY).
    declared = F.array_compact(F.col("_fields")["field"])
    full_after = with_missing_as_null(after, declared)
    decoded = staged.select(
        "*",
        op.alias(model.OP),
        vendor_op.alias(model.VENDOR_OP),
        F.lit("Lindorm").alias(model.DB_TYPE),
        # lindorm-debezium.md "Layout": namespace ~ database; `db` is the instance id (ld-...).
        source["namespace"].alias(model.DATABASE),
        source["table"].alias(model.TABLE),
        # HBase: the key is the row key `ROW`; SQL tables: from the table DDL (configure `keys`).
        F.when(
            is_row, F.when(is_hbase, F.array(F.lit(model.ROW_ID_COLUMN))).otherwise(F.array().cast("array<string>"))
        ).alias(model.KEY_COLUMNS),
        F.when(is_row, before).alias(model.BEFORE),
        F.when(is_row & p["after"].isNotNull(), full_after).alias(model.AFTER),
        F.when(is_row, F.concat(fields_columns(F.col("_fields")), _row_id_columns(is_hbase))).alias(model.COLUMNS),
        # lindorm-debezium.md "Ordering": no sequence field; the Kafka order is the order (position null).
        epoch_timestamp(F.coalesce(source["ts_ms"], p["ts_ms"]), "ms").alias(model.EVENT_TIME),
    )
    error = first_error(
        (F.col(MESSAGE_VALUE).isNull(), "empty message (null Kafka value)"),
        (F.col(DUPLICATE_KEY).isNotNull(), F.col(DUPLICATE_KEY)),
        (m.isNull() | m["_corrupt_record"].isNotNull(), "malformed JSON (or a field of the wrong kind)"),
        (vendor_op.isNull(), "missing payload.op: not a Lindorm subscription message"),
        (op.isNull(), F.format_string("unknown Lindorm op '%s'", vendor_op)),
        (source["namespace"].isNull(), "missing payload.source.namespace"),
        (
            is_hbase
            & (
                F.coalesce(F.map_contains_key(p["after"], model.ROW_ID_COLUMN), F.lit(False))
                | F.coalesce(F.map_contains_key(p["before"], model.ROW_ID_COLUMN), F.lit(False))
            ),
            f"HBase row with a column named {model.ROW_ID_COLUMN}, the name of its row key's hex text",
        ),
        *fields_errors(is_row),
    )
    return finish(decoded, LINDORM_NAME, error)


def lindorm_sniff(message: Any) -> bool:
    """README "Recognition": ``payload.source.namespace`` and no ``source.connector`` (also un-wrapped)."""
    if not isinstance(message, dict):
        return False
    body = message.get("payload") if {"schema", "payload"} <= message.keys() else message
    source = body.get("source") if isinstance(body, dict) else None
    return isinstance(source, dict) and "namespace" in source and "connector" not in source


LINDORM_FORMAT: Final = register(
    CdcFormat(
        name=LINDORM_NAME,
        description="Alibaba Lindorm data subscription, Debezium format v2.0 (SQL and HBase tables)",
        decode=lindorm_decode,
        # `after` is the whole row: a missing column is NULL.
        batch_step=lambda events: type_nulls_in_batch(events, changed_only=F.lit(False)),
        operations=LINDORM_OPERATIONS,
        sniff=lindorm_sniff,
        examples=("lindorm-debezium.jsonl",),
    )
)
