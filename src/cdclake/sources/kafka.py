"""Kafka via Spark's own Kafka source (``spark-sql-kafka-0-10``): offsets live in the query checkpoint."""

from __future__ import annotations

import json
from collections.abc import Mapping

from py4j.protocol import Py4JJavaError
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import DataFrame, SparkSession

from cdclake.exceptions import SourceUnavailableError
from cdclake.formats.base import MESSAGE_COLUMNS, MESSAGE_HEADERS
from cdclake.spark import jvm_causes


def read_stream(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """A streaming raw message frame from Kafka, headers included; ``options`` are Spark Kafka source options."""
    reader = spark.readStream.format("kafka").option("includeHeaders", "true")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().select(*MESSAGE_COLUMNS, MESSAGE_HEADERS)


def read_batch(
    spark: SparkSession, options: Mapping[str, str], limit: int, start: Mapping[str, Mapping[str, int]] | None
) -> DataFrame:
    """Up to ``limit`` raw messages read in one batch up to the latest offsets, computed once (a local checkpoint:
    the brokers are read once). From the earliest offsets of the subscribed topics, or with ``start`` (topic ->
    partition -> offset, as a query checkpoint stores them) from there, in those partitions only. Streaming-only
    options are left out. Spark stops reading each partition at the limit."""
    skipped = {"startingOffsets", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"}
    if start is not None:
        skipped |= {"subscribe", "subscribePattern"}
    reader = spark.read.format("kafka").option("includeHeaders", "true")
    for key, value in options.items():
        if key not in skipped:
            reader = reader.option(key, value)
    if start is None:
        reader = reader.option("startingOffsets", "earliest")
    else:
        assigned = {topic: [int(p) for p in partitions] for topic, partitions in start.items()}
        reader = reader.option("assign", json.dumps(assigned)).option("startingOffsets", json.dumps(start))
    frame = reader.option("endingOffsets", "latest").load()
    try:
        return frame.select(*MESSAGE_COLUMNS, MESSAGE_HEADERS).limit(limit).localCheckpoint(eager=True)
    except (Py4JJavaError, CapturedException) as exc:
        reason = failure_reason(exc)
        if reason is None:
            raise
        raise SourceUnavailableError(
            f"cannot read Kafka at {options.get('kafka.bootstrap.servers')}: {reason}"
        ) from exc


def failure_reason(error: Exception) -> str | None:
    """The Kafka client's reason for a failed Spark call or query (e.g. ``TimeoutException: Timed out waiting for a
    node assignment``), or None when its innermost cause is not the Kafka client's."""
    causes = jvm_causes(error)
    if not causes:
        return None
    root = causes[-1]
    if not str(root.getClass().getName()).startswith("org.apache.kafka."):
        return None
    return f"{root.getClass().getSimpleName()}: {root.getMessage()}"
