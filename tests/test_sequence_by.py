"""``sequence_by``: a column of the row orders a table's changes instead of the log position (Canal JSON has none,
so without it the Kafka order decides)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdclake.devtools.verify import read_table
from cdclake.runner import replay
from tests.test_ddl import row_message

pytestmark = pytest.mark.spark

TYPES = {"id": "bigint(20)", "version": "bigint(20)", "v": "varchar(8)"}


def messages() -> list[str]:
    # Delivered out of order: version 10 first, then the older versions 9 and -1 (a negative version too).
    return [
        row_message("INSERT", "t", [{"id": "1", "version": "10", "v": "new"}], TYPES),
        row_message("INSERT", "t", [{"id": "1", "version": "9", "v": "old"}], TYPES),
        row_message("INSERT", "t", [{"id": "2", "version": "-1", "v": "b-old"}], TYPES),
        row_message("INSERT", "t", [{"id": "2", "version": "-5", "v": "b-older"}], TYPES),
        row_message("INSERT", "u", [{"id": "1", "version": "10", "v": "first"}], TYPES),
        row_message("INSERT", "u", [{"id": "1", "version": "9", "v": "last"}], TYPES),
    ]


@pytest.mark.parametrize("batch_lines", [100, 1], ids=["one-batch", "one-per-batch"])
def test_sequence_by_orders_by_the_column_not_the_arrival(spark, tmp_path: Path, batch_lines: int) -> None:
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(m + "\n" for m in messages()), encoding="utf-8")
    lake = str(tmp_path / "lake")
    replay(
        spark,
        lake=lake,
        format_name="canal-json",
        paths=[str(capture)],
        batch_lines=batch_lines,
        sequence_by={"crm.t*": "version"},  # a pattern, as in `tables`: t, not u
    )
    assert sorted(read_table(f"{lake}/crm/t"), key=lambda r: r["id"]) == [
        {"id": 1, "version": 10, "v": "new"},
        {"id": 2, "version": -1, "v": "b-old"},
    ]
    # a table without sequence_by keeps the arrival order
    assert read_table(f"{lake}/crm/u") == [{"id": 1, "version": 9, "v": "last"}]


def test_a_column_named_for_a_table_that_it_does_not_have_makes_dead_letters(spark, tmp_path: Path) -> None:
    """A misspelt column sorted every change as NULL: the arrival order, silently. Named for the table, its changes
    become dead letters that say why (through a pattern, which may match tables without the column, the table keeps
    the format's order with a warning: tests/e2e/test_check.py). The case of a name does not matter."""
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(m + "\n" for m in messages()), encoding="utf-8")
    lake = str(tmp_path / "lake")
    results = replay(
        spark,
        lake=lake,
        format_name="canal-json",
        paths=[str(capture)],
        sequence_by={"crm.t": "Versoin", "crm.*": "VERSION"},
    )
    assert sum(r.dead_letters for r in results) == 4
    reasons = {r["reason"] for r in read_table(f"{lake}/_cdclake/dead_letters")}
    assert reasons == {"sequence_by column Versoin is not a column of crm.t: fix the `sequence_by` setting"}
    assert read_table(f"{lake}/crm/u") == [{"id": 1, "version": 10, "v": "first"}]
