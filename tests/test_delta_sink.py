"""How a batch's MERGEs use the session (DeltaSink.merging), read back from what Delta recorded in each table's log."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import pytest
from delta.tables import DeltaTable

from cdclake.devtools.verify import read_table
from cdclake.runner import replay
from cdclake.sinks import delta
from cdclake.sinks.delta import DeltaSink
from cdclake.spark import session_settings
from tests.test_ddl import ddl_message, row_message

pytestmark = pytest.mark.spark

TYPES = {"id": "bigint(20)", "v": "varchar(8)"}


CREATED_WITH_ROWS = "CREATE TABLE AS SELECT"
"""The operation of a new lake table's first commit: created with its first batch's rows."""


def _writes(table: Path) -> list[tuple[str, int, int]]:
    """(operation, rows inserted, files added) of the table's creating commit with rows and its MERGEs, oldest
    first."""
    out = []
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            info = json.loads(line).get("commitInfo")
            if info and info["operation"] == "MERGE":
                metrics = info["operationMetrics"]
                out.append(("MERGE", int(metrics["numTargetRowsInserted"]), int(metrics["numTargetFilesAdded"])))
            elif info and info["operation"] == CREATED_WITH_ROWS:
                metrics = info["operationMetrics"]
                out.append((CREATED_WITH_ROWS, int(metrics["numOutputRows"]), int(metrics["numFiles"])))
    return out


def _last_merge(table: Path) -> dict[str, Any]:
    commits = sorted((table / "_delta_log").glob("*.json"))
    for commit in reversed(commits):
        for line in commit.read_text(encoding="utf-8").splitlines():
            info = json.loads(line).get("commitInfo")
            if info and info["operation"] == "MERGE":
                return dict(info)
    raise AssertionError(f"no MERGE commit in {table}")


def _last_merge_metrics(table: Path) -> dict[str, str]:
    return dict(_last_merge(table)["operationMetrics"])


def _replay(spark, tmp_path: Path, tables: list[str]) -> Path:  # type: ignore[no-untyped-def]
    """Two batches: 40 rows into each of ``tables``, then 40 more."""
    lake = tmp_path / "lake"
    for batch in range(2):
        rows = [{"id": str(i), "v": f"v{i}"} for i in range(40 * batch, 40 * batch + 40)]
        capture = tmp_path / f"capture-{batch}.jsonl"
        capture.write_text("".join(row_message("INSERT", t, rows, TYPES) + "\n" for t in tables), encoding="utf-8")
        replay(spark, lake=str(lake), format_name="canal-json", paths=[str(capture)])
    return lake


REWRITE_MAX_BYTES: Final = DeltaSink.REWRITE_MAX_BYTES


@pytest.fixture(autouse=True)
def merges_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests read what Delta records of MERGEs: every table takes its changes by one, however small (not by a
    rewrite of its rows, DeltaSink.rewrites_whole, which tests/test_rewrite_whole.py covers)."""
    monkeypatch.setattr(DeltaSink, "REWRITE_MAX_BYTES", -1)


@pytest.fixture
def files_per_partition(spark):  # type: ignore[no-untyped-def]
    """Writes without Delta's optimized write, which cdclake's tables have (TABLE_PROPERTIES): one file per shuffle
    partition that holds rows, so the files a commit adds show the partitions it ran on."""
    with session_settings(spark, {"spark.databricks.delta.optimizeWrite.enabled": "false"}):
        yield


@pytest.mark.usefixtures("files_per_partition")
def test_merges_of_many_tables_share_the_shuffle_partitions(spark, tmp_path: Path) -> None:
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    assert int(partitions) >= 2, "the test session must have partitions to share"
    lake = _replay(spark, tmp_path, ["a", "b", "c"])
    for table in "abc":
        # 3 concurrent writes on 2 partitions: one partition, so one file, each; the first creates the table.
        assert _writes(lake / "crm" / table) == [(CREATED_WITH_ROWS, 40, 1), ("MERGE", 40, 1)]
    # The session is as it was.
    assert spark.conf.get("spark.sql.shuffle.partitions") == partitions
    assert spark.conf.get("spark.databricks.delta.merge.materializeSource", None) in (None, "auto")


@pytest.mark.usefixtures("files_per_partition")
def test_the_merge_of_a_single_table_keeps_every_partition(spark, tmp_path: Path) -> None:
    lake = _replay(spark, tmp_path, ["only"])
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 0)
    assert _writes(lake / "crm" / "only") == [(CREATED_WITH_ROWS, 40, partitions), ("MERGE", 40, partitions)]


@pytest.mark.usefixtures("first_compaction")
def test_writes_are_optimized_so_a_new_table_is_not_compacted_at_once(spark, tmp_path: Path) -> None:
    lake = _replay(spark, tmp_path, ["only"])
    # Optimized writes (one file for small rows), so auto compaction, which compacts each table on its first
    # file-adding commit in a process, finds nothing to compact after the creation: no OPTIMIZE.
    assert _writes(lake / "crm" / "only") == [(CREATED_WITH_ROWS, 40, 1), ("MERGE", 40, 1)]
    table = DeltaTable.forPath(spark, str(lake / "crm" / "only"))
    assert [row["operation"] for row in table.history().collect()] == ["MERGE", CREATED_WITH_ROWS]
    assert table.detail().first()["properties"]["delta.autoOptimize.optimizeWrite"] == "true"  # type: ignore[index]


@pytest.mark.usefixtures("first_compaction")
def test_small_files_of_many_batches_are_compacted(spark, tmp_path: Path) -> None:
    # One message per batch: each insert adds a file, so without compaction the table would end with at least 3 (4
    # inserts; the delete removes row 0, alone in its file). Compaction starts at 2 small files here (50 by default).
    messages = [row_message("INSERT", "t", [{"id": str(i), "v": f"v{i}"}], TYPES) for i in range(4)]
    messages.append(row_message("DELETE", "t", [{"id": "0", "v": "v0"}], TYPES))
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(m + "\n" for m in messages), encoding="utf-8")
    lake = tmp_path / "lake"
    with session_settings(spark, {"spark.databricks.delta.autoCompact.minNumFiles": "2"}):
        replay(spark, lake=str(lake), format_name="canal-json", paths=[str(capture)], batch_lines=1)
    table = DeltaTable.forPath(spark, str(lake / "crm" / "t"))
    operations = [row["operation"] for row in table.history().collect()]
    assert operations[-1] == CREATED_WITH_ROWS  # the first batch's
    assert operations.count("MERGE") == len(messages) - 1
    assert "OPTIMIZE" in operations
    assert len(table.toDF().inputFiles()) < 3
    assert sorted(read_table(str(lake / "crm" / "t")), key=lambda r: r["id"]) == [
        {"id": i, "v": f"v{i}"} for i in range(1, 4)
    ]
    # Every table cdclake creates carries the policy, bookkeeping tables too.
    for path in (lake / "crm" / "t", lake / "_cdclake" / "progress", lake / "_cdclake" / "tombstones"):
        properties = DeltaTable.forPath(spark, str(path)).detail().first()["properties"]  # type: ignore[index]
        assert properties.get("delta.autoOptimize.autoCompact") == "true", path


def test_a_rewrite_to_a_type_without_statistics_unlists_the_column(spark, tmp_path: Path) -> None:
    """A key-less table keeps statistics on every column; retyping one to binary (a TEXT/BLOB column created from
    a NULL, then given values) must take it out of delta.dataSkippingStatsColumns, which Delta checks on write."""
    from pyspark.sql import functions as F

    from cdclake.apply import TablePlan
    from cdclake.sinks.delta import DeltaSink

    sink = DeltaSink(spark, str(tmp_path / "lake"))
    plan = TablePlan("db.t", "db", None, "t", [("note", "string"), ("detail", "string")], [])
    sink.ensure_table(plan)
    before = DeltaTable.forPath(spark, sink.table_path("db", None, "t")).detail().collect()[0]["properties"]
    assert before["delta.dataSkippingStatsColumns"] == "`note`,`detail`,_cdc_position"
    retyped = [("note", F.col("note")), ("detail", F.col("detail").cast("binary"))]
    sink.rewrite("db", None, "t", retyped, None, key_columns=[])
    after = DeltaTable.forPath(spark, sink.table_path("db", None, "t")).detail().collect()[0]["properties"]
    assert after["delta.dataSkippingStatsColumns"] == "`note`,_cdc_position"
    assert sink.columns("db", None, "t") == [("note", "string"), ("detail", "binary")]


def test_a_widening_is_made_in_place_only_in_a_table_with_type_widening_and_where_delta_allows_it(
    spark, tmp_path: Path
) -> None:
    """DeltaSink.widen_in_place: nothing without ``delta.enableTypeWidening`` (the caller rewrites the table, which
    every Delta reader reads); with it, every column but one that a CHECK constraint reads, which Delta refuses to
    retype (DELTA_CONSTRAINT_DEPENDENT_COLUMN_CHANGE) and is left to the rewrite. Stored values read as before."""
    from cdclake.apply import TablePlan

    sink = DeltaSink(spark, str(tmp_path / "lake"))
    plan = TablePlan("db.t", "db", None, "t", [("id", "int"), ("qty", "int"), ("price", "decimal(5,2)")], ["id"])
    sink.ensure_table(plan)
    path = sink.table_path("db", None, "t")
    spark.sql(f"INSERT INTO delta.`{path}` (id, qty, price) VALUES (1, 7, 123.45)")
    wanted = {"id": "bigint", "qty": "bigint", "price": "decimal(12,4)"}
    assert sink.widen_in_place("db", None, "t", wanted) == {}
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
    spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT positive CHECK (id > 0)")
    assert sink.widen_in_place("db", None, "t", wanted) == {"qty": "bigint", "price": "decimal(12,4)"}
    assert sink.columns("db", None, "t") == [("id", "int"), ("qty", "bigint"), ("price", "decimal(12,4)")]
    assert [tuple(r) for r in spark.read.format("delta").load(path).select("id", "qty", "price").collect()] == [
        (1, 7, Decimal("123.4500"))
    ]


def test_a_batch_creates_its_tables_concurrently_and_plans_sharing_a_path_in_turn(spark, tmp_path: Path) -> None:
    """Pipeline._ensure_tables: many new tables at once, each with its columns (and no CHECK constraints); two plans
    whose source names map to the same lake path (database x, and schema x without a database) both end up in that
    one table. A new table only one plan lands in is left to its first write (created with its rows), unless the
    batch declares other types for its columns, which need the table to be reconciled."""
    from cdclake.apply import TablePlan
    from cdclake.pipeline import Pipeline, PipelineSettings

    pipeline = Pipeline(spark, PipelineSettings(lake=str(tmp_path / "lake"), app_id="ensure"))
    plans = [
        TablePlan(f"db.t{i}", "db", None, f"t{i}", [("id", "bigint"), (f"c{i}", "string")], ["id"]) for i in range(6)
    ]
    plans += [
        TablePlan("x..shared", "x", None, "shared", [("id", "bigint"), ("a", "string")], ["id"]),
        TablePlan(".x.shared", None, "x", "shared", [("id", "bigint"), ("b", "int")], ["id"]),
    ]
    retyped = TablePlan("db.r", "db", None, "r", [("id", "bigint"), ("n", "int")], ["id"])
    retyped.declared_types = {"n": {"int", "bigint"}}
    plans.append(retyped)
    columns, constraints = pipeline._ensure_tables(plans)

    assert constraints == {plan.table_id: {} for plan in plans}
    for plan, i in zip(plans, range(6), strict=False):
        assert columns[f"db.t{i}"] == [("id", "bigint"), (f"c{i}", "string")]
        assert pipeline.sink.awaits_creation(plan)
        assert pipeline.sink.columns("db", None, f"t{i}") is None
    assert columns["db.r"] == pipeline.sink.columns("db", None, "r") == [("id", "bigint"), ("n", "int")]
    assert not pipeline.sink.awaits_creation(retyped)
    # Turns go by table id: ".x.shared" creates the table, "x..shared" then adds its column.
    shared = [("id", "bigint"), ("b", "int"), ("a", "string")]
    assert columns[".x.shared"] == [("id", "bigint"), ("b", "int")]
    assert columns["x..shared"] == shared
    assert pipeline.sink.columns("x", None, "shared") == shared


def _ogg_insert(table: str, position: int, row: dict[str, object]) -> dict[str, object]:
    """A golden-style line (``tests.formats.golden.messages_frame``) of one OGG JSON insert."""
    return {
        "value": {
            "table": table,
            "op_type": "I",
            "op_ts": "2024-03-01 10:15:31.000000",
            "current_ts": "2024-03-01T10:15:33.126000",
            "pos": f"{position:020d}",
            "primary_keys": ["ID"],
            "after": row,
        }
    }


def _commits(table: Path) -> int:
    return len(list((table / "_delta_log").glob("*.json")))


def test_source_tables_sharing_a_lake_table_are_all_applied_once_per_batch(spark, tmp_path: Path) -> None:
    """Two schemas of one database (``CAT.S1.T`` and ``CAT.S2.T``) land in one lake table, ``<lake>/CAT/T``, and a
    batch holds changes of both. Their MERGEs (and history writes) go in turn, each with its own commit marker:
    concurrent, the two commits to one table conflict; in turn under the batch's one marker, Delta would skip the
    second as already committed. Re-running the batch commits nothing more, its progress rows included."""
    from cdclake.pipeline import Pipeline, PipelineSettings
    from tests.formats.golden import messages_frame

    schemas = list(enumerate(["S1", "S2", "S1", "S2", "S2"], start=1))
    lines = [_ogg_insert(f"CAT.{schema}.T", at, {"ID": at, "V": f"{schema}-{at}"}) for at, schema in schemas]
    expected = [(at, f"{schema}-{at}") for at, schema in schemas]  # ids ascend, as the sorted rows read back
    frame = messages_frame(spark, lines, topic="ogg")
    lake = tmp_path / "lake"
    settings = PipelineSettings(lake=str(lake), app_id="shared", default_format="ogg-json", changelog=True)
    table, changelog = lake / "CAT" / "T", lake / "_cdclake" / "changelog" / "CAT" / "T"

    first = Pipeline(spark, settings).process_batch(frame, 0)
    assert first.applied == {str(table): 5}
    assert sorted((r["ID"], r["V"]) for r in read_table(str(table))) == expected
    assert sorted((r["ID"], r["V"]) for r in read_table(str(changelog))) == expected

    progress = lake / "_cdclake" / "progress"
    commits = (_commits(table), _commits(changelog), _commits(progress))
    Pipeline(spark, settings).process_batch(frame, 0)  # a re-run after a crash, in a new process
    assert (_commits(table), _commits(changelog), _commits(progress)) == commits
    assert sorted((r["ID"], r["V"]) for r in read_table(str(table))) == expected
    assert len(read_table(str(changelog))) == 5


def test_turns_do_not_depend_on_the_order_the_batch_lists_its_tables() -> None:
    """A re-run of a batch must give each source table the commit marker it had: the turns go by table id."""
    import random

    from cdclake.sinks.delta import Txn, in_turns, turn_marker

    tables = [("a", "lake/a"), ("b", "lake/x"), ("c", "lake/x"), ("d", "lake/d"), ("e", "lake/x")]
    expected = [[("a", "lake/a"), ("b", "lake/x"), ("d", "lake/d")], [("c", "lake/x")], [("e", "lake/x")]]
    for seed in range(5):
        shuffled = random.Random(seed).sample(tables, len(tables))
        assert in_turns(shuffled, lambda t: t[1], lambda t: t[0]) == expected
    batch = Txn("app", 7)
    assert [turn_marker(batch, turn) for turn in range(3)] == [batch, Txn("app/turn1", 7), Txn("app/turn2", 7)]
    assert turn_marker(None, 1) is None


@pytest.mark.parametrize(
    ("spark_type", "values"),
    [
        ("bigint", [-(2**63), -5, 0, 7, 2**63 - 1]),
        ("tinyint", [-128, -1, 0, 3, 127]),
        ("string", ["", "a'b\\c", "ab", "b", "é\n€"]),
        ("date", ["0001-01-01", "1969-12-31", "2024-02-29", "2024-03-01", "9999-12-31"]),
        ("timestamp", ["-62135596800000000", "-1", "0", "1711846800123456", "253402300799999999"]),
        ("decimal(12,3)", ["-999999999.999", "-0.001", "0.000", "0.001", "999999999.999"]),
    ],
)
def test_key_ranges_keep_exactly_the_target_rows_a_source_key_can_match(spark, spark_type: str, values) -> None:  # type: ignore[no-untyped-def]
    """DeltaSink's target-only MERGE conditions (_key_ranges): the target rows within the range of the source's
    keys, bounds included, compared in the column's own type (extreme values, quotes, backslashes, non-ASCII,
    instants before 1970), and the NULL rows when a source key is NULL."""
    from pyspark.sql import functions as F

    from cdclake import model
    from cdclake.sinks.delta import _key_ranges
    from cdclake.spark import local_frame

    def typed(texts: list[str | None], name: str):  # type: ignore[no-untyped-def]
        frame = local_frame(spark, [(t,) for t in texts], "text string")
        return frame.select(model.typed_value(F.col("text"), spark_type).alias(name))

    texts = [str(v) for v in values]
    target = typed([*texts, None], "k").alias("t")
    # Each value as Spark prints it once typed, read in one job: what a kept target row reads as.
    rows = typed(texts, "k").select(F.col("k").cast("string")).collect()
    printed = dict(zip(texts, [row[0] for row in rows], strict=True))
    for source_texts, expected in (
        (texts[1:4], texts[1:4]),  # the bounds are kept
        ([texts[2]], [texts[2]]),
        ([texts[0], texts[4]], texts),  # the whole type's range
        ([texts[3], None], [texts[3], None]),  # a NULL key keeps the NULL rows
        ([None], [None]),
    ):
        source = typed(source_texts, "_c0")
        conditions = _key_ranges(source, [("k", 0, spark_type)])
        kept = target.where(conditions[0]) if conditions else target
        got = {row[0] for row in kept.select(F.col("k").cast("string")).collect()}
        want = {None if text is None else printed[text] for text in expected}
        assert got == want, (source_texts, got, want)


def test_a_merge_source_reads_an_image_by_position_only_when_it_lists_the_table_columns_in_order(spark) -> None:  # type: ignore[no-untyped-def]
    """The MERGE source's value and presence of each table column (delta._in_table_order, delta._image_columns):
    the same as a lookup by name for an image in the table's order (read by position), in another order, partial,
    with a column the table lacks, with a NULL value, empty and NULL. An image in another order read by position
    would swap its values."""
    from pyspark.sql import functions as F

    from cdclake.sinks.delta import _image_columns, _in_table_order

    names = ["id", "a", "b"]
    images: list[dict[str, str | None] | None] = [
        {"id": "1", "a": "x", "b": "y"},
        {"b": "y", "id": "2", "a": "x"},
        {"id": "3", "b": "y"},
        {"id": "4", "a": "x", "b": "y", "c": "z"},
        {"id": "5", "a": None, "b": "y"},
        {},
        None,
    ]

    def literal(image: dict[str, str | None] | None) -> str:
        if image is None:
            return "CAST(NULL AS MAP<STRING, STRING>)"
        pairs = ", ".join(f"'{k}', {'NULL' if v is None else repr(v)}" for k, v in image.items())
        return f"CAST(map({pairs}) AS MAP<STRING, STRING>)"

    selects = (f"SELECT {i} AS n, {literal(image)} AS image" for i, image in enumerate(images))
    frame = spark.sql(" UNION ALL ".join(selects)).withColumn("in_order", _in_table_order(F.col("image"), names))
    columns = _image_columns(F.col("image"), F.col("in_order"), names)
    read = frame.select("n", *(F.struct(value, present) for value, present in columns)).orderBy("n").collect()
    got = [[tuple(cell) for cell in row[1:]] for row in read]
    want = [
        [(None, None)] * len(names) if image is None else [(image.get(name), name in image) for name in names]
        for image in images
    ]
    assert got == want


@pytest.mark.parametrize(("keyed", "updated_inserted_deleted"), [(True, ("5", "10", "1")), (False, ("0", "15", "6"))])
def test_a_merge_of_new_and_recent_keys_does_not_read_the_files_of_older_keys(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keyed: bool, updated_inserted_deleted: tuple[str, str, str]
) -> None:
    """The key range reaches Delta's file skipping: once the files holding only older keys are removed from disk
    (reading one would fail), a batch that updates recent keys, inserts new ones and deletes one still applies. A
    key-less table is matched on its whole row: its columns are ranged (an update is a delete and an insert). The
    table is tiny: ranges are asked for whatever its size (KEY_RANGES_MIN_BYTES 0)."""
    monkeypatch.setattr(DeltaSink, "KEY_RANGES_MIN_BYTES", 0)

    def message(*args, **kwargs) -> str:  # type: ignore[no-untyped-def]
        decoded = json.loads(row_message(*args, **kwargs))
        return json.dumps({**decoded, "pkNames": decoded["pkNames"] if keyed else []})

    lake = tmp_path / "lake"
    first = tmp_path / "first.jsonl"
    first.write_text(
        "".join(
            message("INSERT", "t", [{"id": str(i), "v": f"v{i}"} for i in range(start, start + 25)], TYPES) + "\n"
            for start in range(0, 100, 25)
        ),
        encoding="utf-8",
    )
    replay(spark, lake=str(lake), format_name="canal-json", paths=[str(first)], batch_lines=1)
    table = lake / "crm" / "t"
    removed = 0
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            added = json.loads(line).get("add")
            if added and json.loads(added["stats"])["maxValues"]["id"] < 75:
                (table / added["path"]).unlink()
                removed += 1
    assert removed >= 3, "each of the first three batches wrote its own files"

    second = tmp_path / "second.jsonl"
    recent = [{"id": str(i), "v": f"v{i}"} for i in range(80, 85)]
    second.write_text(
        message("UPDATE", "t", [{**row, "v": "new"} for row in recent], TYPES, old=recent)
        + "\n"
        + message("INSERT", "t", [{"id": str(i), "v": f"v{i}"} for i in range(100, 110)], TYPES)
        + "\n"
        + message("DELETE", "t", [{"id": "90", "v": "v90"}], TYPES)
        + "\n",
        encoding="utf-8",
    )
    # Offsets order by file, then line (cdclake.sources.files): as the second file, these are newer than the first.
    placeholder = tmp_path / "placeholder.jsonl"
    placeholder.write_text("", encoding="utf-8")
    replay(spark, lake=str(lake), format_name="canal-json", paths=[str(placeholder), str(second)])
    metrics = _last_merge_metrics(table)
    assert (
        metrics["numTargetRowsUpdated"],
        metrics["numTargetRowsInserted"],
        metrics["numTargetRowsDeleted"],
    ) == updated_inserted_deleted


def test_a_merge_gets_key_ranges_when_the_table_holds_key_ranges_min_bytes(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Key ranges cost a compilation per MERGE and save reading the files outside them, which a small table hardly
    has: a MERGE gets them when the table's files hold at least KEY_RANGES_MIN_BYTES, as Delta counts them (DESCRIBE
    DETAIL's sizeInBytes). Seen in the condition Delta records for the MERGE."""
    lake = tmp_path / "lake"
    table = lake / "crm" / "t"

    def merge_of(start: int) -> str:
        capture = tmp_path / f"batch{start}.jsonl"
        rows = [{"id": str(i), "v": f"v{i}"} for i in range(start, start + 10)]
        capture.write_text(row_message("INSERT", "t", rows, TYPES) + "\n", encoding="utf-8")
        replay(spark, lake=str(lake), format_name="canal-json", paths=[str(capture)])
        return str(_last_merge(table)["operationParameters"]["predicate"])

    with pytest.raises(AssertionError, match="no MERGE"):
        merge_of(0)  # the first batch creates the table with its rows
    first = merge_of(10)
    assert re.search(r"\bid#\d+L <=> _c0#\d+L", first), first
    assert ">=" not in first, "a tiny table: no range"
    size = int(DeltaTable.forPath(spark, str(table)).detail().first()["sizeInBytes"])
    monkeypatch.setattr(DeltaSink, "KEY_RANGES_MIN_BYTES", size + 1)
    assert ">=" not in merge_of(20)
    size = int(DeltaTable.forPath(spark, str(table)).detail().first()["sizeInBytes"])
    monkeypatch.setattr(DeltaSink, "KEY_RANGES_MIN_BYTES", size)
    ranged = merge_of(30)
    assert re.search(r"\bid#\d+L >= 30\b", ranged), ranged
    assert re.search(r"\bid#\d+L <= 39\b", ranged), ranged
    assert sorted(int(row["id"]) for row in read_table(str(table))) == list(range(40))


def test_a_tables_size_is_read_on_its_first_merge_and_again_once_every_check(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """key_ranges_pay reads a table's size once, then keeps it until one in DELETION_VECTORS_CHECK_EVERY MERGEs
    (the same staggered count as auto's look at deletion vectors), whatever the deletion-vector mode."""
    path = str(tmp_path / "t")
    spark.range(10).write.format("delta").save(path)
    reads: list[str] = []
    real = delta._table_bytes

    def counted(frame):  # type: ignore[no-untyped-def]
        reads.append("read")
        return real(frame)

    monkeypatch.setattr(delta, "_table_bytes", counted)
    sink = DeltaSink(spark, str(tmp_path), "never")
    assert not sink.key_ranges_pay(path)
    assert not sink.key_ranges_pay(path)
    assert len(reads) == 1
    every = DeltaSink.DELETION_VECTORS_CHECK_EVERY
    for check in range(1, 4):
        for _ in range(every):
            sink.merged(path)
            sink.key_ranges_pay(path)
        assert len(reads) == 1 + check, "one more read per DELETION_VECTORS_CHECK_EVERY MERGEs"
    assert delta._table_bytes is counted
    assert (
        real(DeltaTable.forPath(spark, path).toDF()) == DeltaTable.forPath(spark, path).detail().first()["sizeInBytes"]
    )


def _wait_for(started: Path, released: Path) -> bool:
    """Runs in a Python worker while an operation reads its table (after it took its snapshot, before it commits):
    says so, then waits for the other writer's commit. Only the first call waits, so that the other writer's own
    Spark tasks find a free slot while the operation's other tasks go on."""
    import time

    try:
        started.open("x").close()
    except FileExistsError:
        return True
    deadline = time.monotonic() + 120
    while not released.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


class _Compaction:
    """Another writer: a compaction of a lake table (Delta's OPTIMIZE, Iceberg's rewrite_data_files, as a scheduled
    one would run) that commits while one of cdclake's operations on the table is held between reading the table
    and committing (by :meth:`hold`, a Python UDF in what the operation reads, which waits for the compaction)."""

    UDF_NAME = "cdclake_test_wait_for_the_compaction"

    def __init__(self, spark, sink, table: str, table_format: str, directory: Path) -> None:  # type: ignore[no-untyped-def]
        import threading

        from pyspark.sql import functions as F
        from pyspark.sql.types import BooleanType

        self.spark, self.sink, self.table, self.table_format = spark, sink, table, table_format
        self.started, self.released = directory / "operation-started", directory / "compacted"
        started, released = self.started, self.released  # the UDF's closure: paths only, no session
        # A lambda: PySpark reads a function's type hints as a pandas UDF's, and warns.
        self._udf = F.udf(lambda _: _wait_for(started, released), BooleanType())  # noqa: TID251
        spark.udf.register(self.UDF_NAME, self._udf)
        self._thread = threading.Thread(target=self._compact)
        self._thread.start()

    def _compact(self) -> None:
        import time

        deadline = time.monotonic() + 120
        while not self.started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.table_format == "iceberg":
            self.sink.compact(self.table)
        else:
            self.spark.sql(f"OPTIMIZE delta.`{self.table}`")
        self.released.touch()

    def hold(self, column: str | None = None):  # type: ignore[no-untyped-def]
        """A condition that is always true and waits for the compaction's commit (over ``column`` of the rows read,
        where Spark needs the UDF bound to a column, as in Delta's DELETE)."""
        from pyspark.sql import functions as F

        return self._udf(F.lit(1) if column is None else F.col(column))

    def join(self) -> None:
        self._thread.join()

    def operations(self) -> list[str]:
        """The table's commits in order (Iceberg: snapshot operations, a compaction is ``replace``)."""
        if self.table_format == "iceberg":
            snapshots = self.spark.table(f"{self.sink._identifier_of(self.table)}.snapshots").orderBy("committed_at")
            return [row["operation"] for row in snapshots.collect()]
        history = DeltaTable.forPath(self.spark, self.table).history().orderBy("version").collect()
        return [row["operation"] for row in history]


def _lake_of_twenty_rows(spark, tmp_path: Path, table_format: str):  # type: ignore[no-untyped-def]
    """A lake table crm.t of rows id 0-19 (v = v<id>) in four files; returns (lake, sink, table path)."""
    from cdclake.sinks import lake_sink

    lake = tmp_path / "lake"
    first = tmp_path / "first.jsonl"
    first.write_text(
        "".join(
            row_message("INSERT", "t", [{"id": str(i), "v": f"v{i}"} for i in range(start, start + 5)], TYPES) + "\n"
            for start in range(0, 20, 5)
        ),
        encoding="utf-8",
    )
    replay(
        spark, lake=str(lake), format_name="canal-json", paths=[str(first)], batch_lines=2, table_format=table_format
    )
    sink = lake_sink(spark, str(lake), table_format)  # type: ignore[arg-type]
    return lake, sink, sink.table_path("crm", None, "t")


@pytest.mark.parametrize("table_format", ["delta", "delta-rewrite", "iceberg"])
def test_a_merge_that_meets_a_concurrent_commit_runs_again(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table_format: str
) -> None:
    """Another writer commits to a lake table while a batch's MERGE into it runs: the table format refuses the
    MERGE's commit, and the MERGE runs again on the table as the other writer left it, instead of failing the batch
    and stopping the stream. ``delta-rewrite``: the same for a rewrite of a small table's rows in its place
    (DeltaSink.rewrites_whole)."""
    from dataclasses import replace as replaced

    from cdclake.sinks.iceberg import IcebergSink

    rewrite = table_format == "delta-rewrite"
    if rewrite:
        table_format = "delta"
    lake, sink, table = _lake_of_twenty_rows(spark, tmp_path, table_format)  # by MERGEs: files to compact
    if rewrite:
        monkeypatch.setattr(DeltaSink, "REWRITE_MAX_BYTES", REWRITE_MAX_BYTES)
    compaction = _Compaction(spark, sink, table, table_format, tmp_path)
    owner = IcebergSink if table_format == "iceberg" else DeltaSink
    executed = "_rewrite_whole" if rewrite else "_execute_merge"
    original = getattr(owner, executed)
    calls: list[str] = []

    def attempt(self, path, statement, *rest):  # type: ignore[no-untyped-def]
        calls.append(path)
        if len(calls) == 1:  # the first attempt only
            statement = replaced(statement, source=statement.source.where(compaction.hold()))
        return original(self, path, statement, *rest)

    monkeypatch.setattr(owner, executed, attempt)
    second = tmp_path / "second.jsonl"
    second.write_text(
        row_message("UPDATE", "t", [{"id": "3", "v": "new"}], TYPES, old=[{"id": "3", "v": "v3"}]) + "\n", "utf-8"
    )
    replay(spark, lake=str(lake), format_name="canal-json", paths=[str(second)], table_format=table_format)
    compaction.join()

    assert calls == [table, table]  # the MERGE ran twice: the first attempt met the compaction's commit
    operations = compaction.operations()
    if table_format == "iceberg":
        assert operations[-2] == "replace"  # the compaction, then the MERGE
        assert operations[-1] != "replace"
    else:
        assert operations[-2:] == ["OPTIMIZE", "WRITE" if rewrite else "MERGE"]
    expected = {i: f"v{i}" for i in range(20)} | {3: "new"}
    assert {row["id"]: row["v"] for row in sink.read_path(table).collect()} == expected


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_truncate_that_meets_a_concurrent_commit_runs_again(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table_format: str
) -> None:
    """The same for a source TRUNCATE, which deletes the table's older rows in one commit: after the compaction's
    commit refused it, it runs again, and the rows written before the TRUNCATE are gone, the ones after it stay."""
    from cdclake.sinks import lake_sink
    from cdclake.sinks.iceberg import IcebergSink

    lake = tmp_path / "lake"
    sink = lake_sink(spark, str(lake), table_format)  # type: ignore[arg-type]
    table = sink.table_path("crm", None, "t")
    compaction = _Compaction(spark, sink, table, table_format, tmp_path)
    calls: list[str] = []
    if table_format == "iceberg":
        original_sql = IcebergSink._execute_delete

        def attempt_sql(self, path, condition):  # type: ignore[no-untyped-def]
            calls.append(path)
            if len(calls) == 1:
                condition = f"{condition} AND {_Compaction.UDF_NAME}(id)"
            original_sql(self, path, condition)

        monkeypatch.setattr(IcebergSink, "_execute_delete", attempt_sql)
    else:
        original = DeltaSink._delete_where

        def attempt(self, path, condition):  # type: ignore[no-untyped-def]
            calls.append(path)
            if len(calls) == 1:
                condition = condition & compaction.hold("id")
            original(self, path, condition)

        monkeypatch.setattr(DeltaSink, "_delete_where", attempt)
    # One replay, three batches: rows 0-19 in the first two (a file each), then the TRUNCATE (whose fallback position,
    # its line, comes after theirs) and a row after it.
    capture = tmp_path / "capture.jsonl"
    capture.write_text(
        "".join(
            row_message("INSERT", "t", [{"id": str(i), "v": f"v{i}"} for i in range(start, start + 5)], TYPES) + "\n"
            for start in range(0, 20, 5)
        )
        + ddl_message("t", "TRUNCATE TABLE t", kind="TRUNCATE")
        + "\n"
        + row_message("INSERT", "t", [{"id": "100", "v": "after"}], TYPES)
        + "\n",
        "utf-8",
    )
    replay(
        spark, lake=str(lake), format_name="canal-json", paths=[str(capture)], batch_lines=2, table_format=table_format
    )
    compaction.join()

    assert calls == [table, table]  # the DELETE ran twice: the first attempt met the compaction's commit
    operations = compaction.operations()
    assert ("replace" if table_format == "iceberg" else "OPTIMIZE") in operations[-3:]
    assert {row["id"]: row["v"] for row in sink.read_path(table).collect()} == {100: "after"}


def _log_actions(table: Path, version: int) -> dict[str, Any]:
    """The actions of one commit of a Delta table, by kind (the last of each kind)."""
    commit = table / "_delta_log" / f"{version:020d}.json"
    return {
        kind: body
        for line in commit.read_text(encoding="utf-8").splitlines()
        for kind, body in json.loads(line).items()
    }


NEW_TABLES_ROWS: Final = {"t": [(0, "v0"), (1, "v1"), (2, "new"), (4, "v4")], "gone": []}
"""The (id, v) rows of the tables ``crm.t`` and ``crm.gone`` after :func:`new_tables_batch`."""


def new_tables_batch(spark):  # type: ignore[no-untyped-def]
    """A Canal JSON batch for two new tables: ``crm.t`` gets rows inserted, updated and deleted, ``crm.gone`` a row
    inserted and deleted (none left)."""
    from tests.formats.golden import messages_frame

    lines = [
        row_message("INSERT", "t", [{"id": str(i), "v": f"v{i}"} for i in range(5)], TYPES),
        row_message("UPDATE", "t", [{"id": "2", "v": "new"}], TYPES, old=[{"id": "2", "v": "v2"}]),
        row_message("DELETE", "t", [{"id": "3", "v": "v3"}], TYPES),
        row_message("INSERT", "gone", [{"id": "9", "v": "v9"}], TYPES),
        row_message("DELETE", "gone", [{"id": "9", "v": "v9"}], TYPES),
    ]
    return messages_frame(spark, [{"value": json.loads(line)} for line in lines], topic="canal")


def test_a_new_table_is_created_with_its_first_batchs_rows_in_one_commit(spark, tmp_path: Path) -> None:
    """A batch that finds its tables missing creates each with the rows the batch leaves (one commit, the batch's
    marker, cdclake's table properties), as a creation and a MERGE into the empty table would have left them: a
    key inserted and deleted is not there, an updated one has its last image. A table none of whose rows remain is
    created empty. Re-running the batch (a crash before its progress was stored) commits nothing more."""
    from cdclake.pipeline import Pipeline, PipelineSettings

    lake = tmp_path / "lake"
    settings = PipelineSettings(lake=str(lake), app_id="first", default_format="canal-json")

    frame = new_tables_batch(spark)
    Pipeline(spark, settings).process_batch(frame, 0)
    commits = {}
    for name, rows in NEW_TABLES_ROWS.items():
        table = lake / "crm" / name
        assert sorted((r["id"], r["v"]) for r in read_table(str(table))) == rows
        created = _log_actions(table, 0)
        assert created["commitInfo"]["operation"] == CREATED_WITH_ROWS
        assert (created["txn"]["appId"], created["txn"]["version"]) == ("first", 0)
        properties = created["metaData"]["configuration"]
        assert properties["cdclake.source"] == f"crm.{name}"
        assert properties["cdclake.keyColumns"] == "id"
        assert properties["delta.dataSkippingStatsColumns"] == "`id`,_cdc_position"
        assert properties["delta.autoOptimize.autoCompact"] == "true"
        assert all(field["nullable"] for field in json.loads(created["metaData"]["schemaString"])["fields"])
        commits[name] = _commits(table)

    Pipeline(spark, settings).process_batch(frame, 0)  # a re-run after a crash, in a new process
    for name, rows in NEW_TABLES_ROWS.items():
        assert _commits(lake / "crm" / name) == commits[name]
        assert sorted((r["id"], r["v"]) for r in read_table(str(lake / "crm" / name))) == rows


def test_a_table_another_writer_creates_first_gets_its_rows_by_a_merge(spark, tmp_path: Path) -> None:
    """Two writers that both find a table missing: the one that creates it second finds it there, MERGEs instead,
    and so keeps the first writer's newer row (the position guard) and adds its own other rows."""
    from pyspark.sql import functions as F

    from cdclake import apply, model
    from cdclake.apply import TablePlan

    def changes(rows: list[tuple[int, str, str]]):  # type: ignore[no-untyped-def]
        return spark.createDataFrame(rows, "id long, v string, position string").select(
            F.lit(apply.UPSERT).alias(apply.KIND),
            F.create_map(F.lit("id"), F.col("id").cast("string"), F.lit("v"), F.col("v")).alias(apply.IMAGE),
            F.lit(False).alias(apply.PARTIAL),
            F.col("position").alias(apply.ORDER),
            F.current_timestamp().alias(model.EVENT_TIME),
        )

    lake = str(tmp_path / "lake")
    plan = TablePlan("db.t", "db", None, "t", [("id", "bigint"), ("v", "string")], ["id"])
    late, early = DeltaSink(spark, lake), DeltaSink(spark, lake)
    columns = late.ensure_table(plan, defer_creation=True)
    assert late.awaits_creation(plan)
    early.merge(plan, early.ensure_table(plan, defer_creation=True), changes([(1, "newer", "0002")]))

    late.merge(plan, columns, changes([(1, "older", "0001"), (2, "two", "0001")]))
    assert not late.awaits_creation(plan)
    path = late.table_path("db", None, "t")
    assert sorted((r["id"], r["v"]) for r in read_table(path)) == [(1, "newer"), (2, "two")]
    operations = [row["operation"] for row in DeltaTable.forPath(spark, path).history().orderBy("version").collect()]
    assert [op for op in operations if op != "OPTIMIZE"] == [CREATED_WITH_ROWS, "MERGE"]


def _after_a_killed_creation(spark, tmp_path: Path):  # type: ignore[no-untyped-def]
    """(the path of lake table crm.t, holding only a killed creation's data files; a batch of two inserts into it;
    the settings of the pipeline that applies it as batch 4)."""
    from cdclake.pipeline import PipelineSettings
    from tests.formats.golden import messages_frame

    lake = tmp_path / "lake"
    table = lake / "crm" / "t"
    spark.range(3).selectExpr("id", "'killed' AS v").write.parquet(str(table))  # files of the killed write
    lines = [row_message("INSERT", "t", [{"id": str(i), "v": f"v{i}"} for i in range(2)], TYPES)]
    frame = messages_frame(spark, [{"value": json.loads(line)} for line in lines], topic="canal")
    settings = PipelineSettings(lake=str(lake), app_id="again", default_format="canal-json")
    return table, frame, settings


def test_files_a_killed_creation_left_do_not_stop_the_next_one(spark, tmp_path: Path) -> None:
    """A creation with rows killed before its commit leaves data files and no Delta table, and Spark's catalog then
    refuses to create a table there. The next run creates it beside them, with cdclake's properties and the batch's
    marker; the files no commit lists are not read."""
    from cdclake.pipeline import Pipeline

    table, frame, settings = _after_a_killed_creation(spark, tmp_path)

    Pipeline(spark, settings).process_batch(frame, 4)
    assert sorted((r["id"], r["v"]) for r in read_table(str(table))) == [(0, "v0"), (1, "v1")]
    assert sorted(tuple(r) for r in spark.read.format("delta").load(str(table)).select("id", "v").collect()) == [
        (0, "v0"),
        (1, "v1"),
    ]
    created = _log_actions(table, 0)
    assert (created["txn"]["appId"], created["txn"]["version"]) == ("again", 4)
    detail = DeltaTable.forPath(spark, str(table)).detail().first()
    assert detail is not None
    properties = detail["properties"]
    assert (properties["cdclake.keyColumns"], properties["cdclake.source"]) == ("id", "crm.t")
    assert properties["delta.dataSkippingStatsColumns"] == "`id`,_cdc_position"


def test_a_table_created_beside_leftovers_gets_its_partitioning(spark, tmp_path: Path) -> None:
    """The creation beside a killed creation's files goes through Delta's path writer, not DataFrameWriterV2: it
    partitions the table as ``partition_by`` says all the same."""
    from dataclasses import replace

    from cdclake.pipeline import Pipeline

    table, frame, settings = _after_a_killed_creation(spark, tmp_path)
    Pipeline(spark, replace(settings, partition_by={"crm.t": ["v"]})).process_batch(frame, 4)
    assert sorted((r["id"], r["v"]) for r in read_table(str(table))) == [(0, "v0"), (1, "v1")]
    detail = DeltaTable.forPath(spark, str(table)).detail().first()
    assert detail is not None
    assert list(detail["partitionColumns"]) == ["v"]
    assert sorted(p.name for p in table.glob("v=*")) == ["v=v0", "v=v1"]


class _KilledBeforeThePropertiesError(Exception):
    """Stands for the process being killed between the two commits of DeltaSink._create_beside_leftovers."""


def test_a_table_created_beside_leftovers_and_killed_again_gets_its_properties_on_the_next_run(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The creation beside a killed creation's files is two commits (the rows with Delta's properties, then
    cdclake's). Killed between them, the table holds its rows but not the key columns it was created with; the next
    run, which finds the batch applied, gives them back before anything reads them (a later rename needs them)."""
    from cdclake.pipeline import Pipeline

    table, frame, settings = _after_a_killed_creation(spark, tmp_path)

    def killed_after_the_rows(self, path, rows, properties, marker, partitioning):  # type: ignore[no-untyped-def]
        # The first of _create_beside_leftovers' two commits, as it makes it.
        delta_properties = {k: v for k, v in properties.items() if k.startswith("delta.")}
        rows.write.format("delta").mode("errorifexists").options(**delta_properties, **marker).save(path)
        raise _KilledBeforeThePropertiesError(path)

    with monkeypatch.context() as patched:
        patched.setattr(DeltaSink, "_create_beside_leftovers", killed_after_the_rows)
        with pytest.raises(_KilledBeforeThePropertiesError):
            Pipeline(spark, settings).process_batch(frame, 4)
    properties = DeltaTable.forPath(spark, str(table)).detail().first()["properties"]  # type: ignore[index]
    assert "cdclake.keyColumns" not in properties
    assert properties["delta.autoOptimize.optimizeWrite"] == "true"

    again = Pipeline(spark, settings)
    again.process_batch(frame, 4)
    properties = DeltaTable.forPath(spark, str(table)).detail().first()["properties"]  # type: ignore[index]
    assert (properties["cdclake.keyColumns"], properties["cdclake.source"]) == ("id", "crm.t")
    assert again.sink.key_columns("crm", None, "t") == ["id"]
    assert sorted((r["id"], r["v"]) for r in read_table(str(table))) == [(0, "v0"), (1, "v1")]
