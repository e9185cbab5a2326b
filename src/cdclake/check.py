"""``cdclake check``: a pipeline's configuration tried on the messages it would read next, writing nothing.

Before a pipeline is started (or after its configuration changed), ``check`` answers what a first run would
otherwise answer the hard way: can the brokers be read with these settings, does the configured format decode
these topics, which source tables are in them, which of them land and in which lake table, what identifies their
rows, which columns and ``table_properties`` values would be added to existing lake tables, where the partitioning
of a lake table would not be the one ``partition_by`` gives, and which rows would not meet a lake table's CHECK
constraints.

It reads up to N messages from where the pipeline would go on (the offsets of the newest batch its checkpoint has
committed, in the partitions it knows; for a new checkpoint, the earliest offsets of the configured topics) with
Spark's Kafka source and the pipeline's Kafka options, and decodes them with
:meth:`cdclake.pipeline.Pipeline.decode` (the decoders ``run`` uses; table definitions found in messages are used,
not stored). Nothing is written: not the lake, not the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdclake import apply, model
from cdclake.config import PipelineConfig
from cdclake.constraints import violation_reason
from cdclake.pipeline import (
    Pipeline,
    PipelineSettings,
    ordering_changed_problem,
    partitions_warning,
    unknown_keys_problem,
    unknown_old_key_warning,
    unordered_change_problem,
)
from cdclake.runner import committed_offsets, settings_from_config
from cdclake.sinks.delta import DeltaSink
from cdclake.sinks.partitioning import described, missing_columns
from cdclake.sources import kafka
from cdclake.sources.files import InputEncoding, check_files, read_file
from cdclake.tables import PerTable, sequence_by_problem


@dataclass(frozen=True)
class TableFinding:
    """One source table seen in the sample.

    Attributes:
        name: ``database.schema.table`` (the parts the messages give).
        events: decoded events of the table, by canonical op.
        lands: ``yes``, ``excluded`` (``tables``), or ``helper`` (an online schema change's helper table).
        lake_table: where it lands, relative to the lake (``routes``); None when it does not land.
        in_lake: whether that lake table exists already.
        key_columns: what identifies its rows; empty: the full row image (no key in messages or ``keys``).
        key_source: ``messages``, ``keys`` (the configuration) or ``none``.
        new_columns: columns the messages carry that the existing lake table lacks (they would be added).
        unmet_constraints: CHECK constraints of the existing lake table (``name (condition)``) -> sampled events
            whose row would not meet it (they would be dead letters; :mod:`cdclake.constraints`).
        misfits: what the lake table cannot hold (``Pipeline.value_misfits``: a value that does not fit its column's
            type, a partition value that would name a folder too long for a file system) -> sampled events with it
            (they would be dead letters); events already counted as ``null_keys`` or ``unordered_changes`` are not.
        setting_problem: why the table's row events would be dead letters because of a per-table setting (``keys``
            naming columns it does not have, a ``sequence_by`` column it does not have, a ``sequence_by`` that
            orders it otherwise than its existing lake table was written), or None.
        setting_warning: what a run would log about the table's settings (a ``sequence_by`` pattern whose column
            the table does not have: it keeps the format's order; changes without a position from several Kafka
            partitions under ``kafka_order: partition``), or None.
        properties_to_set: ``table_properties`` values that the existing lake table lacks or has otherwise (a run
            sets them).
        partitioning_note: how the lake table's partitioning would differ from what ``partition_by`` gives: an
            existing table partitioned otherwise (it keeps its partitioning), or a new table's partition columns
            that the messages do not carry (it would be created without them); None when it would not.
        null_keys: sampled row events with no value in a key column (they would be dead letters: rows with a NULL
            key cannot be told apart).
        unordered_changes: sampled row events that carry the table's ``sequence_by`` column in no image (they would
            be dead letters, :func:`cdclake.apply.unordered_change`: an OGG trail's compressed deletes and updates),
            and the reason their dead letters would give.
        unknown_old_keys: sampled UPDATEs that changed the source's key but whose before image has no value of a
            configured key column (``apply.TablePlan.unknown_old_key_events``): a run applies each to the row its
            after image keys and warns with ``unknown_old_key_warning`` (``pipeline.unknown_old_key_warning``).
        untyped_decimals: columns the messages declare as a bare ``decimal``/``numeric``/``number`` (no precision and
            scale: DTS Canal JSON, DRS JSON) and that therefore land as exact text in a ``string`` column, as
            ``column (vendor type)``; ``column_types`` would type them.
    """

    name: str
    events: dict[str, int]
    lands: str
    lake_table: str | None
    in_lake: bool
    key_columns: list[str]
    key_source: str
    new_columns: list[str]
    unmet_constraints: dict[str, int] = field(default_factory=dict)
    misfits: dict[str, int] = field(default_factory=dict)
    setting_problem: str | None = None
    setting_warning: str | None = None
    properties_to_set: dict[str, str] = field(default_factory=dict)
    partitioning_note: str | None = None
    null_keys: int = 0
    unordered_changes: int = 0
    unordered_problem: str | None = None
    unknown_old_keys: int = 0
    unknown_old_key_warning: str | None = None
    untyped_decimals: list[str] = field(default_factory=list)

    @property
    def refused_by_setting(self) -> int:
        """Sampled row events that ``setting_problem`` would make dead letters."""
        if self.setting_problem is None:
            return 0
        return sum(count for op, count in self.events.items() if op in {o.value for o in model.ROW_OPS})


@dataclass(frozen=True)
class DecodeFailure:
    """A sampled message that does not decode: its coordinates and the reason (as its dead letter would say)."""

    topic: str
    partition: int
    offset: int
    reason: str


@dataclass
class CheckReport:
    """What :func:`check_pipeline` found."""

    started_from: str
    """``checkpoint`` (where the pipeline goes on), ``earliest`` (a new checkpoint) or ``files`` (capture files)."""
    messages: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    """sampled messages with at least one event that does not decode."""
    failures: list[DecodeFailure] = field(default_factory=list)
    """the first of them, by topic, partition and offset."""
    tables: list[TableFinding] = field(default_factory=list)

    @property
    def unmet(self) -> int:
        """Sampled events whose row would not meet a CHECK constraint of its lake table."""
        return sum(sum(table.unmet_constraints.values()) for table in self.tables)

    @property
    def misfits(self) -> int:
        """Sampled events with a value their lake table cannot hold (``TableFinding.misfits``)."""
        return sum(sum(table.misfits.values()) for table in self.tables)

    @property
    def refused_by_settings(self) -> int:
        """Sampled row events that a per-table setting would make dead letters (``TableFinding.setting_problem``)."""
        return sum(table.refused_by_setting for table in self.tables)

    @property
    def null_keys(self) -> int:
        """Sampled row events of landing tables with a NULL key value (``TableFinding.null_keys``)."""
        return sum(table.null_keys for table in self.tables if table.lands == "yes")

    @property
    def unordered_changes(self) -> int:
        """Sampled row events of landing tables that lack their ``sequence_by`` value
        (``TableFinding.unordered_changes``)."""
        return sum(table.unordered_changes for table in self.tables if table.lands == "yes")

    @property
    def ok(self) -> bool:
        """No sampled message would be a dead letter: each decodes, its table's settings fit it, its key has values,
        its ``sequence_by`` column is in it, its lake table can hold its values, and each row meets the table's CHECK
        constraints (an empty sample is no failure)."""
        refused = self.refused_by_settings + self.null_keys + self.unordered_changes + self.misfits
        return self.failed == 0 and self.unmet == 0 and refused == 0


def check_pipeline(
    spark: SparkSession, config: PipelineConfig, *, messages: int = 1000, shown: int = 20
) -> CheckReport:
    """Reads up to ``messages`` messages from where the pipeline would go on and reports what it would do with them
    (see the module doc); ``shown``: how many decode failures are listed."""
    settings = settings_from_config(config, app_id="cdclake-check")
    offsets = committed_offsets(spark, config.checkpoint_location)
    sample = kafka.read_batch(spark, config.kafka.spark_options(), messages, offsets)
    try:
        return check_messages(spark, settings, sample, "checkpoint" if offsets else "earliest", shown=shown)
    finally:
        sample.unpersist()


def check_capture(
    spark: SparkSession, settings: PipelineSettings, paths: Sequence[str], encoding: InputEncoding, *, shown: int = 20
) -> CheckReport:
    """A file replay tried without writing (``cdclake replay --dry-run``): every message of the capture files decoded
    with the replay's settings, and reported as :func:`check_pipeline` reports a sample (``by_topic`` holds the
    messages per file; a failure's coordinates name its file and line, ``sources.files.location``)."""
    captures = [read_file(spark, path, index, encoding) for index, path in enumerate(check_files(paths, spark))]
    try:
        messages = reduce(DataFrame.unionByName, (capture.messages for capture in captures))
        return check_messages(spark, settings, messages, "files", shown=shown)
    finally:
        for capture in captures:
            capture.release()


def check_messages(
    spark: SparkSession, settings: PipelineSettings, messages: DataFrame, started_from: str, *, shown: int = 20
) -> CheckReport:
    """What a pipeline with ``settings`` would do with ``messages`` (Kafka message columns), writing nothing."""
    report = CheckReport(started_from=started_from)
    report.by_topic = {row["topic"]: row["count"] for row in messages.groupBy("topic").count().collect()}
    report.messages = sum(report.by_topic.values())
    if not report.messages:
        return report
    pipeline = Pipeline(spark, settings)
    events = pipeline.decode(messages, store=False).localCheckpoint(eager=True)
    try:
        _failures(events, report, shown)
        report.tables = _tables(pipeline, events)
    finally:
        events.unpersist()
    return report


BARE_DECIMAL_TYPES: Final = ("decimal", "numeric", "number", "dec", "fixed")
"""Vendor type names of a decimal that give no precision and scale (``TableFinding.untyped_decimals``)."""


def _failures(events: DataFrame, report: CheckReport, shown: int) -> None:
    coordinates = ["topic", "partition", "offset"]
    failed = events.where(F.col(model.ERROR).isNotNull()).groupBy(*coordinates).agg(F.min(model.ERROR).alias("reason"))
    report.failed = failed.count()
    rows = failed.orderBy(*coordinates).limit(shown).collect()
    report.failures = [DecodeFailure(r["topic"], r["partition"], r["offset"], r["reason"]) for r in rows]


def _tables(pipeline: Pipeline, events: DataFrame) -> list[TableFinding]:
    settings, sink = pipeline.settings, pipeline.sink
    image = F.coalesce(F.col(model.AFTER), F.col(model.BEFORE))
    good = events.where(F.col(model.ERROR).isNull() & F.col(model.TABLE).isNotNull())
    is_row = F.col(model.OP).isin(*(o.value for o in model.ROW_OPS))
    # As a run finds them (apply.plan_tables): the keys it would use, read in the image that identifies the row.
    event_keys = apply.effective_keys(good, settings.keys)
    staged = good.select(
        "*",
        event_keys.alias("_keys"),
        F.when(is_row, apply.identifying_image()).alias("_identifying"),
        (apply.old_key_unknown(event_keys) if settings.keys else F.lit(False)).alias("_unknown_old_key"),
    )
    null_key = apply.lacks_key_value(F.col("_keys"), F.col("_identifying"))
    unknown_old_key = F.col("_unknown_old_key")
    unordered_event = (
        apply.unordered_change(*apply.carries_sequence_column(settings.sequence_by))
        if settings.sequence_by
        else F.lit(False)
    )
    table = (model.DATABASE, model.SCHEMA, model.TABLE)
    # Aggregates whose size is the tables' and their columns', not the events' (a dry run reads a whole backfill).
    per_table = (
        staged.groupBy(*table)
        .agg(
            F.max(F.when(F.size(model.KEY_COLUMNS) > 0, F.col(model.KEY_COLUMNS))).alias("keys"),
            F.sum(F.when(null_key, 1).otherwise(0)).alias("null_keys"),
            F.sum(F.when(unknown_old_key, 1).otherwise(0)).alias("unknown_old_keys"),
            F.sum(F.when(unordered_event, 1).otherwise(0)).alias("unordered_changes"),
            # Where changes without a position come from (Pipeline._warn_of_partitions).
            F.collect_set(
                F.when(
                    F.col(model.POSITION).isNull() & (is_row | (F.col(model.OP) == model.Op.TRUNCATE.value)),
                    F.struct(F.col(model.TOPIC).alias("topic"), F.col(model.PARTITION).alias("partition")),
                )
            ).alias("unpositioned"),
        )
        .orderBy(*table)
        .collect()
    )
    ops: dict[tuple[str | None, ...], dict[str, int]] = {}
    for row in staged.groupBy(*table, model.OP).count().collect():
        ops.setdefault(tuple(row[name] for name in table), {})[row[model.OP]] = row["count"]
    # Bare DECIMAL types (dts.md 2, drs.md 2 spell them without precision and scale) that land as text.
    untyped: dict[tuple[str | None, ...], list[str]] = {}
    bare_decimals = (
        staged.where(is_row)
        .select(*table, F.explode(model.COLUMNS).alias("_c"))
        .where(
            (F.col("_c")["spark_type"] == "string")
            & F.lower(F.trim(F.col("_c")["vendor_type"])).isin(*BARE_DECIMAL_TYPES)
        )
        .select(*table, F.format_string("%s (%s)", F.col("_c")["name"], F.col("_c")["vendor_type"]).alias("_column"))
        .distinct()
    )
    for row in bare_decimals.orderBy("_column").collect():
        untyped.setdefault(tuple(row[name] for name in table), []).append(row["_column"])
    image_columns: dict[tuple[str | None, ...], list[str]] = {}
    named = staged.select(*table, F.explode(F.map_keys(image)).alias("_column")).distinct()
    for row in named.orderBy("_column").collect():
        image_columns.setdefault(tuple(row[name] for name in table), []).append(row["_column"])
    # The events a run would not refuse for a NULL key or a missing sequence_by value first (Pipeline._misfit_reason).
    checked_for_misfits = staged.where(~F.coalesce(null_key, F.lit(False)) & ~F.coalesce(unordered_event, F.lit(False)))
    plans: list[dict[str, apply.TablePlan]] = []

    def plan_of(ident: tuple[str | None, str | None, str]) -> apply.TablePlan | None:
        if not plans:  # one planning of all tables, for the first table that needs one
            plans.append({p.table_id: p for p in apply.plan_tables(good, settings.keys, settings.sequence_by)})
        return plans[0].get(apply.table_id_of(*ident))

    configured = PerTable.of(settings.keys)
    online = settings.online_schema_change
    kafka_order = pipeline.kafka_order
    findings = []
    for row in per_table:
        ident = (row[model.DATABASE], row[model.SCHEMA], row[model.TABLE])
        counts = ops.get(ident, {})
        found_columns = image_columns.get(ident, [])
        if online is not None and online.is_helper(ident[2]):
            lands = "helper"
        elif not settings.tables.admits(*ident):
            lands = "excluded"
        else:
            lands = "yes"
        lake_table = "/".join(sink.lake_names(*ident)) if lands == "yes" else None
        stored = sink.columns(*ident) if lake_table is not None else None
        keys, key_source = _keys(configured.value_for(*ident), row["keys"])
        known = {name.lower() for name, _ in stored or []}
        new_columns = [c for c in found_columns if stored is not None and c.lower() not in known]
        # The columns the run would find: the lake table's and the ones the messages add (cdclake.pipeline checks
        # the settings against those). The messages' own keys are their declared columns, respelt as the lake
        # spells them: only configured keys can name a column the table does not have.
        columns = [name for name, _ in stored or []] + (new_columns if stored is not None else found_columns)
        configured_keys = keys if key_source == "keys" else []
        key_problem = unknown_keys_problem(ident, configured_keys, columns) if lands == "yes" else None
        unordered = sequence_by_problem(settings.sequence_by, ident, columns) if lands == "yes" else None
        if key_problem is not None:  # its events are dead letters whatever sequence_by says
            unordered = None
        # A table without the column (a pattern's) keeps the format's order, as in a run.
        ordering = PerTable.of(settings.sequence_by).entry_for(*ident)
        has_column = ordering is not None and ordering[1].lower() in {c.lower() for c in columns}
        ordered = lands == "yes" and key_problem is None and has_column
        reordered = (
            _ordering_changed(sink, ident, ordering[1] if ordering and has_column else None, lake_table)
            if stored is not None
            else None
        )
        unordered_changes = int(row["unordered_changes"] or 0) if ordered else 0
        unknown_old_keys = 0 if key_problem is not None else int(row["unknown_old_keys"] or 0)
        unpositioned = sorted((found["topic"], found["partition"]) for found in row["unpositioned"] or [])
        warnings = [unordered.text] if unordered and unordered.warning_only else []
        # A table that sequence_by orders is ordered by its column (the run's events carry positions then).
        spread = (
            partitions_warning(ident, unpositioned)
            if lands == "yes" and kafka_order == "partition" and not ordered
            else None
        )
        if spread is not None:
            warnings.append(spread)
        findings.append(
            TableFinding(
                name=".".join(part for part in ident if part),
                events=dict(sorted(counts.items())),
                lands=lands,
                lake_table=lake_table,
                in_lake=stored is not None,
                key_columns=keys,
                key_source=key_source,
                new_columns=new_columns,
                unmet_constraints=(
                    {} if stored is None or lake_table is None else _unmet(pipeline, events, ident, stored, lake_table)
                ),
                misfits=(
                    _misfits(pipeline, checked_for_misfits, plan_of, ident, stored)
                    if lands == "yes"
                    and key_problem is None
                    and (stored is not None or sink.partition_by.value_for(*ident))
                    else {}
                ),
                setting_problem=key_problem
                or (unordered.text if unordered and not unordered.warning_only else None)
                or reordered,
                setting_warning="; ".join(warnings) or None,
                properties_to_set=sink.properties_to_set(*ident) if stored is not None and lake_table else {},
                partitioning_note=_partitioning_note(sink, ident, stored, columns) if lake_table else None,
                # Events a missing key column already refuses are counted there (setting_problem).
                null_keys=0 if key_problem is not None else int(row["null_keys"] or 0),
                unordered_changes=unordered_changes,
                unknown_old_keys=unknown_old_keys,
                unknown_old_key_warning=unknown_old_key_warning(ident, unknown_old_keys, keys)
                if unknown_old_keys
                else None,
                unordered_problem=unordered_change_problem(ordering[1], ident)
                if ordering and unordered_changes
                else None,
                untyped_decimals=untyped.get(ident, []) if lands == "yes" else [],
            )
        )
    return findings


def _ordering_changed(
    sink: DeltaSink, ident: tuple[str | None, str | None, str], column: str | None, lake_table: str | None
) -> str | None:
    """Why a run would refuse the row events of a table whose existing lake table was written in another order than
    the ``sequence_by`` ``column`` that orders it now (None: its position; ``DeltaSink.ordering_conflict``), or
    None."""
    recorded = sink.recorded_ordering(*ident)
    if lake_table is None or recorded is None or recorded == (column or "").lower() or not sink.holds_orders(*ident):
        return None
    return ordering_changed_problem(ident, recorded, column, lake_table)


def _partitioning_note(
    sink: DeltaSink,
    ident: tuple[str | None, str | None, str],
    stored: Sequence[tuple[str, str]] | None,
    columns: Sequence[str],
) -> str | None:
    """``TableFinding.partitioning_note`` of a landing table with lake columns ``stored`` (None: not in the lake
    yet) and ``columns`` (the lake table's and the messages' new ones)."""
    wanted = sink.partition_by.value_for(*ident)
    if not wanted:
        return None
    if stored is None:
        absent = missing_columns(wanted, columns)
        if not absent:
            return None
        return (
            f"partition_by gives {described(wanted)}, but the messages carry no column {', '.join(absent)}: the lake "
            "table would be created without it"
        )
    has = sink.partitioning(*ident)
    if described(has).lower() == described(wanted).lower():
        return None
    return (
        f"the lake table is partitioned by {described(has)}, partition_by gives {described(wanted)}: an existing "
        "table keeps its partitioning (recreate it to change it)"
    )


def _unmet(
    pipeline: Pipeline,
    events: DataFrame,
    ident: tuple[str | None, str | None, str],
    columns: Sequence[tuple[str, str]],
    lake_table: str,
) -> dict[str, int]:
    """Per CHECK constraint of the table's existing lake table: how many of its events would not meet it, as a run
    would find them: each event's after image first, then, for a table whose events hold partial images (or with a
    condition an image cannot settle), the rows their MERGE would write (``Pipeline.refused_keys``)."""
    constraints = pipeline.sink.check_constraints(*ident)
    if not constraints:
        return {}
    table_id = apply.table_id_of(*ident)
    this_table = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE)) == table_id
    good = events.where(F.col(model.ERROR).isNull() & this_table)
    label = {name: f"{name} ({condition})" for name, condition in constraints.items()}
    defaulted = pipeline.sink.column_defaults(*ident)
    counted: list[tuple[str, Column]] = []
    unchecked: list[str] = []
    for name, condition in sorted(constraints.items()):
        reason, not_checked = violation_reason({name: condition}, columns, lake_table, good, defaulted)
        unchecked += not_checked
        if reason is not None:
            counted.append((label[name], reason))
    unmet: dict[str, int] = {}
    if counted:
        row = good.agg(*(F.count(reason).alias(f"c{i}") for i, (_, reason) in enumerate(counted))).first()
        assert row is not None
        unmet = {name: row[f"c{i}"] for i, (name, _) in enumerate(counted) if row[f"c{i}"]}
    plans = [
        p
        for p in apply.plan_tables(good, pipeline.settings.keys, pipeline.settings.sequence_by)
        if p.table_id == table_id
    ]
    if plans and (plans[0].partial_events or unchecked):
        # What a run checks on the rows: the events that meet every constraint on their images.
        fits = good.where(F.coalesce(*(reason for _, reason in counted)).isNull()) if counted else good
        refused = pipeline.refused_keys(fits, plans, {table_id: list(columns)}, {table_id: constraints})
        by_label = {label[name]: keys for (_, name), keys in refused.items()}
        if by_label:
            reason = pipeline.refused_event_reason(fits, by_label)
            for found in fits.where(reason.isNotNull()).groupBy(reason.alias("label")).count().collect():
                unmet[found["label"]] = unmet.get(found["label"], 0) + found["count"]
    return dict(sorted(unmet.items()))


def _misfits(
    pipeline: Pipeline,
    events: DataFrame,
    plan_of: Callable[[tuple[str | None, str | None, str]], apply.TablePlan | None],
    ident: tuple[str | None, str | None, str],
    stored: Sequence[tuple[str, str]] | None,
) -> dict[str, int]:
    """``TableFinding.misfits`` of a landing table whose lake table has user columns ``stored`` (None: it would be
    created), counted in ``events``."""
    plan = plan_of(ident)
    if plan is None:  # no row events
        return {}
    # The columns a run's MERGE would find: the lake table's, and the ones the plan adds (or creates it with).
    known = {name.lower() for name, _ in stored or []}
    columns = [*(stored or []), *((n, t) for n, t in plan.columns if n.lower() not in known)]
    by_label: dict[str, Column] = {}
    for label, condition, _ in pipeline.value_misfits(plan, columns):
        by_label[label] = by_label[label] | condition if label in by_label else condition
    if not by_label:
        return {}
    labels = sorted(by_label)
    row = events.agg(
        *(F.count_if(F.coalesce(by_label[label], F.lit(False))).alias(f"c{i}") for i, label in enumerate(labels))
    ).first()
    assert row is not None
    return {label: row[f"c{i}"] for i, label in enumerate(labels) if row[f"c{i}"]}


def _keys(configured: Sequence[str] | None, from_messages: Sequence[str] | None) -> tuple[list[str], str]:
    """The key columns the pipeline would use and where they come from: ``keys`` wins over the messages' own."""
    if configured:
        return list(configured), "keys"
    if from_messages:
        return list(from_messages), "messages"
    return [], "none"
