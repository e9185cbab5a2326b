"""``table_properties``: the lake tables' own properties (Delta's ``delta.*``, Iceberg's, or the owner's), set when
cdclake creates a table and on an existing table whose values differ; the properties cdclake sets itself, or that
would stop it applying changes, are refused with the setting's key named."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdclake.config import parse_config
from cdclake.devtools.verify import read_table
from cdclake.exceptions import ConfigError
from cdclake.pipeline import PipelineSettings
from cdclake.runner import replay
from cdclake.sinks import lake_sink
from tests.test_ddl import ddl_message, row_message

TYPES = {"id": "bigint(20)", "v": "varchar(8)"}

BASE = {"lake": "/tmp/lake", "kafka": {"bootstrap_servers": "k:9092", "topics": ["t"]}, "format": "canal-json"}


def test_yaml_scalars_become_the_text_a_property_holds() -> None:
    config = parse_config(
        {**BASE, "table_properties": {"shop.*": {"delta.enableChangeDataFeed": True, "delta.checkpointInterval": 20}}}
    )
    assert config.table_properties == {
        "shop.*": {"delta.enableChangeDataFeed": "true", "delta.checkpointInterval": "20"}
    }


@pytest.mark.parametrize(
    ("table_format", "key", "hint"),
    [
        ("delta", "delta.enableDeletionVectors", "use the `deletion_vectors` setting"),
        ("delta", "DELTA.appendOnly", "refuses the MERGEs"),
        ("delta", "delta.columnMapping.mode", "column mapping"),
        ("delta", "delta.constraints.positive", "ALTER TABLE ... ADD CONSTRAINT"),
        ("delta", "cdclake.keyColumns", "cdclake's own properties"),
        ("iceberg", "format-version", "format version 2"),
        ("iceberg", "write.delete.mode", "merge-on-read"),
        ("iceberg", "delta.enableChangeDataFeed", "does nothing on an Iceberg table"),
    ],
)
def test_properties_cdclake_sets_or_that_would_stop_it_are_refused(table_format: str, key: str, hint: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({**BASE, "table_format": table_format, "table_properties": {"shop.orders": {key: "x"}}})
    assert caught.value.key == f"table_properties.shop.orders.{key}"
    assert hint in caught.value.problem
    assert caught.value.fix == "remove it from `table_properties`"
    # The same rule for library use.
    with pytest.raises(ConfigError):
        PipelineSettings(lake="/tmp/lake", app_id="a", table_format=table_format, table_properties={"t": {key: "x"}})  # type: ignore[arg-type]


def test_a_property_spark_keeps_for_its_catalog_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({**BASE, "table_properties": {"shop.orders": {"Owner": "me"}}})
    assert caught.value.key == "table_properties.shop.orders.Owner"
    assert "Spark keeps this table property" in caught.value.problem


def test_an_entry_without_properties_or_not_a_mapping_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"table shop\.orders has no properties"):
        parse_config({**BASE, "table_properties": {"shop.orders": {}}})
    with pytest.raises(ConfigError) as caught:
        parse_config({**BASE, "table_properties": {"shop.orders": ["delta.appendOnly"]}})
    assert caught.value.key.startswith("table_properties")


def _capture(tmp_path: Path, name: str, messages: list[str]) -> str:
    capture = tmp_path / name
    capture.write_text("".join(m + "\n" for m in messages), encoding="utf-8")
    return str(capture)


def _properties(spark, table: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES {table}").collect()}


@pytest.mark.spark
def test_delta_tables_get_their_entrys_properties_and_a_changed_value_reaches_existing_tables(
    spark, tmp_path: Path
) -> None:
    lake = str(tmp_path / "lake")
    first = _capture(
        tmp_path,
        "a.jsonl",
        [
            row_message("INSERT", "orders", [{"id": "1", "v": "a"}, {"id": "2", "v": "b"}], TYPES),
            row_message("INSERT", "notes", [{"id": "1", "v": "n"}], TYPES),
        ],
    )
    replay(
        spark,
        lake=lake,
        format_name="canal-json",
        paths=[first],
        table_properties={
            # The most specific entry wins, as for `keys`; entries are not combined.
            "crm.orders": {
                "delta.enableChangeDataFeed": "true",
                "team": "orders-team",
                "delta.feature.allowColumnDefaults": "supported",
            },
            "crm.*": {"delta.logRetentionDuration": "interval 60 days"},
        },
    )
    orders, notes = f"delta.`{lake}/crm/orders`", f"delta.`{lake}/crm/notes`"
    assert {k: v for k, v in _properties(spark, orders).items() if k in ("delta.enableChangeDataFeed", "team")} == {
        "delta.enableChangeDataFeed": "true",
        "team": "orders-team",
    }
    assert "delta.logRetentionDuration" not in _properties(spark, orders)
    assert _properties(spark, notes)["delta.logRetentionDuration"] == "interval 60 days"
    assert "cdclake.source" in _properties(spark, orders)  # cdclake's own are kept beside them
    # As created, nothing to set again: a run would not commit anything (Delta spells the feature's key otherwise
    # once it has checked it, delta.feature.allowcolumndefaults, than SHOW TBLPROPERTIES does).
    created_with = {
        "crm.orders": {"delta.enableChangeDataFeed": "true", "delta.feature.allowColumnDefaults": "supported"}
    }
    assert lake_sink(spark, lake, table_properties=created_with).properties_to_set("crm", None, "orders") == {}

    second = _capture(
        tmp_path,
        "b.jsonl",
        [row_message("UPDATE", "orders", [{"id": "1", "v": "a2"}], TYPES, old=[{"v": "a"}])],
    )
    replay(
        spark,
        lake=lake,
        format_name="canal-json",
        paths=[second],
        table_properties={"crm.orders": {"delta.enableChangeDataFeed": "true", "team": "billing"}},
    )
    assert _properties(spark, orders)["team"] == "billing"
    # A property no longer in the setting is left as the table has it.
    assert _properties(spark, notes)["delta.logRetentionDuration"] == "interval 60 days"
    assert sorted(read_table(f"{lake}/crm/orders"), key=lambda r: r["id"]) == [
        {"id": 1, "v": "a2"},
        {"id": 2, "v": "b"},
    ]
    # The change data feed that the property turned on records cdclake's MERGE.
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(f"{lake}/crm/orders")
    )
    changes = sorted((r["id"], r["v"], r["_change_type"]) for r in feed.collect())
    assert changes == [
        (1, "a", "insert"),
        (1, "a", "update_preimage"),
        (1, "a2", "update_postimage"),
        (2, "b", "insert"),
    ]


@pytest.mark.spark
def test_a_property_delta_does_not_know_stops_the_pipeline_before_it_writes(spark, tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    capture = _capture(tmp_path, "a.jsonl", [row_message("INSERT", "orders", [{"id": "1", "v": "a"}], TYPES)])
    for properties, reason in [
        ({"delta.enableChangeDataFeeds": "true"}, "delta.enableChangeDataFeeds"),
        ({"delta.checkpointInterval": "-3"}, "delta.checkpointInterval needs to be a positive integer"),
    ]:
        with pytest.raises(ConfigError) as caught:
            replay(spark, lake=lake, format_name="canal-json", paths=[capture], table_properties={"crm.*": properties})
        assert caught.value.key == "table_properties.crm.*"
        assert reason in caught.value.problem
    assert not Path(lake).exists()


@pytest.mark.spark
def test_iceberg_tables_get_their_entrys_properties_and_a_changed_value_reaches_existing_tables(
    spark, tmp_path: Path
) -> None:
    from cdclake.sinks.iceberg import IcebergSink

    lake = str(tmp_path / "lake")
    capture = _capture(tmp_path, "a.jsonl", [row_message("INSERT", "orders", [{"id": "1", "v": "a"}], TYPES)])
    settings = {"write.parquet.compression-codec": "zstd", "team": "orders-team"}
    replay(
        spark,
        lake=lake,
        format_name="canal-json",
        paths=[capture],
        table_format="iceberg",
        table_properties={"crm.orders": settings},
    )
    table = IcebergSink(spark, lake).identifier("crm", None, "orders")
    stored = _properties(spark, table)
    assert {k: stored.get(k) for k in settings} == settings
    assert stored["write.merge.mode"] == "merge-on-read"  # cdclake's own are kept beside them
    # The row sets the changed value (once per table and process, before its first write); the dropped column
    # then rewrites the table (IcebergSink.rewrite), which keeps the properties.
    dropped = _capture(
        tmp_path,
        "b.jsonl",
        [
            row_message("INSERT", "orders", [{"id": "2", "v": "b"}], TYPES),
            ddl_message("orders", "ALTER TABLE orders DROP COLUMN v"),
        ],
    )
    replay(
        spark,
        lake=lake,
        format_name="canal-json",
        paths=[dropped],
        table_format="iceberg",
        table_properties={"crm.orders": {**settings, "team": "billing"}},
    )
    stored = _properties(spark, table)
    assert {k: stored.get(k) for k in settings} == {**settings, "team": "billing"}
    assert sorted(r["id"] for r in spark.table(table).select("id").collect()) == [1, 2]
    assert "v" not in spark.table(table).columns
