"""``column_types``: types the messages do not carry. DTS and DRS spell a MySQL DECIMAL as a bare ``decimal``, whose
scale is unknown, so without the setting the lake column is a ``string`` (dts.md 2; drs.md 2)."""

from __future__ import annotations

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


@pytest.mark.spark
def test_a_configured_type_types_the_lake_column_and_a_value_it_cannot_hold_is_a_dead_letter(
    spark, tmp_path: Path
) -> None:
    capture = tmp_path / "dts-canal.jsonl"
    capture.write_text("".join(m + "\n" for m in _messages()), encoding="utf-8")
    lake = str(tmp_path / "lake")
    results = replay(
        spark,
        lake=lake,
        format_name="dts-canal-json",
        paths=[str(capture)],
        # A pattern, another case than the messages', and Spark's spelling with a blank: all as for other settings.
        column_types={"crm.ord*": {"AMOUNT": "DECIMAL(12, 2)"}},
    )
    assert sum(r.dead_letters for r in results) == 1
    [dead] = read_table(f"{lake}/_cdclake/dead_letters")
    assert dead["reason"] == (
        "after value 1.005 of column amount is not a valid decimal(12,2) (column_types; declared decimal)"
    )
    assert (dead["partition"], dead["offset"]) == (0, 2)  # the third line of the capture

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
