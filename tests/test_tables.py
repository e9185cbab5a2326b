"""The ``tables`` filter (cdclake.tables): which source tables land, by glob patterns over the names every
per-table setting uses; ``routes``: which lake table each lands in; and the per-table settings' choice of entry."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from cdclake import apply
from cdclake.sinks.delta import DeltaSink, safe_name
from cdclake.tables import PerTable, TableFilter, TableRoute, TableRoutes, check_pattern, check_target, table_names


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


def test_a_name_too_long_for_a_folder_is_shortened_and_one_that_fits_is_kept() -> None:
    # Up to 255 bytes a name is its own folder, as before names were fitted: no existing table moves.
    assert safe_name("t" * 255) == "t" * 255
    long_a, long_b = "t" * 255 + "_a", "t" * 255 + "_b"  # a route's prefix or suffix makes such names
    assert safe_name(long_a).startswith("t" * 200 + "_")
    assert len(safe_name(long_a)) == 209
    assert safe_name(long_a) != safe_name(long_b)  # the hash of the whole name tells them apart


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


# ---------------------------------------------------------------------------------------------------------------------
# Per-table settings: names and patterns, the most specific wins

SETTING = PerTable.of(
    {
        "*": "every",
        "shop.*": "shop",
        "shop.orders_*": "shards",
        "orders_7": "bare name",
        "shop.orders_7": "qualified name",
        "pg.public.orders": "three parts",
        "public.*": "schema pattern",
    }
)


@pytest.mark.parametrize(
    ("table", "value"),
    [
        (("shop", None, "orders_7"), "qualified name"),  # a name wins; more parts win
        (("crm", None, "orders_7"), "bare name"),
        (("shop", None, "orders_8"), "shards"),  # of patterns, more literal characters win
        (("shop", None, "customer"), "shop"),
        (("crm", None, "customer"), "every"),
        (("pg", "public", "orders"), "three parts"),
        (("pg", "public", "items"), "schema pattern"),
        (("shop.orders_", None, "x"), "shards"),  # * spans dots, as in `tables`
    ],
)
def test_the_most_specific_entry_of_a_per_table_setting_wins(
    table: tuple[str | None, str | None, str], value: str
) -> None:
    assert SETTING.value_for(*table) == value
    # The order of a YAML mapping does not matter.
    assert PerTable(tuple(reversed(SETTING.entries))).value_for(*table) == value


def test_a_per_table_setting_without_a_match_gives_none() -> None:
    assert PerTable.of({"shop.*": 1}).value_for("crm", None, "orders") is None
    assert not PerTable.of({})
    # Of two equally specific entries, the one listed first.
    assert PerTable.of({"a.t": 1, "s.t": 2}).value_for("a", "s", "t") == 1
    assert PerTable.of({"s.t": 2, "a.t": 1}).value_for("a", "s", "t") == 2


NAME_PART = st.text(alphabet="ab.*?+$^[]\\()|{}\n_-", min_size=1, max_size=4)
TABLE_PART = st.text(alphabet="ab.+$^[]\\()|{}\n_-", min_size=1, max_size=4)


@pytest.mark.spark
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    entries=st.lists(
        st.tuples(NAME_PART.filter(lambda n: check_pattern(n) is None), st.integers(-1000, 1000)), max_size=6
    ),
    tables=st.lists(
        st.tuples(st.one_of(st.none(), TABLE_PART), st.one_of(st.none(), TABLE_PART), TABLE_PART), min_size=1
    ),
)
def test_spark_picks_the_entry_the_driver_picks(
    spark, entries: list[tuple[str, int]], tables: list[tuple[str | None, str | None, str]]
) -> None:
    """keys and sequence_by are chosen per event by a Spark column (apply.per_table), ddl.tables and dlq replay on
    the driver (PerTable.value_for): the two agree, regex metacharacters and line breaks in names included."""
    setting = PerTable(tuple(entries))
    frame = spark.createDataFrame(tables, "database string, schema string, table string")
    picked = frame.select(
        "database", "schema", "table", apply.per_table(setting, F.lit, F.lit(None).cast("int")).alias("value")
    ).collect()
    assert [(r["database"], r["schema"], r["table"], r["value"]) for r in picked] == [
        (*table, setting.value_for(*table)) for table in tables
    ]
