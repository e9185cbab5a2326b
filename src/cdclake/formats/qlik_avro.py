"""Qlik Replicate Avro without a schema registry (``qlik-avro``).

Spec: ``shared/formats/qlik.md`` sections 1 ("Avro"), 2-5. Value = Avro binary of ``MessageEnvelope`` (``magic``
fixed(5) ``atMSG``, ``type``, ``headers``, ``messageSchemaId``, ``messageSchema``, ``message`` bytes).

* **MD messages**: ``message`` is the metadata record, written with the Avro schema in the envelope's own
  ``messageSchema``. It is decoded with that schema (one Spark ``from_avro`` per distinct schema text of the batch)
  and read like a qlik-json MD message (``schemaId``, ``lineage``, ``tableStructure``, ``dataSchema``): it becomes a
  DDL event (no statement text) declaring the table's key and columns (typed as its data messages decode, below),
  and the pipeline stores it (``<lake>/_cdclake/metadata``, see :mod:`cdclake.formats.qlik`) so that DT messages
  of later batches and runs can be decoded.
* **DT messages**: ``message`` is the data record, written with the ``dataSchema`` of the MD message whose schemaId
  is the envelope's ``messageSchemaId`` (qlik.md 1: consumers must cache MD messages first). ``from_avro`` needs
  the schema when the query is planned: the distinct ids of the batch (with the MD envelopes' schema texts, one
  small job) are collected on the driver, and each message runs the ``from_avro`` of its own id (all ids in one pass;
  see ``_dt_events``); later batches naming the same schemas reuse the plan (``formats._plans``). A DT whose schema
  is unknown is a dead letter naming its ``messageSchemaId`` (its MD was never read; replay it after the MD). With a
  null ``messageSchemaId``: the latest MD of the table named by the options ``database``/``table``.
* **Overrides** (format options, they win over MD messages): ``data_schemas`` = a JSON object
  ``{"<schemaId>": "<dataSchema JSON text>", ...}``, ``data_schema`` = one dataSchema for every DT message.

Values (5, logical types on or off): ``int``/``long`` -> ``bigint``; ``float``/``double`` -> ``double``;
``boolean``; ``string``; ``bytes`` -> ``binary``; ``decimal(p,s)`` bytes -> ``decimal(p,s)``; ``date`` ->
``date``; ``timestamp-micros``/``timestamp-millis`` -> ``timestamp`` (an Avro instant); ``time-millis``/
``time-micros`` -> ``HH:mm:ss.fff[fff]`` text; any other type -> its JSON text. Without logical types Replicate
writes NUMERIC, UINT8, DATE and DATETIME as Avro strings: with the MD known they get the MD's Replicate type like
qlik-json (decimal, date, timestamp_ntz...). Keys are the MD's ``primaryKeyPosition`` columns (configure keys for
data messages decoded with an override schema and no MD). Masks are ``bytes`` here (4): same bit layout as the
JSON hex text, ordinals from the MD (else the position in the data record). Table: the MD's lineage, else the
options ``database`` (default: none) and ``table`` (default: the topic). Position, transactions and REFRESH
handling are those of ``qlik-json`` (see its module doc).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from cdclake import model
from cdclake.formats import _plans, register
from cdclake.formats.base import (
    MESSAGE_COLUMNS,
    MESSAGE_HEADERS,
    MESSAGE_VALUE,
    CdcFormat,
    FormatOptions,
    MetadataSupport,
    TableMetadata,
    collect_metadata,
    finish,
    first_error,
    op_from_code,
)
from cdclake.formats.qlik import (
    MAGIC,
    OPERATIONS,
    QlikColumn,
    QlikTable,
    join_metadata,
    latest_versions,
    mask_bit,
    md_position,
    md_problem,
    parse_definitions,
    position_and_time,
    replicate_value,
)
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

MD_PREFIX: Final = MAGIC.encode() + b"\x04MD"
"""First bytes of every MD envelope: the fixed magic, then the Avro string ``MD`` (zig-zag length 2 = 0x04)."""
DT_PREFIX: Final = MAGIC.encode() + b"\x04DT"
"""First bytes of every DT envelope."""

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


Converter = Callable[[Column], Column]


def _converter(avro_type: Any) -> tuple[str, Converter]:
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
    fields = schema.get("fields") if isinstance(schema, dict) else None
    by_name = {f.get("name"): f for f in fields if isinstance(f, dict)} if isinstance(fields, list) else {}
    if "data" not in by_name or "headers" not in by_name:
        raise ValueError("a Qlik dataSchema needs the record fields 'data' and 'headers'")
    data, headers = _branch(by_name["data"].get("type")), _branch(by_name["headers"].get("type"))
    if not isinstance(data, dict) or not isinstance(headers, dict) or "fields" not in data or "fields" not in headers:
        raise ValueError("the fields 'data' and 'headers' of a Qlik dataSchema must be records")
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


def _check_options(options: FormatOptions) -> None:
    """ValueError unless ``data_schemas`` is a JSON object of Avro schemas and ``data_schema`` an Avro schema."""
    if options.get("data_schemas"):
        try:
            by_id = json.loads(options["data_schemas"])
        except ValueError:
            by_id = None
        if not isinstance(by_id, dict):
            raise ValueError('data_schemas is not a JSON object {"<schemaId>": <dataSchema>, ...}')
    for schema_id, text in _schemas(options).items():
        try:
            schema = json.loads(text)
        except ValueError:
            schema = None
        if not isinstance(schema, dict) or schema.get("type") != "record":
            which = "data_schema" if schema_id == "*" else f"the data_schemas entry {schema_id}"
            raise ValueError(f'{which} is not an Avro record schema (JSON with "type": "record")')


# ---------------------------------------------------------------------------------------------------------------
# Frames: every part of a batch is projected onto the same columns, then unioned and finished once.

_PART_FIELDS: Final = (
    model.OP,
    model.VENDOR_OP,
    model.DATABASE,
    model.TABLE,
    model.COLUMNS,
    model.KEY_COLUMNS,
    model.BEFORE,
    model.AFTER,
    model.AFTER_IS_PARTIAL,
    model.POSITION,
    model.EVENT_TIME,
    model.TXN_ID,
    model.DDL,
    model.SUB_INDEX,
)
_ERROR: Final = "_qlik_error"


def _part(frame: DataFrame, error: Column, **values: Column) -> DataFrame:
    """The message columns, the canonical columns this format knows (null unless given) and the format error."""
    types = {f.name: f.dataType for f in model.CANONICAL_SCHEMA.fields}
    values = {model.AFTER_IS_PARTIAL: F.lit(False), **values}
    unknown = set(values) - set(_PART_FIELDS)
    if unknown:
        raise ValueError(f"not a canonical column of qlik-avro: {sorted(unknown)}")
    headers = [MESSAGE_HEADERS] if MESSAGE_HEADERS in frame.columns else []
    return frame.select(
        *MESSAGE_COLUMNS,
        *headers,
        *(values.get(name, F.lit(None)).cast(types[name]).alias(name) for name in _PART_FIELDS),
        error.cast("string").alias(_ERROR),
    )


def _stage(frame: DataFrame, **columns: Column) -> DataFrame:
    """Adds named columns that later expressions reference by name (keeps expression trees and planning small)."""
    return frame.select("*", *(column.alias(name) for name, column in columns.items()))


def _envelopes(messages: DataFrame) -> DataFrame:
    e = F.col("_e")
    parsed = _stage(messages, _e=from_avro(F.col(MESSAGE_VALUE), ENVELOPE_SCHEMA, {"mode": "PERMISSIVE"}))
    envelope_ok = e.isNotNull() & e["type"].isNotNull() & (e["magic"] == F.lit(MAGIC.encode()))
    return _stage(parsed, _envelope_ok=F.coalesce(envelope_ok, F.lit(False)))


def _md_envelopes(envelopes: DataFrame) -> DataFrame:
    return envelopes.where(F.col("_envelope_ok") & (F.col("_e")["type"] == "MD"))


def _md_records(envelopes: DataFrame, texts: Sequence[str]) -> DataFrame:
    """The MD envelopes with ``_definition``: their metadata record as JSON text, decoded with the envelope's own
    ``messageSchema`` (null when that schema is missing or cannot decode it). ``texts``: every ``messageSchema`` of
    these MD envelopes (see :class:`_BatchInputs`)."""
    e = F.col("_e")
    md = _md_envelopes(envelopes)
    # An MD whose schema text matches none of ``texts`` has none that decodes it: a text with bytes that are not
    # UTF-8 comes back from the driver's collect changed (U+FFFD), and such an MD matched no branch below and
    # disappeared from the batch.
    unmatched = F.coalesce(~e["messageSchema"].isin(*texts), F.lit(True)) if texts else F.lit(True)
    parts = [md.where(unmatched).withColumn("_definition", F.lit(None).cast("string"))]
    for text in texts:
        branch = md.where(e["messageSchema"] == F.lit(text))
        try:
            decoded = branch.withColumn("_definition", F.to_json(from_avro(e["message"], text, {"mode": "PERMISSIVE"})))
        except Exception:  # Spark reports an unusable schema text as a JVM error while analysing the plan
            decoded = branch.withColumn("_definition", F.lit(None).cast("string"))
        parts.append(decoded)
    return reduce(DataFrame.unionByName, parts)


def extract_metadata(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """The MD messages of a batch as metadata rows (``base.METADATA_SCHEMA``); the definition is the metadata
    record as JSON (the same shape as a qlik-json MD ``message``)."""
    candidates = _envelopes(messages.where(F.substring(F.col(MESSAGE_VALUE), 1, len(MD_PREFIX)) == F.lit(MD_PREFIX)))
    schema = _md_envelopes(candidates).select(F.col("_e")["messageSchema"]).distinct()
    texts = sorted(row[0] for row in schema.collect() if row[0] is not None)
    definition = F.col("_definition")
    return _md_records(candidates, texts).select(
        F.lit(NAME).alias("format"),
        F.upper(F.get_json_object(definition, "$.schemaId")).alias("schema_id"),
        F.get_json_object(definition, "$.lineage.schema").alias("database"),
        F.lit(None).cast("string").alias("schema"),
        F.get_json_object(definition, "$.lineage.table").alias("table"),
        # try_cast: a tableVersion that is not a number reads as 0 (as a missing one does), where a cast
        # would fail the batch.
        F.coalesce(F.get_json_object(definition, "$.lineage.tableVersion").try_cast("bigint"), F.lit(0)).alias(
            "table_version"
        ),
        definition.alias("definition"),
        md_position().alias("position"),
    )


def _md_events(envelopes: DataFrame, texts: Sequence[str], tables: Sequence[QlikTable]) -> DataFrame:
    """MD messages -> DDL events declaring the columns and key of their MD (looked up by their own schemaId)."""
    definition = F.col("_definition")
    schema_id = F.upper(F.get_json_object(definition, "$.schemaId"))
    table = F.get_json_object(definition, "$.lineage.table")
    md = join_metadata(_md_records(envelopes, texts), tables, schema_id, F.lit(None), F.lit(None), "_q_")
    declared = F.transform(
        F.col("_q_columns"),
        lambda c: F.struct(
            c["name"].alias("name"), c["vendor_type"].alias("vendor_type"), c["spark_type"].alias("spark_type")
        ),
    )
    error = first_error(
        (definition.isNull(), "MD metadata record not decodable with the envelope's messageSchema"),
        (table.isNull(), "MD message without lineage.table"),
        (schema_id.isNull(), "MD message without schemaId"),
        (md_problem("_q_").isNotNull(), md_problem("_q_")),
    )
    return _part(
        md,
        error,
        op=F.lit(Op.DDL.value),
        vendor_op=F.lit("MD"),
        database=F.get_json_object(definition, "$.lineage.schema"),
        table=table,
        columns=declared,
        key_columns=F.col("_q_keys"),
        sub_index=F.lit(0),
    )


# A value of a data field -> (canonical text, fits without loss, or None when every value fits).
FieldConverter = Callable[[Column], tuple[Column, Column | None]]


def _always_fits(convert: Converter) -> FieldConverter:
    return lambda value: (convert(value), None)


@dataclass(frozen=True)
class _Field:
    """How one field of a data record becomes a column (qlik.md 4, 5)."""

    name: str
    ordinal: int
    spark_type: str
    vendor_type: str
    convert: FieldConverter


def _replicate_text(spark_type: str) -> FieldConverter:
    """Replicate's text of a ``spark_type`` value (qlik.md 5), with only that type's rule."""
    return lambda value: replicate_value(value, spark_type)


def _fields(schema_text: str, md: QlikTable | None) -> tuple[list[_Field], set[str]]:
    data_fields, header_names = _data_fields(schema_text)
    fields: list[_Field] = []
    for position, (name, avro_type) in enumerate(data_fields, start=1):
        spark_type, convert = _converter(avro_type)
        column = md.column(name) if md is not None else None
        if column is None:
            fields.append(_Field(name, position, spark_type, json.dumps(_branch(avro_type)), _always_fits(convert)))
            continue
        if spark_type == "string" and _branch(avro_type) == "string" and column.spark_type != "string":
            # qlik.md 5: without logical types NUMERIC, UINT8, DATE, DATETIME... travel as Replicate's text.
            fields.append(
                _Field(name, column.ordinal, column.spark_type, column.vendor_type, _replicate_text(column.spark_type))
            )
            continue
        fields.append(_Field(name, column.ordinal, spark_type, column.vendor_type, _always_fits(convert)))
    return fields, header_names


def _as_decoded(table: QlikTable) -> QlikTable:
    """The MD with the columns its data messages decode to (types of the dataSchema, see the module doc), so that
    its DDL event declares the same types as its DT events; unchanged when its dataSchema is not usable."""
    if table.data_schema is None or table.problem is not None:
        return table
    try:
        fields, _headers_present = _fields(table.data_schema, table)
    except (ValueError, KeyError, TypeError):
        return table
    replicate = {c.name: c for c in table.columns}
    columns = tuple(
        QlikColumn(
            name=f.name,
            ordinal=f.ordinal,
            replicate_type=replicate[f.name].replicate_type if f.name in replicate else "",
            vendor_type=f.vendor_type,
            spark_type=f.spark_type,
            key_position=replicate[f.name].key_position if f.name in replicate else 0,
        )
        for f in fields
    )
    return dataclasses.replace(table, columns=columns)


@dataclass(frozen=True)
class _DataSchema:
    """How the DT messages of one ``messageSchemaId`` of a batch decode (a null id: see the module doc)."""

    schema_id: str | None
    text: str | None
    """The dataSchema they were written with; None when it is unknown."""
    md: QlikTable | None
    source: str
    """Where ``text`` comes from, for error messages."""
    override: bool
    """``text`` comes from an option: an unusable one is a configuration error, not dead letters."""
    problem: str | None = None
    """Why the messages cannot be decoded (they are dead letters), or None."""
    fields: tuple[_Field, ...] = ()
    header_names: frozenset[str] = frozenset()

    def unusable(self, exc: Exception) -> _DataSchema:
        if self.override:
            raise exc
        first_line = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return dataclasses.replace(self, problem=f"the dataSchema of {self.source} is not usable: {first_line}")

    def read_with_spark(self, value: Column) -> Column:
        assert self.text is not None
        return from_avro(value, self.text, {"mode": "PERMISSIVE"})


def _data_schema(
    schema_id: str | None,
    by_id: Mapping[str, QlikTable],
    latest: Mapping[tuple[str | None, str], QlikTable],
    overrides: Mapping[str, str],
    options: FormatOptions,
) -> _DataSchema:
    """The schema DT messages with ``schema_id`` decode with: an override option, else their MD's dataSchema."""
    named = (options.get("database") or None, options["table"]) if options.get("table") else None
    md = by_id.get(schema_id) if schema_id is not None else (latest.get(named) if named else None)
    override = (overrides.get(schema_id) if schema_id is not None else None) or overrides.get("*")
    text = override or (md.data_schema if md is not None else None)
    source = "the data_schema(s) option" if override else f"MD {md.schema_id if md else ''}"
    schema = _DataSchema(schema_id, text, md, source, override is not None)
    if text is None:
        reason = (
            f"no MD message known for messageSchemaId '{schema_id}': its dataSchema is needed to decode the data "
            "message (send the MD first, on any topic of the pipeline, or set the data_schemas option)"
            if schema_id is not None
            else "messageSchemaId is null and no data_schema option or MD of the table named by the options "
            "database/table"
        )
        return dataclasses.replace(schema, problem=reason)
    try:
        fields, header_names = _fields(text, md)
    except (ValueError, KeyError, TypeError) as exc:
        return schema.unusable(exc)
    return dataclasses.replace(schema, fields=tuple(fields), header_names=frozenset(header_names))


def _record_texts(record: Column, fields: Sequence[_Field]) -> tuple[Column, Column | None]:
    """(the canonical text of each field of a data record, in field order; per field, why its value does not fit
    without loss, or None when every value of these fields fits); both null for a null record."""
    texts: list[Column] = []
    errors: list[Column | None] = []
    for field in fields:
        value = record[field.name]
        text, fits = field.convert(value)
        texts.append(text.cast("string"))
        errors.append(
            None
            if fits is None
            else F.when(
                ~fits,
                F.format_string(
                    f"value '%s' of column {field.name} does not fit {field.vendor_type} without loss",
                    F.substring(value, 1, 80),
                ),
            )
        )
    values = F.when(record.isNotNull(), F.array(*texts).cast("array<string>"))
    if all(error is None for error in errors):
        return values, None
    listed = [F.lit(None).cast("string") if error is None else error for error in errors]
    return values, F.when(record.isNotNull(), F.array(*listed))


_SCHEMA_INFO_TYPE: Final = (
    "array<struct<names:array<string>,ordinals:array<int>,"
    "columns:array<struct<name:string,vendor_type:string,spark_type:string>>,keys:array<string>,database:string,"
    "table:string,has_md:boolean,source:string>>"
)


def _schema_info(schemas: Sequence[_DataSchema]) -> Column:
    """What the events of each schema (1-based, in order) share, as one constant: field names and ordinals, declared
    columns, key, table. A row picks its schema's entry by index (one array access), so this part of the query does
    not grow with the number of schemas."""
    info = [
        {
            "names": [f.name for f in s.fields],
            "ordinals": [f.ordinal for f in s.fields],
            "columns": [{"name": f.name, "vendor_type": f.vendor_type, "spark_type": f.spark_type} for f in s.fields],
            "keys": s.md.key_columns if s.md is not None else [],
            "database": s.md.database if s.md is not None else None,
            "table": s.md.table if s.md is not None else None,
            "has_md": s.md is not None,
            "source": s.source,
        }
        for s in schemas
    ]
    # from_json of a literal is folded into a constant when the query is optimised (one parse per query).
    return F.from_json(F.lit(json.dumps(info)), _SCHEMA_INFO_TYPE)


def _read_records(frame: DataFrame, schemas: Sequence[tuple[int, _DataSchema]]) -> DataFrame:
    """``frame`` with ``_d<index>``: the data record of the messages of schema ``index`` (``_k``), null for the
    others (each row runs only its own schema's ``from_avro``)."""
    e = F.col("_e")
    index = F.col("_k")
    return _stage(frame, **{f"_d{i}": F.when(index == i, s.read_with_spark(e["message"])) for i, s in schemas})


def _readable(frame: DataFrame, schemas: list[_DataSchema]) -> list[_DataSchema]:
    """``schemas`` with those Spark cannot read with marked unusable (Spark reports an unusable schema text as a JVM
    error while analysing the plan: tried one by one, only after the batch's query failed)."""
    checked: list[_DataSchema] = []
    for schema in schemas:
        if schema.problem is None:
            try:
                frame.select(schema.read_with_spark(F.col("_e")["message"]))
            except Exception as exc:  # any analysis error of this schema makes it unusable
                schema = schema.unusable(exc)
        checked.append(schema)
    return checked


def _dt_events(data: DataFrame, schemas: list[_DataSchema], options: FormatOptions) -> DataFrame:
    """The DT messages of ``data`` (``_sid``: their upper-cased ``messageSchemaId``, one of ``schemas``) -> row
    events (+ TXN_END), every schema in one pass.

    Per schema, only what depends on its fields is built: its ``from_avro`` and each field's conversion to text,
    into one shape for all (headers struct, value texts in field order, lossy-value messages). Masks, images,
    positions, checks and the canonical columns are built once. Each row runs only its own schema's branch, and
    neither the query nor its planning repeat per schema what every schema shares (before, each schema id had a
    copy of the whole decoder, unioned: planning grew with the tables of the batch).
    """
    ids = [s.schema_id for s in schemas if s.schema_id is not None]
    assert all(s.schema_id is not None for s in schemas[: len(ids)]), "schemas with an id come first"
    sid = F.col("_sid")
    position = F.array_position(F.from_json(F.lit(json.dumps(ids)), "array<string>"), sid).cast("int")
    null_index = F.lit(len(ids) + 1 if len(schemas) > len(ids) else None).cast("int")
    indexed = _stage(data, _k=F.when(sid.isNull(), null_index).otherwise(position))
    try:
        decoded = _read_records(indexed, [(i, s) for i, s in enumerate(schemas, 1) if s.problem is None])
    except Exception:  # one of the texts is not a schema Spark can read: find which, the others still decode
        schemas = _readable(indexed, schemas)
        decoded = _read_records(indexed, [(i, s) for i, s in enumerate(schemas, 1) if s.problem is None])
    usable = [(i, s) for i, s in enumerate(schemas, 1) if s.problem is None]
    unusable = [(i, s) for i, s in enumerate(schemas, 1) if s.problem is not None]
    parts: list[DataFrame] = []
    index = F.col("_k")
    if unusable:
        reason: Column = F.lit(None).cast("string")
        for i, s in unusable:
            reason = F.when(index == i, F.lit(s.problem)).otherwise(reason)
        parts.append(_unknown_schema(indexed.where(index.isin(*(i for i, _ in unusable))), reason))
        decoded = decoded.where(index.isin(*(i for i, _ in usable)))
    if usable:
        parts.append(_row_events(decoded, usable, _schema_info(schemas), options))
    return reduce(DataFrame.unionByName, parts)


def _row_events(
    decoded: DataFrame, schemas: Sequence[tuple[int, _DataSchema]], info_of_schema: Column, options: FormatOptions
) -> DataFrame:
    """Row events of the DT messages read by :func:`_read_records` (see :func:`_dt_events`)."""
    index = F.col("_k")

    def per_schema(values: Mapping[int, Column | None], data_type: str) -> Column:
        """The value of the row's own schema (a CASE on ``_k``; null for schemas without one)."""
        out: Column | None = None
        for i, value in values.items():
            if value is not None:
                out = F.when(index == i, value) if out is None else out.when(index == i, value)
        return (F.lit(None) if out is None else out).cast(data_type)

    record = {i: F.col(f"_d{i}") for i, _ in schemas}
    data_texts = {i: _record_texts(record[i]["data"], s.fields) for i, s in schemas}
    before_texts = {i: _record_texts(record[i]["beforeData"], s.fields) for i, s in schemas}
    decoded = _stage(
        decoded,
        _h=per_schema({i: _headers(record[i], set(s.header_names)) for i, s in schemas}, HEADERS_TYPE),
        _after_values=per_schema({i: texts for i, (texts, _) in data_texts.items()}, "array<string>"),
        _before_values=per_schema({i: texts for i, (texts, _) in before_texts.items()}, "array<string>"),
        _after_errors=per_schema({i: errors for i, (_, errors) in data_texts.items()}, "array<string>"),
        _before_errors=per_schema({i: errors for i, (_, errors) in before_texts.items()}, "array<string>"),
    )
    headers = F.col("_h")
    decoded = _stage(decoded, _mask_hex=F.hex(headers["columnMask"]))
    info = F.element_at(info_of_schema, index)
    mask = F.col("_mask_hex")
    # Per field, whether its columnMask bit (by its ordinal) is set; null = no mask, every field captured.
    decoded = _stage(
        decoded, _captured=F.when(mask.isNotNull(), F.transform(info["ordinals"], lambda o: mask_bit(mask, o)))
    )
    captured = F.col("_captured")

    def image(values: Column) -> Column:
        names = info["names"]
        kept = F.transform(names, lambda n, i: F.when(captured[i], F.struct(n.alias("k"), values[i].alias("v"))))
        masked = F.map_from_entries(F.filter(kept, lambda entry: entry.isNotNull()))
        return F.when(values.isNotNull(), F.when(captured.isNull(), F.map_from_arrays(names, values)).otherwise(masked))

    def first_lossy(errors: Column) -> Column:
        in_image = F.transform(errors, lambda m, i: F.when(F.coalesce(captured[i], F.lit(True)), m))
        return F.get(F.filter(in_image, lambda m: m.isNotNull()), 0)

    decoded = _stage(
        decoded,
        _after_raw=image(F.col("_after_values")),
        _before_raw=image(F.col("_before_values")),
        _dropped=F.coalesce(F.exists(captured, lambda c: ~c), F.lit(False)),
        _value_error=F.coalesce(first_lossy(F.col("_after_errors")), first_lossy(F.col("_before_errors"))),
    )
    after_raw, before_raw = F.col("_after_raw"), F.col("_before_raw")
    vendor_op = headers["operation"]
    op = op_from_code(vendor_op, _ROW_OPERATIONS)
    is_row = op.isNotNull()
    is_delete = op == Op.DELETE.value
    # qlik.md 3: DELETE row in data, or in beforeData: data ?? beforeData.
    after = F.when(is_row & ~is_delete, after_raw)
    before = F.when(is_delete, F.coalesce(after_raw, before_raw)).when(is_row, before_raw)
    position, event_time, header_checks = position_and_time(headers, op, is_row)
    last_event = F.coalesce(is_row & headers["transactionLastEvent"], F.lit(False))
    has_md = info["has_md"]
    database = F.when(has_md, info["database"])
    if options.get("database"):
        database = database.otherwise(F.lit(options["database"]))
    table = F.when(has_md, info["table"]).otherwise(F.lit(options["table"]) if options.get("table") else F.col("topic"))
    exploded = decoded.select(
        "*", F.explode(F.when(last_event, F.array(F.lit(0), F.lit(1))).otherwise(F.array(F.lit(0)))).alias("_sub")
    )
    txn_end = F.col("_sub") == 1
    error = first_error(
        (
            headers.isNull() | vendor_op.isNull(),
            F.format_string("data message not decodable with the data schema of %s", info["source"]),
        ),
        (op.isNull(), F.format_string("unknown Qlik operation '%s'", vendor_op)),
        (is_row & ~is_delete & after_raw.isNull(), F.format_string("%s without data", vendor_op)),
        (is_delete & before.isNull(), "DELETE without data or beforeData"),
        # Like the shared value checks: the row event is the dead letter, its transaction end is not.
        (is_row & ~txn_end & F.col("_value_error").isNotNull(), F.col("_value_error")),
        *header_checks,
    )
    return _part(
        exploded,
        error,
        op=F.when(txn_end, F.lit(Op.TXN_END.value)).otherwise(op),
        vendor_op=F.when(txn_end, F.lit("transactionLastEvent")).otherwise(vendor_op),
        database=F.when(~txn_end, database),
        table=F.when(~txn_end, table),
        columns=F.when(is_row & ~txn_end, info["columns"]),
        key_columns=F.when(is_row & ~txn_end, info["keys"]),
        before=F.when(~txn_end, before),
        after=F.when(~txn_end, after),
        after_is_partial=is_row & ~is_delete & ~txn_end & F.col("_dropped"),
        position=position,
        event_time=event_time,
        txn_id=F.when(headers["transactionId"] != "", headers["transactionId"]),
        sub_index=F.col("_sub"),
    )


def _unknown_schema(frame: DataFrame, reason: Column) -> DataFrame:
    return _part(frame, reason, vendor_op=F.lit("DT"), sub_index=F.lit(0))


def decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """Qlik Avro envelopes -> canonical events, with the MD messages of the same batch (see the module doc)."""
    return decode_with_metadata(messages, options, collect_metadata(extract_metadata(messages, options)))


@dataclass(frozen=True)
class _BatchInputs:
    """What the decoder's plan reads from a batch's messages (their Avro schemas are needed to plan ``from_avro``):
    the batch's plan is built once per options, definitions and inputs, and reused (``formats._plans``)."""

    md_schemas: tuple[str, ...]
    """Every ``messageSchema`` text of the batch's MD envelopes, sorted."""
    schema_ids: tuple[str | None, ...]
    """Every upper-cased ``messageSchemaId`` of the batch's DT envelopes, sorted, the null id (if any) last."""


def _batch_inputs(messages: DataFrame) -> _BatchInputs:
    """The batch's :class:`_BatchInputs`, in one Spark job over its MD and DT envelopes."""
    e = F.col("_e")
    head = F.substring(F.col(MESSAGE_VALUE), 1, len(MD_PREFIX))
    envelopes = _envelopes(messages.where(head.isin(MD_PREFIX, DT_PREFIX))).where(F.col("_envelope_ok"))
    named = F.when(e["type"] == "MD", e["messageSchema"]).otherwise(F.upper(e["messageSchemaId"]))
    rows = envelopes.select(e["type"], named).distinct().collect()
    md_schemas = sorted(name for kind, name in rows if kind == "MD" and name is not None)
    schema_ids = sorted((name for kind, name in rows if kind == "DT"), key=lambda i: (i is None, i or ""))
    return _BatchInputs(tuple(md_schemas), tuple(schema_ids))


def decode_with_metadata(messages: DataFrame, options: FormatOptions, known: Sequence[TableMetadata]) -> DataFrame:
    """Qlik Avro envelopes -> canonical events (one per message, two for a transaction's last event); DT messages
    are decoded with the dataSchema of their MD message among ``known`` (or an override option)."""
    return _plans.decode_with_batch_inputs_reusing_plan(
        _decode_with_inputs, messages, options, known, _batch_inputs(messages)
    )


def _decode_with_inputs(
    messages: DataFrame, options: FormatOptions, known: Sequence[TableMetadata], inputs: _BatchInputs
) -> DataFrame:
    """:func:`decode_with_metadata` with the batch's :class:`_BatchInputs` collected (the messages are not read
    while the plan is built)."""
    overrides = _schemas(options)
    tables = parse_definitions(known, NAME)
    by_id = {t.schema_id.upper(): t for t in tables if t.problem is None}
    latest = latest_versions(tables)
    # The envelope's first bytes tell MD from DT (see MD_PREFIX): each part parses only its own messages.
    head = F.substring(F.col(MESSAGE_VALUE), 1, len(MD_PREFIX))
    md_envelopes = _envelopes(messages.where(head == F.lit(MD_PREFIX)))
    dt_envelopes = _envelopes(messages.where(head == F.lit(DT_PREFIX)))
    other = _envelopes(messages.where(~F.coalesce(head.isin(MD_PREFIX, DT_PREFIX), F.lit(False))))
    e = F.col("_e")
    raw = F.col(MESSAGE_VALUE)
    ok = F.col("_envelope_ok")
    broken = reduce(DataFrame.unionByName, [md_envelopes.where(~ok), dt_envelopes.where(~ok), other])
    parts = [
        _part(
            broken,
            first_error(
                (raw.isNull(), "empty message (null Kafka value)"),
                (~F.col("_envelope_ok"), "malformed Qlik Avro envelope (not an atMSG MessageEnvelope)"),
                (F.lit(True), F.format_string("unknown message type '%s'", e["type"])),
            ),
            vendor_op=F.when(F.col("_envelope_ok"), e["type"]),
            sub_index=F.lit(0),
        ),
        _md_events(md_envelopes, inputs.md_schemas, [_as_decoded(t) for t in tables]),
    ]
    data = _stage(dt_envelopes.where(ok), _sid=F.upper(e["messageSchemaId"]))
    # Ids first, the null id (if any) last: see _dt_events.
    schemas = [_data_schema(schema_id, by_id, latest, overrides, options) for schema_id in inputs.schema_ids]
    if schemas:
        parts.append(_dt_events(data, schemas, options))
    return finish(reduce(DataFrame.unionByName, parts), NAME, F.col(_ERROR))


FORMAT: Final = register(
    CdcFormat(
        name=NAME,
        description="Qlik Replicate Avro (atMSG MessageEnvelope; data messages decoded with their MD's dataSchema)",
        decode=decode,
        encoding="binary",
        operations=OPERATIONS,
        options={
            "data_schema": "override: one dataSchema (Avro JSON) for every DT message, instead of their MD's",
            "data_schemas": 'override: JSON object {"<schemaId>": "<dataSchema>"} chosen by messageSchemaId',
            "database": "database (Qlik schema) of DT messages without a known MD (default: none)",
            "table": "table of DT messages without a known MD (default: the topic)",
        },
        sniff=None,  # binary; README "Recognition": the value starts with the bytes atMSG
        examples=(),
        metadata=MetadataSupport(extract=extract_metadata, decode=decode_with_metadata),
        validate_options=_check_options,
    )
)
