"""``routes`` end to end: three MySQL shards ``shop.orders_0..2`` (disjoint keys) merged into lake table
``shop.orders``, and ``crm.customer`` renamed to ``ods.crm_customer``, from a seeded random DataWorks stream replayed
into Delta (in three batches) and Iceberg (in one) lake tables. The lake tables equal an independent reference built
from the same operations; a TRUNCATE of one shard becomes a dead letter (it would delete the other shards' rows)
while the renamed table's TRUNCATE applies; a shard's ADD COLUMN changes the merged table; a RENAME of a shard within
its pattern leaves the rows where they are; the shards' key columns come from a ``keys`` pattern; their changes of a
batch are one MERGE; the history table, the progress rows and ``cdclake maintain`` follow the routes. A crm table
named in 255 characters (the longest identifier) lands too, although its routed name is longer than a folder name
may be: it gets a shortened one."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdclake.maintain import maintain_lake
from cdclake.runner import replay
from cdclake.sinks import lake_sink
from cdclake.sinks.delta import REWRITE_METADATA
from cdclake.tables import TableRoutes

pytestmark = pytest.mark.spark

ROUTES = TableRoutes.of([(["shop.orders_*"], "shop.orders"), (["crm.*"], "ods.crm_{table}")])
SHARDS = ("orders_0", "orders_1", "orders_2")
LONG_TABLE = "contacts_" + "n" * 246
"""255 characters: routed to ``ods.crm_<it>``, 259, past the 255 bytes of a folder name."""
Row = dict[str, Any]


class Stream:
    """DataWorks messages of a MySQL source, and the rows each lake table should end with (the reference)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.orders: dict[int, Row] = {}  # lake shop.orders: every shard's rows, keys disjoint
        self.customers: dict[int, Row] = {}  # lake ods.crm_customer
        self.contacts: dict[int, Row] = {}  # lake ods.crm_<LONG_TABLE>, shortened
        self.columns = [("id", "LONG"), ("v", "STRING")]

    def _message(self, op: str, database: str, table: str, row: Row | None, *, ddl: str | None = None) -> None:
        sequence = len(self.lines) + 1
        image = None if row is None else {"dataColumn": {k: None if v is None else str(v) for k, v in row.items()}}
        self.lines.append(
            json.dumps(
                {
                    "schema": {
                        "dataColumn": [{"name": n, "type": t} for n, t in self.columns] if row else [],
                        # The shards' key comes from a `keys` pattern.
                        "primaryKey": [] if table.startswith("orders_") else ["id"],
                        "source": {"dbType": "MySQL", "dbName": database, "schemaName": None, "tableName": table},
                    },
                    "payload": {
                        "before": image if op == "DELETE" else None,
                        "after": None if op == "DELETE" else image,
                        "sequenceId": str(1_000_000 + sequence),
                        "timestamp": {"eventTime": 1_709_288_131_000 + sequence},
                        "op": op,
                        "ddl": None if ddl is None else {"text": ddl},
                    },
                    "version": "1.0.0",
                }
            )
        )

    def change(self, rng: random.Random, database: str, table: str, rows: dict[int, Row], keys: range) -> None:
        key = rng.choice(keys)
        value = f"{table}-{rng.randrange(10_000)}"
        if key in rows and rng.random() < 0.3:
            self._message("DELETE", database, table, rows.pop(key))
            return
        row: Row = {"id": key, "v": value}
        if len(self.columns) == 3:
            row["note"] = rng.choice([None, f"n{key}"])
        self._message("UPDATE_AFTER" if key in rows else "INSERT", database, table, row)
        rows[key] = row

    def ddl(self, op: str, database: str, table: str, text: str) -> None:
        self._message(op, database, table, None, ddl=text)


def _stream(seed: int) -> Stream:
    rng = random.Random(seed)
    stream = Stream()
    shard_keys = {shard: range(i * 1000, i * 1000 + 40) for i, shard in enumerate(SHARDS)}

    def burst(n: int, shards: tuple[str, ...] = SHARDS) -> None:
        for _ in range(n):
            if rng.random() < 0.25:
                stream.change(rng, "crm", "customer", stream.customers, range(1, 30))
            else:
                shard = rng.choice(shards)
                stream.change(rng, "shop", shard, stream.orders, shard_keys[shard])

    # Its own random numbers, so the other tables' stream stays as it was.
    contacts_rng = random.Random(seed + 1)
    for _ in range(2):
        stream.change(contacts_rng, "crm", LONG_TABLE, stream.contacts, range(1, 4))
    burst(150)
    # orders_0's TRUNCATE would delete the rows of orders_1 and orders_2 too: refused, so the reference keeps them.
    stream.ddl("TRUNCATE", "shop", "orders_0", "TRUNCATE TABLE orders_0")
    stream.ddl("TRUNCATE", "crm", "customer", "TRUNCATE TABLE customer")
    stream.customers.clear()
    burst(60)
    stream.ddl("ALTER", "shop", "orders_1", "ALTER TABLE orders_1 ADD COLUMN note VARCHAR(20)")
    for row in stream.orders.values():
        row.setdefault("note", None)
    for row in (*stream.customers.values(), *stream.contacts.values()):
        row.setdefault("note", None)
    stream.columns.append(("note", "STRING"))
    burst(60)
    stream.change(contacts_rng, "crm", LONG_TABLE, stream.contacts, range(1, 4))
    # Both names match shop.orders_*: the rows stay in shop.orders, and later changes of orders_2_old land there.
    stream.ddl("RENAME", "shop", "orders_2", "RENAME TABLE orders_2 TO orders_2_old")
    shard_keys["orders_2_old"] = shard_keys.pop("orders_2")
    burst(80, ("orders_0", "orders_1", "orders_2_old"))
    return stream


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_routed_tables_land_where_the_routes_say(spark: SparkSession, tmp_path: Path, table_format: str) -> None:
    stream = _stream(seed=41)
    capture = tmp_path / "capture.jsonl"
    capture.write_text("\n".join(stream.lines) + "\n", encoding="utf-8")
    lake = str(tmp_path / "lake")
    results = replay(
        spark,
        lake=lake,
        format_name="dataworks-json",
        paths=[str(capture)],
        routes=ROUTES,
        keys={"shop.orders_*": ["id"]},
        # Delta: three batches; Iceberg (whose routing is only its naming) one, for the suite's time.
        batch_lines=120 if table_format == "delta" else 400,
        changelog=["crm.c*"],  # a pattern, as in `tables`
        table_format=table_format,  # type: ignore[arg-type]
    )
    assert len(results) == (3 if table_format == "delta" else 1)  # 357 messages

    sink = lake_sink(spark, lake, table_format)  # type: ignore[arg-type]  # no routes: reads by lake name
    for (database, table), reference in (
        (("shop", "orders"), stream.orders),
        (("ods", "crm_customer"), stream.customers),
        (("ods", f"crm_{LONG_TABLE}"), stream.contacts),
    ):
        rows = sink.read(database, table).select("id", "v", "note").collect()
        assert {r["id"]: r.asDict() for r in rows} == {k: {"note": None, **row} for k, row in reference.items()}
        assert reference
    if table_format == "delta":
        # The shards share one write per batch and DDL segment (a MERGE, or a small table's rewrite): batch 1; batch 2
        # before and after the ALTER; batch 3 before and after the RENAME (one write per shard made 15).
        history = spark.sql(f"DESCRIBE HISTORY delta.`{lake}/shop/orders`")
        written = history.where((F.col("operation") == "MERGE") | (F.col("userMetadata") == REWRITE_METADATA))
        assert written.count() == 5
    routed_long = f"crm_{LONG_TABLE}"
    contacts = f"{routed_long[:200]}_{hashlib.sha1(routed_long.encode()).hexdigest()[:8]}"
    assert len(contacts) == 209
    lake_dirs = {p.name for p in Path(lake).iterdir()} - {"_cdclake"}
    assert lake_dirs == {"shop", "ods"}
    assert {p.name for p in (Path(lake) / "shop").iterdir()} == {"orders"}
    assert sink.history_path("changelog", "ods", None, "crm_customer") == lake_sink(
        spark,
        lake,
        table_format,
        routes=ROUTES,  # type: ignore[arg-type]
    ).history_path("changelog", "crm", None, "customer")
    changelog = sink.read_path(sink.history_path("changelog", "ods", None, "crm_customer"))
    assert changelog.where("_cdc_op = 'TRUNCATE'").count() == 1

    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").collect()
    assert [r["reason"] for r in dead] == [
        "TRUNCATE of shop.orders_0 not applied: its lake table also holds the rows of shop.orders_1, "
        "which it would delete"
    ]
    outcomes = {
        r["ddl"]: r["outcome"] for r in spark.read.format("delta").load(f"{lake}/_cdclake/schema_changes").collect()
    }
    assert outcomes == {
        "TRUNCATE TABLE orders_0": "dead letter: TRUNCATE of shop.orders_0 not applied: its lake table also holds "
        "the rows of shop.orders_1, which it would delete",
        "TRUNCATE TABLE customer": "applied: truncate",
        "ALTER TABLE orders_1 ADD COLUMN note VARCHAR(20)": "applied: column note string added",
        "RENAME TABLE orders_2 TO orders_2_old": "nothing to do: both names land in the same lake table",
    }

    progress = spark.read.format("delta").load(f"{lake}/_cdclake/progress").where("scope = 'table'")
    recorded = {(r["database"], r["table"]): r["lake_table"] for r in progress.select(*_IDENT).distinct().collect()}
    assert recorded == {
        **{("shop", shard): "shop/orders" for shard in (*SHARDS, "orders_2_old")},
        ("crm", "customer"): "ods/crm_customer",
        ("crm", LONG_TABLE): f"ods/{contacts}",
    }
    maintained = {
        (m.kind, m.path.removeprefix(lake + "/")) for m in maintain_lake(spark, lake, table_format=table_format)
    }  # type: ignore[arg-type]
    assert {m for m in maintained if m[0] != "bookkeeping"} == {
        ("lake", "shop/orders"),
        ("lake", "ods/crm_customer"),
        ("lake", f"ods/{contacts}"),
        ("changelog", sink.history_path("changelog", "ods", None, "crm_customer").removeprefix(lake + "/")),
        ("changelog", sink.history_path("changelog", "ods", None, routed_long).removeprefix(lake + "/")),
    }
    # Every folder of the lake, history tables' included (Iceberg's `_changelog_<table>`), fits a file system.
    assert max(len(p.name.encode()) for p in Path(lake).rglob("*")) <= 255


_IDENT = ("database", "table", "lake_table")
