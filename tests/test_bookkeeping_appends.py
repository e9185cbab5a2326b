"""Appends to the bookkeeping tables under ``_cdclake`` (``DeltaSink.append``) are written once per commit marker,
which their rows carry, as Delta's idempotent-writer rule would: an append whose app id has that version or a later
one in the table is skipped, by the same sink or by a new one (a restarted process)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from cdclake.sinks.delta import (
    MARKER_APP_COLUMN,
    MARKER_VERSION_COLUMN,
    TABLE_PROPERTIES,
    TXN_APP_ID,
    TXN_VERSION,
    DeltaSink,
    Txn,
)
from cdclake.spark import local_frame, session_settings

NAME = "log"


def _rows(spark: SparkSession, *values: int) -> DataFrame:
    return local_frame(spark, [(value,) for value in values], "n bigint")


def _appended(sink: DeltaSink) -> list[int]:
    table = sink.read_system(NAME)
    assert table is not None
    return sorted(row["n"] for row in table.collect())


def _log_actions(path: Path) -> list[dict[str, object]]:
    return [
        json.loads(line)
        for commit in sorted(path.glob("_delta_log/*.json"))
        for line in commit.read_text().split("\n")
        if line
    ]


def test_an_append_is_written_once_per_marker_without_deltas_marker(spark: SparkSession, tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    sink = DeltaSink(spark, lake)
    sink.append(NAME, _rows(spark, 1), Txn("app", 1))
    sink.append(NAME, _rows(spark, 1), Txn("app", 1))  # the same sink: a batch run again in the same process
    DeltaSink(spark, lake).append(NAME, _rows(spark, 1), Txn("app", 1))  # a restarted process
    DeltaSink(spark, lake).append(NAME, _rows(spark, 0), Txn("app", 0))  # an older version, as Delta skips it
    sink.append(NAME, _rows(spark, 2), Txn("app", 2))
    sink.append(NAME, _rows(spark, 3), Txn("app/step", 2))  # another step of the batch: a marker of its own
    sink.append(NAME, _rows(spark, 4), None)  # unmarked appends are always written
    sink.append(NAME, _rows(spark, 4), None)

    assert _appended(sink) == [1, 2, 3, 4, 4]
    table = sink.read_system(NAME)
    assert table is not None
    assert table.columns == ["n"]
    marked = spark.read.format("delta").load(sink.system_path(NAME))
    assert sorted(
        (r[0], r[1], r[2]) for r in marked.select("n", MARKER_APP_COLUMN, MARKER_VERSION_COLUMN).collect()
    ) == [
        (1, "app", 1),
        (2, "app", 2),
        (3, "app/step", 2),
        (4, None, None),
        (4, None, None),
    ]
    # No Delta idempotent-writer action: Delta would look the app's last one up on every append (a log replay).
    assert not [action for action in _log_actions(Path(sink.system_path(NAME))) if "txn" in action]


def test_a_table_from_before_the_marker_columns_keeps_deltas_marker_in_that_sink(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = str(tmp_path / "lake")
    sink = DeltaSink(spark, lake)
    # As cdclake appended before its rows carried the marker: Delta's writer options only.
    _rows(spark, 1).write.format("delta").option("txnAppId", "app").option("txnVersion", 1).save(sink.system_path(NAME))
    (
        _rows(spark, 2)
        .write.format("delta")
        .mode("append")
        .option("txnAppId", "app/step")
        .option("txnVersion", 1)
        .save(sink.system_path(NAME))
    )

    sink.append(NAME, _rows(spark, 1), Txn("app", 1))  # a re-run of that batch, the first append of a new process
    sink.append(NAME, _rows(spark, 3), Txn("app", 2))  # adds the marker columns
    sink.append(NAME, _rows(spark, 2), Txn("app/step", 1))  # still found by Delta's marker in this sink
    assert _appended(sink) == [1, 2, 3]

    later = DeltaSink(spark, lake)
    later.append(NAME, _rows(spark, 3), Txn("app", 2))  # found in the rows
    later.append(NAME, _rows(spark, 4), Txn("app", 3))
    assert _appended(later) == [1, 2, 3, 4]


def test_after_a_failed_append_the_sink_reads_the_markers_again(spark: SparkSession, tmp_path: Path) -> None:
    """A failed append may have committed: the sink does not trust what it knew before it."""
    lake = str(tmp_path / "lake")
    sink = DeltaSink(spark, lake)
    sink.append(NAME, _rows(spark, 1), Txn("app", 1))
    misfit = local_frame(spark, [({"x": 1},)], "n struct<x: int>")
    with pytest.raises(AnalysisException):
        sink.append(NAME, misfit, Txn("app", 3))
    DeltaSink(spark, lake).append(NAME, _rows(spark, 2), Txn("app", 2))  # written meanwhile, by another sink

    sink.append(NAME, _rows(spark, 2), Txn("app", 2))
    assert _appended(sink) == [1, 2]


def test_a_sink_reads_the_versions_below_those_it_read_when_it_needs_them(spark: SparkSession, tmp_path: Path) -> None:
    """A sink reads the markers of the versions from its first append's up (the newest files); an append of an older
    version reads again from there."""
    lake = str(tmp_path / "lake")
    DeltaSink(spark, lake).append(NAME, _rows(spark, 3), Txn("app/step", 3))
    sink = DeltaSink(spark, lake)
    sink.append(NAME, _rows(spark, 5), Txn("app", 5))

    sink.append(NAME, _rows(spark, 3), Txn("app/step", 3))
    sink.append(NAME, _rows(spark, 4), Txn("app/step", 4))
    assert _appended(sink) == [3, 4, 5]


@pytest.mark.parametrize(
    "marker",
    [{TXN_APP_ID: "app", TXN_VERSION: "7"}, {TXN_APP_ID: "app"}, {TXN_VERSION: "7"}],
    ids=["both", "app id only", "version only"],
)
def test_an_append_ignores_the_marker_that_an_idempotent_block_sets_on_the_session(
    spark: SparkSession, tmp_path: Path, marker: dict[str, str]
) -> None:
    """The batch's background thread appends while the batch's thread is inside ``idempotent``, whose marker is a
    setting of the shared session. An append neither records that marker nor is skipped by it, and one that starts
    while the block has set only one of its two settings is written (Delta refuses such a write outright:
    ``DELTA_INVALID_IDEMPOTENT_WRITES_OPTIONS``, which failed a batch in CI)."""
    sink = DeltaSink(spark, str(tmp_path / "lake"))
    sink.append(NAME, _rows(spark, 1), Txn("app", 1))
    # ``marker``: the block's settings as another thread would find them while it enters or leaves the block.
    with session_settings(spark, marker):
        sink.append(NAME, _rows(spark, 2), Txn("app", 2))
        sink.append(NAME, _rows(spark, 3), None)
        assert spark.conf.get(TXN_VERSION, None) == marker.get(TXN_VERSION)  # left as it was

    assert _appended(sink) == [1, 2, 3]
    assert not [action for action in _log_actions(Path(sink.system_path(NAME))) if "txn" in action]


@pytest.mark.usefixtures("first_compaction")
def test_a_table_created_here_is_compacted_by_count_and_a_found_one_at_its_first_append(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Delta's auto compaction compacts a table on its first file-adding commit in a process. A bookkeeping table
    that the sink creates has nothing to compact then, so its appends compact only by count (``minNumFiles``, 5 here
    instead of 50); a table the sink finds existing keeps the first compaction, which is what compacts it when every
    run is shorter than the count. Each append writes two files here (no optimized write), so that a first compaction
    has something to do and leaves a commit. The found table is written first by delta-rs: Delta's count lives in
    the JVM, so only a table this JVM has never written is one it has not compacted."""

    def compactions(path: str) -> list[int]:
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
        return sorted(row["version"] for row in history if row["operation"] == "OPTIMIZE")

    def two_files(value: int) -> DataFrame:
        return spark.range(value, value + 2, numPartitions=2).withColumnRenamed("id", "n")

    sink = DeltaSink(spark, str(tmp_path / "lake"))
    found = sink.system_path("found")
    write_deltalake(found, pa.table({"n": pa.array([0], pa.int64())}), configuration=dict(TABLE_PROPERTIES))
    settings = {
        "spark.databricks.delta.autoCompact.minNumFiles": "5",
        "spark.databricks.delta.optimizeWrite.enabled": "false",
    }
    with session_settings(spark, settings):
        for version in range(3):
            sink.append(NAME, two_files(10 * version), Txn("app", version))
        sink.append("found", two_files(1), Txn("app", 0))
    assert compactions(sink.system_path(NAME)) == [3]  # once versions 0-2 made 6 files, not after the first
    assert compactions(found) == [2]  # right after the sink's first append (version 1)
    assert _appended(sink) == sorted(10 * v + i for v in range(3) for i in range(2))
