"""A small lake table takes a batch's changes by a rewrite of its rows (DeltaSink.rewrites_whole): the rows a MERGE
would leave, in one commit marked as such; tables whose commits record more than their rows keep their MERGEs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable

from cdclake.devtools.verify import read_table
from cdclake.runner import replay
from cdclake.sinks import delta
from cdclake.sinks.delta import REWRITE_METADATA, DeltaSink, MergeStatement
from tests.test_ddl import row_message

pytestmark = pytest.mark.spark

TYPES = {"id": "bigint(20)", "v": "varchar(16)", "ver": "int(11)"}
KEYLESS_TYPES = {"name": "varchar(16)", "n": "int(11)"}


def _row(key: int, value: str, version: int) -> dict[str, str]:
    return {"id": str(key), "v": value, "ver": str(version)}


MESSAGES: list[str] = [
    # First batch (BATCH_LINES messages each): the tables are created.
    row_message("INSERT", "t", [_row(k, f"v{k}", 1) for k in range(1, 7)], TYPES),
    row_message("INSERT", "bag", [{"name": "a", "n": "1"}, {"name": "b", "n": "2"}], KEYLESS_TYPES, keys=[]),
    row_message("UPDATE", "t", [_row(1, "one", 2)], TYPES, old=[{"v": "v1", "ver": "1"}]),
    row_message("DELETE", "t", [_row(2, "v2", 1)], TYPES),
    # Older than the stored row (sequence_by ver): neither this update nor the next batch's delete of 4 applies.
    row_message("UPDATE", "t", [_row(3, "stale", 0)], TYPES, old=[{"v": "v3"}]),
    # Second batch.
    row_message("DELETE", "t", [_row(4, "v4", 0)], TYPES),
    row_message("DELETE", "t", [_row(99, "none", 5)], TYPES),  # a key the table never had
    row_message("INSERT", "t", [_row(7, "v7", 1)], TYPES),
    row_message("DELETE", "bag", [{"name": "a", "n": "1"}], KEYLESS_TYPES, keys=[]),
    row_message("INSERT", "bag", [{"name": "c", "n": None}], KEYLESS_TYPES, keys=[]),
    # Third batch.
    row_message("UPDATE", "t", [_row(7, "seven", 2)], TYPES, old=[{"v": "v7", "ver": "1"}]),
    row_message("DELETE", "t", [_row(1, "one", 3)], TYPES),
    row_message("INSERT", "t", [_row(2, "again", 4)], TYPES),  # a deleted key comes back
    row_message("UPDATE", "t", [_row(3, "three", 5)], TYPES, old=[{"v": "v3", "ver": "1"}]),
    row_message("DELETE", "bag", [{"name": "c", "n": None}], KEYLESS_TYPES, keys=[]),  # NULL matches NULL
]
BATCH_LINES = 5
_FEED = {"delta.enableChangeDataFeed": "true"}


def _replay(spark: Any, tmp_path: Path, lake: Path, messages: list[str], **settings: Any) -> None:
    """Canal ``messages`` replayed into ``lake``, :data:`BATCH_LINES` per batch unless ``settings`` say otherwise."""
    capture = tmp_path / f"{lake.name}.jsonl"
    capture.write_text("".join(m + "\n" for m in messages), encoding="utf-8")
    settings = {"batch_lines": BATCH_LINES, **settings}
    replay(spark, lake=str(lake), format_name="canal-json", paths=[str(capture)], **settings)


def _all_rows(spark: Any, path: Path) -> list[dict[str, Any]]:
    """Every row and column of the table, cdclake's own columns included."""
    rows = [row.asDict() for row in spark.read.format("delta").load(str(path)).collect()]
    return sorted(rows, key=lambda row: json.dumps(row, default=str, sort_keys=True))


def _commits(path: Path) -> list[tuple[str, str | None]]:
    """(operation, userMetadata) of the table's commits, oldest first."""
    out = []
    for commit in sorted((path / "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            info = json.loads(line).get("commitInfo")
            if info:
                out.append((info["operation"], info.get("userMetadata")))
    return out


def test_a_small_table_is_rewritten_with_the_rows_its_merge_would_leave(spark, tmp_path: Path) -> None:
    rewritten, merged = tmp_path / "rewritten", tmp_path / "merged"
    _replay(spark, tmp_path, rewritten, MESSAGES, sequence_by={"crm.t": "ver"})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DeltaSink, "REWRITE_MAX_BYTES", -1)
        _replay(spark, tmp_path, merged, MESSAGES, sequence_by={"crm.t": "ver"})

    assert sorted(read_table(str(rewritten / "crm" / "t")), key=lambda r: r["id"]) == [
        {"id": 2, "v": "again", "ver": 4},
        {"id": 3, "v": "three", "ver": 5},
        {"id": 4, "v": "v4", "ver": 1},
        {"id": 5, "v": "v5", "ver": 1},
        {"id": 6, "v": "v6", "ver": 1},
        {"id": 7, "v": "seven", "ver": 2},
    ]
    assert sorted(read_table(str(rewritten / "crm" / "bag")), key=lambda r: r["name"]) == [{"name": "b", "n": 2}]
    for table in ("t", "bag"):
        # The same rows as the MERGEs leave, cdclake's columns (position, event time, operation) included.
        assert _all_rows(spark, rewritten / "crm" / table) == _all_rows(spark, merged / "crm" / table)
        assert [op for op, _ in _commits(merged / "crm" / table)] == ["CREATE TABLE AS SELECT", "MERGE", "MERGE"]
        assert _commits(rewritten / "crm" / table) == [
            ("CREATE TABLE AS SELECT", None),
            ("WRITE", REWRITE_METADATA),
            ("WRITE", REWRITE_METADATA),
        ]


def test_a_table_with_a_change_data_feed_keeps_its_merges(spark, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    first = [_row(k, f"v{k}", 1) for k in range(3)]
    messages = [
        row_message("INSERT", "fed", first, TYPES),
        row_message("UPDATE", "fed", [_row(1, "one", 2)], TYPES, old=[{"v": "v1"}]),
    ]
    _replay(spark, tmp_path, lake, messages, batch_lines=1, table_properties={"crm.fed": _FEED})
    assert [op for op, _ in _commits(lake / "crm" / "fed")] == ["CREATE TABLE AS SELECT", "MERGE"]
    # The feed holds the update, not the table's every row deleted and inserted again.
    changes = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 1)
    kinds = sorted(r["_change_type"] for r in changes.load(str(lake / "crm" / "fed")).collect())
    assert kinds == ["update_postimage", "update_preimage"]


def test_a_rewrite_reads_the_table_inside_its_own_transaction(spark, tmp_path: Path, monkeypatch) -> None:
    """Another writer's commit after the rewrite's rows were planned is read, not overwritten: Delta reads the table
    for the write at the version its transaction starts from."""
    path = str(tmp_path / "lake" / "crm" / "t")
    spark.range(3).selectExpr("id", "'a' AS v").write.format("delta").save(path)
    statement = MergeStatement(
        source=spark.createDataFrame([(0, "new")], "id bigint, v string"),
        matched_on="t.id = s.id",
        insert_values={"id": "s.id", "v": "s.v"},
        update_when="true",
        update_set={"v": "s.v"},
    )
    planned = delta.rows_after

    def planned_then_another_commit(*args: Any) -> Any:
        rows = planned(*args)
        spark.sql(f"UPDATE delta.`{path}` SET v = 'other writer' WHERE id = 1")
        return rows

    monkeypatch.setattr(delta, "rows_after", planned_then_another_commit)
    assert DeltaSink(spark, str(tmp_path / "lake"))._rewrite_whole(path, statement)

    assert sorted((r["id"], r["v"]) for r in spark.read.format("delta").load(path).collect()) == [
        (0, "new"),
        (1, "other writer"),
        (2, "a"),
    ]
    last = DeltaTable.forPath(spark, path).history(1).first()
    assert last is not None
    assert (last["operation"], last["readVersion"], last["userMetadata"]) == ("WRITE", 1, REWRITE_METADATA)


def test_a_statement_that_leaves_a_column_to_the_merge_is_not_rewritten(spark) -> None:
    target = spark.createDataFrame([(1, "a", "x")], "id bigint, v string, extra string")
    statement = MergeStatement(
        source=spark.createDataFrame([(1, "b")], "id bigint, v string"),
        matched_on="t.id = s.id",
        insert_values={"id": "s.id", "v": "s.v"},  # nothing for `extra`: a MERGE inserts NULL or its DEFAULT
    )
    assert delta.rows_after(statement, target) is None
    refused = {"id": "s.id", "v": "s.v", "extra": "NULL", "missing": "s.v"}  # a column the table lacks
    assert delta.rows_after(MergeStatement(statement.source, statement.matched_on, refused), target) is None
    statement = MergeStatement(
        source=statement.source,
        matched_on=statement.matched_on,
        insert_values={"id": "s.id", "v": "s.v", "`extra`": "'new'"},
        update_when="s.v > t.v",
        update_set={"`v`": "s.v"},
    )
    rows = delta.rows_after(statement, target)
    assert rows is not None
    assert [tuple(r) for r in rows.collect()] == [(1, "b", "x")]
