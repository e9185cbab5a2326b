"""The ``tables`` filter (cdclake.tables): which source tables land, by glob patterns over the names every
per-table setting uses."""

from __future__ import annotations

import pytest

from cdclake.tables import TableFilter, check_pattern, table_names


def test_a_table_is_named_as_in_every_per_table_setting() -> None:
    assert table_names("shop", None, "orders") == {"orders", "shop.orders"}
    assert table_names(None, "public", "orders") == {"orders", "public.orders"}
    assert table_names("shop", "public", "orders") == {"orders", "shop.orders", "public.orders", "shop.public.orders"}


@pytest.mark.parametrize(
    ("include", "exclude", "table", "admitted"),
    [
        ((), (), ("shop", None, "orders"), True),
        (("shop.*",), (), ("shop", None, "orders"), True),
        (("shop.*",), (), ("crm", None, "orders"), False),
        # a bare table name matches in every database; * spans dots
        (("orders",), (), ("crm", None, "orders"), True),
        (("*",), ("*.tmp_*",), ("shop", None, "tmp_1"), False),
        (("*",), ("*.tmp_*",), ("shop", None, "tmp"), True),
        # ? is one character; every other character is itself (a dot is not "any character", + is not a repeat)
        (("shop.orders_??",), (), ("shop", None, "orders_07"), True),
        (("shop.orders_??",), (), ("shop", None, "orders_7"), False),
        (("shop.orders",), (), ("shopXorders", None, "x"), False),
        (("shop.orders",), (), ("shop", None, "ordersX"), False),
        (("a+b.t",), (), ("aab", None, "t"), False),
        (("a+b.t",), (), ("a+b", None, "t"), True),
        (("shop.[ab]",), (), ("shop", None, "a"), False),
        (("shop.[ab]",), (), ("shop", None, "[ab]"), True),
        # case-sensitive, as the source names
        (("SHOP.*",), (), ("shop", None, "orders"), False),
        # schema and three-part names (PostgreSQL, SQL Server)
        (("*.public.*",), (), ("pg", "public", "orders"), True),
        (("pg.archive.*",), (), ("pg", "public", "orders"), False),
        (("public.orders",), (), ("pg", "public", "orders"), True),
        # exclude wins over include
        (("shop.*",), ("shop.orders",), ("shop", None, "orders"), False),
        # events of no table (heartbeats, transaction boundaries) always pass
        (("shop.*",), ("*",), ("shop", None, None), True),
    ],
)
def test_include_and_exclude_patterns(
    include: tuple[str, ...], exclude: tuple[str, ...], table: tuple[str | None, str | None, str | None], admitted: bool
) -> None:
    assert TableFilter.of(include, exclude).admits(*table) is admitted


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [("", "empty"), (" ", "empty"), ("shop.*  ", "blanks"), ("shop..orders", "empty name part"), (".x", "empty name")],
)
def test_bad_patterns_are_refused(pattern: str, problem: str) -> None:
    assert problem in (check_pattern(pattern) or "")
    assert check_pattern("shop.orders_*") is None


def test_replay_refuses_a_bad_pattern_before_reading_anything(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from cdclake.cli.main import app

    capture = tmp_path / "capture.jsonl"
    capture.write_text("{}\n", encoding="utf-8")
    args = ["replay", "--format", "dataworks-json", "--lake", str(tmp_path / "lake"), "--exclude-table", "shop..x"]
    result = CliRunner().invoke(app, [*args, str(capture)])
    assert result.exit_code == 1
    assert "--exclude-table" in str(result.exception)
    assert "empty name part" in str(result.exception)
    assert not (tmp_path / "lake").exists()
