"""`cdclake check`: a configuration tried on the messages the pipeline would read next, against a real broker."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cdclake.check import check_pipeline
from cdclake.cli import main as cli_main
from cdclake.cli.main import app
from cdclake.config import KafkaConfig, PipelineConfig, TablesConfig, TriggerConfig
from cdclake.devtools import broker
from cdclake.runner import run
from tests.test_dlq import stock

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def with_note(message: str, note: str) -> str:
    """The DataWorks message with one more column, ``note``, as after an ALTER TABLE ADD COLUMN at the source."""
    parsed = json.loads(message)
    parsed["schema"]["dataColumn"].append({"name": "note", "type": "STRING"})
    parsed["payload"]["after"]["dataColumn"]["note"] = note
    return json.dumps(parsed)


def test_check_reports_what_a_run_would_do_and_writes_nothing(
    spark, kafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = f"check-{uuid.uuid4().hex[:8]}"
    broker.create_topics(kafka, {topic: 1})
    first = [
        stock("INSERT", 1, None, {"code": "a", "qty": 1}, "LONG"),
        stock("INSERT", 2, None, {"code": "b", "qty": 2}, "LONG"),
        stock("INSERT", 3, None, {"code": "t", "qty": 3}, "LONG", table="tmp_stock"),
        "not json",
        stock("UPDATE_AFTER", 4, {"code": "a", "qty": 1}, {"code": "a", "qty": 5}, "LONG"),
    ]
    broker.produce(kafka, topic, [(None, m.encode()) for m in first], partition=0)
    lake = tmp_path / "lake"
    config = PipelineConfig(
        name="check-test",
        lake=str(lake),
        kafka=KafkaConfig(bootstrap_servers=kafka, topics=[topic]),
        format="dataworks-json",
        tables=TablesConfig(exclude=["inv.tmp_*"]),
        trigger=TriggerConfig(available_now=True),
    )

    report = check_pipeline(spark, config)
    assert (report.started_from, report.messages, report.by_topic, report.failed) == ("earliest", 5, {topic: 5}, 1)
    assert [(f.offset, f.reason.startswith("malformed")) for f in report.failures] == [(3, True)]
    assert [(t.name, t.events, t.lands, t.lake_table, t.in_lake, t.key_source) for t in report.tables] == [
        ("inv.stock", {"INSERT": 2, "UPDATE": 1}, "yes", "inv/stock", False, "none"),
        ("inv.tmp_stock", {"INSERT": 1}, "excluded", None, False, "none"),
    ]
    assert not lake.exists()  # nothing written: no lake, no checkpoint
    # A partition column the messages do not carry: the new lake table would be created without it.
    partitioned = config.model_copy(update={"partition_by": {"inv.stock": ["warehouse"]}})
    assert [t.partitioning_note for t in check_pipeline(spark, partitioned).tables] == [
        "partition_by gives (warehouse), but the messages carry no column warehouse: the lake table would be created "
        "without it",
        None,
    ]

    # The CLI: the messages that would be dead letters make it exit 1; a key-less table gets a hint.
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(cli_main, "out", cli_main._console())
    path = tmp_path / "pipeline.yaml"
    configured = config.model_copy(update={"keys": {"inv.stock": ["code"]}})
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True)), encoding="utf-8")
    checked = CliRunner().invoke(app, ["check", str(path)])
    assert checked.exit_code == 1, checked.output
    assert "5 messages read from the earliest offsets" in checked.output
    assert "1 of 5 messages do not decode (they would be dead letters)" in checked.output
    assert "no key columns for inv.stock" in checked.output

    # After a run, the check starts where the pipeline goes on: the next message, which brings a new column.
    run(spark, configured)
    broker.produce(
        kafka,
        topic,
        [(None, with_note(stock("UPDATE_AFTER", 5, {"code": "b"}, {"code": "b", "qty": 6}, "LONG"), "x").encode())],
        partition=0,
    )
    report = check_pipeline(spark, configured)
    assert (report.started_from, report.messages, report.failed) == ("checkpoint", 1, 0)
    assert [(t.name, t.in_lake, t.key_columns, t.key_source, t.new_columns) for t in report.tables] == [
        ("inv.stock", True, ["code"], "keys", ["note"])
    ]
    # Table properties the existing lake table lacks: a run would set them. Its partitioning stays as it is.
    feed = {"inv.*": {"delta.enableChangeDataFeed": "true"}}
    with_properties = configured.model_copy(update={"table_properties": feed, "partition_by": {"inv.*": ["code"]}})
    path.write_text(yaml.safe_dump(with_properties.model_dump(mode="json", exclude_defaults=True)), encoding="utf-8")
    checked = CliRunner().invoke(app, ["check", str(path)])
    assert checked.exit_code == 0, checked.output
    assert "1 messages read from where the checkpoint goes on" in checked.output
    assert "every message read decodes" in checked.output
    assert "inv/stock would get table properties delta.enableChangeDataFeed=true (table_properties)" in checked.output
    assert (
        "inv.stock: the lake table is partitioned by (none), partition_by gives (code): an existing table keeps its "
        "partitioning (recreate it to change it)"
    ) in " ".join(checked.output.split())

    # The lake's owner adds CHECK constraints; the next message's row does not meet one: it would be a dead letter.
    # The other one reads cdclake's own columns, which no image holds: the rows a MERGE would write are checked, as a
    # run checks them (the change at source position 5 is not older than 5).
    spark.sql(f"ALTER TABLE delta.`{lake}/inv/stock` ADD CONSTRAINT positive CHECK (qty > 0)")
    spark.sql(f"ALTER TABLE delta.`{lake}/inv/stock` ADD CONSTRAINT early CHECK (_cdc_position < '{'0' * 23}5')")
    broker.produce(
        kafka, topic, [(None, stock("INSERT", 6, None, {"code": "c", "qty": -1}, "LONG").encode())], partition=0
    )
    report = check_pipeline(spark, configured)
    assert (report.messages, report.failed, report.unmet, report.ok) == (2, 0, 2, False)
    early = f"early (_cdc_position < '{'0' * 23}5')"
    assert [(t.name, t.unmet_constraints) for t in report.tables] == [
        ("inv.stock", {early: 1, "positive (qty > 0)": 1})
    ]
    checked = CliRunner().invoke(app, ["check", str(path)])
    assert checked.exit_code == 1, checked.output
    assert (
        "1 events of inv.stock would not meet CHECK constraint positive (qty > 0) of lake table inv/stock (they would "
        "be dead letters)"
    ) in checked.output
    assert f"1 events of inv.stock would not meet CHECK constraint {early} of lake table inv/stock" in checked.output

    # Settings that do not fit the table: keys in another case than its columns would make every row event a dead
    # letter; a sequence_by pattern whose column the table lacks leaves it in the format's order, with a warning.
    miscased = configured.model_copy(update={"keys": {"inv.stock": ["CODE"]}})
    report = check_pipeline(spark, miscased)
    assert [(t.setting_problem, t.refused_by_setting) for t in report.tables] == [
        (
            "key columns ['CODE'] are not columns of inv.stock (it has code: names are case-sensitive): fix the "
            "`keys` setting",
            2,
        )
    ]
    assert (report.refused_by_settings, report.ok) == (2, False)
    report = check_pipeline(spark, configured.model_copy(update={"sequence_by": {"*": "updated_at"}}))
    assert [(t.setting_problem, t.setting_warning) for t in report.tables] == [
        (None, "sequence_by pattern *: inv.stock has no column updated_at; keeping its position")
    ]
    assert report.refused_by_settings == 0


def test_check_counts_the_rows_whose_key_is_null(spark, kafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A configured key column that is NULL in a row: the run would dead-letter it, and the check says so."""
    topic = f"check-{uuid.uuid4().hex[:8]}"
    broker.create_topics(kafka, {topic: 1})
    messages = [
        stock("INSERT", 1, None, {"code": "a", "qty": 1}, "LONG"),
        stock("INSERT", 2, None, {"code": None, "qty": 2}, "LONG"),
        stock("DELETE", 3, {"code": None, "qty": 2}, None, "LONG"),
    ]
    broker.produce(kafka, topic, [(None, m.encode()) for m in messages], partition=0)
    config = PipelineConfig(
        name="check-null-keys",
        lake=str(tmp_path / "lake"),
        kafka=KafkaConfig(bootstrap_servers=kafka, topics=[topic]),
        format="dataworks-json",
        keys={"inv.stock": ["code"]},
        trigger=TriggerConfig(available_now=True),
    )
    report = check_pipeline(spark, config)
    assert [(t.name, t.key_columns, t.null_keys) for t in report.tables] == [("inv.stock", ["code"], 2)]
    assert (report.failed, report.null_keys, report.ok) == (0, 2, False)
    keyed_by_qty = check_pipeline(spark, config.model_copy(update={"keys": {"inv.stock": ["qty"]}}))
    assert (keyed_by_qty.null_keys, keyed_by_qty.ok) == (0, True)

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(cli_main, "out", cli_main._console())
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True)), encoding="utf-8")
    checked = CliRunner().invoke(app, ["check", str(path)])
    assert checked.exit_code == 1, checked.output
    assert "2 events of inv.stock would be dead letters: a key column (code) is NULL in their row" in " ".join(
        checked.output.split()
    )


def test_kafka_headers_reach_the_decoder(spark, kafka, tmp_path: Path) -> None:
    """Spark's Kafka source reads headers only when asked (``includeHeaders``): a Debezium ``c`` whose
    ``__debezium.oldkey`` header names its old key is the UPDATE of a primary-key update (debezium.md 2), the ``d``
    beside it (``__debezium.newkey``) is not applied. Read from the broker, as a run reads it; without the headers
    the ``c`` was an INSERT and the ``d`` a DELETE."""
    topic = f"headers-{uuid.uuid4().hex[:8]}"
    broker.create_topics(kafka, {topic: 1})
    source = {"connector": "postgresql", "db": "appdb", "schema": "public", "table": "articles", "lsn": 200, "ts_ms": 1}

    def change(op: str, image: dict[str, object]) -> tuple[bytes, bytes]:
        images = {"before": image, "after": None} if op == "d" else {"before": None, "after": image}
        value = {**images, "source": source, "op": op, "ts_ms": 1}
        return json.dumps({"id": image["id"]}).encode(), json.dumps(value).encode()

    messages = [change("d", {"id": 1, "title": None}), change("c", {"id": 2, "title": "t"})]
    headers = [[("__debezium.newkey", b'{"id":2}')], [("__debezium.oldkey", b'{"id":1}')]]
    broker.produce(kafka, topic, messages, partition=0, headers=headers)
    config = PipelineConfig(
        name="headers-test",
        lake=str(tmp_path / "lake"),
        kafka=KafkaConfig(bootstrap_servers=kafka, topics=[topic]),
        format="debezium-json",
        trigger=TriggerConfig(available_now=True),
    )
    report = check_pipeline(spark, config)
    assert (report.messages, report.failed) == (2, 0)
    assert [(t.name, t.events) for t in report.tables] == [("appdb.public.articles", {"OTHER": 1, "UPDATE": 1})]
