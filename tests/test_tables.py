"""The ``tables`` filter (cdclake.tables): which source tables land, by glob patterns over the names every
per-table setting uses; and ``routes``: which lake table each lands in."""

from __future__ import annotations

import pytest

from cdclake.sinks.delta import DeltaSink
from cdclake.tables import TableFilter, TableRoute, TableRoutes, check_pattern, check_target, table_names


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


ROUTES = TableRoutes.of(
    [
        (["shop.orders_*"], "shop.orders"),
        (["crm.tmp_*", "crm.scratch"], "scratch"),
        (["*.public.*"], "{database}_{schema}.{table}"),
        (["*"], "ods.{database}_{table}"),
    ]
)


@pytest.mark.parametrize(
    ("source", "lake"),
    [
        # shards merged; the first matching rule wins (orders_07 also matches "*")
        (("shop", None, "orders_07"), ("shop", "orders")),
        (("shop", None, "orders"), ("ods", "shop_orders")),
        # a target without a database keeps the source's
        (("crm", None, "tmp_1"), ("crm", "scratch")),
        (("crm", None, "scratch"), ("crm", "scratch")),
        # placeholders; {database} is the schema for sources that name one level only
        (("pg", "public", "orders"), ("pg_public", "orders")),
        # a schema-only source has no db.schema.table name for *.public.* to match
        ((None, "public", "orders"), ("ods", "public_orders")),
    ],
)
def test_the_first_matching_route_names_the_lake_table(
    source: tuple[str | None, str | None, str], lake: tuple[str, str]
) -> None:
    assert ROUTES.lake_name(*source) == lake


def test_without_routes_a_table_lands_in_its_database_and_name() -> None:
    assert TableRoutes().lake_name("shop", "public", "orders") == ("shop", "orders")
    assert TableRoutes().lake_name(None, "public", "orders") == ("public", "orders")
    assert TableRoutes.of([(["crm.*"], "x.{table}")]).lake_name("shop", None, "orders") == ("shop", "orders")
    # a part that comes out empty (no schema here) keeps the source's name
    assert TableRoutes.of([(["*"], "{schema}.{schema}")]).lake_name("shop", None, "orders") == ("shop", "orders")


def test_routed_names_are_made_path_safe_and_drive_every_path_of_the_sink() -> None:
    sink = DeltaSink.__new__(DeltaSink)  # the paths only: no Spark session needed
    sink.lake, sink.system_dir = "/lake", "/lake/_cdclake"
    sink.routes = TableRoutes.of([(["*"], "ods.{database}-{table}")])
    path = sink.table_path("shop", None, "orders")
    assert path.startswith("/lake/ods/shop_orders_")  # "-" is not path-safe: replaced, with a hash of the name
    assert sink.history_path("scd2", "shop", None, "orders") == f"/lake/_cdclake/scd2/{path.removeprefix('/lake/')}"


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("", "empty"),
        (" shop.x", "blanks"),
        ("a.b.c", "two name levels"),
        ("shop.", "`db.table`"),
        ("ods.{db}_{table}", "unknown placeholder {db}"),
        ("ods.{table", "unmatched brace"),
        ("ods.table}", "unmatched brace"),
    ],
)
def test_bad_route_targets_are_refused(target: str, problem: str) -> None:
    assert problem in (check_target(target) or "")
    with pytest.raises(ValueError, match="route"):
        TableRoute(("shop.*",), target)


def test_a_route_needs_good_patterns() -> None:
    assert check_target("ods.{database}_{schema}_{table}") is None
    with pytest.raises(ValueError, match="no table pattern"):
        TableRoute((), "shop.orders")
    with pytest.raises(ValueError, match="empty name part"):
        TableRoute(("shop..x",), "shop.orders")


def test_replay_refuses_a_bad_route_before_reading_anything(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from cdclake.cli.main import app

    capture = tmp_path / "capture.jsonl"
    capture.write_text("{}\n", encoding="utf-8")
    for route, problem in (("shop.orders_*", "expected PATTERN=TARGET"), ("shop.*=a.b.c", "two name levels")):
        args = ["replay", "--format", "dataworks-json", "--lake", str(tmp_path / "lake"), "--route", route]
        result = CliRunner().invoke(app, [*args, str(capture)])
        assert result.exit_code == 1
        assert "--route" in str(result.exception)
        assert problem in str(result.exception)
    assert not (tmp_path / "lake").exists()
