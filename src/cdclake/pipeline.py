"""One batch of raw messages -> decoded events -> lake tables. Used by ``cdclake run`` (each Structured Streaming
micro-batch, through ``foreachBatch``) and ``cdclake replay`` (chunks of capture files), so both take one path.

Per batch, in this order (each commit idempotent for the batch, see cdclake.sinks.delta):

1. decode every message with its topic's format; events with an error -> dead letters;
2. plan the touched tables on the driver (columns, keys, truncates); create tables / add new columns;
3. events whose values do not fit an existing column's type -> dead letters (never silently NULL);
4. keyed changes -> fold per key -> gate by tombstones -> per table: truncate, then one MERGE;
   opt-in history tables (changelog, SCD2) from the unfolded changes, see cdclake.sinks.history;
5. tombstones, schema changes (DDL text as received) and progress rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import reduce

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdclake import apply, model
from cdclake.evolve import Policy, SchemaEvent, SchemaEvolution
from cdclake.formats import get_format
from cdclake.formats.base import METADATA_SCHEMA, TableMetadata, collect_metadata, unique_metadata
from cdclake.model import Op
from cdclake.sinks import history
from cdclake.sinks.delta import DeltaSink, Txn

log = logging.getLogger(__name__)

DEAD_LETTERS = "dead_letters"
PROGRESS = "progress"
SCHEMA_CHANGES = "schema_changes"
SCHEMA_CHANGE_ROW = (
    "database string, schema string, table string, op string, vendor_op string, ddl string, position string, "
    "event_time timestamp, topic string, partition int, offset bigint, outcome string"
)


def _sub_txn(txn: Txn | None, step: str) -> Txn | None:
    """The commit marker of one step of a batch that writes the same table more than once."""
    return None if txn is None else Txn(f"{txn.app_id}/{step}", txn.version)


@dataclass(frozen=True)
class PipelineSettings:
    """What the pipeline needs to know, whatever the entry point.

    Attributes:
        lake: lake directory (local path or any Hadoop file system URI).
        app_id: idempotent-writer id; unique per checkpoint (run) or per invocation (replay).
        default_format: format of topics not listed in ``topic_formats``.
        topic_formats: topic -> format name.
        format_options: format name -> its options.
        keys: ``db.table`` or ``table`` -> key columns, for tables whose messages carry none (or to override).
        tombstone_retention_seconds: how long deleted keys are remembered to reject late older events.
        name: pipeline name, recorded in bookkeeping tables.
        merge_threads: how many tables' MERGEs of a batch run concurrently.
        ddl_policy: what DDL statements do to lake tables: ``evolve``, ``ignore`` or ``fail`` (see cdclake.evolve).
        ddl_table_policies: ``db.table`` or ``table`` -> policy, overriding ``ddl_policy``.
        sequence_by: ``db.table``, ``table`` or ``*`` -> column whose value orders the table's changes instead of
            the format's position (see :func:`cdclake.apply.sequenced`).
        changelog: tables that get an append-only changelog table (see cdclake.sinks.history.TableSelection).
        scd2: tables that get an SCD type 2 history table (same selection rules).
        dead_letter_handler: when set, receives each batch's dead-letter rows (the ``dead_letters`` columns) instead
            of the ``dead_letters`` table; ``cdclake dlq replay`` records messages that fail again as replay
            outcomes, so one message is never dead-lettered twice.
    """

    lake: str
    app_id: str
    default_format: str | None = None
    topic_formats: Mapping[str, str] = field(default_factory=dict)
    format_options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    keys: Mapping[str, Sequence[str]] = field(default_factory=dict)
    tombstone_retention_seconds: int = 7 * 24 * 3600
    name: str = "cdclake"
    merge_threads: int = 4
    ddl_policy: Policy = "evolve"
    ddl_table_policies: Mapping[str, Policy] = field(default_factory=dict)
    sequence_by: Mapping[str, str] = field(default_factory=dict)
    changelog: history.TableSelection = False
    scd2: history.TableSelection = False
    dead_letter_handler: Callable[[DataFrame], None] | None = None


@dataclass
class BatchResult:
    """What one batch did, for progress output."""

    batch_id: int
    messages: int = 0
    dead_letters: int = 0
    applied: dict[str, int] = field(default_factory=dict)
    """lake table path -> folded changes applied (after per-key folding)."""
    ops: dict[str, int] = field(default_factory=dict)
    """canonical op -> events decoded."""
    seconds: dict[str, float] = field(default_factory=dict)
    """step -> wall-clock seconds spent in it (for tuning and benchmarks)."""

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[step] = self.seconds.get(step, 0.0) + time.perf_counter() - started


class Pipeline:
    """Decodes and applies batches of raw messages into a lake of Delta tables."""

    def __init__(self, spark: SparkSession, settings: PipelineSettings) -> None:
        self.spark = spark
        self.settings = settings
        self.sink = DeltaSink(spark, settings.lake)
        self.history = history.HistorySink(self.sink)
        self.merge_threads = max(1, settings.merge_threads)
        self.evolution = SchemaEvolution(self.sink, settings.ddl_policy, settings.ddl_table_policies)
        # Duplicate keys inside one JSON object keep the last value (as JSON parsers do) instead of failing the
        # whole batch; it is a runtime setting, so it also applies to sessions that spark-submit created.
        spark.conf.set("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
        # Spark still writes timestamps as legacy INT96 by default; other Delta readers (delta-rs, Trino, DuckDB)
        # expect the standard TIMESTAMP_MICROS with UTC semantics.
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        for name in {settings.default_format, *settings.topic_formats.values()} - {None}:
            get_format(str(name))  # fail fast on unknown names
        # Table definitions sent in their own messages (Qlik MD), by (format, schema id): loaded from the lake's
        # metadata table on first use, then kept up to date by decode (see _known_metadata).
        self._metadata: dict[tuple[str, str], TableMetadata] | None = None

    # -------------------------------------------------------------------------------------------------------------

    def decode(self, messages: DataFrame, txn: Txn | None = None) -> DataFrame:
        """Raw messages (key, value, topic, partition, offset, timestamp) -> canonical events.

        Formats with table definitions in their own messages (``CdcFormat.metadata``, Qlik MD) first hand over the
        batch's definitions (all topics of the format), which are stored in ``<lake>/_cdclake/metadata`` (once per
        ``txn``) before the batch is decoded with every definition known so far, earlier batches and runs included.
        """
        settings = self.settings
        parts: list[DataFrame] = []
        listed = sorted(settings.topic_formats)
        by_format: dict[str, list[str]] = {}
        for topic in listed:
            by_format.setdefault(settings.topic_formats[topic], []).append(topic)
        for name, topics in sorted(by_format.items()):
            subset = messages.where(F.col("topic").isin(*topics))
            parts.append(self._decode_format(name, subset, txn))
        if settings.default_format is not None:
            rest = messages.where(~F.col("topic").isin(*listed)) if listed else messages
            parts.append(self._decode_format(settings.default_format, rest, txn))
        if not parts:
            raise ValueError("no format configured")
        return reduce(DataFrame.unionByName, parts)

    METADATA = "metadata"
    """Bookkeeping table of the table definitions read from messages (see decode)."""

    def _decode_format(self, name: str, messages: DataFrame, txn: Txn | None) -> DataFrame:
        fmt = get_format(name)
        options = self.settings.format_options.get(name, {})
        if fmt.metadata is None:
            return fmt.decode(messages, options)
        known = self._known_metadata(name, collect_metadata(fmt.metadata.extract(messages, options)), txn)
        return fmt.metadata.decode(messages, options, known)

    def _known_metadata(self, format_name: str, found: Sequence[TableMetadata], txn: Txn | None) -> list[TableMetadata]:
        """Every definition of ``format_name`` known after storing the new ones among ``found`` (the first stored
        definition of a schema id wins: ids are unique, re-sent definition messages are copies)."""
        if self._metadata is None:
            stored = self.sink.read_system(self.METADATA)
            rows = [] if stored is None else stored.orderBy("recorded_at").collect()
            loaded = unique_metadata(TableMetadata.from_row(row.asDict()) for row in rows)
            self._metadata = {(m.format, m.schema_id): m for m in loaded}
        new = [m for m in found if (m.format, m.schema_id) not in self._metadata]
        if new:
            frame = self.spark.createDataFrame([m.as_row() for m in new], METADATA_SCHEMA).select(
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
        events = apply.sequenced(self.decode(messages), self.settings.sequence_by)
        events = events.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            return self._process(events, batch_id, marker)
        finally:
            events.unpersist()

    def _process(self, events: DataFrame, batch_id: int, txn: Txn | None) -> BatchResult:
        result = BatchResult(batch_id)
        with result.timed("decode"):
            counts = events.groupBy(F.col(model.OP), F.col(model.ERROR).isNotNull().alias("bad")).count().collect()
        for row in counts:
            result.messages += row["count"]
            if row["bad"]:
                result.dead_letters += row["count"]
            else:
                result.ops[str(row[model.OP])] = result.ops.get(str(row[model.OP]), 0) + row["count"]
        if result.messages == 0:
            return result
        if result.dead_letters:
            with result.timed("dead_letters"):
                self._dead_letters(events.where(F.col(model.ERROR).isNotNull()), F.col(model.ERROR), batch_id, txn)
        good = events.where(F.col(model.ERROR).isNull())

        schema_events: list[SchemaEvent] = []
        if result.ops.get(Op.DDL.value) or result.ops.get(Op.TRUNCATE.value):
            with result.timed("ddl"):
                schema_events = self.evolution.collect(good)
        self._apply_around_ddl(good, [e for e in schema_events if e.changes], batch_id, txn, result)
        if schema_events:
            with result.timed("schema_changes"):
                self._schema_changes(good, schema_events, batch_id, txn, result)
        with result.timed("progress"):
            self._progress(good, batch_id, txn)
        if batch_id % 100 == 0:
            with result.timed("expire_tombstones"):
                self.sink.expire_tombstones(self.settings.tombstone_retention_seconds)
        log.info("batch %s: %s", batch_id, {k: round(v, 2) for k, v in result.seconds.items()})
        return result

    def _apply_around_ddl(
        self, good: DataFrame, steps: Sequence[SchemaEvent], batch_id: int, txn: Txn | None, result: BatchResult
    ) -> None:
        """Applies the batch's row events; for tables a DDL statement of the batch changes, in segments: the rows
        ordered before the statement, the statement, the rows after it (each step with its own commit marker)."""
        if not steps:
            self._apply_events(good, batch_id, txn, result)
            return
        order = apply.effective_order(good)
        affected = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE)).isin(
            *SchemaEvolution.affected_table_ids(steps)
        )
        self._apply_events(good.where(~affected), batch_id, txn, result)
        lower: str | None = None
        for index, step in enumerate(steps):
            segment = affected & (order <= F.lit(step.order))
            if lower is not None:
                segment = segment & (order > F.lit(lower))
            self._apply_events(good.where(segment), batch_id, _sub_txn(txn, f"ddl{index}/rows"), result)
            with result.timed("ddl"):
                self.evolution.apply_event(step, _sub_txn(txn, f"ddl{index}/change"))
            lower = step.order
        self._apply_events(good.where(affected & (order > F.lit(lower))), batch_id, _sub_txn(txn, "ddl/rows"), result)

    def _apply_events(self, good: DataFrame, batch_id: int, txn: Txn | None, result: BatchResult) -> None:
        """Plan, create/evolve tables, dead-letter misfits, then fold, gate and merge the row changes."""
        with result.timed("plan"):
            # Tables with only DDL events here are created by their statements (cdclake.evolve), not empty.
            plans = [p for p in apply.plan_tables(good, self.settings.keys) if p.row_events or p.truncate_order]
            table_columns = {plan.table_id: self.sink.ensure_table(plan) for plan in plans}
        with result.timed("types"):
            self.evolution.reconcile_types(plans, table_columns, txn)

        misfit = self._misfit_reason(plans, table_columns)
        if misfit is not None:
            with result.timed("misfit"):
                bad = good.where(misfit.isNotNull())
                extra = bad.count()
                if extra:
                    self._dead_letters(bad, misfit, batch_id, _sub_txn(txn, "misfit"))
                    result.dead_letters += extra
                good = good.where(misfit.isNull())

        if plans:
            self._apply_rows(good, plans, table_columns, txn, result)
        self._history(good, plans, table_columns, txn, result)

    def _apply_rows(
        self,
        good: DataFrame,
        plans: Sequence[apply.TablePlan],
        table_columns: Mapping[str, list[tuple[str, str]]],
        txn: Txn | None,
        result: BatchResult,
    ) -> None:
        changes = apply.row_changes(good, self.settings.keys)
        truncated = [p for p in plans if p.truncate_order]
        if truncated:
            # Changes ordered before a TRUNCATE of their table in the same batch are void.
            keep: Column = F.lit(True)
            for plan in truncated:
                assert plan.truncate_order is not None
                keep = keep & ~((F.col(apply.TABLE_ID) == plan.table_id) & (F.col(apply.ORDER) < plan.truncate_order))
            changes = changes.where(keep)
        with result.timed("fold"):
            folded = self.sink.gate(apply.fold(changes), [p.table_id for p in plans])
            folded = folded.persist(StorageLevel.MEMORY_AND_DISK)
            stats = {
                row[apply.TABLE_ID]: row
                for row in folded.groupBy(apply.TABLE_ID)
                .agg(
                    F.count("*").alias("changes"),
                    F.sum(F.when(F.col(apply.KIND) == apply.DELETE, 1).otherwise(0)).alias("deletes"),
                )
                .collect()
            }
        try:
            with result.timed("merge"):
                for plan in truncated:
                    self.sink.truncate(plan, txn)
                merges = [p for p in plans if p.table_id in stats]

                def merge(plan: apply.TablePlan) -> None:
                    table_changes = folded.where(F.col(apply.TABLE_ID) == plan.table_id)
                    self.sink.merge(plan, table_columns[plan.table_id], table_changes)

                # One commit per table; tables are independent, so their MERGEs overlap (driver-side planning and
                # commit I/O dominate small batches). They share the batch's idempotency marker.
                with self.sink.idempotent(txn), ThreadPoolExecutor(max_workers=self.merge_threads) as pool:
                    for future in [pool.submit(merge, plan) for plan in merges]:
                        future.result()
            for plan in plans:
                path = self.sink.table_path(plan.database, plan.schema, plan.table)
                result.applied[path] = stats[plan.table_id]["changes"] if plan.table_id in stats else 0
            if truncated or any(row["deletes"] for row in stats.values()):
                with result.timed("tombstones"):
                    self.sink.record_tombstones(folded, truncated, txn)
        finally:
            folded.unpersist()

    def _history(
        self,
        good: DataFrame,
        plans: Sequence[apply.TablePlan],
        table_columns: Mapping[str, list[tuple[str, str]]],
        txn: Txn | None,
        result: BatchResult,
    ) -> None:
        """Changelog and SCD2 tables of the tables that have them (settings ``changelog`` / ``scd2``)."""
        changelog = [p for p in plans if history.is_selected(self.settings.changelog, p)]
        scd2 = [p for p in plans if history.is_selected(self.settings.scd2, p)]
        if changelog or scd2:
            with result.timed("history"):
                self.history.record(
                    good, changelog, scd2, table_columns, self.settings.keys, result.batch_id, txn, self.merge_threads
                )

    def _misfit_reason(
        self, plans: Sequence[apply.TablePlan], table_columns: Mapping[str, list[tuple[str, str]]]
    ) -> Column | None:
        """Per event: why a value does not fit the lake table's existing column type (null when it fits).

        The decoder already checked each value against the type its message declares; this only matters when a
        message declares a column with another type than the table already has.
        """
        reason: Column | None = None
        for plan in plans:
            stored = {name.lower(): (name, t) for name, t in table_columns[plan.table_id]}
            differing = [
                (stored[key][0], sorted(types - {stored[key][1]}), stored[key][1])
                for key, types in sorted(plan.declared_types.items())
                if key in stored and types - {stored[key][1]}
            ]
            if not differing:
                continue
            this_table = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE)) == plan.table_id
            for name, declared, table_type in differing:
                message = F.lit(
                    f"value of column {name} (declared {', '.join(declared)}) does not fit the lake table's type "
                    f"{table_type}"
                )
                for image in (F.col(model.AFTER), F.col(model.BEFORE)):
                    text = image[name]
                    lost = this_table & text.isNotNull() & model.typed_value(text, table_type).isNull()
                    reason = F.when(lost, message) if reason is None else reason.when(lost, message)
        return reason

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
        ).dropDuplicates(["topic", "partition", "offset"])
        if self.settings.dead_letter_handler is not None:
            self.settings.dead_letter_handler(rows)
            return
        self.sink.append(DEAD_LETTERS, rows, txn)

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
        rows = [(*(e.row[c] for c in columns), e.outcome) for e in events]
        frame = self.spark.createDataFrame(rows, SCHEMA_CHANGE_ROW).select(
            F.lit(self.settings.name).alias("pipeline"),
            F.lit(batch_id).cast("bigint").alias("batch_id"),
            F.current_timestamp().alias("recorded_at"),
            "*",
        )
        self.sink.append(SCHEMA_CHANGES, frame, txn)

    def _progress(self, good: DataFrame, batch_id: int, txn: Txn | None) -> None:
        """Per table: events by op, last position, last event time. Per Kafka partition: last offset and the
        newest event time of any event, heartbeats included (the source is read up to that time)."""
        common = [
            F.lit(self.settings.name).alias("pipeline"),
            F.lit(batch_id).cast("bigint").alias("batch_id"),
            F.current_timestamp().alias("recorded_at"),
        ]
        op_counts = F.map_from_entries(F.collect_list(F.struct(F.col("op"), F.col("n"))))
        tables = (
            good.where(F.col(model.TABLE).isNotNull())
            .groupBy(model.DATABASE, model.SCHEMA, model.TABLE, model.OP)
            .agg(F.count("*").alias("n"), F.max(model.POSITION).alias("p"), F.max(model.EVENT_TIME).alias("t"))
            .groupBy(model.DATABASE, model.SCHEMA, model.TABLE)
            .agg(
                op_counts.alias("ops"),
                F.sum("n").alias("events"),
                F.max("p").alias("last_position"),
                F.max("t").alias("last_event_time"),
            )
            .select(
                *common,
                F.lit("table").alias("scope"),
                model.DATABASE,
                model.SCHEMA,
                model.TABLE,
                F.lit(None).cast("string").alias("topic"),
                F.lit(None).cast("int").alias("partition"),
                F.lit(None).cast("bigint").alias("last_offset"),
                "events",
                "ops",
                "last_position",
                "last_event_time",
            )
        )
        streams = (
            good.groupBy(model.TOPIC, model.PARTITION, model.OP)
            .agg(F.count("*").alias("n"), F.max(model.OFFSET).alias("o"), F.max(model.EVENT_TIME).alias("t"))
            .groupBy(model.TOPIC, model.PARTITION)
            .agg(
                op_counts.alias("ops"),
                F.sum("n").alias("events"),
                F.max("o").alias("last_offset"),
                F.max("t").alias("last_event_time"),
            )
            .select(
                *common,
                F.lit("stream").alias("scope"),
                F.lit(None).cast("string").alias("database"),
                F.lit(None).cast("string").alias("schema"),
                F.lit(None).cast("string").alias("table"),
                model.TOPIC,
                model.PARTITION,
                "last_offset",
                "events",
                "ops",
                F.lit(None).cast("string").alias("last_position"),
                "last_event_time",
            )
        )
        self.sink.append(PROGRESS, tables.unionByName(streams), txn)
