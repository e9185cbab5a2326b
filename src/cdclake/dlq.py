"""``cdclake dlq``: list dead letters, and re-apply them once their cause is fixed, each at most once.

Tables under ``<lake>/_cdclake``:

* ``dead_letters`` (written by the pipeline): one row per message that could not be decoded or did not fit its
  lake table, with its raw key and value, the format that read it and the reason.
* ``dead_letter_replays`` (written here): one row per dead letter and ``dlq replay`` run: the outcome ``applied``
  or ``failed`` (then with the new reason), the replay id and time, and which recording of the dead letter it
  answers (``dead_letter_recorded_at``).

A dead letter is identified by its message's coordinates: Kafka ``topic``, ``partition``, ``offset`` (for capture
files: the file and line, see :mod:`cdclake.sources.files`). When the same message was dead-lettered more than
once (two pipelines, or a capture file replayed twice), its newest recording counts. It is *resolved* when a replay
applied that recording; else *unresolved*, with the newest reason (a failed replay's reason is newer than the
recorded one).

``dlq replay`` decodes the stored raw key and value again, with the format that read them (or ``--format``), under
the message's original coordinates, and applies them through :meth:`cdclake.pipeline.Pipeline.process_batch`, the
path every batch takes: ordering positions, tombstones and the MERGE gate decide, so an old dead letter never
overwrites a newer row. Messages that fail again are handed to this module (``dead_letter_handler``) instead of
being dead-lettered a second time. Given the settings of the pipeline that dead-lettered them (``cdclake dlq replay
--config``), the messages take that pipeline's every path, its history tables and ``sequence_by`` included.

Without duplicates, also across a crash (ordering of writes): the tables are written first, the outcomes after,
in one commit per format. Once an outcome says ``applied``, no later replay selects that dead letter again. A crash
between the two leaves the dead letters unresolved, and the next replay applies them again, which changes nothing
in the tables: each change carries its original position, and the MERGE gate only writes a change whose position is
at least the row's (re-applying writes identical values; anything newer wins). Only bookkeeping rows of the
re-applied batch can appear twice: ``progress`` counts, ``tombstones`` (harmless), ``schema_changes`` records.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import reduce
from pathlib import Path
from typing import Final

from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F

from cdclake import model
from cdclake.exceptions import ConfigError, InputError
from cdclake.formats import get_format
from cdclake.formats.base import MESSAGE_HEADERS
from cdclake.pipeline import DEAD_LETTERS, PROGRESS, Pipeline, PipelineSettings
from cdclake.sinks import TableFormat, lake_sink
from cdclake.sinks.delta import DeltaSink
from cdclake.sources.files import is_uri
from cdclake.spark import local_frame
from cdclake.tables import OnlineSchemaChange, PerTable, TableFilter, TableRoutes

log = logging.getLogger(__name__)

DEAD_LETTER_REPLAYS: Final = "dead_letter_replays"
APPLIED: Final = "applied"
FAILED: Final = "failed"
IDENTITY: Final = model.MESSAGE_COORDINATES
"""Columns that identify a dead letter: the coordinates of its message."""


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a command looks at; every given criterion must hold.

    Attributes:
        pipeline: name of the pipeline that recorded it (``cdclake replay`` records as ``replay``).
        topic: Kafka topic (for capture files: the file path, as given or absolute).
        table: source table, ``table`` or ``database.table``.
        reason: text contained in the current reason (case-insensitive).
        since: recorded at or after this instant (a naive datetime is UTC).
    """

    pipeline: str | None = None
    topic: str | None = None
    table: str | None = None
    reason: str | None = None
    since: datetime | None = None

    def condition(self) -> Column:
        condition: Column = F.lit(True)
        if self.pipeline is not None:
            condition &= F.col("pipeline") == self.pipeline
        if self.topic is not None:
            condition &= F.col("topic").isin(*self._topic_names())
        if self.table is not None:
            if "." in self.table:
                condition &= F.concat_ws(".", F.col("database"), F.col("table")) == self.table
            else:
                condition &= F.col("table") == self.table
        if self.reason is not None:
            condition &= F.lower(F.col("reason")).contains(self.reason.lower())
        if self.since is not None:
            since = self.since if self.since.tzinfo else self.since.replace(tzinfo=UTC)
            condition &= F.col("recorded_at") >= F.lit(since)
        return condition

    def _topic_names(self) -> list[str]:
        """``topic`` as given, and for a capture file named by a path on this machine, that path made absolute (a
        file replay records the absolute path; a Kafka topic name holds no ``/``, so it cannot match by mistake)."""
        assert self.topic is not None
        if is_uri(self.topic):
            return [self.topic]
        return list(dict.fromkeys([self.topic, str(Path(self.topic).resolve())]))


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter in its current state."""

    topic: str
    partition: int
    offset: int
    pipeline: str
    format: str | None
    database: str | None
    table: str | None
    reason: str
    """The newest reason: of the last failed replay, else the recorded one."""
    recorded_at: datetime
    """When its newest recording was made."""
    recordings: int
    """How many times the message was dead-lettered (by pipelines; replays never add one)."""
    failed_replays: int
    """Replays of the newest recording that failed again."""
    resolved_at: datetime | None
    """When a replay applied it; None while unresolved."""
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    """The message's Kafka headers (name, value), in order; none for dead letters recorded before they were kept."""

    @property
    def resolved(self) -> bool:
        return self.resolved_at is not None


@dataclass(frozen=True)
class DeadLetterList:
    """The first ``limit`` matching dead letters, and how many matched in all."""

    dead_letters: list[DeadLetter]
    matched: int
    unresolved: int


@dataclass(frozen=True)
class ReplayFailure:
    """A dead letter that failed again, with the new reason."""

    topic: str
    partition: int
    offset: int
    reason: str


@dataclass
class ReplayReport:
    """What one ``dlq replay`` did (or, with ``dry_run``, would do)."""

    replay_id: str
    dry_run: bool
    selected: int = 0
    """Unresolved dead letters matching the filters."""
    applied: int = 0
    """Dead letters that went through (or, dry run: would decode)."""
    failures: list[ReplayFailure] = field(default_factory=list)
    """Dead letters that failed again (dry run: those that still do not decode; misfits show only when applying)."""
    formats: dict[str, int] = field(default_factory=dict)
    """format used -> dead letters decoded with it."""
    changes: dict[str, int] = field(default_factory=dict)
    """lake table path -> folded row changes merged (including those the MERGE found older than the row)."""


# ----------------------------------------------------------------------------------------------------------------
# State


def _states(sink: DeltaSink) -> DataFrame | None:
    """Every dead letter (newest recording per message) with its replay state; None when there are none yet."""
    dead = sink.read_system(DEAD_LETTERS)
    if dead is None:
        return None
    per_message = Window.partitionBy(*IDENTITY)
    newest_first = per_message.orderBy(F.col("recorded_at").desc(), F.col("batch_id").desc(), F.col("reason"))
    current = (
        dead.withColumn("recordings", F.count(F.lit(1)).over(per_message))
        .withColumn("_rank", F.row_number().over(newest_first))
        .where(F.col("_rank") == 1)
        .drop("_rank")
    )
    replays = sink.read_system(DEAD_LETTER_REPLAYS)
    if replays is None:
        return current.select(
            "*",
            F.lit(0).cast("bigint").alias("failed_replays"),
            F.lit(None).cast("timestamp").alias("resolved_at"),
        )
    # Outcomes answer one recording: a message dead-lettered again after a replay applied it is unresolved again.
    answered = [*(F.col(name) for name in IDENTITY), F.col("dead_letter_recorded_at").alias("recorded_at")]
    failed = (
        replays.where(F.col("outcome") == FAILED)
        .groupBy(*answered)
        .agg(F.count(F.lit(1)).alias("failed_replays"), F.max_by("reason", "replayed_at").alias("last_failure"))
    )
    applied = (
        replays.where(F.col("outcome") == APPLIED).groupBy(*answered).agg(F.min("replayed_at").alias("resolved_at"))
    )
    recording = [*IDENTITY, "recorded_at"]
    return (
        current.join(failed, recording, "left")
        .join(applied, recording, "left")
        .select(
            *(name for name in current.columns if name != "reason"),
            F.coalesce(F.col("last_failure"), F.col("reason")).alias("reason"),
            F.coalesce(F.col("failed_replays"), F.lit(0)).cast("bigint").alias("failed_replays"),
            "resolved_at",
        )
    )


def _selected(sink: DeltaSink, filters: DeadLetterFilter, *, include_resolved: bool) -> DataFrame | None:
    states = _states(sink)
    if states is None:
        if sink.read_system(PROGRESS) is None:  # nothing was ever applied here: most likely a wrong --lake
            raise InputError(f"no cdclake lake at {sink.lake} (it has no _cdclake/progress table); check --lake")
        return None
    matching = states.where(filters.condition())
    return matching if include_resolved else matching.where(F.col("resolved_at").isNull())


def list_dead_letters(
    spark: SparkSession,
    lake: str,
    filters: DeadLetterFilter | None = None,
    *,
    include_resolved: bool = False,
    limit: int | None = None,
) -> DeadLetterList:
    """Dead letters matching ``filters`` in message order (topic, partition, offset), unresolved only unless
    ``include_resolved``; at most ``limit`` of them, with the count of all that matched."""
    selected = _selected(DeltaSink(spark, lake), filters or DeadLetterFilter(), include_resolved=include_resolved)
    if selected is None:
        return DeadLetterList([], 0, 0)
    selected = selected.persist()
    try:
        counts = selected.agg(
            F.count(F.lit(1)).alias("matched"), F.count(F.when(F.col("resolved_at").isNull(), 1)).alias("unresolved")
        ).first()
        assert counts is not None
        ordered = selected.orderBy(*IDENTITY)
        rows = (ordered.limit(limit) if limit is not None else ordered).collect()
    finally:
        selected.unpersist()
    has_headers = MESSAGE_HEADERS in selected.columns  # not in a table written before headers were kept
    dead_letters = [
        DeadLetter(
            topic=row["topic"],
            partition=row["partition"],
            offset=row["offset"],
            pipeline=row["pipeline"],
            format=row["format"],
            database=row["database"],
            table=row["table"],
            reason=row["reason"],
            recorded_at=row["recorded_at"],
            recordings=row["recordings"],
            failed_replays=row["failed_replays"],
            resolved_at=row["resolved_at"],
            key=None if row["key"] is None else bytes(row["key"]),
            value=None if row["value"] is None else bytes(row["value"]),
            headers=_headers(row[MESSAGE_HEADERS] if has_headers else None),
        )
        for row in rows
    ]
    return DeadLetterList(dead_letters, counts["matched"], counts["unresolved"])


def _headers(stored: Sequence[Row] | None) -> tuple[tuple[str, bytes | None], ...]:
    return tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in stored or ())


# ----------------------------------------------------------------------------------------------------------------
# Replay


def replay_dead_letters(
    spark: SparkSession,
    lake: str,
    *,
    format_name: str | None = None,
    keys: Mapping[str, Sequence[str]] | None = None,
    format_options: Mapping[str, str] | None = None,
    filters: DeadLetterFilter | None = None,
    dry_run: bool = False,
    table_format: TableFormat | None = None,
    iceberg_catalog: str | None = None,
    tables: TableFilter | None = None,
    routes: TableRoutes | None = None,
    online_schema_change: OnlineSchemaChange | None = None,
    pipeline: PipelineSettings | None = None,
    column_types: Mapping[str, Mapping[str, str]] | None = None,
    sequence_by: Mapping[str, str] | None = None,
) -> ReplayReport:
    """Decodes the unresolved dead letters matching ``filters`` again and applies them (see the module doc).

    Args:
        format_name: decode every selected dead letter with this format instead of the one that read it.
        keys: key columns per ``db.table`` or ``table``, as the pipeline's ``keys`` (added to ``pipeline``'s). A
            table without configured keys whose messages carry none uses the key columns the lake table was
            created with.
        column_types: types of columns whose messages carry none, per table (as the pipeline's ``column_types``,
            added to ``pipeline``'s column by column): the fix of a dead letter whose value did not fit the type.
        sequence_by: the column that orders a table's changes, per table or pattern (as the pipeline's
            ``sequence_by``, added to ``pipeline``'s): the fix of a dead letter that named a column its table lacks.
            A table that the pipeline ordered by a column must be replayed with it too, or its replayed changes
            would be ordered by the log and compared with the stored rows' versions.
        format_options: options of the format used (over ``pipeline``'s options of that format); with dead letters
            of several formats, ``format_name`` must say which.
        dry_run: only decode, and report which dead letters would go through and which still fail to decode;
            nothing is written.
        table_format, iceberg_catalog: the lake tables' format (default ``delta``) and, for Iceberg, their catalog
            (as the pipeline's).
        tables, routes: which source tables land, and in which lake tables (give the pipeline's ``tables`` and
            ``routes``; default every table, in ``<database>/<table>``). A dead letter of a table ``tables`` leaves
            out changes nothing, as in the pipeline, and is recorded as applied (it is resolved).
        online_schema_change: the pipeline's ``ddl.online_schema_change``: without it, a dead-lettered cut-over of
            an online schema change would be applied as a plain ``RENAME TABLE``, moving the table's rows away.
        pipeline: the settings of the pipeline that dead-lettered the messages (``cdclake.runner.settings_from_config``
            gives them from its configuration). Replayed messages then take its every path: format options, keys,
            tables, routes, DDL policies, ``sequence_by``, changelog and SCD2 tables, deletion vectors, table format.
            The arguments above that are given win over its settings. Its transaction-consistent mode is not used:
            a dead letter is one message of its transaction, whose other messages were applied long ago.
    """
    base = pipeline or PipelineSettings(lake=lake, app_id="")
    if base.lake.rstrip("/") != lake.rstrip("/"):
        raise ValueError(f"the pipeline's lake is {base.lake}, not {lake}")
    shared = replace(
        base,
        keys={**base.keys, **{k: list(v) for k, v in (keys or {}).items()}},
        sequence_by={**base.sequence_by, **(sequence_by or {})},
        column_types={
            table: {**base.column_types.get(table, {}), **(column_types or {}).get(table, {})}
            for table in {**base.column_types, **(column_types or {})}
        },
        tables=base.tables if tables is None else tables,
        routes=base.routes if routes is None else routes,
        online_schema_change=base.online_schema_change if online_schema_change is None else online_schema_change,
        table_format=table_format or base.table_format,
        iceberg_catalog=base.iceberg_catalog if iceberg_catalog is None else iceberg_catalog,
        topic_formats={},
        name="dlq-replay",
        transaction_consistent=False,
        dead_letter_handler=None,
    )
    sink = lake_sink(spark, lake, shared.table_format, iceberg_catalog=shared.iceberg_catalog, routes=shared.routes)
    report = ReplayReport(replay_id=f"dlq-{uuid.uuid4()}", dry_run=dry_run)
    if format_name is not None:
        get_format(format_name)  # an unknown name stops here, with the known ones
    selected = _selected(sink, filters or DeadLetterFilter(), include_resolved=False)
    if selected is None:
        return report
    # Materialised: the outcomes written below change what _states selects.
    pending = selected.select(
        *IDENTITY,
        "key",
        "value",
        # Dead letters recorded before headers were kept have no such column (_messages reads it where there is).
        *([MESSAGE_HEADERS] if MESSAGE_HEADERS in selected.columns else []),
        "kafka_timestamp",
        "recorded_at",
        F.lit(format_name).cast("string").alias("_use") if format_name else F.col("format").alias("_use"),
    ).localCheckpoint(eager=True)
    groups = {row["_use"]: row["count"] for row in pending.groupBy("_use").count().collect()}
    report.selected = sum(groups.values())
    if None in groups:
        raise ConfigError(
            "--format", f"{groups[None]} dead letters do not record the format that read them", "pass --format NAME"
        )
    if format_options and len(groups) > 1:
        raise ConfigError(
            "--option",
            f"the selected dead letters were read with several formats ({', '.join(sorted(groups))})",
            "add --format NAME, or select one format's dead letters with --topic / --table",
        )
    for name in groups:
        get_format(name)
    for batch_id, name in enumerate(sorted(groups)):
        group = pending.where(F.col("_use") == name)
        report.formats[name] = groups[name]
        settings = replace(
            shared,
            app_id=f"cdclake-{report.replay_id}",
            default_format=name,
            format_options={name: {**base.format_options.get(name, {}), **(format_options or {})}},
        )
        if dry_run:
            failures = _decode_failures(spark, settings, group)
        else:
            failures = _replay_group(spark, sink, settings, group, batch_id, report.changes)
            _record_outcomes(sink, report.replay_id, group, failures)
        failed = [ReplayFailure(r["topic"], r["partition"], r["offset"], r["reason"]) for r in failures.collect()]
        report.failures.extend(sorted(failed, key=lambda f: (f.topic, f.partition, f.offset)))
        report.applied += groups[name] - len(failed)
    return report


def _messages(group: DataFrame) -> DataFrame:
    """Raw messages under their original coordinates, so that they are ordered exactly as when first received."""
    headers = [MESSAGE_HEADERS] if MESSAGE_HEADERS in group.columns else []
    return group.select("key", "value", *IDENTITY, F.col("kafka_timestamp").alias("timestamp"), *headers)


def _decode_failures(spark: SparkSession, settings: PipelineSettings, group: DataFrame) -> DataFrame:
    """(topic, partition, offset, reason) of the dead letters that still do not decode; nothing is written."""
    decoded = _materialised(Pipeline(spark, settings).decode(_messages(group), store=False))
    return decoded.where(F.col(model.ERROR).isNotNull()).groupBy(*IDENTITY).agg(F.min(model.ERROR).alias("reason"))


def _materialised(decoded: DataFrame) -> DataFrame:
    """Decoded events computed once, before they are filtered.

    A filter on a decoder's output is pushed down through its projections with every column reference replaced by
    its expression; for the Avro decoders (DTS, DRS) that inlining grows without bound: the optimizer ran out of a
    3 GiB heap before reading a row (``error IS NOT NULL`` on 50 messages), and took 2 minutes with 4 GiB. The
    pipeline filters a local checkpoint of the events for the same reason (``Pipeline._decoded``).
    """
    return decoded.localCheckpoint(eager=True)


def _table_keys(
    spark: SparkSession, sink: DeltaSink, settings: PipelineSettings, messages: DataFrame
) -> dict[str, list[str]]:
    """Configured keys, plus the recorded key columns of each existing table whose events carry no key and has
    none configured: the pipeline that dead-lettered them had its ``keys`` setting, which a replay must not lose
    (an update applied under another key would add a second row instead of replacing the first)."""
    keys = {name: list(columns) for name, columns in settings.keys.items()}
    decoded = _materialised(Pipeline(spark, settings).decode(messages))
    keyless = (
        decoded.where(
            F.col(model.ERROR).isNull()
            & F.col(model.OP).isin(*(op.value for op in model.ROW_OPS))
            & (F.size(F.coalesce(F.col(model.KEY_COLUMNS), F.array())) == 0)
        )
        .select(model.DATABASE, model.SCHEMA, model.TABLE)
        .distinct()
        .collect()
    )
    configured = PerTable.of(keys)
    for row in keyless:
        database, schema, table = row[model.DATABASE], row[model.SCHEMA], row[model.TABLE]
        if configured.value_for(database, schema, table) is not None:
            continue
        recorded = sink.recorded_key_columns(database, schema, table)
        if recorded:
            # Its most qualified name: it wins over any pattern, and names no other table.
            qualified = ".".join(part for part in (database, schema, table) if part)
            log.info("dlq replay: %s uses the key columns its lake table was created with: %s", qualified, recorded)
            keys[qualified] = recorded
    return keys


def _replay_group(
    spark: SparkSession,
    sink: DeltaSink,
    settings: PipelineSettings,
    group: DataFrame,
    batch_id: int,
    changes: dict[str, int],
) -> DataFrame:
    """Applies one format's dead letters as one batch; returns (topic, partition, offset, reason) of those that
    failed again, and adds the row changes per lake table to ``changes``."""
    messages = _messages(group)
    failed_again: list[DataFrame] = []

    def keep_failures(rows: DataFrame) -> None:
        # Materialised now: the batch's decoded events are released when process_batch returns.
        failed_again.append(rows.select(*IDENTITY, "reason").localCheckpoint(eager=True))

    keys = _table_keys(spark, sink, settings, messages)
    pipeline = Pipeline(spark, replace(settings, keys=keys, dead_letter_handler=keep_failures))
    result = pipeline.process_batch(messages, batch_id)
    for path, count in result.applied.items():
        changes[path] = changes.get(path, 0) + count
    if not failed_again:
        return local_frame(spark, [], "topic string, partition int, offset bigint, reason string")
    # A message can fail twice in one batch (one event undecodable, another a misfit): one outcome per message.
    return reduce(DataFrame.unionByName, failed_again).groupBy(*IDENTITY).agg(F.min("reason").alias("reason"))


def _record_outcomes(sink: DeltaSink, replay_id: str, group: DataFrame, failures: DataFrame) -> None:
    """One outcome per replayed dead letter, in one commit, written after the tables (see the module doc)."""
    outcomes = group.join(failures, list(IDENTITY), "left").select(
        F.lit(replay_id).alias("replay_id"),
        F.current_timestamp().alias("replayed_at"),
        *IDENTITY,
        F.col("recorded_at").alias("dead_letter_recorded_at"),
        F.col("_use").alias("format"),
        F.when(F.col("reason").isNull(), F.lit(APPLIED)).otherwise(F.lit(FAILED)).alias("outcome"),
        "reason",
    )
    sink.append(DEAD_LETTER_REPLAYS, outcomes, None)
