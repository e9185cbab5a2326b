"""A row event whose key value is NULL cannot be told apart from the table's other NULL-key rows: a dead letter, not a
row that swallows them (keys from the messages, such as a unique index on nullable columns, and configured keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdclake.devtools.verify import read_table
from cdclake.runner import replay
from tests.test_ddl import row_message

pytestmark = pytest.mark.spark

USER_TYPES = {"id": "bigint(20)", "email": "varchar(64)"}
STOCK_TYPES = {"code": "varchar(8)", "qty": "bigint(20)"}


def test_rows_with_a_null_key_value_are_dead_letters_with_the_reason(spark, tmp_path: Path) -> None:
    messages = [
        # crm.users is keyed by a unique index on a nullable column (the messages' own keys).
        row_message(
            "INSERT",
            "users",
            [{"id": "1", "email": "a@x"}, {"id": "2", "email": None}, {"id": "3", "email": None}],
            USER_TYPES,
            keys=["email"],
        ),
        row_message("DELETE", "users", [{"id": "2", "email": None}], USER_TYPES, keys=["email"]),
        # crm.stock has no key in its messages; `keys` names a column that is NULL in one row.
        row_message("INSERT", "stock", [{"code": "x", "qty": "1"}, {"code": None, "qty": "2"}], STOCK_TYPES, keys=[]),
    ]
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(line + "\n" for line in messages), encoding="utf-8")
    lake = str(tmp_path / "lake")
    results = replay(spark, lake=lake, format_name="canal-json", paths=[str(capture)], keys={"crm.stock": ["code"]})

    assert read_table(f"{lake}/crm/users") == [{"id": 1, "email": "a@x"}]
    assert read_table(f"{lake}/crm/stock") == [{"code": "x", "qty": 1}]
    assert sum(r.dead_letters for r in results) == 4  # events: two inserts and the delete of users, one of stock
    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").collect()  # one row per message
    reasons = sorted(row["reason"] for row in dead)
    assert [r.split(":")[0] for r in reasons] == [
        "key column code is NULL (or missing) in the row's image",
        *["key column email is NULL (or missing) in the row's image"] * 2,
    ]
    assert all("set `keys` for the table to columns that are never NULL" in r for r in reasons)
