"""``partition_by``: the partitioning of the lake tables cdclake creates (column values; for Iceberg also
transforms), kept through cdclake's rewrites (a renamed column's fields under its new name, a dropped column's
left out), with rows found by key whatever partition they are in."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdclake.config import parse_config
from cdclake.devtools.verify import read_table
from cdclake.exceptions import ConfigError, InputError
from cdclake.pipeline import PipelineSettings
from cdclake.runner import replay
from cdclake.sinks import lake_sink
from cdclake.sinks.partitioning import PartitionField, from_iceberg, on_columns, parse_field
from tests.test_ddl import ddl_message, row_message

BASE = {"lake": "/tmp/lake", "kafka": {"bootstrap_servers": "k:9092", "topics": ["t"]}, "format": "canal-json"}

TYPES = {"id": "bigint(20)", "region": "varchar(8)", "v": "varchar(8)"}


def test_fields_are_columns_or_iceberg_transforms_of_one() -> None:
    assert parse_field("region") == PartitionField("region")
    assert parse_field(" Days( created_at ) ") == PartitionField("created_at", "days")
    assert parse_field("bucket(16, id)") == PartitionField("id", "bucket", 16)
    assert str(PartitionField("id", "bucket", 16)) == "bucket(16, id)"
    for text in ("", "days(a, b)", "bucket(0, id)", "bucket(x, id)", "f(x", "truncate(4, name)"):
        assert parse_field(text) is None, text
    config = parse_config(
        {**BASE, "table_format": "iceberg", "partition_by": {"shop.orders": ["days(created_at)", "region"], "x": "y"}}
    )
    assert config.partition_by == {"shop.orders": ["days(created_at)", "region"], "x": ["y"]}  # one column: a list


@pytest.mark.parametrize(
    ("table_format", "fields", "problem"),
    [
        ("delta", ["days(created_at)"], "Delta tables are partitioned by column values"),
        ("iceberg", ["f(x"], "is not a partition field"),
        ("iceberg", ["_cdc_position"], "cdclake's own columns"),
        ("iceberg", ["region", "REGION"], "listed twice"),
        ("iceberg", ["days(ts)", "hours(ts)"], "two time transforms"),
        ("iceberg", [], "expected a list of columns"),
    ],
)
def test_a_field_a_table_cannot_have_is_refused_naming_the_entry(
    table_format: str, fields: list[str], problem: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({**BASE, "table_format": table_format, "partition_by": {"shop.orders": fields}})
    assert caught.value.key == "partition_by.shop.orders"
    assert problem in caught.value.problem
    # The same rule for library use.
    with pytest.raises(ConfigError):
        PipelineSettings(lake="/tmp/lake", app_id="a", table_format=table_format, partition_by={"t": fields})  # type: ignore[arg-type]


def test_the_replay_option_splits_fields_outside_parentheses() -> None:
    from cdclake.cli.main import _check_partition_by, _parse_partition_by

    parsed = _parse_partition_by(["shop.orders=bucket(16, id), region", "crm.*=day"])
    assert parsed == {"shop.orders": ["bucket(16, id)", "region"], "crm.*": ["day"]}
    with pytest.raises(InputError, match=r"expected db\.table=col1,col2"):
        _parse_partition_by(["shop.orders"])
    with pytest.raises(InputError, match=r"--partition-by shop\.orders: days\(ts\) is an Iceberg transform"):
        _check_partition_by({"shop.orders": ["days(ts)"]}, "delta")


def test_a_rewrite_keeps_the_fields_of_the_columns_it_keeps() -> None:
    fields = (PartitionField("Region"), PartitionField("ts", "days"), PartitionField("id", "bucket", 4))
    # Respelt as the table spells its columns; a renamed column's fields follow it; a dropped column's go.
    assert on_columns(fields, ["ID", "region", "event_ts"], {"ts": "event_ts"}) == (
        PartitionField("region"),
        PartitionField("event_ts", "days"),
        PartitionField("ID", "bucket", 4),
    )
    assert on_columns(fields, ["id"]) == (PartitionField("id", "bucket", 4),)
    assert from_iceberg("day", "ts") == PartitionField("ts", "days")
    assert from_iceberg("bucket[8]", "id") == PartitionField("id", "bucket", 8)
    assert from_iceberg("void", "id") is None


def test_a_transform_takes_the_types_iceberg_partitions_by() -> None:
    days, hours, bucket = PartitionField("ts", "days"), PartitionField("ts", "hours"), PartitionField("x", "bucket", 4)
    assert days.problem_with("date", "iceberg") is None
    assert days.problem_with("timestamp_ntz", "iceberg") is None
    assert days.problem_with("string", "iceberg") == "days(ts) needs a date or timestamp column, and ts is string"
    assert hours.problem_with("date", "iceberg") == "hours(ts) needs a timestamp column, and ts is date"
    assert bucket.problem_with("decimal(10,2)", "iceberg") is None
    assert bucket.problem_with("double", "iceberg") == "Iceberg does not bucket double values (bucket(4, x))"
    assert PartitionField("v").problem_with("double", "delta") is None
    assert PartitionField("v").problem_with("array<string>", "delta") == (
        "v is of type array<string>, which cannot partition a table"
    )


def _capture(tmp_path: Path, name: str, messages: list[str]) -> str:
    capture = tmp_path / name
    capture.write_text("".join(m + "\n" for m in messages), encoding="utf-8")
    return str(capture)


def _delta_partitioning(spark, path: str) -> list[str]:  # type: ignore[no-untyped-def]
    return list(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["partitionColumns"])


def _rows(path: str) -> list[tuple]:  # type: ignore[type-arg]
    """The user columns' values of the Delta table at ``path``, columns by name, read by delta-rs (not Spark)."""
    rows = read_table(path)
    columns = sorted(c for c in (rows[0] if rows else {}) if not c.startswith("_cdc_"))
    return sorted(tuple(row[c] for c in columns) for row in rows)


def _dry_run_counts_what_the_lake_tables_cannot_hold(tmp_path: Path, lake: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`replay --dry-run` over the lake of the test below (in this process: `replay` takes the active test session):
    the events a run would make dead letters because their lake table cannot hold a value, existing or new."""
    from typer.testing import CliRunner

    from cdclake.cli import main as cli_main

    messages = [
        row_message("INSERT", "tags", [{"id": "3", "region": "eu", "v": "/" * 90}], TYPES),
        # Declared as text, where the lake table's id is a bigint: `x1` does not fit it, `7` does.
        row_message(
            "INSERT",
            "orders",
            [{"id": "x1", "region": "eu", "v": "a"}, {"id": "7", "region": "eu", "v": "b"}],
            {**TYPES, "id": "varchar(8)"},
        ),
        # A table that a run would create partitioned by region.
        row_message("INSERT", "items_new", [{"id": "1", "region": "é" * 130, "v": "a"}], TYPES),
    ]
    capture = _capture(tmp_path, "dry.jsonl", messages)
    monkeypatch.delenv("COLUMNS", raising=False)  # one line per finding (cli.main._console)
    monkeypatch.setattr(cli_main, "out", cli_main._console())
    partitioned = [
        "--partition-by",
        "crm.tags=v",
        "--partition-by",
        "crm.items*=region",
        "--partition-by",
        "crm.orders=REGION",
    ]
    args = ["replay", "--dry-run", "--format", "canal-json", "--lake", lake, *partitioned, capture]
    dry = CliRunner().invoke(cli_main.app, args)
    assert dry.exit_code == 1, dry.output  # some would be dead letters
    found = [line for line in dry.stdout.splitlines() if "would be dead letters" in line]
    assert found == [
        "1 events of crm.items_new would be dead letters: value of partition column region names a folder of over "
        "255 bytes",
        "1 events of crm.orders would be dead letters: value of column id (declared string) does not fit the lake "
        "table's type bigint",
        "1 events of crm.tags would be dead letters: value of partition column v names a folder of over 255 bytes",
    ]


@pytest.mark.spark
def test_delta_tables_are_created_partitioned_and_keep_it_through_rewrites(spark, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    lake = str(tmp_path / "lake")
    partition_by = {
        "crm.orders": ["REGION"],
        "crm.items*": ["region"],
        "crm.notes": ["missing"],
        "crm.a*": ["region"],  # accounts, audits
        "crm.log": ["region"],
        "crm.tags": ["v"],
    }
    first = _capture(
        tmp_path,
        "a.jsonl",
        [
            row_message(
                "INSERT",
                "orders",
                [{"id": "1", "region": "eu", "v": "a"}, {"id": "2", "region": "us", "v": "b"}],
                TYPES,
            ),
            row_message("INSERT", "items", [{"id": "7", "region": "eu", "v": "i"}], TYPES),
            row_message("INSERT", "notes", [{"id": "1", "region": "eu", "v": "n"}], TYPES),
            # A partition column that is a key column, or one of a key-less table's (which keeps statistics on
            # its columns): Delta keeps no statistics on partition columns, and refuses a table that asks for them.
            row_message(
                "INSERT",
                "accounts",
                [{"id": "1", "region": "eu", "v": "a"}, {"id": "2", "region": "eu", "v": "b"}],
                TYPES,
                keys=["region", "id"],
            ),
            # An update of a key column: the old key's row goes, the new key's row comes, in another partition.
            row_message(
                "UPDATE",
                "accounts",
                [{"id": "1", "region": "us", "v": "a"}],
                TYPES,
                old=[{"region": "eu"}],
                keys=["region", "id"],
            ),
            row_message("INSERT", "log", [{"id": "1", "region": "eu", "v": "l"}], TYPES, keys=[]),
            # An update that moves a row to another partition, and a delete: found by key, wherever they are.
            row_message(
                "UPDATE", "orders", [{"id": "1", "region": "us", "v": "a2"}], TYPES, old=[{"region": "eu", "v": "a"}]
            ),
            row_message("DELETE", "orders", [{"id": "2", "region": "us", "v": "b"}], TYPES),
            row_message("INSERT", "orders", [{"id": "3", "region": "apac", "v": "c"}], TYPES),
            # Partition folder names of up to 255 bytes: `v=` and 120 two-byte characters (242) lands; 90 slashes,
            # each written %2F (272), would fail the batch's write: a dead letter, and the other rows land.
            row_message(
                "INSERT",
                "tags",
                [{"id": "1", "region": "eu", "v": "é" * 120}, {"id": "2", "region": "eu", "v": "/" * 90}],
                TYPES,
            ),
        ],
    )
    replay(spark, lake=lake, format_name="canal-json", paths=[first], partition_by=partition_by)
    assert _rows(f"{lake}/crm/tags") == [(1, "eu", "é" * 120)]
    assert [r["reason"] for r in spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").collect()] == [
        "value of partition column v names a folder of 272 bytes, over the 255 a file system holds: the row cannot be "
        "stored in its partition (correct the value at the source, or partition the lake table by another column), "
        "then replay this dead letter"
    ]
    _dry_run_counts_what_the_lake_tables_cannot_hold(tmp_path, lake, monkeypatch)
    orders = f"{lake}/crm/orders"
    assert _delta_partitioning(spark, orders) == ["region"]  # spelt as the table spells it
    assert _delta_partitioning(spark, f"{lake}/crm/items") == ["region"]
    # A partition column the table does not have: created without it, its rows land.
    assert _delta_partitioning(spark, f"{lake}/crm/notes") == []
    assert _rows(f"{lake}/crm/notes") == [(1, "eu", "n")]
    assert _rows(orders) == [(1, "us", "a2"), (3, "apac", "c")]
    for table in ("accounts", "log"):
        assert _delta_partitioning(spark, f"{lake}/crm/{table}") == ["region"]
    assert _rows(f"{lake}/crm/accounts") == [(1, "us", "a"), (2, "eu", "b")]
    assert _rows(f"{lake}/crm/log") == [(1, "eu", "l")]
    assert {row[0] for row in spark.sql(f"SELECT DISTINCT region FROM delta.`{orders}`").collect()} == {"us", "apac"}

    renamed = {"id": "bigint(20)", "area": "varchar(8)", "v": "varchar(8)"}
    second = _capture(
        tmp_path,
        "b.jsonl",
        [
            ddl_message("orders", "ALTER TABLE orders RENAME COLUMN region TO area"),
            row_message("INSERT", "orders", [{"id": "4", "area": "eu", "v": "d"}], renamed),
            ddl_message("orders", "ALTER TABLE orders DROP COLUMN v"),
            ddl_message("items", "RENAME TABLE items TO items_v2", kind="RENAME"),
            # A dropped partition column leaves the partitioning: the table is rewritten without it.
            ddl_message("log", "ALTER TABLE log DROP COLUMN region"),
            # A table created by a CREATE TABLE statement, before any row.
            ddl_message("audits", "CREATE TABLE audits (id bigint primary key, region varchar(8))", "CREATE"),
        ],
    )
    replay(spark, lake=lake, format_name="canal-json", paths=[second], partition_by=partition_by)
    assert _delta_partitioning(spark, orders) == ["area"]
    assert _rows(orders) == [("apac", 3), ("eu", 4), ("us", 1)]  # (area, id)
    # The renamed table's lake table is created with its name's partitioning and keeps it when the rows move in.
    assert _delta_partitioning(spark, f"{lake}/crm/items_v2") == ["region"]
    assert _rows(f"{lake}/crm/items_v2") == [(7, "eu", "i")]

    assert _delta_partitioning(spark, f"{lake}/crm/audits") == ["region"]
    assert _delta_partitioning(spark, f"{lake}/crm/log") == []
    assert _rows(f"{lake}/crm/log") == [(1, "l")]
    outcomes = [
        row["outcome"]
        for row in spark.read.format("delta").load(f"{lake}/_cdclake/schema_changes").collect()
        if "DROP COLUMN region" in row["ddl"]
    ]
    assert outcomes == ["applied: column region dropped; the table is no longer partitioned by region"]


@pytest.mark.spark
def test_iceberg_tables_take_transforms_and_keep_them_through_a_rename(spark, tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    types = {"id": "bigint(20)", "ts": "datetime", "v": "varchar(8)"}
    partition_by = {"crm.events*": ["days(ts)", "bucket(4, id)"], "crm.flags": ["hours(v)"], "crm.tags": ["v"]}
    first = _capture(
        tmp_path,
        "a.jsonl",
        [
            row_message(
                "INSERT",
                "events",
                [
                    {"id": "1", "ts": "2026-11-30 10:00:00", "v": "a"},
                    {"id": "2", "ts": "2026-12-01 09:00:00", "v": "b"},
                ],
                types,
            ),
            # Moved to another day's partition: found by key.
            row_message(
                "UPDATE",
                "events",
                [{"id": "1", "ts": "2026-12-01 11:00:00", "v": "a2"}],
                types,
                old=[{"ts": "2026-11-30 10:00:00"}],
            ),
            # hours() of a string column: the table is created without that field, and its rows land.
            row_message("INSERT", "flags", [{"id": "1", "ts": "2026-12-01 09:00:00", "v": "f"}], types),
            # Iceberg writes each byte of a two-byte character as %XX: `v=` and 42 of them take 254 bytes, 43 take 260
            # (a dead letter; Delta would hold both).
            row_message(
                "INSERT",
                "tags",
                [{"id": "1", "ts": None, "v": "é" * 42}, {"id": "2", "ts": None, "v": "é" * 43}],
                types,
            ),
        ],
    )
    replay(spark, lake=lake, format_name="canal-json", paths=[first], partition_by=partition_by, table_format="iceberg")
    sink = lake_sink(spark, lake, "iceberg")
    assert sink.partitioning("crm", None, "events") == (PartitionField("ts", "days"), PartitionField("id", "bucket", 4))
    assert sink.partitioning("crm", None, "flags") == ()
    assert sink.read("crm", "flags").count() == 1
    assert [(r["id"], r["v"]) for r in sink.read("crm", "tags").collect()] == [(1, "é" * 42)]
    reasons = [r["reason"] for r in spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").collect()]
    assert [r.split(",")[0] for r in reasons] == ["value of partition column v names a folder of 260 bytes"]
    second = _capture(
        tmp_path,
        "b.jsonl",
        [
            ddl_message("events", "ALTER TABLE events RENAME COLUMN ts TO event_ts"),
            ddl_message("events_v2", "CREATE TABLE events_v2 (id bigint primary key, ts datetime)", "CREATE"),
        ],
    )
    replay(
        spark, lake=lake, format_name="canal-json", paths=[second], partition_by=partition_by, table_format="iceberg"
    )
    sink = lake_sink(spark, lake, "iceberg")
    assert sink.partitioning("crm", None, "events") == (
        PartitionField("event_ts", "days"),
        PartitionField("id", "bucket", 4),
    )
    # A table created by a CREATE TABLE statement, before any row.
    assert sink.partitioning("crm", None, "events_v2") == (
        PartitionField("ts", "days"),
        PartitionField("id", "bucket", 4),
    )
    rows = sink.read("crm", "events").orderBy("id").collect()
    assert [(row["id"], str(row["event_ts"]), row["v"]) for row in rows] == [
        (1, "2026-12-01 11:00:00", "a2"),
        (2, "2026-12-01 09:00:00", "b"),
    ]
