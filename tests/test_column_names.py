"""Column names with spaces and ``,;{}()=`` (SQL Server's ``Order Date``, a MongoDB document's ``first name``,
``price(usd)``) land under their own names. Delta refuses them in a table without column mapping, so cdclake creates
such a table with column mapping, and switches it on when a DDL statement or a message adds such a column to a table
that has none; Iceberg keeps any name. Every other Delta table is left without column mapping."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdclake.devtools.verify import read_table
from cdclake.pipeline import DEAD_LETTERS
from cdclake.runner import BatchResult, replay
from cdclake.sinks import lake_sink
from cdclake.sinks.delta import COLUMN_MAPPING_MODE, needs_column_mapping
from cdclake.sinks.partitioning import PartitionField
from tests.test_ddl import ddl_message, row_message
from tests.test_partitioning import _capture

ORDERS = {
    "id": "bigint(20)",
    "Order Date": "datetime",
    "price(usd)": "decimal(10,2)",
    "a,b;c": "varchar(8)",
    "x=y {z}": "varchar(8)",
}
PLAIN = {"id": "bigint(20)", "v": "varchar(8)"}
REGIONS = {"id": "bigint(20)", "region code": "varchar(400)"}
LINES = {"order no": "bigint(20)", "line (no)": "int(11)", "qty=": "int(11)"}
"""A table keyed by two columns with such names: MERGE conditions, file statistics and tombstones name them."""
LONG_REGION = "r" * 300
"""A partition value whose folder (``region code=rrr...``, 312 bytes) no file system holds: a column-mapped Delta
table writes no partition folders, an Iceberg table does."""


def test_which_names_need_column_mapping() -> None:
    assert not needs_column_mapping(["id", "a.b", "名前", "Grüße", "$x", "a-b"])
    for name in ("Order Date", "a,b", "a;b", "{a}", "f(x)", "x=y", "a\tb", "a\nb"):
        assert needs_column_mapping(["id", name]), name


def _order(order_id: int, date: str, price: str, abc: str, xyz: str, date_column: str = "Order Date") -> dict[str, Any]:
    return {"id": str(order_id), date_column: date, "price(usd)": price, "a,b;c": abc, "x=y {z}": xyz}


@pytest.mark.spark
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_columns_named_with_spaces_and_delta_reserved_characters_land_under_their_names(
    spark, tmp_path: Path, table_format: str
) -> None:
    lake = str(tmp_path / "lake")
    options: dict[str, Any] = {
        "lake": lake,
        "format_name": "canal-json",
        "table_format": table_format,
        "partition_by": {"crm.regions": ["region code"]},
        "changelog": ["crm.orders"],
        "scd2": ["crm.orders"],
    }
    first_batch = [
        row_message(
            "INSERT",
            "orders",
            [
                _order(1, "2024-03-01 10:00:00", "1.00", "a", "x"),
                _order(2, "2024-03-02 11:00:00", "2.50", "b", "y"),
            ],
            ORDERS,
        ),
        row_message(
            "UPDATE",
            "orders",
            [_order(1, "2024-03-01 10:00:00", "9.99", "a", "x")],
            ORDERS,
            old=[{"price(usd)": "1.00"}],
        ),
        row_message("DELETE", "orders", [_order(2, "2024-03-02 11:00:00", "2.50", "b", "y")], ORDERS),
        row_message("INSERT", "plain", [{"id": "1", "v": "v1"}], PLAIN),
        row_message("INSERT", "notes", [{"id": "1", "v": "n1"}], PLAIN),
        row_message(
            "INSERT",
            "lines",
            [{"order no": "1", "line (no)": str(n), "qty=": str(n)} for n in (1, 2, 3)],
            LINES,
            keys=["order no", "line (no)"],
        ),
        row_message(
            "INSERT",
            "regions",
            [{"id": "1", "region code": "eu"}, {"id": "2", "region code": LONG_REGION}],
            REGIONS,
        ),
    ]
    sink = lake_sink(spark, lake, table_format)

    def rows(table: str) -> list[dict[str, Any]]:
        if table_format == "delta":  # read by delta-rs, not Spark
            found = read_table(sink.table_path("crm", None, table))
        else:
            found = [row.asDict() for row in sink.read("crm", table).collect()]
        return sorted(({k: v for k, v in row.items() if not k.startswith("_cdc_")} for row in found), key=str)

    def dead_letters() -> list[str]:
        table = sink.read_system(DEAD_LETTERS)  # None until the first dead letter
        return [r["reason"] for r in table.collect()] if table is not None else []

    def mapped(table: str) -> bool:
        properties = spark.sql(f"SHOW TBLPROPERTIES delta.`{sink.table_path('crm', None, table)}`").collect()
        return {row["key"]: row["value"] for row in properties}.get(COLUMN_MAPPING_MODE, "none") == "name"

    first_order = {"id": 1, "price(usd)": Decimal("9.99"), "a,b;c": "a", "x=y {z}": "x"}

    def check_first_batch() -> None:
        assert [{k: v for k, v in row.items() if k != "Order Date"} for row in rows("orders")] == [first_order]
        assert str(rows("orders")[0]["Order Date"]).startswith("2024-03-01 10:00:00")
        assert rows("plain") == [{"id": 1, "v": "v1"}]
        assert len(rows("lines")) == 3
        assert sink.partitioning("crm", None, "regions") == (PartitionField("region code"),)
        if table_format == "delta":
            assert [mapped("orders"), mapped("regions"), mapped("plain"), mapped("notes")] == [True, True, False, False]
            # A column-mapped table's files are under random folders: a partition value of any length lands.
            assert rows("regions") == [{"id": 1, "region code": "eu"}, {"id": 2, "region code": LONG_REGION}]
            assert dead_letters() == []
        else:
            assert rows("regions") == [{"id": 1, "region code": "eu"}]
            assert [reason.split(",")[0] for reason in dead_letters()] == [
                "value of partition column region code names a folder of 312 bytes"
            ]
        history = {
            kind: sink.read_path(sink.history_path(kind, "crm", None, "orders")) for kind in ("changelog", "scd2")
        }
        for kind, table in history.items():
            assert {"Order Date", "price(usd)", "a,b;c", "x=y {z}"} <= set(table.columns), kind
        changes = history["changelog"].orderBy("_cdc_position", "_cdc_sub_index").collect()
        assert [(r["_cdc_op"], r["id"], r["price(usd)"]) for r in changes] == [
            ("INSERT", 1, Decimal("1.00")),
            ("INSERT", 2, Decimal("2.50")),
            ("UPDATE", 1, Decimal("9.99")),
            ("DELETE", 2, Decimal("2.50")),
        ]
        assert changes[2]["_cdc_before"]["price(usd)"] == Decimal("1.00")  # a struct's fields keep the names too
        versions = history["scd2"].orderBy("id", "_cdc_valid_from").collect()
        assert [(r["id"], r["price(usd)"], r["_cdc_is_current"], r["_cdc_is_deleted"]) for r in versions] == [
            (1, Decimal("1.00"), False, False),
            (1, Decimal("9.99"), True, False),
            (2, Decimal("2.50"), False, False),
            (2, Decimal("2.50"), True, True),
        ]

    second_batch = [
        # Added to a table without column mapping, or renamed to in one: switched on first.
        ddl_message("notes", "ALTER TABLE notes RENAME COLUMN v TO `v (text)`"),
        ddl_message("plain", "ALTER TABLE plain ADD COLUMN `Added On` varchar(8)"),
        row_message(
            "INSERT", "plain", [{"id": "2", "v": "v2", "Added On": "today"}], {**PLAIN, "Added On": "varchar(8)"}
        ),
        row_message(
            "UPDATE",
            "lines",
            [{"order no": "1", "line (no)": "1", "qty=": "10"}],
            LINES,
            old=[{"qty=": "1"}],
            keys=["order no", "line (no)"],
        ),
        row_message(
            "DELETE",
            "lines",
            [{"order no": "1", "line (no)": "2", "qty=": "2"}],
            LINES,
            keys=["order no", "line (no)"],
        ),
        ddl_message("orders", "ALTER TABLE orders RENAME COLUMN `Order Date` TO `Ordered (UTC)`"),
        row_message(
            "INSERT",
            "orders",
            [_order(3, "2024-03-03 12:00:00", "3.00", "c", "z", date_column="Ordered (UTC)")],
            {**{k: v for k, v in ORDERS.items() if k != "Order Date"}, "Ordered (UTC)": "datetime"},
        ),
    ]
    # One capture, two batches: canal-json messages carry no log position, so their order is their line's, which a
    # second capture would start again.
    capture = _capture(tmp_path, "messages.jsonl", first_batch + second_batch)
    batches: list[BatchResult] = []

    def after_batch(result: BatchResult) -> None:
        batches.append(result)
        if len(batches) == 1:
            check_first_batch()

    replay(spark, paths=[capture], batch_lines=len(first_batch), on_batch=after_batch, **options)
    assert len(batches) == 2
    assert rows("plain") == [{"Added On": None, "id": 1, "v": "v1"}, {"Added On": "today", "id": 2, "v": "v2"}]
    assert rows("lines") == [
        {"line (no)": 1, "order no": 1, "qty=": 10},
        {"line (no)": 3, "order no": 1, "qty=": 3},
    ]
    orders = rows("orders")
    assert [sorted(row) for row in orders] == [sorted(["Ordered (UTC)", *first_order])] * 2
    assert [(row["id"], str(row["Ordered (UTC)"])[:19]) for row in orders] == [
        (1, "2024-03-01 10:00:00"),
        (3, "2024-03-03 12:00:00"),
    ]
    outcomes = [r["outcome"] for r in spark.read.format("delta").load(f"{lake}/_cdclake/schema_changes").collect()]
    assert all(outcome.startswith("applied") for outcome in outcomes), outcomes
    assert rows("notes") == [{"id": 1, "v (text)": "n1"}]
    if table_format == "delta":
        assert [mapped("plain"), mapped("notes")] == [True, True]
    assert len(dead_letters()) == (0 if table_format == "delta" else 1)  # the long partition value's, from before
