"""Qlik Replicate / Qlik Talend Data Integration JSON (``qlik-json``): atMSG envelope (DT + MD) or bare DT.

Spec: ``shared/formats/qlik.md``. Enveloped (1)::

    {"magic": "atMSG", "type": "DT"|"MD", "headers": null, "messageSchemaId", "messageSchema", "message": {..}}

Bare data messages (1, "un-wrapped") are the DT ``message`` alone: ``{"data", "beforeData", "headers": {..}}``.

**Metadata** (1, 2). An MD message defines one version of a table: its columns with Replicate types and ordinals,
its key (``primaryKeyPosition > 0``, in that order) and the Avro ``dataSchema``; DT messages reference it with
``messageSchemaId`` = the MD's ``message.schemaId``. Consumers must know the MD before decoding its DT messages:
the pipeline stores every MD message it reads, from any topic of the pipeline and any earlier batch or run
(``<lake>/_cdclake/metadata``), and decodes DT messages with all of them (:data:`FORMAT` ``metadata``). The plain
``decode`` (a format used without a pipeline) knows only the MD messages of its own batch. An MD message itself
becomes a DDL event (vendor op ``MD``) that declares the table's columns and key, so its table exists in the lake
with the right types even before the first row; it has no statement text (the definition is not SQL: it is kept in
the metadata table).

Choices where the spec leaves room (documented for users):

* **Which MD** a DT uses: the one whose schemaId is its ``messageSchemaId``; when that is null (bare messages, or the
  task sends no ids) or not known, the latest ``tableVersion`` known for the DT's schema and table (see *Table*).
* **With an MD**: types from the Replicate types (:func:`replicate_spark_type`): INT1/2/4/8 -> tinyint / smallint /
  int / bigint; UINT1/2/4 -> smallint / int / bigint; UINT8 -> decimal(20,0); NUMERIC(p,s) -> decimal(p,s) for
  1 <= p <= 38, else exact text; REAL4/8 -> float / double; STRING, WSTRING, CLOB, NCLOB -> string; BYTES, BLOB (hex
  digits) -> binary; DATE -> date; TIME -> its text (Spark has no time of day here); DATETIME -> timestamp_ntz (a
  source wall-clock time, no zone; up to 6 fraction digits, and DATETIME with a scale above 6 stays exact text);
  BOOLEAN -> boolean; other types -> exact text. A value that would lose digits (a NUMERIC with more digits than
  declared, a DATETIME with a non-zero 7th fraction digit, hex that is not hex) is a dead letter, never rounded.
  Keys are the MD's; mask bits map to MD ordinals. A DT column the MD does not declare is a dead letter (it belongs
  to another table version); an MD column missing from the DT counts as not captured.
* **Without a known MD** (its MD was never read, or arrives later): the message is still applied, as before MD
  messages were joined: every column is ``string`` holding the exact JSON value text (NUMERIC/UINT8 strings as they
  are, dates and times as Replicate's text, BYTES as Replicate's hex digits), except JSON booleans, which are
  ``boolean``; mask ordinals are the 1-based positions of the columns in ``data`` (Replicate writes them in table
  order); keys must be configured. Send MD messages first to get typed columns and keys.
* **Masks** (4): a column whose ``columnMask`` bit is 0 was not captured: it is left out of the images and the after
  image is partial, so the stored value is kept. Bit ``n`` of the mask is in byte ``n div 8`` (first two hex digits
  = ordinals 1-8), least significant bit first. A null mask (REFRESH) = all captured. ``changeMask`` is not needed
  to apply (``columnMask`` decides what is a real value).
* **Table**: ``message.schema``/``message.table`` when present, else the MD's lineage, else the Kafka key
  ``SCHEMA+TABLE``, else the format options ``database``/``table``, else no database and the topic as table; the
  Qlik schema is the canonical ``database``.
* **Position**: ``changeSequence`` (35 digits, string order). REFRESH rows have none: they get ``!`` + Kafka
  coordinates, which sorts before every change sequence (the full load precedes the changes captured after it).
* **Transactions**: a DT with ``transactionLastEvent`` true yields its row event and a TXN_END event (sub_index 1).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdclake import model
from cdclake.formats import register
from cdclake.formats.base import (
    DUPLICATE_KEY,
    MESSAGE_KEY,
    MESSAGE_VALUE,
    CdcFormat,
    FormatOptions,
    MetadataSupport,
    TableMetadata,
    collect_metadata,
    exact_text_image,
    finish,
    first_error,
    op_from_code,
    with_unique_keys,
)
from cdclake.model import Op
from cdclake.spark import local_frame

NAME: Final = "qlik-json"
MAGIC: Final = "atMSG"

_HEADERS: Final = """STRUCT<operation: STRING, changeSequence: STRING, timestamp: STRING, streamPosition: STRING,
    transactionId: STRING, changeMask: STRING, columnMask: STRING, transactionEventCounter: BIGINT,
    transactionLastEvent: BOOLEAN, externalSchemaId: STRING>"""
_LINEAGE: Final = """STRUCT<server: STRING, task: STRING, schema: STRING, table: STRING, tableVersion: BIGINT,
    timestamp: STRING>"""
RAW_SCHEMA: Final = f"""
    magic STRING, type STRING, messageSchemaId STRING,
    message STRUCT<
        data: MAP<STRING, VARIANT>, beforeData: MAP<STRING, VARIANT>, headers: {_HEADERS},
        schema: STRING, table: STRING, schemaId: STRING, lineage: {_LINEAGE}>,
    data MAP<STRING, VARIANT>, beforeData MAP<STRING, VARIANT>, headers {_HEADERS}, schema STRING, table STRING,
    _corrupt_record STRING
"""
_MD_ENVELOPE_SCHEMA: Final = f"magic STRING, type STRING, message STRUCT<schemaId: STRING, lineage: {_LINEAGE}>"

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

# ---------------------------------------------------------------------------------------------------------------
# MD messages on the driver (qlik.md 2): shared with qlik-avro.

_INTEGER_TYPES: Final = {
    "INT1": "tinyint",
    "INT2": "smallint",
    "INT4": "int",
    "INT8": "bigint",
    "UINT1": "smallint",
    "UINT2": "int",
    "UINT4": "bigint",
    "UINT8": "decimal(20,0)",
}
_TEXT_TYPES: Final = frozenset({"STRING", "WSTRING", "CLOB", "NCLOB"})
_MAX_TIMESTAMP_DIGITS: Final = 6


def replicate_spark_type(replicate_type: str, precision: int = 0, scale: int = 0) -> str:
    """The Spark type that holds every value of a Replicate type without loss (qlik.md 2 and 5)."""
    kind = replicate_type.upper()
    if kind in _INTEGER_TYPES:
        return _INTEGER_TYPES[kind]
    if kind == "NUMERIC":
        # Beyond 38 digits, or without a declared precision, only the exact text is lossless.
        return f"decimal({precision},{scale})" if 1 <= precision <= 38 and 0 <= scale <= precision else "string"
    if kind in ("REAL4", "REAL8"):
        return "float" if kind == "REAL4" else "double"
    if kind in ("BYTES", "BLOB"):
        return "binary"
    if kind == "DATE":
        return "date"
    if kind == "DATETIME":
        # A source wall-clock time (no zone). Spark keeps microseconds: finer DATETIME columns stay text.
        return "timestamp_ntz" if scale <= _MAX_TIMESTAMP_DIGITS else "string"
    if kind == "BOOLEAN":
        return "boolean"
    return "string"  # STRING, WSTRING, CLOB, NCLOB, TIME (no time-of-day type in canonical text), unknown types


def _vendor_type(kind: str, length: int, precision: int, scale: int) -> str:
    if kind == "NUMERIC":
        return f"NUMERIC({precision},{scale})"
    if kind in ("DATETIME", "TIME") and scale > 0:
        return f"{kind}({scale})"
    if (kind in _TEXT_TYPES or kind in ("BYTES", "BLOB")) and length > 0:
        return f"{kind}({length})"
    return kind


@dataclass(frozen=True)
class QlikColumn:
    """One column of an MD message's ``tableStructure.tableColumns``."""

    name: str
    ordinal: int
    replicate_type: str
    vendor_type: str
    spark_type: str
    key_position: int


@dataclass(frozen=True)
class QlikTable:
    """One MD message, parsed on the driver (qlik.md 2).

    Attributes:
        problem: why the definition cannot be used (its DDL event is then a dead letter), or None.
    """

    schema_id: str
    database: str | None
    table: str
    table_version: int
    columns: tuple[QlikColumn, ...]
    data_schema: str | None
    problem: str | None = None

    @property
    def key_columns(self) -> list[str]:
        """Columns with ``primaryKeyPosition > 0``, in key order."""
        return [c.name for c in sorted(self.columns, key=lambda c: c.key_position) if c.key_position > 0]

    def column(self, name: str) -> QlikColumn | None:
        return next((c for c in self.columns if c.name == name), None)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def parse_definition(metadata: TableMetadata) -> QlikTable:
    """An MD message's definition (the JSON text of its ``message``: schemaId, lineage, tableStructure, dataSchema)."""

    def broken(problem: str) -> QlikTable:
        return QlikTable(schema_id, metadata.database, metadata.table, metadata.table_version, (), None, problem)

    schema_id = metadata.schema_id.upper()  # DT messageSchemaId is compared upper-case too

    try:
        definition = json.loads(metadata.definition)
    except ValueError:
        return broken("MD message definition is not JSON")
    structure = definition.get("tableStructure") if isinstance(definition, dict) else None
    table_columns = structure.get("tableColumns") if isinstance(structure, dict) else None
    if not isinstance(table_columns, dict) or not table_columns:
        return broken("MD message without tableStructure.tableColumns")
    columns: list[QlikColumn] = []
    for name, spec in table_columns.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("ordinal"), int) or spec["ordinal"] < 1:
            return broken(f"MD column {name} without a positive ordinal")
        kind = str(spec.get("type") or "").upper()
        length, precision, scale = _int(spec.get("length")), _int(spec.get("precision")), _int(spec.get("scale"))
        columns.append(
            QlikColumn(
                name=name,
                ordinal=spec["ordinal"],
                replicate_type=kind,
                vendor_type=_vendor_type(kind, length, precision, scale),
                spark_type=replicate_spark_type(kind, precision, scale),
                key_position=_int(spec.get("primaryKeyPosition")),
            )
        )
    columns.sort(key=lambda c: (c.ordinal, c.name))
    if len({c.ordinal for c in columns}) < len(columns):
        return broken("MD columns share an ordinal")
    data_schema = definition.get("dataSchema")
    return QlikTable(
        schema_id=schema_id,
        database=metadata.database,
        table=metadata.table,
        table_version=metadata.table_version,
        columns=tuple(columns),
        data_schema=data_schema if isinstance(data_schema, str) else None,
    )


def parse_definitions(known: Iterable[TableMetadata], format_name: str) -> list[QlikTable]:
    """The known MD messages of ``format_name``, parsed."""
    return [parse_definition(m) for m in known if m.format == format_name]


def latest_versions(tables: Iterable[QlikTable]) -> dict[tuple[str | None, str], QlikTable]:
    """(schema, table) -> its usable MD with the highest ``tableVersion`` (qlik.md 1: DDL => new version)."""
    latest: dict[tuple[str | None, str], QlikTable] = {}
    for table in tables:
        if table.problem is not None:
            continue
        ident = (table.database, table.table)
        current = latest.get(ident)
        if current is None or (table.table_version, table.schema_id) > (current.table_version, current.schema_id):
            latest[ident] = table
    return latest


_MD_COLUMN: Final = "STRUCT<name: STRING, ordinal: INT, vendor_type: STRING, spark_type: STRING>"
_MD_FRAME_SCHEMA: Final = (
    f"id STRING, database STRING, `table` STRING, columns ARRAY<{_MD_COLUMN}>, keys ARRAY<STRING>, problem STRING, "
    "latest BOOLEAN"
)
MD_FIELDS: Final = ("id", "database", "table", "columns", "keys", "problem")
"""Fields of a metadata lookup (:func:`metadata_frame`), joined to messages as ``<prefix><field>``."""


def metadata_frame(spark: SparkSession, tables: Sequence[QlikTable]) -> DataFrame:
    """The MD messages as a small frame to broadcast-join to the messages (one row per schemaId)."""
    latest = {id(t) for t in latest_versions(tables).values()}
    rows = [
        (
            t.schema_id,
            t.database,
            t.table,
            [(c.name, c.ordinal, c.vendor_type, c.spark_type) for c in t.columns],
            t.key_columns,
            t.problem,
            id(t) in latest,
        )
        for t in tables
    ]
    return local_frame(spark, rows, _MD_FRAME_SCHEMA)


def join_metadata(
    messages: DataFrame, tables: Sequence[QlikTable], schema_id: Column, schema: Column, table: Column, prefix: str
) -> DataFrame:
    """``messages`` with the fields of their MD (``<prefix>id`` ... null when none is known): the MD whose schemaId
    is ``schema_id``, else the latest version of ``schema``.``table`` (qlik.md 1). ``table`` null: by id only."""
    if not tables:
        return messages.select(
            "*", *(F.lit(None).cast(t).alias(prefix + f) for f, t in zip(MD_FIELDS, _md_types(), strict=True))
        )
    frame = F.broadcast(metadata_frame(messages.sparkSession, tables))
    by_id = frame.select(*(F.col(f).alias(f"{prefix}id_{f}") for f in MD_FIELDS))
    by_name = frame.where(F.col("latest") & F.col("problem").isNull()).select(
        *(F.col(f).alias(f"{prefix}name_{f}") for f in MD_FIELDS)
    )
    lookup = {"sid": schema_id, "schema": schema, "table": table}
    joined = messages.select("*", *(column.alias(f"{prefix}lookup_{name}") for name, column in lookup.items()))
    joined = joined.join(by_id, F.col(f"{prefix}lookup_sid") == F.col(f"{prefix}id_id"), "left")
    joined = joined.join(
        by_name,
        F.col(f"{prefix}id_id").isNull()
        & F.col(f"{prefix}lookup_schema").eqNullSafe(F.col(f"{prefix}name_database"))
        & (F.col(f"{prefix}lookup_table") == F.col(f"{prefix}name_table")),
        "left",
    )
    found_by_id = F.col(f"{prefix}id_id").isNotNull()
    merged = [
        F.when(found_by_id, F.col(f"{prefix}id_{f}")).otherwise(F.col(f"{prefix}name_{f}")).alias(prefix + f)
        for f in MD_FIELDS
    ]
    helper = [c for c in joined.columns if c.startswith(prefix) and c not in messages.columns]
    return joined.select(*(F.col(c) for c in joined.columns if c not in helper), *merged)


def _md_types() -> list[str]:
    return ["string", "string", "string", f"array<{_MD_COLUMN}>", "array<string>", "string"]


# ---------------------------------------------------------------------------------------------------------------
# Values (qlik.md 5): Replicate text -> canonical text, shared with qlik-avro (Avro strings without logical types).

_HEX: Final = r"^([0-9A-Fa-f]{2})*$"
_DATETIME: Final = r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,6})(\d*))?$"


def _binary_value(text: Column) -> tuple[Column, Column]:
    """qlik.md 5: BYTES/BLOB travel as hex text; canonical binary text is base64."""
    return F.when(text.rlike(_HEX), F.base64(F.unhex(text))), text.rlike(_HEX)


def _datetime_value(text: Column) -> tuple[Column, Column]:
    is_datetime = text.rlike(_DATETIME)
    datetime_text = F.concat(
        F.regexp_extract(text, _DATETIME, 1),
        F.lit(" "),
        F.regexp_extract(text, _DATETIME, 2),
        F.when(F.regexp_extract(text, _DATETIME, 3) != "", F.concat(F.lit("."), F.regexp_extract(text, _DATETIME, 3))),
    )
    # qlik.md 5: DATETIME may carry 7 fraction digits; Spark would silently drop the 7th, so it must be 0.
    datetime_exact = F.regexp_extract(text, _DATETIME, 4).rlike("^0*$")
    return F.when(is_datetime, datetime_text).otherwise(text), ~is_datetime | datetime_exact


def canonical_value(text: Column, spark_type: Column) -> Column:
    """``STRUCT<text, ok>``: Replicate's text of a value (qlik.md 5) as canonical text of the data-dependent
    ``spark_type``; ``ok`` is false when the value cannot be held without loss (the message is a dead letter).

    Other types keep the text; the shared checks of ``finish`` validate it against the declared type.
    """
    binary_text, binary_ok = _binary_value(text)
    datetime_text, datetime_ok = _datetime_value(text)
    converted = (
        F.when(text.isNull(), text)
        .when(spark_type == "binary", binary_text)
        .when(spark_type == "timestamp_ntz", datetime_text)
        .otherwise(text)
    )
    ok = (
        F.when(text.isNull(), F.lit(True))
        .when(spark_type == "binary", binary_ok)
        .when(spark_type == "timestamp_ntz", datetime_ok)
        .when(spark_type.startswith("decimal("), model.decimal_text_fits(text, *model.decimal_parameters(spark_type)))
        .otherwise(F.lit(True))
    )
    return F.struct(converted.alias("text"), F.coalesce(ok, F.lit(False)).alias("ok"))


def replicate_value(text: Column, spark_type: str) -> tuple[Column, Column | None]:
    """:func:`canonical_value` for a ``spark_type`` known when the query is built (qlik-avro: one per data field):
    (canonical text, fits without loss, or None when every text fits). Only that type's rule is built, so a table's
    expressions stay small to build and to plan."""
    decimal = re.fullmatch(r"decimal\((\d+),(\d+)\)", spark_type)
    if spark_type == "binary":
        converted, ok = _binary_value(text)
    elif spark_type == "timestamp_ntz":
        converted, ok = _datetime_value(text)
    elif decimal is not None:
        converted, ok = text, model.decimal_text_fits(text, F.lit(int(decimal[1])), F.lit(int(decimal[2])))
    else:
        return text, None
    return converted, text.isNull() | F.coalesce(ok, F.lit(False))


def typed_image_entries(image: Column, columns: Column, mask: Column) -> Column:
    """Step 1 of typing a row image with its MD ``columns`` (qlik.md 4, 5): per MD column, whether it is kept and
    its canonical text. Materialise it as a column and finish with :func:`typed_image` (each step references its
    input many times; staged, Spark evaluates and plans the input once).

    ``image`` maps names to Replicate text; a column is kept when present and captured (its ``columnMask`` bit by
    MD ordinal, see :func:`mask_bit`; a null mask = all captured).
    """
    located = F.transform(
        columns,
        lambda c: F.struct(
            c["name"].alias("name"),
            c["vendor_type"].alias("vendor_type"),
            c["spark_type"].alias("spark_type"),
            (F.map_contains_key(image, c["name"]) & (mask.isNull() | mask_bit(mask, c["ordinal"]))).alias("kept"),
            image[c["name"]].alias("raw"),
        ),
    )
    return F.when(
        image.isNotNull(),
        F.transform(
            located,
            lambda e: F.struct(
                e["name"].alias("name"),
                e["vendor_type"].alias("vendor_type"),
                e["kept"].alias("kept"),
                e["raw"].alias("raw"),
                canonical_value(e["raw"], e["spark_type"]).alias("value"),
            ),
        ),
    )


def typed_image(entries: Column, image: Column, columns: Column) -> Column:
    """Step 2: ``STRUCT<image, partial, error>`` from the ``entries`` of :func:`typed_image_entries`.

    Columns the MD does not declare stay as they are (the shared checks report them). ``partial``: some MD column is
    missing or not captured. ``error``: the first value that cannot be held without loss.
    """
    names = columns["name"]
    kept = F.filter(entries, lambda e: e["kept"])
    typed = F.map_from_arrays(kept["name"], kept["value"]["text"])
    undeclared = F.map_filter(image, lambda k, _v: ~F.array_contains(names, k))
    bad = F.get(F.filter(entries, lambda e: e["kept"] & ~e["value"]["ok"]), 0)
    error = F.when(
        bad.isNotNull(),
        F.format_string(
            "value '%s' of column %s does not fit %s without loss",
            F.substring(bad["raw"], 1, 80),
            bad["name"],
            bad["vendor_type"],
        ),
    )
    return F.when(
        entries.isNotNull(),
        F.struct(
            F.map_concat(typed, undeclared).alias("image"),
            F.exists(entries, lambda e: ~e["kept"]).alias("partial"),
            error.alias("error"),
        ),
    )


# ---------------------------------------------------------------------------------------------------------------
# Shared header helpers


def mask_bit(mask: Column, ordinal: Column) -> Column:
    """qlik.md 4: whether the bit of 1-based ``ordinal`` is set in the hex ``mask`` (first byte = ordinals 1-8,
    least significant bit first). Bits beyond the mask's length are 0."""
    index = ordinal - 1
    # try_cast: a mask that is not hex is the message's error, but its images are still built; conv reads "-1" as
    # 2^64 - 1, whose cast to int failed the whole batch (ANSI mode).
    byte = F.conv(F.substring(mask, (F.floor(index / 8) * 2 + 1).cast("int"), 2), 16, 10).try_cast("int")
    return F.coalesce(F.getbit(byte, (index % 8).cast("int")) == 1, F.lit(False))


def _captured(image: Column, mask: Column) -> Column:
    """Without an MD: the image without the columns whose columnMask bit is 0 (ordinal = position in ``data``)."""
    # One pass over the entries by position: a lookup of each key in a kept-names array built outside the lambda
    # would rebuild that array for every entry (Spark evaluates it inside the lambda).
    return F.map_from_entries(F.filter(F.map_entries(image), lambda _e, i: mask.isNull() | mask_bit(mask, i + 1)))


def _spark_type_of(value: Column) -> Column:
    """Without an MD: the Spark type inferable from the message alone: JSON booleans, else exact text."""
    return F.when(F.schema_of_variant(value) == "BOOLEAN", F.lit("boolean")).otherwise(F.lit("string"))


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


def md_problem(prefix: str) -> Column:
    """Why an MD message's own DDL event is a dead letter (after :func:`join_metadata` by its schemaId), or null."""
    return F.when(F.col(prefix + "id").isNull(), F.lit("MD message without a usable definition")).otherwise(
        F.col(prefix + "problem")
    )


def md_position() -> Column:
    """Where an MD message was read: ``topic/partition/offset`` (provenance in the metadata store)."""
    return F.format_string("%s/%d/%d", F.col("topic"), F.col("partition"), F.col("offset"))


# ---------------------------------------------------------------------------------------------------------------
# qlik-json


def extract_metadata(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """The MD messages of a batch as metadata rows (``base.METADATA_SCHEMA``); the definition is the JSON text of
    the MD ``message`` (schemaId, lineage, tableStructure, dataSchema)."""
    text = F.col(MESSAGE_VALUE).cast("string")
    # Cheap pre-filter before parsing: an MD message spells "type": "MD" (a JSON writer escaping plain letters
    # would only cost typed columns: the MD still becomes a DDL event, its DT messages fall back to text).
    candidates = messages.where(text.contains('"MD"'))
    m = F.col("_m")
    parsed = candidates.select("*", F.from_json(text, _MD_ENVELOPE_SCHEMA).alias("_m")).where(
        (m["magic"] == MAGIC) & (m["type"] == "MD")
    )
    lineage = m["message"]["lineage"]
    return parsed.select(
        F.lit(NAME).alias("format"),
        F.upper(m["message"]["schemaId"]).alias("schema_id"),
        lineage["schema"].alias("database"),
        F.lit(None).cast("string").alias("schema"),
        lineage["table"].alias("table"),
        F.coalesce(lineage["tableVersion"], F.lit(0)).alias("table_version"),
        F.get_json_object(text, "$.message").alias("definition"),
        md_position().alias("position"),
    )


def decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """Qlik JSON messages -> canonical events, with the MD messages of the same batch (see the module doc)."""
    return decode_with_metadata(messages, options, collect_metadata(extract_metadata(messages, options)))


def _stage(frame: DataFrame, **columns: Column) -> DataFrame:
    """Adds named columns. Later expressions refer to them by name instead of repeating their expression trees,
    which keeps planning fast (the row images are referenced by many checks)."""
    return frame.select("*", *(column.alias(name) for name, column in columns.items()))


def decode_with_metadata(messages: DataFrame, options: FormatOptions, known: Sequence[TableMetadata]) -> DataFrame:
    """Qlik JSON messages -> canonical events (one per message, two for a transaction's last event), the DT messages
    typed and keyed by their MD message among ``known``."""
    msg = F.from_json(F.col(MESSAGE_VALUE).cast("string"), RAW_SCHEMA, {"columnNameOfCorruptRecord": "_corrupt_record"})
    m = F.col("_m")
    inner = m["message"]
    enveloped = m["magic"].isNotNull() | m["type"].isNotNull()
    is_md = F.col("_is_md")
    headers = F.col("_headers")
    data, before_data = F.col("_data"), F.col("_before_data")
    # Table identity from the message itself (see the module doc); the MD's lineage comes between.
    key_text = F.col(MESSAGE_KEY).cast("string")
    key_parts = F.split(key_text, r"\+")
    key_ok = key_text.isNotNull() & (F.size(key_parts) == 2)
    fallback_db = F.lit(options["database"]) if options.get("database") else F.lit(None).cast("string")
    fallback_table = F.lit(options["table"]) if options.get("table") else F.col("topic")
    msg_table = F.col("_msg_table")
    parsed = with_unique_keys(messages, msg, "_m")
    parsed = _stage(
        parsed,
        _enveloped=enveloped,
        _is_md=enveloped & (m["type"] == "MD"),
        # qlik.md 1: enveloped DT -> `message`; un-wrapped -> the DT message at top level.
        _data=F.when(enveloped, inner["data"]).otherwise(m["data"]),
        _before_data=F.when(enveloped, inner["beforeData"]).otherwise(m["beforeData"]),
        _headers=F.when(enveloped, inner["headers"]).otherwise(m["headers"]),
        _msg_schema=F.when(enveloped, inner["schema"]).otherwise(m["schema"]),
        _msg_table=F.when(enveloped, inner["table"]).otherwise(m["table"]),
    )
    named_db = F.when(msg_table.isNotNull(), F.col("_msg_schema")).when(key_ok, F.get(key_parts, 0))
    named_table = F.when(msg_table.isNotNull(), msg_table).when(key_ok, F.get(key_parts, 1))
    parsed = _stage(
        parsed,
        _named_db=named_db.otherwise(fallback_db),
        _named_table=named_table.otherwise(fallback_table),
        _vendor_op=F.when(is_md, F.lit("MD")).otherwise(headers["operation"]),
    )
    parsed = join_metadata(
        parsed,
        parse_definitions(known, NAME),
        F.upper(F.when(is_md, inner["schemaId"]).when(F.col("_enveloped"), m["messageSchemaId"])),
        F.when(~is_md, F.col("_named_db")),
        F.when(~is_md, F.col("_named_table")),
        "_q_",
    )
    md_found = F.col("_q_id").isNotNull() & F.col("_q_problem").isNull()
    md_columns = F.col("_q_columns")
    vendor_op = F.col("_vendor_op")
    op = op_from_code(vendor_op, {**_ROW_OPERATIONS, "MD": Op.DDL})
    is_delete = F.col("_op") == Op.DELETE.value
    # qlik.md 3: DELETE row in `data` (Replicate) or in `beforeData` (some producers): data ?? beforeData.
    row_image = F.col("_row_image")
    parsed = _stage(parsed, _op=op, _md_found=md_found, _mask=headers["columnMask"])
    parsed = _stage(parsed, _row_image=F.when(is_delete, F.coalesce(data, before_data)).otherwise(data))
    parsed = _stage(
        parsed,
        _after_raw=F.when(~is_delete, row_image),
        _before_raw=F.when(is_delete, row_image).otherwise(before_data),
    )
    after_raw, before_raw, mask = F.col("_after_raw"), F.col("_before_raw"), F.col("_mask")
    parsed = _stage(parsed, _after_text=exact_text_image(after_raw), _before_text=exact_text_image(before_raw))
    # With an MD: typed by Replicate type, masks by ordinal. Without: exact text, masks by position in `data`.
    parsed = _stage(
        parsed,
        _after_entries=F.when(md_found, typed_image_entries(F.col("_after_text"), md_columns, mask)),
        _before_entries=F.when(md_found, typed_image_entries(F.col("_before_text"), md_columns, mask)),
        _after_untyped=exact_text_image(_captured(after_raw, mask)),
        _before_untyped=exact_text_image(_captured(before_raw, mask)),
    )
    parsed = _stage(
        parsed,
        _after_typed=typed_image(F.col("_after_entries"), F.col("_after_text"), md_columns),
        _before_typed=typed_image(F.col("_before_entries"), F.col("_before_text"), md_columns),
    )
    after_typed, before_typed = F.col("_after_typed"), F.col("_before_typed")
    md = F.col("_md_found")
    after = F.when(md, after_typed["image"]).otherwise(F.col("_after_untyped"))
    before = F.when(md, before_typed["image"]).otherwise(F.col("_before_untyped"))
    after_partial = F.when(md, after_typed["partial"]).otherwise(
        F.size(F.map_keys(after_raw)) > F.size(F.map_keys(F.col("_after_untyped")))
    )
    all_columns = F.coalesce(row_image, before_data)
    text_columns = F.transform(
        F.map_entries(all_columns),
        lambda e: F.struct(
            e["key"].alias("name"),
            F.lit("json").alias("vendor_type"),
            _spark_type_of(F.coalesce(e["value"], before_data[e["key"]], data[e["key"]])).alias("spark_type"),
        ),
    )
    declared = F.transform(
        md_columns,
        lambda c: F.struct(
            c["name"].alias("name"), c["vendor_type"].alias("vendor_type"), c["spark_type"].alias("spark_type")
        ),
    )
    columns = F.when(md, declared).otherwise(text_columns)
    key_columns = F.when(md, F.col("_q_keys")).otherwise(F.array().cast("array<string>"))
    database = (
        F.when(is_md, inner["lineage"]["schema"])
        .when(msg_table.isNotNull(), F.col("_msg_schema"))
        .when(md, F.col("_q_database"))
        .otherwise(F.col("_named_db"))
    )
    table = (
        F.when(is_md, inner["lineage"]["table"])
        .when(msg_table.isNotNull(), msg_table)
        .when(md, F.col("_q_table"))
        .otherwise(F.col("_named_table"))
    )
    op = F.col("_op")
    txn_id = F.when(headers["transactionId"] != "", headers["transactionId"])
    is_row = op.isin(*(o.value for o in model.ROW_OPS))
    position, event_time, header_checks = position_and_time(headers, op, is_row)
    last_event = F.coalesce(is_row & headers["transactionLastEvent"], F.lit(False))
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
        F.when((is_md | is_row) & ~txn_end, columns).alias(model.COLUMNS),
        F.when((is_md | is_row) & ~txn_end, key_columns).alias(model.KEY_COLUMNS),
        F.when(is_row & ~txn_end, before).alias(model.BEFORE),
        F.when(is_row & ~txn_end, after).alias(model.AFTER),
        (is_row & ~txn_end & F.coalesce(after_partial, F.lit(False))).alias(model.AFTER_IS_PARTIAL),
        position.alias(model.POSITION),
        event_time.alias(model.EVENT_TIME),
        txn_id.alias(model.TXN_ID),
        # An MD definition is not a SQL statement: it is kept in the metadata table, not as the event's DDL text.
        F.lit(None).cast("string").alias(model.DDL),
        F.col("_sub").alias(model.SUB_INDEX),
    )
    hex_mask = r"^([0-9A-Fa-f]{2})*$"
    error = first_error(
        (F.col(MESSAGE_VALUE).isNull(), "empty message (null Kafka value)"),
        (F.col(DUPLICATE_KEY).isNotNull(), F.col(DUPLICATE_KEY)),
        (m.isNull() | m["_corrupt_record"].isNotNull(), "malformed JSON"),
        (
            F.col("_enveloped") & (F.coalesce(m["magic"], F.lit("")) != MAGIC),
            F.format_string("magic '%s' is not atMSG", m["magic"]),
        ),
        (
            F.col("_enveloped") & ~F.coalesce(m["type"].isin("DT", "MD"), F.lit(False)),
            F.format_string("unknown message type '%s'", m["type"]),
        ),
        (is_md & inner["lineage"]["table"].isNull(), "MD message without lineage.table"),
        (is_md & inner["schemaId"].isNull(), "MD message without schemaId"),
        (is_md & md_problem("_q_").isNotNull(), md_problem("_q_")),
        (~is_md & headers.isNull(), "data message without headers: not a Qlik message"),
        (~is_md & vendor_op.isNull(), "data message without headers.operation"),
        (op.isNull(), F.format_string("unknown Qlik operation '%s'", vendor_op)),
        (is_row & ~is_delete & data.isNull(), F.format_string("%s without data", vendor_op)),
        (is_delete & row_image.isNull(), "DELETE without data or beforeData"),
        (mask.isNotNull() & ~mask.rlike(hex_mask), F.format_string("columnMask '%s' is not hex bytes", mask)),
        (
            headers["changeMask"].isNotNull() & ~headers["changeMask"].rlike(hex_mask),
            F.format_string("changeMask '%s' is not hex bytes", headers["changeMask"]),
        ),
        (
            # Like the shared value checks: the row event is the dead letter, its transaction end is not.
            is_row & md & ~txn_end & F.coalesce(after_typed["error"], before_typed["error"]).isNotNull(),
            F.coalesce(after_typed["error"], before_typed["error"]),
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
            "database": "database (Qlik schema) when neither the message, its MD nor the Kafka key names it "
            "(default: none)",
            "table": "table when neither the message, its MD nor the Kafka key names it (default: the topic)",
        },
        sniff=sniff,
        examples=("qlik-json.jsonl",),
        metadata=MetadataSupport(extract=extract_metadata, decode=decode_with_metadata, plan_from_definitions=True),
    )
)
