"""Online schema change (``ddl.online_schema_change``): gh-ost and pt-online-schema-change migrations of a table land
as the table's own schema change at the cut-over; the ghost and helper tables never land.

The statements are the ones the tools issue (gh-ost's ``/* gh-ost */`` marked statements and its sentry table,
pt-online-schema-change's ``CREATE TABLE _t_new`` and ``RENAME TABLE``), as TiDB DM's online DDL documentation
lists them; the rows are Canal JSON messages, as a MySQL binlog reader sends them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cdclake.config import parse_config
from cdclake.ddl import parse_ddl
from cdclake.devtools.verify import read_table
from cdclake.exceptions import ConfigError
from cdclake.runner import replay
from cdclake.tables import OnlineSchemaChange, TableFilter
from tests.test_ddl import ddl_message, row_message

# ------------------------------------------------------------------------------------------------------------------
# Names and statements (no Spark)


def test_helper_tables_are_known_by_their_templates() -> None:
    online = OnlineSchemaChange()
    assert online.ghost_of("_orders_gho") == "orders"
    assert online.ghost_of("_order_items_new") == "order_items"
    assert online.ghost_of("orders") is None
    assert online.ghost_of("_orders_del") is None
    assert [online.trash_of(t) for t in ("_orders_ghc", "_orders_del", "_orders_old", "_orders_gho")] == [
        "orders",
        "orders",
        "orders",
        None,
    ]
    assert not online.is_helper(None)
    custom = OnlineSchemaChange(ghost_tables=("_{table}_pcnew",), trash_tables=("_{table}_*_del",))
    assert custom.ghost_of("_orders_pcnew") == "orders"
    assert custom.ghost_of("_orders_gho") is None
    assert custom.trash_of("_orders_20261125_del") == "orders"
    for bad in ("{table}", "_t_gho", "_{table}_{table}", "x._{table}_gho"):
        with pytest.raises(ValueError, match="online schema change"):
            OnlineSchemaChange(ghost_tables=(bad,))


def test_the_tools_statements_parse() -> None:
    def changes(text: str, db_type: str | None = "MySQL") -> list[tuple[str, str, str | None, str | None]]:
        parsed = parse_ddl(text, db_type=db_type, database="crm", schema=None)
        assert parsed.error is None, parsed
        assert parsed.ignored is None, parsed
        return [
            (
                c.kind,
                c.table.table,
                c.new_table.table if c.new_table else c.like.table if c.like else None,
                c.column,
            )
            for c in parsed.changes
        ]

    # gh-ost marks its statements with a comment between the verb and TABLE
    assert changes(
        "rename /* gh-ost */ table `crm`.`orders` to `crm`.`_orders_del`, `crm`.`_orders_gho` to `crm`.`orders`"
    ) == [
        ("rename_table", "orders", "_orders_del", None),
        ("rename_table", "_orders_gho", "orders", None),
    ]
    assert changes("create /* gh-ost */ table `crm`.`_orders_gho` like `crm`.`orders`") == [
        ("create_table", "_orders_gho", "orders", None)
    ]
    assert changes("alter /* gh-ost */ table `crm`.`_orders_gho` add column tier varchar(8)") == [
        ("add_column", "_orders_gho", None, "tier")
    ]
    # Canal names no database type: backquoted names are MySQL's
    assert changes("RENAME TABLE `crm`.`orders` TO `crm`.`_orders_old`", db_type=None) == [
        ("rename_table", "orders", "_orders_old", None)
    ]
    assert changes("CREATE TABLE a (LIKE b)") == [("create_table", "a", "b", None)]
    # MySQL's executable comments are SQL, not comments: they stay
    assert parse_ddl("/*!40000 ALTER TABLE t FROBNICATE */", db_type="MySQL", database="crm", schema=None).changes == ()


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        (None, None),
        (False, None),
        (True, OnlineSchemaChange()),
        ({"ghost_tables": ["_{table}_pcnew"]}, OnlineSchemaChange(ghost_tables=("_{table}_pcnew",))),
    ],
)
def test_config_switch_and_templates(setting: object, expected: OnlineSchemaChange | None) -> None:
    ddl = {} if setting is None else {"online_schema_change": setting}
    config = parse_config(
        {"lake": "/l", "kafka": {"bootstrap_servers": "b:9092", "topics": ["t"]}, "format": "canal-json", "ddl": ddl}
    )
    assert config.ddl.online() == expected


def test_config_error_names_the_template_and_the_fix() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "lake": "/l",
                "kafka": {"bootstrap_servers": "b:9092", "topics": ["t"]},
                "format": "canal-json",
                "ddl": {"online_schema_change": {"trash_tables": ["_old"]}},
            }
        )
    assert info.value.key == "ddl.online_schema_change.trash_tables"
    assert "{table}" in str(info.value)
    assert "ghost_tables" in info.value.fix


# ------------------------------------------------------------------------------------------------------------------
# Applied

TYPES = {"id": "bigint(20)", "v": "varchar(8)"}
WITH_TIER = {**TYPES, "tier": "varchar(8)"}
WITH_LEVEL = {**TYPES, "level": "varchar(8)"}


def _row(op: str, table: str, id_: int, v: str, types: dict[str, str], old: dict | None = None, **extra: object) -> str:
    row = {"id": str(id_), "v": v, **extra}
    return row_message(op, table, [row], types, old=[old] if old else None)


def _migrations() -> list[str]:
    """Rows of ``crm.orders``, an aborted gh-ost run, a gh-ost migration (adds ``tier``), then a
    pt-online-schema-change migration (renames it to ``level``); each tool copies the rows into its ghost table and
    forwards the table's changes to it."""
    ghost_alter = "alter /* gh-ost */ table `crm`.`_orders_gho` add column tier varchar(8)"
    return [
        _row("INSERT", "orders", 1, "a", TYPES),
        _row("INSERT", "orders", 2, "b", TYPES),
        _row("INSERT", "orders", 3, "c", TYPES),
        # an aborted run: its change must not reach the table
        ddl_message("_orders_gho", "create /* gh-ost */ table `crm`.`_orders_gho` like `crm`.`orders`", "CREATE"),
        ddl_message("_orders_gho", "alter /* gh-ost */ table `crm`.`_orders_gho` add column junk int"),
        _row("INSERT", "_orders_gho", 1, "a", TYPES),
        # gh-ost, with --initially-drop-ghost-table
        ddl_message("_orders_gho", "drop /* gh-ost */ table if exists `crm`.`_orders_gho`", "ERASE"),
        ddl_message(
            "_orders_ghc",
            "create /* gh-ost */ table `crm`.`_orders_ghc` (id bigint auto_increment, hint varchar(64) not null, "
            "value varchar(4096) not null, primary key(id)) auto_increment=256 comment='gh-ost changelog'",
            "CREATE",
        ),
        row_message(
            "INSERT",
            "_orders_ghc",
            [{"id": "2", "hint": "state", "value": "migrating"}],
            {"id": "bigint(20)", "hint": "varchar(64)", "value": "varchar(4096)"},
        ),
        ddl_message("_orders_gho", "create /* gh-ost */ table `crm`.`_orders_gho` like `crm`.`orders`", "CREATE"),
        ddl_message("_orders_gho", ghost_alter),
        _row("INSERT", "_orders_gho", 1, "a", WITH_TIER, tier=None),
        _row("UPDATE", "orders", 2, "B", TYPES, old={"v": "b"}),
        _row("INSERT", "_orders_gho", 2, "B", WITH_TIER, tier=None),
        _row("DELETE", "orders", 3, "c", TYPES),
        _row("INSERT", "orders", 4, "d", TYPES),
        _row("INSERT", "_orders_gho", 4, "d", WITH_TIER, tier=None),
        ddl_message(
            "_orders_del",
            "create /* gh-ost */ table `crm`.`_orders_del` (id int auto_increment primary key) engine=InnoDB "
            "comment='ghost-cut-over-sentry'",
            "CREATE",
        ),
        ddl_message("_orders_del", "drop /* gh-ost */ table if exists `crm`.`_orders_del`", "ERASE"),
        ddl_message(
            "orders",
            "rename /* gh-ost */ table `crm`.`orders` to `crm`.`_orders_del`, `crm`.`_orders_gho` to `crm`.`orders`",
            "RENAME",
        ),
        _row("INSERT", "orders", 5, "e", WITH_TIER, tier="gold"),
        _row("UPDATE", "orders", 1, "a", WITH_TIER, old={"tier": None}, tier="silver"),
        ddl_message("_orders_ghc", "drop /* gh-ost */ table if exists `crm`.`_orders_ghc`", "ERASE"),
        # pt-online-schema-change: the ghost is created from the table's definition, then altered
        ddl_message(
            "_orders_new",
            "CREATE TABLE `crm`.`_orders_new` (id bigint NOT NULL, v varchar(8), tier varchar(8), PRIMARY KEY (id))",
            "CREATE",
        ),
        ddl_message("_orders_new", "ALTER TABLE `crm`.`_orders_new` CHANGE COLUMN tier level varchar(8)"),
        # a restarted copy: Canal decodes the statement as a TRUNCATE event, which is not applied either
        ddl_message("_orders_new", "TRUNCATE TABLE `crm`.`_orders_new`", "QUERY"),
        _row("INSERT", "_orders_new", 1, "a", WITH_LEVEL, level="silver"),
        _row("UPDATE", "orders", 4, "D", WITH_TIER, old={"v": "d"}, tier=None),
        _row("UPDATE", "_orders_new", 4, "D", WITH_LEVEL, old={"v": "d"}, level=None),
        # the swap as two statements (gh-ost's --cut-over=two-step does the same)
        ddl_message("orders", "RENAME TABLE `crm`.`orders` TO `crm`.`_orders_old`", "RENAME"),
        ddl_message("_orders_new", "RENAME TABLE `crm`.`_orders_new` TO `crm`.`orders`", "RENAME"),
        ddl_message("_orders_old", "DROP TABLE IF EXISTS `crm`.`_orders_old`", "ERASE"),
        _row("UPDATE", "orders", 5, "e", WITH_LEVEL, old={"level": "gold"}, level="platinum"),
    ]


EXPECTED = [
    {"id": 1, "v": "a", "level": "silver"},
    {"id": 2, "v": "B", "level": None},
    {"id": 4, "v": "D", "level": None},
    {"id": 5, "v": "e", "level": "platinum"},
]
HELPER_EVENTS = 8
"""The helper tables' row events and the TRUNCATE event: counted as excluded tables' events."""


@pytest.mark.spark
def test_migrations_change_the_table_and_no_helper_table_lands(spark, tmp_path: Path) -> None:
    """Eight messages per batch: gh-ost's change is held in an earlier batch than its cut-over (read back from
    ``schema_changes``), pt-online-schema-change's in the cut-over's batch."""
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(line + "\n" for line in _migrations()), encoding="utf-8")
    lake = str(tmp_path / "lake")
    results = replay(
        spark,
        lake=lake,
        format_name="canal-json",
        paths=[str(capture)],
        batch_lines=8,
        online_schema_change=OnlineSchemaChange(),
        # excluding the helper tables as well changes nothing: their statements still count
        tables=TableFilter.of(exclude=["crm._*_gho"]),
    )

    assert sorted(read_table(f"{lake}/crm/orders"), key=lambda r: r["id"]) == EXPECTED
    assert [p.name for p in Path(lake, "crm").iterdir()] == ["orders"]
    assert sum(r.excluded for r in results) == HELPER_EVENTS
    assert sum(r.dead_letters for r in results) == 0
    outcomes = [
        (r["ddl"].split(" table ")[0].split(" TABLE ")[0], r["outcome"])
        for r in spark.read.format("delta")
        .load(f"{lake}/_cdclake/schema_changes")
        .orderBy("offset")
        .select("ddl", "outcome")
        .collect()
    ]
    assert outcomes == [
        ("create /* gh-ost */", "not applied: online schema change ghost table crm._orders_gho"),
        ("alter /* gh-ost */", "held for the cut-over of crm.orders (online schema change)"),
        ("drop /* gh-ost */", "not applied: online schema change ghost table crm._orders_gho"),
        ("create /* gh-ost */", "not applied: online schema change helper table crm._orders_ghc"),
        ("create /* gh-ost */", "not applied: online schema change ghost table crm._orders_gho"),
        ("alter /* gh-ost */", "held for the cut-over of crm.orders (online schema change)"),
        ("create /* gh-ost */", "not applied: online schema change helper table crm._orders_del"),
        ("drop /* gh-ost */", "not applied: online schema change helper table crm._orders_del"),
        (
            "rename /* gh-ost */",
            "not applied: online schema change cut-over, crm.orders keeps its rows; online schema change cut-over of "
            "crm.orders: 1 held changes of crm._orders_gho; applied: column tier string added",
        ),
        ("drop /* gh-ost */", "not applied: online schema change helper table crm._orders_ghc"),
        ("CREATE", "not applied: online schema change ghost table crm._orders_new"),
        ("ALTER", "held for the cut-over of crm.orders (online schema change)"),
        ("RENAME", "not applied: online schema change cut-over, crm.orders keeps its rows"),
        (
            "RENAME",
            "online schema change cut-over of crm.orders: 1 held changes of crm._orders_new; applied: column tier "
            "renamed to level",
        ),
        ("DROP", "not applied: online schema change helper table crm._orders_old"),
    ]
