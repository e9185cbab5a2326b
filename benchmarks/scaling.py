"""Target c: what one batch costs as the number of tables it touches grows, with the same total events.

For each table count T, one workload of ``(1 + TIMED_BATCHES) * events`` changes over T tables is split in batches
by offset and applied with ``Pipeline.process_batch`` (no Kafka, no streaming: the per-table cost alone). The first
batch creates the tables and is reported separately; the next ones touch the same T existing tables, as steady-state
micro-batches do, and the point's figure is their median. One timed batch swung with warm-up and the shared machine:
the 100-to-1 ratio read 4.6x to 11.0x in runs of the same commit. Per-step seconds come from ``BatchResult.seconds``
of the median batch, and so do its Spark jobs per table (Spark's status store): what a table costs is mostly Delta's
jobs for its MERGE, among them the rebuild of the table version's state (``python -m benchmarks.anatomy`` breaks a
batch down further).
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.spark_jobs import DELTA_STATE, jobs_since
from benchmarks.workload import Workload, WorkloadSpec, materialize, message_frame
from cdclake.pipeline import Pipeline, PipelineSettings

TIMED_BATCHES = 3
"""Steady-state batches timed per table count; the point's figure is their median."""


@dataclass
class ScalingPoint:
    tables: int
    events: int
    messages: int
    seconds: float
    """Median of the timed batches."""
    first_batch_seconds: float
    steps: dict[str, float] = field(default_factory=dict)
    """Per-step seconds of the median batch."""
    tables_applied: int = 0
    batch_seconds: list[float] = field(default_factory=list)
    """Every timed batch, in order."""
    jobs: Counter[str] = field(default_factory=Counter)
    """Spark jobs of the median batch by kind (:func:`benchmarks.spark_jobs.job_kind`)."""

    @property
    def jobs_per_table(self) -> float:
        return sum(self.jobs.values()) / self.tables

    @property
    def state_rebuilds_per_table(self) -> float:
        """Delta's rebuilds of a table version's state from its log in the median batch, per table."""
        return self.jobs[DELTA_STATE] / self.tables


def workload_spec(
    tables: int, events_per_batch: int, batches: int = 1 + TIMED_BATCHES, format_name: str = "dataworks-json"
) -> WorkloadSpec:
    """The workload of ``batches`` batches of ``events_per_batch`` events over ``tables`` tables."""
    return WorkloadSpec(
        format=format_name,
        events=batches * events_per_batch,
        tables=tables,
        # The same share of updates per key whatever T: each table's key pool fits its share of the changes.
        keys_per_table=max(16, events_per_batch // tables),
    )


def scaling_pipeline(
    spark: SparkSession, workload: Workload, lake: Path, app_id: str, history: Sequence[str] = ()
) -> Pipeline:
    """A pipeline applying the workload's messages to ``lake``, as the scaling benchmark runs it; with the
    ``history`` tables (``changelog``, ``scd2``) of every table too, if any are named."""
    settings = PipelineSettings(
        lake=str(lake),
        app_id=app_id,
        default_format=workload.spec.format,
        format_options={workload.spec.format: workload.format_options},
        keys=workload.keys,
        name="bench-scaling",
        changelog="changelog" in history,
        scd2="scd2" in history,
    )
    return Pipeline(spark, settings)


def cut(messages: DataFrame, count: int, batches: int) -> list[DataFrame]:
    """The ``count`` messages of a message frame (offsets 0 to count - 1) cut by offset into ``batches`` batches."""
    size = -(-count // batches)
    offset = F.col("offset")
    return [messages.where((offset >= index * size) & (offset < (index + 1) * size)) for index in range(batches)]


def measure_point(spark: SparkSession, spec: WorkloadSpec, work: Path) -> ScalingPoint:
    workload = materialize(spec)
    lake = work / f"scaling-{spec.tables}"
    shutil.rmtree(lake, ignore_errors=True)
    messages = message_frame(spark, workload.path)
    try:
        pipeline = scaling_pipeline(spark, workload, lake, f"bench-scaling-{spec.tables}")
        timed = []
        first_seconds = 0.0
        for index, batch in enumerate(cut(messages, workload.messages, 1 + TIMED_BATCHES)):
            since_ms = int(time.time() * 1000)
            started = time.perf_counter()
            result = pipeline.process_batch(batch, index)
            seconds = time.perf_counter() - started
            if index == 0:
                first_seconds = seconds
            else:
                # Read after the timing: a few Py4J calls per job.
                timed.append((seconds, result, Counter(job.kind for job in jobs_since(spark, since_ms))))
        seconds, result, jobs = sorted(timed, key=lambda item: item[0])[len(timed) // 2]
        return ScalingPoint(
            tables=spec.tables,
            events=spec.events // (1 + TIMED_BATCHES),
            messages=result.messages,
            seconds=seconds,
            first_batch_seconds=first_seconds,
            steps=dict(result.seconds),
            tables_applied=len(result.applied),
            batch_seconds=[s for s, _, _ in timed],
            jobs=jobs,
        )
    finally:
        messages.unpersist()
        shutil.rmtree(lake, ignore_errors=True)


def measure(
    spark: SparkSession,
    table_counts: Sequence[int],
    events_per_batch: int,
    work: Path,
    format_name: str = "dataworks-json",
    log: Callable[[str], None] = print,
) -> list[ScalingPoint]:
    points = []
    for tables in table_counts:
        point = measure_point(spark, workload_spec(tables, events_per_batch, format_name=format_name), work)
        steps = " ".join(f"{k}={v:.2f}" for k, v in point.steps.items())
        each = ", ".join(f"{seconds:.1f}" for seconds in point.batch_seconds)
        log(
            f"scaling {tables} tables: batch of {point.messages:,} events in {point.seconds:.1f} s "
            f"(median of {each} s) "
            f"({point.tables_applied} tables applied; first batch, creating them: {point.first_batch_seconds:.1f} s); "
            f"{steps}; Spark jobs per table {point.jobs_per_table:.2f}, of them Delta state rebuilds "
            f"{point.state_rebuilds_per_table:.2f}"
        )
        points.append(point)
    return points
