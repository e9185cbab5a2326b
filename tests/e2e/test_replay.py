"""`cdclake replay`: captured DataWorks streams -> Delta tables equal to the source truth."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cdclake import pipeline
from cdclake.cli import main as cli_main
from cdclake.cli.main import app
from cdclake.devtools.verify import read_table
from cdclake.runner import replay
from cdclake.sinks.delta import DeltaSink
from cdclake.status import lake_status
from cdclake.workload import to_b64_lines, to_jsonl
from tests.e2e.helpers import assert_lake_equals_truth, workload, write_lines

pytestmark = pytest.mark.spark


def test_replay_equals_truth_and_dead_letters_the_malformed(spark, lake, tmp_path: Path) -> None:
    history, messages = workload(seed=11)
    results = replay(
        spark, lake=lake, format_name="dataworks-json", paths=[str(write_lines(tmp_path / "dw.jsonl", messages))]
    )
    assert_lake_equals_truth(lake, history)

    malformed = [i for i, m in enumerate(m for m in messages if m.value is not None) if m.is_malformed]
    assert sum(r.dead_letters for r in results) == len(malformed) == 3
    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").orderBy("offset").collect()
    assert [row["offset"] for row in dead] == malformed
    values = [m.value for m in messages if m.value is not None]
    for row in dead:
        assert bytes(row["value"]) == values[row["offset"]]  # raw bytes kept exactly
        assert row["reason"]
        assert row["topic"].endswith("dw.jsonl")

    status = {row[1]: row for row in lake_status(spark, lake) if row[0] == "table"}
    assert set(status) == {"crm.customer", "shop.orders", "crm.audit_log"}
    assert all(row[3].isdigit() or "/" in row[3] for row in status.values())  # last position recorded


def test_small_batches_and_split_updates_across_batch_boundaries(spark, lake, tmp_path: Path) -> None:
    history, messages = workload(seed=15, events=90, update_mode="split")
    lines = [m for m in messages if m.value is not None]
    straddling = [
        i for i in range(44, len(lines) - 1, 45) if lines[i].description.startswith("UPDATE_BEFOR")
    ]  # the last line of a batch is the first half of an update
    assert straddling, "no split update crosses a batch boundary: pick another seed"
    path = write_lines(tmp_path / "dw.jsonl", messages)
    results = replay(spark, lake=lake, format_name="dataworks-json", paths=[str(path)], batch_lines=45)
    assert len(results) >= 4
    assert_lake_equals_truth(lake, history)


def test_resent_older_messages_never_regress_rows(spark, lake, tmp_path: Path) -> None:
    history, messages = workload(seed=13, failover_resends=0, malformed=0)
    first = write_lines(tmp_path / "all.jsonl", messages)
    replay(spark, lake=lake, format_name="dataworks-json", paths=[str(first)])
    before = {t: read_table(f"{lake}/{t}") for t in ("crm/customer", "shop/orders")}
    # DataWorks re-sends after failover: an old window arrives again, long after newer changes were applied.
    old_window = write_lines(tmp_path / "resend.jsonl", messages[: len(messages) // 2])
    replay(spark, lake=lake, format_name="dataworks-json", paths=[str(old_window)])
    assert_lake_equals_truth(lake, history)
    for table, rows in before.items():
        assert sorted(map(repr, read_table(f"{lake}/{table}"))) == sorted(map(repr, rows))


def test_base64_input_encoding(spark, lake, tmp_path: Path) -> None:
    """Base64 lines (binary messages) apply as the JSON lines would; a line that is not base64 is a dead letter."""
    history, messages = workload(seed=14, events=80, malformed=0)
    path = tmp_path / "dw.b64"
    path.write_text(to_b64_lines(messages) + "!!not base64!!\n", encoding="ascii")
    results = replay(spark, lake=lake, format_name="dataworks-json", paths=[str(path)], encoding="b64")
    assert_lake_equals_truth(lake, history)
    assert sum(r.dead_letters for r in results) == 1


def test_files_are_applied_in_the_order_given(spark, lake, tmp_path: Path) -> None:
    history, messages = workload(seed=15, events=120, malformed=0, failover_resends=0)
    half = len(messages) // 2
    first = write_lines(tmp_path / "b-first.jsonl", messages[:half])
    second = write_lines(tmp_path / "a-second.jsonl", messages[half:])
    replay(spark, lake=lake, format_name="dataworks-json", paths=[str(first), str(second)])
    assert_lake_equals_truth(lake, history)


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    batch_lines=st.integers(70, 400),
    update_mode=st.sampled_from(["split", "merged", "mixed"]),
)
def test_property_random_histories_and_batch_splits_equal_truth(
    spark, tmp_path_factory, seed, batch_lines, update_mode
):
    lake = str(tmp_path_factory.mktemp("lake"))
    history, messages = workload(seed=seed, events=100, update_mode=update_mode)
    path = write_lines(Path(lake) / "in.jsonl", messages)
    replay(spark, lake=f"{lake}/out", format_name="dataworks-json", paths=[str(path)], batch_lines=batch_lines)
    assert_lake_equals_truth(f"{lake}/out", history)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cdclake = str(Path(sys.executable).with_name("cdclake"))
    return subprocess.run([cdclake, *args], capture_output=True, text=True, timeout=600, check=False)


def test_cli_replay_prints_counts_and_exits_zero(spark, lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process, with the test session (the one `cdclake replay` takes when one is active): a new process
    costs a Spark start, and the bad-argument cases below already run the installed `cdclake` command.

    The capture has blank lines; the dead letters are listed with the file's own line numbers, by `replay` itself
    and by `dlq list --topic` naming the file as the user wrote it. The lake is given as a relative path: Delta reads
    ``delta.`lake/t``` as a path only when it is absolute, and `replay` and `maintain` failed on one."""
    history, messages = workload(seed=16, events=60)
    text = to_jsonl(messages).splitlines()
    lines = [*text[:5], "", "   ", *text[5:40], "", *text[40:]]  # blank lines are skipped, and still counted
    path = tmp_path / "dw.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.delenv("COLUMNS", raising=False)  # one table row per output line (cli.main._console)
    monkeypatch.setattr(cli_main, "out", cli_main._console())
    history_flags = ["--changelog", "crm.customer", "--scd2", "crm.customer"]
    monkeypatch.chdir(tmp_path)
    assert Path(lake) == tmp_path / "lake"
    args = ["replay", "--format", "auto", "--lake", "lake", *history_flags, "--deletion-vectors", "always", "dw.jsonl"]
    # A dry run first: it finds what the replay will dead-letter, at the same lines, and writes nothing.
    dry = CliRunner().invoke(app, [*args, "--dry-run"])
    assert dry.exit_code == 1, dry.output
    assert f"dry run, nothing written: {len(text)} messages decoded from 1 files" in dry.stdout
    assert "crm/customer (new)" in dry.stdout
    dry_lines = sorted(int(n) for n in re.findall(r"│ line (\d+)", dry.stdout))
    assert f"{len(dry_lines)} of {len(text)} messages do not decode" in dry.stdout
    assert not Path(lake).exists() or not any(Path(lake).iterdir())
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    assert "detected dataworks-json" in done.stderr
    assert "crm/customer" in done.stdout
    assert "3 dead letters" in done.stdout
    # Each dead letter's line of the file holds its raw value; replay and `dlq list` name that line.
    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").collect()
    at_line = {row["offset"] + 1: bytes(row["value"]).decode() for row in dead}
    assert len(at_line) == 3
    assert at_line == {number: lines[number - 1] for number in at_line}
    printed = [line.split("│") for line in done.stdout.splitlines() if str(path) in line]
    assert sorted(int(cells[2]) for cells in printed) == sorted(at_line) == dry_lines
    # status: the file, read up to its last line (a dead letter's line counts too)
    streams = [(row[1], row[3]) for row in lake_status(spark, lake) if row[0] == "stream"]
    assert streams == [(str(path), f"line {len(lines)}")]
    listed = CliRunner().invoke(app, ["dlq", "list", "--lake", "./lake", "--topic", "dw.jsonl"])
    assert listed.exit_code == 0, listed.output
    assert sorted(int(n) for n in re.findall(r"│ line (\d+)", listed.stdout)) == sorted(at_line)
    maintained = CliRunner().invoke(app, ["maintain", "--lake", "lake"])
    assert maintained.exit_code == 0, maintained.output
    # The lake tables use deletion vectors; the truth is read back through delta-rs, which applies them.
    assert "deletionVectors" in (DeltaTable(str(Path(lake, "crm", "customer"))).protocol().reader_features or [])
    assert_lake_equals_truth(lake, history)
    # history tables for the table named only (`all` selects every table: test_cli_table_selection)
    assert [p.name for p in Path(lake, "_cdclake", "changelog", "crm").iterdir()] == ["customer"]
    assert [p.name for p in Path(lake, "_cdclake", "scd2", "crm").iterdir()] == ["customer"]
    assert not Path(lake, "_cdclake", "scd2", "shop").exists()


def test_cli_table_selection() -> None:
    from cdclake.cli.main import _table_selection

    assert _table_selection([]) is False
    assert _table_selection(["all"]) is True
    assert _table_selection(["crm.customer", " shop.orders "]) == ["crm.customer", "shop.orders"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "nope", "--lake", "L", "f"], "unknown format 'nope'"),
        (["--format", "dataworks-json", "--lake", "L", "/does/not/exist.jsonl"], "input file not found"),
        (["--format", "dataworks-json", "--lake", "L", "--input-encoding", "hex", "x"], "--input-encoding"),
        (["--format", "dataworks-json", "--lake", "L", "--keys", "crm.t", "README.md"], "expected db.table=col1,col2"),
        (["--format", "canal-json", "--lake", "L", "--option", "zone", "README.md"], "'zone' is not name=value"),
        (["--format", "canal-json", "--lake", "L", "--sequence-by", "t", "README.md"], "expected db.table=column"),
        (["--format", "canal-json", "--lake", "L", "--deletion-vectors", "yes", "README.md"], "--deletion-vectors"),
        (["--format", "canal-json", "--lake", "L", "--kafka-order", "time", "README.md"], "--kafka-order"),
        (["--format", "canal-json", "--lake", "L", "--partition-by", "t=days(ts)", "README.md"], "Iceberg transform"),
    ],
)
def test_cli_replay_rejects_bad_arguments(args: list[str], message: str) -> None:
    done = _cli("replay", *args)
    assert done.returncode != 0
    assert message in done.stderr + done.stdout


def test_cli_replay_without_files_is_a_usage_error() -> None:
    done = _cli("replay", "--format", "dataworks-json", "--lake", "L")
    assert done.returncode == 2


def test_configured_keys_for_a_table_without_any(spark, lake, tmp_path: Path) -> None:
    """A table whose messages carry no key and no row id: --keys makes updates replace rows."""

    def message(op: str, seq: int, before: dict | None, after: dict | None) -> str:
        columns = [{"name": "code", "type": "STRING"}, {"name": "qty", "type": "LONG"}]
        source = {"dbType": "PostgreSQL", "dbName": "inv", "schemaName": "public", "tableName": "stock"}
        payload = {
            "before": before and {"dataColumn": before},
            "after": after and {"dataColumn": after},
            "sequenceId": str(seq),
            "op": op,
            "timestamp": {"eventTime": 1709288131000 + seq},
            "ddl": None,
        }
        return json.dumps(
            {
                "schema": {"dataColumn": columns, "primaryKey": None, "source": source},
                "payload": payload,
                "version": "1.0.0",
            }
        )

    lines = [
        message("INSERT", 1, None, {"code": "a", "qty": 1}),
        message("INSERT", 2, None, {"code": "b", "qty": 5}),
        message("UPDATE_AFTER", 3, {"code": "a", "qty": 1}, {"code": "a", "qty": 2}),
        message("DELETE", 4, {"code": "b", "qty": 5}, None),
    ]
    path = tmp_path / "stock.jsonl"
    path.write_text("\n".join(lines) + "\n")
    replay(spark, lake=lake, format_name="dataworks-json", paths=[str(path)], keys={"inv.stock": ["code"]})
    assert read_table(f"{lake}/inv/stock") == [{"code": "a", "qty": 2}]


def test_columns_spelt_in_another_case_land_in_the_lake_tables_columns(spark, lake, tmp_path: Path) -> None:
    """The source renames `code` to `CODE` (MySQL `CHANGE code CODE ...`), or shards of one lake table spell a column
    differently. The lake keeps one column (Delta matches names case-insensitively), and images are read by exact
    names: every value of such a column was NULL, so rows were written with NULL keys and values."""

    def message(table: str, op: str, seq: int, row: dict[str, Any], keys: list[str] | None) -> str:
        columns = [{"name": name, "type": "STRING" if name.lower() == "code" else "LONG"} for name in row]
        source = {"dbType": "MySQL", "dbName": "inv", "tableName": table}
        payload = {
            "before": {"dataColumn": row} if op == "UPDATE_BEFOR" else None,
            "after": {"dataColumn": row} if op != "UPDATE_BEFOR" else None,
            "sequenceId": str(seq),
            "op": op,
            "timestamp": {"eventTime": 1709288131000 + seq},
            "ddl": None,
        }
        schema = {"dataColumn": columns, "primaryKey": keys, "source": source}
        return json.dumps({"schema": schema, "payload": payload, "version": "1.0.0"})

    def land(name: str, *lines: str) -> int:
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        results = replay(
            spark, lake=lake, format_name="dataworks-json", paths=[str(path)], keys={"inv.stock": ["code"]}
        )
        return sum(r.dead_letters for r in results)

    # inv.stock: keys configured (in the lake's spelling); inv.bin: the messages' own primary key.
    before = [
        message(t, "INSERT", 1, {"code": "a", "qty": 1}, keys) for t, keys in (("stock", None), ("bin", ["code"]))
    ]
    assert land("lower", *before) == 0
    renamed = [
        message(table, op, seq, row, keys)
        for table, keys in (("stock", None), ("bin", ["CODE"]))
        for op, seq, row in (
            ("UPDATE_BEFOR", 2, {"CODE": "a", "QTY": 1}),
            ("UPDATE_AFTER", 2, {"CODE": "a", "QTY": 30}),
            ("INSERT", 3, {"CODE": "c", "QTY": 40}),
        )
    ]
    assert land("upper", *renamed) == 0
    for table in ("stock", "bin"):
        rows = sorted(read_table(f"{lake}/inv/{table}"), key=lambda r: r["code"])
        assert rows == [{"code": "a", "qty": 30}, {"code": "c", "qty": 40}], table


def test_full_image_identity_when_no_key_is_known(spark, lake, tmp_path: Path) -> None:
    """Last resort: the whole before image identifies the row."""
    row = {
        "schema": {
            "dataColumn": [{"name": "v", "type": "STRING"}],
            "primaryKey": None,
            "source": {"dbType": "MySQL", "dbName": "d", "tableName": "t"},
        },
        "payload": {
            "before": None,
            "after": {"dataColumn": {"v": "x"}},
            "sequenceId": "1",
            "op": "INSERT",
            "timestamp": {"eventTime": 1},
        },
        "version": "1.0.0",
    }
    update = json.loads(json.dumps(row))
    update["payload"].update(
        op="UPDATE_AFTER", sequenceId="2", before={"dataColumn": {"v": "x"}}, after={"dataColumn": {"v": "y"}}
    )
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(update) + "\n")
    replay(spark, lake=lake, format_name="dataworks-json", paths=[str(path)])
    assert read_table(f"{lake}/d/t") == [{"v": "y"}]


@pytest.mark.parametrize("batch_lines", [100, 2], ids=["one-batch", "batch-per-two"])
def test_keyless_rows_keep_their_identity_across_an_added_column(spark, lake, tmp_path: Path, batch_lines: int) -> None:
    """A key-less row written before a column was added is the same row for later messages that declare the new
    column (NULL in it), in the same batch or a later one: updates replace it, deletes remove it."""

    def message(op: str, seq: int, before: dict | None, after: dict | None, columns: list[str]) -> str:
        return json.dumps(
            {
                "schema": {
                    "dataColumn": [{"name": name, "type": "STRING"} for name in columns],
                    "primaryKey": None,
                    "source": {"dbType": "MySQL", "dbName": "d", "tableName": "t"},
                },
                "payload": {
                    "before": before and {"dataColumn": before},
                    "after": after and {"dataColumn": after},
                    "sequenceId": str(seq),
                    "op": op,
                    "timestamp": {"eventTime": seq},
                },
                "version": "1.0.0",
            }
        )

    lines = [
        message("INSERT", 1, None, {"v": "x"}, ["v"]),
        message("INSERT", 2, None, {"v": "z"}, ["v"]),
        # ALTER TABLE t ADD COLUMN n: later messages declare n, NULL in the rows written before.
        message("UPDATE_AFTER", 3, {"v": "x", "n": None}, {"v": "x", "n": "1"}, ["v", "n"]),
        message("DELETE", 4, {"v": "z", "n": None}, None, ["v", "n"]),
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    replay(spark, lake=lake, format_name="dataworks-json", paths=[str(path)], batch_lines=batch_lines)
    assert read_table(f"{lake}/d/t") == [{"v": "x", "n": "1"}]


def test_a_value_that_does_not_fit_the_tables_type_is_a_dead_letter_not_null(spark, lake, tmp_path: Path) -> None:
    """An older message in a batch declares another type than the table has: its value must not become NULL."""

    def message(seq: int, row_id: int, kind: str, value: object) -> str:
        columns = [{"name": "id", "type": "LONG"}, {"name": "x", "type": kind}]
        source = {"dbType": "MySQL", "dbName": "d", "tableName": "t"}
        payload = {
            "before": None,
            "after": {"dataColumn": {"id": row_id, "x": value}},
            "sequenceId": str(seq),
            "op": "INSERT",
            "timestamp": {"eventTime": seq},
        }
        return json.dumps(
            {
                "schema": {"dataColumn": columns, "primaryKey": ["id"], "source": source},
                "payload": payload,
                "version": "1.0.0",
            }
        )

    first = tmp_path / "first.jsonl"
    first.write_text(message(1, 1, "LONG", 5) + "\n")
    replay(spark, lake=lake, format_name="dataworks-json", paths=[str(first)])
    second = tmp_path / "second.jsonl"
    second.write_text(message(2, 2, "DOUBLE", 1.5) + "\n" + message(3, 3, "LONG", 7) + "\n")
    results = replay(spark, lake=lake, format_name="dataworks-json", paths=[str(second)])
    assert sorted(read_table(f"{lake}/d/t"), key=lambda r: r["id"]) == [{"id": 1, "x": 5}, {"id": 3, "x": 7}]
    assert sum(r.dead_letters for r in results) == 1
    reasons = [row["reason"] for row in spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").collect()]
    assert reasons == ["value of column x (declared double) does not fit the lake table's type bigint"]


@pytest.mark.parametrize("small", [True, False], ids=["small-interpreted", "large-generated"])
def test_small_and_large_batches_apply_to_the_truth_with_their_projection_setting(
    spark, lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small: bool
) -> None:
    """Small batches are applied with Spark's interpreted projections, larger ones with the session's setting
    (``pipeline.SMALL_BATCH_SETTINGS``); both give the same tables, and the session's setting is back after each
    batch. Every other test runs small batches, so ``large-generated`` is what covers the generated path."""
    key = "spark.sql.codegen.factoryMode"
    if not small:
        monkeypatch.setattr(pipeline, "SMALL_BATCH_MESSAGES", 0)
    during_merges: list[str | None] = []
    merge = DeltaSink.merge

    def recording_merge(self: DeltaSink, *args: Any) -> None:
        during_merges.append(spark.conf.get(key, None))
        merge(self, *args)

    monkeypatch.setattr(DeltaSink, "merge", recording_merge)
    before = spark.conf.get(key, None)
    history, messages = workload(seed=16, events=120)
    path = write_lines(tmp_path / "dw.jsonl", messages)
    results = replay(spark, lake=lake, format_name="dataworks-json", paths=[str(path)], batch_lines=70)

    assert len(results) >= 2
    assert_lake_equals_truth(lake, history)
    assert during_merges
    assert set(during_merges) == ({"NO_CODEGEN"} if small else {before})
    assert spark.conf.get(key, None) == before
