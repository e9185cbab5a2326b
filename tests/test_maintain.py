"""`cdclake maintain`: old files and snapshots go, the tables (lake, history, bookkeeping) stay as they are, and a
batch re-run after it changes nothing."""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F
from typer.testing import CliRunner

from cdclake.cli.main import app
from cdclake.devtools.verify import compare_lake, describe, read_table
from cdclake.exceptions import InputError
from cdclake.maintain import maintain_lake
from cdclake.pipeline import Pipeline, PipelineSettings
from cdclake.runner import replay
from cdclake.sinks import TableFormat
from cdclake.sources import files
from tests.e2e.helpers import history_table, lake_reader, scd2_reader, workload, write_lines
from tests.test_ddl import ddl_message, row_message

pytestmark = pytest.mark.spark

HISTORY_TABLE = "crm.customer"


def _data_files(table: Path) -> set[str]:
    """The Parquet files under a table's directory, outside its log or metadata (Delta checkpoints are Parquet)."""
    return {
        str(path.relative_to(table))
        for path in table.rglob("*.parquet")
        if not {"_delta_log", "metadata"} & set(path.relative_to(table).parts)
    }


def _referenced(spark, path: Path, table_format: str) -> set[str]:  # type: ignore[no-untyped-def]
    """The data (and Iceberg delete) files that the table's current version references, relative to it."""
    if table_format == "delta":
        uris = spark.read.format("delta").load(str(path)).inputFiles()
    else:
        listed = spark.read.format("iceberg").load(f"{path}#files").select("file_path").collect()
        uris = [row[0] for row in listed]
    return {uri.removeprefix("file:").split(str(path) + "/", 1)[1] for uri in uris}


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_maintain_removes_what_only_old_versions_need(spark, tmp_path: Path, table_format: TableFormat) -> None:
    history, messages = workload(seed=31, events=120, failover_resends=0)
    capture = files.read_file(spark, write_lines(tmp_path / "dw.jsonl", messages), 0, "lines")
    lake = str(tmp_path / "lake")
    settings = PipelineSettings(
        lake=lake,
        app_id="maintained",
        default_format="dataworks-json",
        changelog=[HISTORY_TABLE],
        scd2=[HISTORY_TABLE],
        table_format=table_format,
    )
    pipeline = Pipeline(spark, settings)
    cuts = [0, capture.count // 2, capture.count]  # the second batch's MERGEs leave the first's files unreferenced
    for batch_id, (start, end) in enumerate(pairwise(cuts)):
        pipeline.process_batch(capture.lines(start, end), batch_id)
    truth = history.truth()
    lake_tables = [Path(lake, db, table) for db, table in truth]
    history_rows: dict[str, list[str]] = {}
    for kind in ("changelog", "scd2"):
        frame = history_table(spark, lake, kind, "crm", "customer", table_format)
        assert frame is not None
        history_rows[kind] = sorted(map(repr, frame.collect()))
    before = {table: _data_files(table) for table in lake_tables}
    assert any(before[table] - _referenced(spark, table, table_format) for table in lake_tables)

    if table_format == "delta":
        arguments = ["--lake", lake, "--table-format", table_format]
    else:  # the lake, table format and Spark settings of a pipeline's configuration
        config = tmp_path / "pipeline.yaml"
        kafka = {"bootstrap_servers": "127.0.0.1:9", "topics": ["dw"]}
        configured = {"lake": lake, "kafka": kafka, "format": "dataworks-json", "table_format": table_format}
        config.write_text(yaml.safe_dump(configured))
        arguments = ["--config", str(config)]
    result = CliRunner().invoke(app, ["maintain", *arguments, "--retain-hours", "0"])
    assert result.exit_code == 0, result.output
    for kind in ("lake", "changelog", "scd2", "bookkeeping"):
        assert kind in result.output
    summary = re.search(r"(\d+) tables, (\d+) files removed", result.output)
    assert summary is not None, result.output
    # The lake tables, two history tables, and at least the progress, tombstones and dead letters.
    assert int(summary[1]) >= len(truth) + 2 + 3
    gone = sum(len(before[table] - _data_files(table)) for table in lake_tables)
    assert int(summary[2]) >= gone > 0
    # Each lake table now holds only the files its current version reads.
    for table in lake_tables:
        assert _data_files(table) == _referenced(spark, table, table_format), table
        if table_format == "iceberg":
            assert spark.read.format("iceberg").load(f"{table}#snapshots").count() == 1
    # Nothing a reader sees changed.
    comparison = compare_lake(lake, truth, lake_reader(spark, table_format))
    comparison += compare_lake(
        lake, {("crm", "customer"): truth[("crm", "customer")]}, scd2_reader(spark, lake, table_format)
    )
    assert all(r.ok for r in comparison), describe(comparison)
    for kind, rows in history_rows.items():
        frame = history_table(spark, lake, kind, "crm", "customer", table_format)
        assert frame is not None
        assert sorted(map(repr, frame.collect())) == rows
    progress = spark.read.format("delta").load(f"{lake}/_cdclake/progress")
    assert progress.where(F.col("batch_id") == len(cuts) - 2).count() > 0

    # The other table format finds none of the lake's tables: an error, not a silent partial clean-up.
    other = "iceberg" if table_format == "delta" else "delta"
    wrong = CliRunner().invoke(app, ["maintain", "--lake", lake, "--table-format", other])
    assert isinstance(wrong.exception, InputError)
    assert f"none is a {other} table there" in str(wrong.exception)

    # The last batch, run again by a new pipeline after the maintenance, changes nothing. Delta keeps every batch
    # marker in its log, so nothing is committed either; an Iceberg table keeps the marker of its current snapshot
    # only (its last write), so earlier steps of the batch (a truncate) may commit again, to no effect.
    commits = [_commit_count(spark, table, table_format) for table in lake_tables]
    Pipeline(spark, settings).process_batch(capture.lines(cuts[-2], cuts[-1]), len(cuts) - 2)
    if table_format == "delta":
        assert [_commit_count(spark, table, table_format) for table in lake_tables] == commits
    comparison = compare_lake(lake, truth, lake_reader(spark, table_format))
    assert all(r.ok for r in comparison), describe(comparison)


def _commit_count(spark, table: Path, table_format: str) -> int:  # type: ignore[no-untyped-def]
    if table_format == "delta":
        return spark.sql(f"DESCRIBE HISTORY delta.`{table}`").count()
    return spark.read.format("iceberg").load(f"{table}#snapshots").count()


def test_maintain_finds_a_table_that_only_a_rename_filled(spark, tmp_path: Path) -> None:
    """``RENAME TABLE customer TO client`` moves the rows to a new lake table that no later change names, so no
    progress row does either: ``schema_changes`` records where the rows went (``moved_to``), and maintain reads it."""
    types = {"id": "bigint(20)", "name": "varchar(64)"}
    lines = [
        row_message("INSERT", "customer", [{"id": "1", "name": "a"}, {"id": "2", "name": "b"}], types),
        row_message("UPDATE", "customer", [{"id": "1", "name": "aa"}], types, old=[{"name": "a"}]),
        ddl_message("customer", "RENAME TABLE customer TO client", "RENAME"),
    ]
    capture = tmp_path / "canal.jsonl"
    capture.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    lake = str(tmp_path / "lake")
    replay(spark, lake=lake, format_name="canal-json", paths=[str(capture)], batch_lines=2)
    renames = spark.read.format("delta").load(f"{lake}/_cdclake/schema_changes").select("moved_to").collect()
    assert [row[0] for row in renames] == [["crm/client"]]

    maintained = maintain_lake(spark, lake, retain_hours=0)
    lake_tables = {item.name: item.path for item in maintained if item.kind == "lake"}
    assert lake_tables == {"crm.customer": f"{lake}/crm/customer", "crm.client": f"{lake}/crm/client"}
    assert sorted(read_table(f"{lake}/crm/client"), key=lambda row: row["id"]) == [
        {"id": 1, "name": "aa"},
        {"id": 2, "name": "b"},
    ]
