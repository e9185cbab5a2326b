"""Compare lake tables with a source truth using an independent Delta reader (delta-rs, no Spark).

Used by the demo and the end-to-end tests: if cdclake wrote something that only Spark can read back, or read back
differently, this is where it shows.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cdclake.model import METADATA_PREFIX
from cdclake.sinks.delta import safe_name


@dataclass
class TableComparison:
    """Result for one table."""

    name: str
    expected_rows: int
    actual_rows: int
    missing: list[dict[str, Any]] = field(default_factory=list)
    unexpected: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and not self.missing and not self.unexpected


def _normalise(value: Any) -> Any:
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=UTC)
        return aware.astimezone(UTC)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def _row_key(row: Mapping[str, Any], columns: Sequence[str]) -> tuple[Any, ...]:
    return tuple((c, repr(_normalise(row.get(c)))) for c in columns)


def read_table(path: str) -> list[dict[str, Any]]:
    """All rows of the Delta table at ``path`` without cdclake's metadata columns, read by delta-rs."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    # delta-rs resolves the log to the live data files; pyarrow reads them. (Letting delta-rs or pyarrow.dataset
    # scan aborts the interpreter at exit now and then, a thread-teardown race; this path does not.) A live file
    # of a table with deletion vectors still holds the rows its vector marks deleted, and a column-mapped table's
    # files name its columns by generated names: such tables are read through delta-rs' DataFusion engine, which
    # applies both (its pyarrow dataset refuses deletion vectors).
    table = DeltaTable(path)
    mapped = table.metadata().configuration.get("delta.columnMapping.mode", "none") != "none"
    if mapped or "deletionVectors" in (table.protocol().reader_features or []):
        import pyarrow as pa
        from deltalake import QueryBuilder

        rows = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all()).to_pylist()
    else:
        # A data file may hold columns that are not the table's: Delta's change data feed writes `_change_type`
        # into them (null in data rows), and pyarrow reads every column a file has.
        columns = {field.name for field in table.schema().fields}
        rows = [
            {k: v for k, v in row.items() if k in columns}
            for uri in table.file_uris()
            for row in pq.read_table(uri.removeprefix("file://")).to_pylist()
        ]
    return user_rows(rows)


def user_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (of a lake table, read by any reader) without cdclake's metadata columns, values normalised as
    :func:`read_table` does."""
    return [{k: _normalise(v) for k, v in row.items() if not k.startswith(METADATA_PREFIX)} for row in rows]


def compare_table(
    path: str,
    name: str,
    expected: Sequence[Mapping[str, Any]],
    read: Callable[[str], list[dict[str, Any]]] = read_table,
) -> TableComparison:
    """Compares a lake table with expected rows as multisets (row order is irrelevant).

    Args:
        read: reads the table at ``path`` (:func:`read_table`, delta-rs, by default).
    """
    try:
        actual = read(path)
    except Exception as exc:  # a missing or unreadable table is a finding, not a crash
        if not expected:
            return TableComparison(name, 0, 0)
        return TableComparison(name, len(expected), 0, problem=f"cannot read {path}: {exc}")
    columns = sorted({c for row in expected for c in row} | {c for row in actual for c in row})
    want = Counter(_row_key(row, columns) for row in expected)
    have = Counter(_row_key(row, columns) for row in actual)
    result = TableComparison(name, len(expected), len(actual))
    by_key_expected = {_row_key(r, columns): dict(r) for r in expected}
    by_key_actual = {_row_key(r, columns): r for r in actual}
    result.missing = [by_key_expected[k] for k in (want - have)]
    result.unexpected = [by_key_actual[k] for k in (have - want)]
    return result


def compare_lake(
    lake: str,
    truth: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]],
    read: Callable[[str], list[dict[str, Any]]] = read_table,
) -> list[TableComparison]:
    """Compares every table of ``truth`` ((database, table) -> rows) with ``<lake>/<database>/<table>``, read by
    ``read`` (delta-rs by default)."""
    return [
        compare_table(f"{lake.rstrip('/')}/{safe_name(db)}/{safe_name(table)}", f"{db}.{table}", rows, read)
        for (db, table), rows in sorted(truth.items())
    ]


def describe(results: Sequence[TableComparison], limit: int = 3) -> str:
    """Human-readable report, one line per table plus a few differing rows."""
    lines = []
    for r in results:
        status = "PASS" if r.ok else "FAIL"
        lines.append(f"{status} {r.name}: {r.actual_rows} rows (expected {r.expected_rows})")
        if r.problem:
            lines.append(f"    {r.problem}")
        for row in r.missing[:limit]:
            lines.append(f"    missing:    {row}")
        for row in r.unexpected[:limit]:
            lines.append(f"    unexpected: {row}")
    return "\n".join(lines)
