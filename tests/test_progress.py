"""Progress rows: rolled up on the driver from the batch summary, they equal the SQL definition over the batch's
decoded events (per table: events by op, last position and event time; per Kafka partition: last offset and
newest event time, heartbeats included; a dead letter counts only in its partition's last offset)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdclake import model
from cdclake.pipeline import PROGRESS, Pipeline, PipelineSettings
from tests.formats.golden import CASES, messages_frame, read_jsonl

pytestmark = pytest.mark.spark

SCENARIOS = ("insert", "update_split", "delete", "heartbeat", "malformed")


def _messages(spark: SparkSession) -> DataFrame:
    """Every scenario of DataWorks JSON, spread over two topics and three partitions."""
    lines = [
        line for scenario in SCENARIOS for line in read_jsonl(CASES / "dataworks-json" / f"{scenario}.input.jsonl")
    ]
    frame = messages_frame(spark, lines)
    return frame.select(
        "key",
        "value",
        F.when(F.col("offset") % 4 == 3, F.lit("other")).otherwise(F.col("topic")).alias("topic"),
        (F.col("offset") % 3).cast("int").alias("partition"),
        "offset",
        "timestamp",
    )


def _reference(events: DataFrame) -> list[dict[str, Any]]:
    """The progress rows by their definition, in Spark SQL over the decoded events."""
    # Stored first: a filter on the decoders' error column, pushed into their projections, would inline the whole
    # error expression there, which took Spark about a minute to optimise and generate code for.
    stored = events.localCheckpoint(eager=True)
    good = stored.where(F.col(model.ERROR).isNull())
    ops = F.map_from_entries(F.collect_list(F.struct("op", "n")))
    tables = (
        good.where(F.col(model.TABLE).isNotNull())
        .groupBy(model.DATABASE, model.SCHEMA, model.TABLE, model.OP)
        .agg(F.count("*").alias("n"), F.max(model.POSITION).alias("p"), F.max(model.EVENT_TIME).alias("t"))
        .groupBy(model.DATABASE, model.SCHEMA, model.TABLE)
        .agg(ops.alias("ops"), F.sum("n").alias("events"), F.max("p").alias("last_position"), F.max("t").alias("t"))
        .select(F.lit("table").alias("scope"), "database", "schema", "table", "ops", "events", "last_position", "t")
    )
    counted = (
        good.groupBy(model.TOPIC, model.PARTITION, model.OP)
        .agg(F.count("*").alias("n"), F.max(model.EVENT_TIME).alias("t"))
        .groupBy(model.TOPIC, model.PARTITION)
        .agg(ops.alias("ops"), F.sum("n").alias("events"), F.max("t").alias("t"))
    )
    # Every message read moves its partition's last offset, a dead letter's too.
    read = stored.groupBy(model.TOPIC, model.PARTITION).agg(F.max(model.OFFSET).alias("last_offset"))
    streams = read.join(counted, [model.TOPIC, model.PARTITION], "left").select(
        F.lit("stream").alias("scope"),
        "topic",
        "partition",
        F.coalesce("ops", F.create_map().cast("map<string,bigint>")).alias("ops"),
        F.coalesce("events", F.lit(0)).cast("bigint").alias("events"),
        "last_offset",
        "t",
    )
    return _rows(tables.unionByName(streams, allowMissingColumns=True))


def _rows(frame: DataFrame) -> list[dict[str, Any]]:
    columns = ["scope", "database", "schema", "table", "topic", "partition", "last_offset", "events", "ops"]
    picked = frame.select(*columns, "last_position", F.col("t").cast("string").alias("last_event_time"))
    rows = [row.asDict() for row in picked.collect()]
    return sorted(rows, key=lambda r: repr(sorted(r.items())))


def test_progress_rows_equal_their_definition(spark: SparkSession, tmp_path: Path) -> None:
    messages = _messages(spark)
    settings = PipelineSettings(lake=str(tmp_path / "lake"), app_id="progress", default_format="dataworks-json")
    pipeline = Pipeline(spark, settings)
    expected = _reference(pipeline.decode(messages))
    result = pipeline.process_batch(messages, 7)
    assert result.dead_letters > 0  # the malformed scenario: its events must not count
    progress = spark.read.format("delta").load(str(tmp_path / "lake" / "_cdclake" / PROGRESS))
    assert progress.select("pipeline", "batch_id").distinct().collect() == [("cdclake", 7)]
    actual = _rows(progress.withColumnRenamed("last_event_time", "t"))
    assert {r["scope"] for r in expected} == {"table", "stream"}
    assert len({(r["topic"], r["partition"]) for r in expected if r["scope"] == "stream"}) == 6
    assert actual == expected
    assert sum(r["events"] for r in actual if r["scope"] == "stream") == result.messages - result.dead_letters
    # A batch of dead letters only still records how far its partition was read (status showed no progress).
    bad = messages.where(F.col("offset") == 0).select("key", F.lit(b"not json").alias("value"), *messages.columns[2:])
    assert pipeline.process_batch(bad, 8).dead_letters == 1
    [where] = bad.select("topic", "partition", "offset").collect()
    read = progress.where("batch_id = 8").select("scope", "topic", "partition", "last_offset", "events").collect()
    assert [tuple(row) for row in read] == [("stream", *where, 0)]
