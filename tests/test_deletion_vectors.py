"""When lake tables use deletion vectors (``deletion_vectors``: auto, always, never), read back from each table's
Delta log and through an independent reader (delta-rs), which must see exactly the rows the changes leave."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from cdclake.devtools.verify import read_table
from cdclake.runner import replay
from cdclake.sinks.delta import DeltaSink
from tests.test_ddl import row_message
from tests.test_delta_sink import CREATED_WITH_ROWS

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def merges_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deletion vectors are a MERGE's: every table takes its changes by one, however small (not by a rewrite of its
    rows, DeltaSink.rewrites_whole, which only tables without deletion vectors get)."""
    monkeypatch.setattr(DeltaSink, "REWRITE_MAX_BYTES", -1)


TYPES = {"id": "bigint(20)", "v": "varchar(8)"}


def _rows(ids: range, v: str | None = None) -> list[dict[str, str]]:
    return [{"id": str(i), "v": v or f"v{i}"} for i in ids]


def _update(ids: range, v: str) -> str:
    return row_message("UPDATE", "t", _rows(ids, v), TYPES, old=_rows(ids))


# One message per batch, so one MERGE each: inserts, an update, a delete, another update, more inserts.
MESSAGES = [
    row_message("INSERT", "t", _rows(range(40)), TYPES),
    _update(range(10), "u1"),
    row_message("DELETE", "t", _rows(range(10, 15)), TYPES),
    _update(range(20, 25), "u2"),
    row_message("INSERT", "t", _rows(range(40, 45)), TYPES),
]
EXPECTED = [
    {"id": i, "v": "u1" if i < 10 else "u2" if 20 <= i < 25 else f"v{i}"} for i in range(45) if not 10 <= i < 15
]


def _replay(spark: Any, lake: Path, messages: list[str], name: str, **options: Any) -> None:
    capture = lake.parent / f"{name}.jsonl"
    capture.write_text("".join(m + "\n" for m in messages), encoding="utf-8")
    replay(spark, lake=str(lake), format_name="canal-json", paths=[str(capture)], batch_lines=1, **options)


def _commits(table: Path) -> list[tuple[str, dict[str, str]]]:
    """(operation, operation metrics) of the table's commits, oldest first, without auto compaction's OPTIMIZEs
    (Delta decides when they follow a commit)."""
    out = []
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            info = json.loads(line).get("commitInfo")
            if info and info["operation"] != "OPTIMIZE":
                out.append((info["operation"], dict(info.get("operationMetrics") or {})))
    return out


def _uses_vectors(metrics: dict[str, str]) -> bool:
    """A MERGE that marked rows in deletion vectors and rewrote no file."""
    marked = int(metrics["numTargetDeletionVectorsAdded"]) + int(metrics["numTargetDeletionVectorsUpdated"])
    return marked > 0 and metrics["numTargetBytesRemoved"] == "0"


def _rewrites(metrics: dict[str, str]) -> bool:
    """A copy-on-write MERGE that replaced rows: it rewrote their files, no deletion vector."""
    return int(metrics["numTargetBytesRemoved"]) > 0 and metrics["numTargetDeletionVectorsAdded"] == "0"


def _reads_back(table: Path) -> list[dict[str, Any]]:
    return sorted(read_table(str(table)), key=lambda row: row["id"])


def test_always_applies_replaced_and_deleted_rows_through_deletion_vectors(spark, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    _replay(spark, lake, MESSAGES, "always", deletion_vectors="always")
    table = lake / "crm" / "t"

    assert "deletionVectors" in (DeltaTable(str(table)).protocol().reader_features or [])
    commits = _commits(table)
    # The first batch creates the table with its rows (no MERGE); each later one MERGEs.
    assert [operation for operation, _ in commits] == [CREATED_WITH_ROWS, *["MERGE"] * (len(MESSAGES) - 1)]
    # The updates and the delete mark the old rows instead of rewriting the file that holds them.
    assert [_uses_vectors(m) for _, m in commits[1:]] == [True, True, True, False]
    assert _reads_back(table) == EXPECTED
    # The data files still hold the replaced and deleted rows: the reader above applied the vectors.
    stored = sum(pq.read_metadata(uri.removeprefix("file://")).num_rows for uri in DeltaTable(str(table)).file_uris())
    assert stored == len(EXPECTED) + 10 + 5 + 5


def test_auto_switches_a_table_once_its_merges_rewrite_enough_and_only_once(spark, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    table = lake / "crm" / "t"
    # Any rewrite is enough here, and the rewrites are looked at after every MERGE.
    with (
        mock.patch.object(DeltaSink, "DELETION_VECTORS_REWRITE_BYTES", 1),
        mock.patch.object(DeltaSink, "DELETION_VECTORS_CHECK_EVERY", 1),
    ):
        _replay(spark, lake, MESSAGES, "auto")
        commits = _commits(table)
        # The inserts create the table; the first update rewrites its file (the median of its one MERGE > 0), so
        # the table switches before the next batch's MERGE, which marks the deleted rows instead.
        assert [operation for operation, _ in commits] == [
            CREATED_WITH_ROWS,
            "MERGE",
            "SET TBLPROPERTIES",
            "MERGE",
            "MERGE",
            "MERGE",
        ]
        assert _rewrites(commits[1][1])
        assert _uses_vectors(commits[3][1])
        assert _uses_vectors(commits[4][1])
        assert _reads_back(table) == EXPECTED

        # A new run finds the vectors in the table's MERGEs and does not switch again.
        _replay(spark, lake, [_update(range(30, 35), "u3")], "later")
    later = _commits(table)[len(commits) :]
    assert [operation for operation, _ in later] == ["MERGE"]
    assert _uses_vectors(later[0][1])
    expected = [{**row, "v": "u3"} if 30 <= row["id"] < 35 else row for row in EXPECTED]
    assert _reads_back(table) == expected


@pytest.mark.parametrize("mode", ["never", "auto"])
def test_a_table_stays_copy_on_write_until_always_switches_it(spark, tmp_path: Path, mode: str) -> None:
    """``never`` does not switch however much MERGEs rewrite; ``auto`` does not switch a table whose MERGEs rewrite
    less than its threshold (kilobytes here). ``always`` then switches the existing table on first use."""
    lake = tmp_path / "lake"
    table = lake / "crm" / "t"
    threshold = 1 if mode == "never" else DeltaSink.DELETION_VECTORS_REWRITE_BYTES
    with (
        mock.patch.object(DeltaSink, "DELETION_VECTORS_REWRITE_BYTES", threshold),
        mock.patch.object(DeltaSink, "DELETION_VECTORS_CHECK_EVERY", 1),
    ):
        _replay(spark, lake, MESSAGES, mode, deletion_vectors=mode)
    commits = _commits(table)
    assert [operation for operation, _ in commits] == [CREATED_WITH_ROWS, *["MERGE"] * (len(MESSAGES) - 1)]
    assert [_rewrites(metrics) for _, metrics in commits[1:]] == [True, True, True, False]
    assert "deletionVectors" not in (DeltaTable(str(table)).protocol().reader_features or [])
    assert _reads_back(table) == EXPECTED

    _replay(spark, lake, [_update(range(30, 35), "u3")], "always", deletion_vectors="always")
    later = _commits(table)[len(commits) :]
    assert [operation for operation, _ in later] == ["SET TBLPROPERTIES", "MERGE"]
    assert _uses_vectors(later[1][1])
    expected = [{**row, "v": "u3"} if 30 <= row["id"] < 35 else row for row in EXPECTED]
    assert _reads_back(table) == expected


def test_history_tables_follow_the_mode_and_keep_the_same_rows(spark, tmp_path: Path) -> None:
    """An SCD2 table closes a key's current row on each change (a MERGE update): with ``always`` it marks the old
    row instead of rewriting its file, and holds exactly the rows the copy-on-write table holds."""
    lakes = {mode: tmp_path / mode / "lake" for mode in ("always", "never")}
    for mode, lake in lakes.items():
        lake.parent.mkdir()
        # SCD2 only: a changelog is append-only, its MERGE inserts and never marks a row.
        _replay(spark, lake, MESSAGES, mode, deletion_vectors=mode, scd2=True)
    history = {mode: lake / "_cdclake" / "scd2" / "crm" / "t" for mode, lake in lakes.items()}
    for mode in lakes:
        features = DeltaTable(str(history[mode])).protocol().reader_features or []
        assert ("deletionVectors" in features) == (mode == "always"), mode
    # The first batch creates the table with its rows (no MERGE); each later one MERGEs.
    commits = _commits(history["always"])
    assert [operation for operation, _ in commits] == [CREATED_WITH_ROWS, *["MERGE"] * (len(MESSAGES) - 1)]
    assert [_uses_vectors(metrics) for _, metrics in commits[1:]] == [True, True, True, False]

    def rows(table: Path) -> list[tuple[Any, ...]]:
        return sorted(tuple(row) for row in spark.read.format("delta").load(str(table)).collect())

    assert rows(history["always"]) == rows(history["never"])
    # A version per insert and update, a marker per delete.
    assert len(rows(history["always"])) == 40 + 10 + 5 + 5 + 5


def test_auto_looks_at_each_table_once_every_25_merges_staggered_by_table(spark) -> None:  # type: ignore[no-untyped-def]
    sink = DeltaSink(spark, "/lake")
    paths = [f"/lake/db/t{i}" for i in range(40)]
    reviewed: dict[str, list[int]] = {path: [] for path in paths}
    done = dict.fromkeys(paths, 0)

    def review(path: str) -> bool:
        reviewed[path].append(done[path])
        return False

    with mock.patch.object(sink, "review_rewrites", side_effect=review):
        for _ in range(100):
            for path in paths:
                sink.merged(path)
                done[path] += 1
    every = DeltaSink.DELETION_VECTORS_CHECK_EVERY
    for path, merges in reviewed.items():
        assert len(merges) == 100 // every, path
        assert all(b - a == every for a, b in itertools.pairwise(merges)), path
    # Not all tables at the same MERGE: a batch of many tables looks at a few of them.
    assert len({merges[0] for merges in reviewed.values()}) > 10
    # never and always have nothing to look at.
    for mode in ("never", "always"):
        with mock.patch.object(DeltaSink, "review_rewrites") as review_rewrites:
            other = DeltaSink(spark, "/lake", mode)  # type: ignore[arg-type]
            for _ in range(every):
                other.merged(paths[0])
        review_rewrites.assert_not_called()


def test_a_look_that_fails_is_logged_not_raised(spark, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The MERGE has committed; its table's history cannot be read (here: no table at the path).
    sink = DeltaSink(spark, str(tmp_path))
    path = str(tmp_path / "db" / "gone")
    with caplog.at_level(logging.WARNING, logger="cdclake.sinks.delta"):
        for _ in range(DeltaSink.DELETION_VECTORS_CHECK_EVERY):
            sink.merged(path)
    assert f"the look at {path}'s recent MERGEs failed, left for later" in caplog.text
    assert "[DELTA_MISSING_DELTA_TABLE]" in caplog.text


def test_short_runs_look_at_every_table_in_turn(spark) -> None:  # type: ignore[no-untyped-def]
    # Scheduled runs (trigger available_now) of one MERGE per table each: a count that started from the path's
    # number alone would look at the same few tables in every run and never at the others.
    paths = [f"/lake/db/t{i}" for i in range(40)]
    reviewed: set[str] = set()
    runs = 20 * DeltaSink.DELETION_VECTORS_CHECK_EVERY  # a table is missed by all of them with odds (24/25)^500
    looked_at_per_run = []
    for _ in range(runs):
        sink = DeltaSink(spark, "/lake")
        with mock.patch.object(sink, "review_rewrites", side_effect=lambda path: reviewed.add(path)) as review:
            for path in paths:
                sink.merged(path)
        looked_at_per_run.append(review.call_count)
    assert reviewed == set(paths)
    # Still a few tables per run, not all of them (40 / 25 on average).
    assert max(looked_at_per_run) < len(paths) // 2
