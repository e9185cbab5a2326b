"""``tables: {include, exclude}`` end to end: a whole-database stream (DTS Avro, whose TRUNCATE and ADD COLUMN come
as DDL text) replayed with a filter lands exactly the admitted tables, equal to the source truth; the excluded ones
get no lake table, no DDL and no dead letters, and their events are counted in progress rows of scope
``excluded``. A DDL statement sent as an admitted table's event but naming an excluded table is not applied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdclake import model
from cdclake.devtools.verify import compare_lake, describe
from cdclake.pipeline import PROGRESS, Pipeline, PipelineSettings
from cdclake.runner import replay
from cdclake.sources.files import read_file
from cdclake.tables import TableFilter
from cdclake.workload import HistoryConfig, RenderOptions, SourceHistory, render_stream
from tests.e2e.helpers import replay_in_two_batches
from tests.formats.golden import CASES, read_jsonl

pytestmark = pytest.mark.spark

HISTORY = HistoryConfig(
    seed=28, tables=4, events=160, keys_per_table=15, keyless_tables=1, truncates=1, added_columns=1
)
SHAPE = RenderOptions(heartbeat_every=40, resends=1, malformed=2, transactions=True)
# shop.orders gets the ADD COLUMN, crm.customer the TRUNCATE, crm.audit_log is the key-less table.
FILTER = TableFilter.of(include=["shop.*", "crm.c*"], exclude=["shop.ord?rs"])
ADMITTED = {("crm", "customer"), ("shop", "events")}


def test_only_the_admitted_tables_land(spark: SparkSession, tmp_path: Path) -> None:
    history = SourceHistory.generate(HISTORY)
    assert {t.ident for t in history.tables} == ADMITTED | {("shop", "orders"), ("crm", "audit_log")}
    ddl_tables = {c.table.ident for c in history.changes if c.op in ("TRUNCATE", "ADD_COLUMN")}
    assert ddl_tables == {("crm", "customer"), ("shop", "orders")}
    stream = render_stream("dts-avro", history, SHAPE, seed=28)
    lake, results = replay_in_two_batches(spark, tmp_path, stream, "dts-avro", tables=FILTER)

    truth = stream.expected_truth(history)
    comparison = compare_lake(lake, {ident: rows for ident, rows in truth.items() if ident in ADMITTED})
    assert all(r.ok for r in comparison), describe(comparison)
    assert all(r.actual_rows > 0 for r in comparison)
    for database, table in {("shop", "orders"), ("crm", "audit_log")}:
        assert not (Path(lake) / database / table).exists()

    # Reference: the stream decoded without a filter, counted per table (errors apart). Stored before counting, as
    # the pipeline does: filters over the decoder's projections would be pushed into them.
    decoder = Pipeline(spark, PipelineSettings(lake=str(tmp_path / "unused"), app_id="ref", default_format="dts-avro"))
    capture = read_file(spark, str(tmp_path / "capture.txt"), 0, "b64")
    try:
        events = decoder.decode(capture.lines(0, capture.count)).localCheckpoint(eager=True)
        counts = (
            events.where(F.col(model.TABLE).isNotNull())
            .groupBy(model.DATABASE, model.TABLE, F.col(model.ERROR).isNotNull().alias("bad"))
            .count()
            .collect()
        )
    finally:
        capture.release()
    per_table = {(r[model.DATABASE], r[model.TABLE]): r["count"] for r in counts if not r["bad"]}
    bad_tables = {(r[model.DATABASE], r[model.TABLE]) for r in counts if r["bad"]}
    assert not bad_tables  # the malformed messages name no table: dead letters whatever the filter
    excluded_events = sum(n for ident, n in per_table.items() if ident not in ADMITTED)
    assert excluded_events > 0
    assert sum(r.excluded for r in results) == excluded_events
    assert sum(r.dead_letters for r in results) == SHAPE.malformed

    progress = spark.read.format("delta").load(f"{lake}/_cdclake/{PROGRESS}")
    counted = {
        (r["scope"], r["database"], r["table"]): r["events"]
        for r in progress.where("scope IN ('table', 'excluded')")
        .groupBy("scope", "database", "table")
        .agg(F.sum("events").alias("events"))
        .collect()
    }
    assert counted == {("excluded" if ident not in ADMITTED else "table", *ident): n for ident, n in per_table.items()}
    changes = spark.read.format("delta").load(f"{lake}/_cdclake/schema_changes").collect()
    # DTS sends DDL as database-level events (no table): they pass the event filter, and the statement naming the
    # excluded table is recorded but not applied.
    outcomes = {(r["database"], r["ddl"]): r["outcome"] for r in changes}
    assert outcomes == {
        ("crm", "TRUNCATE TABLE `customer`"): "applied: rows deleted",
        ("shop", "ALTER TABLE `orders` ADD COLUMN `extra_1` varchar(255) NULL"): "not applied: table excluded",
    }


def _dataworks_ddl(text: str, sequence: str) -> str:
    """The golden DataWorks ALTER message of crm.customer, carrying ``text`` instead."""
    value = read_jsonl(CASES / "dataworks-json" / "ddl.input.jsonl")[0]["value"]
    value["payload"]["ddl"]["text"] = text
    value["payload"]["op"] = "CREATE"
    value["payload"]["sequenceId"] = sequence
    return json.dumps(value)


def test_a_statement_naming_only_excluded_tables_is_not_applied(spark: SparkSession, tmp_path: Path) -> None:
    lines = [case["value"] for case in read_jsonl(CASES / "dataworks-json" / "insert.input.jsonl")]
    capture = tmp_path / "capture.jsonl"
    capture.write_text(
        "\n".join(
            [
                *(json.dumps(v) for v in lines),
                _dataworks_ddl("CREATE TABLE tmp_load (id BIGINT PRIMARY KEY, v VARCHAR(8))", "1709288131000000901"),
                _dataworks_ddl("CREATE TABLE kept (id BIGINT PRIMARY KEY)", "1709288131000000902"),
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    lake = str(tmp_path / "lake")
    # ddl policy fail for the excluded table: a statement about it must not stop the pipeline either.
    replay(
        spark,
        lake=lake,
        format_name="dataworks-json",
        paths=[str(capture)],
        tables=TableFilter.of(exclude=["crm.tmp_*"]),
        ddl_table_policies={"crm.tmp_load": "fail"},
    )
    outcomes = {
        r["ddl"]: r["outcome"] for r in spark.read.format("delta").load(f"{lake}/_cdclake/schema_changes").collect()
    }
    assert outcomes == {
        "CREATE TABLE tmp_load (id BIGINT PRIMARY KEY, v VARCHAR(8))": "not applied: table excluded",
        "CREATE TABLE kept (id BIGINT PRIMARY KEY)": "applied: table created",
    }
    assert not (Path(lake) / "crm" / "tmp_load").exists()
    assert (Path(lake) / "crm" / "kept").exists()
    assert (Path(lake) / "crm" / "customer").exists()
