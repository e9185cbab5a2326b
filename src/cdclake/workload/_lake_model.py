"""What a lake holds after replaying a history through a format that identifies rows differently from the source,
or cannot express a change kind: the reference for :attr:`RenderedStream.expected` of the vendor renderers.

:meth:`SourceHistory.truth` identifies rows by primary key, or by the hidden row id of key-less tables, and empties
a table on TRUNCATE. A format may only offer another identity (the full row image when it carries no row id, the
Oracle ROWID of the physical row) or carry a TRUNCATE as DDL text that is recorded but not applied. :func:`simulate`
replays the changes under such semantics; run with the source semantics it must give the truth back
(:func:`check_against_truth`), which keeps this model honest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

from cdclake.workload.history import Change, SourceHistory, TableSpec

Identity = Literal["source", "full_image", "physical_row"]
"""How the lake tells rows apart:

* ``source``: primary key, else the hidden row id (:attr:`Change.row_id`), as the truth does;
* ``full_image``: primary key, else every column value (identical rows collapse into one; a column added later
  counts as NULL in older rows, as in a table altered in place);
* ``physical_row``: the physical row (Oracle ROWID): a new one per INSERT, kept by UPDATEs.
"""

Rows = dict[tuple[str, str], list[tuple[Any, dict[str, Any]]]]
"""``(database, table)`` -> ``(identity, row)`` pairs; rows map every column of the final table definition."""


def physical_rows(history: SourceHistory) -> list[int | None]:
    """The physical row number of each change (same index as :attr:`SourceHistory.changes`): the history's row id
    where it has one, else a per-table counter assigned at INSERT and kept until the row is deleted or
    truncated; ``None`` for TRUNCATE and ADD_COLUMN."""
    numbers: list[int | None] = []
    live: dict[tuple[str, str], dict[tuple[Any, ...], int]] = {}
    issued: dict[tuple[str, str], int] = {}
    for change in history.changes:
        table = change.table
        rows = live.setdefault(table.ident, {})
        if change.op == "TRUNCATE":
            rows.clear()
            numbers.append(None)
            continue
        if change.op == "ADD_COLUMN":
            numbers.append(None)
            continue
        if change.row_id is not None:
            numbers.append(change.row_id)
            continue
        if change.op == "INSERT":
            assert change.after is not None
            number = issued.get(table.ident, 0) + 1
            issued[table.ident] = number
            rows[primary_key(table, change.after)] = number
        elif change.op == "UPDATE":
            assert change.before is not None
            assert change.after is not None
            number = rows.pop(primary_key(table, change.before))
            rows[primary_key(table, change.after)] = number
        else:
            assert change.before is not None
            number = rows.pop(primary_key(table, change.before))
        numbers.append(number)
    return numbers


def primary_key(table: TableSpec, row: dict[str, Any]) -> tuple[Any, ...]:
    """The primary-key values of ``row`` (``()`` for a key-less table)."""
    return tuple(row[k] for k in table.primary_key)


def simulate(history: SourceHistory, identity: Identity, *, applies_truncate: bool) -> Rows:
    """Replays ``history`` with the given row identity; TRUNCATE empties the table only if ``applies_truncate``."""
    numbers = physical_rows(history) if identity == "physical_row" else []
    final_columns = {t.ident: t.column_names() for t in history.tables}
    state: dict[tuple[str, str], dict[Any, dict[str, Any]]] = {t.ident: {} for t in history.tables}

    def identity_of(index: int, change: Change, row: dict[str, Any]) -> Any:
        table = change.table
        if identity == "physical_row":
            return ("row", numbers[index])
        if table.primary_key:
            return primary_key(table, row)
        if identity == "source":
            return ("row", change.row_id)
        return tuple(row.get(c) for c in final_columns[table.ident])

    for index, change in enumerate(history.changes):
        rows = state.setdefault(change.table.ident, {})
        if change.op == "TRUNCATE":
            if applies_truncate:
                rows.clear()
            continue
        if change.op == "ADD_COLUMN":
            continue
        if change.before is not None:
            rows.pop(identity_of(index, change, change.before), None)
        if change.after is not None:
            rows[identity_of(index, change, change.after)] = dict(change.after)
    return {
        ident: [(key, {c: row.get(c) for c in final_columns[ident]}) for key, row in rows.items()]
        for ident, rows in state.items()
    }


def _multiset(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(repr(sorted(row.items())) for row in rows)


def check_against_truth(history: SourceHistory, truth: dict[tuple[str, str], list[dict[str, Any]]]) -> None:
    """Raises ``AssertionError`` unless :func:`simulate` with the source semantics reproduces ``truth``."""
    replayed = simulate(history, "source", applies_truncate=True)
    for ident, rows in truth.items():
        if _multiset(rows) != _multiset([row for _, row in replayed.get(ident, [])]):
            raise AssertionError(f"lake model disagrees with SourceHistory.truth() for {ident}")


def _source_name(table: TableSpec) -> tuple[str, str]:
    return table.ident


def expected_tables(
    history: SourceHistory,
    identity: Identity,
    *,
    applies_truncate: bool,
    to_lake: Callable[[TableSpec, Any, dict[str, Any]], dict[str, Any]],
    lake_table: Callable[[TableSpec], tuple[str, str]] | None = None,
) -> Callable[[dict[tuple[str, str], list[dict[str, Any]]]], dict[tuple[str, str], list[dict[str, Any]]]]:
    """The ``expected`` mapping of a rendered stream: the truth checked against the model, then the rows the model
    says the lake keeps, each converted by ``to_lake(final table, identity, row)``, under the lake's
    ``(database, table)`` name (``lake_table``, by default the source's)."""

    def expected(truth: dict[tuple[str, str], list[dict[str, Any]]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
        check_against_truth(history, truth)
        kept = simulate(history, identity, applies_truncate=applies_truncate)
        tables = {t.ident: t for t in history.tables}
        return {
            (lake_table or _source_name)(tables[ident]): [
                to_lake(tables[ident], key, row) for key, row in kept.get(ident, [])
            ]
            for ident in truth
        }

    return expected
