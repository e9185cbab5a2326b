"""``cdclake status``: freshness per table and per Kafka partition, from the progress table."""

from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdclake.pipeline import PROGRESS
from cdclake.sinks.delta import DeltaSink
from cdclake.sources.files import location


def _lag(event_time: datetime | None, now: datetime) -> str:
    if event_time is None:
        return "-"
    seconds = (now - event_time.replace(tzinfo=event_time.tzinfo or UTC)).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def lake_status(spark: SparkSession, lake: str) -> list[tuple[str, ...]]:
    """Rows of (scope, name, events, last position, last event time, lag to now, last batch time)."""
    progress = DeltaSink(spark, lake).read_system(PROGRESS)
    if progress is None:
        return []
    summary = (
        progress.groupBy("scope", "database", "schema", "table", "topic", "partition")
        .agg(
            F.sum("events").alias("events"),
            F.max("last_position").alias("last_position"),
            F.max("last_offset").alias("last_offset"),
            F.max("last_event_time").alias("last_event_time"),
            F.max("recorded_at").alias("recorded_at"),
        )
        .orderBy("scope", "database", "schema", "table", "topic", "partition")
        .collect()
    )
    now = datetime.now(UTC)
    rows: list[tuple[str, ...]] = []
    for row in summary:
        if row["scope"] in ("table", "excluded"):
            name = ".".join(p for p in (row["database"], row["schema"], row["table"]) if p)
            position = str(row["last_position"] or "-")
        elif (file := _file_read(row["topic"], row["last_offset"])) is not None:
            name, position = file  # a file replay's stream: the file, read up to a line
        else:
            name = f"{row['topic']}[{row['partition']}]"
            position = f"offset {row['last_offset']}"
        event_time = row["last_event_time"]
        rows.append(
            (
                str(row["scope"]),
                name,
                str(row["events"]),
                position,
                "-" if event_time is None else event_time.isoformat(sep=" "),
                _lag(event_time, now),
                str(row["recorded_at"]),
            )
        )
    return rows


def _file_read(topic: str | None, offset: int | None) -> tuple[str, str] | None:
    """(file, ``line N``) of a file replay's progress row (``sources.files.location``); None for a Kafka partition."""
    found = None if topic is None or offset is None else location(topic, offset)
    return None if found is None else (found[0], f"line {found[1]}")
