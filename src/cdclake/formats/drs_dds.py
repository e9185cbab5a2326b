"""Huawei Cloud DRS JSON for DDS / MongoDB sources (``drs-json-dds``).

Spec: ``shared/formats/drs.md`` section 5. One JSON message per oplog entry::

    {"id", "op": INSERT|UPDATE|DELETE|DDL, "dbType": "MongoDB", "db", "coll", "value": "<Mongo-shell text>",
     "where": "<Mongo-shell text>" | null, "recordType": insert|update|replace|doc, "extra", "es", "ts",
     "clusterTime": "<epochSeconds>:<increment>"}

How documents land in tables (the spec leaves this to us):

* Each top-level field of a document is a ``string`` column; the value is its text: strings as they are, numbers
  exactly, booleans ``true``/``false``, sub-documents and arrays as JSON text. ``_id`` is the key column.
* ``value``/``where`` are Mongo-shell text, not JSON (5): shell constructors are rewritten to JSON first, with
  Spark regular expressions: ``ObjectId("h")`` -> ``"h"`` (so ``_id`` is the hex string), ``ISODate("t")`` ->
  ``"t"``, ``UUID("u")`` -> ``"u"``, ``NumberLong(n)`` / ``NumberInt(n)`` -> the number, ``NumberDecimal("d")`` ->
  the string ``"d"`` (its exact text: ``1.10``, ``1.234567890123456789012345678901234E+40``, ``NaN``),
  ``BinData(t, "b")`` -> ``{"$binary": "b", "$type": "t"}``, ``Timestamp(t, i)`` -> ``{"$timestamp": {"t", "i"}}``,
  ``Date(ms)`` -> the epoch milliseconds; each may be preceded by ``new`` (the MongoDB Java driver's shell mode
  writes ``new BinData(...)`` and, beyond year 9999, ``new Date(ms)``).
  Only a constructor in a value's place is rewritten (after ``:``, ``[`` or ``,``; before ``,``, ``}``, ``]`` or
  the end), so a string value that mentions one keeps its text, unless the string itself puts it in such a place
  (see the comment on ``SHELL_REWRITES``).
* insert -> INSERT of the full document; UPDATE + ``replace`` -> UPDATE with the full replacement document
  (fields it lacks become NULL); UPDATE + ``update`` -> UPDATE with a partial image: ``$set`` fields get their
  new values, ``$unset`` fields are set to NULL, every other field keeps its stored value. Any other update
  operator (``$inc``, ``$push``, MongoDB 5 ``diff``...) or a ``$set`` of a nested path (``a.b``) cannot be applied
  without the stored document: a dead letter. DELETE -> by ``_id`` from ``value`` (or ``where``).
* Position: ``clusterTime`` seconds and increment, then ``id`` as tiebreak.
"""

from __future__ import annotations

from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdclake import model
from cdclake.formats import register
from cdclake.formats.base import (
    MESSAGE_VALUE,
    CdcFormat,
    FormatOptions,
    epoch_timestamp,
    exact_text_image,
    finish,
    first_error,
    op_from_code,
)
from cdclake.model import Op

NAME: Final = "drs-json-dds"

RAW_SCHEMA: Final = """
    id STRING, op STRING, dbType STRING, db STRING, coll STRING, value STRING, `where` STRING,
    recordType STRING, extra STRING, es BIGINT, ts BIGINT, clusterTime STRING, _corrupt_record STRING
"""

OPERATIONS: Final = {"INSERT": Op.INSERT, "UPDATE": Op.UPDATE, "DELETE": Op.DELETE, "DDL": Op.DDL}
RECORD_TYPES: Final = ("insert", "update", "replace", "doc")
KEY: Final = "_id"
VENDOR_TYPE: Final = "mongo"

# drs.md 5 "Parsing": Mongo-shell constructors -> JSON (Java regex, Java replacement syntax). The MongoDB Java
# driver's shell mode (JsonMode.SHELL, the `{"_id": ObjectId(...), ...}` layout of the drs.md samples) writes some
# constructors with `new`: `new BinData(0, "...")` and, for dates outside years 0-9999, `new Date(<epoch ms>)`.
# * Only constructors in a value's place are rewritten: after `:`, `[` or `,` (and white space), before `,`, `}`, `]`
#   or the end. So a string value whose text holds one (`"retry after Date(1700000000)"`) keeps it, unless the
#   string itself puts it in such a place (`"a: Date(5), b"`: a regular expression cannot tell a string's inside
#   from a document's); the constructors whose argument is quoted cannot match inside a string (its quotes are
#   escaped there).
# * Every pattern starts with its literal name, so that Java scans for it (Boyer-Moore) instead of trying a pattern
#   at every character; what must precede the name is a look-behind after it, and `new` goes in a pass of its own,
#   only where a whole constructor follows. Measured on the DRS DDS benchmark's documents (80,000, 2 cores, warm):
#   1.4-1.8 s with `(?:\bnew\s+)?` in front of each pattern, 0.4-0.6 s like this.
_VALUE_BEFORE: Final = r"[:\[,]\s{0,100}"
_VALUE_AFTER: Final = r"(?=\s*+(?:[,}\]]|\z))"
# (name, arguments, replacement)
_CONSTRUCTORS: Final = (
    ("ObjectId", r'\s*"([0-9A-Fa-f]*)"\s*', '"$1"'),
    ("ISODate", r'\s*"([^"]*)"\s*', '"$1"'),
    ("Date", r"\s*(-?\d+)\s*", "$1"),
    ("UUID", r'\s*"([^"]*)"\s*', '"$1"'),
    ("NumberLong", r'\s*"?(-?\d+)"?\s*', "$1"),
    ("NumberInt", r'\s*"?(-?\d+)"?\s*', "$1"),
    # A string, not a number: Decimal128 holds 34 digits at any exponent (and NaN, Infinity), and a JSON number
    # beyond 38 digits would pass through a double (1.234567890123456789012345678901234E+40 kept 17 digits).
    ("NumberDecimal", r'\s*"(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|[+-]?(?:NaN|Infinity))"\s*', '"$1"'),
    ("BinData", r'\s*(\d+)\s*,\s*"([^"]*)"\s*', '{"\\$binary":"$2","\\$type":"$1"}'),
    ("Timestamp", r"\s*(\d+)\s*,\s*(\d+)\s*", '{"\\$timestamp":{"t":$1,"i":$2}}'),
)
_NEW_BEFORE_CONSTRUCTOR: Final = (
    rf"new(?<={_VALUE_BEFORE}new)\s+(?=(?:"
    + "|".join(rf"{name}\({arguments}\)" for name, arguments, _ in _CONSTRUCTORS)
    + rf"){_VALUE_AFTER})"
)
SHELL_REWRITES: Final = (
    (_NEW_BEFORE_CONSTRUCTOR, ""),
    *(
        (rf"{name}(?<={_VALUE_BEFORE}{name})\({arguments}\){_VALUE_AFTER}", replacement)
        for name, arguments, replacement in _CONSTRUCTORS
    ),
)
DOCUMENT: Final = "MAP<STRING, VARIANT>"


def shell_to_json(text: Column) -> Column:
    """Mongo-shell document text -> JSON text (see the module doc and the comment on ``SHELL_REWRITES``)."""
    for pattern, replacement in SHELL_REWRITES:
        text = F.regexp_replace(text, pattern, replacement)
    return text


def _document(text: Column) -> Column:
    """JSON text -> ``MAP<STRING, STRING>`` of exact value texts; null when not a JSON object."""
    return exact_text_image(F.from_json(text, DOCUMENT))


def _position(cluster_time: Column, record_id: Column) -> Column:
    """drs.md 5: clusterTime ``<epochSeconds>:<increment>`` compared as a pair, then ``id``."""
    pattern = r"^(\d+):(\d+)$"
    seconds = model.sortable_decimal(F.regexp_extract(cluster_time, pattern, 1), 12)
    increment = model.sortable_decimal(F.regexp_extract(cluster_time, pattern, 2), 10)
    tiebreak = F.coalesce(model.sortable_decimal(record_id, 20), F.lit(""))
    return F.when(cluster_time.rlike(pattern), F.concat(seconds, F.lit(":"), increment, F.lit("#"), tiebreak))


def decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """DRS DDS JSON messages -> canonical events (one per message)."""
    del options  # the format has none
    msg = F.from_json(F.col(MESSAGE_VALUE).cast("string"), RAW_SCHEMA, {"columnNameOfCorruptRecord": "_corrupt_record"})
    parsed = messages.withColumn("_m", msg)
    m = F.col("_m")
    vendor_op, record_type = m["op"], m["recordType"]
    op = op_from_code(vendor_op, OPERATIONS)
    # Staged as columns, step by step: the shell rewrites (nine regular expressions) and the JSON parses feed
    # several expressions each, some of them inside lambdas, where Spark would evaluate them again per element.
    parsed = parsed.select(
        "*",
        op.alias("_op"),
        shell_to_json(m["value"]).alias("_value_json"),
        shell_to_json(m["where"]).alias("_where_json"),
    )
    op, value_json, where_json = F.col("_op"), F.col("_value_json"), F.col("_where_json")
    is_partial = (op == Op.UPDATE.value) & (record_type == "update")
    # $set and $unset are read for partial updates only (every use below is under is_partial).
    parsed = parsed.select(
        "*",
        F.from_json(value_json, DOCUMENT).alias("_operators"),
        _document(where_json).alias("_where_doc"),
        F.when(is_partial, F.from_json(value_json, "STRUCT<`$unset`: MAP<STRING, VARIANT>>")["$unset"]).alias(
            "_unsets"
        ),
    )
    operators, where_doc, unsets = F.col("_operators"), F.col("_where_doc"), F.col("_unsets")
    value_doc = exact_text_image(operators)  # = _document(value_json)
    sets = F.when(is_partial, _document(F.to_json(operators["$set"])))
    empty_map = F.create_map().cast("map<string,string>")
    parsed = parsed.select(
        "*",
        value_doc.alias("_value_doc"),
        sets.alias("_sets"),
        F.map_filter(F.coalesce(sets, empty_map), lambda k, _v: k != KEY).alias("_sets_kept"),
    )
    value_doc, sets, sets_kept = F.col("_value_doc"), F.col("_sets"), F.col("_sets_kept")
    unset_nulls = F.transform_values(unsets, lambda _k, _v: F.lit(None).cast("string"))
    identity = F.coalesce(where_doc, value_doc)
    id_only = F.map_filter(identity, lambda k, _v: k == KEY)
    # map_concat fails on duplicate keys: $set wins over $unset of the same field, _id comes from where only.
    unsets_kept = F.map_filter(
        F.coalesce(unset_nulls, empty_map), lambda k, _v: (k != KEY) & ~F.map_contains_key(sets_kept, k)
    )
    updated = F.map_concat(id_only, unsets_kept, sets_kept)
    after = (
        F.when(op == Op.INSERT.value, value_doc)
        .when(is_partial, updated)
        .when(op == Op.UPDATE.value, F.map_concat(F.map_filter(value_doc, lambda k, _v: k != KEY), id_only))
    )
    before = F.when(op.isin(Op.UPDATE.value, Op.DELETE.value), F.map_filter(identity, lambda k, _v: k == KEY))
    names = F.array_distinct(
        F.concat(
            F.coalesce(F.map_keys(after), F.array().cast("array<string>")),
            F.coalesce(F.map_keys(before), F.array().cast("array<string>")),
        )
    )
    columns = F.transform(
        names,
        lambda n: F.struct(
            n.alias("name"), F.lit(VENDOR_TYPE).alias("vendor_type"), F.lit("string").alias("spark_type")
        ),
    )
    is_row = op.isin(Op.INSERT.value, Op.UPDATE.value, Op.DELETE.value)
    position = _position(m["clusterTime"], m["id"])
    decoded = parsed.select(
        "*",
        op.alias(model.OP),
        F.when(vendor_op.isNotNull(), F.concat_ws("/", vendor_op, record_type)).alias(model.VENDOR_OP),
        m["dbType"].alias(model.DB_TYPE),
        m["db"].alias(model.DATABASE),
        m["coll"].alias(model.TABLE),
        F.when(is_row, F.array(F.lit(KEY))).alias(model.KEY_COLUMNS),
        F.when(is_row, before).alias(model.BEFORE),
        F.when(is_row, after).alias(model.AFTER),
        F.coalesce(is_partial, F.lit(False)).alias(model.AFTER_IS_PARTIAL),
        F.when(is_row, columns).alias(model.COLUMNS),
        position.alias(model.POSITION),
        epoch_timestamp(m["es"], "ms").alias(model.EVENT_TIME),
        F.when(op == Op.DDL.value, m["value"]).alias(model.DDL),
    )
    operator_names = F.coalesce(F.map_keys(operators), F.array().cast("array<string>"))
    other_operators = F.filter(operator_names, lambda k: ~k.isin("$set", "$unset"))
    changed = F.concat(
        F.coalesce(F.map_keys(sets), F.array().cast("array<string>")),
        F.coalesce(F.map_keys(unsets), F.array().cast("array<string>")),
    )
    nested = F.filter(changed, lambda k: k.contains("."))
    error = first_error(
        (F.col(MESSAGE_VALUE).isNull(), "empty message (null Kafka value)"),
        (m.isNull() | m["_corrupt_record"].isNotNull(), "malformed JSON"),
        (vendor_op.isNull(), "missing op: not a DRS DDS message"),
        (op.isNull(), F.format_string("unknown DRS DDS op '%s'", vendor_op)),
        (
            is_row & ~F.coalesce(record_type.isin(*RECORD_TYPES), F.lit(False)),
            F.format_string("unknown recordType '%s'", record_type),
        ),
        (op.isin(Op.INSERT.value, Op.UPDATE.value) & m["value"].isNull(), "insert or update without value"),
        (
            is_row & m["value"].isNotNull() & value_doc.isNull(),
            F.format_string(
                "value is not a document after rewriting shell syntax: %s", F.substring(m["value"], 1, 120)
            ),
        ),
        (
            is_row & m["where"].isNotNull() & where_doc.isNull(),
            F.format_string(
                "where is not a document after rewriting shell syntax: %s", F.substring(m["where"], 1, 120)
            ),
        ),
        (is_row & ~F.map_contains_key(F.coalesce(identity, empty_map), KEY), "no _id in value or where"),
        (is_row & F.coalesce(identity[KEY], F.lit("")).eqNullSafe(""), "_id is null or empty"),
        (
            is_partial & (F.size(other_operators) > 0),
            F.format_string(
                "update operator %s cannot be applied without the stored document", F.get(other_operators, 0)
            ),
        ),
        (is_partial & (F.size(changed) == 0), "update without $set or $unset"),
        (
            is_partial & (F.size(nested) > 0),
            F.format_string("update of nested path '%s' is not supported (top-level fields only)", F.get(nested, 0)),
        ),
        (
            is_partial & F.array_contains(changed, F.lit(KEY)),
            "update that sets or unsets _id",
        ),
        (
            m["clusterTime"].isNotNull() & position.isNull(),
            F.format_string("clusterTime '%s' is not seconds:increment", m["clusterTime"]),
        ),
    )
    return finish(decoded, NAME, error)


def sniff(message: Any) -> bool:
    """README "Recognition": ``coll`` + ``recordType`` + ``clusterTime`` -> DRS DDS."""
    return isinstance(message, dict) and {"coll", "recordType", "clusterTime"} <= message.keys()


FORMAT: Final = register(
    CdcFormat(
        name=NAME,
        description="Huawei Cloud DRS JSON for DDS/MongoDB (Mongo-shell documents; $set/$unset partial updates)",
        decode=decode,
        operations=OPERATIONS,
        sniff=sniff,
        examples=("drs-json-dds.jsonl",),
    )
)
