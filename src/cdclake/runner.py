"""The two entry points, ``run`` (Kafka, streaming) and ``replay`` (capture files), over one Pipeline."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession

from cdclake.config import PipelineConfig
from cdclake.pipeline import BatchResult, Pipeline, PipelineSettings
from cdclake.sources import files, kafka

log = logging.getLogger(__name__)

APP_ID_FILE = "cdclake-app-id"

BatchCallback = Callable[[BatchResult], None]


def checkpoint_app_id(spark: SparkSession, checkpoint: str) -> str:
    """The idempotent-writer id stored beside the query checkpoint; created with it.

    Delta skips a commit whose (app id, batch id) it has seen. Batch ids restart at 0 with a new checkpoint, so
    the id must change with the checkpoint, or every write of the new query would be skipped silently.
    """
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
    path = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/{APP_ID_FILE}")
    fs = path.getFileSystem(hadoop_conf)
    if fs.exists(path):
        stream = fs.open(path)
        try:
            reader = jvm.java.io.BufferedReader(jvm.java.io.InputStreamReader(stream, "UTF-8"))
            return str(reader.readLine()).strip()
        finally:
            stream.close()
    app_id = f"cdclake-{uuid.uuid4()}"
    out = fs.create(path, False)
    try:
        out.write(bytearray(app_id.encode("ascii")))
    finally:
        out.close()
    return app_id


def settings_from_config(config: PipelineConfig, app_id: str) -> PipelineSettings:
    return PipelineSettings(
        lake=config.lake,
        app_id=app_id,
        default_format=config.format,
        topic_formats=dict(config.topic_formats),
        format_options={k: dict(v) for k, v in config.format_options.items()},
        keys={k: list(v) for k, v in config.keys.items()},
        tombstone_retention_seconds=int(config.tombstone_retention_hours * 3600),
        name=config.name,
    )


def run(
    spark: SparkSession,
    config: PipelineConfig,
    *,
    until_caught_up: bool = False,
    on_batch: BatchCallback | None = None,
) -> None:
    """Streams Kafka into the lake until stopped (or, with ``until_caught_up``, until all available data is in)."""
    checkpoint = config.checkpoint_location
    pipeline = Pipeline(spark, settings_from_config(config, checkpoint_app_id(spark, checkpoint)))
    messages = kafka.read_stream(spark, config.kafka.spark_options())

    def process(batch: DataFrame, batch_id: int) -> None:
        result = pipeline.process_batch(batch, batch_id)
        if on_batch is not None:
            on_batch(result)

    writer = messages.writeStream.queryName(config.name).option("checkpointLocation", checkpoint)
    if until_caught_up or config.trigger.available_now:
        writer = writer.trigger(availableNow=True)
    elif config.trigger.processing_time:
        writer = writer.trigger(processingTime=config.trigger.processing_time)
    query = writer.foreachBatch(process).start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        log.info("stopping %s", config.name)
        query.stop()


def replay(
    spark: SparkSession,
    *,
    lake: str,
    format_name: str,
    paths: Sequence[str],
    encoding: files.InputEncoding = "lines",
    keys: Mapping[str, Sequence[str]] | None = None,
    format_options: Mapping[str, str] | None = None,
    batch_lines: int = 1_000_000,
    on_batch: BatchCallback | None = None,
) -> list[BatchResult]:
    """Applies captured messages in file order, ``batch_lines`` messages per batch, through the run code path."""
    checked = files.check_files(paths)
    settings = PipelineSettings(
        lake=lake,
        app_id=f"cdclake-replay-{uuid.uuid4()}",
        default_format=format_name,
        format_options={format_name: dict(format_options or {})},
        keys={k: list(v) for k, v in (keys or {}).items()},
        name="replay",
    )
    pipeline = Pipeline(spark, settings)
    results: list[BatchResult] = []
    for index, path in enumerate(checked):
        capture = files.read_file(spark, path, index, encoding)
        for start in range(0, capture.count, batch_lines):
            result = pipeline.process_batch(capture.lines(start, start + batch_lines), len(results))
            results.append(result)
            if on_batch is not None:
                on_batch(result)
    return results
