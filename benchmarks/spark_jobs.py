"""The Spark jobs a span of work ran, read from Spark's status store and grouped by what they do; the classes Spark
compiled from generated code."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

RETAINED_JOBS: dict[str, str] = {"spark.ui.retainedJobs": "100000"}
"""A static setting for the benchmarks' own sessions: Spark's status store keeps 1,000 jobs by default, fewer than a
batch over 1,000 tables runs (about 5 per table)."""

DELTA_STATE: str = "Delta: Compute snapshot for version: N"
"""The kind of job in which Delta rebuilds a table version's state from its log (see AGENTS.md)."""


@dataclass(frozen=True)
class Job:
    kind: str
    submitted_ms: int
    seconds: float


def job_kind(description: str) -> str:
    """A job's description (or call site) without its numbers: the jobs of every table and version group together."""
    return re.sub(r"\d+", "N", description).strip()


def jobs_since(spark: SparkSession, since_ms: int) -> list[Job]:
    """The finished Spark jobs submitted at ``since_ms`` (epoch milliseconds) or later, from Spark's status store."""
    jvm: Any = spark._jvm  # the status store has no Python API
    store = spark.sparkContext._jsc.sc().statusStore()
    jobs = []
    for data in jvm.scala.jdk.javaapi.CollectionConverters.asJava(store.jobsList(None)):
        submitted, completed = data.submissionTime(), data.completionTime()
        if not submitted.isDefined() or not completed.isDefined():
            continue
        start_ms = int(submitted.get().getTime())
        if start_ms < since_ms:
            continue
        description = data.description()
        kind = job_kind(str(description.get()) if description.isDefined() else str(data.name()))
        jobs.append(Job(kind, start_ms, (int(completed.get().getTime()) - start_ms) / 1000))
    return jobs


def compiled_classes(spark: SparkSession) -> int:
    """How many classes Spark has compiled from generated code (Janino) in this JVM so far."""
    jvm: Any = spark._jvm
    return int(jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount())
