"""The two entry points, ``run`` (Kafka, streaming) and ``replay`` (capture files), over one Pipeline."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from cdclake.config import PipelineConfig
from cdclake.evolve import Policy
from cdclake.exceptions import CdclakeError, SourceUnavailableError
from cdclake.formats.base import MESSAGE_COLUMNS, MESSAGE_HEADERS
from cdclake.model import KafkaOrder
from cdclake.pipeline import PENDING_TRANSACTIONS, BatchResult, Pipeline, PipelineSettings
from cdclake.sinks import TableFormat, TableProperties
from cdclake.sinks.delta import DeletionVectors
from cdclake.sinks.history import TableSelection
from cdclake.sinks.partitioning import PartitionBy
from cdclake.small_files import SmallFiles
from cdclake.sources import files, kafka
from cdclake.tables import OnlineSchemaChange, TableFilter, TableRoutes

log = logging.getLogger(__name__)

APP_ID_FILE = "cdclake-app-id"

BatchCallback = Callable[[BatchResult], None]


def checkpoint_app_id(spark: SparkSession, checkpoint: str) -> str:
    """The idempotent-writer id stored beside the query checkpoint; created with it.

    Delta skips a commit whose (app id, batch id) it has seen. Batch ids restart at 0 with a new checkpoint, so
    the id must change with the checkpoint, or every write of the new query would be skipped silently.
    """
    files = SmallFiles(spark, checkpoint)
    if files.exists(APP_ID_FILE):
        return files.read(APP_ID_FILE).strip()
    app_id = f"cdclake-{uuid.uuid4()}"
    files.write(APP_ID_FILE, app_id)
    return app_id


def _offsets_json(text: str) -> dict[str, dict[str, int]]:
    """The Kafka source offsets in an offset-log or initial-offset file (the last JSON line)."""
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("{")]
    offsets: dict[str, dict[str, int]] = json.loads(lines[-1])
    return offsets


def committed_offsets(spark: SparkSession, checkpoint: str) -> dict[str, dict[str, int]] | None:
    """Where a query with this checkpoint goes on: topic -> partition -> offset at the end of its newest committed
    batch; None for a checkpoint without a committed batch."""
    files = SmallFiles(spark, checkpoint)
    committed = files.batch_ids("commits")
    if not committed:
        return None
    return _offsets_json(files.read(f"offsets/{committed[-1]}"))


def recover_uncommitted_batch(spark: SparkSession, config: PipelineConfig, pipeline: Pipeline) -> BatchResult | None:
    """Applies the batch a crashed query had planned but not committed, exactly as Spark would re-run it.

    Why not let Spark do it: in Spark 4.1.1 (and 4.1.3) the Kafka source throws a NullPointerException while
    reporting progress for such a re-run batch (SPARK-55271 / SPARK-57438), before the batch is committed, so the
    query could never get past it. Same offsets range, same batch id, same idempotent writes; then the commit
    marker Spark itself writes, so the query resumes with the next batch.
    """
    files = SmallFiles(spark, config.checkpoint_location)
    planned, committed = files.batch_ids("offsets"), files.batch_ids("commits")
    if not planned or (committed and committed[-1] >= planned[-1]):
        return None
    batch_id = planned[-1]
    end = _offsets_json(files.read(f"offsets/{batch_id}"))
    if batch_id > 0:
        start = _offsets_json(files.read(f"offsets/{batch_id - 1}"))
    else:
        start = _offsets_json(files.read("sources/0/0"))
    for topic, partitions in end.items():  # partitions that appeared during the batch start at the beginning
        for partition in partitions:
            start.setdefault(topic, {}).setdefault(partition, -2)
    options = {
        k: v
        for k, v in config.kafka.spark_options().items()
        if k not in ("startingOffsets", "maxOffsetsPerTrigger", "subscribe", "subscribePattern")
    }
    reader = spark.read.format("kafka").options(**options)  # with includeHeaders (KafkaConfig.spark_options)
    reader = reader.option("assign", json.dumps({t: [int(p) for p in ps] for t, ps in end.items()}))
    messages = reader.option("startingOffsets", json.dumps(start)).option("endingOffsets", json.dumps(end)).load()
    log.warning("re-applying batch %s that the previous run planned but did not commit", batch_id)
    result = pipeline.process_batch(messages.select(*MESSAGE_COLUMNS, MESSAGE_HEADERS), batch_id)
    files.write(f"commits/{batch_id}", 'v1\n{"nextBatchWatermarkMs":0}')
    return result


def settings_from_config(config: PipelineConfig, app_id: str) -> PipelineSettings:
    return PipelineSettings(
        lake=config.lake,
        app_id=app_id,
        default_format=config.format,
        topic_formats=dict(config.topic_formats),
        format_options={k: dict(v) for k, v in config.format_options.items()},
        tables=config.tables.table_filter(),
        routes=config.table_routes(),
        keys={k: list(v) for k, v in config.keys.items()},
        tombstone_retention_seconds=int(config.tombstone_retention_hours * 3600),
        name=config.name,
        ddl_policy=config.ddl.policy,
        ddl_table_policies=dict(config.ddl.tables),
        online_schema_change=config.ddl.online(),
        sequence_by=dict(config.sequence_by),
        column_types={table: dict(columns) for table, columns in config.column_types.items()},
        changelog=config.history.changelog,
        scd2=config.history.scd2,
        transaction_consistent=config.transactions.consistent,
        transaction_max_open_seconds=config.transactions.max_open_seconds,
        transaction_max_pending_messages=config.transactions.max_pending_messages,
        deletion_vectors=config.deletion_vectors,
        table_format=config.table_format,
        iceberg_catalog=config.iceberg_catalog,
        table_properties={table: dict(properties) for table, properties in config.table_properties.items()},
        partition_by={table: list(fields) for table, fields in config.partition_by.items()},
        kafka_order=config.kafka_order,
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
    recovered = recover_uncommitted_batch(spark, config, pipeline)
    if recovered is not None and on_batch is not None:
        on_batch(recovered)
    messages = kafka.read_stream(spark, config.kafka.spark_options())

    raised: list[BaseException] = []
    stop = _GracefulStop(config.name)

    def process(batch: DataFrame, batch_id: int) -> None:
        with stop.batch():
            try:
                result = pipeline.process_batch(batch, batch_id)
            except BaseException as exc:
                raised.append(exc)  # Spark reports it as the query's failure, as text: kept to raise it as it is
                raise
            if on_batch is not None:
                on_batch(result)

    writer = messages.writeStream.queryName(config.name).option("checkpointLocation", checkpoint)
    if until_caught_up or config.trigger.available_now:
        writer = writer.trigger(availableNow=True)
    elif config.trigger.processing_time:
        writer = writer.trigger(processingTime=config.trigger.processing_time)
    query = writer.foreachBatch(process).start()
    try:
        with stop.on_signals(query):
            query.awaitTermination()
        if stop.requested.is_set():
            log.warning("%s stopped; the next run goes on from its checkpoint", config.name)
    except KeyboardInterrupt:
        log.warning("%s stopped at once; the next run applies the interrupted batch again", config.name)
        with contextlib.suppress(Exception):  # the interrupted Py4J call may have left its connection unusable
            query.stop()
        raise
    except StreamingQueryException as exc:
        # The batch's own error (a SchemaChangeError of the `fail` policy names the table and the fix), or the
        # Kafka client's reason, instead of the query's wrapping of either; the checkpoint keeps the failed batch.
        if raised and isinstance(raised[-1], CdclakeError):
            raise raised[-1] from exc
        reason = kafka.failure_reason(exc)
        if reason is not None:
            raise SourceUnavailableError(
                f"cannot read Kafka at {config.kafka.bootstrap_servers}: {reason} (the stream stopped; started again, "
                "it goes on from its checkpoint)"
            ) from exc
        raise


class _GracefulStop:
    """Ctrl-C or SIGTERM (a Kubernetes pod or YARN container being stopped) while ``cdclake run`` streams: the batch
    in progress finishes, then the query stops and the run returns. A second signal stops at once (KeyboardInterrupt).

    Without it, Ctrl-C raised KeyboardInterrupt inside the Py4J call that waits for the query: that call's connection
    was left mid-answer, and stopping the query then printed some 185 lines of Py4J and foreachBatch tracebacks.
    The stop is asked from a thread of its own, between batches, because the signal arrives while the main thread
    waits in that call. Either way the lake stays exactly once: an interrupted batch is applied again by the next run.
    Signals are only caught on the main thread (Python's rule), so a library caller on another thread keeps its own.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.requested = threading.Event()
        self._running = threading.Event()
        self._query: Any = None

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        self._running.set()
        try:
            yield
        finally:
            self._running.clear()
            if self.requested.is_set():
                self._stop_query()

    @contextlib.contextmanager
    def on_signals(self, query: Any) -> Iterator[None]:
        self._query = query
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {number: signal.signal(number, self._on_signal) for number in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _on_signal(self, number: int, frame: Any) -> None:
        del frame
        if self.requested.is_set():
            raise KeyboardInterrupt
        self.requested.set()
        log.warning(
            "%s: %s received, stopping after the batch in progress (again to stop at once)",
            self.name,
            signal.Signals(number).name,
        )
        if not self._running.is_set():
            self._stop_query()

    def _stop_query(self) -> None:
        threading.Thread(target=self._query.stop, name="cdclake-stop", daemon=True).start()


def replay(
    spark: SparkSession,
    *,
    lake: str,
    format_name: str,
    paths: Sequence[str],
    encoding: files.InputEncoding = "lines",
    keys: Mapping[str, Sequence[str]] | None = None,
    format_options: Mapping[str, str] | None = None,
    tables: TableFilter | None = None,
    routes: TableRoutes | None = None,
    batch_lines: int = 1_000_000,
    on_batch: BatchCallback | None = None,
    ddl_policy: Policy = "evolve",
    ddl_table_policies: Mapping[str, Policy] | None = None,
    online_schema_change: OnlineSchemaChange | None = None,
    sequence_by: Mapping[str, str] | None = None,
    column_types: Mapping[str, Mapping[str, str]] | None = None,
    changelog: TableSelection = False,
    scd2: TableSelection = False,
    transaction_consistent: bool = False,
    deletion_vectors: DeletionVectors = "auto",
    table_format: TableFormat = "delta",
    iceberg_catalog: str | None = None,
    table_properties: TableProperties | None = None,
    partition_by: PartitionBy | None = None,
    kafka_order: KafkaOrder | None = None,
) -> list[BatchResult]:
    """Applies captured messages in file order, ``batch_lines`` lines per batch (blank lines count, but a batch
    holds at least one message), through the run code path.

    ``tables`` selects the source tables that land (see cdclake.tables; default all), ``routes`` their lake tables
    (default ``<database>/<table>``); ``online_schema_change``: gh-ost / pt-online-schema-change handling (see
    cdclake.evolve);
    ``changelog`` / ``scd2`` select the tables that get history tables (see cdclake.sinks.history);
    ``deletion_vectors`` when lake and history tables use Delta deletion vectors (see cdclake.sinks.delta.DeltaSink);
    ``column_types``: table name or pattern -> column -> the type its row events declare (see cdclake.apply.retyped);
    ``table_format`` and ``iceberg_catalog``: the lake tables' format and, for Iceberg, their catalog (see
    cdclake.sinks.iceberg); ``table_properties``: the lake tables' own properties, ``partition_by`` the partitioning of
    those it creates (see cdclake.sinks.lake_sink); ``kafka_order``: the order of changes without a position (a
    capture's lines are all partition 0, so ``timestamp`` orders records by their ``ts``, then line; see
    ``PipelineSettings.kafka_order``).

    With ``transaction_consistent``, messages of transactions still open at the end of the files stay in the
    pending table (a warning says how many). A later replay into the same lake decodes them again with its first
    batch, but each file is its own stream: they are applied once they pass the limits.
    """
    settings = file_replay_settings(
        lake=lake,
        format_name=format_name,
        keys=keys,
        format_options=format_options,
        tables=tables,
        routes=routes,
        ddl_policy=ddl_policy,
        ddl_table_policies=ddl_table_policies,
        online_schema_change=online_schema_change,
        sequence_by=sequence_by,
        column_types=column_types,
        changelog=changelog,
        scd2=scd2,
        transaction_consistent=transaction_consistent,
        deletion_vectors=deletion_vectors,
        table_format=table_format,
        iceberg_catalog=iceberg_catalog,
        table_properties=table_properties,
        partition_by=partition_by,
        kafka_order=kafka_order,
    )
    return replay_files(spark, settings, paths, encoding=encoding, batch_lines=batch_lines, on_batch=on_batch)


def file_replay_settings(
    *,
    lake: str,
    format_name: str,
    keys: Mapping[str, Sequence[str]] | None = None,
    format_options: Mapping[str, str] | None = None,
    tables: TableFilter | None = None,
    routes: TableRoutes | None = None,
    ddl_policy: Policy = "evolve",
    ddl_table_policies: Mapping[str, Policy] | None = None,
    online_schema_change: OnlineSchemaChange | None = None,
    sequence_by: Mapping[str, str] | None = None,
    column_types: Mapping[str, Mapping[str, str]] | None = None,
    changelog: TableSelection = False,
    scd2: TableSelection = False,
    transaction_consistent: bool = False,
    deletion_vectors: DeletionVectors = "auto",
    table_format: TableFormat = "delta",
    iceberg_catalog: str | None = None,
    table_properties: TableProperties | None = None,
    partition_by: PartitionBy | None = None,
    kafka_order: KafkaOrder | None = None,
) -> PipelineSettings:
    """The settings of a file replay (:func:`replay`'s, without a pipeline's configuration): its own id, and the
    name ``replay`` that every file replay records."""
    return PipelineSettings(
        lake=lake,
        app_id=f"cdclake-replay-{uuid.uuid4()}",
        default_format=format_name,
        format_options={format_name: dict(format_options or {})},
        tables=tables or TableFilter(),
        routes=routes or TableRoutes(),
        keys={k: list(v) for k, v in (keys or {}).items()},
        name="replay",
        ddl_policy=ddl_policy,
        ddl_table_policies=dict(ddl_table_policies or {}),
        online_schema_change=online_schema_change,
        sequence_by=dict(sequence_by or {}),
        column_types={table: dict(columns) for table, columns in (column_types or {}).items()},
        changelog=changelog,
        scd2=scd2,
        transaction_consistent=transaction_consistent,
        deletion_vectors=deletion_vectors,
        table_format=table_format,
        iceberg_catalog=iceberg_catalog,
        table_properties=dict(table_properties or {}),
        partition_by={table: list(fields) for table, fields in (partition_by or {}).items()},
        kafka_order=kafka_order,
    )


def replay_settings(config: PipelineConfig, format_name: str) -> PipelineSettings:
    """A pipeline configuration's settings for a replay of capture files in ``format_name`` (``cdclake replay
    --config``): its own id and name (``replay``, as every file replay records), the format's options from the
    configuration, and everything else as the pipeline has it, history tables and ``sequence_by`` included."""
    settings = settings_from_config(config, f"cdclake-replay-{uuid.uuid4()}")
    return replace(
        settings,
        name="replay",
        default_format=format_name,
        topic_formats={},
        format_options={format_name: dict(settings.format_options.get(format_name, {}))},
    )


def replay_files(
    spark: SparkSession,
    settings: PipelineSettings,
    paths: Sequence[str],
    *,
    encoding: files.InputEncoding = "lines",
    batch_lines: int = 1_000_000,
    on_batch: BatchCallback | None = None,
) -> list[BatchResult]:
    """:func:`replay` with the settings given whole (``settings.default_format`` reads every file)."""
    checked = files.check_files(paths, spark)
    lake, transaction_consistent = settings.lake, settings.transaction_consistent
    pipeline = Pipeline(spark, settings)
    results: list[BatchResult] = []
    for index, path in enumerate(checked):
        capture = files.read_file(spark, path, index, encoding)
        try:
            for start, stop in capture.batches(batch_lines):
                result = pipeline.process_batch(capture.lines(start, stop), len(results))
                results.append(result)
                if on_batch is not None:
                    on_batch(result)
        finally:
            capture.release()
    if transaction_consistent and (held := pipeline.pending_transaction_messages()):
        log.warning(
            "%s messages of source transactions without their end marker are held back in %s/_cdclake/%s",
            held,
            lake.rstrip("/"),
            PENDING_TRANSACTIONS,
        )
    return results
