"""Configuration errors name the key and the fix; secrets are never printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cdclake.config import load_config, parse_config
from cdclake.exceptions import ConfigError

GOOD = {
    "lake": "/data/lake",
    "kafka": {"bootstrap_servers": "b:9092", "topics": ["t"]},
    "format": "dataworks-json",
}


def _with(**changes: object) -> dict:
    data = {**GOOD, "kafka": dict(GOOD["kafka"])}  # type: ignore[arg-type]
    for key, value in changes.items():
        if key.startswith("kafka_"):
            data["kafka"][key.removeprefix("kafka_")] = value
        else:
            data[key] = value
    return data


def test_good_config_defaults() -> None:
    config = parse_config(GOOD)
    assert config.checkpoint_location == "/data/lake/_cdclake/checkpoints/cdclake"
    options = config.kafka.spark_options()
    assert options["subscribe"] == "t"
    assert options["startingOffsets"] == "earliest"
    assert options["maxOffsetsPerTrigger"] == "200000"
    assert config.deletion_vectors == "auto"
    assert parse_config({**GOOD, "deletion_vectors": "never"}).deletion_vectors == "never"
    assert config.kafka_order is None
    assert parse_config({**GOOD, "kafka_order": "timestamp"}).kafka_order == "timestamp"
    assert config.tables.table_filter().selects_all
    tables = parse_config({**GOOD, "tables": {"include": ["shop.*"], "exclude": ["*.tmp_*"]}}).tables.table_filter()
    assert (tables.include, tables.exclude) == (("shop.*",), ("*.tmp_*",))
    assert config.table_routes().rules == ()
    routes = parse_config(
        {**GOOD, "routes": [{"tables": "shop.orders_*", "to": "shop.orders"}, {"tables": ["*"], "to": "ods.{table}"}]}
    ).table_routes()
    assert routes.lake_name("shop", None, "orders_01") == ("shop", "orders")
    assert routes.lake_name("crm", None, "customer") == ("ods", "customer")
    patterned = parse_config(
        {**GOOD, "keys": {"shop.orders_*": ["id"]}, "sequence_by": {"*": "v"}, "ddl": {"tables": {"crm.*": "ignore"}}}
    )
    assert (patterned.keys, patterned.sequence_by) == ({"shop.orders_*": ["id"]}, {"*": "v"})
    assert patterned.ddl.tables == {"crm.*": "ignore"}


def test_history_lists_take_the_names_and_patterns_of_tables_include() -> None:
    """A source name may hold a dot itself (MySQL's `shop`.`orders.v2`; a schema `sales.eu`): history lists are not
    limited to three parts, as `tables.include` is not."""
    from cdclake.apply import TablePlan, table_id_of
    from cdclake.sinks.history import is_selected

    history = parse_config({**GOOD, "history": {"scd2": ["erp.sales.eu.orders.v2", "shop.*"]}}).history
    assert history.scd2 == ["erp.sales.eu.orders.v2", "shop.*"]

    def plan(database: str | None, schema: str | None, table: str) -> TablePlan:
        return TablePlan(table_id_of(database, schema, table), database, schema, table, [("id", "int")], ["id"])

    assert is_selected(history.scd2, plan("erp", "sales.eu", "orders.v2"))
    assert is_selected(history.scd2, plan("shop", None, "orders.v2"))
    assert not is_selected(history.scd2, plan("erp", "sales", "orders"))


@pytest.mark.parametrize(
    ("data", "key", "fix"),
    [
        ({k: v for k, v in GOOD.items() if k != "lake"}, "lake", "lake: /data/lake"),
        (_with(kafka={"topics": ["t"]}), "kafka.bootstrap_servers", "bootstrap_servers: host:port"),
        (_with(kafka_topics=None), "kafka.topics", "topic_pattern"),
        (_with(kafka_topic_pattern="x.*"), "kafka.topics", "exactly one"),
        (_with(kafka_starting_offsets="yesterday"), "kafka.starting_offsets", "earliest"),
        (_with(format="dataworks-xml"), "format", "cdclake formats"),
        (_with(format=None), "format", "cdclake formats"),
        (_with(trigger={"every": 1}), "trigger.every", "spelling"),
        (_with(trigger={"processing_time": 5}), "trigger.processing_time", "10 seconds"),
        (_with(lakes="/x"), "lakes", "spelling"),
        (_with(keys={"crm.t": []}), "keys", "keys: {crm.audit_log: [id]}"),
        (_with(keys={"shop..t": ["id"]}), "keys", "shop.orders_*"),
        (_with(sequence_by={" shop.*": "v"}), "sequence_by", "`*` for every table"),
        (_with(ddl={"tables": {"shop.": "ignore"}}), "ddl.tables", "tables may be patterns"),
        (_with(deletion_vectors="sometimes"), "deletion_vectors", "`always` or `never`"),
        ({**GOOD, "kafka_order": "offset"}, "kafka_order", "leave it out to keep the order the lake records"),
        (_with(tables={"include": ["shop..orders"]}), "tables.include", "`*` matches any characters"),
        (_with(tables={"exclude": "shop.*"}), "tables.exclude", "lists of `db.table`"),
        (_with(tables={"only": ["shop.*"]}), "tables.only", "spelling"),
        (_with(routes=[{"tables": ["shop.*"], "to": "a.b.c"}]), "routes.0.to", "`db.table` or `table`"),
        (_with(routes=[{"tables": ["shop..x"], "to": "x"}]), "routes.0.tables", "first rule that matches"),
        (_with(routes=[{"tables": [], "to": "x"}]), "routes.0.tables", "placeholders"),
        (_with(routes=[{"to": "x"}]), "routes.0.tables", "`tables`"),
        (_with(routes={"shop.*": "x"}), "routes", "a list of rules"),
        (_with(history={"scd2": ["shop..orders"]}), "history.scd2", "names or patterns"),
        (_with(history={"changelog": [" crm.customer"]}), "history.changelog", "names or patterns"),
        (_with(history={"scd2": "crm.customer"}), "history.scd2", "`true` for every table"),
        # A misspelt option was ignored: the source's wall-clock times were read as UTC.
        (
            _with(format="canal-json", format_options={"canal-json": {"source_timezon": "+08:00"}}),
            "format_options.canal-json",
            "remove it, or use one of its options: source_timezone",
        ),
        (_with(format_options={"dataworks-json": {"zone": "UTC"}}), "format_options.dataworks-json", "no options"),
        (_with(format_options={"dts-canal-jsn": {}}), "format_options.dts-canal-jsn", "`cdclake formats`"),
        # A topic without a format was read and never applied; a misspelt topic left its own without one.
        (
            _with(format=None, kafka_topics=["t", "u"], topic_formats={"t": "dataworks-json"}),
            "topic_formats",
            "or set `format:` for the topics not listed",
        ),
        (_with(topic_formats={"tt": "canal-json"}), "topic_formats", "add it to kafka.topics"),
        # The bad format is the topic's, not the valid `format:`.
        (_with(topic_formats={"t": "dataworks"}), "topic_formats", "map each topic to a name"),
        # A misspelt key is also a missing one: the unknown key is named, with the key it most looks like.
        (_with(kafka={"bootstrap_server": "b:9092", "topics": ["t"]}), "kafka.bootstrap_server", "`bootstrap_servers`"),
        # The fix names a README section that exists.
        (_with(tombstone_retention_hours=-5), "tombstone_retention_hours", "README (Use: Stream from Kafka)"),
    ],
)
def test_errors_name_the_key_and_the_fix(data: dict, key: str, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.key == key
    assert fix in info.value.fix
    assert f"'{key}'" in str(info.value)


def test_kafka_options_pass_through_and_secrets_are_redacted() -> None:
    config = parse_config(
        _with(kafka_options={"security.protocol": "SASL_SSL", "sasl.jaas.config": "user=u password=hunter2"})
    )
    assert config.kafka.spark_options()["kafka.sasl.jaas.config"] == "user=u password=hunter2"
    redacted = config.kafka.redacted_options()
    assert redacted["kafka.sasl.jaas.config"] == "***"
    assert redacted["kafka.security.protocol"] == "SASL_SSL"
    assert "hunter2" not in str(redacted)
    assert config.kafka.spark_options()["includeHeaders"] == "true"
    with pytest.raises(ConfigError, match="includeHeaders` is cdclake's own"):
        parse_config(_with(kafka_options={"includeHeaders": "false"}))


def test_unreadable_and_invalid_yaml_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("lake: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just text")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(scalar)


def test_the_readme_examples_are_valid_configurations() -> None:
    """The README's pipeline example, and each of its fragments (table properties, partitioning, history, Debezium
    Avro's registry) added to it, load as they are documented."""
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    pipeline, *fragments = (yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", readme, re.S))
    config = parse_config(pipeline)
    assert (config.name, config.kafka.fail_on_data_loss) == ("orders-cdc", True)
    assert config.format_options == {"dts-canal-json": {"legacy_old_data_swap": "true"}}
    assert config.kafka.spark_options()["failOnDataLoss"] == "true"
    assert config.table_properties == {"shop.*": {"delta.enableChangeDataFeed": "true"}}
    assert config.partition_by == {"shop.orders": ["region"]}
    assert config.column_types == {"shop.orders_*": {"amount": "decimal(12,2)"}}
    fragment_keys = sorted(key for fragment in fragments for key in fragment)
    assert fragment_keys == ["column_types", "format", "format_options", "history", "partition_by", "table_properties"]
    with_fragments = [parse_config({**pipeline, **fragment}) for fragment in fragments]
    assert any(c.format_options.get("debezium-avro", {}).get("schema_registry_url") for c in with_fragments)
    assert any(c.history.changelog is True for c in with_fragments)
    retention = {"delta.logRetentionDuration": "interval 60 days"}
    assert any(c.table_properties.get("*") == retention for c in with_fragments)
    assert any(c.partition_by.get("logs.*") == ["event_date"] for c in with_fragments)
    assert any(c.column_types.get("erp.*") == {"created_at": "timestamp_ntz"} for c in with_fragments)


def test_format_options_take_the_names_and_aliases_each_format_reads() -> None:
    options = {"source_timezone": "Asia/Shanghai", "legacy_swap": "true"}  # legacy_swap: legacy_old_data_swap's alias
    config = parse_config(_with(format="dts-canal-json", format_options={"dts-canal-json": options}))
    assert config.format_options == {"dts-canal-json": options}


def test_settings_made_in_code_refuse_an_option_their_format_does_not_read() -> None:
    """`replay`, `dlq replay` and library users build settings without a configuration file: the same check."""
    from cdclake.pipeline import PipelineSettings

    with pytest.raises(ConfigError) as info:
        PipelineSettings(lake="/l", app_id="a", format_options={"ogg-json": {"insert_op": "A"}})
    assert info.value.key == "format_options.ogg-json"
    assert "ogg-json has no option insert_op" in str(info.value)
    assert "insert_op_key" in info.value.fix


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"canal-json": {"source_timezone": "Mars/Olympus"}}, "is not a time zone id or +hh:mm offset"),
        ({"dts-canal-json": {"legacy_swap": "yes"}}, "legacy_old_data_swap must be true or false, not 'yes'"),
        ({"qlik-avro": {"data_schemas": "[1]"}}, 'data_schemas is not a JSON object {"<schemaId>": <dataSchema>'),
        ({"qlik-avro": {"data_schema": '{"type": "string"}'}}, "data_schema is not an Avro record schema"),
        ({"qlik-avro": {"data_schemas": '{"7": "{"}'}}, "the data_schemas entry 7 is not an Avro record schema"),
    ],
)
def test_format_option_values_a_format_cannot_use_are_refused_when_loaded(options: dict, problem: str) -> None:
    """They stopped the first batch, with a stack trace."""
    with pytest.raises(ConfigError) as info:
        parse_config(_with(format_options=options))
    assert info.value.key == f"format_options.{next(iter(options))}"
    assert problem in info.value.problem
    assert info.value.fix == "correct the value (`cdclake formats` says what it takes)"


@pytest.mark.parametrize("interval", ["10 secs", "10s", "10", "1 min", "1 month", "-5 seconds"])
def test_a_trigger_interval_spark_does_not_read_is_refused_when_loaded(interval: str) -> None:
    """Spark's processing-time trigger reads a number and a unit spelt out; these stopped `run` at its start."""
    with pytest.raises(ConfigError) as info:
        parse_config(_with(trigger={"processing_time": interval}))
    assert str(info.value) == (
        f"config error at 'trigger.processing_time': {interval!r} is not an interval: a number and a unit (second, "
        "minute, hour...), spelt out. Fix: write it as Spark does, e.g. `10 seconds`, `1 minute 30 seconds`, "
        "`500 milliseconds`"
    )


@pytest.mark.parametrize(
    "interval", ["10 seconds", "1 second", "interval 1 minute 30 seconds", "1.5 Seconds", "0 seconds"]
)
def test_the_trigger_intervals_spark_reads_are_taken(interval: str) -> None:
    assert parse_config(_with(trigger={"processing_time": interval})).trigger.processing_time == interval


def test_local_lake_and_checkpoint_paths_are_made_absolute_and_uris_kept(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    kafka = {"bootstrap_servers": "b:9092", "topics": ["t"]}
    relative = parse_config({"lake": "lake", "checkpoint": "ck/x", "format": "canal-json", "kafka": kafka})
    assert (relative.lake, relative.checkpoint) == (str(tmp_path / "lake"), str(tmp_path / "ck" / "x"))
    remote = parse_config({"lake": "s3a://bucket/lake", "format": "canal-json", "kafka": kafka})
    assert (remote.lake, remote.checkpoint_location) == (
        "s3a://bucket/lake",
        "s3a://bucket/lake/_cdclake/checkpoints/cdclake",
    )
    assert parse_config({"lake": "file:/data/lake", "format": "canal-json", "kafka": kafka}).lake == "file:/data/lake"


def test_column_types_are_spelled_as_cdclake_spells_them() -> None:
    config = parse_config(
        _with(column_types={"dts.orders": {"amount": "DECIMAL(12, 2)", "qty": "Integer"}, "crm.*": {"born": "date"}})
    )
    assert config.column_types == {"dts.orders": {"amount": "decimal(12,2)", "qty": "int"}, "crm.*": {"born": "date"}}


@pytest.mark.parametrize(
    ("column_types", "message"),
    [
        ({"dts.orders": {"amount": "decimal(40,2)"}}, "column amount: 'decimal(40,2)' is not a type column_types can"),
        ({"dts.orders": {"amount": "decimal(2,3)"}}, "column amount: 'decimal(2,3)' is not a type"),
        ({"dts.orders": {"at": "timestamp"}}, "column at: 'timestamp' is not a type column_types can give; use one of"),
        ({"dts.orders": {"photo": "binary"}}, "column photo: 'binary' is not a type"),
        ({"dts.orders": {}}, "table dts.orders has no columns"),
        ({"dts.orders": {"a": "int", "A": "bigint"}}, "table dts.orders names a column twice"),
    ],
)
def test_a_column_type_cdclake_cannot_give_names_the_key_and_the_types(column_types: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(_with(column_types=column_types))
    text = str(error.value)
    assert "column_types" in text
    assert message in text
    assert "decimal(p,s)" in text  # the fix lists the types


def test_an_unquoted_decimal_in_a_yaml_flow_mapping_is_named_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(GOOD) + "column_types: {shop.orders: {amount: decimal(12,2)}}\n")
    fix = re.escape('quote a decimal type inside {...}, e.g. {amount: "decimal(12,2)"}')
    with pytest.raises(ConfigError, match=fix):
        load_config(path)


def test_settings_made_in_code_spell_column_types_as_cdclake_does_or_name_the_entry() -> None:
    from cdclake.pipeline import PipelineSettings

    settings = PipelineSettings(lake="/l", app_id="a", column_types={"t": {"amount": "NUMERIC(12, 2)"}})
    assert settings.column_types == {"t": {"amount": "decimal(12,2)"}}
    with pytest.raises(ConfigError) as info:
        PipelineSettings(lake="/l", app_id="a", column_types={"t": {"at": "timestamp"}})
    assert info.value.key == "column_types.t"
    assert "column at: 'timestamp' is not a type column_types can give" in str(info.value)
    # Two spellings of one column (--column-type t.A=int --column-type t.a=bigint) would make a map with one key twice.
    with pytest.raises(ConfigError, match="table t names a column twice"):
        PipelineSettings(lake="/l", app_id="a", column_types={"t": {"A": "int", "a": "bigint"}})
