"""``column_types``: types the messages do not carry. DTS Canal JSON and DRS JSON spell a MySQL DECIMAL as a bare
``decimal``, whose scale is unknown, so without the setting the lake column is a ``string`` (dts.md 2; drs.md 2)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from deltalake import DeltaTable

from cdclake.cli.main import _parse_column_types
from cdclake.devtools.verify import read_table
from cdclake.exceptions import InputError
from cdclake.runner import replay
from tests.test_ddl import row_message

TYPES = {"id": "bigint", "amount": "decimal", "note": "varchar"}


def _messages() -> list[str]:
    def row(i: str, amount: str | None) -> dict[str, str | None]:
        return {"id": i, "amount": amount, "note": f"n{i}"}

    return [
        row_message("INSERT", "orders", [row("1", "12.50"), row("2", "7")], TYPES),
        # DTS Canal JSON: `old` holds the full row before the update (dts.md 2).
        row_message("UPDATE", "orders", [row("1", "13.1")], TYPES, old=[row("1", "12.50")]),
        row_message("INSERT", "orders", [row("3", "1.005")], TYPES),  # three decimals: decimal(12,2) cannot hold it
        row_message("INSERT", "orders", [row("4", None)], TYPES),
        row_message("INSERT", "other", [row("1", "12.50")], TYPES),
    ]


VISIT_TYPES = {"id": "bigint", "day": "varchar", "at": "varchar", "n": "varchar"}
# Text that Spark's casts would take and truncate or respell (a time after a date, a zone after a wall-clock time, a
# seventh fraction digit, blanks around an integer): with column_types, each is a dead letter.
VISITS = [
    ({"id": "1", "day": "2024-03-01", "at": "2024-03-01 10:15:31.123456", "n": "-7"}, None),
    ({"id": "2", "day": "2024-03-01 10:15:31", "at": None, "n": None}, "day"),
    ({"id": "3", "day": None, "at": "2024-03-01 10:15:31+08:00", "n": None}, "at"),
    ({"id": "4", "day": None, "at": "2024-03-01 10:15:31.1234567", "n": None}, "at"),
    ({"id": "5", "day": None, "at": None, "n": " 7"}, "n"),
]


@pytest.mark.spark
def test_a_configured_type_types_the_lake_column_and_a_value_it_cannot_hold_is_a_dead_letter(
    spark, tmp_path: Path
) -> None:
    capture = tmp_path / "dts-canal.jsonl"
    visits = [row_message("INSERT", "visits", [visit], VISIT_TYPES) for visit, _ in VISITS]
    capture.write_text("".join(m + "\n" for m in [*_messages(), *visits]), encoding="utf-8")
    lake = str(tmp_path / "lake")
    results = replay(
        spark,
        lake=lake,
        format_name="dts-canal-json",
        paths=[str(capture)],
        column_types={
            # A pattern, another case than the messages', and Spark's spelling with a blank: as for other settings.
            "crm.ord*": {"AMOUNT": "DECIMAL(12, 2)"},
            "crm.visits": {"day": "date", "at": "timestamp_ntz", "n": "int"},
        },
    )
    dead = {row["offset"]: row["reason"] for row in read_table(f"{lake}/_cdclake/dead_letters")}
    assert sum(r.dead_letters for r in results) == len(dead) == 5
    # The third line of the capture, then the visits that cannot be held exactly.
    assert (
        dead.pop(2)
        == "after value 1.005 of column amount is not a valid decimal(12,2) (column_types; declared decimal)"
    )
    first_visit = len(_messages())
    expected_types = {"day": "date", "at": "timestamp_ntz", "n": "int"}
    assert dead == {
        first_visit + i: f"after value {visit[column]} of column {column} is not a valid {expected_types[column]} "
        "(column_types; declared varchar)"
        for i, (visit, column) in enumerate(VISITS)
        if column is not None
    }
    visit_types = {f.name: f.type.type for f in DeltaTable(f"{lake}/crm/visits").schema().fields}
    assert (visit_types["day"], visit_types["at"], visit_types["n"]) == ("date", "timestamp_ntz", "integer")
    # read_table gives every timestamp as UTC, a wall-clock one too.
    assert read_table(f"{lake}/crm/visits") == [
        {"id": 1, "day": date(2024, 3, 1), "at": datetime(2024, 3, 1, 10, 15, 31, 123456, tzinfo=UTC), "n": -7}
    ]

    # delta-rs reads the tables: an independent reader of their schema and rows.
    types = {f.name: f.type.type for f in DeltaTable(f"{lake}/crm/orders").schema().fields}
    assert (types["amount"], types["id"], types["note"]) == ("decimal(12,2)", "long", "string")
    assert sorted(read_table(f"{lake}/crm/orders"), key=lambda r: r["id"]) == [
        {"id": 1, "amount": Decimal("13.10"), "note": "n1"},
        {"id": 2, "amount": Decimal("7.00"), "note": "n2"},
        {"id": 4, "amount": None, "note": "n4"},
    ]
    # A table the setting does not name keeps the format's type: the exact text.
    assert read_table(f"{lake}/crm/other") == [{"id": 1, "amount": "12.50", "note": "n1"}]

    # Later messages without the setting (another replay, a shard the setting does not name) declare the text of a
    # bare decimal: what fits the lake's decimal(12,2) exactly lands, what a cast would round is a dead letter.
    later = tmp_path / "later.jsonl"
    amounts = [{"id": "5", "amount": "2.5", "note": "n5"}, {"id": "6", "amount": "1.005", "note": "n6"}]
    later.write_text("".join(row_message("INSERT", "orders", [a], TYPES) + "\n" for a in amounts), encoding="utf-8")
    results = replay(spark, lake=lake, format_name="dts-canal-json", paths=[str(later)])
    assert sum(r.dead_letters for r in results) == 1
    reasons = {row["reason"] for row in read_table(f"{lake}/_cdclake/dead_letters")}
    assert "value of column amount (declared string) does not fit the lake table's type decimal(12,2)" in reasons
    stored = {row["id"]: row["amount"] for row in read_table(f"{lake}/crm/orders")}
    assert stored == {1: Decimal("13.10"), 2: Decimal("7.00"), 4: None, 5: Decimal("2.50")}

    # The fix of both 1.005 dead letters: a type that holds them, given to `dlq replay`. The lake column widens.
    from typer.testing import CliRunner

    from cdclake.cli import main as cli_main

    args = ["dlq", "replay", "--lake", lake, "--table", "crm.orders"]
    fixed = CliRunner().invoke(cli_main.app, [*args, "--column-type", "crm.orders.amount=decimal(13,3)"])
    assert fixed.exit_code == 0, fixed.output
    assert "2 dead letters, 2 applied, 0 failed again" in " ".join(fixed.output.split())  # wrapped at 80 columns
    types = {f.name: f.type.type for f in DeltaTable(f"{lake}/crm/orders").schema().fields}
    assert types["amount"] == "decimal(13,3)"
    stored = {row["id"]: row["amount"] for row in read_table(f"{lake}/crm/orders")}
    assert stored == {
        1: Decimal("13.1"),
        2: Decimal("7"),
        3: Decimal("1.005"),
        4: None,
        5: Decimal("2.5"),
        6: Decimal("1.005"),
    }


def test_the_replay_flag_takes_table_column_and_type() -> None:
    assert _parse_column_types(["shop.orders.amount=decimal(12, 2)", "shop.orders.qty=INT", "t.c=date"]) == {
        "shop.orders": {"amount": "decimal(12,2)", "qty": "int"},
        "t": {"c": "date"},
    }
    with pytest.raises(InputError, match=r"expected db\.table\.column=type"):
        _parse_column_types(["amount=decimal(12,2)"])
    with pytest.raises(InputError, match="'timestamp' is not a type column_types can give"):
        _parse_column_types(["shop.orders.at=timestamp"])


@pytest.mark.spark
def test_a_dry_run_names_the_bare_decimals_that_would_land_as_text_and_the_setting(
    spark, tmp_path: Path, monkeypatch
) -> None:
    """`replay --dry-run` (in this process: `replay` takes the active test session) with `--column-type` for one
    table: the other's bare decimal is named with the setting, and the value the type cannot hold is found."""
    from typer.testing import CliRunner

    from cdclake.cli import main as cli_main

    capture = tmp_path / "dts-canal.jsonl"
    capture.write_text("".join(m + "\n" for m in _messages()), encoding="utf-8")
    lake = str(tmp_path / "lake")
    monkeypatch.delenv("COLUMNS", raising=False)  # one table row per output line (cli.main._console)
    monkeypatch.setattr(cli_main, "out", cli_main._console())
    args = ["replay", "--dry-run", "--format", "dts-canal-json", "--lake", lake, str(capture)]
    dry = CliRunner().invoke(cli_main.app, [*args, "--column-type", "crm.orders.amount=decimal(12,2)"])
    assert dry.exit_code == 1, dry.output  # a message would be a dead letter
    assert "crm.other: amount (decimal) would land as text" in dry.stdout
    assert "crm.orders: amount" not in dry.stdout
    assert "1.005 of column amount is not a valid decimal(12,2) (column_types" in " ".join(dry.stdout.split())
    assert not Path(lake).exists()

    untyped = CliRunner().invoke(cli_main.app, args)
    assert untyped.exit_code == 0, untyped.output  # every message decodes: the decimals stay text
    assert "crm.orders: amount (decimal) would land as text" in untyped.stdout


@pytest.mark.spark
@pytest.mark.parametrize("batch_lines", [100, 1], ids=["one-batch", "one-per-batch"])
def test_a_retyped_decimal_key_is_one_row_key_however_the_messages_spell_it(
    spark, tmp_path: Path, batch_lines: int
) -> None:
    """A bare decimal key retyped to decimal(10,2): `1.5`, `1.50` and `1.500` are one value, so one row. As text they
    were three row keys; in one batch, two of them matched the one lake row in the MERGE."""
    types = {"code": "decimal", "note": "varchar"}

    def row(code: str, note: str) -> dict[str, str]:
        return {"code": code, "note": note}

    lines = [
        row_message("INSERT", "prices", [row("1.5", "a"), row("2", "b")], types, keys=["code"]),
        row_message("UPDATE", "prices", [row("1.50", "a2")], types, old=[row("1.5", "a")], keys=["code"]),
        row_message("UPDATE", "prices", [row("1.500", "a3")], types, old=[row("1.50", "a2")], keys=["code"]),
        row_message("DELETE", "prices", [row("2.00", "b")], types, keys=["code"]),
    ]
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    lake = str(tmp_path / "lake")
    results = replay(
        spark,
        lake=lake,
        format_name="dts-canal-json",
        paths=[str(capture)],
        batch_lines=batch_lines,
        column_types={"crm.prices": {"code": "decimal(10,2)"}},
    )
    assert sum(r.dead_letters for r in results) == 0
    assert read_table(f"{lake}/crm/prices") == [{"code": Decimal("1.50"), "note": "a3"}]
