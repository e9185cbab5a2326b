"""Tables of one name in several schemas of a database share a lake table (README "What lands in the lake"). Its
rows do not say which source table wrote them, so clearing one source table (TRUNCATE, DROP TABLE, the old name of
a RENAME) would delete the other's rows: such a clear becomes a dead letter with the reason instead, and the rows of
both stay. So does a clear of a source table that never had a row there. Dropping or renaming a column of one
source table would take the other's values too: it is recorded as not applied, and the column stays."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from cdclake.runner import replay

pytestmark = pytest.mark.spark


def _dataworks(
    op: str,
    schema: str,
    sequence: int,
    row_id: int | None = None,
    ddl: str | None = None,
    values: dict[str, Any] | None = None,
) -> str:
    """A DataWorks message of PostgreSQL table ``shop.<schema>.orders``: columns ``id`` and ``v`` (= the schema's
    name), or ``id`` and ``values``."""
    row = {"id": row_id, **(values if values is not None else {"v": schema})}
    types = {int: "LONG", str: "STRING"}  # a DDL message's id is None: declared LONG like the others
    message: dict[str, Any] = {
        "schema": {
            "dataColumn": [{"name": name, "type": types.get(type(value), "LONG")} for name, value in row.items()],
            "primaryKey": ["id"],
            "source": {"dbType": "PostgreSQL", "dbName": "shop", "schemaName": schema, "tableName": "orders"},
        },
        "payload": {
            "before": None,
            "after": None if row_id is None else {"dataColumn": row},
            "sequenceId": str(sequence),
            "timestamp": {"eventTime": 1_709_288_131_000 + sequence},
            "op": op,
            "ddl": None if ddl is None else {"text": ddl},
        },
        "version": "1.0.0",
    }
    return json.dumps(message)


def test_a_clear_of_one_source_table_never_deletes_the_rows_of_another(spark: SparkSession, tmp_path: Path) -> None:
    capture = tmp_path / "capture.jsonl"
    lines = [
        _dataworks("INSERT", "public", 1, row_id=1),
        _dataworks("INSERT", "archive", 2, row_id=2),
        # second batch
        _dataworks("TRUNCATE", "public", 3, ddl="TRUNCATE TABLE public.orders"),
        _dataworks("ERASE", "public", 4, ddl="DROP TABLE public.orders"),
        # third batch: a schema whose table never had a row shares the lake table too
        _dataworks("TRUNCATE", "staging", 5, ddl="TRUNCATE TABLE staging.orders"),
        _dataworks("INSERT", "public", 6, row_id=3),
    ]
    capture.write_text("\n".join(lines) + "\n", encoding="utf-8")
    lake = str(tmp_path / "lake")
    results = replay(spark, lake=lake, format_name="dataworks-json", paths=[str(capture)], batch_lines=2)

    rows = spark.read.format("delta").load(f"{lake}/shop/orders").select("id", "v").collect()
    assert sorted(tuple(r) for r in rows) == [(1, "public"), (2, "archive"), (3, "public")]
    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").orderBy("offset").collect()
    assert [r["reason"] for r in dead] == [
        "TRUNCATE of shop.public.orders not applied: its lake table also holds the rows of shop.archive.orders, "
        "which it would delete",
        "DDL not applied: the lake table of shop.public.orders also holds the rows of shop.archive.orders, which "
        "drop_table would delete",
        "TRUNCATE of shop.staging.orders not applied: its lake table also holds the rows of shop.archive.orders, "
        "which it would delete",
    ]
    assert [r.dead_letters for r in results] == [0, 2, 1]
    progress = spark.read.format("delta").load(f"{lake}/_cdclake/progress").where("scope = 'table' AND batch_id = 1")
    # the refused TRUNCATE is a dead letter, not a TRUNCATE of the table (the DDL event is recorded as received)
    assert {r["schema"]: r["ops"] for r in progress.collect()} == {"public": {"DDL": 1}}


def test_a_column_change_of_one_source_table_keeps_the_column_of_another(spark: SparkSession, tmp_path: Path) -> None:
    capture = tmp_path / "capture.jsonl"
    lines = [
        _dataworks("INSERT", "public", 1, row_id=1, values={"v": "public", "n": 10}),
        _dataworks("INSERT", "archive", 2, row_id=2, values={"v": "archive", "n": 20}),
        # second batch: public drops v and renames n to m
        _dataworks("ALTER", "public", 3, ddl="ALTER TABLE public.orders DROP COLUMN v"),
        _dataworks("ALTER", "public", 4, ddl="ALTER TABLE public.orders RENAME COLUMN n TO m"),
        # third batch: both go on with their own columns
        _dataworks("INSERT", "public", 5, row_id=3, values={"m": 30}),
        _dataworks("INSERT", "archive", 6, row_id=4, values={"v": "archive", "n": 40}),
    ]
    capture.write_text("\n".join(lines) + "\n", encoding="utf-8")
    lake = str(tmp_path / "lake")
    results = replay(spark, lake=lake, format_name="dataworks-json", paths=[str(capture)], batch_lines=2)

    rows = spark.read.format("delta").load(f"{lake}/shop/orders").select("id", "v", "n", "m").collect()
    assert sorted(tuple(r) for r in rows) == [
        (1, "public", 10, None),
        (2, "archive", 20, None),
        (3, None, None, 30),
        (4, "archive", 40, None),
    ]
    outcomes = [
        (r["ddl"], r["outcome"])
        for r in spark.read.format("delta").load(f"{lake}/_cdclake/schema_changes").orderBy("position").collect()
    ]
    assert outcomes == [
        (
            "ALTER TABLE public.orders DROP COLUMN v",
            "not applied: the lake table also holds the rows of shop.archive.orders, which would lose column v too",
        ),
        (
            "ALTER TABLE public.orders RENAME COLUMN n TO m",
            "not applied: the lake table also holds the rows of shop.archive.orders, whose column n would be "
            "renamed too; this table's values arrive as column m",
        ),
    ]
    assert [r.dead_letters for r in results] == [0, 0, 0]
