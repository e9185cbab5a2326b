"""Schema evolution of lake tables: DDL events applied as validated changes, and column types reconciled with data.

Two sources of schema change:

* **DDL events** (op ``DDL`` with statement text). :func:`cdclake.ddl.parse_ddl` turns the text into validated
  changes; this module applies them to the lake table at the statement's position in the stream (the pipeline
  applies the batch's row changes ordered before the statement first, then the statement, then the rest).
  The policy, per pipeline and per table, decides what happens: ``evolve`` (default) applies the changes,
  ``ignore`` records the statement only, ``fail`` stops the pipeline with :class:`SchemaChangeError`.
  A statement that looks like a table change but cannot be understood, or a change that would lose stored values
  (a non-widening type change of a column that has values, dropping a key column, renaming onto an existing
  column), goes to the dead letters with the reason; the table is left as it was.
* **Declared column types** (:meth:`SchemaEvolution.reconcile_types`): when messages declare a column with a
  type other than the table's, the column is widened if no stored value changes (int -> bigint, float -> double,
  decimal precision up, see :func:`cdclake.ddl.widened`), or retyped if it holds no value yet (for example a
  column a DDL statement created with its best-guess type). A widening is made in the table's schema alone where
  the table format can (:meth:`cdclake.sinks.delta.DeltaSink.widen_in_place`), as is a DDL statement's; anything
  else rewrites the table. This happens under every policy, because refusing it
  would drop the values; otherwise the values that do not fit go to the dead letters (the pipeline's misfit
  check).

Every DDL and TRUNCATE event is recorded in ``_cdclake/schema_changes`` (:data:`SCHEMA_CHANGES`) with its outcome.

**Online schema change** (``ddl.online_schema_change``, :class:`cdclake.tables.OnlineSchemaChange`): gh-ost and
pt-online-schema-change alter a table ``t`` by creating a ghost table (``_t_gho``, ``_t_new``), altering it,
copying ``t``'s rows into it while forwarding ``t``'s changes, and swapping it in at the cut-over: ``RENAME TABLE
t TO _t_del, _t_gho TO t`` (or the same as two statements). The lake instead keeps ``t`` and applies the ghost's
changes to it at the cut-over, as TiDB DM's ``online-ddl`` and Flink CDC's online schema change parsing do: the
copy and its changes never land (``t``'s own events carry the same rows), no table's rows move, and ``t`` gets
the altered columns at the position of the swap. Statements about a ghost table are recorded with the outcome
``held for the cut-over of ...``; the cut-over reads them back from ``schema_changes`` (earlier batches) and from
the batch, since the ghost was last created, dropped or swapped in (an aborted copy's changes are dropped with
it). The pipeline drops the row events of the helper tables (they are counted as excluded tables).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdclake import apply, model
from cdclake.constraints import columns_used
from cdclake.ddl import (
    ParsedDdl,
    SchemaChange,
    TableName,
    common_type,
    invalid_name,
    parse_ddl,
    sql_types_of,
    typed_as,
    widened,
)
from cdclake.exceptions import TerminalError, UnknownFormatError
from cdclake.formats import CdcFormat, get_format
from cdclake.model import Op, quote
from cdclake.sinks.delta import DeltaSink, Txn
from cdclake.spark import valueless_as
from cdclake.tables import OnlineSchemaChange, PerTable, TableFilter, sequence_by_problem

log = logging.getLogger(__name__)

SCHEMA_CHANGES: Final = "schema_changes"
"""The bookkeeping table of every DDL and TRUNCATE event with its outcome."""
ONLINE_SCHEMA_CHANGE: Final = "online schema change"
"""In the outcome of every statement about the helper tables of an online schema change."""

Policy = Literal["evolve", "ignore", "fail"]
POLICIES: tuple[Policy, ...] = ("evolve", "ignore", "fail")


class SchemaChangeError(TerminalError):
    """A DDL statement reached a table whose policy is ``fail``."""


@dataclass
class SchemaEvent:
    """A DDL or TRUNCATE event of a batch (few per batch: collected to the driver)."""

    row: dict[str, Any]
    order: str
    parsed: ParsedDdl | None = None
    outcome: str = ""
    dead_letter: str | None = None
    """Reason, when the statement must go to the dead letters."""
    notes: list[str] = field(default_factory=list)
    """What the outcome says before the outcomes of the changes applied (an online schema change's steps)."""
    moved_to: list[str] = field(default_factory=list)
    """The lake tables (``<database>/<table>``, relative to the lake) that a RENAME of the event moved rows into:
    recorded in ``schema_changes`` so that ``cdclake maintain`` finds a table that only a rename filled."""

    @property
    def changes(self) -> tuple[SchemaChange, ...]:
        return self.parsed.changes if self.parsed is not None and self.dead_letter is None else ()


def _format_named(name: str | None) -> CdcFormat | None:
    """The registered format an event names; None for none or a name no format has."""
    if not name:
        return None
    try:
        return get_format(name)
    except UnknownFormatError:
        return None


def _ident(name: TableName) -> tuple[str | None, str | None, str]:
    return name.database, name.schema, name.table


def _table_id(name: TableName) -> str:
    return apply.table_id_of(*_ident(name))


_GHOST_RESETS: Final = ("create_table", "drop_table", "rename_table")
"""Changes of a ghost table after which none of its earlier changes is applied at a cut-over."""


def _coordinates(event: SchemaEvent) -> tuple[Any, ...]:
    return tuple(event.row[c] for c in model.MESSAGE_COORDINATES)


def _name(table: TableName) -> str:
    return ".".join(part for part in _ident(table) if part)


def schema_events(frame: DataFrame) -> list[SchemaEvent]:
    """The rows of ``frame`` (a few DDL or TRUNCATE events) as unclassified :class:`SchemaEvent`, in their order."""
    rows = frame.select(
        model.DATABASE,
        model.SCHEMA,
        model.TABLE,
        model.OP,
        model.VENDOR_OP,
        model.DDL,
        model.DB_TYPE,
        model.FORMAT,
        model.POSITION,
        model.EVENT_TIME,
        model.TOPIC,
        model.PARTITION,
        model.OFFSET,
        model.SUB_INDEX,
        apply.effective_order(frame).alias("order"),
    ).collect()
    return sorted((SchemaEvent(row.asDict(), row["order"]) for row in rows), key=lambda e: e.order)


ROWS_MOVED: Final = "applied: rows moved to"
"""How the outcome of a RENAME that moved a table's rows to another lake table begins."""

CLEARING_KINDS: Final = frozenset({"truncate", "drop_table", "rename_table"})
"""Changes that delete the lake rows of their table (a renamed table's rows move to the new name)."""


SharedWith = Callable[[str | None, str | None, str], str | None]
"""(database, schema, table) -> the name of another source table with rows in that table's lake table, or None."""


def shares_nothing(database: str | None, schema: str | None, table: str) -> str | None:
    """A :data:`SharedWith` for lakes whose tables each hold one source table's rows."""
    del database, schema, table
    return None


class SchemaEvolution:
    """Applies the schema changes of a batch through a :class:`DeltaSink`."""

    def __init__(
        self,
        sink: DeltaSink,
        policy: Policy = "evolve",
        table_policies: Mapping[str, Policy] | None = None,
        tables: TableFilter | None = None,
        online_schema_change: OnlineSchemaChange | None = None,
        sequence_by: Mapping[str, str] | None = None,
    ):
        self.sink = sink
        # Which tables' rows are ordered by a column (TablePlan.sequence_column), for the tables a statement clears.
        self.sequence_by = PerTable.of(dict(sequence_by or {}))
        self.policy = policy
        self.table_policies = PerTable.of(dict(table_policies or {}))
        # The pipeline drops the events of excluded tables; this also leaves out the statements that name only
        # excluded tables while sent as another table's (or no table's) event.
        self.tables = tables or TableFilter()
        # Set by the pipeline for each batch: which other source table has rows in a table's lake table.
        self.shared_with: SharedWith = shares_nothing
        self.online_schema_change = online_schema_change
        # The batch's statements about online schema change helper tables so far, with their changes as parsed, and
        # the messages of the batch's statements (those an earlier attempt at the batch may have recorded).
        self._helper_statements: list[tuple[SchemaEvent, tuple[SchemaChange, ...]]] = []
        self._batch_messages: set[tuple[Any, ...]] = set()
        # (table id, column types) that reconcile_types left as they are and warned about, to warn once per process.
        self._types_kept: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        # (format, SQL type as a statement spells it) -> the Spark type the format gives such a column (_parse).
        self._format_types: dict[tuple[str, str], str | None] = {}

    def policy_for(self, table: TableName) -> Policy:
        """The table's ``ddl.tables`` entry (name or pattern, the most specific wins), else the pipeline's policy."""
        policy = self.table_policies.value_for(table.database, table.schema, table.table)
        return self.policy if policy is None else policy

    # -------------------------------------------------------------------------------------------------------------
    # DDL events

    def collect(self, good: DataFrame) -> list[SchemaEvent]:
        """The batch's DDL and TRUNCATE events, parsed and classified (policy ``fail`` raises here)."""
        events = schema_events(good.where(F.col(model.OP).isin(Op.DDL.value, Op.TRUNCATE.value)))
        self._helper_statements = []
        self._batch_messages = {_coordinates(event) for event in events}
        for event in events:
            self._classify(event)
            if event.notes:  # the online schema change's steps first (apply_event writes them again)
                event.outcome = "; ".join([*event.notes, *([event.outcome] if event.outcome else [])])
        return events

    def _parse(
        self, text: str, *, format_name: str | None, db_type: str | None, database: str | None, schema: str | None
    ) -> ParsedDdl:
        """:func:`parse_ddl`, with the columns typed as the event's format types the columns of its data
        (``CdcFormat.ddl_types``) where it has rules of its own. Canal lands every MySQL integer as ``bigint`` and a
        DATETIME as ``timestamp_ntz``: typed by the parser (``int``, ``timestamp``), a column that ``ADD COLUMN``
        created was rewritten with the whole table by its first values, and ``MODIFY qty INT NOT NULL`` on a column
        that data had made ``bigint`` was a dead letter. The format's rules are Spark expressions: one small job
        per batch for the SQL types not seen before."""
        fmt = _format_named(format_name)
        db_type = db_type or (fmt.ddl_dialect if fmt is not None else None)
        parsed = parse_ddl(text, db_type=db_type, database=database, schema=schema)
        rules = fmt.ddl_types if fmt is not None else None
        if parsed.error is not None or rules is None or format_name is None:
            return parsed
        spelled = sql_types_of(parsed)
        unseen = sorted(t for t in spelled if (format_name, t) not in self._format_types)
        if unseen:
            literal = F.create_map(*(F.lit(part) for sql_type in unseen for part in (sql_type, sql_type)))
            typed = self.sink.spark.range(1).select(rules(literal).alias("types")).head()
            found = typed["types"] if typed is not None else {}
            self._format_types.update(((format_name, t), found.get(t)) for t in unseen)
        return typed_as(parsed, {t: self._format_types[(format_name, t)] for t in spelled})

    def _classify(self, event: SchemaEvent) -> None:
        row = event.row
        if row[model.OP] == Op.TRUNCATE or not row[model.DDL]:
            event.outcome = "applied: truncate" if row[model.OP] == Op.TRUNCATE else "recorded"
            return
        event.parsed = self._parse(
            row[model.DDL],
            format_name=row[model.FORMAT],
            db_type=row[model.DB_TYPE],
            database=row[model.DATABASE],
            schema=row[model.SCHEMA],
        )
        parsed = event.parsed
        statement_table = TableName(row[model.DATABASE], row[model.SCHEMA], row[model.TABLE] or "")
        if parsed.error is not None:
            self._check_fail(statement_table, row[model.DDL], parsed.error)
            event.dead_letter = f"DDL not applied: {parsed.error}"
            event.outcome = f"dead letter: {parsed.error}"
            return
        if not parsed.changes:
            event.outcome = f"ignored: {parsed.ignored}"
            return
        for change in parsed.changes:
            names = [(change.table.table, False), *((n, True) for n in (change.column, change.new_name) if n)]
            names += [(other.table, False) for other in (change.new_table, change.like) if other is not None]
            names += [(n, True) for n, _ in change.columns]
            problems = [p for p in (invalid_name(n, column=c) for n, c in names) if p]
            if problems:
                event.dead_letter = f"DDL not applied: {problems[0]}"
                event.outcome = f"dead letter: {problems[0]}"
                return
        if self.online_schema_change is not None and self._online_schema_change(event, self.online_schema_change):
            return
        parsed = event.parsed
        if not any(self.tables.admits(*_ident(change.table)) for change in parsed.changes):
            event.outcome = "not applied: table excluded"
            event.parsed = ParsedDdl(ignored="table excluded")
            return
        for change in parsed.changes:
            other = self.shared_with(*_ident(change.table)) if self.clears(change) else None
            if other is not None:
                name = ".".join(part for part in _ident(change.table) if part)
                problem = f"the lake table of {name} also holds the rows of {other}, which {change.kind} would delete"
                event.dead_letter = f"DDL not applied: {problem}"
                event.outcome = f"dead letter: {problem}"
                return
        policies = {self.policy_for(change.table) for change in parsed.changes}
        if "fail" in policies:
            self._check_fail(parsed.changes[0].table, row[model.DDL], None)
        if policies == {"ignore"}:
            event.outcome = "not applied: policy ignore"
            event.parsed = ParsedDdl(ignored="policy ignore")

    def _online_schema_change(self, event: SchemaEvent, online: OnlineSchemaChange) -> bool:
        """Rewrites the changes of a statement about online schema change helper tables (see the module doc): a
        ghost's changes are held, the helper tables are left alone, the cut-over applies the held changes to the
        table. Returns True when nothing is left to apply; :attr:`SchemaEvent.notes` say what was done."""
        assert event.parsed is not None
        parsed = event.parsed.changes
        kept: list[SchemaChange] = []
        for change in parsed:
            table, target = change.table, change.new_table
            original = online.ghost_of(table.table)
            if original is not None:
                swapped_to = replace(table, table=original)
                if change.kind == "rename_table" and target == swapped_to:
                    held = [replace(c, table=swapped_to) for c in self._held_changes(table, event)]
                    kept += held
                    event.notes.append(
                        f"{ONLINE_SCHEMA_CHANGE} cut-over of {_name(swapped_to)}: "
                        + (
                            f"{len(held)} held changes of {_name(table)}"
                            if held
                            else f"nothing held for {_name(table)}"
                        )
                    )
                elif change.kind in (*_GHOST_RESETS, "truncate"):
                    # A truncated ghost is being filled again: the table's own rows stay the truth.
                    event.notes.append(f"not applied: {ONLINE_SCHEMA_CHANGE} ghost table {_name(table)}")
                else:
                    event.notes.append(f"held for the cut-over of {_name(swapped_to)} ({ONLINE_SCHEMA_CHANGE})")
            elif online.trash_of(table.table) is not None:
                event.notes.append(f"not applied: {ONLINE_SCHEMA_CHANGE} helper table {_name(table)}")
            elif (
                change.kind == "rename_table"
                and target is not None
                and online.trash_of(target.table) == table.table
                and _ident(target)[:2] == _ident(table)[:2]
            ):
                event.notes.append(f"not applied: {ONLINE_SCHEMA_CHANGE} cut-over, {_name(table)} keeps its rows")
            else:
                kept.append(change)
        if not event.notes:
            return False
        self._helper_statements.append((event, parsed))
        event.parsed = ParsedDdl(tuple(kept), ignored=None if kept else ONLINE_SCHEMA_CHANGE)
        return not kept

    def _held_changes(self, ghost: TableName, cut_over: SchemaEvent) -> list[SchemaChange]:
        """The changes of ``ghost`` since it was last created, dropped or swapped in, before ``cut_over``: from the
        statements ``schema_changes`` recorded as about helper tables, then from the batch's."""
        statements: list[tuple[SchemaChange, ...]] = []
        stored = self.sink.read_system(SCHEMA_CHANGES)
        if stored is not None:
            rows = (
                stored.where(F.col("outcome").contains(ONLINE_SCHEMA_CHANGE) & F.col(model.DDL).contains(ghost.table))
                .select("recorded_at", *model.MESSAGE_COORDINATES, model.DATABASE, model.SCHEMA, model.DDL)
                .collect()
            )
            order = sorted(
                rows,
                key=lambda r: (r["recorded_at"], r[model.TOPIC] or "", r[model.PARTITION] or 0, r[model.OFFSET] or 0),
            )
            for row in order:
                if tuple(row[c] for c in model.MESSAGE_COORDINATES) in self._batch_messages:
                    continue  # this batch's, recorded by an earlier attempt at it
                statements.append(
                    self._parse(
                        row[model.DDL],
                        format_name=cut_over.row[model.FORMAT],
                        db_type=cut_over.row[model.DB_TYPE],
                        database=row[model.DATABASE],
                        schema=row[model.SCHEMA],
                    ).changes
                )
        statements += [changes for event, changes in self._helper_statements if event.order < cut_over.order]
        held: list[SchemaChange] = []
        for changes in statements:
            for change in changes:
                if change.table == ghost and change.kind in _GHOST_RESETS:
                    held = []  # a new copy, an aborted one, or the cut-over: what was held is gone with it
                elif change.table == ghost and change.kind != "truncate":
                    held.append(change)
                elif change.kind == "rename_table" and change.new_table == ghost:
                    held = []
        return held

    def clears(self, change: SchemaChange) -> bool:
        """Whether ``change`` deletes the rows of its table's lake table (a rename within one lake table does not)."""
        if change.kind == "rename_table" and change.new_table is not None:
            return self.sink.table_path(*_ident(change.table)) != self.sink.table_path(*_ident(change.new_table))
        return change.kind in CLEARING_KINDS

    def _check_fail(self, table: TableName, ddl: str, problem: str | None) -> None:
        if self.policy_for(table) != "fail":
            return
        name = ".".join(p for p in (table.database or table.schema, table.table) if p)
        detail = f" ({problem})" if problem else ""
        raise SchemaChangeError(
            f"schema change of {name} stopped the pipeline (ddl policy 'fail'): {ddl!r}{detail}. "
            f"Fix: apply the change to the lake table yourself, or set `ddl: {{tables: {{{name}: evolve}}}}` "
            "(or `ignore`) in the configuration (a file replay: --ddl-policy), then restart; the batch is processed "
            "again."
        )

    @staticmethod
    def affected_table_ids(events: Sequence[SchemaEvent]) -> set[str]:
        """Tables whose rows must be applied in segments around the batch's DDL statements."""
        affected: set[str] = set()
        for event in events:
            for change in event.changes:
                affected.add(_table_id(change.table))
                if change.new_table is not None:
                    affected.add(_table_id(change.new_table))
        return affected

    def apply_event(self, event: SchemaEvent, txn: Txn | None) -> None:
        """Applies the event's changes in statement order; sets its outcome (or dead-letter reason)."""
        outcomes = []
        for index, change in enumerate(event.changes):
            marker = None if txn is None else Txn(f"{txn.app_id}/{index}", txn.version)
            try:
                outcome = self._apply_change(change, event.order, marker)
                outcomes.append(outcome)
                if change.new_table is not None and outcome.startswith(ROWS_MOVED):
                    event.moved_to.append("/".join(self.sink.lake_names(*_ident(change.new_table))))
            except _IncompatibleChangeError as exc:
                event.dead_letter = f"DDL not applied: {exc}"
                outcomes.append(f"dead letter: {exc}")
                break
        event.outcome = "; ".join([*event.notes, *outcomes])
        log.info("DDL %r at %s: %s", event.row[model.DDL], event.order, event.outcome)

    def _apply_change(self, change: SchemaChange, order: str, txn: Txn | None) -> str:
        sink = self.sink
        ident = _ident(change.table)
        columns = sink.columns(*ident)
        kind = change.kind
        if kind in ("truncate", "drop_table"):
            sink.clear(self._plan(change.table, order), txn)
            return "applied: rows deleted" + (" (table dropped at the source)" if kind == "drop_table" else "")
        if kind == "create_table":
            if change.like is not None:
                copied = sink.columns(*_ident(change.like))
                if copied is None:
                    return f"nothing to do: {_name(change.like)} is not in the lake; the columns come with data"
                created, keys = list(copied), sink.key_columns(*_ident(change.like))
                detail = f" with the columns of {_name(change.like)}"
            else:
                created, keys = [(n, t) for n, t in change.columns if t is not None], list(change.key_columns)
                untyped = [n for n, t in change.columns if t is None]
                detail = f"; columns {untyped} come with data" if untyped else ""
            if columns is not None:
                return self._create_again(change, created, keys, columns, txn)
            plan = self._plan(change.table, None)
            plan.columns, plan.key_columns = created, keys
            sink.ensure_table(plan)
            return f"applied: table created{detail}"
        if columns is None:
            return "nothing to do: table not in the lake"
        if kind == "rename_table":
            assert change.new_table is not None
            target = _ident(change.new_table)
            if sink.table_path(*target) == sink.table_path(*ident):
                # Routes send both names to one lake table (shards renamed within their pattern): the rows stay.
                return "nothing to do: both names land in the same lake table"
            if sink.columns(*target) is None:
                plan = self._plan(change.new_table, None)
                plan.columns = list(columns)
                plan.key_columns = sink.key_columns(*ident)
                if self._keeps_position(plan):
                    plan.sequence_column = None
                sink.ensure_table(plan)
            sink.copy_rows(ident, target, txn)
            sink.clear(self._plan(change.table, order), None if txn is None else Txn(f"{txn.app_id}/old", txn.version))
            return f"{ROWS_MOVED} {'.'.join(p for p in target if p)}"
        by_lower = {name.lower(): (name, t) for name, t in columns}
        if kind == "add_column":
            assert change.column is not None
            if change.column.lower() in by_lower:
                return "nothing to do: column exists"
            if change.spark_type is None:
                return "deferred: no exact Spark type for the SQL type; the column comes with data"
            sink.add_columns(*ident, [(change.column, change.spark_type)])
            return f"applied: column {change.column} {change.spark_type} added"
        assert change.column is not None
        existing = by_lower.get(change.column.lower())
        if existing is None:
            if change.new_name and change.new_name.lower() in by_lower:
                return "nothing to do: already renamed"
            return f"nothing to do: no column {change.column}"
        name, current_type = existing
        new_name = change.new_name or name
        other = self.shared_with(*ident) if kind == "drop_column" or new_name != name else None
        if other is not None:
            # The lake rows do not say which source table wrote them, and the other source table still sends the
            # column under its old name: dropping or renaming it would take its values from that table's rows too.
            # This table's later rows leave the column NULL (a renamed one comes with them under its new name).
            if kind == "drop_column":
                return f"not applied: the lake table also holds the rows of {other}, which would lose column {name} too"
            return (
                f"not applied: the lake table also holds the rows of {other}, whose column {name} would be renamed "
                f"too; this table's values arrive as column {new_name}"
            )
        keys = sink.key_columns(*ident)
        if kind == "drop_column" or new_name.lower() != name.lower():  # conditions name columns in any case
            self._refuse_if_constrained(ident, [name], columns)
        if kind == "drop_column":
            if name.lower() in (k.lower() for k in keys):
                raise _IncompatibleChangeError(
                    f"column {name} is a key column of the lake table; dropping it would merge rows"
                )
            self._refuse_if_rewrite_loses(ident)
            kept = [(n, F.col(quote(n))) for n, _ in columns if n != name]
            # The rewrite keeps the table's other partition fields: a column the source no longer has cannot
            # partition its rows.
            partitioned = [str(f) for f in sink.partitioning(*ident) if f.column.lower() == name.lower()]
            sink.rewrite(*ident, kept, txn, key_columns=keys)
            unpartitioned = f"; the table is no longer partitioned by {', '.join(partitioned)}" if partitioned else ""
            return f"applied: column {name} dropped{unpartitioned}"
        if new_name != name and new_name.lower() in by_lower:
            raise _IncompatibleChangeError(
                f"cannot rename {name} to {new_name}: the lake table has a column {new_name}"
            )
        new_type, valueless = current_type, False
        # A column keeps its timestamp kind: which kind a source type maps to differs by format (Canal lands a MySQL
        # DATETIME as timestamp_ntz, Debezium as timestamp, as the DDL does), so `MODIFY c DATETIME(6) NOT NULL`
        # would otherwise refuse or rewrite a column for nothing. Values of the other kind are converted at UTC
        # (Pipeline._in_lake_types).
        kept_kind = change.spark_type is not None and model.converts_to(change.spark_type, current_type)
        if kind == "modify_column" and change.spark_type not in (None, current_type) and not kept_kind:
            assert change.spark_type is not None
            if not widened(current_type, change.spark_type):
                if sink.column_has_values(*ident, name):
                    raise _IncompatibleChangeError(
                        f"column {name}: {current_type} -> {change.spark_type} would not keep stored values "
                        "(later values that do not fit the column go to the dead letters)"
                    )
                valueless = True
            new_type = change.spark_type
        if new_name == name and new_type == current_type:
            if kept_kind:
                return f"nothing to do: column {name} keeps {current_type} ({change.spark_type} values are converted)"
            return "nothing to do: column unchanged" + (
                " (type has no exact Spark type)" if not change.spark_type else ""
            )
        if new_name == name and not valueless and sink.widen_in_place(*ident, {name: new_type}):
            return f"applied: column {name} {current_type} -> {new_type}, widened in place"
        self._refuse_if_rewrite_loses(ident)
        retyped = _retyped(name, new_type, valueless)
        rewritten = [(new_name, retyped) if n == name else (n, F.col(quote(n))) for n, _ in columns]
        new_keys = [new_name if k.lower() == name.lower() else k for k in keys]
        renamed = {name: new_name} if new_name != name else None
        sink.rewrite(*ident, rewritten, txn, key_columns=new_keys, renamed=renamed)
        done = []
        if new_name != name:
            done.append(f"column {name} renamed to {new_name}")
        if new_type != current_type:
            done.append(f"column {new_name} {current_type} -> {new_type}")
        return "applied: " + ", ".join(done)

    def _create_again(
        self,
        change: SchemaChange,
        created: list[tuple[str, str]],
        keys: list[str],
        columns: Sequence[tuple[str, str]],
        txn: Txn | None,
    ) -> str:
        """``CREATE TABLE t`` where the lake already has ``t``. The source had no ``t`` (the statement did not fail
        there): the lake table is what a ``DROP TABLE t`` or a rename of ``t`` away left, and takes the new
        definition if that loses nothing. Kept as it is: with ``IF NOT EXISTS``, when it holds rows (a drop the
        lake never saw: the new columns come with data), or when another source table's rows land in it too."""
        ident = _ident(change.table)
        if change.if_not_exists:
            return "nothing to do: table exists"
        if not self.sink.read(ident[0], ident[2], ident[1]).isEmpty():
            return "nothing to do: the lake table exists and has rows; the new columns come with data"
        other = self.shared_with(*ident)
        if other is not None:
            return f"nothing to do: the lake table also holds the rows of {other}"
        # Columns the statement names without a Spark type keep the lake's (their data types them otherwise).
        untyped = {n.lower() for n, t in change.columns if t is None}
        kept = [(n, t) for n, t in columns if n.lower() in untyped]
        definition = created + kept
        if definition == list(columns) and keys == self.sink.key_columns(*ident):
            return "nothing to do: the empty lake table has the new definition"
        defined = {n.lower() for n, _ in definition}
        self._refuse_if_constrained(ident, [n for n, _ in columns if n.lower() not in defined], columns)
        self._refuse_if_rewrite_loses(ident)
        stored = {n.lower(): n for n, _ in columns}
        rewritten = [
            (
                name,
                valueless_as(F.col(quote(stored[name.lower()])), spark_type, name)
                if name.lower() in stored
                else F.lit(None).cast(spark_type),
            )
            for name, spark_type in definition
        ]
        self.sink.rewrite(*ident, rewritten, txn, key_columns=keys)
        described = ", ".join(f"{n} {t}" for n, t in definition)
        return f"applied: the empty lake table takes the new definition ({described}; key {', '.join(keys) or 'none'})"

    def _refuse_if_constrained(
        self, ident: tuple[str | None, str | None, str], lost: Sequence[str], columns: Sequence[tuple[str, str]]
    ) -> None:
        """Raises when a CHECK constraint of the lake table reads a column of ``lost`` (dropped or renamed): Delta
        refuses the rewrite, and every later write, while a constraint reads a column the table no longer has. The
        lake's owner decides: drop the constraint, then replay the dead letter."""
        if not lost:
            return
        for constraint, condition in sorted(self.sink.check_constraints(*ident).items()):
            read = [name for name in columns_used(condition, columns) if name in lost]
            if read:
                raise _IncompatibleChangeError(
                    f"column {read[0]} is read by CHECK constraint {constraint} ({condition}) of the lake table; "
                    f"drop the constraint (ALTER TABLE ... DROP CONSTRAINT {constraint}), then replay this dead letter"
                )

    def _refuse_if_rewrite_loses(self, ident: tuple[str | None, str | None, str]) -> None:
        """Raises when rewriting the lake table would lose what its owner declared on its columns (a table made by
        hand: NOT NULL, identity or generated columns; ``sink.rewrite_loses``). The change is left to the owner; the
        table keeps its columns meanwhile (a renamed column's later values arrive under its new name)."""
        lost = self.sink.rewrite_loses(*ident)
        if lost:
            raise _IncompatibleChangeError(
                f"rewriting the lake table for it would lose what its owner declared ({'; '.join(lost)}); make the "
                "change by hand (ALTER TABLE ...; a Delta table needs 'delta.columnMapping.mode' = 'name' to drop or "
                "rename a column), or drop those declarations, then replay this dead letter"
            )

    def _keeps_position(self, plan: apply.TablePlan) -> bool:
        """Whether ``plan``'s table is one a ``sequence_by`` pattern names a column it lacks: it keeps the format's
        order (``Pipeline._in_position_order``), and a lake table created for it with rows records that ordering
        (recorded as the column, its next row changes would be refused as ordered otherwise)."""
        ident = (plan.database, plan.schema, plan.table)
        problem = sequence_by_problem(dict(self.sequence_by.entries), ident, [name for name, _ in plan.columns])
        return problem is not None and problem.warning_only

    def _plan(self, table: TableName, order: str | None) -> apply.TablePlan:
        return apply.TablePlan(
            table_id=_table_id(table),
            database=table.database,
            schema=table.schema,
            table=table.table,
            columns=[],
            key_columns=[],
            truncate_order=order,
            sequence_column=apply.sequence_column(self.sequence_by, (table.database, table.schema, table.table)),
        )

    # -------------------------------------------------------------------------------------------------------------
    # Declared types

    def reconcile_types(
        self,
        plans: Sequence[apply.TablePlan],
        table_columns: dict[str, list[tuple[str, str]]],
        txn: Txn | None,
    ) -> None:
        """Widens (or, when it holds no value yet, retypes) table columns that the batch declares with another
        type; updates ``table_columns``. Values that still do not fit are the misfit check's dead letters."""
        for plan in plans:
            stored = table_columns[plan.table_id]
            newest = {name.lower(): t for name, t in plan.columns}
            changes: dict[str, str] = {}
            valueless: set[str] = set()
            for name, current in stored:
                declared = plan.declared_types.get(name.lower(), set()) - {current}
                if not declared:
                    continue
                target = common_type(current, declared)
                if target is not None and target != current and widened(current, target):
                    changes[name] = target
                elif not self.sink.column_has_values(plan.database, plan.schema, plan.table, name):
                    changes[name] = newest.get(name.lower(), sorted(declared)[0])
                    valueless.add(name)
            # A type the table format stores as the current one (Iceberg keeps tinyint and smallint as int) is no
            # change: rewriting the table for it would rewrite it again with every batch.
            current_types = dict(stored)
            changes = {n: t for n, t in changes.items() if self.sink.stored_type(t) != current_types[n]}
            # A widening the table format makes in its schema alone rewrites nothing and loses nothing.
            widenings = {n: t for n, t in changes.items() if n not in valueless}
            in_place = self.sink.widen_in_place(plan.database, plan.schema, plan.table, widenings) if widenings else {}
            if in_place:
                log.info("table %s: column types %s, widened in place", plan.table, in_place)
                changes = {n: t for n, t in changes.items() if n not in in_place}
                stored = self.sink.columns(plan.database, plan.schema, plan.table) or stored
                table_columns[plan.table_id] = stored
            if not changes:
                continue
            if lost := self.sink.rewrite_loses(plan.database, plan.schema, plan.table):
                # Values that do not fit the column's type are the misfit check's dead letters.
                kept = (plan.table_id, tuple(sorted(changes.items())))
                if kept not in self._types_kept:
                    self._types_kept.add(kept)
                    log.warning(
                        "table %s: column types %s not changed: rewriting the lake table would lose what its owner "
                        "declared (%s)",
                        plan.table,
                        changes,
                        "; ".join(lost),
                    )
                continue
            log.info("table %s: column types %s", plan.table, changes)
            rewritten = [(n, _retyped(n, changes.get(n), n in valueless)) for n, _ in stored]
            marker = None if txn is None else Txn(f"{txn.app_id}/types", txn.version)
            keys = self.sink.key_columns(plan.database, plan.schema, plan.table)
            self.sink.rewrite(plan.database, plan.schema, plan.table, rewritten, marker, key_columns=keys)
            table_columns[plan.table_id] = self.sink.columns(plan.database, plan.schema, plan.table) or stored


def _retyped(name: str, spark_type: str | None, valueless: bool) -> Column:
    """Column ``name`` for a rewrite: as it is, cast to a wider ``spark_type``, or, ``valueless`` (found to hold no
    value), as NULLs of any ``spark_type`` (Spark does not cast between every two types)."""
    column = F.col(quote(name))
    if spark_type is None:
        return column
    return valueless_as(column, spark_type, name) if valueless else column.cast(spark_type)


class _IncompatibleChangeError(Exception):
    """A change that would lose stored values or rows."""
