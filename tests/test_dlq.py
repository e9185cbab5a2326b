"""`cdclake dlq list | replay`: dead letters re-applied after a fix, each at most once, never over newer rows."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from cdclake import dlq
from cdclake.cli import main as cli_main
from cdclake.cli.main import app
from cdclake.devtools.verify import compare_table, describe, read_table
from cdclake.dlq import DeadLetterFilter, list_dead_letters, replay_dead_letters
from cdclake.exceptions import ConfigError, InputError
from cdclake.formats import list_formats
from cdclake.pipeline import PipelineSettings
from cdclake.runner import replay
from cdclake.spark import local_frame
from cdclake.tables import TableFilter, TableRoutes
from tests.e2e.helpers import history_table
from tests.e2e.test_format_replay import typed
from tests.formats.golden import CASES, golden_options, message_bytes, read_jsonl

pytestmark = pytest.mark.spark

MISFIT = "value of column qty (declared string) does not fit the lake table's type bigint"


def stock(
    op: str,
    seq: int,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    qty_type: str,
    table: str = "stock",
) -> str:
    """A DataWorks message for inv.stock, whose messages carry no primary key (the pipeline configures `code`)."""
    columns = [{"name": "code", "type": "STRING"}, {"name": "qty", "type": qty_type}]
    source = {"dbType": "MySQL", "dbName": "inv", "schemaName": None, "tableName": table}
    payload = {
        "before": before and {"dataColumn": before},
        "after": after and {"dataColumn": after},
        "sequenceId": str(seq),
        "op": op,
        "timestamp": {"eventTime": 1709288131000 + seq},
        "ddl": None,
    }
    message = {"schema": {"dataColumn": columns, "primaryKey": None, "source": source}, "payload": payload}
    return json.dumps({**message, "version": "1.0.0"})


def replay_lines(spark, lake: str, path: Path, lines: list[str]) -> None:  # type: ignore[no-untyped-def]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    replay(spark, lake=lake, format_name="dataworks-json", paths=[str(path)], keys={"inv.stock": ["code"]})


def widen_qty_to_string(spark, lake: str, table: str = "inv/stock") -> None:  # type: ignore[no-untyped-def]
    """The operator's fix for the misfits: the lake column becomes a string, as the source column did."""
    path = f"{lake}/{table}"
    table = spark.read.format("delta").load(path)
    widened = table.withColumn("qty", table["qty"].cast("string"))
    widened.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)


def stock_rows(lake: str) -> list[tuple[str, str]]:
    return sorted((row["code"], str(row["qty"])) for row in read_table(f"{lake}/inv/stock"))


def misfit_lake(spark, lake: str, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    """inv.stock with a, b, c (qty bigint); then the source column became text: two updates do not fit and are
    dead letters, with one message that is not JSON at all. Returns the capture file holding the dead letters."""
    replay_lines(
        spark,
        lake,
        tmp_path / "1-initial.jsonl",
        [
            stock("INSERT", 1, None, {"code": "a", "qty": 1}, "LONG"),
            stock("INSERT", 2, None, {"code": "b", "qty": 2}, "LONG"),
            stock("INSERT", 3, None, {"code": "c", "qty": 3}, "LONG"),
        ],
    )
    failing = tmp_path / "2-text-qty.jsonl"
    replay_lines(
        spark,
        lake,
        failing,
        [
            stock("UPDATE_AFTER", 4, {"code": "a", "qty": "1"}, {"code": "a", "qty": "one dozen"}, "STRING"),
            stock("UPDATE_AFTER", 5, {"code": "b", "qty": "2"}, {"code": "b", "qty": "two dozen"}, "STRING"),
            '{"schema": {"dataColumn": [',
        ],
    )
    return failing


def outcomes(spark, lake: str) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    rows = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letter_replays").collect()
    return sorted((row["offset"], row["outcome"]) for row in rows)


def test_misfits_replayed_after_the_fix_apply_once_and_never_over_newer_rows(spark, lake, tmp_path: Path) -> None:
    failing = misfit_lake(spark, lake, tmp_path)
    assert stock_rows(lake) == [("a", "1"), ("b", "2"), ("c", "3")]
    listed = list_dead_letters(spark, lake)
    assert (listed.matched, listed.unresolved) == (3, 3)
    assert [(d.topic, d.offset, d.table) for d in listed.dead_letters] == [
        (str(failing), 0, "stock"),
        (str(failing), 1, "stock"),
        (str(failing), 2, None),
    ]
    assert [d.reason for d in listed.dead_letters[:2]] == [MISFIT, MISFIT]

    widen_qty_to_string(spark, lake)
    # The source goes on: `a` changes again and lands before anyone replays the dead letters.
    replay_lines(
        spark,
        lake,
        tmp_path / "3-after-fix.jsonl",
        [stock("UPDATE_AFTER", 6, {"code": "a", "qty": "1"}, {"code": "a", "qty": "thirteen"}, "STRING")],
    )

    # No --keys: the table's recorded key `code` is used, so the old update of `a` meets the newer row (and the gate
    # keeps it) instead of adding a second `a` row under a full-image key.
    report = replay_dead_letters(spark, lake)
    assert (report.selected, report.applied, report.formats) == (3, 2, {"dataworks-json": 3})
    assert [(f.offset, f.reason.startswith("malformed")) for f in report.failures] == [(2, True)]
    assert stock_rows(lake) == [("a", "thirteen"), ("b", "two dozen"), ("c", "3")]

    still = list_dead_letters(spark, lake)
    assert [(d.offset, d.failed_replays, d.resolved) for d in still.dead_letters] == [(2, 1, False)]
    everything = list_dead_letters(spark, lake, include_resolved=True)
    assert [(d.offset, d.resolved) for d in everything.dead_letters] == [(0, True), (1, True), (2, False)]
    assert (everything.matched, everything.unresolved) == (3, 1)

    again = replay_dead_letters(spark, lake)
    assert (again.selected, again.applied, [f.offset for f in again.failures]) == (1, 0, [2])
    assert stock_rows(lake) == [("a", "thirteen"), ("b", "two dozen"), ("c", "3")]
    # Failing again never adds a dead letter: the message stays listed once, with its count of failed replays.
    assert spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").count() == 3
    assert [(d.offset, d.failed_replays) for d in list_dead_letters(spark, lake).dead_letters] == [(2, 2)]
    assert outcomes(spark, lake) == [(0, "applied"), (1, "applied"), (2, "failed"), (2, "failed")]


def test_a_routed_tables_dead_letters_land_where_its_rows_are(spark, lake, tmp_path: Path) -> None:
    """Replayed with the pipeline's routes and table filter: a routed table's misfit lands in its routed lake table;
    an excluded table's changes nothing and is resolved."""
    routes = TableRoutes.of([(["inv.*"], "wh.{table}_all")])
    keys = {"inv.stock": ["code"], "inv.tmp_stock": ["code"]}
    capture = tmp_path / "capture.jsonl"
    capture.write_text(
        "\n".join(
            [
                stock("INSERT", 1, None, {"code": "a", "qty": 1}, "LONG"),
                stock("INSERT", 2, None, {"code": "t", "qty": 1}, "LONG", table="tmp_stock"),
                stock("UPDATE_AFTER", 3, {"code": "a", "qty": "1"}, {"code": "a", "qty": "a dozen"}, "STRING"),
                stock("UPDATE_AFTER", 4, {"code": "t", "qty": "1"}, {"code": "t", "qty": "x"}, "STRING", "tmp_stock"),
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    replay(
        spark, lake=lake, format_name="dataworks-json", paths=[str(capture)], keys=keys, routes=routes, batch_lines=2
    )
    assert [d.reason for d in list_dead_letters(spark, lake).dead_letters] == [MISFIT, MISFIT]
    for table in ("wh/stock_all", "wh/tmp_stock_all"):
        widen_qty_to_string(spark, lake, table)

    report = replay_dead_letters(spark, lake, routes=routes, tables=TableFilter.of(exclude=["inv.tmp_*"]))
    assert (report.selected, report.applied, report.failures) == (2, 2, [])
    assert sorted(report.changes) == [f"{lake}/wh/stock_all"]
    rows = {
        table: sorted((r["code"], str(r["qty"])) for r in read_table(f"{lake}/wh/{table}"))
        for table in ("stock_all", "tmp_stock_all")
    }
    assert rows == {"stock_all": [("a", "a dozen")], "tmp_stock_all": [("t", "1")]}
    assert not (Path(lake) / "inv").exists()
    assert list_dead_letters(spark, lake).unresolved == 0


def test_wrong_format_then_right_options_new_reason_listed_once_then_applied(spark, lake, tmp_path: Path) -> None:
    """Qlik Avro data messages read without the data schema option are dead letters until it is given."""
    folder = CASES / "qlik-avro" / "replay"
    settings = json.loads((folder / "options.json").read_text())
    values = [value for _, value in map(message_bytes, read_jsonl(folder / "input.jsonl")) if value is not None]
    capture = tmp_path / "qlik.b64"
    capture.write_text("".join(base64.b64encode(v).decode() + "\n" for v in values))
    replay(spark, lake=lake, format_name="qlik-avro", paths=[str(capture)], encoding="b64")
    first = list_dead_letters(spark, lake)
    assert first.unresolved == len(values) == 6
    assert all("dataSchema is needed" in d.reason for d in first.dead_letters)

    dry = replay_dead_letters(spark, lake, format_name="qlik-json", dry_run=True)
    assert (dry.selected, dry.applied, len(dry.failures)) == (6, 0, 6)
    assert list_dead_letters(spark, lake).dead_letters == first.dead_letters  # a dry run writes nothing

    wrong = replay_dead_letters(spark, lake, format_name="qlik-json")
    assert (wrong.applied, len(wrong.failures)) == (0, 6)
    new_reason = wrong.failures[0].reason
    assert "dataSchema is needed" not in new_reason
    listed = list_dead_letters(spark, lake)
    assert [d.offset for d in listed.dead_letters] == list(range(6))  # each once
    assert {d.reason for d in listed.dead_letters} == {f.reason for f in wrong.failures}
    assert spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").count() == 6

    fixed = replay_dead_letters(
        spark, lake, keys=settings["keys"], format_options=settings["format_options"], filters=DeadLetterFilter()
    )
    assert (fixed.selected, fixed.applied, fixed.failures, fixed.formats) == (6, 6, [], {"qlik-avro": 6})
    expected = json.loads((folder / "expected.json").read_text(encoding="utf-8"))["SALES/T"]
    result = compare_table(f"{lake}/SALES/T", "SALES/T", [{k: typed(v) for k, v in row.items()} for row in expected])
    assert result.ok, describe([result])

    second = replay_dead_letters(spark, lake, keys=settings["keys"], format_options=settings["format_options"])
    assert (second.selected, second.applied) == (0, 0)
    result = compare_table(f"{lake}/SALES/T", "SALES/T", [{k: typed(v) for k, v in row.items()} for row in expected])
    assert result.ok, describe([result])
    assert list_dead_letters(spark, lake).matched == 0


def test_key_columns_the_messages_do_not_carry_make_dead_letters_not_one_row(spark, lake, tmp_path: Path) -> None:
    """An image holds its columns by their exact names: keys named in another case read NULL in every row, and the
    table's rows all became one row (the last). They are dead letters that name the columns the table has."""
    lines = [stock("INSERT", seq, None, {"code": code, "qty": str(seq)}, "LONG") for seq, code in ((1, "a"), (2, "b"))]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    results = replay(
        spark, lake=lake, format_name="dataworks-json", paths=[str(tmp_path / "m.jsonl")], keys={"inv.stock": ["CODE"]}
    )
    assert sum(r.dead_letters for r in results) == 2
    assert {d.reason for d in list_dead_letters(spark, lake).dead_letters} == {
        "key columns ['CODE'] are not columns of inv.stock (it has code: names are case-sensitive): fix the "
        "`keys` setting"
    }
    report = replay_dead_letters(spark, lake, keys={"inv.stock": ["code"]})
    assert (report.applied, stock_rows(lake)) == (2, [("a", "1"), ("b", "2")])


def test_a_topic_no_format_is_set_for_becomes_dead_letters_replayed_with_a_format(spark, lake) -> None:
    """A topic pattern can subscribe to a topic that `topic_formats` does not name. Its messages were read and
    never decoded: gone, with the offsets committed. They are dead letters, which record no format."""
    from cdclake.pipeline import Pipeline

    rows = [
        (None, stock("INSERT", 1, None, {"code": "a", "qty": "1"}, "LONG", table).encode(), topic, 0, 0, None)
        for topic, table in (("dw.inv", "stock"), ("dw.new", "bin"))
    ]
    batch = spark.createDataFrame(
        rows, "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
    )
    settings = PipelineSettings(
        lake=lake, app_id="by-topic", topic_formats={"dw.inv": "dataworks-json"}, keys={"inv.*": ["code"]}
    )
    result = Pipeline(spark, settings).process_batch(batch, 0)

    assert (result.dead_letters, stock_rows(lake)) == (1, [("a", "1")])
    listed = list_dead_letters(spark, lake).dead_letters
    assert [(d.topic, d.format, d.reason) for d in listed] == [
        (
            "dw.new",
            None,
            "no format is set for this topic: add it to topic_formats (or set format), then replay these dead "
            "letters with `cdclake dlq replay --topic TOPIC --format NAME`",
        )
    ]
    report = replay_dead_letters(spark, lake, format_name="dataworks-json", keys={"inv.*": ["code"]})
    assert (report.selected, report.applied) == (1, 1)
    assert [(row["code"], row["qty"]) for row in read_table(f"{lake}/inv/bin")] == [("a", 1)]


def test_crash_between_applying_and_recording_re_applies_harmlessly(
    spark, lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    misfit_lake(spark, lake, tmp_path)
    widen_qty_to_string(spark, lake)

    def crash(*_args: object) -> None:
        raise RuntimeError("killed before the outcomes were written")

    with monkeypatch.context() as patched:
        patched.setattr(dlq, "_record_outcomes", crash)
        with pytest.raises(RuntimeError, match="killed"):
            replay_dead_letters(spark, lake, filters=DeadLetterFilter(reason="does not fit"))
    assert stock_rows(lake) == [("a", "one dozen"), ("b", "two dozen"), ("c", "3")]
    assert list_dead_letters(spark, lake).unresolved == 3  # nothing recorded: they are replayed again

    report = replay_dead_letters(spark, lake, filters=DeadLetterFilter(reason="does not fit"))
    assert (report.selected, report.applied, report.failures) == (2, 2, [])
    assert stock_rows(lake) == [("a", "one dozen"), ("b", "two dozen"), ("c", "3")]
    assert outcomes(spark, lake) == [(0, "applied"), (1, "applied")]


def test_filters(spark, lake, tmp_path: Path) -> None:
    failing = misfit_lake(spark, lake, tmp_path)

    def offsets(**criteria: Any) -> list[int]:
        return [d.offset for d in list_dead_letters(spark, lake, DeadLetterFilter(**criteria)).dead_letters]

    assert offsets(topic=str(failing)) == [0, 1, 2]
    assert offsets(topic="other") == []
    assert offsets(table="inv.stock") == offsets(table="stock") == [0, 1]
    assert offsets(reason="MALFORMED") == [2]
    assert offsets(pipeline="replay") == [0, 1, 2]
    assert offsets(pipeline="orders-cdc") == []
    assert offsets(since=datetime.now(UTC) - timedelta(hours=1)) == [0, 1, 2]
    assert offsets(since=datetime.now(UTC) + timedelta(hours=1)) == []
    listing = list_dead_letters(spark, lake, limit=1)
    assert (len(listing.dead_letters), listing.matched) == (1, 3)

    with pytest.raises(InputError, match="no cdclake lake"):
        list_dead_letters(spark, str(tmp_path / "not-a-lake"))

    # Options belong to one format: with dead letters of two formats selected, the replay must be told which.
    maxwell = tmp_path / "maxwell.jsonl"
    maxwell.write_text("not json either\n", encoding="utf-8")
    replay(spark, lake=lake, format_name="maxwell-json", paths=[str(maxwell)])
    assert offsets(topic=str(maxwell)) == [0]
    with pytest.raises(ConfigError, match=r"'--option'.*several formats \(dataworks-json, maxwell-json\)"):
        replay_dead_letters(spark, lake, format_options={"database": "inv"})


def test_cli_list_and_replay(spark, lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    misfit_lake(spark, lake, tmp_path)
    # Not a terminal: the CLI prints one table row per line (cli.main._console), nothing cut at 80 columns.
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(cli_main, "out", cli_main._console())
    assert cli_main.out.width == cli_main.PIPED_WIDTH
    runner = CliRunner()

    listed = runner.invoke(app, ["dlq", "list", "--lake", lake, "--show-value"])
    assert listed.exit_code == 0, listed.output
    assert "3 dead letters, 3 unresolved" in listed.output
    assert "does not fit" in listed.output
    assert "one dozen" in listed.output  # the raw value
    assert "headers" not in listed.output  # no message has any: no column for them
    limited = runner.invoke(app, ["dlq", "list", "--lake", lake, "--reason", "malformed", "--limit", "1"])
    assert "1 dead letters, 1 unresolved" in limited.output

    dry = runner.invoke(app, ["dlq", "replay", "--lake", lake, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "3 dead letters, 2 would decode, 1 still fail to decode; nothing written" in dry.output

    widen_qty_to_string(spark, lake)
    done = runner.invoke(app, ["dlq", "replay", "--lake", lake, "--keys", "inv.stock=code"])
    assert done.exit_code == 0, done.output
    assert "3 dead letters, 2 applied, 1 failed again" in done.output
    assert "inv/stock" in done.output
    assert stock_rows(lake) == [("a", "one dozen"), ("b", "two dozen"), ("c", "3")]

    after = runner.invoke(app, ["dlq", "list", "--lake", lake, "--all"])
    assert "3 dead letters, 1 unresolved" in after.output
    assert after.output.count("resolved 20") == 2
    assert "1 replays failed" in after.output
    nothing = runner.invoke(app, ["dlq", "replay", "--lake", lake, "--table", "inv.stock"])
    assert "no unresolved dead letters match" in nothing.output

    bad_option = runner.invoke(app, ["dlq", "replay", "--lake", lake, "--option", "data_schema"])
    assert isinstance(bad_option.exception, ConfigError)
    assert "config error at '--option'" in str(bad_option.exception)
    assert "Fix: write --option name=value" in str(bad_option.exception)
    bad_since = runner.invoke(app, ["dlq", "list", "--lake", lake, "--since", "yesterday"])
    assert isinstance(bad_since.exception, ConfigError)
    assert "'--since'" in str(bad_since.exception)


def test_replayed_with_the_pipeline_configuration_its_history_tables_get_the_changes(
    spark, lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`replay --config` and `dlq replay --config`: captured messages and dead letters take the pipeline's every
    setting, its keys and changelog and SCD2 tables included (given only --lake and --keys, a dead letter would change
    the lake table and leave its history without the change)."""
    config = tmp_path / "pipeline.yaml"
    settings = {
        "name": "stock-cdc",
        "lake": lake,
        "kafka": {"bootstrap_servers": "127.0.0.1:9", "topics": ["inv"]},
        "format": "dataworks-json",
        "keys": {"inv.stock": ["code"]},
        "history": {"changelog": True, "scd2": True},
    }
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    monkeypatch.delenv("COLUMNS", raising=False)  # not a terminal: lines as long as they are (cli.main._console)
    monkeypatch.setattr(cli_main, "out", cli_main._console())
    runner = CliRunner()
    batches = {
        "1-initial": [
            stock("INSERT", seq, None, {"code": code, "qty": seq}, "LONG") for seq, code in enumerate("abc", 1)
        ],
        "2-text-qty": [
            stock("UPDATE_AFTER", 4, {"code": "a", "qty": "1"}, {"code": "a", "qty": "one dozen"}, "STRING"),
            stock("UPDATE_AFTER", 5, {"code": "b", "qty": "2"}, {"code": "b", "qty": "two dozen"}, "STRING"),
        ],
    }
    for name, lines in batches.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        replayed = runner.invoke(app, ["replay", "--config", str(config), str(path)])
        assert replayed.exit_code == 0, replayed.output
    assert [d.reason for d in list_dead_letters(spark, lake).dead_letters] == [MISFIT, MISFIT]
    for table in ("inv/stock", "_cdclake/changelog/inv/stock", "_cdclake/scd2/inv/stock"):
        widen_qty_to_string(spark, lake, table)

    refused = runner.invoke(app, ["replay", "--config", str(config), "--scd2", "all", str(path)])
    assert isinstance(refused.exception, InputError)
    assert "--scd2: --config gives the pipeline's settings" in str(refused.exception)
    clash = runner.invoke(app, ["dlq", "replay", "--config", str(config), "--route", "inv.*=wh.{table}"])
    assert isinstance(clash.exception, InputError)
    assert "--route: --config gives the pipeline's settings" in str(clash.exception)
    no_lake = runner.invoke(app, ["dlq", "replay"])
    assert isinstance(no_lake.exception, InputError)
    assert "--lake DIR, or --config" in str(no_lake.exception)
    # Only the configured pipeline's dead letters by default: these were recorded by file replays (`replay`).
    assert "no unresolved dead letters match" in runner.invoke(app, ["dlq", "replay", "--config", str(config)]).output

    done = runner.invoke(app, ["dlq", "replay", "--config", str(config), "--pipeline", "replay"])
    assert done.exit_code == 0, done.output
    assert "2 dead letters, 2 applied, 0 failed again" in done.output
    listed = runner.invoke(app, ["dlq", "list", "--config", str(config), "--pipeline", "replay", "--all"])
    assert "2 dead letters, 0 unresolved" in listed.output, listed.output
    status = runner.invoke(app, ["status", "--config", str(config)])
    assert status.exit_code == 0, status.output
    assert "inv.stock" in status.output
    assert stock_rows(lake) == [("a", "one dozen"), ("b", "two dozen"), ("c", "3")]
    changelog = history_table(spark, lake, "changelog", "inv", "stock")
    assert changelog is not None
    assert sorted((r["code"], r["qty"], r["_cdc_op"]) for r in changelog.collect()) == [
        ("a", "1", "INSERT"),
        ("a", "one dozen", "UPDATE"),
        ("b", "2", "INSERT"),
        ("b", "two dozen", "UPDATE"),
        ("c", "3", "INSERT"),
    ]
    scd2 = history_table(spark, lake, "scd2", "inv", "stock")
    assert scd2 is not None
    assert sorted((r["code"], r["qty"], r["_cdc_is_current"]) for r in scd2.collect()) == [
        ("a", "1", False),
        ("a", "one dozen", True),
        ("b", "2", False),
        ("b", "two dozen", True),
        ("c", "3", True),
    ]


@pytest.mark.parametrize("format_name", sorted(f.name for f in list_formats()))
def test_the_messages_that_still_fail_are_the_golden_failures_of_every_format(
    spark, tmp_path: Path, format_name: str
) -> None:
    """Before re-applying dead letters, dlq decodes them again and keeps the ones that still fail. For every
    format's malformed golden case that must be exactly the golden file's failures, with the same reasons. (The
    filter on the decoded errors once sent the optimizer out of heap for the Avro formats: dlq._materialised.)"""
    lines = read_jsonl(CASES / format_name / "malformed.input.jsonl")
    expected: dict[int, str] = {}
    line_index = -1
    for event in read_jsonl(CASES / format_name / "malformed.expected.jsonl"):
        line_index += event["sub_index"] == 0
        if event["error"] is not None:
            expected[line_index] = min(event["error"], expected.get(line_index, event["error"]))
    assert expected, "the malformed case has no failing message"
    rows = [(*message_bytes(line), "golden", 0, offset, None) for offset, line in enumerate(lines)]
    group = spark.createDataFrame(
        rows, "key binary, value binary, topic string, partition int, offset bigint, kafka_timestamp timestamp"
    )
    settings = PipelineSettings(
        lake=str(tmp_path / "lake"),
        app_id="dlq-test",
        default_format=format_name,
        format_options={format_name: golden_options(format_name)},
    )
    still_failing = dlq._decode_failures(spark, settings, group)
    assert {row["offset"]: row["reason"] for row in still_failing.collect()} == expected
    # The filter applies to computed events, not to the decoder's expressions inlined into it (they are the
    # whole decoder, thousands of characters per column: the Avro ones grew past the heap).
    optimized = still_failing._jdf.queryExecution().optimizedPlan().toString()
    assert len(optimized) < 5_000, optimized[:2_000]


def test_a_dead_letter_keeps_its_headers_for_its_replay(spark, lake, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Debezium primary-key update whose ``c`` is a dead letter (here: its topic has no format) while its ``d``
    (``__debezium.newkey``, not applied) decodes: the old key's row stays until the ``c`` is replayed, and the
    replay reads the ``c``'s ``__debezium.oldkey`` header again, from the dead letter, so that the ``c`` moves the
    row (debezium.md 2). Replayed without its headers it would be an insert beside the old row, its body NULL."""
    from cdclake.pipeline import Pipeline

    def change(op: str, scn: int, image: dict[str, Any]) -> tuple[bytes, bytes]:
        source = {"connector": "oracle", "db": "APPDB", "schema": "APP", "table": "NOTES", "scn": scn, "ts_ms": 1}
        images = {"before": image, "after": None} if op == "d" else {"before": None, "after": image}
        value = {**images, "source": source, "op": op, "ts_ms": 1}
        return json.dumps({"ID": image["ID"]}).encode(), json.dumps(value).encode()

    def frame(rows: list[tuple[Any, ...]]):  # type: ignore[no-untyped-def]
        schema = "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
        return local_frame(spark, rows, f"{schema}, headers array<struct<key: string, value: binary>>")

    settings = PipelineSettings(lake=lake, app_id="headers", topic_formats={"dbz.notes": "debezium-json"})
    pipeline = Pipeline(spark, settings)
    first = change("c", 100, {"ID": 1, "TITLE": "one", "BODY": "text 1"})
    pipeline.process_batch(frame([(*first, "dbz.notes", 0, 0, None, None)]), 0)
    deleted = change("d", 200, {"ID": 1, "TITLE": None, "BODY": None})
    moved = change("c", 200, {"ID": 2, "TITLE": "two", "BODY": "__debezium_unavailable_value"})
    second = [
        (*deleted, "dbz.notes", 0, 1, None, [("__debezium.newkey", b'{"ID":2}')]),
        (*moved, "dbz.other", 0, 0, None, [("__debezium.oldkey", b'{"ID":1}')]),
    ]
    assert pipeline.process_batch(frame(second), 1).dead_letters == 1

    def rows() -> list[tuple[Any, ...]]:
        return sorted((row["ID"], row["TITLE"], row["BODY"]) for row in read_table(f"{lake}/APPDB/NOTES"))

    assert rows() == [(1, "one", "text 1")]
    stored = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").collect()
    assert [[(h["key"], bytes(h["value"])) for h in row["headers"]] for row in stored] == [
        [("__debezium.oldkey", b'{"ID":1}')]
    ]
    [dead] = list_dead_letters(spark, lake).dead_letters
    assert dead.headers == (("__debezium.oldkey", b'{"ID":1}'),)
    monkeypatch.delenv("COLUMNS", raising=False)  # one table row per line, nothing cut (test_cli_list_and_replay)
    monkeypatch.setattr(cli_main, "out", cli_main._console())
    listed = CliRunner().invoke(app, ["dlq", "list", "--lake", lake, "--show-value"])
    assert listed.exit_code == 0, listed.output
    assert '__debezium.oldkey: {"ID":1}' in listed.output
    report = replay_dead_letters(spark, lake, format_name="debezium-json")
    assert (report.selected, report.applied) == (1, 1)
    assert rows() == [(2, "two", "text 1")]
