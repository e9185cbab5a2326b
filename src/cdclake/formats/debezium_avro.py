"""Debezium change events in Avro, with a Confluent schema registry (``debezium-avro``).

Spec: ``shared/formats/debezium.md`` 1 ("Avro/Protobuf/JSON-Schema with a registry: Confluent framing ``0x00`` +
4-byte big-endian schema id + payload"; "Avro carries the same logical structure"). Keys and values are framed
alike, each with its own schema id; the schemas come from the registry the connector's ``AvroConverter`` wrote them
to (option ``schema_registry_url``), from a folder of ``<id>.avsc`` files (``schemas_dir``: replaying captured
messages without the registry) or from the options themselves (``schemas``); see ``formats._schema_registry``.

Decoding: the batch's distinct key and value schema ids are collected (one small Spark job) and resolved on the
driver; each message is read with ``from_avro`` of its own id (one pass: a CASE over the batch's ids), and the
record is handed to the ``debezium-json`` decoder as the envelope it is (:func:`cdclake.formats.debezium.
decode_parsed`): operations, positions, transactions, heartbeats, tombstones and the unavailable-value placeholder
mean exactly what they mean there. Batches naming the same ids reuse one plan (``formats._plans``).

Types come from the Avro schema, as Confluent's ``AvroData`` writes a Connect schema into it: ``connect.name`` (the
logical type: ``io.debezium.time.MicroTimestamp``, ``org.apache.kafka.connect.data.Decimal``...),
``connect.parameters`` (a decimal's scale and precision) and ``connect.type`` (``int8``/``int16`` stored as Avro
``int``). Avro logical types without a ``connect.name`` (another producer) are read as the Connect types they stand
for (``decimal``, ``date``, ``time-millis``, ``timestamp-millis``; ``time-micros`` and ``timestamp-micros`` as
Debezium's ``MicroTime``/``MicroTimestamp``). Records are read without their Avro logical types, so a value arrives
as the same bytes or number Debezium's JSON converter writes (a decimal's unscaled bytes, epoch days...) and is
converted by the same rules. A union of several non-null types is kept as JSON text.

Column names are the Avro field names: a connector that writes Avro must make names Avro-safe
(``field.name.adjustment.mode=avro`` turns ``my-col`` into ``my_col``), and the original spelling is not carried.

Dead letters: a value without the framing; a schema id the source does not have (or a schema that is not Avro,
uses schema references, or that Spark cannot read); a value that does not decode with its schema; the same for a
framed key. A key without the framing (a string key), or whose schema is not a record, gives no key columns, as a
JSON key that is not an object does in ``debezium-json``. A registry that cannot be reached fails the batch instead
(it runs again on restart).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from cdclake.formats import _plans, register
from cdclake.formats._json_images import _FIELD, inferred_kinds
from cdclake.formats._schema_registry import RegisteredSchema, check_options, resolve, source_from_options
from cdclake.formats.base import MESSAGE_KEY, MESSAGE_VALUE, CdcFormat, FormatOptions, first_error
from cdclake.formats.debezium import OPERATIONS, PAYLOAD_SCHEMA, PLACEHOLDER, decode_parsed, key_changes_rejoined

NAME: Final = "debezium-avro"

MAGIC: Final = b"\x00"
HEADER_BYTES: Final = 5
"""Confluent framing: the magic byte and the 4-byte schema id before the Avro binary."""

# Avro logical type -> the Connect logical name it stands for, when the schema has no connect.name.
_LOGICAL_NAMES: Final = {
    "decimal": "org.apache.kafka.connect.data.Decimal",
    "date": "org.apache.kafka.connect.data.Date",
    "time-millis": "org.apache.kafka.connect.data.Time",
    "timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
    "time-micros": "io.debezium.time.MicroTime",
    "timestamp-micros": "io.debezium.time.MicroTimestamp",
    "local-timestamp-millis": "io.debezium.time.Timestamp",
    "local-timestamp-micros": "io.debezium.time.MicroTimestamp",
}
_CONNECT_TYPES: Final = {
    "int": "int32",
    "long": "int64",
    "float": "float32",
    "double": "float64",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
    "fixed": "bytes",
    "enum": "string",
    "record": "struct",
    "array": "array",
    "map": "map",
    "null": "string",
}


# ----------------------------------------------------------------------------------------------------------------
# Avro schemas -> what the plan needs (driver side, once per schema id)


class _Names:
    """The named types (records, enums, fixed) of one Avro schema by full and short name: a Debezium envelope
    defines its ``Value`` record in ``before`` and refers to it by name in ``after``."""

    def __init__(self, schema: Any) -> None:
        self.types: dict[str, dict[str, Any]] = {}
        self._collect(schema, "")

    def _collect(self, schema: Any, namespace: str) -> None:
        if isinstance(schema, list):
            for branch in schema:
                self._collect(branch, namespace)
        elif isinstance(schema, dict):
            kind = schema.get("type")
            if kind in ("record", "error", "enum", "fixed") and isinstance(schema.get("name"), str):
                name = schema["name"]
                space = schema.get("namespace", namespace) if "." not in name else name.rpartition(".")[0]
                full = name if "." in name else (f"{space}.{name}" if space else name)
                self.types[full] = schema
                self.types.setdefault(name.rpartition(".")[2], schema)
                namespace = space or ""
            if kind in ("record", "error"):
                for fld in schema.get("fields", []):
                    self._collect(fld.get("type"), namespace)
            elif kind == "array":
                self._collect(schema.get("items"), namespace)
            elif kind == "map":
                self._collect(schema.get("values"), namespace)
            elif isinstance(kind, (dict, list)):
                self._collect(kind, namespace)

    def resolve(self, schema: Any) -> Any:
        """``schema`` with a reference by name replaced by the named type, and a nested type spec unwrapped."""
        while True:
            if isinstance(schema, str) and schema in self.types:
                schema = self.types[schema]
            elif isinstance(schema, dict) and isinstance(schema.get("type"), (dict, list)):
                schema = schema["type"]
            elif isinstance(schema, dict) and isinstance(schema.get("type"), str) and schema["type"] in self.types:
                schema = self.types[schema["type"]]
            else:
                return schema

    def non_null(self, schema: Any) -> Any:
        """The type of an optional field (``["null", T]`` -> T); a union of several types stays a list."""
        schema = self.resolve(schema)
        if isinstance(schema, list):
            branches = [b for b in schema if b != "null"]
            return self.resolve(branches[0]) if len(branches) == 1 else branches
        return schema


def _connect_field(name: str, schema: Any, names: _Names) -> dict[str, Any]:
    """One row column as a Connect schema field (what ``_json_images`` reads: ``field``, ``type``, ``name``,
    ``parameters``), from its Avro type and the ``connect.*`` attributes ``AvroData`` writes into it."""
    avro = names.non_null(schema)
    if isinstance(avro, list):  # a union of several types: Spark reads it as a struct of members, kept as JSON
        return {"field": name, "type": "struct", "name": None, "parameters": None}
    attributes = avro if isinstance(avro, dict) else {}
    kind = attributes.get("type", avro)
    connect_type = _CONNECT_TYPES.get(kind if isinstance(kind, str) else "", "string")
    if kind == "int" and attributes.get("connect.type") in ("int8", "int16"):
        connect_type = attributes["connect.type"]
    logical = attributes.get("logicalType")
    logical_name = attributes.get("connect.name") or _LOGICAL_NAMES.get(logical or "")
    parameters = attributes.get("connect.parameters")
    if logical == "decimal" and not parameters:
        parameters = {
            "scale": str(attributes.get("scale", 0)),
            "connect.decimal.precision": str(attributes["precision"]),
        }
    return {
        "field": name,
        "type": connect_type,
        "name": logical_name,
        "parameters": {str(k): str(v) for k, v in parameters.items()} if isinstance(parameters, dict) else None,
    }


def _image_fields(schema: Any, names: _Names) -> list[dict[str, Any]] | None:
    """The row columns an envelope schema declares: ``after``'s record fields, then those only ``before`` has
    (as ``_json_images.schema_fields`` reads a Connect schema); None when it has no row images (transaction,
    heartbeat and schema-change records)."""
    top = {f["name"]: f["type"] for f in schema.get("fields", []) if isinstance(f, dict) and "name" in f}
    declared: dict[str, dict[str, Any]] = {}
    found = False
    for image in ("after", "before"):
        record = names.non_null(top[image]) if image in top else None
        if isinstance(record, dict) and record.get("type") in ("record", "error"):
            found = True
            for fld in record.get("fields", []):
                declared.setdefault(fld["name"], _connect_field(fld["name"], fld["type"], names))
    return list(declared.values()) if found else None


def _without_logical_types(schema: Any) -> Any:
    """``schema`` with every ``logicalType`` left out: ``from_avro`` then reads a decimal as its unscaled bytes, a
    date as epoch days..., which is what Debezium's JSON converter writes and ``debezium-json`` converts. The
    binary encoding is the same, so the record still decodes."""
    if isinstance(schema, list):
        return [_without_logical_types(s) for s in schema]
    if isinstance(schema, dict):
        return {
            k: _without_logical_types(v) for k, v in schema.items() if not (k == "logicalType" and "type" in schema)
        }
    return schema


NOT_A_RECORD: Final = "is not an Avro record schema"


@dataclass(frozen=True)
class _Reading:
    """How the messages of one schema id are read: the reader schema for ``from_avro`` and, for a value schema,
    the row columns it declares (JSON text of ``ARRAY<_FIELD>``, None without row images); or why they cannot be."""

    schema_id: int
    reader: str | None
    fields: str | None = None
    problem: str | None = None


def _reading(registered: RegisteredSchema) -> _Reading:
    if registered.avro is None:
        return _Reading(registered.schema_id, None, problem=registered.problem)
    try:
        schema = json.loads(registered.avro)
    except ValueError as exc:
        return _Reading(registered.schema_id, None, problem=f"is not JSON: {exc}")
    names = _Names(schema)
    record = names.resolve(schema)
    if not isinstance(record, dict) or record.get("type") not in ("record", "error"):
        return _Reading(registered.schema_id, None, problem=NOT_A_RECORD)
    try:
        fields = _image_fields(record, names)
    except (KeyError, TypeError, AttributeError) as exc:
        return _Reading(registered.schema_id, None, problem=f"cannot be read as a Debezium envelope: {exc!r}")
    reader = json.dumps(_without_logical_types(schema))
    return _Reading(registered.schema_id, reader, None if fields is None else json.dumps(fields))


# ----------------------------------------------------------------------------------------------------------------
# The decoder


_ALL_NULL: Final = r'^\{("[A-Za-z0-9_]*":null,?)*\}$'
"""A record's JSON with every field null: what ``from_avro`` (PERMISSIVE) gives for bytes it cannot decode. Avro
names are letters, digits and underscores; the match fails at the first field with a value."""


def schema_id(framed: Column) -> Column:
    """The schema id of a Confluent-framed binary, null when it is not framed (or null)."""
    is_framed = (F.length(framed) >= HEADER_BYTES) & (F.substring(framed, 1, 1) == F.lit(MAGIC))
    return F.when(is_framed, F.conv(F.hex(F.substring(framed, 2, 4)), 16, 10).cast("bigint"))


def _avro_part(framed: Column) -> Column:
    return F.substring(framed, HEADER_BYTES + 1, 1 << 30)


@dataclass(frozen=True)
class _BatchInputs:
    """The batch's value and key schemas (what the decoder's plan is built from: ``formats._plans``)."""

    values: tuple[RegisteredSchema, ...]
    keys: tuple[RegisteredSchema, ...]


def _batch_inputs(messages: DataFrame, options: FormatOptions) -> _BatchInputs:
    """The batch's distinct key and value schema ids (one Spark job), resolved on the driver."""
    rows = (
        messages.select(schema_id(F.col(MESSAGE_VALUE)).alias("v"), schema_id(F.col(MESSAGE_KEY)).alias("k"))
        .distinct()
        .collect()
    )
    value_ids = sorted({int(r["v"]) for r in rows if r["v"] is not None})
    key_ids = sorted({int(r["k"]) for r in rows if r["k"] is not None})
    source = source_from_options(options)
    return _BatchInputs(resolve(source, value_ids), resolve(source, key_ids))


def decode(messages: DataFrame, options: FormatOptions) -> DataFrame:
    """Confluent-framed Debezium Avro messages -> canonical events (see the module doc)."""
    return _plans.decode_with_batch_inputs_reusing_plan(
        _decode_with_schemas, messages, options, (), _batch_inputs(messages, options)
    )


def _usable(messages: DataFrame, readings: list[_Reading]) -> list[_Reading]:
    """``readings`` with those Spark cannot read marked unusable: Spark reports a schema it cannot read (recursive
    types...) as an analysis error of the whole plan, so each is tried alone first."""
    checked = []
    for reading in readings:
        if reading.reader is not None:
            try:
                messages.select(from_avro(_avro_part(F.col(MESSAGE_VALUE)), reading.reader))
            except Exception as exc:  # any analysis error of this schema makes it unusable
                reading = _Reading(reading.schema_id, None, problem=f"cannot be read by Spark: {str(exc)[:300]}")
        checked.append(reading)
    return checked


def _by_id(schema_ids: Column, readings: Sequence[_Reading], value: Any) -> Column:
    """A CASE over ``schema_ids``: per reading, ``value(reading)`` (a Column), null for the ids of no reading."""
    result: Column | None = None
    for reading in readings:
        then = value(reading)
        if then is None:
            continue
        result = (F.when if result is None else result.when)(schema_ids == F.lit(reading.schema_id), then)
    return result if result is not None else F.lit(None)


def _decode_with_schemas(
    messages: DataFrame, options: FormatOptions, known: Sequence[Any], inputs: _BatchInputs
) -> DataFrame:
    """:func:`decode` with the batch's schemas resolved (the messages are not read while the plan is built)."""
    del known  # schemas come from the registry, not from messages of the stream
    values = _usable(messages, [_reading(s) for s in inputs.values])
    # A key that is not a record (a string key written by the AvroConverter) names no columns, as a JSON key that
    # is not an object does in debezium-json: no key columns, and no dead letter.
    keys = [
        _Reading(r.schema_id, None) if r.problem == NOT_A_RECORD else r
        for r in _usable(messages, [_reading(s) for s in inputs.keys])
    ]
    value, key = F.col(MESSAGE_VALUE), F.col(MESSAGE_KEY)
    staged = messages.select("*", schema_id(value).alias("_vid"), schema_id(key).alias("_kid"))
    vid, kid = F.col("_vid"), F.col("_kid")

    def record_json(framed: Column) -> Any:
        def read(reading: _Reading) -> Column | None:
            if reading.reader is None:
                return None
            # NULLs kept: a column missing from an image would keep its stored value.
            record = from_avro(_avro_part(framed), reading.reader, {"mode": "PERMISSIVE"})
            return F.to_json(record, {"ignoreNullFields": "false"})

        return read

    def fields_of(reading: _Reading) -> Column | None:
        # from_json of a literal: folded into a constant when the plan is optimised.
        return None if reading.fields is None else F.from_json(F.lit(reading.fields), f"array<{_FIELD}>")

    staged = staged.select(
        "*",
        _by_id(vid, values, record_json(value)).cast("string").alias("_value_json"),
        _by_id(kid, keys, record_json(key)).cast("string").alias("_key_json"),
        _by_id(vid, values, fields_of).cast(f"array<{_FIELD}>").alias("_schema_fields"),
        _by_id(vid, values, lambda r: None if r.problem is None else F.lit(r.problem)).cast("string").alias("_vp"),
        _by_id(kid, keys, lambda r: None if r.problem is None else F.lit(r.problem)).cast("string").alias("_kp"),
        F.coalesce(_by_id(kid, keys, lambda r: None if r.reader is None else F.lit(True)), F.lit(False)).alias("_kr"),
    )
    value_json = F.col("_value_json")
    parsed = staged.select(
        "*",
        F.when(value_json.isNotNull(), F.struct(F.lit(None).cast("string").alias("_corrupt_record"))).alias("_m"),
        F.from_json(value_json, PAYLOAD_SCHEMA).alias("_p"),
    )
    p = F.col("_p")
    parsed = parsed.select(
        "*", F.when(F.col("_schema_fields").isNull(), inferred_kinds(p["before"], p["after"])).alias("_inferred_kinds")
    )
    error = first_error(
        (
            value.isNotNull() & vid.isNull(),
            "not Confluent-framed Avro: the value does not start with the magic byte 0 and a 4-byte schema id",
        ),
        (value.isNotNull() & F.col("_vp").isNotNull(), F.format_string("value schema id %d %s", vid, F.col("_vp"))),
        (
            value.isNotNull() & (value_json.isNull() | value_json.rlike(_ALL_NULL)),
            F.format_string("the value does not decode with Avro schema id %d", vid),
        ),
        (kid.isNotNull() & F.col("_kp").isNotNull(), F.format_string("key schema id %d %s", kid, F.col("_kp"))),
        (
            F.col("_kr") & (F.col("_key_json").isNull() | F.col("_key_json").rlike(_ALL_NULL)),
            F.format_string("the key does not decode with Avro schema id %d", kid),
        ),
    )
    return decode_parsed(parsed, options, NAME, key=F.col("_key_json"), format_error=error)


FORMAT: Final = register(
    CdcFormat(
        name=NAME,
        description="Debezium change events in Avro with a Confluent schema registry (magic byte + schema id)",
        decode=decode,
        encoding="binary",
        batch_step=key_changes_rejoined,
        operations=OPERATIONS,
        options={
            "schema_registry_url": "the Confluent-compatible schema registry the connector wrote to, e.g. "
            "http://registry:8081 (several: comma-separated)",
            "schema_registry_user_info": "user:password for the registry's HTTP basic authentication",
            "schemas_dir": "a folder of <schema id>.avsc files, looked in before the registry (replay without it)",
            "schemas": 'the schemas as a JSON object {"<schema id>": <Avro schema>, ...}, looked in first',
            "unavailable_value_placeholder": f"the connector's unavailable.value.placeholder (default {PLACEHOLDER})",
        },
        validate_options=check_options,
        sniff=None,  # binary: the magic byte 0 is not enough to tell it from DTS Avro (formats README)
        reads_batch_to_plan=True,
    )
)
