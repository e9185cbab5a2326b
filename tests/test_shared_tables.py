"""Tables of one name in several schemas of a database share a lake table (README "What lands in the lake"). Its
rows do not say which source table wrote them, so clearing one source table (TRUNCATE, DROP TABLE, the old name of
a RENAME) would delete the other's rows: such a clear becomes a dead letter with the reason instead, and the rows of
both stay. So does a clear of a source table that never had a row there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from cdclake.runner import replay

pytestmark = pytest.mark.spark


def _dataworks(op: str, schema: str, sequence: int, row_id: int | None = None, ddl: str | None = None) -> str:
    """A DataWorks message of PostgreSQL table ``shop.<schema>.orders``."""
    message: dict[str, Any] = {
        "schema": {
            "dataColumn": [{"name": "id", "type": "LONG"}, {"name": "v", "type": "STRING"}],
            "primaryKey": ["id"],
            "source": {"dbType": "PostgreSQL", "dbName": "shop", "schemaName": schema, "tableName": "orders"},
        },
        "payload": {
            "before": None,
            "after": None if row_id is None else {"dataColumn": {"id": row_id, "v": schema}},
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
