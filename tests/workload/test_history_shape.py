"""The HistoryConfig knobs the benchmarks use: row width (``extra_columns``) and a steady clock (``clock_step_ms``)."""

from __future__ import annotations

import pytest

from cdclake.workload import HistoryConfig, SourceHistory
from cdclake.workload.history import COLUMN_KINDS, build_tables


def test_defaults_leave_the_history_unchanged() -> None:
    plain = SourceHistory.generate(HistoryConfig(seed=3, events=200))
    explicit = SourceHistory.generate(HistoryConfig(seed=3, events=200, extra_columns=0, clock_step_ms=None))
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
