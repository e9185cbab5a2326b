"""Iceberg lake tables (``table_format: iceberg``, cdclake.sinks.iceberg): the same streams must end as the same
tables as with Delta, a re-run batch must commit nothing twice, and DDL must evolve the Iceberg schema.

Tables are read back by path through Iceberg's own Hadoop-table reader (``format("iceberg").load(path)``), not
through the catalog the sink registers."""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JError
from pyspark.sql import functions as F
from typer.testing import CliRunner

from cdclake.cli.main import app
from cdclake.config import parse_config
from cdclake.devtools.verify import compare_lake, describe
from cdclake.exceptions import ConfigError, InputError
from cdclake.pipeline import Pipeline, PipelineSettings
from cdclake.sinks.iceberg import MARKER_PREFIX, IcebergSink, _promotes
from cdclake.workload import HistoryConfig, RenderOptions, SourceHistory, render_stream
from tests.e2e.helpers import lake_reader, replay_in_two_batches
from tests.formats.golden import messages_frame
from tests.test_ddl import EXPECTED_CLIENT, row_message, run_scenario
from tests.test_delta_sink import NEW_TABLES_ROWS, new_tables_batch
from tests.test_dlq import stock

pytestmark = pytest.mark.spark

HISTORY = HistoryConfig(
    seed=11, tables=3, events=120, keys_per_table=15, keyless_tables=1, truncates=1, added_columns=1, null_ratio=0.2
)
SHAPE = RenderOptions(heartbeat_every=30, resends=1, malformed=2, transactions=True, partial_updates=True)
TYPES = {"id": "bigint(20)", "v": "varchar(8)"}


# DataWorks JSON into Iceberg tables: tests/e2e/test_routes.py.
@pytest.mark.parametrize("format_name", ["qlik-json", "dts-shareplex-json", "dts-avro"])
def test_rendered_stream_replays_into_iceberg_tables_equal_to_the_truth(
    spark, tmp_path: Path, format_name: str
) -> None:
    # Truncates, deletes, a key-less table, an added column, re-sends, partial images (Qlik's column mask,
    # SharePlex's changed-only data) and malformed messages, in two batches.
    history = SourceHistory.generate(HISTORY)
    stream = render_stream(format_name, history, SHAPE, seed=11)
    lake, results = replay_in_two_batches(spark, tmp_path, stream, format_name, table_format="iceberg")

    assert sum(r.dead_letters for r in results) == sum(1 for m in stream.messages if m.is_malformed)
    comparison = compare_lake(lake, stream.expected_truth(history), lake_reader(spark, "iceberg"))
    assert all(r.ok for r in comparison), describe(comparison)
    assert sum(r.actual_rows for r in comparison) > 0
    table = next(p for r in results for p in r.applied)
    assert (Path(table) / "metadata").is_dir()  # an Iceberg table, not a Delta one
    assert not (Path(table) / "_delta_log").exists()


def _canal(op: str, rows: list[dict[str, str]]) -> dict[str, Any]:
    return {"value": json.loads(row_message(op, "customer", rows, TYPES))}


def _marks(spark, path: str) -> list[str | None]:  # type: ignore[no-untyped-def]
    """The batch marker of each of the table's snapshots, oldest first."""
    snapshots = spark.read.format("iceberg").load(f"{path}#snapshots").orderBy("committed_at")
    return [row[0] for row in snapshots.select(F.col("summary")[f"{MARKER_PREFIX}app"]).collect()]


def test_a_rerun_batch_commits_nothing_twice(spark, tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    settings = PipelineSettings(lake=lake, app_id="app", default_format="canal-json", table_format="iceberg")
    first = messages_frame(spark, [_canal("INSERT", [{"id": "1", "v": "a"}, {"id": "2", "v": "b"}])])
    second = messages_frame(
        spark, [_canal("UPDATE", [{"id": "2", "v": "c"}]), _canal("DELETE", [{"id": "1", "v": "a"}])]
    )
    second = second.withColumn("offset", F.col("offset") + 10)

    Pipeline(spark, settings).process_batch(first, 0)
    result = Pipeline(spark, settings).process_batch(second, 1)
    path = next(iter(result.applied))
    assert _marks(spark, path) == ["0", "1"]
    # A restarted run (a new pipeline, nothing in memory) re-runs both batches: each MERGE finds its batch's marker
    # in the table's snapshots and is skipped.
    rerun = Pipeline(spark, settings)
    rerun.process_batch(first, 0)
    rerun.process_batch(second, 1)

    assert _marks(spark, path) == ["0", "1"]
    assert lake_reader(spark, "iceberg")(path) == [{"id": 2, "v": "c"}]
    rerun.process_batch(
        messages_frame(spark, [_canal("INSERT", [{"id": "3", "v": "d"}])]).withColumn("offset", F.lit(20)), 2
    )
    assert _marks(spark, path) == ["0", "1", "2"]
    assert sorted(r["id"] for r in lake_reader(spark, "iceberg")(path)) == [2, 3]


def test_a_new_table_is_created_with_its_first_batchs_rows_in_one_snapshot(spark, tmp_path: Path) -> None:
    """As with Delta (tests/test_delta_sink.py): a batch that finds its tables missing creates each with the rows the
    batch leaves, in one snapshot that carries the batch's marker, with cdclake's table properties; a table none of
    whose rows remain is created empty. A re-run of the batch commits nothing more."""
    frame = new_tables_batch(spark)
    lake = str(tmp_path / "lake")
    settings = PipelineSettings(lake=lake, app_id="app", default_format="canal-json", table_format="iceberg")

    Pipeline(spark, settings).process_batch(frame, 0)
    Pipeline(spark, settings).process_batch(frame, 0)  # a re-run after a crash, in a new process

    sink = IcebergSink(spark, lake)
    for name, rows in NEW_TABLES_ROWS.items():
        path = f"{lake}/crm/{name}"
        assert sorted((r["id"], r["v"]) for r in lake_reader(spark, "iceberg")(path)) == rows
        assert _marks(spark, path) == ["0"]
        assert _operations(spark, path) == ["append"]
        # One metadata file: created with its snapshot (a CREATE TABLE and a MERGE would have written two).
        assert spark.read.format("iceberg").load(f"{path}#metadata_log_entries").count() == 1
        properties = sink._properties(path)
        assert (properties["cdclake.source"], properties["cdclake.keyColumns"]) == (f"crm.{name}", "id")
        assert properties["write.merge.mode"] == "merge-on-read"
        table = spark.read.format("iceberg").load(path)
        assert all(field.nullable for field in table.schema.fields)
        assert dict(table.dtypes)["id"] == "bigint"


def test_ddl_evolves_iceberg_tables(spark, tmp_path: Path) -> None:
    # The DDL scenario of test_ddl (add, rename, drop and widen columns, a rejected narrowing, rename, drop and create
    # a table again).
    lake = run_scenario(spark, tmp_path, 4, table_format="iceberg")

    read = lake_reader(spark, "iceberg")
    assert sorted(read(f"{lake}/crm/client"), key=lambda r: r["id"]) == EXPECTED_CLIENT
    assert read(f"{lake}/crm/customer") == []
    schema = dict(spark.read.format("iceberg").load(f"{lake}/crm/client").dtypes)
    assert schema["qty"] == "bigint"
    assert "score" not in schema
    assert "name" not in schema
    # dropped and created again with another definition and key
    assert read(f"{lake}/crm/scratch") == [{"code": "x", "flag": "yes", "born": None}]
    metadata = Path(lake, "crm", "scratch", "metadata")
    newest = (metadata / "version-hint.text").read_text().strip()
    properties = json.loads((metadata / f"v{newest}.metadata.json").read_text())["properties"]
    assert properties["cdclake.keyColumns"] == "code"


def test_iceberg_settings_are_checked(tmp_path: Path) -> None:
    base: dict[str, Any] = {
        "lake": str(tmp_path),
        "format": "dataworks-json",
        "kafka": {"bootstrap_servers": "localhost:9092", "topics": ["t"]},
    }
    assert parse_config({**base, "table_format": "iceberg"}).table_format == "iceberg"
    assert parse_config({**base, "table_format": "iceberg", "history": {"changelog": True}}).history.changelog
    with pytest.raises(ConfigError, match=r"'iceberg_catalog'.*Fix: remove it, or set `table_format: iceberg`"):
        parse_config({**base, "iceberg_catalog": "glue"})
    with pytest.raises(ConfigError, match=r"'table_format'"):
        parse_config({**base, "table_format": "hudi"})


def test_cli_replay_and_dead_letter_replay_into_iceberg_tables(spark, tmp_path: Path) -> None:
    # inv.stock (key `code`, configured) gets a, b, c with a bigint qty; then the source column becomes text: the two
    # updates do not fit and are dead letters. After the operator's fix (qty becomes a string column of the Iceberg
    # table), `dlq replay --table-format iceberg` applies them, under the key columns the table was created with.
    lake = str(tmp_path / "lake")
    initial = tmp_path / "1.jsonl"
    initial.write_text(
        "\n".join(stock("INSERT", i, None, {"code": c, "qty": i}, "LONG") for i, c in [(1, "a"), (2, "b"), (3, "c")])
        + "\n"
    )
    updates = tmp_path / "2.jsonl"
    updates.write_text(
        "\n".join(
            stock("UPDATE_AFTER", seq, {"code": c, "qty": str(old)}, {"code": c, "qty": new}, "STRING")
            for seq, c, old, new in [(4, "a", 1, "one dozen"), (5, "b", 2, "two dozen")]
        )
        + "\n"
    )
    runner = CliRunner()
    for capture in (initial, updates):
        args = ["replay", "--format", "dataworks-json", "--lake", lake, "--keys", "inv.stock=code"]
        done = runner.invoke(app, [*args, "--table-format", "iceberg", str(capture)])
        assert done.exit_code == 0, done.output
    assert "2 dead letters" in done.stdout
    read = lake_reader(spark, "iceberg")
    assert sorted((r["code"], r["qty"]) for r in read(f"{lake}/inv/stock")) == [("a", 1), ("b", 2), ("c", 3)]

    identifier = IcebergSink(spark, lake).identifier("inv", None, "stock")
    table = spark.table(identifier)
    table.withColumn("qty", table["qty"].cast("string")).writeTo(identifier).createOrReplace()
    done = runner.invoke(app, ["dlq", "replay", "--lake", lake, "--table-format", "iceberg"])

    assert done.exit_code == 0, done.output
    assert sorted((r["code"], r["qty"]) for r in read(f"{lake}/inv/stock")) == [
        ("a", "one dozen"),
        ("b", "two dozen"),
        ("c", "3"),
    ]
    bad = runner.invoke(app, ["dlq", "replay", "--lake", lake, "--iceberg-catalog", "glue"])
    assert isinstance(bad.exception, InputError)
    assert "--iceberg-catalog is only used with --table-format iceberg" in str(bad.exception)


def _debezium_insert(key: int, small: int | None) -> dict[str, Any]:
    """A Debezium insert into shop.items (id int64, s int16), with schemas."""
    fields = [{"field": "id", "type": "int64"}, {"field": "s", "type": "int16", "optional": True}]
    image = {"type": "struct", "optional": True, "fields": fields}
    envelope = {
        "type": "struct",
        "fields": [
            {**image, "field": "before"},
            {**image, "field": "after"},
            {"field": "source", "type": "struct", "fields": []},
            {"field": "op", "type": "string"},
            {"field": "ts_ms", "type": "int64"},
        ],
    }
    source = {"db": "shop", "table": "items", "ts_ms": 1709288131000, "lsn": key}
    payload = {"before": None, "after": {"id": key, "s": small}, "source": source, "op": "c", "ts_ms": 1709288131000}
    key_schema = {"type": "struct", "fields": [{"field": "id", "type": "int64"}]}
    return {"key": {"schema": key_schema, "payload": {"id": key}}, "value": {"schema": envelope, "payload": payload}}


def test_a_smallint_column_is_stored_as_int_without_a_rewrite_per_batch(spark, tmp_path: Path) -> None:
    # Iceberg has no smallint: the column is an int. The batches' declared smallint is no type change, so the table
    # is never rewritten for it (each batch would rewrite it again), not even while the column holds only NULLs.
    lake = str(tmp_path / "lake")
    settings = PipelineSettings(lake=lake, app_id="app", default_format="debezium-json", table_format="iceberg")
    pipeline = Pipeline(spark, settings)
    for batch, (key, small) in enumerate([(1, None), (2, None), (3, 7)]):
        messages = messages_frame(spark, [_debezium_insert(key, small)]).withColumn("offset", F.lit(batch))
        result = pipeline.process_batch(messages, batch)
        assert result.dead_letters == 0

    path = f"{lake}/shop/items"
    assert dict(spark.read.format("iceberg").load(path).dtypes)["s"] == "int"
    assert _marks(spark, path) == ["0", "1", "2"]  # one MERGE per batch, nothing else
    assert sorted((r["id"], r["s"]) for r in lake_reader(spark, "iceberg")(path)) == [(1, None), (2, None), (3, 7)]


def test_tables_written_together_are_compacted_after_counts_of_their_own() -> None:
    # Tables that get a MERGE in every batch would all reach one fixed count in the same batch.
    paths = [f"/lake/crm/t{i}" for i in range(200)]
    counts = [IcebergSink.compact_after(path) for path in paths]
    every = IcebergSink.COMPACT_EVERY
    assert all(every * 3 // 4 <= count <= every * 5 // 4 for count in counts)
    assert len(set(counts)) >= 20
    assert abs(statistics.mean(counts) - every) < 2
    # The same in every run (counted on the table's snapshots, whoever wrote them).
    assert counts == [IcebergSink.compact_after(path) for path in paths]


def test_every_nth_merge_of_a_table_compacts_it(spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One change per batch: each MERGE adds a data file and maybe position deletes; every 3rd MERGE (50 by
    # default) rewrites the table's files with their deletes applied.
    monkeypatch.setattr(IcebergSink, "COMPACT_EVERY", 3)
    lake = str(tmp_path / "lake")
    settings = PipelineSettings(lake=lake, app_id="app", default_format="canal-json", table_format="iceberg")
    pipeline = Pipeline(spark, settings)
    changes = [
        _canal("INSERT", [{"id": "1", "v": "a"}]),
        _canal("INSERT", [{"id": "2", "v": "b"}]),
        _canal("UPDATE", [{"id": "1", "v": "c"}]),
        _canal("DELETE", [{"id": "2", "v": "b"}]),
        _canal("INSERT", [{"id": "3", "v": "d"}]),
        _canal("UPDATE", [{"id": "3", "v": "e"}]),
    ]
    for batch, change in enumerate(changes):
        pipeline.process_batch(messages_frame(spark, [change]).withColumn("offset", F.lit(batch)), batch)

    path = f"{lake}/crm/customer"
    snapshots = spark.read.format("iceberg").load(f"{path}#snapshots").orderBy("committed_at").collect()
    assert [s["operation"] for s in snapshots].count("replace") == 2  # after the 3rd and the 6th MERGE
    # The last compaction rewrote the 3 data files into one, applying the deletes, and removed the position delete
    # files that only pointed at files now gone (Iceberg keeps the newest one, as new as the rewritten file).
    last = snapshots[-1]["summary"]
    assert (snapshots[-1]["operation"], last["deleted-data-files"], last["total-data-files"]) == ("replace", "3", "1")
    assert int(last["removed-delete-files"]) >= 1
    assert sorted((r["id"], r["v"]) for r in lake_reader(spark, "iceberg")(path)) == [(1, "c"), (3, "e")]


def _operations(spark, path: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The operation of each of the table's snapshots, oldest first."""
    snapshots = spark.read.format("iceberg").load(f"{path}#snapshots").orderBy("committed_at")
    return [row["operation"] for row in snapshots.select("operation").collect()]


def test_the_commits_since_the_last_rewrite_add_up_across_runs_and_writers(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Scheduled runs (trigger available_now) each make fewer MERGEs of a table than the compaction waits for: the
    # count is the table's own, so they add up; and a rewrite by anyone (by hand here) starts it again. One change
    # per batch, 3 commits per rewrite (50 by default).
    monkeypatch.setattr(IcebergSink, "COMPACT_EVERY", 3)
    lake = str(tmp_path / "lake")
    path = f"{lake}/crm/customer"
    settings = PipelineSettings(lake=lake, app_id="app", default_format="canal-json", table_format="iceberg")

    def run(batches: range) -> None:
        pipeline = Pipeline(spark, settings)  # a new run: a new sink, which has seen none of the earlier MERGEs
        for batch in batches:
            change = _canal("UPDATE" if batch else "INSERT", [{"id": "1", "v": f"v{batch}"}])
            pipeline.process_batch(messages_frame(spark, [change]).withColumn("offset", F.lit(batch)), batch)

    run(range(2))
    run(range(2, 4))
    assert _operations(spark, path) == ["append", "overwrite", "overwrite", "replace", "overwrite"]

    spark.sql(
        f"CALL {IcebergSink(spark, lake).catalog}.system.rewrite_data_files(table => "
        "'crm.customer', options => map('min-input-files', '1'))"
    ).collect()
    run(range(4, 6))
    assert _operations(spark, path)[5:] == ["replace", "overwrite", "overwrite"]  # 2 since the rewrite by hand
    run(range(6, 7))
    assert _operations(spark, path)[5:] == ["replace", "overwrite", "overwrite", "overwrite", "replace"]
    assert [(r["id"], r["v"]) for r in lake_reader(spark, "iceberg")(path)] == [(1, "v6")]


def _sink_and_empty_table(spark, tmp_path: Path) -> tuple[IcebergSink, str, str]:  # type: ignore[no-untyped-def]
    """A sink at ``tmp_path/lake`` and an empty table ``shop.items (id BIGINT)`` of its catalog, created by hand (its
    commits are then the test's own): the sink, the table's path and its catalog name."""
    sink = IcebergSink(spark, str(tmp_path / "lake"))
    name = f"{sink.catalog}.shop.items"
    spark.sql(f"CREATE TABLE {name} (id BIGINT) USING iceberg")
    return sink, f"{sink.lake}/shop/items", name


def test_a_rewrite_with_nothing_to_do_is_not_tried_again_after_each_merge(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three commits that leave one data file and no deletes: rewrite_data_files finds nothing to rewrite and adds
    # no snapshot, so the table's count stays at 3. The sink counts from its own attempt instead.
    monkeypatch.setattr(IcebergSink, "COMPACT_EVERY", 3)
    sink, path, name = _sink_and_empty_table(spark, tmp_path)
    spark.sql(f"INSERT INTO {name} VALUES (1)")
    spark.sql(f"DELETE FROM {name}")  # removes the whole file: no delete file
    spark.sql(f"INSERT INTO {name} VALUES (2)")
    compactions = []
    compact = sink.compact
    monkeypatch.setattr(sink, "compact", lambda p: (compactions.append(p), compact(p)))

    sink.merged(path)
    assert compactions == [path]
    assert _operations(spark, path) == ["append", "delete", "append"]  # nothing was rewritten
    sink.merged(path)
    sink.merged(path)
    assert compactions == [path]
    spark.sql(f"INSERT INTO {name} VALUES (3)")
    spark.sql(f"INSERT INTO {name} VALUES (4)")
    spark.sql(f"INSERT INTO {name} VALUES (5)")
    sink.merged(path)  # 3 commits since the attempt: the 4 files are rewritten into one
    assert compactions == [path, path]
    assert _operations(spark, path)[-1] == "replace"
    assert sorted(r["id"] for r in spark.read.format("iceberg").load(path).collect()) == [2, 3, 4, 5]


def test_a_compaction_that_fails_is_logged_and_tried_again_after_the_next_merge(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The MERGE before it has committed: its batch must not fail (and run again) for the table's upkeep.
    monkeypatch.setattr(IcebergSink, "COMPACT_EVERY", 2)
    sink, path, name = _sink_and_empty_table(spark, tmp_path)
    spark.sql(f"INSERT INTO {name} VALUES (1)")
    spark.sql(f"INSERT INTO {name} VALUES (2)")
    rewrite = sink.compact

    def unavailable(table_path: str) -> None:
        raise Py4JError(f"the catalog of {table_path} is unavailable")

    monkeypatch.setattr(sink, "compact", unavailable)
    with caplog.at_level(logging.WARNING, logger="cdclake.sinks.iceberg"):
        sink.merged(path)
    assert f"compaction of {path} after its MERGE failed" in caplog.text
    assert "is unavailable" in caplog.text
    assert _operations(spark, path) == ["append", "append"]

    monkeypatch.setattr(sink, "compact", rewrite)
    sink.merged(path)  # the count still stands
    assert _operations(spark, path) == ["append", "append", "replace"]


def test_a_catalog_the_session_lacks_is_a_config_error(spark, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'iceberg_catalog'.*no catalog 'nowhere'.*Fix: configure it"):
        IcebergSink(spark, str(tmp_path), "nowhere")


def test_tables_go_to_a_catalog_of_the_session(spark, tmp_path: Path) -> None:
    # A catalog the user configured (a Hadoop one here, elsewhere than the lake; REST, Glue or Hive the same way):
    # the lake tables go there as <namespace>.<table>, their history tables beside them, and the bookkeeping stays at
    # the lake.
    warehouse = tmp_path / "warehouse"
    spark.conf.set("spark.sql.catalog.userlake", "org.apache.iceberg.spark.SparkCatalog")
    spark.conf.set("spark.sql.catalog.userlake.type", "hadoop")
    spark.conf.set("spark.sql.catalog.userlake.warehouse", str(warehouse))
    lake = str(tmp_path / "lake")
    settings = PipelineSettings(
        lake=lake,
        app_id="app",
        default_format="canal-json",
        table_format="iceberg",
        iceberg_catalog="userlake",
        changelog=True,
        scd2=True,
    )
    result = Pipeline(spark, settings).process_batch(
        messages_frame(spark, [_canal("INSERT", [{"id": "1", "v": "a"}, {"id": "2", "v": "b"}])]), 0
    )

    assert sorted((r["id"], r["v"]) for r in spark.table("userlake.crm.customer").collect()) == [(1, "a"), (2, "b")]
    assert (warehouse / "crm" / "customer" / "metadata").is_dir()
    changelog = spark.table("userlake.crm._changelog_customer").select("id", "_cdc_op", "_cdc_batch_id")
    assert sorted(changelog.collect()) == [(1, "INSERT", 0), (2, "INSERT", 0)]
    current = spark.table("userlake.crm._scd2_customer").where("_cdc_is_current AND NOT _cdc_is_deleted")
    assert sorted((r["id"], r["v"]) for r in current.collect()) == [(1, "a"), (2, "b")]
    assert not Path(lake, "crm").exists()
    assert Path(lake, "_cdclake", "progress", "_delta_log").is_dir()
    sink = IcebergSink(spark, lake, "userlake")
    assert [sink.row_count(path) for path in result.applied] == [2]


@pytest.mark.parametrize(
    ("current", "wanted", "promoted"),
    [
        ("int", "bigint", True),
        ("smallint", "bigint", True),  # stored as int
        ("float", "double", True),
        ("decimal(5,2)", "decimal(10,2)", True),
        ("decimal(5,2)", "decimal(12,4)", False),  # a scale change is no Iceberg promotion
        ("int", "decimal(20,0)", False),
        ("int", "double", False),
        ("bigint", "decimal(38,0)", False),
    ],
)
def test_only_iceberg_s_own_promotions_widen_in_place(current: str, wanted: str, promoted: bool) -> None:
    """Iceberg spec, "Schema Evolution": int -> long, float -> double, decimal(P,S) -> decimal(P',S) with P' > P. The
    other widenings rewrite the table (IcebergSink.widen_path_in_place)."""
    assert _promotes(current, wanted) is promoted
