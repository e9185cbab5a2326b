"""HistoryConfig knobs: row width (``extra_columns``) and a steady clock (``clock_step_ms``), which the benchmarks use,
and primary-key updates (``key_update_ratio``), which tests/test_key_changes.py replays."""

from __future__ import annotations

import pytest

from cdclake.workload import HistoryConfig, SourceHistory
from cdclake.workload.history import COLUMN_KINDS, Change, build_tables


def test_defaults_leave_the_history_unchanged() -> None:
    plain = SourceHistory.generate(HistoryConfig(seed=3, events=200))
    explicit = SourceHistory.generate(
        HistoryConfig(seed=3, events=200, extra_columns=0, clock_step_ms=None, key_update_ratio=0.0)
    )
    assert [(c.op, c.sequence, c.event_time_ms, c.after) for c in plain.changes] == [
        (c.op, c.sequence, c.event_time_ms, c.after) for c in explicit.changes
    ]


def test_extra_columns_widen_every_table() -> None:
    cfg = HistoryConfig(tables=3, keyless_tables=1, oracle_tables=1, extra_columns=7)
    for spec in build_tables(cfg):
        extra = spec.columns[-7:]
        names = [c.name for c in extra]
        expected = [f"x{i:02d}" for i in range(1, 8)]
        assert names == ([n.upper() for n in expected] if spec.db_type == "Oracle" else expected)
        assert [c.kind for c in extra] == [COLUMN_KINDS[i % len(COLUMN_KINDS)] for i in range(7)]
    history = SourceHistory.generate(HistoryConfig(seed=1, events=300, extra_columns=7))
    rows = [c.after for c in history.changes if c.after is not None]
    assert rows
    assert all("x07" in row for row in rows)


def test_steady_clock_paces_event_times() -> None:
    cfg = HistoryConfig(seed=2, events=1000, start_time_ms=1_000_000, clock_step_ms=2.5)
    changes = SourceHistory.generate(cfg).changes
    assert [c.event_time_ms for c in changes] == [1_000_000 + int(i * 2.5) for i in range(len(changes))]
    sequences = [c.sequence for c in changes]
    assert sequences == sorted(set(sequences))


def test_sub_millisecond_steps_keep_sequences_increasing() -> None:
    changes = SourceHistory.generate(HistoryConfig(seed=2, events=500, clock_step_ms=0.1)).changes
    sequences = [c.sequence for c in changes]
    assert sequences == sorted(set(sequences))


@pytest.mark.parametrize(("name", "value"), [("extra_columns", -1), ("clock_step_ms", -0.5)])
def test_invalid_values_are_rejected(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=name):
        HistoryConfig(**{name: value}).validate()


def test_a_history_with_key_updates_moves_rows_to_their_new_keys() -> None:
    """The workload generator's primary-key updates (``key_update_ratio``): each moves a row to a key no row holds,
    the truth follows it, and a history without them is the one it always was."""
    config = HistoryConfig(seed=3, tables=2, events=200, keys_per_table=12, keyless_tables=1, key_update_ratio=0.5)
    history = SourceHistory.generate(config)
    moves = _key_updates(history)
    assert moves
    live: dict[tuple[str, str], set[int]] = {}
    for change in history.changes:
        keys = live.setdefault(change.table.ident, set())
        if not change.table.primary_key:
            continue
        if change.op == "TRUNCATE":
            keys.clear()
        elif change.op == "INSERT":
            assert change.after is not None
            assert change.after["id"] not in keys
            keys.add(change.after["id"])
        elif change.op == "DELETE":
            assert change.before is not None
            keys.remove(change.before["id"])
        elif change.op == "UPDATE":
            assert change.before is not None
            assert change.after is not None
            if change.before["id"] != change.after["id"]:
                assert change.after["id"] not in keys, "a key update moved a row onto a held key"
                keys.remove(change.before["id"])
                keys.add(change.after["id"])
    for ident, rows in history.truth().items():
        if history.table(*ident).primary_key:
            assert {row["id"] for row in rows} == live[ident]
    unmoved = SourceHistory.generate(HistoryConfig(seed=3, tables=2, events=200, keys_per_table=12, keyless_tables=1))
    assert _key_updates(unmoved) == []  # none by default


def _key_updates(history: SourceHistory) -> list[Change]:
    """The UPDATEs of ``history`` that change a row's ``id`` (its primary key)."""
    return [
        change
        for change in history.changes
        if change.op == "UPDATE"
        and change.table.primary_key
        and change.before is not None
        and change.after is not None
        and change.before["id"] != change.after["id"]
    ]
