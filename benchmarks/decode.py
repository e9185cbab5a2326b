"""Target a: decode throughput of every format with a renderer, against a hand-written parse of the same messages.

Both sides read the same in-memory, materialised message frame and are forced through the ``noop`` writer, so the
figure is the cost of the projection alone (no source I/O, no sink I/O).

The baseline, per encoding family, built generically from the format module's own envelope schema (the schema its
decoder parses with: the module attribute ``RAW_SCHEMA``, else ``ENVELOPE_SCHEMA`` or ``AVRO_SCHEMA``):

* JSON: ``from_json(CAST(value AS STRING), <envelope schema>)``;
* binary: ``from_avro(value, <envelope schema>, PERMISSIVE)``, after dropping an Avro single-object header
  (``C3 01`` + 8-byte fingerprint) when a message has one;
* JSON without a module schema: the schema Spark infers from a sample of 2,000 messages.

Two binary formats keep each record's schema outside the module, so their envelope alone holds no row values:

* Confluent-framed Avro (``debezium-avro``): per schema id, ``from_avro`` of that id's schema;
* Avro records nested in an envelope whose schema is given by the stream's own metadata messages (``qlik-avro``:
  a DT message's ``message`` bytes are written with the ``dataSchema`` of the MD message its ``messageSchemaId``
  names, qlik.md 1 "Avro"): the MD messages are read first, as any consumer of the format must (one small job on
  the driver, as the decoder does), then per data schema id ``from_avro`` of the DT messages' inner record.

One JSON format keeps its row as text that no JSON parser reads as it is: DRS DDS (``drs-json-dds``) sends each
document (``value``, ``where``) as Mongo-shell text inside the JSON message (drs.md 5 "Parsing"). Its baseline rewrites
the shell constructors to JSON with the format's own rewrites (``drs_dds.SHELL_REWRITES``, which any consumer needs in
some form) and reads both documents with ``from_json`` as maps of text, in place of the two envelope strings.

then one ``select`` of as many columns as the canonical event has (24): the six Kafka columns passed through and the
envelope's leaves (nested struct fields, depth first; arrays and maps count as one leaf) to fill the rest. That is
what "parse the envelope into the fields the canonical event needs" costs without any of the decoder's work (op
mapping, canonical value text, identifier and value checks, keys, positions).

Ratio = decoder throughput / baseline throughput (best of ``repeats`` timed runs each, alternated, after a warm-up).
"""

from __future__ import annotations

import functools
import importlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro
from pyspark.sql.types import DataType, StructType

from benchmarks.workload import Workload, message_frame
from cdclake import model
from cdclake.formats import debezium_avro, decode_batch, drs_dds, get_format, qlik_avro
from cdclake.formats.base import MESSAGE_COLUMNS

SCHEMA_ATTRIBUTES = ("RAW_SCHEMA", "ENVELOPE_SCHEMA", "AVRO_SCHEMA")
AVRO_SINGLE_OBJECT_MAGIC = bytes([0xC3, 0x01])
AVRO_SINGLE_OBJECT_HEADER = 10
LEAVES = len(model.CANONICAL_COLUMNS) - len(MESSAGE_COLUMNS)
"""How many parsed leaves a baseline selects beside the Kafka columns: as many columns as the canonical event has."""


@dataclass
class DecodeResult:
    format: str
    messages: int
    baseline_seconds: float
    decoder_seconds: float
    baseline_description: str
    dead_letters: int

    @property
    def ratio(self) -> float:
        return self.baseline_seconds / self.decoder_seconds if self.decoder_seconds else 0.0

    @property
    def decoder_rate(self) -> float:
        return self.messages / self.decoder_seconds if self.decoder_seconds else 0.0

    @property
    def baseline_rate(self) -> float:
        return self.messages / self.baseline_seconds if self.baseline_seconds else 0.0


def envelope_schema(format_name: str) -> str | None:
    """The schema string the format's decoder parses the envelope with, if its module exposes one."""
    module = importlib.import_module(get_format(format_name).decode.__module__)
    for attribute in SCHEMA_ATTRIBUTES:
        value = getattr(module, attribute, None)
        if isinstance(value, str):
            return value
    return None


def _leaves(column: Column, data_type: DataType, path: str) -> list[tuple[str, Column]]:
    if isinstance(data_type, StructType):
        out: list[tuple[str, Column]] = []
        for field in data_type.fields:
            if field.name != "_corrupt_record":
                out += _leaves(column[field.name], field.dataType, f"{path}.{field.name}")
        return out
    return [(path, column)]


def _as_text(leaves: list[tuple[str, Column]]) -> list[Column]:
    """The first :data:`LEAVES` of ``leaves`` as text columns ``c0``, ``c1``..., padded with NULLs to that count
    (frames of several record schemas share one union)."""
    columns = [column.cast("string") for _, column in leaves] + [F.lit(None).cast("string")] * LEAVES
    return [c.alias(f"c{i}") for i, c in enumerate(columns[:LEAVES])]


def baseline_frame(
    spark: SparkSession, messages: DataFrame, format_name: str, options: Mapping[str, str] | None = None
) -> tuple[DataFrame, str]:
    """The hand-written parse of ``messages`` (see the module doc) and a description of it."""
    encoding = get_format(format_name).encoding
    schema = envelope_schema(format_name)
    value = F.col("value")
    if encoding == "binary" and options and "schemas" in options:
        return _framed_baseline(messages, json.loads(options["schemas"]))
    if format_name == qlik_avro.NAME:
        return _nested_record_baseline(messages)
    if encoding == "binary":
        if schema is None:
            raise ValueError(f"{format_name}: binary format without a module-level Avro schema")
        header = F.substring(value, 1, 2) == F.lit(AVRO_SINGLE_OBJECT_MAGIC)
        body = F.when(header, F.expr(f"substring(value, {AVRO_SINGLE_OBJECT_HEADER + 1})")).otherwise(value)
        parsed = from_avro(body, schema, {"mode": "PERMISSIVE"})
        how = "from_avro(value, module Avro schema)"
    else:
        if schema is None:
            sample = messages.select(F.col("value").cast("string").alias("v")).limit(2000)
            schema = spark.read.json(sample.rdd.map(lambda row: row.v)).schema.json()
            how = "from_json(value, schema inferred from 2,000 messages)"
            parsed = F.from_json(value.cast("string"), StructType.fromJson(json.loads(schema)))
        else:
            how = "from_json(value, module envelope schema)"
            parsed = F.from_json(value.cast("string"), schema)
    with_parsed = messages.select(*MESSAGE_COLUMNS, parsed.alias("_m"))
    if format_name == drs_dds.NAME:
        with_parsed, how = _shell_documents_parsed(with_parsed), f"{how}, documents rewritten and parsed"
    parsed_type = with_parsed.schema["_m"].dataType
    leaves = _leaves(F.col("_m"), parsed_type, "_m")[:LEAVES]
    frame = with_parsed.select(*MESSAGE_COLUMNS, *(column.alias(f"c{i}") for i, (_, column) in enumerate(leaves)))
    return frame, f"{how}, {len(MESSAGE_COLUMNS)} Kafka columns + {len(leaves)} envelope leaves"


def _shell_documents_parsed(parsed: DataFrame) -> DataFrame:
    """DRS DDS: the envelope's Mongo-shell documents (``value``, ``where``) turned into JSON by the format's
    constructor rewrites, then read with ``from_json`` as ``MAP<STRING, STRING>`` in their envelope places."""
    envelope = F.col("_m")
    for name in ("value", "where"):
        envelope = envelope.withField(name, F.from_json(drs_dds.shell_to_json(envelope[name]), "MAP<STRING, STRING>"))
    return parsed.withColumn("_m", envelope)


def _framed_baseline(messages: DataFrame, schemas: Mapping[str, object]) -> tuple[DataFrame, str]:
    """Confluent-framed Avro (``0x00``, a 4-byte schema id, the record): per schema id, its messages read with
    ``from_avro`` of that id's schema and projected to the envelope's leaves (padded with NULLs to the same count),
    all ids' frames in one union."""
    schema_id = debezium_avro.schema_id(F.col("value"))
    body = F.substring(F.col("value"), debezium_avro.HEADER_BYTES + 1, 1 << 30)
    frames = []
    for key, schema in sorted(schemas.items(), key=lambda item: int(item[0])):
        text = schema if isinstance(schema, str) else json.dumps(schema)
        own = messages.where(schema_id == int(key)).select(
            *MESSAGE_COLUMNS, from_avro(body, text, {"mode": "PERMISSIVE"}).alias("_m")
        )
        frames.append(own.select(*MESSAGE_COLUMNS, *_as_text(_leaves(F.col("_m"), own.schema["_m"].dataType, "_m"))))
    union = functools.reduce(DataFrame.unionByName, frames)
    how = f"per schema id ({len(frames)}), from_avro(value after the 5-byte header, its schema), leaves as text"
    return union, f"{how}, {len(MESSAGE_COLUMNS)} Kafka columns + {LEAVES} envelope leaves"


def _nested_record_baseline(messages: DataFrame) -> tuple[DataFrame, str]:
    """Qlik Replicate Avro (see the module doc): the envelope with ``from_avro``; the MD messages' own records
    decoded with their ``messageSchema`` and collected (schemaId -> dataSchema, Qlik's metadata store); then per data
    schema id, its DT messages' ``message`` read with ``from_avro`` of that ``dataSchema`` and projected to the
    record's leaves as text, headers first (padded with NULLs to the same count). The MD messages keep their envelope
    leaves. All frames in one union."""
    envelopes = messages.select(
        *MESSAGE_COLUMNS, from_avro(F.col("value"), qlik_avro.ENVELOPE_SCHEMA, {"mode": "PERMISSIVE"}).alias("_e")
    )
    e = F.col("_e")
    metadata = envelopes.where(e["type"] == "MD")
    data_schemas: dict[str, str] = {}
    for (text,) in metadata.select(e["messageSchema"]).distinct().collect():
        record = from_avro(e["message"], text, {"mode": "PERMISSIVE"})
        rows = metadata.where(e["messageSchema"] == text).select(record["schemaId"], record["dataSchema"]).collect()
        data_schemas.update(dict(rows))

    frames = [metadata.select(*MESSAGE_COLUMNS, *_as_text(_leaves(e, envelopes.schema["_e"].dataType, "_e")))]
    for schema_id, data_schema in sorted(data_schemas.items()):
        own = envelopes.where((e["type"] == "DT") & (e["messageSchemaId"] == schema_id)).select(
            *MESSAGE_COLUMNS, from_avro(e["message"], data_schema, {"mode": "PERMISSIVE"}).alias("_r")
        )
        record_type = own.schema["_r"].dataType
        assert isinstance(record_type, StructType)
        r = F.col("_r")
        order = sorted(record_type.fields, key=lambda f: f.name != "headers")  # headers (op, position, time) first
        leaves = [leaf for f in order for leaf in _leaves(r[f.name], f.dataType, f"_r.{f.name}")]
        frames.append(own.select(*MESSAGE_COLUMNS, *_as_text(leaves)))
    union = functools.reduce(DataFrame.unionByName, frames)
    how = (
        f"from_avro(value, envelope schema), MD records read on the driver, per data schema id ({len(data_schemas)}) "
        "from_avro(message, its dataSchema), leaves as text"
    )
    return union, f"{how}, {len(MESSAGE_COLUMNS)} Kafka columns + {LEAVES} record leaves"


def _noop(frame: DataFrame) -> float:
    started = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def measure(
    spark: SparkSession, workload: Workload, repeats: int = 3, log: Callable[[str], None] = print
) -> DecodeResult:
    """Times the format's decoder and the baseline on the workload's messages."""
    name = workload.spec.format
    messages = message_frame(spark, workload.path)
    try:
        decoded = decode_batch(get_format(name), messages, workload.format_options)
        baseline, description = baseline_frame(spark, messages, name, workload.format_options)
        # Counted on a local checkpoint, as the pipeline does: a filter pushed into the decoder's projections makes
        # the optimizer inline them without bound for the Avro formats (cdclake.dlq._materialised).
        dead = decoded.localCheckpoint(eager=True).where(F.col(model.ERROR).isNotNull()).count()  # also a warm-up
        _noop(baseline)
        baseline_times, decoder_times = [], []
        for _ in range(repeats):
            # Each side's frame is built anew and timed with its run, as each micro-batch does: Spark analyses and
            # optimises both plans every time, and a decoder may run Spark jobs to plan (Qlik reads its MD messages).
            started = time.perf_counter()
            baseline = baseline_frame(spark, messages, name, workload.format_options)[0]
            baseline_times.append(time.perf_counter() - started + _noop(baseline))
            started = time.perf_counter()
            decoded = decode_batch(get_format(name), messages, workload.format_options)
            decoder_times.append(time.perf_counter() - started + _noop(decoded))
        result = DecodeResult(name, workload.messages, min(baseline_times), min(decoder_times), description, dead)
        log(
            f"decode {name}: {result.decoder_rate:,.0f} msg/s vs baseline {result.baseline_rate:,.0f} msg/s "
            f"({workload.messages:,} messages, {dead} dead letters; baseline: {description})"
        )
        return result
    finally:
        messages.unpersist()
