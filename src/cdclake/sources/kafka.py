"""Kafka via Spark's own Kafka source (``spark-sql-kafka-0-10``): offsets live in the query checkpoint."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession

from cdclake.formats.base import MESSAGE_COLUMNS


def read_stream(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """A streaming raw message frame from Kafka; ``options`` are Spark Kafka source options."""
    reader = spark.readStream.format("kafka")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().select(*MESSAGE_COLUMNS)
