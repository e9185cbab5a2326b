"""Target c: what one batch costs as the number of tables it touches grows, with the same total events.

For each table count T, one workload of ``2 * events`` changes over T tables is split in two batches by offset and
applied with ``Pipeline.process_batch`` (no Kafka, no streaming: the per-table cost alone). The first batch creates
the tables and is reported separately; the second, timed batch touches the same T existing tables, as a steady-state
micro-batch does. Per-step seconds come from ``BatchResult.seconds``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks.workload import WorkloadSpec, materialize, message_frame
from cdclake.pipeline import Pipeline, PipelineSettings


@dataclass
class ScalingPoint:
    tables: int
    events: int
    messages: int
    seconds: float
    first_batch_seconds: float
    steps: dict[str, float] = field(default_factory=dict)
    tables_applied: int = 0


def measure_point(spark: SparkSession, spec: WorkloadSpec, work: Path) -> ScalingPoint:
    workload = materialize(spec)
    messages = message_frame(spark, workload.path)
    lake = work / f"scaling-{spec.tables}"
    shutil.rmtree(lake, ignore_errors=True)
    try:
        half = workload.messages // 2
        first = messages.where(F.col("offset") < half)
        second = messages.where(F.col("offset") >= half)
        settings = PipelineSettings(
            lake=str(lake),
            app_id=f"bench-scaling-{spec.tables}",
            default_format=spec.format,
            format_options={spec.format: workload.format_options},
            keys=workload.keys,
            name="bench-scaling",
        )
        pipeline = Pipeline(spark, settings)
        started = time.perf_counter()
        pipeline.process_batch(first, 0)
        first_seconds = time.perf_counter() - started
        started = time.perf_counter()
        result = pipeline.process_batch(second, 1)
        seconds = time.perf_counter() - started
        return ScalingPoint(
            tables=spec.tables,
            events=spec.events // 2,
            messages=result.messages,
            seconds=seconds,
            first_batch_seconds=first_seconds,
            steps=dict(result.seconds),
            tables_applied=len(result.applied),
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
        spec = WorkloadSpec(
            format=format_name,
            events=2 * events_per_batch,
            tables=tables,
            # The same share of updates per key whatever T: each table's key pool fits its share of the changes.
            keys_per_table=max(16, events_per_batch // tables),
        )
        point = measure_point(spark, spec, work)
        steps = " ".join(f"{k}={v:.2f}" for k, v in point.steps.items())
        log(
            f"scaling {tables} tables: batch of {point.messages:,} events in {point.seconds:.1f} s "
            f"({point.tables_applied} tables applied; first batch, creating them: {point.first_batch_seconds:.1f} s); "
            f"{steps}"
        )
        points.append(point)
    return points
