"""`make demo`: the demo's steps after the broker start (`cdclake.demo.run_demo`), smaller, on the suite's broker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cdclake import demo

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def test_the_demo_streams_every_table_equal_to_the_source_truth(
    spark, kafka, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.run_demo(kafka, tmp_path, topic="demo.test", events=400, max_offsets_per_trigger=300)

    printed = capsys.readouterr().out
    produced = re.search(r"produced (\d+) DataWorks messages for 3 tables", printed)
    assert produced is not None
    batches = [int(count) for count in re.findall(r"batch \d+: (\d+) events ->", printed)]
    assert len(batches) >= 2
    assert sum(batches) == int(produced.group(1))
    for table in ("crm.audit_log", "crm.customer", "shop.orders"):
        assert re.search(rf"PASS {re.escape(table)}: (\d+) rows \(expected \1\)", printed), table
    # The one malformed message the demo produces is a dead letter, named in the output with its offset.
    dead = spark.read.format("delta").load(f"{tmp_path}/lake/_cdclake/dead_letters").collect()
    assert [(row["topic"], row["reason"]) for row in dead] == [("demo.test", "malformed JSON")]
    assert f"demo.test[{dead[0]['partition']}]@{dead[0]['offset']}: malformed JSON" in printed
