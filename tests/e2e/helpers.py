"""Shared pieces of the end-to-end tests: workloads with known truth, and lake comparisons."""

from __future__ import annotations

from pathlib import Path

from cdclake.devtools.verify import compare_lake, describe
from cdclake.workload import DataWorksOptions, HistoryConfig, Message, SourceHistory, render, to_jsonl


def workload(seed: int = 11, events: int = 300, **options: object) -> tuple[SourceHistory, list[Message]]:
    """A DataWorks stream with every trap of issue 2: both update modes, failover re-sends, heartbeats,
    transactions, a key-less table, a truncate, an added column and malformed messages."""
    history = SourceHistory.generate(
        HistoryConfig(
            seed=seed, tables=3, events=events, keys_per_table=25, keyless_tables=1, truncates=1, added_columns=1
        )
    )
    settings = {
        "update_mode": "mixed",
        "heartbeat_every": 40,
        "failover_resends": 2,
        "malformed": 3,
        "transactions": True,
        **options,
    }
    return history, render(history, DataWorksOptions(**settings), seed=seed)  # type: ignore[arg-type]


def write_lines(path: Path, messages: list[Message]) -> Path:
    path.write_text(to_jsonl(messages), encoding="utf-8")
    return path


def assert_lake_equals_truth(lake: str, history: SourceHistory) -> None:
    results = compare_lake(lake, history.truth())
    assert all(r.ok for r in results), describe(results)
    assert sum(r.actual_rows for r in results) > 0
