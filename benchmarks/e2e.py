"""Target b: Kafka -> Delta end to end with cdclake (decode, fold, one MERGE per table per batch) against a plain
Structured Streaming append of the same Kafka messages to one Delta table, same broker, same topic, same run.

* baseline: ``readStream.format("kafka")`` (same ``maxOffsetsPerTrigger``) -> the six raw message columns ->
  ``writeStream.format("delta")`` append, ``availableNow``;
* cdclake: ``cdclake.runner.run`` with a ``PipelineConfig`` (``available_now``), as ``cdclake run`` does.

Then, for information (no target): the same cdclake run into Iceberg lake tables (``table_format: iceberg``,
:func:`iceberg_run`), outside the memory sampling of the two timed runs.

Both start from the earliest offset of the topic with their own fresh checkpoint; wall-clock time from query start to
termination. Before the timed runs, both paths run once on a small warm-up topic (JIT, code generation, first Delta
commits), so neither pays the cold start alone.
"""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from benchmarks.workload import Workload, records
from cdclake.config import KafkaConfig, PipelineConfig, TriggerConfig
from cdclake.devtools import broker
from cdclake.formats.base import MESSAGE_COLUMNS
from cdclake.pipeline import BatchResult
from cdclake.runner import run
from cdclake.sinks import TableFormat

TOPIC_PARTITIONS = 2
"""One partition per core: the Kafka source reads one task per partition."""


@dataclass
class StreamRun:
    seconds: float
    messages: int
    batches: int = 0
    steps: dict[str, float] = field(default_factory=dict)
    applied: int = 0

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


@dataclass
class EndToEndResult:
    append: StreamRun
    cdclake: StreamRun
    max_offsets_per_trigger: int
    produce_seconds: float
    topic: str
    warm_topic: str

    @property
    def ratio(self) -> float:
        return self.cdclake.rate / self.append.rate if self.append.rate else 0.0


def produce(bootstrap: str, topic: str, workload: Workload, limit: int | None = None) -> tuple[int, float]:
    """Creates ``topic`` and produces the workload's messages (keys kept, murmur2 partitioning like the Java client)."""
    broker.create_topics(bootstrap, {topic: TOPIC_PARTITIONS})
    started = time.perf_counter()
    count = broker.produce(bootstrap, topic, itertools.islice(records(workload.path), limit), timeout=120.0)
    return count, time.perf_counter() - started


def append_baseline(spark: SparkSession, bootstrap: str, topic: str, work: Path, max_offsets: int) -> StreamRun:
    """The plain Kafka -> Delta append of the raw messages."""
    target, checkpoint = work / "append" / "table", work / "append" / "checkpoint"
    shutil.rmtree(work / "append", ignore_errors=True)
    started = time.perf_counter()
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets))
        .load()
        .select(*MESSAGE_COLUMNS)
        .writeStream.format("delta")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(target))
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    rows = spark.read.format("delta").load(str(target)).count()
    return StreamRun(seconds, rows, batches=len(query.recentProgress))


def cdclake_run(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    work: Path,
    workload: Workload,
    max_offsets: int,
    on_batch: Callable[[BatchResult], None] | None = None,
    table_format: TableFormat = "delta",
) -> StreamRun:
    """The cdclake pipeline over the topic, until caught up."""
    shutil.rmtree(work / "cdclake", ignore_errors=True)
    config = PipelineConfig(
        name="bench",
        lake=str(work / "cdclake" / "lake"),
        checkpoint=str(work / "cdclake" / "checkpoint"),
        kafka=KafkaConfig(bootstrap_servers=bootstrap, topics=[topic], max_offsets_per_trigger=max_offsets),
        format=workload.spec.format,
        format_options={workload.spec.format: workload.format_options} if workload.format_options else {},
        keys=workload.keys,
        trigger=TriggerConfig(available_now=True),
        table_format=table_format,
    )
    result = StreamRun(0.0, 0)

    def collect(batch: BatchResult) -> None:
        result.batches += 1
        result.messages += batch.messages
        result.applied += sum(batch.applied.values())
        for step, seconds in batch.seconds.items():
            result.steps[step] = result.steps.get(step, 0.0) + seconds
        if on_batch is not None:
            on_batch(batch)

    started = time.perf_counter()
    run(spark, config, until_caught_up=True, on_batch=collect)
    result.seconds = time.perf_counter() - started
    return result


def measure(
    spark: SparkSession,
    bootstrap: str,
    workload: Workload,
    work: Path,
    max_offsets: int,
    log: Callable[[str], None] = print,
) -> EndToEndResult:
    """Produces the workload to a new topic (the broker is fresh), then times the append and the cdclake run."""
    topic, warm_topic = f"bench-e2e-{workload.spec.events}", f"bench-warm-{workload.spec.events}"
    produce(bootstrap, warm_topic, workload, limit=2000)
    append_baseline(spark, bootstrap, warm_topic, work / "warm", max_offsets)
    cdclake_run(spark, bootstrap, warm_topic, work / "warm", workload, max_offsets)
    produced, produce_seconds = produce(bootstrap, topic, workload)
    log(f"e2e: produced {produced:,} messages in {produce_seconds:.1f} s to {topic} ({TOPIC_PARTITIONS} partitions)")
    append = append_baseline(spark, bootstrap, topic, work, max_offsets)
    log(f"e2e: plain append {append.messages:,} messages in {append.seconds:.1f} s = {append.rate:,.0f} msg/s")

    def progress(batch: BatchResult) -> None:
        steps = " ".join(f"{k}={v:.1f}" for k, v in batch.seconds.items())
        log(f"e2e:   batch {batch.batch_id}: {batch.messages:,} events, {len(batch.applied)} tables; {steps}")

    pipeline = cdclake_run(spark, bootstrap, topic, work, workload, max_offsets, on_batch=progress)
    log(f"e2e: cdclake {pipeline.messages:,} events in {pipeline.seconds:.1f} s = {pipeline.rate:,.0f} events/s")
    return EndToEndResult(append, pipeline, max_offsets, produce_seconds, topic, warm_topic)


def iceberg_run(
    spark: SparkSession,
    bootstrap: str,
    workload: Workload,
    work: Path,
    measured: EndToEndResult,
    log: Callable[[str], None] = print,
) -> StreamRun:
    """The cdclake run of :func:`measure` again, into Iceberg lake tables (after its own warm-up)."""
    max_offsets = measured.max_offsets_per_trigger
    cdclake_run(
        spark, bootstrap, measured.warm_topic, work / "warm-iceberg", workload, max_offsets, table_format="iceberg"
    )
    result = cdclake_run(
        spark, bootstrap, measured.topic, work / "iceberg", workload, max_offsets, table_format="iceberg"
    )
    log(
        f"e2e: cdclake into Iceberg tables {result.messages:,} events in {result.seconds:.1f} s "
        f"= {result.rate:,.0f} events/s"
    )
    return result
