"""One batch of raw messages -> decoded events -> lake tables. Used by ``cdclake run`` (each Structured Streaming
micro-batch, through ``foreachBatch``) and ``cdclake replay`` (chunks of capture files), so both take one path.

Per batch, in this order (each commit idempotent for the batch, see cdclake.sinks.delta):

1. decode every message with its topic's format; events with an error -> dead letters;
2. plan the touched tables on the driver (columns, keys, truncates); create tables / add new columns;
3. events whose values do not fit an existing column's type -> dead letters (never silently NULL);
4. keyed changes -> fold per key -> gate by tombstones -> per table: truncate, then one MERGE;
   opt-in history tables (changelog, SCD2) from the unfolded changes, see cdclake.sinks.history;
5. tombstones, schema changes (DDL text as received) and progress rows.

The bookkeeping appends of steps 1-5 (dead letters, tombstones, schema changes) go to a background writer while the
lake work goes on; the batch waits for them before its progress rows, which come last (see :class:`_Bookkeeping`).

In transaction-consistent mode (``PipelineSettings.transaction_consistent``) the messages held back by the previous
batch are decoded first, together with the batch, and the messages of source transactions still open after it are
held back again instead of applied (see :meth:`Pipeline._process_complete_transactions`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import reduce
from typing import Final, TypeVar

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from cdclake import apply, model
from cdclake.config import (
    DEFAULT_TRANSACTION_MAX_OPEN_SECONDS,
    DEFAULT_TRANSACTION_MAX_PENDING_MESSAGES,
    FIXES,
    checked_column_types,
)
from cdclake.constraints import row_not_met, unmet_on_rows, violation_reason
from cdclake.ddl import TableName
from cdclake.evolve import (
    SCHEMA_CHANGES,
    Policy,
    SchemaEvent,
    SchemaEvolution,
    SharedWith,
    schema_events,
    shares_nothing,
)
from cdclake.exceptions import ConfigError
from cdclake.formats import check_options, decode_batch, decode_batch_with_metadata, get_format
from cdclake.formats.base import (
    MESSAGE_COLUMNS,
    MESSAGE_HEADERS,
    METADATA_SCHEMA,
    TableMetadata,
    collect_metadata,
    not_decoded,
    unique_metadata,
)
from cdclake.model import KafkaOrder, Op, quote
from cdclake.sinks import TableFormat, TableProperties, check_table_properties, history, lake_sink
from cdclake.sinks.delta import (
    MAX_SEGMENT_BYTES,
    POSITION_COLUMN,
    DeletionVectors,
    Txn,
    concurrently,
    in_turns,
    turn_marker,
)
from cdclake.sinks.partitioning import PartitionBy, check_partition_by
from cdclake.small_files import SmallFiles
from cdclake.spark import (
    HUGE_METHOD_LIMIT,
    JIT_HUGE_METHOD_LIMIT,
    LATERAL_ALIASES,
    avro_limit_options,
    is_local_checkpoint,
    local_frame,
    missing_avro_limits,
    pin_jvm_classes,
    release,
    release_stored_inputs,
    session_settings,
)
from cdclake.tables import (
    OnlineSchemaChange,
    PerTable,
    TableFilter,
    TableRoutes,
    sequence_by_problem,
)

log = logging.getLogger(__name__)

SNAPSHOT_PARTITIONS: Final = "spark.databricks.delta.snapshotPartitions"
"""Delta's partitions for rebuilding a table version's file list, which every MERGE of a new version starts with."""

MAX_SNAPSHOT_PARTITIONS: Final = 8


def snapshot_partitions(default_parallelism: int) -> int:
    """The Delta snapshot partitions cdclake sets on a session that has none (one spark-submit built, say).

    Delta's default is 50: each table version's log replay is then a shuffle into 50 tasks, and a micro-batch
    rebuilds one version per table it writes, lake and bookkeeping tables alike. CDC tables keep small logs (auto
    compaction bounds their file counts), so most of those tasks have nothing to do. Measured with `spark-submit
    --master local[2]` and `cdclake run` (one 269-message DataWorks batch into 3 tables, cold JVM, two runs each):
    66.5 and 63.4 s with Delta's default, 32.4 and 44.6 s with 1 partition; the embedded session (which sets 1) took
    38.4 and 38.9 s; with this rule (2 partitions there), 35.8 and 33.6 s against 30.5 s embedded. One partition
    per core, up to :data:`MAX_SNAPSHOT_PARTITIONS`, so that a large table's log replay still spreads over a
    cluster's cores. A value the session has (``--conf``) is kept."""
    return max(1, min(MAX_SNAPSHOT_PARTITIONS, default_parallelism))


SMALL_BATCH_MESSAGES: Final = 50_000
"""Batches of at most this many decoded events (``BatchResult.messages``) are applied with
:data:`SMALL_BATCH_SETTINGS`."""
SMALL_BATCH_SETTINGS: Final = {
    # Spark's interpreted projections while a small batch is applied (decoding keeps generated code). Outside
    # whole-stage code generation, every task of every stage generates Java source for its projections, predicates
    # and Delta's statistics, and strips it with regular expressions before it looks in its compiled-class cache:
    # in a JFR profile of 3-table micro-batches of ~100 messages, 83% of the executor samples were that code
    # generation. With few rows per task, interpreting them costs less; with many it costs more. Steady batches on
    # 2 cores, the apply steps (plan, fold, MERGE, bookkeeping, progress), generated -> interpreted
    # (python -m benchmarks.ab --variant generated-apply): 1,000 events over 3 tables -24% to -31% for the whole
    # batch (two runs); 25,000 events, 1 table -15%; 25,000 over 100 tables 0% (Delta's per-table MERGE overhead
    # dominates); 60,000, 1 table -2%; 100,000 over 10 tables -10%; 250,000, 1 table +25%.
    # Decoding runs many rows through each large projection and measured up to 20% slower interpreted at 20,000
    # messages, so it keeps the session's setting. The setting is internal to Spark (its switch for tests since
    # 2.4); the interpreted path is the one Spark itself takes whenever generated code fails to compile.
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
"""Session settings for the part of a small batch after decoding (restored after it)."""

KAFKA_ORDER_FILE: Final = "_cdclake/kafka_order"
"""The lake's order of events whose format carries no position (``PipelineSettings.kafka_order``), as text under the
lake; absent: ``partition``. Written before the first batch applied with ``timestamp``, so that every position of
that form in the lake's tables is covered by it: a later run by partition would take its changes as older than all of
them (``cdclake.model.kafka_position``), so the setting only ever goes from ``partition`` to ``timestamp``."""

DEAD_LETTERS = "dead_letters"
PROGRESS = "progress"
SCHEMA_CHANGE_ROW = (
    "database string, schema string, table string, op string, vendor_op string, ddl string, position string, "
    "event_time timestamp, topic string, partition int, offset bigint, outcome string, moved_to array<string>"
)


def _sub_txn(txn: Txn | None, step: str) -> Txn | None:
    """The commit marker of one step of a batch that writes the same table more than once."""
    return None if txn is None else Txn(f"{txn.app_id}/{step}", txn.version)


PENDING_TRANSACTIONS = "pending_transactions"

_MESSAGE_OF_EVENT = dict(
    zip(
        (*MESSAGE_COLUMNS, MESSAGE_HEADERS),
        (
            model.RAW_KEY,
            model.RAW_VALUE,
            model.TOPIC,
            model.PARTITION,
            model.OFFSET,
            model.KAFKA_TIMESTAMP,
            model.RAW_HEADERS,
        ),
        strict=True,
    )
)
"""Raw message column -> the canonical column that keeps it (as ``cdclake.formats.base.finish`` fills them), so
that held messages can be stored from their decoded events and decoded again later."""
_COORDINATES = list(model.MESSAGE_COORDINATES)
"""Identify one message (a list: ``DataFrame.join`` takes its columns so)."""


@dataclass(frozen=True)
class PipelineSettings:
    """What the pipeline needs to know, whatever the entry point.

    Attributes:
        lake: lake directory (local path or any Hadoop file system URI).
        app_id: idempotent-writer id; unique per checkpoint (run) or per invocation (replay).
        default_format: format of topics not listed in ``topic_formats``.
        topic_formats: topic -> format name.
        format_options: format name -> its options.
        tables: the source tables that land in the lake (see cdclake.tables); the events of the others are only
            counted, in the progress rows of scope ``excluded``.
        routes: the lake table each source table lands in (see cdclake.tables.TableRoutes; default
            ``<database>/<table>``). Events, progress and per-table settings keep the source names.
        keys: table name or pattern -> key columns, for tables whose messages carry none (or to override); the
            most specific entry that matches a table wins (see cdclake.tables.PerTable), as for every mapping here.
        tombstone_retention_seconds: how long deleted keys are remembered to reject late older events.
        name: pipeline name, recorded in bookkeeping tables.
        merge_threads: how many tables' MERGEs of a batch run concurrently.
        ddl_policy: what DDL statements do to lake tables: ``evolve``, ``ignore`` or ``fail`` (see cdclake.evolve).
        ddl_table_policies: table name or pattern -> policy, overriding ``ddl_policy``.
        online_schema_change: when set, the helper tables of online schema change tools (gh-ost,
            pt-online-schema-change) do not land, and a cut-over applies the ghost table's changes to the table
            (see cdclake.evolve); their row events are counted as excluded tables'.
        sequence_by: table name or pattern (``*``: every table) -> column whose value orders the table's changes
            instead of the format's position (see :func:`cdclake.apply.sequenced`).
        column_types: table name or pattern -> column -> Spark type its row events declare instead of the
            format's (see :func:`cdclake.apply.retyped`; types checked by :func:`cdclake.config.retype_target`).
        changelog: tables that get an append-only changelog table (see cdclake.sinks.history.TableSelection).
        scd2: tables that get an SCD type 2 history table (same selection rules).
        dead_letter_handler: when set, receives each batch's dead-letter rows (the ``dead_letters`` columns) instead
            of the ``dead_letters`` table; ``cdclake dlq replay`` records messages that fail again as replay
            outcomes, so one message is never dead-lettered twice.
        transaction_consistent: apply only complete source transactions where the format marks their boundaries;
            hold the messages of open ones back for a later batch (README "Transaction-consistent mode").
        transaction_max_open_seconds: an open transaction whose first event is older than the newest event seen
            by more than this (source event time) is applied anyway, with a warning.
        transaction_max_pending_messages: an open transaction holding back more messages than this is applied
            anyway, with a warning.
        deletion_vectors: when lake and history tables use Delta deletion vectors: ``auto``, ``always`` or
            ``never`` (see :class:`cdclake.sinks.delta.DeltaSink`).
        table_format: the lake tables' format, ``delta`` or ``iceberg`` (see cdclake.sinks.iceberg); the
            bookkeeping tables are Delta either way.
        iceberg_catalog: with ``iceberg``, a Spark catalog of the session that holds the lake tables instead of a
            Hadoop catalog at ``lake``.
        table_properties: table name or pattern -> the properties of its lake table (``delta.*`` ones, Iceberg's,
            or the lake owner's own), set when the table is created and when an existing one has other values (see
            cdclake.sinks.lake_sink).
        partition_by: table name or pattern -> the partition fields of the lake table cdclake creates for it
            (columns; for Iceberg also transforms such as ``days(created_at)``; see cdclake.sinks.partitioning).
            Existing tables keep their partitioning.
        kafka_order: how events whose format carries no position are ordered (``cdclake.model.kafka_position``):
            ``partition`` (then offset) or ``timestamp`` (the Kafka record's, then partition and offset). The lake
            records ``timestamp`` once a batch is applied with it (:data:`KAFKA_ORDER_FILE`), and keeps it: None
            takes the lake's order (``partition`` for a lake that records none); ``partition`` for a lake that
            records ``timestamp`` is a configuration error.
    """

    lake: str
    app_id: str
    default_format: str | None = None
    topic_formats: Mapping[str, str] = field(default_factory=dict)
    format_options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    tables: TableFilter = field(default_factory=TableFilter)
    routes: TableRoutes = field(default_factory=TableRoutes)
    keys: Mapping[str, Sequence[str]] = field(default_factory=dict)
    tombstone_retention_seconds: int = 7 * 24 * 3600
    name: str = "cdclake"
    merge_threads: int = 8
    # Per-table MERGEs are mostly driver-side planning and commit I/O: on 2 cores, 100 tables of one batch took
    # 72.5 s with 4 threads and 50.4 s with 8 (python -m benchmarks.ab --variant threads-8 --tables 100).
    ddl_policy: Policy = "evolve"
    ddl_table_policies: Mapping[str, Policy] = field(default_factory=dict)
    online_schema_change: OnlineSchemaChange | None = None
    sequence_by: Mapping[str, str] = field(default_factory=dict)
    column_types: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    changelog: history.TableSelection = False
    scd2: history.TableSelection = False
    dead_letter_handler: Callable[[DataFrame], None] | None = None
    transaction_consistent: bool = False
    transaction_max_open_seconds: float = DEFAULT_TRANSACTION_MAX_OPEN_SECONDS
    transaction_max_pending_messages: int = DEFAULT_TRANSACTION_MAX_PENDING_MESSAGES
    deletion_vectors: DeletionVectors = "auto"
    table_format: TableFormat = "delta"
    iceberg_catalog: str | None = None
    table_properties: TableProperties = field(default_factory=dict)
    partition_by: PartitionBy = field(default_factory=dict)
    kafka_order: KafkaOrder | None = None

    def __post_init__(self) -> None:
        check_options(self.format_options)
        # Spelled as cdclake spells types (`DECIMAL(12, 2)` -> `decimal(12,2)`), whoever built the settings.
        spelled: dict[str, dict[str, str]] = {}
        for table, columns in self.column_types.items():
            try:
                spelled[table] = checked_column_types(table, dict(columns))
            except ValueError as exc:
                raise ConfigError(f"column_types.{table}", str(exc), FIXES["column_types"]) from None
        object.__setattr__(self, "column_types", spelled)
        check_table_properties(self.table_properties, self.table_format)
        check_partition_by(self.partition_by, self.table_format)


@dataclass
class BatchResult:
    """What one batch did, for progress output."""

    batch_id: int
    messages: int = 0
    """decoded events (a message can decode to several: a Canal message's rows, a Maxwell row and its commit)."""
    dead_letters: int = 0
    """events that went to the dead letters (the table holds one row per message)."""
    excluded: int = 0
    """events of tables left out by ``PipelineSettings.tables`` (not applied, not dead-lettered)."""
    applied: dict[str, int] = field(default_factory=dict)
    """lake table path -> folded changes applied (after per-key folding)."""
    ops: dict[str, int] = field(default_factory=dict)
    """canonical op -> events decoded."""
    seconds: dict[str, float] = field(default_factory=dict)
    """step -> wall-clock seconds spent in it (for tuning and benchmarks). The background writes of the batch
    (dead letters, tombstones, schema changes, see ``_Bookkeeping``) overlap the other steps."""

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[step] = self.seconds.get(step, 0.0) + time.perf_counter() - started


@dataclass(frozen=True)
class _PendingGeneration:
    """The stored generation of held messages (transaction-consistent mode) that a batch builds on."""

    generation: int
    """Increases with each write; 0 when nothing is stored."""
    held_messages: int
    messages: DataFrame | None
    """The held raw messages; None when there are none."""


class _Bookkeeping:
    """The bookkeeping appends of one batch (dead letters, tombstones, schema changes), written in submission order
    by one background thread while the batch's lake work goes on.

    Each is a small Delta commit to a table under ``_cdclake`` that the batch's other steps do not write (a DDL
    change that records a tombstone waits for them first), mostly driver-side log I/O and job set-up, so it can
    overlap the batch's planning, folding and MERGEs. Tombstones are submitted after the MERGEs. One thread:
    two writes to the same table never race (nor do two creations of it). The batch waits for them (:meth:`join`)
    before its progress rows: a batch whose progress is recorded has all its bookkeeping recorded. Each write keeps
    its commit marker, so a re-run batch writes each once. Their seconds are counted under their own steps; the
    ``bookkeeping`` step is what the batch waited for them at the end.
    """

    def __init__(self, result: BatchResult) -> None:
        self.result = result
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdclake-bookkeeping")
        self._pending: list[Future[None]] = []

    def submit(self, step: str, write: Callable[..., None], *args: object) -> None:
        def timed_write() -> None:
            # Only this thread times these steps (the batch's thread times the others): no two updates of one key.
            with self.result.timed(step):
                write(*args)

        self._pending.append(self._pool.submit(timed_write))

    def join(self) -> None:
        """Waits for every submitted write; raises the first one's error."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def close(self) -> None:
        """Waits for the writes still running (a failed batch must not leave one racing its re-run), then stops."""
        self._pool.shutdown(wait=True)


class Pipeline:
    """Decodes and applies batches of raw messages into a lake of Delta tables."""

    def __init__(self, spark: SparkSession, settings: PipelineSettings) -> None:
        self.spark = spark
        self.settings = settings
        self.sink = lake_sink(
            spark,
            settings.lake,
            settings.table_format,
            deletion_vectors=settings.deletion_vectors,
            iceberg_catalog=settings.iceberg_catalog,
            routes=settings.routes,
            table_properties=settings.table_properties,
            partition_by=settings.partition_by,
        )
        self.history = history.HistorySink(self.sink)
        self.merge_threads = max(1, settings.merge_threads)
        self.evolution = SchemaEvolution(
            self.sink,
            settings.ddl_policy,
            settings.ddl_table_policies,
            settings.tables,
            settings.online_schema_change,
            settings.sequence_by,
        )
        # Duplicate keys inside one JSON object keep the last value (as JSON parsers do) instead of failing the
        # whole batch; it is a runtime setting, so it also applies to sessions that spark-submit created.
        spark.conf.set("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
        # Spark still writes timestamps as legacy INT96 by default; other Delta readers (delta-rs, Trino, DuckDB)
        # expect the standard TIMESTAMP_MICROS with UTC semantics.
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        # Spark 4.1 resolves a name inside a lambda (map_filter, transform...) to an alias made earlier in the same
        # select before the input column of that name: a select that gives a column a new value and then reads the
        # column in a lambda read the new value, without a word (apply._made_whole did). cdclake never means to use
        # such lateral aliases, so they are off.
        spark.conf.set(LATERAL_ALIASES, "false")
        if spark.conf.get(SNAPSHOT_PARTITIONS, None) is None:
            spark.conf.set(SNAPSHOT_PARTITIONS, str(snapshot_partitions(spark.sparkContext.defaultParallelism)))
        if spark.conf.get(HUGE_METHOD_LIMIT, None) is None:
            spark.conf.set(HUGE_METHOD_LIMIT, str(JIT_HUGE_METHOD_LIMIT))
        pin_jvm_classes(spark)  # for sessions that cdclake.spark.get_session did not make
        # get_format fails fast on unknown names.
        formats = [
            get_format(str(name)) for name in {settings.default_format, *settings.topic_formats.values()} - {None}
        ]
        avro = sorted(fmt.name for fmt in formats if fmt.encoding == "binary")
        if avro and (missing := missing_avro_limits(spark)):
            log.warning(
                "%s: the driver's JVM has no Avro limits (%s), so one corrupt length in a message can make it allocate "
                "gigabytes and fail with OutOfMemoryError. Start Spark with `--driver-java-options` and "
                "`--conf spark.executor.extraJavaOptions=` set to: %s",
                ", ".join(avro),
                ", ".join(missing),
                avro_limit_options(),
            )
        # Table definitions sent in their own messages (Qlik MD), by (format, schema id): loaded from the lake's
        # metadata table on first use, then kept up to date by decode (see _known_metadata).
        self._metadata: dict[tuple[str, str], TableMetadata] | None = None
        # The background writer of the batch being processed (set by _process), and the local checkpoints the batch
        # made after decoding, released when it ends.
        self._bookkeeping: _Bookkeeping
        self._batch_frames: list[DataFrame] = []
        # The lake's Kafka order (kafka_order), read on first use; whether it is written under the lake.
        self._kafka_order: KafkaOrder | None = None
        self._kafka_order_recorded = False
        # Per source table, the (topic, partition)s its changes without a position came from in this process, and the
        # tables warned of for coming from several (_warn_of_partitions).
        self._unpositioned_partitions: dict[tuple[str | None, str | None, str], set[tuple[str, int]]] = {}
        self._partitions_warned: set[tuple[str | None, str | None, str]] = set()
        # The source tables that wrote rows to the lake, (database, schema, table): loaded by _shared_with when needed.
        self._landed: set[tuple[str | None, str | None, str]] | None = None
        # Tables a sequence_by pattern gives a column they do not have, already warned of (_sequence_by_problem).
        self._unsequenced_warned: set[str] = set()
        self._conversions_logged: set[tuple[str, str, str]] = set()  # table id, column, declared type

    # -------------------------------------------------------------------------------------------------------------

    def decode(self, messages: DataFrame, txn: Txn | None = None, *, store: bool = True) -> DataFrame:
        """Raw messages (key, value, topic, partition, offset, timestamp, and headers if the frame has them) ->
        canonical events, with the column types of ``column_types``.

        Formats with table definitions in their own messages (``CdcFormat.metadata``, Qlik MD) first hand over the
        batch's definitions (all topics of the format), which are stored in ``<lake>/_cdclake/metadata`` (once per
        ``txn``; not with ``store`` false, for decoding that must write nothing) before the batch is decoded with
        every definition known so far, earlier batches and runs included.
        """
        settings = self.settings
        parts: list[DataFrame] = []
        listed = sorted(settings.topic_formats)
        by_format: dict[str, list[str]] = {}
        for topic in listed:
            by_format.setdefault(settings.topic_formats[topic], []).append(topic)
        for name, topics in sorted(by_format.items()):
            subset = messages.where(F.col("topic").isin(*topics))
            parts.append(self._decode_format(name, subset, txn, store))
        rest = messages.where(~F.col("topic").isin(*listed)) if listed else messages
        if settings.default_format is not None:
            parts.append(self._decode_format(settings.default_format, rest, txn, store))
        elif listed:
            # A topic that a pattern subscribes to but `topic_formats` does not name: its messages are read, so
            # they must not vanish.
            reason = (
                "no format is set for this topic: add it to topic_formats (or set format), then replay these dead "
                "letters with `cdclake dlq replay --topic TOPIC --format NAME`"
            )
            parts.append(not_decoded(rest, reason))
        if not parts:
            raise ValueError("no format configured")
        events = apply.retyped(reduce(DataFrame.unionByName, parts), settings.column_types)
        if self.kafka_order == "timestamp":
            fallback = model.kafka_position(
                F.col(model.PARTITION), F.col(model.OFFSET), timestamp=F.col(model.KAFKA_TIMESTAMP)
            )
            events = events.withColumn(model.POSITION, F.coalesce(F.col(model.POSITION), fallback))
        return events

    @property
    def kafka_order(self) -> KafkaOrder:
        """The order of events whose format carries no position: ``PipelineSettings.kafka_order``, or the lake's
        (:data:`KAFKA_ORDER_FILE`) when that is None. Raises ConfigError for ``partition`` on a lake that records
        ``timestamp``."""
        if self._kafka_order is None:
            files = SmallFiles(self.spark, self.settings.lake)
            recorded = files.read(KAFKA_ORDER_FILE).strip() if files.exists(KAFKA_ORDER_FILE) else "partition"
            self._kafka_order_recorded = recorded == "timestamp"
            wanted = self.settings.kafka_order or recorded
            if wanted == "partition" and recorded == "timestamp":
                raise ConfigError(
                    "kafka_order",
                    f"the lake {self.settings.lake} orders events without a position by their Kafka record timestamps "
                    f"(kafka_order: timestamp, recorded in {KAFKA_ORDER_FILE}); ordered by partition, every change "
                    "would be taken as older than the rows it holds, and dropped",
                    "leave `kafka_order` out (the lake's order is kept; `cdclake replay`: `--kafka-order`) or set it "
                    "to `timestamp`",
                )
            self._kafka_order = "timestamp" if wanted == "timestamp" else "partition"
        return self._kafka_order

    def _record_kafka_order(self) -> None:
        """Writes ``timestamp`` to :data:`KAFKA_ORDER_FILE` before the first batch applied with it (once)."""
        if self.kafka_order == "timestamp" and not self._kafka_order_recorded:
            SmallFiles(self.spark, self.settings.lake).write(KAFKA_ORDER_FILE, "timestamp\n")
            log.info("%s: events without a position are ordered by Kafka record time from now on", self.settings.lake)
            self._kafka_order_recorded = True

    METADATA = "metadata"
    """Bookkeeping table of the table definitions read from messages (see decode)."""

    def _decode_format(self, name: str, messages: DataFrame, txn: Txn | None, store: bool = True) -> DataFrame:
        fmt = get_format(name)
        options = self.settings.format_options.get(name, {})
        if fmt.metadata is None:
            return decode_batch(fmt, messages, options)
        known = self._known_metadata(name, collect_metadata(fmt.metadata.extract(messages, options)), txn, store)
        return decode_batch_with_metadata(fmt, messages, options, known)

    def _known_metadata(
        self, format_name: str, found: Sequence[TableMetadata], txn: Txn | None, store: bool = True
    ) -> list[TableMetadata]:
        """Every definition of ``format_name`` known after storing the new ones among ``found`` (the first stored
        definition of a schema id wins: ids are unique, re-sent definition messages are copies). Without ``store``
        the new ones are only used, neither stored nor kept."""
        if self._metadata is None:
            stored = self.sink.read_system(self.METADATA)
            rows = [] if stored is None else stored.orderBy("recorded_at").collect()
            loaded = unique_metadata(TableMetadata.from_row(row.asDict()) for row in rows)
            self._metadata = {(m.format, m.schema_id): m for m in loaded}
        new = [m for m in found if (m.format, m.schema_id) not in self._metadata]
        if new and not store:
            return [m for m in [*self._metadata.values(), *unique_metadata(new)] if m.format == format_name]
        if new:
            frame = local_frame(self.spark, [m.as_row() for m in new], METADATA_SCHEMA).select(
                "*", F.lit(self.settings.name).alias("pipeline"), F.current_timestamp().alias("recorded_at")
            )
            # One append per format and batch: a batch re-run after a crash skips it (and finds them stored).
            marker = Txn(f"{txn.app_id}/{self.METADATA}/{format_name}", txn.version) if txn else None
            self.sink.append(self.METADATA, frame, marker)
            self._metadata.update({(m.format, m.schema_id): m for m in new})
        return [m for m in self._metadata.values() if m.format == format_name]

    def process_batch(self, messages: DataFrame, batch_id: int, *, txn: bool = True) -> BatchResult:
        """Decodes and applies one batch. Safe to call again with the same ``batch_id`` after a failure."""
        marker = Txn(self.settings.app_id, batch_id) if txn else None
        self._record_kafka_order()
        if self.settings.transaction_consistent:
            return self._process_complete_transactions(messages, batch_id, marker)
        started = time.perf_counter()
        events = self._decoded(messages, marker)
        try:
            return self._process(events, batch_id, marker, decoding=time.perf_counter() - started)
        finally:
            release(events)

    def _decoded(self, messages: DataFrame, txn: Txn | None) -> DataFrame:
        """The batch's canonical events, ordered by ``sequence_by`` where configured, computed once.

        A local checkpoint rather than ``persist``: it also cuts the lineage, so the plans of the batch's concurrent
        MERGEs and history writes no longer contain the decoders' expressions. Spark canonicalises shared plan nodes
        from several threads at once when it looks up cached data, and ``from_avro`` with options is not safe
        there (its options map is evaluated through a shared builder: IndexOutOfBoundsException in
        ArrayBasedMapBuilder.put). The caller releases its blocks after the batch (``spark.release``).
        """
        decoded = apply.sequenced(self.decode(messages, txn), self.settings.sequence_by)
        # A format's batch step may have stored them already (type_nulls_in_batch): a second copy would only cost.
        if is_local_checkpoint(decoded):
            return decoded
        events = decoded.localCheckpoint(eager=True)
        # Checkpoints a batch step made on the way (one that rewrote the events, or the steps of several formats)
        # are read by nothing else: freed now rather than when the JVM collects them.
        release_stored_inputs(decoded, keep=messages)
        return events

    def _process(self, events: DataFrame, batch_id: int, txn: Txn | None, *, decoding: float) -> BatchResult:
        """Applies decoded ``events``; ``decoding``: the seconds it took to decode them (the ``decode`` step)."""
        result = BatchResult(batch_id)
        result.seconds["decode"] = decoding
        self._bookkeeping = _Bookkeeping(result)
        self._batch_frames = []
        try:
            return self._apply_batch(events, batch_id, txn, result)
        finally:
            self._bookkeeping.close()
            # After the background writes, which read them too.
            for frame in self._batch_frames:
                release(frame)

    def _apply_batch(self, events: DataFrame, batch_id: int, txn: Txn | None, result: BatchResult) -> BatchResult:
        with result.timed("decode"):
            summary = _summary(events)
        helpers = self._helper_tables(summary)
        excluded = self._excluded_tables(summary) - helpers  # a helper's statements count even when excluded
        self._warn_of_partitions(summary, excluded | helpers)
        for row in summary:
            result.messages += row["n"]
            if _table_id_of(row) in excluded or (_table_id_of(row) in helpers and row[model.OP] != Op.DDL):
                result.excluded += row["n"]
            elif row["bad"]:
                result.dead_letters += row["n"]
            else:
                result.ops[str(row[model.OP])] = result.ops.get(str(row[model.OP]), 0) + row["n"]
        if result.messages == 0:
            return result
        if excluded or helpers:
            table = F.col(model.TABLE)
            table_id = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), table)
            left_out = table_id.isin(*sorted(excluded)) if excluded else F.lit(False)
            if helpers:  # their statements are kept: the cut-over needs them (cdclake.evolve)
                left_out = left_out | (table_id.isin(*sorted(helpers)) & (F.col(model.OP) != Op.DDL.value))
            events = events.where(table.isNull() | ~left_out)
            excluded = excluded | helpers
        self._note_landed(summary, excluded)
        shared_with = self._shared_with(summary, excluded) if _clears_tables(result.ops) else shares_nothing
        self.evolution.shared_with = shared_with
        refused: list[SchemaEvent] = []
        if result.ops.get(Op.TRUNCATE.value):
            events, summary, refused = self._refuse_shared_truncates(
                events, summary, shared_with, batch_id, txn, result
            )
        small = result.messages <= SMALL_BATCH_MESSAGES
        with session_settings(self.spark, SMALL_BATCH_SETTINGS if small else {}):
            self._apply_summarised(events, summary, excluded, refused, batch_id, txn, result)
        log.info("batch %s: %s", batch_id, {k: round(v, 2) for k, v in result.seconds.items()})
        return result

    def _warn_of_partitions(self, summary: Sequence[Row], left_out: set[str]) -> None:
        """Warns once per source table whose changes without a position (Kafka-ordered: Canal, DTS Canal, Lindorm,
        Maxwell without ``output_binlog_position``...) have come from more than one Kafka partition in this process,
        under ``kafka_order: partition``: their order across partitions is then the partitions' numbers, not the
        source's (README "Ordering across Kafka partitions"). Tables of ``left_out`` (table ids) do not land."""
        if self.kafka_order != "partition":
            return
        for row in summary:
            op = row[model.OP]
            if row["bad"] or row[model.TABLE] is None or row["position"] is not None:
                continue
            if _table_id_of(row) in left_out:
                continue
            if op not in _ROW_OPS and op != Op.TRUNCATE.value:
                continue
            ident = _ident_of(row)
            if ident in self._partitions_warned:
                continue
            seen = self._unpositioned_partitions.setdefault(ident, set())
            seen.add((row[model.TOPIC], row[model.PARTITION]))
            warning = partitions_warning(ident, sorted(seen))
            if warning is not None:
                self._partitions_warned.add(ident)
                log.warning("%s", warning)

    def _excluded_tables(self, summary: Sequence[Row]) -> set[str]:
        """The batch's tables that ``settings.tables`` leaves out, by :func:`cdclake.apply.table_id`: decided once
        per table on the driver, so that the filter is a plain ``IN`` list for Spark."""
        tables = self.settings.tables
        if tables.selects_all:
            return set()
        found = {(row[model.DATABASE], row[model.SCHEMA], row[model.TABLE]) for row in summary}
        return {apply.table_id_of(*ident) for ident in found if ident[2] is not None and not tables.admits(*ident)}

    def _helper_tables(self, summary: Sequence[Row]) -> set[str]:
        """The batch's tables that are helper tables of an online schema change (``online_schema_change``), by
        :func:`cdclake.apply.table_id`; their row events do not land."""
        online = self.settings.online_schema_change
        if online is None:
            return set()
        found = {_ident_of(row) for row in summary if online.is_helper(row[model.TABLE])}
        return {apply.table_id_of(*ident) for ident in found}

    def _note_landed(self, summary: Sequence[Row], excluded: set[str]) -> None:
        """Adds the batch's landed source tables to :attr:`_landed`, once that is loaded (see :meth:`_shared_with`)."""
        if self._landed is not None:
            self._landed |= {
                _ident_of(row)
                for row in summary
                if row[model.OP] in _ROW_OPS and not row["bad"] and _table_id_of(row) not in excluded
            }

    def _shared_with(self, summary: Sequence[Row], excluded: set[str]) -> SharedWith:
        """Which other source table has rows in a source table's lake table (tables of one name in several schemas
        of a database share one, see README "What lands in the lake"): (database, schema, table) -> that table's
        name, or None.

        From the tables the progress table names with row changes, read on the first batch that may clear a table,
        then kept up to date from each batch's summary (the progress table grows by a row per table and batch)."""
        if self._landed is None:
            stored = self.sink.read_system(PROGRESS)
            with_rows = F.arrays_overlap(F.map_keys("ops"), F.array(*map(F.lit, sorted(_ROW_OPS))))
            known = (
                []
                if stored is None
                else stored.where((F.col("scope") == "table") & with_rows).select(*_IDENT).distinct().collect()
            )
            self._landed = {(r[0], r[1], r[2]) for r in known}
            self._note_landed(summary, excluded)
        by_path: dict[str, list[tuple[str | None, str | None, str]]] = {}
        for ident in sorted(self._landed, key=lambda i: tuple(part or "" for part in i)):
            by_path.setdefault(self.sink.table_path(*ident), []).append(ident)

        def shared_with(database: str | None, schema: str | None, table: str) -> str | None:
            members = by_path.get(self.sink.table_path(database, schema, table), [])
            other = next((m for m in members if m != (database, schema, table)), None)
            return None if other is None else ".".join(part for part in other if part)

        return shared_with

    def _refuse_shared_truncates(
        self,
        events: DataFrame,
        summary: Sequence[Row],
        shared_with: SharedWith,
        batch_id: int,
        txn: Txn | None,
        result: BatchResult,
    ) -> tuple[DataFrame, list[Row], list[SchemaEvent]]:
        """TRUNCATE events of a source table whose lake table also holds another source table's rows become dead
        letters: the lake rows do not say which source table wrote them, so the truncate would delete the other
        table's rows too. Returns the other events, the summary with the refused ones marked bad, and the refused
        ones to record in ``schema_changes`` (with the reason as their outcome)."""
        reasons: dict[str, str] = {}
        refused: list[Row] = []
        for row in summary:
            if row[model.OP] == Op.TRUNCATE and not row["bad"] and row[model.TABLE] is not None:
                ident = _ident_of(row)
                other = shared_with(*ident)
                if other is not None:
                    name = ".".join(part for part in ident if part)
                    reasons[apply.table_id_of(*ident)] = (
                        f"TRUNCATE of {name} not applied: its lake table also holds the rows of {other}, "
                        "which it would delete"
                    )
                    refused.append(row)
        if not reasons:
            return events, list(summary), []
        table_id = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE))
        reason: Column = F.lit(None).cast("string")
        for refused_id, text in reasons.items():
            reason = F.when(table_id == F.lit(refused_id), F.lit(text)).otherwise(reason)
        reason = F.when(F.col(model.OP) == Op.TRUNCATE.value, reason)
        refused_events = events.where(reason.isNotNull())
        self._dead_letters(refused_events, reason, batch_id, _sub_txn(txn, "shared"))
        recorded = schema_events(refused_events)
        for event in recorded:
            ident = event.row[model.DATABASE], event.row[model.SCHEMA], event.row[model.TABLE]
            event.outcome = f"dead letter: {reasons[apply.table_id_of(*ident)]}"
        count = sum(row["n"] for row in refused)
        result.dead_letters += count
        result.ops[Op.TRUNCATE.value] -= count
        marked = [Row(**{**row.asDict(), "bad": True}) if row in refused else row for row in summary]
        return events.where(reason.isNull()), marked, recorded

    def _apply_summarised(
        self,
        events: DataFrame,
        summary: Sequence[Row],
        excluded: set[str],
        refused: Sequence[SchemaEvent],
        batch_id: int,
        txn: Txn | None,
        result: BatchResult,
    ) -> None:
        """Everything after decoding: dead letters, DDL, row changes, history, bookkeeping and progress.
        ``refused``: TRUNCATE events already dead-lettered, to record in ``schema_changes`` with the rest."""
        if result.dead_letters:
            self._dead_letters(events.where(F.col(model.ERROR).isNotNull()), F.col(model.ERROR), batch_id, txn)
        good = events.where(F.col(model.ERROR).isNull())

        collected: list[SchemaEvent] = []
        if result.ops.get(Op.DDL.value) or result.ops.get(Op.TRUNCATE.value):
            with result.timed("ddl"):
                collected = self.evolution.collect(good)
        steps = [e for e in collected if e.changes]
        self._apply_around_ddl(good, steps, self._sharing_lake_tables(summary, steps), batch_id, txn, result)
        if collected or refused:
            recorded = sorted([*collected, *refused], key=lambda e: e.order)
            self._schema_changes(good, recorded, batch_id, txn, result)
        with result.timed("bookkeeping"):
            self._bookkeeping.join()
        with result.timed("progress"):
            self._progress(summary, excluded, batch_id, txn)
        if batch_id % 100 == 0:
            with result.timed("expire_tombstones"):
                self.sink.expire_tombstones(self.settings.tombstone_retention_seconds)

    def _sharing_lake_tables(self, summary: Sequence[Row], steps: Sequence[SchemaEvent]) -> set[str]:
        """The tables that the batch's DDL ``steps`` change, by :func:`cdclake.apply.table_id`, with the batch's other
        source tables that land in the same lake tables (``routes``, one name in several schemas)."""
        if not steps:
            return set()
        changed = SchemaEvolution.affected_table_ids(steps)
        paths = {self.sink.table_path(*apply.split_table_id(table_id)) for table_id in changed}
        sharing = {
            apply.table_id_of(*ident)
            for ident in {_ident_of(row) for row in summary if row[model.TABLE] is not None}
            if self.sink.table_path(*ident) in paths
        }
        return changed | sharing

    def _apply_around_ddl(
        self,
        good: DataFrame,
        steps: Sequence[SchemaEvent],
        affected_ids: set[str],
        batch_id: int,
        txn: Txn | None,
        result: BatchResult,
    ) -> None:
        """Applies the batch's row events; for the ``affected_ids`` tables, whose lake tables a DDL statement of the
        batch changes, in segments: the rows ordered before the statement, the statement, the rows after it (each
        step with its own commit marker). The other tables' rows go with the first segment (the batch's marker):
        nothing of theirs waits for a statement, and a round of planning, folding and MERGEs of its own cost them
        about a second (rendered streams of 3 tables with an added column, second batch: the seconds of its steps
        summed, 10.0 -> 8.8)."""
        if not steps:
            self._apply_events(good, batch_id, txn, result)
            return
        # A statement has its log position only; a sequence_by row change's order is `value|position`, and only its
        # log part says whether the log wrote it before or after the statement.
        order = apply.log_order(apply.effective_order(good))
        affected = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE)).isin(
            *sorted(affected_ids)
        )
        for index, step in enumerate(steps):
            segment = affected & (order <= F.lit(step.order))
            if index == 0:
                rows, marker = segment | ~affected, txn
            else:
                rows, marker = segment & (order > F.lit(steps[index - 1].order)), _sub_txn(txn, f"ddl{index}/rows")
            self._apply_events(good.where(rows), batch_id, marker, result)
            with result.timed("ddl"):
                # A dropped or truncated table is remembered in the tombstones table, which the background writer
                # may be appending to (and creating): one writer at a time.
                self._bookkeeping.join()
                self.evolution.apply_event(step, _sub_txn(txn, f"ddl{index}/change"))
            self._history_of_cleared_tables(good, step, _sub_txn(txn, f"ddl{index}/history"), result)
        after_last = affected & (order > F.lit(steps[-1].order))
        self._apply_events(good.where(after_last), batch_id, _sub_txn(txn, "ddl/rows"), result)

    def _apply_events(self, good: DataFrame, batch_id: int, txn: Txn | None, result: BatchResult) -> None:
        """Plan, create/evolve tables, dead-letter misfits, then fold, gate and merge the row changes."""
        with result.timed("plan"):
            # Tables with only DDL events here are created by their statements (cdclake.evolve), not empty.
            plans = [
                p
                for p in apply.plan_tables(good, self.settings.keys, self.settings.sequence_by)
                if p.row_events or p.truncate_order
            ]
            good = self._in_position_order(good, plans)
            table_columns, constraints = self._ensure_tables(plans)
        for plan in plans:
            if plan.unknown_old_key_events:
                ident = (plan.database, plan.schema, plan.table)
                log.warning(unknown_old_key_warning(ident, plan.unknown_old_key_events, plan.key_columns))
        with result.timed("types"):
            self.evolution.reconcile_types(plans, table_columns, txn)
            self._latest_columns_of_shared_tables(plans, table_columns)
            good = self._in_lake_spelling(good, plans, table_columns)
            good = self._in_lake_types(good, plans, table_columns)

        misfit, unchecked = self._misfit_reason(plans, table_columns, constraints, good)
        if misfit is not None:
            with result.timed("misfit"):
                bad = good.where(misfit.isNotNull())
                extra = bad.count()
                if extra:
                    self._dead_letters(bad, misfit, batch_id, _sub_txn(txn, _misfit_marker(constraints)))
                    result.dead_letters += extra
                good = good.where(misfit.isNull())
        # The rows that partial images write keep stored values the events do not carry, and some conditions cannot
        # be read off an image: such tables' rows are checked as the MERGE would write them.
        written = [p for p in plans if constraints.get(p.table_id) and (p.partial_events or p.table_id in unchecked)]
        if written:
            with result.timed("misfit"):
                good = self._refuse_rows_not_meeting_constraints(
                    good, written, table_columns, constraints, batch_id, txn, result
                )

        made_whole = self._apply_rows(good, plans, table_columns, txn, result) if plans else None
        self._history(good, plans, table_columns, txn, result, made_whole)

    def _in_position_order(self, events: DataFrame, plans: Sequence[apply.TablePlan]) -> DataFrame:
        """``events`` with the row changes of the tables that a ``sequence_by`` pattern names a column they have
        neither in the lake nor in the batch ordered by their position only (``apply.log_order``), and those plans
        without the column: such a table keeps the format's order, as the warning of
        :meth:`_sequence_by_problem` says. ``apply.sequenced`` gave their changes the order of a NULL value
        (``<NULL key>|position``), which a lake table written before the pattern, by bare positions, would have
        compared with them as text (``DeltaSink.ordering_conflict`` would refuse them instead)."""
        unsequenced: list[str] = []
        for plan in plans:
            ident = (plan.database, plan.schema, plan.table)
            names = [name for name, _ in plan.columns]
            if plan.sequence_column is None or sequence_by_problem(self.settings.sequence_by, ident, names) is None:
                continue
            stored = [name for name, _ in self.sink.columns(*ident) or []]
            problem = sequence_by_problem(self.settings.sequence_by, ident, names + stored)
            if problem is not None and problem.warning_only:
                plan.sequence_column = None
                unsequenced.append(plan.table_id)
        if not unsequenced:
            return events
        table = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE))
        position = F.col(model.POSITION)
        return events.withColumn(
            model.POSITION, F.when(table.isin(*unsequenced), apply.log_order(position)).otherwise(position)
        )

    def _in_lake_spelling(
        self, good: DataFrame, plans: Sequence[apply.TablePlan], table_columns: Mapping[str, list[tuple[str, str]]]
    ) -> DataFrame:
        """``good`` with the row events' column names spelt as their lake table spells them, where a message spells
        one in another case (the source renamed `code` to `CODE`, shards of one lake table differ). Delta and Iceberg
        match column names case-insensitively, so the lake keeps one column; images are read by exact names, so
        without this every value of such a column read NULL: rows were written with NULL keys and values.
        Nothing to do, and nothing computed, when every message spells the columns as the lake does."""
        respelt: dict[str, dict[str, str]] = {}
        for plan in plans:
            lake = {name.lower(): name for name, _ in table_columns[plan.table_id]}
            renames = {n: lake[n.lower()] for n in plan.declared_names if lake.get(n.lower(), n) != n}
            if renames:
                respelt[plan.table_id] = renames
                # The messages' own keys are respelt with their images. Configured keys are not: they are read as
                # written, and must name the lake's spelling (_misfit_reason says so).
                if PerTable.of(self.settings.keys).value_for(plan.database, plan.schema, plan.table) is None:
                    plan.key_columns = [renames.get(key, key) for key in plan.key_columns]
        if not respelt:
            return good
        log.info("column names spelt as their lake tables spell them: %s", respelt)
        # One lookup per name, however many are respelt: table id, separator and message name -> the lake's name.
        # (Identifiers hold no control characters: formats.base refuses them.)
        lake_names = F.create_map(
            *(
                F.lit(text)
                for table_id, renames in sorted(respelt.items())
                for message_name, lake_name in sorted(renames.items())
                for text in (table_id + _KEY_SEP + message_name, lake_name)
            )
        )
        this_table = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE))
        of_table = F.concat(this_table, F.lit(_KEY_SEP))

        def in_lake(name: Column) -> Column:
            return F.coalesce(F.element_at(lake_names, F.concat(of_table, name)), name)

        return self._with_row_columns(
            good,
            {
                model.BEFORE: F.transform_keys(model.BEFORE, lambda k, _v: in_lake(k)),
                model.AFTER: F.transform_keys(model.AFTER, lambda k, _v: in_lake(k)),
                model.COLUMNS: F.transform(model.COLUMNS, lambda c: c.withField("name", in_lake(c["name"]))),
                model.KEY_COLUMNS: F.transform(model.KEY_COLUMNS, in_lake),
            },
        )

    def _in_lake_types(
        self, good: DataFrame, plans: Sequence[apply.TablePlan], table_columns: Mapping[str, list[tuple[str, str]]]
    ) -> DataFrame:
        """``good`` with the values that row events declare as one kind of timestamp and their lake table's column
        holds as the other (after :meth:`Evolution.reconcile_types` retyped what it could) converted at UTC
        (:func:`model.converted_text`), and their declared types (the plans' too) the column's. Without it every
        such value was a dead letter: a lake table made by hand with a TIMESTAMP column for a MySQL DATETIME took
        no row. Nothing computed when no table needs it."""
        conversions: list[tuple[Column, str, str, str]] = []  # events, lake column, declared type, lake type
        this_table = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE))
        for plan in plans:
            for name, stored in table_columns[plan.table_id]:
                declared = plan.declared_types.get(name.lower(), set())
                for kind in sorted(t for t in declared if model.converts_to(t, stored)):
                    conversions.append(((this_table == plan.table_id) & _declares(name, kind), name, kind, stored))
                    if (plan.table_id, name, kind) not in self._conversions_logged:  # once per run
                        self._conversions_logged.add((plan.table_id, name, kind))
                        log.info("%s: %s values of column %s written as %s (at UTC)", plan.table, kind, name, stored)
                    declared.discard(kind)
                    declared.add(stored)
        if not conversions:
            return good

        def converted(image: str) -> Column:
            def value(key: Column, text: Column) -> Column:
                result = text
                for events, name, kind, stored in conversions:
                    result = F.when(events & (key == name), model.converted_text(text, kind, stored)).otherwise(result)
                return result

            return F.transform_values(image, value)

        def declared_as_stored(column: Column) -> Column:
            spark_type = column["spark_type"]
            for events, name, kind, stored in conversions:
                spark_type = F.when(events & (column["name"] == name) & (spark_type == kind), stored).otherwise(
                    spark_type
                )
            return column.withField("spark_type", spark_type)

        return self._with_row_columns(
            good,
            {
                model.AFTER: converted(model.AFTER),
                model.BEFORE: converted(model.BEFORE),
                model.COLUMNS: F.transform(model.COLUMNS, declared_as_stored),
            },
        )

    def _with_row_columns(self, good: DataFrame, replaced: Mapping[str, Column]) -> DataFrame:
        """``good`` with the ``replaced`` columns of its row events (other events keep theirs), checkpointed with
        the batch's frames: every later read would otherwise evaluate the replacements again."""
        rows = F.col(model.OP).isin(*(o.value for o in model.ROW_OPS))
        replaced_events = good.select(
            *(
                F.when(rows, replaced[name]).otherwise(F.col(name)).alias(name) if name in replaced else F.col(name)
                for name in good.columns
            )
        ).localCheckpoint(eager=True)
        self._batch_frames.append(replaced_events)
        return replaced_events

    def _latest_columns_of_shared_tables(
        self, plans: Sequence[apply.TablePlan], table_columns: dict[str, list[tuple[str, str]]]
    ) -> None:
        """Gives the plans of source tables that share a lake table its latest columns: each plan's entry is the
        table's columns when that plan was ensured or retyped, and a later plan's may have added or widened one."""
        by_path: dict[str, list[apply.TablePlan]] = {}
        for plan in plans:
            by_path.setdefault(self._path_of(plan), []).append(plan)
        for first, *others in by_path.values():
            latest = self.sink.columns(first.database, first.schema, first.table) if others else None
            if latest is not None:
                table_columns.update((plan.table_id, latest) for plan in (first, *others))

    def _history_of_cleared_tables(
        self, good: DataFrame, step: SchemaEvent, txn: Txn | None, result: BatchResult
    ) -> None:
        """The history tables see a table that a DDL statement cleared (``TRUNCATE TABLE``, ``DROP TABLE``, the old
        name of a renamed table: cdclake.evolve deletes its rows) as a TRUNCATE event at the statement's order, with
        the statement's position and vendor op: its SCD2 versions close there, as its lake rows went, and its
        changelog logs it. Formats whose messages carry TRUNCATE as an op of their own reach the history directly.

        The new name of a renamed table sees each row the lake moved to it as an UPSERT at the statement's order
        (:meth:`_moved_rows`): its SCD2 versions start there, so its live versions are its lake rows, and its
        changelog logs the rows it starts with. Both in one commit per history table."""
        if not (self.settings.changelog or self.settings.scd2):
            return
        clearing = [c for c in step.changes if self.evolution.clears(c)]
        if not clearing:
            return
        statement = good.where((F.col(model.OP) == Op.DDL.value) & (apply.effective_order(good) == F.lit(step.order)))
        truncates = [
            statement.withColumns(
                {
                    model.OP: F.lit(Op.TRUNCATE.value),
                    model.DATABASE: F.lit(change.table.database).cast("string"),
                    model.SCHEMA: F.lit(change.table.schema).cast("string"),
                    model.TABLE: F.lit(change.table.table),
                }
            )
            for change in clearing
        ]
        renamed = [c.new_table for c in clearing if c.kind == "rename_table" and c.new_table is not None]
        moved = [rows for name in renamed if (rows := self._moved_rows(statement, name)) is not None]
        events = reduce(DataFrame.unionByName, [*truncates, *moved])
        plans = apply.plan_tables(events, self.settings.keys, self.settings.sequence_by)
        table_columns: dict[str, list[tuple[str, str]]] = {}
        for plan in plans:
            columns = self.sink.columns(plan.database, plan.schema, plan.table)
            if columns is not None:
                table_columns[plan.table_id] = columns
        self._history(events, [p for p in plans if p.table_id in table_columns], table_columns, txn, result)

    def _moved_rows(self, statement: DataFrame, name: TableName) -> DataFrame | None:
        """The rows of the lake table ``name`` (the new name of a table the ``statement`` renamed, just after the
        move) as UPSERT events of that statement: its position, time and vendor op, one event per row, the images
        in canonical text (:func:`cdclake.model.canonical_text`). None when the table's history is off or the
        rename moved nothing."""
        ident = (name.database, name.schema, name.table)
        plan = apply.TablePlan(apply.table_id_of(*ident), *ident, columns=[], key_columns=[])
        if not (history.is_selected(self.settings.changelog, plan) or history.is_selected(self.settings.scd2, plan)):
            return None
        columns = self.sink.columns(*ident)
        if columns is None:
            return None

        def value_of(column: str) -> Column:
            return F.col(f"_row.{quote(column)}")

        image = model.canonical_image(columns, value_of)
        rows = self.sink.read(name.database, name.table, name.schema).select(
            F.struct(*(F.col(quote(column)) for column, _ in columns)).alias("_row")
        )
        keys = self.sink.key_columns(*ident)
        # Ordered as the lake rows are now (DeltaSink.in_recorded_order): a version of a table ordered by a column
        # starts at the statement's position after the key of its value, where the row's next change compares.
        ordering = self.sink.recorded_ordering(*ident) or ""
        replaced = {
            model.POSITION: apply.reordered(apply.event_position(), ordering, columns, value_of),
            model.OP: F.lit(Op.UPSERT.value),
            model.DATABASE: F.lit(name.database).cast("string"),
            model.SCHEMA: F.lit(name.schema).cast("string"),
            model.TABLE: F.lit(name.table),
            model.KEY_COLUMNS: F.array(*map(F.lit, keys)).cast("array<string>"),
            model.BEFORE: F.lit(None).cast(model.CANONICAL_SCHEMA[model.BEFORE].dataType),
            model.AFTER: image,
            model.AFTER_IS_PARTIAL: F.lit(False),
        }
        return statement.crossJoin(rows).select(
            *(replaced.get(column, F.col(column)).alias(column) for column in statement.columns)
        )

    def _ensure_tables(
        self, plans: Sequence[apply.TablePlan]
    ) -> tuple[dict[str, list[tuple[str, str]]], dict[str, dict[str, str]]]:
        """Creates or widens the lake tables of ``plans``; their (name, type) user columns and their CHECK constraints
        (name -> condition, read every batch: the lake's owner may add or drop one any time), by table id.

        Concurrently, as the MERGEs: creating a table is a commit and a read of its log (0.2-0.3 s on two cores),
        and an initial load creates every table in its first batch (40 tables: 7.6-8.3 s one at a time, 4.4-4.5 s
        eight at a time). Plans that land in one lake table go in turns (``in_turns``): the first creates it, the
        next sees it and adds its columns.

        A missing table that only this plan lands in, with no TRUNCATE, is created by its first write instead, with
        its rows (``ensure_table(defer_creation=True)``, Delta and Iceberg): an initial load then makes one commit
        per table, not two. Not when the batch declares other types for its columns than the plan's: reconciling
        them (``reconcile_types``) needs the table.
        """
        plans_per_path = Counter(self._path_of(plan) for plan in plans)

        def ensure(plan: apply.TablePlan) -> tuple[list[tuple[str, str]], dict[str, str]]:
            alone = plans_per_path[self._path_of(plan)] == 1 and plan.truncate_order is None
            columns = self.sink.ensure_table(plan, defer_creation=alone)
            if self.sink.awaits_creation(plan):
                if all(plan.declared_types.get(name.lower(), set()) <= {t} for name, t in columns):
                    return columns, {}
                columns = self.sink.ensure_table(plan)
            return columns, self.sink.check_constraints(plan.database, plan.schema, plan.table)

        columns: dict[str, list[tuple[str, str]]] = {}
        constraints: dict[str, dict[str, str]] = {}
        for turn in self._in_turns(plans):
            for plan, (created, checks) in zip(turn, concurrently(ensure, turn, self.merge_threads), strict=True):
                columns[plan.table_id], constraints[plan.table_id] = created, checks
        return columns, constraints

    def _path_of(self, plan: apply.TablePlan) -> str:
        return self.sink.table_path(plan.database, plan.schema, plan.table)

    def _in_turns(self, plans: Sequence[apply.TablePlan]) -> list[list[apply.TablePlan]]:
        return in_turns(plans, self._path_of, lambda plan: plan.table_id)

    def _merge_units(self, plans: Sequence[apply.TablePlan]) -> list[list[apply.TablePlan]]:
        """``plans`` grouped into one MERGE each: the plans of source tables that land in one lake table (routed
        shards, one name in several schemas) together, when they have the same key columns and no TRUNCATE; every
        other plan alone. Sharded tables then cost one MERGE per batch, not one per shard.

        Decided from the plans only, so that a re-run of the batch makes the same commits (see in_turns)."""
        units: dict[tuple[str, bool, tuple[str, ...]], list[apply.TablePlan]] = {}
        for plan in sorted(plans, key=lambda p: p.table_id):
            unit: tuple[str, bool, tuple[str, ...]]
            if plan.truncate_order:
                unit = (self._path_of(plan), False, (plan.table_id,))
            else:
                unit = (self._path_of(plan), True, tuple(k.lower() for k in plan.key_columns))
            units.setdefault(unit, []).append(plan)
        return list(units.values())

    def _apply_rows(
        self,
        good: DataFrame,
        plans: Sequence[apply.TablePlan],
        table_columns: Mapping[str, list[tuple[str, str]]],
        txn: Txn | None,
        result: BatchResult,
    ) -> DataFrame | None:
        """Applies the row changes of ``good`` to the lake tables of ``plans``: fold, gate, one MERGE per table.
        Returns the UPSERTs of key changes made whole from the old keys' rows (:meth:`_moves_made_whole`), for the
        history tables, or None."""
        every_change = apply.row_changes(good, self.settings.keys)
        changes = _not_truncated(every_change, plans)
        truncated = [p for p in plans if p.truncate_order]
        with result.timed("fold"):
            folded, stats, made_whole = self._folded(changes, plans, table_columns)
            self._batch_frames.append(folded)
            # Before the MERGE step's truncates: it reads the lake rows they clear.
            void_made_whole = self._void_moves_made_whole(every_change, truncated, table_columns)
            if void_made_whole is not None:
                made_whole = void_made_whole if made_whole is None else made_whole.unionByName(void_made_whole)
        # Turns of every plan, not only those with changes: a re-run must give each plan the marker it had.
        turns = in_turns(self._merge_units(plans), lambda unit: self._path_of(unit[0]), lambda unit: unit[0].table_id)
        with result.timed("merge"):
            for turn, same_turn in enumerate(turns):
                for plan in (p for unit in same_turn for p in unit):
                    if plan.truncate_order:
                        self.sink.truncate(plan, turn_marker(txn, turn))

            def merge(unit: list[apply.TablePlan]) -> None:
                if len(unit) == 1:
                    table_changes = folded.where(F.col(apply.TABLE_ID) == unit[0].table_id)
                else:
                    ids = [plan.table_id for plan in unit]
                    table_changes = apply.latest_per_key(folded.where(F.col(apply.TABLE_ID).isin(*ids)))
                self.sink.merge(unit[0], table_columns[unit[0].table_id], table_changes)

            # One commit per lake table; tables are independent, so their MERGEs overlap (driver-side planning and
            # commit I/O dominate small batches). They share the batch's idempotency marker; source tables sharing a
            # lake table that cannot share its MERGE take turns, each with a marker of its own (in_turns).
            for turn, same_turn in enumerate(turns):
                # A table left to its first write is created even when none of its changes remain.
                tables = [
                    unit for unit in same_turn if any(p.table_id in stats or self.sink.awaits_creation(p) for p in unit)
                ]
                if not tables:
                    continue
                with (
                    self.sink.idempotent(turn_marker(txn, turn)),
                    self.sink.merging(len(tables), self.merge_threads),
                ):
                    concurrently(merge, tables, self.merge_threads)
        for plan in plans:
            path = self._path_of(plan)
            changes_of_plan = stats[plan.table_id]["changes"] if plan.table_id in stats else 0
            result.applied[path] = result.applied.get(path, 0) + changes_of_plan
        if truncated or any(row["deletes"] for row in stats.values()):
            # After the MERGEs, not beside them: a big batch's MERGEs keep every core busy, and a tombstone write
            # beside them made 10-table batches of 31k messages 9% slower (python -m benchmarks.ab --variant
            # inline-bookkeeping).
            self._bookkeeping.submit("tombstones", self.sink.record_tombstones, folded, truncated, txn)
        return made_whole

    def _folded(
        self,
        changes: DataFrame,
        plans: Sequence[apply.TablePlan],
        table_columns: Mapping[str, list[tuple[str, str]]],
    ) -> tuple[DataFrame, dict[str, Row], DataFrame | None]:
        """The row ``changes`` folded per key and gated by the tombstones, stored (a local checkpoint: the caller
        releases it), with their figures per table (:meth:`_folded_stats`). Key changes from partial images are made
        whole from the old keys' rows first (:meth:`_moves_made_whole`) and their UPSERTs returned too, for the history
        tables (else None): only batches that hold one pay for the second fold."""
        first_orders = {plan.table_id: plan.first_order for plan in plans}
        # A local checkpoint, not persist: Delta refuses to MERGE from a source it has not copied when the source
        # plan holds cached data (a cache does not pin the tombstones' Delta version), and the copy is the cost
        # DeltaSink.merging removes.
        folded = self.sink.gate(apply.fold(changes), first_orders).localCheckpoint(eager=True)
        stats = self._folded_stats(folded)
        moved = {table for table, row in stats.items() if row["moved"]}
        if not moved:
            return folded, stats, None
        release(folded)  # the second fold starts again from the changes
        changes, made_whole = self._moves_made_whole(changes, plans, table_columns, moved)
        folded = self.sink.gate(apply.fold(changes), first_orders).localCheckpoint(eager=True)
        return folded, self._folded_stats(folded), made_whole

    @staticmethod
    def _folded_stats(folded: DataFrame) -> dict[str, Row]:
        """Per table id of the batch's folded changes: how many (``changes``), deletes, and how many keys had a key
        change from a partial image among their changes (``moved``: made whole not yet, ``_moves_made_whole``)."""
        return {
            row[apply.TABLE_ID]: row
            for row in folded.groupBy(apply.TABLE_ID)
            .agg(
                F.count("*").alias("changes"),
                F.sum(F.when(F.col(apply.KIND) == apply.DELETE, 1).otherwise(0)).alias("deletes"),
                F.count(apply.MOVED_FROM).alias("moved"),
            )
            .collect()
        }

    def _moves_made_whole(
        self,
        changes: DataFrame,
        plans: Sequence[apply.TablePlan],
        table_columns: Mapping[str, list[tuple[str, str]]],
        moved: set[str],
        *,
        before_truncates: bool = False,
    ) -> tuple[DataFrame, DataFrame | None]:
        """The batch's row ``changes`` with its key changes' partial images made whole from the old keys' rows
        (:func:`cdclake.apply.moves_made_whole`), read from the batch and from the lake tables before their MERGEs,
        and those UPSERTs made whole. Only batches that hold such a key change pay for it, and only the ``moved``
        tables (by table id), which hold them, are read.

        The lake rows of a table truncated in this batch are those its TRUNCATE leaves, as the ``changes`` are those
        written after it (:func:`_not_truncated`); unless they are those written ``before_truncates``."""

        def stored_rows(plan: apply.TablePlan) -> DataFrame | None:
            if self.sink.awaits_creation(plan):
                return None
            rows = self.sink.read(plan.database, plan.table, plan.schema)
            if plan.truncate_order and not before_truncates:
                rows = rows.where(~F.coalesce(self.sink.truncated_by(plan), F.lit(False)))
            return rows

        tables = {
            plan.table_id: apply.StoredRows(
                stored_rows(plan), plan.key_columns, table_columns[plan.table_id], POSITION_COLUMN
            )
            for plan in plans
            if plan.table_id in moved
        }
        # The void ones (before a truncate) are made whole for the SCD2 tables alone: no warning of their own.
        return apply.moves_made_whole(changes, tables, self._batch_frames.append, warn_unfound=not before_truncates)

    def _void_moves_made_whole(
        self,
        changes: DataFrame,
        truncated: Sequence[apply.TablePlan],
        table_columns: Mapping[str, list[tuple[str, str]]],
    ) -> DataFrame | None:
        """The UPSERTs of key changes from partial images that the log wrote before a TRUNCATE of their table in the
        same batch, made whole from the old keys' rows as they were then, for the SCD2 tables: the lake table never
        writes them (the truncate clears both keys, :func:`_not_truncated`), but its SCD2 table keeps them as
        versions. Only the ``truncated`` plans with an SCD2 table are looked at; None when none has such a change."""
        plans = [plan for plan in truncated if history.is_selected(self.settings.scd2, plan)]
        if not plans:
            return None
        void = _truncated_away(changes, plans)
        with_moves = void.where(F.col(apply.MOVED_FROM).isNotNull()).select(apply.TABLE_ID).distinct().collect()
        if not with_moves:
            return None
        moved = {row[apply.TABLE_ID] for row in with_moves}
        _, made_whole = self._moves_made_whole(void, plans, table_columns, moved, before_truncates=True)
        return made_whole

    def _history(
        self,
        good: DataFrame,
        plans: Sequence[apply.TablePlan],
        table_columns: Mapping[str, list[tuple[str, str]]],
        txn: Txn | None,
        result: BatchResult,
        made_whole: DataFrame | None = None,
    ) -> None:
        """Changelog and SCD2 tables of the tables that have them (settings ``changelog`` / ``scd2``). ``made_whole``:
        the UPSERTs of key changes that :meth:`_apply_rows` made whole, which the SCD2 tables take as they are."""
        changelog = [p for p in plans if history.is_selected(self.settings.changelog, p)]
        scd2 = [p for p in plans if history.is_selected(self.settings.scd2, p)]
        if changelog or scd2:
            with result.timed("history"):
                self.history.record(
                    good,
                    changelog,
                    scd2,
                    table_columns,
                    self.settings.keys,
                    result.batch_id,
                    txn,
                    self.merge_threads,
                    made_whole,
                )

    def _misfit_reason(
        self,
        plans: Sequence[apply.TablePlan],
        table_columns: Mapping[str, list[tuple[str, str]]],
        constraints: Mapping[str, dict[str, str]],
        events: DataFrame,
    ) -> tuple[Column | None, set[str]]:
        """Per event: why it does not fit the lake table (null when it fits): a key value that is NULL (for the
        tables whose plan counted some), a value that does not fit the table's column type, a partition value that
        would name a folder too long for a file system (``DeltaSink.folder_columns``), or a row that does
        not meet one of the table's CHECK ``constraints`` (by table id;
        :mod:`cdclake.constraints`). And the ids of the tables with a constraint that cannot be checked on the
        events' images (:meth:`_refuse_rows_not_meeting_constraints` checks them on the rows a MERGE would write).
        """
        reason: Column | None = None
        unmet: list[Column] = []
        unchecked_tables: set[str] = set()
        for plan in plans:
            stored = {name.lower(): (name, t) for name, t in table_columns[plan.table_id]}
            this_table = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE)) == plan.table_id
            # Images hold the lake table's spelling (_in_lake_spelling).
            names = [name for name, _ in table_columns[plan.table_id]]
            ident = (plan.database, plan.schema, plan.table)
            if problem := (
                unknown_keys_problem(ident, plan.key_columns, names)
                or self._sequence_by_problem(ident, names)
                or self._ordering_changed_problem(plan)
            ):
                rows = this_table & F.col(model.OP).isin(*(o.value for o in model.ROW_OPS))
                reason = F.when(rows, problem) if reason is None else reason.when(rows, problem)
                continue
            ordering = PerTable.of(self.settings.sequence_by).entry_for(*ident)
            if ordering is not None and ordering[1].lower() in stored:  # a pattern's table may not have it
                lake_name = F.lit(stored[ordering[1].lower()][0])  # the images hold the lake's spelling
                carried = (F.map_contains_key(F.col(image), lake_name) for image in (model.AFTER, model.BEFORE))
                unordered_reason = unordered_change_problem(ordering[1], ident)
                lost = this_table & apply.unordered_change(*carried)
                reason = F.when(lost, unordered_reason) if reason is None else reason.when(lost, unordered_reason)
            if plan.null_key_events and plan.key_columns:
                rows = this_table & F.col(model.OP).isin(*(o.value for o in model.ROW_OPS))
                identifying = apply.identifying_image()
                for key in plan.key_columns:
                    message = F.lit(
                        f"key column {key} is NULL (or missing) in the row's image: the row cannot be identified, "
                        "and rows with a NULL key would all become one row (set `keys` for the table to columns "
                        "that are never NULL)"
                    )
                    unkeyed = rows & identifying.isNotNull() & identifying[key].isNull()
                    reason = F.when(unkeyed, message) if reason is None else reason.when(unkeyed, message)
            for _, lost, message in self.value_misfits(plan, table_columns[plan.table_id]):
                reason = F.when(lost, message) if reason is None else reason.when(lost, message)
            if constraints.get(plan.table_id):
                lake_table = "/".join(self.sink.lake_names(plan.database, plan.schema, plan.table))
                not_met, unchecked = violation_reason(
                    constraints[plan.table_id],
                    table_columns[plan.table_id],
                    lake_table,
                    events,
                    self.sink.column_defaults(*ident),
                )
                if unchecked:
                    unchecked_tables.add(plan.table_id)
                if not_met is not None:
                    unmet.append(F.when(this_table, not_met))
        reasons = [r for r in (reason, *unmet) if r is not None]
        return (F.coalesce(*reasons) if len(reasons) > 1 else (reasons[0] if reasons else None)), unchecked_tables

    def value_misfits(
        self, plan: apply.TablePlan, table_columns: Sequence[tuple[str, str]]
    ) -> list[tuple[str, Column, Column]]:
        """The plan's row events whose values its lake table (user columns ``table_columns``) cannot hold, as
        (label, condition, reason): a value whose message declares another type than the table's column and that
        does not fit the column's type, and a partition value that would name a folder too long for a file system
        (``DeltaSink.folder_columns``). ``label`` names the kind (``cdclake check`` counts events by it).

        The decoder already checked each value against the type its message declares; the type check only matters
        when a message declares a column with another type than the table already has."""
        stored = {name.lower(): (name, t) for name, t in table_columns}
        this_table = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE)) == plan.table_id
        misfits: list[tuple[str, Column, Column]] = []
        for key, types in sorted(plan.declared_types.items()):
            if key not in stored:
                continue
            name, table_type = stored[key]
            # Timestamps of the other kind are converted (_in_lake_types; cdclake check does not convert them).
            differing = sorted(t for t in types - {table_type} if not model.converts_to(t, table_type))
            if not differing:
                continue
            label = (
                f"value of column {name} (declared {', '.join(differing)}) does not fit the lake table's type "
                f"{table_type}"
            )
            for image in (F.col(model.AFTER), F.col(model.BEFORE)):
                text = image[name]
                # A cast rounds a decimal's extra fraction digits: the exact fit decides (model.text_is_valid).
                fits = (
                    model.text_is_valid(text, F.lit(table_type))
                    if table_type.startswith("decimal(")
                    else (model.typed_value(text, table_type).isNotNull())
                )
                misfits.append((label, this_table & text.isNotNull() & ~fits, F.lit(label)))
        writes_row = this_table & F.col(model.OP).isin(Op.INSERT.value, Op.UPDATE.value, Op.UPSERT.value)
        for column in self.sink.folder_columns(plan, table_columns):
            size = self.sink.partition_folder_bytes(column, F.col(model.AFTER)[column])
            message = F.concat(
                F.lit(f"value of partition column {column} names a folder of "),
                size.cast("string"),
                F.lit(
                    f" bytes, over the {MAX_SEGMENT_BYTES} a file system holds: the row cannot be stored in its "
                    "partition (correct the value at the source, or partition the lake table by another column), "
                    "then replay this dead letter"
                ),
            )
            label = f"value of partition column {column} names a folder of over {MAX_SEGMENT_BYTES} bytes"
            misfits.append((label, writes_row & (size > MAX_SEGMENT_BYTES), message))
        return misfits

    def _sequence_by_problem(self, ident: tuple[str | None, str | None, str], columns: Sequence[str]) -> str | None:
        """:func:`sequence_by_problem` of the table; a pattern's table without the column is logged, once."""
        problem = sequence_by_problem(self.settings.sequence_by, ident, columns)
        if problem is None or not problem.warning_only:
            return None if problem is None else problem.text
        if problem.text not in self._unsequenced_warned:
            self._unsequenced_warned.add(problem.text)
            log.warning(problem.text)
        return None

    def _ordering_changed_problem(self, plan: apply.TablePlan) -> str | None:
        """:func:`ordering_changed_problem` of the plan's table, when its lake table was written in another order
        than ``sequence_by`` gives it now (``DeltaSink.ordering_conflict``)."""
        recorded = self.sink.ordering_conflict(plan)
        if recorded is None:
            return None
        ident = (plan.database, plan.schema, plan.table)
        lake_table = "/".join(self.sink.lake_names(*ident))
        return ordering_changed_problem(ident, recorded, plan.sequence_column, lake_table)

    def _refuse_rows_not_meeting_constraints(
        self,
        good: DataFrame,
        plans: Sequence[apply.TablePlan],
        table_columns: Mapping[str, list[tuple[str, str]]],
        constraints: Mapping[str, dict[str, str]],
        batch_id: int,
        txn: Txn | None,
        result: BatchResult,
    ) -> DataFrame:
        """``good`` without the events of the keys whose rows, as the MERGE would write them, would not meet one of
        their table's CHECK ``constraints`` (:meth:`refused_keys`); those events go to the dead letters (every row
        event of such a key in the batch: the key keeps its stored row, which met them, and the events replay in
        their order later). Without this, Delta refuses the whole MERGE, so the batch, on every restart."""
        refused = self.refused_keys(good, plans, table_columns, constraints)
        if not refused:
            return good
        messages: dict[str, list[str]] = {}
        for (table_id, name), keys in refused.items():
            database, schema, table = apply.split_table_id(table_id)
            lake_table = "/".join(self.sink.lake_names(database, schema, table))
            messages.setdefault(row_not_met(name, constraints[table_id][name], lake_table), []).extend(keys)
        staged = good.withColumn("_unmet", self.refused_event_reason(good, messages)).localCheckpoint(eager=True)
        self._batch_frames.append(staged)
        bad = staged.where(F.col("_unmet").isNotNull())
        extra = bad.count()
        self._dead_letters(bad, F.col("_unmet"), batch_id, _sub_txn(txn, _misfit_marker(constraints) + "/rows"))
        result.dead_letters += extra
        return staged.where(F.col("_unmet").isNull()).drop("_unmet")

    def refused_keys(
        self,
        good: DataFrame,
        plans: Sequence[apply.TablePlan],
        table_columns: Mapping[str, list[tuple[str, str]]],
        constraints: Mapping[str, dict[str, str]],
    ) -> dict[tuple[str, str], list[str]]:
        """The keys of ``plans``' tables whose rows, as their MERGE would write them (the stored row with the batch's
        changes of the key applied: ``rows_written``), would not meet one of the table's CHECK ``constraints``:
        (table id, constraint name) -> the keys, each as the table id, ``_KEY_SEP`` and the row key. Writes nothing.

        For the tables whose events the per-event check cannot settle: a partial image writes the stored values of
        the columns it lacks (``CHECK (a < b)`` and an update of ``a`` alone), and a condition may read what an image
        does not hold (cdclake's own columns). It costs a fold and a join with the table's rows, for these only.

        Refusing a key takes out every event that writes it, and an update that changed its key also wrote its old
        key, whose row is then another: while such an update is refused, the rows are checked again without the
        refused events (each round refuses new keys only, so this ends)."""
        refused: dict[tuple[str, str], list[str]] = {}
        remaining = good
        while True:
            found = self._keys_not_meeting_constraints(remaining, plans, table_columns, constraints)
            if not found:
                return refused
            for label, keys in found.items():
                refused.setdefault(label, []).extend(keys)
            every_key = [key for keys in refused.values() for key in keys]
            taken = self.refused_event_reason(remaining, {"refused": every_key}).isNotNull()
            if not remaining.where(taken & self._changes_its_key(remaining)).take(1):
                return refused
            remaining = remaining.where(~taken)

    def _changes_its_key(self, events: DataFrame) -> Column:
        """Whether an update moved its row to another key (so it wrote two keys)."""
        keys = apply.effective_keys(events, self.settings.keys)
        before, after = F.col(model.BEFORE), F.col(model.AFTER)
        return F.coalesce(
            before.isNotNull() & after.isNotNull() & (apply.key_of(before, keys) != apply.key_of(after, keys)),
            F.lit(False),
        )

    def _keys_not_meeting_constraints(
        self,
        good: DataFrame,
        plans: Sequence[apply.TablePlan],
        table_columns: Mapping[str, list[tuple[str, str]]],
        constraints: Mapping[str, dict[str, str]],
    ) -> dict[tuple[str, str], list[str]]:
        """One round of :meth:`refused_keys`: the keys whose rows, written from ``good``, would not meet one."""
        ids = [plan.table_id for plan in plans]
        this_batch = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE))
        changes = _not_truncated(apply.row_changes(good.where(this_batch.isin(*ids)), self.settings.keys), plans)
        folded, _, _ = self._folded(changes, plans, table_columns)  # what _apply_rows will MERGE
        refused: dict[tuple[str, str], list[str]] = {}
        try:
            for plan in plans:
                of_table = folded.where(F.col(apply.TABLE_ID) == plan.table_id)
                rows = self.sink.rows_written(plan, table_columns[plan.table_id], of_table, [apply.ROW_KEY])
                first_unmet, unchecked = unmet_on_rows(constraints[plan.table_id], rows)
                if unchecked:
                    log.warning(
                        "CHECK constraints %s of lake table %s cannot be evaluated on its rows before the MERGE: a "
                        "row that does not meet one fails the batch",
                        unchecked,
                        "/".join(self.sink.lake_names(plan.database, plan.schema, plan.table)),
                    )
                if first_unmet is None:
                    continue
                not_met = rows.select(apply.ROW_KEY, first_unmet.alias("_name")).where(F.col("_name").isNotNull())
                for row in not_met.collect():
                    refused.setdefault((plan.table_id, row["_name"]), []).append(
                        plan.table_id + _KEY_SEP + row[apply.ROW_KEY]
                    )
        finally:
            release(folded)
        return refused

    def refused_event_reason(self, events: DataFrame, refused: Mapping[str, Sequence[str]]) -> Column:
        """Per event of ``events``: the label under which ``refused`` (label -> keys, as :meth:`refused_keys` gives
        them) lists a key the event writes; null for the others. An event writes the key of its after image and,
        when its key changes or it deletes, its before image's."""
        keys = apply.effective_keys(events, self.settings.keys)
        this_table = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE))
        event_keys = [
            F.when(image.isNotNull(), F.concat(this_table, F.lit(_KEY_SEP), apply.key_of(image, keys)))
            for image in (F.col(model.AFTER), F.col(model.BEFORE))
        ]
        row_event = F.col(model.OP).isin(*(o.value for o in model.ROW_OPS))
        reason: Column = F.lit(None).cast("string")
        for label, refused_keys in sorted(refused.items(), reverse=True):
            writes_one = reduce(Column.__or__, (F.coalesce(k.isin(*refused_keys), F.lit(False)) for k in event_keys))
            reason = F.when(row_event & writes_one, F.lit(label)).otherwise(reason)
        return reason

    # -------------------------------------------------------------------------------------------------------------
    # Transaction-consistent mode

    def _process_complete_transactions(self, messages: DataFrame, batch_id: int, txn: Txn | None) -> BatchResult:
        """Applies the events of complete source transactions only; the messages of open ones are stored in the
        pending table and decoded again, before the next batch's messages, with the next batch.

        Idempotent like :meth:`_process`: the batch reads the pending generation it builds on (never its own
        write), applies the ready events with the batch's marker, and only then stores the held messages, with the
        same marker. A re-run after a crash at any point therefore sees the same messages, makes the same split
        (the limits depend on the data only, never on the clock) and skips the commits that already happened.
        """
        pending = self._read_pending(batch_id)
        if pending.messages is not None:
            messages = pending.messages.unionByName(messages, allowMissingColumns=True)
        started = time.perf_counter()
        events = self._decoded(messages, txn)
        decoding = time.perf_counter() - started
        held: DataFrame | None = None
        try:
            held, held_count = self._held_coordinates(events)
            ready = events.join(held, _COORDINATES, "left_anti") if held_count else events
            result = self._process(ready, batch_id, txn, decoding=decoding)
            # Nothing held before and nothing now: the stored generation says so already, no commit needed.
            if held_count or pending.held_messages:
                self._write_pending(pending, events.join(held, _COORDINATES, "left_semi"), held_count, batch_id, txn)
            if held_count:
                log.info("batch %s: %s messages of open source transactions held back", batch_id, held_count)
            return result
        finally:
            if held is not None:
                held.unpersist()
            release(events)

    def _boundary_formats(self, op: Op) -> list[str]:
        """Configured formats that have ``op`` (TXN_BEGIN or TXN_END) among their operations."""
        names = {self.settings.default_format, *self.settings.topic_formats.values()} - {None}
        return sorted(str(name) for name in names if op in get_format(str(name)).operations.values())

    def _held_coordinates(self, events: DataFrame) -> tuple[DataFrame, int]:
        """Topic, partition and offset of every message with an event of a still open source transaction (cached:
        unpersist it), and how many there are.

        A transaction is open when its events are in the data seen so far (held messages and this batch) but its
        end marker is not:

        * by position, for formats with TXN_BEGIN markers: in a Kafka partition whose last TXN_BEGIN comes after
          its last TXN_END, every event from that TXN_BEGIN on (DataWorks, DTS: markers without usable ids);
        * by id, for formats with TXN_END markers: the events with a ``txn_id`` for which no TXN_END with that id
          has been seen, in any partition (Maxwell and Qlik mark the last event; Debezium's END comes on the
          transaction topic). Formats that also have TXN_BEGIN markers (Debezium, DTS) open a transaction only
          with its TXN_BEGIN, so that data events arriving after their END (another topic read later) are not
          held for ever.

        An open transaction beyond the limits (settings) is applied anyway, with a warning: a lost end marker
        must not stall the lake. Events without transaction information are never held.
        """
        ok = F.col(model.ERROR).isNull()
        op = F.col(model.OP)
        begins = ok & (op == Op.TXN_BEGIN.value)
        ends = ok & (op == Op.TXN_END.value)
        members: list[DataFrame] = []
        positional = self._boundary_formats(Op.TXN_BEGIN)
        if positional:
            order = F.struct(F.col(model.OFFSET).alias("offset"), F.col(model.SUB_INDEX).alias("sub_index"))
            open_tails = (
                events.where((begins | ends) & F.col(model.FORMAT).isin(*positional))
                .groupBy(model.TOPIC, model.PARTITION)
                .agg(F.max(F.when(begins, order)).alias("_begin"), F.max(F.when(ends, order)).alias("_end"))
                .where(F.col("_begin").isNotNull() & (F.col("_end").isNull() | (F.col("_begin") > F.col("_end"))))
            )
            members.append(
                events.join(F.broadcast(open_tails), [model.TOPIC, model.PARTITION])
                .where(order >= F.col("_begin"))
                .select(
                    F.format_string(
                        "transaction from %s[%d] offset %d", model.TOPIC, model.PARTITION, F.col("_begin.offset")
                    ).alias("_transaction"),
                    *_COORDINATES,
                    model.EVENT_TIME,
                )
            )
        by_id = self._boundary_formats(Op.TXN_END)
        if by_id:
            with_id = ok & F.col(model.TXN_ID).isNotNull() & F.col(model.FORMAT).isin(*by_id)
            needs_begin = F.col(model.FORMAT).isin(*positional) if positional else F.lit(False)
            open_ids = (
                events.where(with_id)
                .groupBy(model.FORMAT, model.TXN_ID)
                .agg(F.bool_or(ends).alias("_ended"), F.bool_or(begins).alias("_begun"))
                .where(~F.col("_ended") & (F.col("_begun") | ~needs_begin))
                .select(model.FORMAT, model.TXN_ID)
            )
            members.append(
                events.where(with_id)
                .join(open_ids, [model.FORMAT, model.TXN_ID], "left_semi")
                .select(
                    F.format_string("transaction %s (%s)", model.TXN_ID, model.FORMAT).alias("_transaction"),
                    *_COORDINATES,
                    model.EVENT_TIME,
                )
            )
        if not members:
            return events.select(*_COORDINATES).limit(0), 0
        # One row per transaction and message, cached: the limits and the held set are both read from it.
        held_by_transaction = (
            reduce(DataFrame.unionByName, members)
            .groupBy("_transaction", *_COORDINATES)
            .agg(F.min(model.EVENT_TIME).alias(model.EVENT_TIME))
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        try:
            released = self._past_limits(events, held_by_transaction)
            still_open = ~F.col("_transaction").isin(*released) if released else F.lit(True)
            held = (
                held_by_transaction.where(still_open)
                .select(*_COORDINATES)
                .distinct()
                .persist(StorageLevel.MEMORY_AND_DISK)
            )
            return held, held.count()
        finally:
            held_by_transaction.unpersist()

    def _past_limits(self, events: DataFrame, held_by_transaction: DataFrame) -> list[str]:
        """Open transactions to apply anyway: open for longer than ``transaction_max_open_seconds`` (from their
        oldest event to the newest event seen, source event time, so a re-run decides the same) or holding more
        than ``transaction_max_pending_messages`` messages. Logs a warning for each."""
        settings = self.settings
        newest = events.agg(F.max(model.EVENT_TIME).alias("_newest"))
        stats = (
            held_by_transaction.groupBy("_transaction")
            .agg(F.min(model.EVENT_TIME).alias("_oldest"), F.count("*").alias("_messages"))
            .crossJoin(newest)
            .select(
                "_transaction",
                "_messages",
                ((F.unix_micros("_newest") - F.unix_micros("_oldest")) / 1e6).alias("_open_seconds"),
            )
            .where(
                (F.col("_open_seconds") > settings.transaction_max_open_seconds)
                | (F.col("_messages") > settings.transaction_max_pending_messages)
            )
            .collect()
        )
        for row in stats:
            log.warning(
                "transaction-consistent mode: applying %s without its end marker: open for %s s of source time "
                "(limit %s s), %s messages held (limit %s)",
                row["_transaction"],
                row["_open_seconds"],
                settings.transaction_max_open_seconds,
                row["_messages"],
                settings.transaction_max_pending_messages,
            )
        return sorted(str(row["_transaction"]) for row in stats)

    def _read_pending(self, batch_id: int | None) -> _PendingGeneration:
        """The newest stored generation of held messages of this pipeline, except one that batch ``batch_id`` wrote
        (a re-run after the write must see what the first run saw). The table keeps two generations per pipeline:
        the newest and the one it was built on."""
        stored = self.sink.read_system_snapshot(PENDING_TRANSACTIONS)
        if stored is None:
            return _PendingGeneration(0, 0, None)
        mine = stored.where(F.col("pipeline") == self.settings.name)
        generations = [
            row
            for row in mine.where(F.col("generation_header"))
            .select("generation", "app_id", "batch_id", "held_messages")
            .collect()
            if batch_id is None or (row["app_id"], row["batch_id"]) != (self.settings.app_id, batch_id)
        ]
        if not generations:
            return _PendingGeneration(0, 0, None)
        base = max(generations, key=lambda row: int(row["generation"]))
        if not base["held_messages"]:
            return _PendingGeneration(int(base["generation"]), 0, None)
        messages = mine.where((F.col("generation") == base["generation"]) & ~F.col("generation_header"))
        # Held by a version that stored no headers: the table has no such column yet (the batch's union with the
        # new messages allows missing columns).
        kept = [name for name in _MESSAGE_OF_EVENT if name in messages.columns]
        return _PendingGeneration(int(base["generation"]), int(base["held_messages"]), messages.select(*kept))

    def _write_pending(
        self, base: _PendingGeneration, held_events: DataFrame, held_count: int, batch_id: int, txn: Txn | None
    ) -> None:
        """Stores the held messages as the next generation, in one commit that also drops the generations older
        than ``base``. A header row per generation records who wrote it and how many messages it holds (also
        when none), so that a re-run can tell its own write from the one it builds on."""
        stamp = [
            F.lit(self.settings.name).alias("pipeline"),
            F.lit(base.generation + 1).cast("bigint").alias("generation"),
            F.lit(self.settings.app_id).alias("app_id"),
            F.lit(batch_id).cast("bigint").alias("batch_id"),
            F.current_timestamp().alias("recorded_at"),
        ]
        messages = held_events.select(
            *stamp,
            F.lit(False).alias("generation_header"),
            F.lit(None).cast("bigint").alias("held_messages"),
            *[F.col(canonical).alias(name) for name, canonical in _MESSAGE_OF_EVENT.items()],
        ).dropDuplicates(_COORDINATES)
        header = self.spark.range(1).select(
            *stamp, F.lit(True).alias("generation_header"), F.lit(held_count).cast("bigint").alias("held_messages")
        )
        self.sink.replace_partition(
            PENDING_TRANSACTIONS,
            messages.unionByName(header, allowMissingColumns=True),
            ("pipeline", self.settings.name),
            keep=("generation", base.generation) if base.generation else None,
            txn=txn,
        )

    def pending_transaction_messages(self) -> int:
        """How many messages of open source transactions this pipeline holds back (transaction-consistent mode)."""
        return self._read_pending(None).held_messages

    # -------------------------------------------------------------------------------------------------------------
    # Bookkeeping tables

    def _dead_letters(self, events: DataFrame, reason: Column, batch_id: int, txn: Txn | None) -> None:
        rows = events.select(
            F.lit(self.settings.name).alias("pipeline"),
            F.lit(batch_id).cast("bigint").alias("batch_id"),
            F.current_timestamp().alias("recorded_at"),
            F.col(model.TOPIC).alias("topic"),
            F.col(model.PARTITION).alias("partition"),
            F.col(model.OFFSET).alias("offset"),
            F.col(model.KAFKA_TIMESTAMP).alias("kafka_timestamp"),
            F.col(model.FORMAT).alias("format"),
            F.col(model.DATABASE).alias("database"),
            F.col(model.TABLE).alias("table"),
            reason.alias("reason"),
            F.col(model.RAW_KEY).alias("key"),
            F.col(model.RAW_VALUE).alias("value"),
            F.col(model.RAW_HEADERS).alias("headers"),
        ).dropDuplicates(["topic", "partition", "offset"])
        if self.settings.dead_letter_handler is not None:
            with self._bookkeeping.result.timed("dead_letters"):
                self.settings.dead_letter_handler(rows)
            return
        self._bookkeeping.submit("dead_letters", self.sink.append, DEAD_LETTERS, rows, txn)

    def _schema_changes(
        self, good: DataFrame, events: Sequence[SchemaEvent], batch_id: int, txn: Txn | None, result: BatchResult
    ) -> None:
        """Records every DDL and TRUNCATE event with its outcome; statements that could not be applied also go to
        the dead letters (with the raw message)."""
        rejected = [e for e in events if e.dead_letter]
        if rejected:
            reason: Column | None = None
            for event in rejected:
                row = event.row
                match = (
                    (F.col(model.TOPIC) == row[model.TOPIC])
                    & (F.col(model.PARTITION) == row[model.PARTITION])
                    & (F.col(model.OFFSET) == row[model.OFFSET])
                    & (F.col(model.SUB_INDEX) == row[model.SUB_INDEX])
                )
                text = F.lit(event.dead_letter)
                reason = F.when(match, text) if reason is None else reason.when(match, text)
            assert reason is not None
            self._dead_letters(good.where(reason.isNotNull()), reason, batch_id, _sub_txn(txn, "ddl/dead"))
            result.dead_letters += len(rejected)
        columns = (
            model.DATABASE,
            model.SCHEMA,
            model.TABLE,
            model.OP,
            model.VENDOR_OP,
            model.DDL,
            model.POSITION,
            model.EVENT_TIME,
            model.TOPIC,
            model.PARTITION,
            model.OFFSET,
        )
        rows = [(*(e.row[c] for c in columns), e.outcome, e.moved_to or None) for e in events]
        frame = local_frame(self.spark, rows, SCHEMA_CHANGE_ROW).select(
            F.lit(self.settings.name).alias("pipeline"),
            F.lit(batch_id).cast("bigint").alias("batch_id"),
            F.current_timestamp().alias("recorded_at"),
            "*",
        )
        self._bookkeeping.submit("schema_changes", self.sink.append, SCHEMA_CHANGES, frame, txn)

    def _progress(self, summary: Sequence[Row], excluded: set[str], batch_id: int, txn: Txn | None) -> None:
        """Per table: events by op, last position, last event time (scope ``table``, or ``excluded`` for the
        ``excluded`` tables, whose events were only counted). Per Kafka partition: last offset and the newest event
        time of any event, heartbeats and excluded tables included (the source is read up to that time); a dead
        letter moves the last offset only.

        Rolled up on the driver from the batch's :func:`_summary` (a few rows per table and partition): the events
        are not read again for it."""
        tables: dict[tuple[str, str | None, str | None, str], _Totals] = {}
        streams: dict[tuple[str, int], _Totals] = {}
        for row in summary:
            left_out = _table_id_of(row) in excluded
            if row["bad"] and not left_out:
                # A dead letter is read too: its partition's last offset counts it (status would otherwise show an
                # offset behind the stream, and a replay of dead letters only no progress at all).
                streams.setdefault((row[model.TOPIC], row[model.PARTITION]), _Totals()).read_up_to(row["offset"])
                continue
            if row[model.TABLE] is not None:
                table = ("excluded" if left_out else "table", *_ident_of(row))
                tables.setdefault(table, _Totals()).add(row)
            if not row["bad"]:
                streams.setdefault((row[model.TOPIC], row[model.PARTITION]), _Totals()).add(row)
        rows = [
            (*table, None, None, None, *totals.figures(), totals.last_position, self._lake_table(table))
            for table, totals in tables.items()
        ] + [
            ("stream", None, None, None, *stream, totals.last_offset, *totals.figures(), None, None)
            for stream, totals in streams.items()
        ]
        frame = local_frame(self.spark, rows, _PROGRESS_ROLLUP).select(
            F.lit(self.settings.name).alias("pipeline"),
            F.lit(batch_id).cast("bigint").alias("batch_id"),
            F.current_timestamp().alias("recorded_at"),
            "scope",
            "database",
            "schema",
            "table",
            "topic",
            "partition",
            "last_offset",
            "events",
            "ops",
            "last_position",
            F.timestamp_micros("last_event_micros").alias("last_event_time"),
            "lake_table",
        )
        self.sink.append(PROGRESS, frame, txn)

    def _lake_table(self, table: tuple[str, str | None, str | None, str]) -> str | None:
        """``<database>/<table>`` of a progress row's lake table, relative to the lake (``routes`` may name it
        differently from the source table): what ``cdclake maintain`` looks after. None for excluded tables."""
        scope, database, schema, name = table
        return "/".join(self.sink.lake_names(database, schema, name)) if scope == "table" else None


_PROGRESS_ROLLUP = (
    "scope string, database string, schema string, table string, topic string, partition int, last_offset bigint, "
    "events bigint, ops map<string,bigint>, last_event_micros bigint, last_position string, lake_table string"
)


_KEY_SEP: Final = "\x1e"
"""Between a table id and a row key, in the keys whose rows do not meet a CHECK constraint."""


def _case_hint(names: Sequence[str], columns: Sequence[str]) -> str:
    same = [c for name in names for c in columns if c.lower() == name.lower()]
    return f" (it has {', '.join(same)}: names are case-sensitive)" if same else ""


def _table_name(ident: tuple[str | None, str | None, str]) -> str:
    return ".".join(part for part in ident if part)


def unknown_keys_problem(
    ident: tuple[str | None, str | None, str], keys: Sequence[str], columns: Sequence[str]
) -> str | None:
    """Why the table's rows cannot be identified by ``keys`` (the configured key columns, or the messages' own),
    or None: some are not among its ``columns``. Exact names: an image holds its columns by their exact names, so a
    key named in another case would read NULL in every row, and all of the table's rows would become one."""
    unknown = [key for key in keys if key not in columns]
    if not unknown:
        return None
    return (
        f"key columns {unknown} are not columns of {_table_name(ident)}{_case_hint(unknown, columns)}: fix the "
        "`keys` setting"
    )


def partitions_warning(ident: tuple[str | None, str | None, str], partitions: Sequence[tuple[str, int]]) -> str | None:
    """The warning about a table whose changes without a position come from the Kafka ``partitions`` ((topic,
    partition)s) under ``kafka_order: partition`` (``Pipeline._warn_of_partitions``; ``cdclake check`` prints it
    too); None when they all come from one partition number. Partition numbers, not topics: a capture replay's files
    are topics of partition 0 each, and their offsets are in file order."""
    if len({partition for _, partition in partitions}) < 2:
        return None
    listed = ", ".join(f"{topic}[{partition}]" for topic, partition in partitions)
    return (
        f"{_table_name(ident)}: its changes come from Kafka partitions {listed} and carry no position, so they are "
        "ordered by partition, then offset (kafka_order: partition). Within a partition that is the source's order; "
        "across partitions it is not: a change from a lower partition is taken as older than every change stored "
        "from a higher one, so a key or table that moves to a lower partition (partitions added, a primary-key "
        "update hashed by its new key) keeps its old row, and a truncate keeps the rows of higher partitions. Set "
        "`kafka_order: timestamp` to order them by Kafka record timestamp (README: Ordering across Kafka partitions)"
    )


def unknown_old_key_warning(ident: tuple[str | None, str | None, str], count: int, key_columns: Sequence[str]) -> str:
    """The warning about ``count`` UPDATEs of a table that changed the source's key but whose before image lacks the
    configured ``key_columns`` (``TablePlan.unknown_old_key_events``; ``cdclake check`` prints it too)."""
    keys = ", ".join(key_columns)
    return (
        f"{count} update(s) of {_table_name(ident)} changed "
        f"the source's key, but their before image has no value for the configured key column(s) {keys} (a Debezium "
        f"key change's before image is the old source key alone), so the row they moved from is unknown under `keys`: "
        f"each was applied to the row its after image keys, and where it changed {keys} too, the old row stays. Set "
        "`keys` for the table to the source's key columns (or leave them to the messages)"
    )


def unordered_change_problem(column: str, ident: tuple[str | None, str | None, str]) -> str:
    """The reason of a row event that carries its table's ``sequence_by`` column in no image
    (:func:`cdclake.apply.unordered_change`)."""
    return (
        f"the change does not carry the sequence_by column {column} of {_table_name(ident)} (a partial image: an OGG "
        "compressed update or delete, a document update...), so it cannot be ordered by it; have the source send "
        "full images (OGG: NOCOMPRESSUPDATES, NOCOMPRESSDELETES, GETUPDATEBEFORES) or leave the table to the "
        "format's position"
    )


def ordering_changed_problem(
    ident: tuple[str | None, str | None, str], recorded: str, column: str | None, lake_table: str
) -> str:
    """The reason of a row event of a table whose lake table was written in another order (``recorded``: a
    ``sequence_by`` column, lower-cased, or ``""`` for the format's position) than ``sequence_by`` gives it now
    (``column``, or None for the format's position): see ``DeltaSink.ordering_conflict``."""

    def ordering(column: str | None) -> str:
        return f"its column {column}" if column else "the format's position"

    back = f"`{recorded}`" if recorded else "none (no entry that matches it)"
    return (
        f"the lake table {lake_table} was written with {_table_name(ident)}'s changes ordered by {ordering(recorded)}, "
        f"but sequence_by now orders them by {ordering(column)}: the stored orders and the new ones do not compare, "
        f"so the change could overwrite a newer row or be dropped as older. Set sequence_by for {_table_name(ident)} "
        f"back to {back}, or load the table again into a new lake table under the new setting; then replay these "
        "dead letters (`cdclake dlq replay`)"
    )


def _not_truncated(changes: DataFrame, plans: Sequence[apply.TablePlan]) -> DataFrame:
    """``changes`` without those the log wrote before a TRUNCATE of their table in the same batch: they are void."""
    before = _before_truncate(plans)
    return changes if before is None else changes.where(~before)


def _truncated_away(changes: DataFrame, plans: Sequence[apply.TablePlan]) -> DataFrame:
    """The ``changes`` that :func:`_not_truncated` leaves out."""
    before = _before_truncate(plans)
    return changes.where(F.lit(False) if before is None else before)


def _before_truncate(plans: Sequence[apply.TablePlan]) -> Column | None:
    """Whether a row change was written before a TRUNCATE of its table in the same batch; None without one."""
    before: Column | None = None
    for plan in plans:
        if plan.truncate_order:
            this = (F.col(apply.TABLE_ID) == plan.table_id) & (
                apply.log_order(F.col(apply.ORDER)) < plan.truncate_order
            )
            before = this if before is None else before | this
    return before


def _declares(column: str, spark_type: str) -> Column:
    """Whether an event declares ``column`` with ``spark_type``."""
    return F.exists(model.COLUMNS, lambda c: (c["name"] == column) & (c["spark_type"] == spark_type))


def _misfit_marker(constraints: Mapping[str, Mapping[str, str]]) -> str:
    """The commit-marker step of a batch's misfit dead letters. They depend on the lake tables' CHECK constraints,
    which the owner may change before a re-run of the batch: a re-run that checks other constraints writes its dead
    letters under another marker instead of skipping them (at worst a dead letter twice, never one lost)."""
    checked = sorted((table_id, sorted(checks.items())) for table_id, checks in constraints.items() if checks)
    if not checked:
        return "misfit"
    return "misfit/" + hashlib.sha1(json.dumps(checked).encode("utf-8")).hexdigest()[:12]


def _summary(events: DataFrame) -> list[Row]:
    """The batch's events counted by op, table, Kafka partition and whether they failed, with the last position,
    offset and event time (as epoch microseconds) of each group: the figures of the batch result and of the
    progress rows, in one pass over the events."""
    return (
        events.groupBy(
            F.col(model.OP),
            F.col(model.ERROR).isNotNull().alias("bad"),
            model.DATABASE,
            model.SCHEMA,
            model.TABLE,
            model.TOPIC,
            model.PARTITION,
        )
        .agg(
            F.count("*").alias("n"),
            F.max(model.POSITION).alias("position"),
            F.max(model.OFFSET).alias("offset"),
            F.unix_micros(F.max(model.EVENT_TIME)).alias("event_micros"),
        )
        .collect()
    )


_IDENT: Final = (model.DATABASE, model.SCHEMA, model.TABLE)
_ROW_OPS: Final = frozenset(op.value for op in model.ROW_OPS)


def _clears_tables(ops: Mapping[str, int]) -> bool:
    """Whether a batch with these events by op may clear a table (TRUNCATE, or DDL: DROP, TRUNCATE, RENAME)."""
    return bool(ops.get(Op.TRUNCATE.value) or ops.get(Op.DDL.value))


def _ident_of(row: Row) -> tuple[str | None, str | None, str]:
    """(database, schema, table) of a summary row (the table is None for events of no table)."""
    return row[model.DATABASE], row[model.SCHEMA], row[model.TABLE]


def _table_id_of(row: Row) -> str | None:
    """:func:`cdclake.apply.table_id` of a summary row's table; None for events of no table."""
    return None if row[model.TABLE] is None else apply.table_id_of(*_ident_of(row))


_Ordered = TypeVar("_Ordered", str, int)


@dataclass
class _Totals:
    """One progress row's figures, summed over summary rows."""

    ops: dict[str, int] = field(default_factory=dict)
    last_position: str | None = None
    last_offset: int | None = None
    last_event_micros: int | None = None

    def add(self, row: Row) -> None:
        self.ops[row[model.OP]] = self.ops.get(row[model.OP], 0) + row["n"]
        self.last_position = _newest(self.last_position, row["position"])
        self.last_offset = _newest(self.last_offset, row["offset"])
        self.last_event_micros = _newest(self.last_event_micros, row["event_micros"])

    def read_up_to(self, offset: int | None) -> None:
        """An offset read without an event to count (a dead letter's)."""
        self.last_offset = _newest(self.last_offset, offset)

    def figures(self) -> tuple[int, dict[str, int], int | None]:
        """(events, events by op, last event time)."""
        return sum(self.ops.values()), self.ops, self.last_event_micros


def _newest(current: _Ordered | None, value: _Ordered | None) -> _Ordered | None:
    """The larger of two values, ignoring nulls (as SQL max does; Python orders str by code point, Spark by UTF-8
    bytes: the same order)."""
    if value is None:
        return current
    return value if current is None or value > current else current
