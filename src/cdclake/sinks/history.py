"""History tables, opt-in per source table: an append-only changelog of canonical row events, and an SCD type 2
table holding every version of every row. They are stored by the lake tables' sink, in the same table format: it
names them, creates, reads, alters and MERGEs them (:meth:`~cdclake.sinks.delta.DeltaSink.merge_rows`), and marks
their commits with the batch's :class:`~cdclake.sinks.delta.Txn`; this module only says what to write.

Layout (Delta; :meth:`~cdclake.sinks.delta.DeltaSink.history_path`)::

    <lake>/_cdclake/changelog/<database>/<table>   one row per distinct source row event (and TRUNCATE)
    <lake>/_cdclake/scd2/<database>/<table>        one row per version of a row key

With Iceberg lake tables they are tables ``_changelog_<table>`` and ``_scd2_<table>`` beside the lake table, in its
namespace (:meth:`~cdclake.sinks.iceberg.IcebergSink.history_path`). Either way
:func:`~cdclake.sinks.delta.safe_name` never yields a name starting with ``_``, so no source database or table can
collide with them. Each table gets one commit per batch, marked with the batch's marker; on top of that both are
idempotent by content, so a batch re-run without the marker adds nothing either.

**Changelog.** The table's user columns hold the event's row image (the after image; the before image for events
without one: DELETE and the first half of a split update), typed like the lake table, followed by the columns of
:data:`CHANGELOG_COLUMNS`. An event is identified by (``_cdc_position``, ``_cdc_sub_index``, ``_cdc_key``): re-sent
copies of an event (same vendor position) are logged once; events of formats without a position are identified by
their Kafka coordinates, so only a re-read of the same offsets is recognised.

**SCD2.** A row per change of a key: ``UPSERT`` rows are versions; ``DELETE`` and ``TRUNCATE`` rows mark the key
absent (``_cdc_is_deleted``) and show the row as it was when it went. ``_cdc_valid_from`` is the order of the
change (see :mod:`cdclake.apply`), ``_cdc_valid_to`` the order of the key's next change (null for the newest row,
which is ``_cdc_is_current``). The live rows are ``_cdc_is_current AND NOT _cdc_is_deleted``; the rows as of
order ``o`` are ``_cdc_valid_from <= o AND (_cdc_valid_to IS NULL OR o < _cdc_valid_to) AND NOT _cdc_is_deleted``.
A TRUNCATE also leaves one marker row without key (``_cdc_row_key`` null, empty interval), so that changes of any
key that arrive later, but are older than the truncate, are still closed by it. A table that ``sequence_by`` orders
by a column (``TablePlan.ordered_by_column``) orders its changes by ``value|position`` and its truncates by position
(:func:`cdclake.apply.log_order`): once it has a truncate, its chains are placed by log epoch (how many truncates the
log wrote before the change), then by order, and read whole, since the two kinds of order do not bound each other.

Every batch recomputes, with window functions, the chain of each key it touches from the stored rows that can
change (those still open at the key's oldest change in the batch) plus the batch's changes, and applies the
difference in one MERGE: inserted rows, re-closed rows, and rows that must go (the delete half of a split update
whose other half arrived in a later batch). Changes arriving late or out of order across batches land in their
place by order.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructField, StructType, _parse_datatype_string

from cdclake import apply, model
from cdclake.apply import TablePlan
from cdclake.ddl import widened
from cdclake.model import Op, quote
from cdclake.sinks.delta import (
    EVENT_TIME_COLUMN,
    NO_CONSTRAINT_PROPAGATION,
    OP_COLUMN,
    POSITION_COLUMN,
    ColumnPath,
    DeltaSink,
    MergeStatement,
    Txn,
    concurrently,
    in_turns,
    inserted_rows,
    source_properties,
    sql_string,
    turn_marker,
    type_at,
)
from cdclake.spark import castable, local_frame, session_settings, valueless_as
from cdclake.tables import TableFilter

log = logging.getLogger(__name__)

CHANGELOG_DIR: Final = "changelog"
SCD2_DIR: Final = "scd2"

TableSelection = bool | Sequence[str]
"""Which tables get a history table: ``True`` every table, ``False`` none, or names (``db.table``, where ``db`` is
the database or, for sources without one, the schema; ``db.schema.table``; or a bare ``table``), which may be glob
patterns as in ``tables.include`` (``shop.orders_*``: every shard that ``routes`` merge)."""

# ----------------------------------------------------------------------------------------------------------------
# Changelog columns, after the user columns. POSITION_COLUMN, EVENT_TIME_COLUMN and OP_COLUMN as in user tables.

VENDOR_OP_COLUMN: Final = "_cdc_vendor_op"
TXN_ID_COLUMN: Final = "_cdc_txn_id"
KEY_COLUMN: Final = "_cdc_key"
"""Key values of the event's row as JSON text (a JSON array in key-column order); null for TRUNCATE."""
BEFORE_COLUMN: Final = "_cdc_before"
"""Before image as a struct of the typed user columns; null when the event carries none."""
PARTIAL_COLUMN: Final = "_cdc_after_is_partial"
CAPTURED_COLUMN: Final = "_cdc_after_columns"
"""For partial after images, the columns the image carries (the others show NULL but were not captured)."""
TOPIC_COLUMN: Final = "_cdc_topic"
PARTITION_COLUMN: Final = "_cdc_partition"
OFFSET_COLUMN: Final = "_cdc_offset"
SUB_INDEX_COLUMN: Final = "_cdc_sub_index"
BATCH_ID_COLUMN: Final = "_cdc_batch_id"
"""Batch that logged the event first."""

CHANGELOG_COLUMNS: Final = (
    (OP_COLUMN, "string"),
    (VENDOR_OP_COLUMN, "string"),
    (POSITION_COLUMN, "string"),
    (EVENT_TIME_COLUMN, "timestamp"),
    (TXN_ID_COLUMN, "string"),
    (KEY_COLUMN, "string"),
    # BEFORE_COLUMN (a struct of the user columns) goes here
    (PARTIAL_COLUMN, "boolean"),
    (CAPTURED_COLUMN, "array<string>"),
    (TOPIC_COLUMN, "string"),
    (PARTITION_COLUMN, "int"),
    (OFFSET_COLUMN, "bigint"),
    (SUB_INDEX_COLUMN, "int"),
    (BATCH_ID_COLUMN, "bigint"),
)

# ----------------------------------------------------------------------------------------------------------------
# SCD2 columns, after the user columns.

ROW_KEY_COLUMN: Final = "_cdc_row_key"
"""Key values as JSON text (the apply engine's row key); null on TRUNCATE marker rows."""
VALID_FROM_COLUMN: Final = "_cdc_valid_from"
VALID_TO_COLUMN: Final = "_cdc_valid_to"
VALID_FROM_TIME_COLUMN: Final = "_cdc_valid_from_time"
"""Source event time of the change that produced the row."""
VALID_TO_TIME_COLUMN: Final = "_cdc_valid_to_time"
"""Source event time of the key's next change."""
IS_CURRENT_COLUMN: Final = "_cdc_is_current"
IS_DELETED_COLUMN: Final = "_cdc_is_deleted"
TRUNCATE: Final = Op.TRUNCATE.value
"""``_cdc_op`` of SCD2 rows closed by a TRUNCATE, beside apply.UPSERT and apply.DELETE."""

SCD2_COLUMNS: Final = (
    (ROW_KEY_COLUMN, "string"),
    (VALID_FROM_COLUMN, "string"),
    (VALID_TO_COLUMN, "string"),
    (VALID_FROM_TIME_COLUMN, "timestamp"),
    (VALID_TO_TIME_COLUMN, "timestamp"),
    (IS_CURRENT_COLUMN, "boolean"),
    (IS_DELETED_COLUMN, "boolean"),
    (OP_COLUMN, "string"),
)

_HALF_SUFFIX = re.compile(r"/[01]$")


def is_selected(selection: TableSelection, plan: TablePlan) -> bool:
    """Whether ``selection`` (see :data:`TableSelection`) names the plan's table."""
    if isinstance(selection, bool):
        return selection
    names = [selection] if isinstance(selection, str) else list(selection)
    return bool(names) and TableFilter.of(include=names).admits(plan.database, plan.schema, plan.table)


def _position_text(order: str) -> str:
    """The position part of an order (without the split-update half suffix): a lower bound of every order of the
    same position, the first half included."""
    return _HALF_SUFFIX.sub("", order)


def _position_of(order: Column) -> Column:
    return F.regexp_replace(order, _HALF_SUFFIX.pattern, "")


def _placed(chain_part: DataFrame, truncate_positions: Sequence[str]) -> DataFrame:
    """``chain_part`` (SCD2 chain events) with the two columns the chain sorts by before ``_order``: ``_epoch``, how
    many of ``truncate_positions`` (sorted) the log wrote before the event, and ``_tail``, 1 for a truncate (the
    batch's marker events and the rows stored for them), which closes its epoch, else 0. Both 0 when no positions
    are given (the chain is ordered by ``_order`` alone)."""
    if not truncate_positions:
        return chain_part.select("*", F.lit(0).alias("_epoch"), F.lit(0).alias("_tail"))
    staged = chain_part.select("*", apply.log_order(F.col("_order")).alias("_log"))
    log, positions = F.col("_log"), F.array(*(F.lit(position) for position in truncate_positions))
    is_truncate = F.col("_kind") == TRUNCATE
    # A row change at a truncate's own position comes after it, as in the lake table (whose DELETE keeps the rows
    # at the truncate's position): the rows a RENAME TABLE moves into a table, versions at the statement's position.
    epoch = F.when(is_truncate, F.size(F.filter(positions, lambda t: t < log))).otherwise(
        F.size(F.filter(positions, lambda t: t <= log))
    )
    tail = F.when(is_truncate, 1).otherwise(0)
    return staged.select("*", epoch.alias("_epoch"), tail.alias("_tail")).drop("_log")


def _typed(spark_type: str) -> DataType:
    return _parse_datatype_string(spark_type)


@dataclass(frozen=True)
class _Work:
    """One history table to write in a batch."""

    kind: Literal["changelog", "scd2"]
    plan: TablePlan
    columns: list[tuple[str, str]]
    """The lake table's (name, type) user columns."""
    oldest: str
    """Oldest order of the table's events in the batch."""
    truncates: list[tuple[str, datetime | None]]
    """(order, event time) of every TRUNCATE of the table in the batch, oldest first."""
    sources: tuple[str, ...]
    """The source tables whose events go into this history table (:func:`apply.table_id`): the plan's, and those of
    the other source tables that share its lake table and write with it (:func:`_together`)."""
    partial: bool
    """Whether an event of these tables in the batch has a partial after image (SCD2 then carries each column's value
    from change to change, see :meth:`HistorySink._scd2`)."""


def _together(work: Sequence[_Work], path_of: Callable[[_Work], str]) -> list[_Work]:
    """``work`` with the items that write one history table (source tables sharing a lake table: routed shards, one
    name in several schemas) as one item, hence one MERGE and one commit per batch instead of one per source table,
    when they have the same key columns and no TRUNCATE in the batch: the lake tables' MERGE units
    (``Pipeline._merge_units``) follow the same rule. The others stay apart and are written in turns (``in_turns``).

    Decided from the items only, so that a re-run of the batch makes the same commits."""
    groups: dict[tuple[str, str, tuple[str, ...]], list[_Work]] = {}
    items: list[_Work] = []
    for item in sorted(work, key=lambda w: (w.plan.table_id, w.kind)):
        if item.truncates:
            items.append(item)
        else:
            keys = tuple(k.lower() for k in item.plan.key_columns)
            groups.setdefault((item.kind, path_of(item), keys), []).append(item)
    for first, *others in groups.values():
        if not others:
            items.append(first)
            continue
        # The lake table's columns, as each plan saw them: the union, should one plan predate a column.
        columns = list(first.columns)
        known = {name.lower() for name, _ in columns}
        for item in others:
            columns += [(name, t) for name, t in item.columns if name.lower() not in known]
            known |= {name.lower() for name, _ in item.columns}
        oldest = min(item.oldest for item in (first, *others))
        sources = tuple(item.plan.table_id for item in (first, *others))
        partial = any(item.partial for item in (first, *others))
        items.append(_Work(first.kind, first.plan, columns, oldest, [], sources, partial))
    return items


class HistorySink:
    """Writes the changelog and SCD2 tables of a batch (see the module doc)."""

    def __init__(self, sink: DeltaSink) -> None:
        self.sink = sink
        self.spark = sink.spark
        # Schemas of the history tables this sink has seen, so a batch without new columns does not re-read the log.
        self._schemas: dict[str, StructType] = {}
        # path -> (column, type) retypes refused because stored values would not fit (see _retype): not retried.
        self._kept_types: dict[str, set[tuple[ColumnPath, str]]] = {}
        # path -> table properties of a history table left to its first write, which creates it with its rows.
        self._awaiting_creation: dict[str, dict[str, str]] = {}

    def changelog_path(self, plan: TablePlan) -> str:
        return self._path(CHANGELOG_DIR, plan)

    def scd2_path(self, plan: TablePlan) -> str:
        return self._path(SCD2_DIR, plan)

    def _path_of(self, item: _Work) -> str:
        return self.changelog_path(item.plan) if item.kind == "changelog" else self.scd2_path(item.plan)

    def _path(self, kind: str, plan: TablePlan) -> str:
        return self.sink.history_path(kind, plan.database, plan.schema, plan.table)

    # ---------------------------------------------------------------------------------------------------------

    def record(
        self,
        events: DataFrame,
        changelog: Sequence[TablePlan],
        scd2: Sequence[TablePlan],
        table_columns: Mapping[str, Sequence[tuple[str, str]]],
        keys: Mapping[str, Sequence[str]],
        batch_id: int,
        txn: Txn | None,
        threads: int = 4,
        made_whole: DataFrame | None = None,
    ) -> None:
        """Writes the batch's decoded, applicable ``events`` into the changelog tables of the ``changelog`` plans
        and the SCD2 tables of the ``scd2`` plans: one commit per table, all marked with ``txn``. ``made_whole``:
        the batch's UPSERTs of key changes from partial images, made whole from the old keys' rows
        (``apply.moves_made_whole``), which the SCD2 tables take in place of the partial ones."""
        plans = {plan.table_id: plan for plan in [*changelog, *scd2]}
        if not plans:
            return
        logged = {plan.table_id for plan in changelog}
        versioned = {plan.table_id for plan in scd2}
        op = F.col(model.OP)
        table_id = apply.table_id(F.col(model.DATABASE), F.col(model.SCHEMA), F.col(model.TABLE))
        order = apply.effective_order(events)
        relevant = events.where(op.isin(*(o.value for o in model.ROW_OPS), TRUNCATE) & table_id.isin(*plans))
        # One small row per table on the driver: where the batch starts (bounds what stored rows can be affected)
        # and its truncates (every one, not only the newest as in the plan).
        summary = (
            relevant.groupBy(table_id.alias(apply.TABLE_ID))
            .agg(
                F.min(order).alias("oldest"),
                F.collect_set(F.when(op == TRUNCATE, F.struct(order.alias("order"), F.col(model.EVENT_TIME)))).alias(
                    "truncates"
                ),
                F.bool_or(F.coalesce(F.col(model.AFTER_IS_PARTIAL), F.lit(False))).alias("partial"),
            )
            .collect()
        )
        work: list[_Work] = []
        for row in summary:
            plan, columns = plans[row[apply.TABLE_ID]], list(table_columns[row[apply.TABLE_ID]])
            # A re-sent truncate is one truncate: one (order, earliest event time) each.
            truncate_times: dict[str, datetime | None] = {}
            for truncate in row["truncates"]:
                known = truncate_times.get(truncate["order"])
                event_time = truncate[model.EVENT_TIME]
                truncate_times[truncate["order"]] = event_time if known is None else min(known, event_time or known)
            truncates = sorted(truncate_times.items())
            sources, partial = (plan.table_id,), bool(row["partial"])
            if plan.table_id in logged:
                work.append(_Work("changelog", plan, columns, row["oldest"], truncates, sources, partial))
            if plan.table_id in versioned:
                work.append(_Work("scd2", plan, columns, row["oldest"], truncates, sources, partial))
        changes = apply.row_changes(relevant, keys)
        if made_whole is not None:
            changes = apply.with_moves_made_whole(changes, made_whole)
        row_keys = apply.effective_keys(relevant, keys)

        def write(item: _Work) -> None:
            if item.kind == "changelog":
                table_events = relevant.where(table_id.isin(*item.sources))
                self._changelog(item, table_events, row_keys, batch_id)
            else:
                self._scd2(item, changes.where(F.col(apply.TABLE_ID).isin(*item.sources)))

        # Tables are created and columns added first, outside the marker: only the data commits may carry it. Items
        # of one history table that _together leaves apart go in turns, each turn with its own marker. A missing
        # table that one item writes is created by that write instead, with its rows: one commit, not two.
        together = _together(work, self._path_of)
        writers = Counter(map(self._path_of, together))
        turns = in_turns(together, self._path_of, lambda item: f"{item.plan.table_id}\x00{item.kind}")

        def prepare(item: _Work) -> None:
            self._prepare(item, defer_creation=writers[self._path_of(item)] == 1)

        # An SCD2 statement has several aliases per user column: planned without constraint propagation.
        with session_settings(self.spark, NO_CONSTRAINT_PROPAGATION):
            for turn in turns:
                concurrently(prepare, turn, threads)
            for index, turn in enumerate(turns):
                with self.sink.idempotent(turn_marker(txn, index)):
                    concurrently(write, turn, threads)

    # ---------------------------------------------------------------------------------------------------------
    # Tables

    @staticmethod
    def _user_struct(columns: Sequence[tuple[str, str]]) -> StructType:
        return StructType([StructField(name, _typed(spark_type)) for name, spark_type in columns])

    def _changelog_schema(self, columns: Sequence[tuple[str, str]]) -> StructType:
        user = self._user_struct(columns)
        fields = list(user.fields)
        for name, spark_type in CHANGELOG_COLUMNS:
            fields.append(StructField(name, _typed(spark_type)))
            # A table known by no column yet (a TRUNCATE is its first event) gets the before image once it has
            # columns (_ensure adds it): Delta refuses a struct column without fields.
            if name == KEY_COLUMN and user.fields:
                fields.append(StructField(BEFORE_COLUMN, user))
        return StructType(fields)

    def _scd2_schema(self, columns: Sequence[tuple[str, str]]) -> StructType:
        fields = list(self._user_struct(columns).fields)
        fields += [StructField(name, _typed(spark_type)) for name, spark_type in SCD2_COLUMNS]
        return StructType(fields)

    def _prepare(self, item: _Work, *, defer_creation: bool = False) -> None:
        """Creates the item's history table or adds the columns it lacks (:meth:`_ensure`)."""
        if item.kind == "changelog":
            stats = [POSITION_COLUMN]
            self._ensure(
                self.changelog_path(item.plan), self._changelog_schema(item.columns), item, stats, defer_creation
            )
        else:
            stats = [ROW_KEY_COLUMN, VALID_FROM_COLUMN, VALID_TO_COLUMN]
            self._ensure(self.scd2_path(item.plan), self._scd2_schema(item.columns), item, stats, defer_creation)

    def _ensure(
        self, path: str, wanted: StructType, item: _Work, stats: Sequence[str], defer_creation: bool = False
    ) -> StructType:
        """Creates the table or adds the columns (and fields of struct columns) it lacks; returns its schema.

        Args:
            stats: metadata columns that get min/max statistics, beside the key columns.
            defer_creation: a missing table is not created here but by its first write, with its rows
                (:meth:`_write`); its schema is then ``wanted``.
        """
        self.sink.prepare_deletion_vectors(path)
        cached = self._schemas.get(path)
        if cached is not None and not _missing(cached, wanted) and not self._to_retype(path, cached, wanted):
            return cached
        schema = self.sink.table_schema(path)
        if schema is None:
            plan = item.plan
            types = {name.lower(): spark_type for name, spark_type in item.columns}
            # Delta keeps no min/max statistics for binary or boolean columns.
            keys = [k for k in plan.key_columns if types.get(k.lower()) not in (None, "binary", "boolean")]
            properties = source_properties(plan)
            # Statistics where they prune: the MERGE conditions (orders, keys) and lookups by key.
            statistics = [*map(quote, keys), *stats]
            if defer_creation:
                self._awaiting_creation[path] = self.sink.history_table_properties(properties, statistics)
                self._schemas[path] = wanted
                return wanted
            self.sink.create_history_table(path, wanted, properties, statistics)
            schema = self.sink.table_schema(path)
            assert schema is not None
        missing = _missing(schema, wanted)
        if missing:
            self.sink.allow_columns(path, wanted)
            # Names come from the lake table (validated by the decoder) and are quoted; nothing is taken from a message.
            self.sink.add_history_columns(
                path, ", ".join(f"{name} {_ddl_type(data_type)}" for name, data_type in missing)
            )
            schema = self.sink.table_schema(path)
            assert schema is not None
        differing = self._to_retype(path, schema, wanted)
        if differing:
            lake_path = self.sink.table_path(item.plan.database, item.plan.schema, item.plan.table)
            schema = self._retype(path, schema, differing, lake_path)
        self._schemas[path] = schema
        return schema

    def _to_retype(self, path: str, schema: StructType, wanted: StructType) -> dict[ColumnPath, DataType]:
        kept = self._kept_types.get(path, set())
        return {
            column: data_type
            for column, data_type in _differing_types(schema, wanted).items()
            if (column, data_type.simpleString()) not in kept
        }

    def _retype(
        self, path: str, schema: StructType, differing: Mapping[ColumnPath, DataType], lake_path: str
    ) -> StructType:
        """Follows the lake table's column type changes (widening, retyping a column without values): rewrites the
        history table with the columns converted, when every stored value converts. A column whose stored values
        would not all fit keeps its type, and incoming values that do not fit it are NULL in this table only (the
        lake table has them); a warning says so. Costs a full rewrite, as for the lake table; type changes are rare.
        A widening that the table format makes in its schema alone (:meth:`DeltaSink.widen_path_in_place`) is made
        so, as for the lake table at ``lake_path``, whose Delta type widening the history table follows.
        """
        in_place = self.sink.widen_path_in_place(
            path,
            {
                column: data_type.simpleString()
                for column, data_type in differing.items()
                if widened(type_at(schema, column).simpleString(), data_type.simpleString())
            },
            like=lake_path,
        )
        if in_place:
            log.info("%s: column types %s, widened in place", path, {".".join(c): t for c, t in in_place.items()})
            differing = {c: t for c, t in differing.items() if c not in in_place}
            retyped = self.sink.table_schema(path)
            assert retyped is not None
            schema = retyped
            if not differing:
                return schema
        table = self.sink.read_path(path)

        def column(path_of: ColumnPath) -> Column:
            top = F.col(quote(path_of[0]))
            return top if len(path_of) == 1 else top[path_of[1]]

        ordered = sorted(differing.items())
        # A pair of types Spark does not cast between at all converts only a column without values.
        can_cast = {c: castable(self.spark, type_at(schema, c), t) for c, t in ordered}

        def lost(c: ColumnPath, t: DataType) -> Column:
            return column(c).try_cast(t).isNull() if can_cast[c] else F.lit(True)

        def converted(c: ColumnPath, t: DataType) -> Column:
            return column(c).cast(t) if can_cast[c] else valueless_as(column(c), t, ".".join(c))

        unconvertible = table.agg(
            *(
                F.sum(F.when(column(c).isNotNull() & lost(c, t), 1).otherwise(0)).alias(f"_{i}")
                for i, (c, t) in enumerate(ordered)
            )
        ).first()
        assert unconvertible is not None
        convertible: dict[ColumnPath, DataType] = {}
        for index, (name, data_type) in enumerate(ordered):
            if unconvertible[f"_{index}"]:
                log.warning(
                    "%s: column %s keeps its type; %s stored values would not convert to %s",
                    path,
                    ".".join(name),
                    unconvertible[f"_{index}"],
                    data_type.simpleString(),
                )
                self._kept_types.setdefault(path, set()).add((name, data_type.simpleString()))
            else:
                convertible[name] = data_type
        if not convertible:
            return schema
        selected: list[Column] = []
        for f in schema.fields:
            top = F.col(quote(f.name))
            if (f.name,) in convertible:
                selected.append(converted((f.name,), convertible[(f.name,)]).alias(f.name))
            elif isinstance(f.dataType, StructType) and any((f.name, g.name) in convertible for g in f.dataType.fields):
                inner = [
                    (
                        converted((f.name, g.name), convertible[(f.name, g.name)])
                        if (f.name, g.name) in convertible
                        else top[g.name]
                    )
                    for g in f.dataType.fields
                ]
                rebuilt = F.struct(*(value.alias(g.name) for value, g in zip(inner, f.dataType.fields, strict=True)))
                selected.append(F.when(top.isNotNull(), rebuilt).alias(f.name))
            else:
                selected.append(top)
        log.info("%s: column types %s", path, {".".join(c): t.simpleString() for c, t in convertible.items()})
        self.sink.replace_rows(path, table.select(*selected))
        retyped = self.sink.table_schema(path)
        assert retyped is not None
        return retyped

    # ---------------------------------------------------------------------------------------------------------
    # Changelog

    def _changelog(self, item: _Work, events: DataFrame, row_keys: Column, batch_id: int) -> None:
        """Inserts the table's events not logged yet: one insert-only MERGE, matching rows from the batch's oldest
        event on."""
        path = self.changelog_path(item.plan)
        schema = self._schemas[path]
        columns, oldest = item.columns, item.oldest
        after, before = F.col(model.AFTER), F.col(model.BEFORE)
        image = F.coalesce(after, before)
        typed = dict(columns)
        before_type = schema[BEFORE_COLUMN].dataType if BEFORE_COLUMN in schema.fieldNames() else StructType()
        assert isinstance(before_type, StructType)
        before_struct = F.when(
            before.isNotNull(),
            F.struct(
                *(self._typed_or_null(before, f.name, typed, f.dataType).alias(f.name) for f in before_type.fields)
            ),
        )
        partial = after.isNotNull() & F.coalesce(F.col(model.AFTER_IS_PARTIAL), F.lit(False))
        values: dict[str, Column] = {
            OP_COLUMN: F.col(model.OP),
            VENDOR_OP_COLUMN: F.col(model.VENDOR_OP),
            POSITION_COLUMN: apply.effective_order(events),
            EVENT_TIME_COLUMN: F.col(model.EVENT_TIME),
            TXN_ID_COLUMN: F.col(model.TXN_ID),
            KEY_COLUMN: F.when(F.col(model.OP) != TRUNCATE, apply.key_of(image, row_keys)),
            BEFORE_COLUMN: before_struct,
            PARTIAL_COLUMN: partial,
            CAPTURED_COLUMN: F.when(partial, F.array_sort(F.map_keys(after))),
            TOPIC_COLUMN: F.col(model.TOPIC),
            PARTITION_COLUMN: F.col(model.PARTITION),
            OFFSET_COLUMN: F.col(model.OFFSET),
            SUB_INDEX_COLUMN: F.col(model.SUB_INDEX),
            BATCH_ID_COLUMN: F.lit(batch_id).cast("bigint"),
        }
        source_columns = [
            (values[f.name] if f.name in values else self._typed_or_null(image, f.name, typed, f.dataType)).alias(
                f"_c{index}"
            )
            for index, f in enumerate(schema.fields)
        ]
        alias = {f.name: f"_c{index}" for index, f in enumerate(schema.fields)}
        identity = [alias[POSITION_COLUMN], alias[SUB_INDEX_COLUMN], alias[KEY_COLUMN]]
        # Copies of an event inside the batch (re-sends) are logged once: the first received.
        first = Window.partitionBy(*identity).orderBy(alias[PARTITION_COLUMN], alias[OFFSET_COLUMN])
        source = (
            events.select(*source_columns)
            .withColumn("_copy", F.row_number().over(first))
            .where(F.col("_copy") == 1)
            .drop("_copy")
        )

        def same(name: str, operator: str = "=") -> str:
            return f"t.{name} {operator} s.{alias[name]}"

        statement = MergeStatement(
            source=source,
            matched_on=" AND ".join(
                (
                    same(POSITION_COLUMN),
                    same(SUB_INDEX_COLUMN),
                    same(KEY_COLUMN, "<=>"),
                    # Only rows at or after the batch's oldest event can match: lets the sink skip the older files.
                    f"t.{POSITION_COLUMN} >= {sql_string(oldest)}",
                )
            ),
            insert_values={quote(f.name): f"s.{alias[f.name]}" for f in schema.fields},
        )
        if not self._write(item, path, statement):
            self._changelog(item, events, row_keys, batch_id)

    def _typed_or_null(self, image: Column, name: str, types: Mapping[str, str], data_type: DataType) -> Column:
        """The image's value of column ``name`` typed like the lake table; NULL for a history column the lake table
        no longer has, and for a value that does not fit the older type a history column kept (see _retype)."""
        if name not in types:
            return F.lit(None).cast(data_type)
        value = model.typed_value(image[name], types[name])
        if data_type.simpleString() == types[name]:
            return value
        if castable(self.spark, _typed(types[name]), data_type):
            return value.try_cast(data_type)
        return F.lit(None).cast(data_type)  # no value of the one type is a value of the other (DATE and INT)

    # ---------------------------------------------------------------------------------------------------------
    # SCD2

    def _truncate_positions(self, stored: DataFrame, truncates: Sequence[tuple[str, datetime | None]]) -> list[str]:
        """The positions of every TRUNCATE of the table, stored (its marker rows) and in the batch, sorted."""
        marked = stored.where(F.col(ROW_KEY_COLUMN).isNull()).select(VALID_FROM_COLUMN).distinct().collect()
        return sorted({row[0] for row in marked} | {order for order, _ in truncates})

    def _scd2(self, item: _Work, changes: DataFrame) -> None:
        """Recomputes the chains of the keys the batch touches and MERGEs the difference (see the module doc)."""
        columns, oldest, truncates = item.columns, item.oldest, item.truncates
        path = self.scd2_path(item.plan)
        schema = self._schemas[path]
        user = [(f.name, f.dataType) for f in schema.fields if f.name not in {name for name, _ in SCD2_COLUMNS}]
        types = dict(columns)
        floor = _position_text(oldest)
        # A table left to its first write has no rows yet (and no files to read).
        stored = local_frame(self.spark, [], schema) if path in self._awaiting_creation else self.sink.read_path(path)
        # A table that sequence_by orders by a column orders its changes by value|position, and a TRUNCATE by its
        # position: it closes the versions the log wrote before it, whatever their values (apply.log_order). Once
        # the table has a truncate, the chain is placed by log epoch first (how many truncates the log wrote before
        # the change), then by order; orders of the two kinds do not compare, so no stored row is left out by order.
        truncate_positions = self._truncate_positions(stored, truncates) if item.plan.ordered_by_column else []
        by_epoch = bool(truncate_positions)
        # Rows closed before the batch's oldest change cannot change: skip their files (statistics on valid_to).
        open_rows = (
            stored
            if by_epoch
            else stored.where(F.col(VALID_TO_COLUMN).isNull() | (F.col(VALID_TO_COLUMN) >= F.lit(floor)))
        )

        stored_events = open_rows.where(F.col(ROW_KEY_COLUMN).isNotNull()).select(
            F.col(ROW_KEY_COLUMN).alias("_key"),
            F.col(VALID_FROM_COLUMN).alias("_order"),
            F.col(OP_COLUMN).alias("_kind"),
            F.lit(1).alias("_stored"),
            F.lit(None).cast("int").alias("_partition"),
            F.lit(None).cast("bigint").alias("_offset"),
            F.lit(None).cast("int").alias("_sub_index"),
            F.col(VALID_FROM_TIME_COLUMN).alias("_time"),
            F.col(VALID_TO_COLUMN).alias("_was_to"),
            F.col(VALID_TO_TIME_COLUMN).alias("_was_to_time"),
            F.col(IS_CURRENT_COLUMN).alias("_was_current"),
            *(F.col(quote(name)).alias(f"_v{i}") for i, (name, _) in enumerate(user)),
            # A stored row is complete: it sets every column.
            *(F.lit(True).alias(f"_s{i}") for i in range(len(user))),
        )
        # Per key, stored rows matter from the one open at the key's oldest change in the batch (its base image) on;
        # with a truncate in the batch, every key's rows from the truncate on.
        first_change = changes.groupBy(F.col(apply.ROW_KEY).alias("_key")).agg(
            _position_of(F.min(apply.ORDER)).alias("_floor")
        )
        if by_epoch:
            # Every stored row of the keys the batch changes; of every key when it truncates.
            if not truncates:
                stored_events = stored_events.join(first_change.select("_key"), "_key", "left_semi")
        else:
            if truncates:
                truncate_floor = F.lit(_position_text(truncates[0][0]))
                stored_events = stored_events.join(first_change, "_key", "left").withColumn(
                    "_floor", F.least(F.col("_floor"), truncate_floor)
                )
            else:
                stored_events = stored_events.join(first_change, "_key", "inner")
            stored_events = stored_events.where(F.col("_was_to").isNull() | (F.col("_was_to") >= F.col("_floor"))).drop(
                "_floor"
            )

        # Copies of a change (re-sends) count once.
        unique_changes = changes.dropDuplicates([apply.ROW_KEY, apply.ORDER, apply.KIND, model.SUB_INDEX])
        image = F.col(apply.IMAGE)
        full = (F.col(apply.KIND) == apply.UPSERT) & ~F.col(apply.PARTIAL)
        new_events = unique_changes.select(
            F.col(apply.ROW_KEY).alias("_key"),
            F.col(apply.ORDER).alias("_order"),
            F.col(apply.KIND).alias("_kind"),
            F.lit(0).alias("_stored"),
            F.col(model.PARTITION).alias("_partition"),
            F.col(model.OFFSET).alias("_offset"),
            F.col(model.SUB_INDEX).alias("_sub_index"),
            F.col(model.EVENT_TIME).alias("_time"),
            F.lit(None).cast("string").alias("_was_to"),
            F.lit(None).cast("timestamp").alias("_was_to_time"),
            F.lit(None).cast("boolean").alias("_was_current"),
            *(
                self._typed_or_null(image, name, types, data_type).alias(f"_v{i}")
                for i, (name, data_type) in enumerate(user)
            ),
            # Full images set every column (absent = NULL); partial ones and delete before images only theirs.
            *((full | F.map_contains_key(image, F.lit(name))).alias(f"_s{i}") for i, (name, _) in enumerate(user)),
        )

        # Truncates: the stored markers and the batch's, applied to every key in play.
        stored_markers = open_rows.where(F.col(ROW_KEY_COLUMN).isNull()).select(
            F.col(VALID_FROM_COLUMN).alias("_order"), F.col(VALID_FROM_TIME_COLUMN).alias("_time")
        )
        batch_markers = local_frame(self.spark, truncates, "_order string, _time timestamp")
        markers = stored_markers.unionByName(batch_markers).groupBy("_order").agg(F.min("_time").alias("_time"))
        keys_in_play = stored_events.select("_key").unionByName(new_events.select("_key")).distinct()
        marker_events = keys_in_play.crossJoin(F.broadcast(markers)).select(
            F.col("_key"),
            F.col("_order"),
            F.lit(TRUNCATE).alias("_kind"),
            F.lit(0).alias("_stored"),
            F.lit(None).cast("int").alias("_partition"),
            F.lit(None).cast("bigint").alias("_offset"),
            F.lit(None).cast("int").alias("_sub_index"),
            F.col("_time"),
            F.lit(None).cast("string").alias("_was_to"),
            F.lit(None).cast("timestamp").alias("_was_to_time"),
            F.lit(None).cast("boolean").alias("_was_current"),
            # No values (the union gives them as NULLs: no cast per column to build here); nothing captured.
            *(F.lit(False).alias(f"_s{i}") for i in range(len(user))),
        )
        chain = (
            _placed(stored_events, truncate_positions)
            .unionByName(_placed(new_events, truncate_positions))
            .unionByName(_placed(marker_events, truncate_positions), allowMissingColumns=True)
        )

        # At equal orders a stored row sorts last and so wins (it is the same change, already complete).
        # Stored orders as they compare now (apply.comparable_order); the rows keep the text they were written with.
        by_key = Window.partitionBy("_key").orderBy(
            "_epoch", "_tail", apply.comparable_order(F.col("_order")), "_stored", "_partition", "_offset", "_sub_index"
        )
        kind, order, stored_row = F.col("_kind"), F.col("_order"), F.col("_stored") == 1
        shown: list[Column] = []
        if item.partial:
            up_to_here = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)
            before_here = by_key.rowsBetween(Window.unboundedPreceding, -1)
            for i, (_, data_type) in enumerate(user):
                value, captured = F.col(f"_v{i}"), F.col(f"_s{i}")
                # What a change leaves in column i for the next one: an upsert its captured value (a partial image
                # keeps the previous one), a delete or truncate nothing (a later partial image starts from NULLs).
                setter = F.when(kind == apply.UPSERT, F.when(captured, F.struct(value.alias("v")))).otherwise(
                    F.struct(F.lit(None).cast(data_type).alias("v"))
                )
                state = F.last(setter, ignorenulls=True).over(up_to_here)["v"]
                previous = F.last(setter, ignorenulls=True).over(before_here)["v"]
                # A delete shows its before image over the version it ends; a truncate the version it ends.
                shown.append(
                    F.when(kind == apply.UPSERT, state).when(captured, value).otherwise(previous).alias(f"_r{i}")
                )
        else:
            # Without partial images every upsert sets every column: the state a change leaves is its own image (an
            # upsert) or nothing (a delete, a truncate), so the state before a change is the previous change's. One
            # offset window for all columns instead of two running ones per column, whose planning and evaluation
            # cost grows with the table's width (a table of 208 columns, about 130 changes: AGENTS.md).
            previous_image = F.lag(
                F.when(kind == apply.UPSERT, F.struct(*(F.col(f"_v{i}") for i in range(len(user)))))
            ).over(by_key)
            # An upsert captures every column; a delete shows its before image over the version it ends (what it
            # lacks, from that version), a truncate the version it ends.
            shown = [
                F.when(F.col(f"_s{i}"), F.col(f"_v{i}")).otherwise(previous_image[f"_v{i}"]).alias(f"_r{i}")
                for i in range(len(user))
            ]
        next_order = F.lead("_order").over(by_key)
        last_of_order = next_order.isNull() | (next_order != order)
        # The first half of a split update (order "<position>/0") followed by its second half is no deletion. A first
        # half with nothing after it (its second half gave the row another key, or is in a later batch) is one: the
        # comparison with no next order is NULL, which must not leave the row unkept.
        second_half = F.concat(_position_of(order), F.lit("/1"))
        replaced_half = (
            (kind == apply.DELETE) & order.endswith("/0") & F.coalesce(next_order == second_half, F.lit(False))
        )
        # A truncate only ends a live version (its marker row remembers it for the others).
        ends_nothing = (
            (kind == TRUNCATE) & ~stored_row & ~F.coalesce(F.lag("_kind").over(by_key) == apply.UPSERT, F.lit(False))
        )
        keep = last_of_order & ~replaced_half & ~ends_nothing
        evaluated = chain.select(
            "_key",
            "_epoch",
            "_tail",
            "_order",
            "_kind",
            "_stored",
            "_partition",
            "_offset",
            "_sub_index",
            "_time",
            "_was_to",
            "_was_to_time",
            "_was_current",
            *shown,
            keep.alias("_keep"),
        )
        following = by_key.rowsBetween(1, Window.unboundedFollowing)
        next_kept = F.first(
            F.when(F.col("_keep"), F.struct(F.col("_order").alias("order"), F.col("_time").alias("time"))),
            ignorenulls=True,
        ).over(following)
        valid_to, valid_to_time = next_kept["order"], next_kept["time"]
        kept, stored_row = F.col("_keep"), F.col("_stored") == 1
        changed = (
            ~F.col("_was_to").eqNullSafe(valid_to)
            | ~F.col("_was_to_time").eqNullSafe(valid_to_time)
            | ~F.col("_was_current").eqNullSafe(valid_to.isNull())
        )
        action = (
            F.when(kept & ~stored_row, F.lit("I"))
            .when(kept & stored_row & changed, F.lit("U"))
            .when(~kept & stored_row, F.lit("D"))
        )
        versions = evaluated.select(
            F.col("_key"),
            F.col("_order").alias("_valid_from"),
            valid_to.alias("_valid_to"),
            F.col("_time").alias("_valid_from_time"),
            valid_to_time.alias("_valid_to_time"),
            valid_to.isNull().alias("_is_current"),
            (F.col("_kind") != apply.UPSERT).alias("_is_deleted"),
            F.col("_kind"),
            *(F.col(f"_r{i}") for i in range(len(user))),
            action.alias("_action"),
        ).where(F.col("_action").isNotNull())
        # The batch's truncates as marker rows (a re-sent one matches its stored marker and is left alone).
        marker_rows = batch_markers.select(
            F.lit(None).cast("string").alias("_key"),
            F.col("_order").alias("_valid_from"),
            F.col("_order").alias("_valid_to"),
            F.col("_time").alias("_valid_from_time"),
            F.col("_time").alias("_valid_to_time"),
            F.lit(False).alias("_is_current"),
            F.lit(True).alias("_is_deleted"),
            F.lit(TRUNCATE).alias("_kind"),
            F.lit("I").alias("_action"),
        )
        source = versions.unionByName(marker_rows, allowMissingColumns=True)  # a marker row has no values

        insert = {quote(name): f"s._r{i}" for i, (name, _) in enumerate(user)}
        insert.update(
            {
                ROW_KEY_COLUMN: "s._key",
                VALID_FROM_COLUMN: "s._valid_from",
                VALID_TO_COLUMN: "s._valid_to",
                VALID_FROM_TIME_COLUMN: "s._valid_from_time",
                VALID_TO_TIME_COLUMN: "s._valid_to_time",
                IS_CURRENT_COLUMN: "s._is_current",
                IS_DELETED_COLUMN: "s._is_deleted",
                OP_COLUMN: "s._kind",
            }
        )
        statement = MergeStatement(
            source=source,
            matched_on=(
                f"t.{ROW_KEY_COLUMN} <=> s._key AND t.{VALID_FROM_COLUMN} = s._valid_from"
                # Only rows still open at the batch's oldest change can match: lets the sink skip the older files.
                f" AND (t.{VALID_TO_COLUMN} IS NULL OR t.{VALID_TO_COLUMN} >= {sql_string(floor)})"
            ),
            insert_values=insert,
            insert_when="s._action = 'I'",
            delete_when="s._action = 'D'",
            update_when="s._action = 'U'",
            update_set={
                VALID_TO_COLUMN: "s._valid_to",
                VALID_TO_TIME_COLUMN: "s._valid_to_time",
                IS_CURRENT_COLUMN: "s._is_current",
            },
        )
        if not self._write(item, path, statement):
            self._scd2(item, changes)

    def _write(self, item: _Work, path: str, statement: MergeStatement) -> bool:
        """Executes ``statement`` on the history table at ``path``, one commit; for a table left to its first write,
        creates it with the rows ``statement`` would insert into it (one commit instead of a creation and a MERGE).
        False, having written nothing, when another writer created that table meanwhile: the caller builds its
        statement again, for the table as it is."""
        properties = self._awaiting_creation.pop(path, None)
        if properties is None:
            self.sink.merge_rows(path, statement)
        elif not self.sink.create_with_rows(path, inserted_rows(statement, self._schemas[path]), properties):
            del self._schemas[path]
            self._prepare(item)
            return False
        self.sink.merged(path)
        return True


def _differing_types(schema: StructType, wanted: StructType) -> dict[ColumnPath, DataType]:
    """Columns (and fields of struct columns) that both have, with the wanted type where it differs."""
    have = {f.name.lower(): f for f in schema.fields}
    differing: dict[ColumnPath, DataType] = {}
    for f in wanted.fields:
        existing = have.get(f.name.lower())
        if existing is None or existing.dataType == f.dataType:
            continue
        if isinstance(f.dataType, StructType) and isinstance(existing.dataType, StructType):
            inner = {g.name.lower(): g for g in existing.dataType.fields}
            for g in f.dataType.fields:
                stored = inner.get(g.name.lower())
                if stored is not None and stored.dataType != g.dataType:
                    differing[(existing.name, stored.name)] = g.dataType
        else:
            differing[(existing.name,)] = f.dataType
    return differing


def _ddl_type(data_type: DataType) -> str:
    """A type for ALTER TABLE ADD COLUMNS, struct field names quoted (``simpleString`` leaves them bare, and a lake
    column may be named ``unit-price``)."""
    if isinstance(data_type, StructType):
        return "struct<" + ", ".join(f"{quote(f.name)}: {_ddl_type(f.dataType)}" for f in data_type.fields) + ">"
    return data_type.simpleString()


def _missing(schema: StructType, wanted: StructType) -> list[tuple[str, DataType]]:
    """Columns of ``wanted`` that ``schema`` lacks, as (quoted name for ALTER TABLE, type); fields missing from a
    struct column as ``struct.field``."""
    have = {f.name.lower(): f for f in schema.fields}
    missing: list[tuple[str, DataType]] = []
    for f in wanted.fields:
        existing = have.get(f.name.lower())
        if existing is None:
            missing.append((quote(f.name), f.dataType))
        elif isinstance(f.dataType, StructType) and isinstance(existing.dataType, StructType):
            inner = {g.name.lower() for g in existing.dataType.fields}
            missing += [
                (f"{quote(f.name)}.{quote(g.name)}", g.dataType)
                for g in f.dataType.fields
                if g.name.lower() not in inner
            ]
    return missing
