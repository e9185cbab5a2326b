"""Schema evolution: DDL text -> validated changes (pure Python), and DDL / type changes applied to Delta tables.

The end-to-end scenario uses Canal JSON messages (MySQL types, DDL statements in ``sql``) and checks the final
tables, the recorded outcomes and the dead letters, whether the stream arrives as one batch or one message per
batch (the statements must apply at their position in the stream either way).
"""

from __future__ import annotations

import json
import logging
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from cdclake.ddl import common_type, parse_ddl, spark_type_of, typed_as, widened
from cdclake.devtools.verify import read_table
from cdclake.evolve import SchemaChangeError
from cdclake.runner import replay
from cdclake.sinks.delta import REWRITE_METADATA, DeltaSink
from tests.e2e.helpers import history_table, replay_lines

# ------------------------------------------------------------------------------------------------------------------
# Parsing (no Spark)


def kinds(text: str, db_type: str | None = "MySQL") -> list[tuple[str, str | None, str | None, str | None]]:
    parsed = parse_ddl(text, db_type=db_type, database="crm", schema="SALES" if db_type == "Oracle" else None)
    assert parsed.error is None, parsed.error
    return [(c.kind, c.column, c.new_name, c.spark_type) for c in parsed.changes]


def test_column_changes_in_each_dialect() -> None:
    assert kinds("ALTER TABLE customer ADD COLUMN tier varchar(8) NULL") == [("add_column", "tier", None, "string")]
    assert kinds("ALTER TABLE crm.customer DROP COLUMN tier") == [("drop_column", "tier", None, None)]
    assert kinds("ALTER TABLE customer RENAME COLUMN a TO b") == [("rename_column", "a", "b", None)]
    assert kinds("ALTER TABLE customer CHANGE COLUMN a b bigint") == [("modify_column", "a", "b", "bigint")]
    assert kinds("ALTER TABLE customer MODIFY COLUMN a decimal(12,2) NOT NULL") == [
        ("modify_column", "a", None, "decimal(12,2)")
    ]
    assert kinds("ALTER TABLE t ADD COLUMN a int, DROP COLUMN b") == [
        ("add_column", "a", None, "int"),
        ("drop_column", "b", None, None),
    ]
    # Oracle folds unquoted names to upper case; ADD (...) and MODIFY (...) lists
    assert kinds("ALTER TABLE t ADD (c NUMBER(10,2), d VARCHAR2(10))", "Oracle") == [
        ("add_column", "C", None, "decimal(10,2)"),
        ("add_column", "D", None, "string"),
    ]
    assert kinds('ALTER TABLE "SALES"."T" MODIFY ("Mixed" NUMBER(12,2))', "Oracle") == [
        ("modify_column", "Mixed", None, "decimal(12,2)")
    ]
    assert kinds("ALTER TABLE t ALTER COLUMN c TYPE bigint", "PostgreSQL") == [("modify_column", "c", None, "bigint")]


def test_table_changes_and_statements_that_change_no_table() -> None:
    rename = parse_ddl("RENAME TABLE a TO b, c TO shop.d", db_type="MySQL", database="crm", schema=None)
    assert [(c.table.table, c.new_table and (c.new_table.database, c.new_table.table)) for c in rename.changes] == [
        ("a", ("crm", "b")),
        ("c", ("shop", "d")),
    ]
    created = parse_ddl(
        "CREATE TABLE t2 (id bigint primary key, v tinyint(1), n NUMBER)", db_type=None, database="x", schema=None
    )
    assert created.changes[0].columns == (("id", "bigint"), ("v", "boolean"), ("n", None))
    assert (created.changes[0].key_columns, created.changes[0].if_not_exists) == (("id",), False)
    keyed = parse_ddl(
        'CREATE TABLE IF NOT EXISTS "T" (a int, "B" int, CONSTRAINT pk PRIMARY KEY (A, "B"))',
        db_type="Oracle",
        database=None,
        schema="S",
    )
    assert (keyed.changes[0].key_columns, keyed.changes[0].if_not_exists) == (("A", "B"), True)
    # a key column without an exact Spark type: the keys come with data
    assert (
        parse_ddl("CREATE TABLE t (n NUMBER primary key)", db_type="Oracle", database=None, schema="S")
        .changes[0]
        .key_columns
        == ()
    )
    assert [c.kind for c in parse_ddl("DROP TABLE t2", db_type="MySQL", database="x", schema=None).changes] == [
        "drop_table"
    ]
    assert parse_ddl("CREATE INDEX i ON t(a)", db_type="MySQL", database="x", schema=None).ignored
    assert parse_ddl("ALTER TABLE t ADD INDEX idx (a)", db_type="MySQL", database="x", schema=None).ignored
    assert parse_ddl("GRANT ALL ON x TO y", db_type="MySQL", database="x", schema=None).ignored
    assert parse_ddl("ALTER TABLE t FROBNICATE", db_type="MySQL", database="x", schema=None).error


def test_a_statement_nested_too_deeply_for_the_parser_is_a_ddl_that_does_not_parse() -> None:
    """sqlglot recurses per nested expression: 60 nested parentheses raised RecursionError out of parse_ddl, which
    stopped the batch (found by fuzzing parse_ddl with mutated statements)."""
    nested = "(" * 60 + "1" + ")" * 60
    cases = [
        (f"ALTER TABLE t ADD c INT DEFAULT {nested}", "MySQL", "cannot parse DDL: nested too deeply"),
        (f"ALTER TABLE t ADD c DECIMAL{nested}", None, "cannot parse DDL: nested too deeply"),
        (f"ALTER TABLE T MODIFY (C NUMBER DEFAULT {nested})", "Oracle", "cannot parse MODIFY: nested too deeply"),
    ]
    for text, db_type, error in cases:
        assert parse_ddl(text, db_type=db_type, database="x", schema=None).error == error, text
    shallow = "(" * 10 + "1" + ")" * 10
    parsed = parse_ddl(f"ALTER TABLE t ADD c INT DEFAULT {shallow}", db_type="MySQL", database="x", schema=None)
    assert [(c.kind, c.column, c.spark_type) for c in parsed.changes] == [("add_column", "c", "int")]


def test_types_map_only_when_lossless_and_widening_never_loses_values() -> None:
    assert spark_type_of(None) is None
    assert widened("int", "bigint")
    assert widened("float", "double")
    assert widened("bigint", "decimal(20,0)")
    assert widened("decimal(10,2)", "decimal(12,2)")
    assert widened("decimal(10,2)", "decimal(12,4)")
    assert not widened("bigint", "int")
    assert not widened("decimal(10,2)", "decimal(10,3)")
    assert not widened("int", "string")
    assert not widened("double", "float")
    assert not widened("int", "int")
    assert common_type("int", {"bigint"}) == "bigint"
    assert common_type("bigint", {"string"}) is None


def test_each_column_keeps_its_sql_type_as_spelled_for_a_format_to_type_it_its_own_way() -> None:
    parsed = parse_ddl(
        "ALTER TABLE t ADD COLUMN a INT(11) UNSIGNED, MODIFY b DATETIME(3) NOT NULL, CHANGE c d tinyint(1), ADD e time",
        db_type="MySQL",
        database="crm",
        schema=None,
    )
    assert [(c.column, c.sql_type, c.spark_type) for c in parsed.changes] == [
        ("a", "int(11) unsigned", "bigint"),
        ("b", "datetime(3)", "timestamp"),
        ("c", "tinyint(1)", "boolean"),
        ("e", "time", None),
    ]
    # a format's rules replace the parser's types where they give one (a null: the parser's type stays)
    typed = typed_as(parsed, {"datetime(3)": "timestamp_ntz", "tinyint(1)": None, "time": "string"})
    assert [(c.column, c.spark_type) for c in typed.changes] == [
        ("a", "bigint"),
        ("b", "timestamp_ntz"),
        ("c", "boolean"),
        ("e", "string"),
    ]
    created = parse_ddl("CREATE TABLE t (id int primary key, seen datetime)", db_type=None, database="x", schema=None)
    assert created.changes[0].column_sql_types == ("int", "datetime")
    typed = typed_as(created, {"int": "bigint", "datetime": "timestamp_ntz"})
    assert typed.changes[0].columns == (("id", "bigint"), ("seen", "timestamp_ntz"))
    assert typed.changes[0].key_columns == ("id",)
    oracle = parse_ddl('ALTER TABLE "T" MODIFY (c NUMBER(10,2), d DATE)', db_type="Oracle", database=None, schema="S")
    assert [(c.column, c.sql_type) for c in oracle.changes] == [("C", "number(10, 2)"), ("D", "date")]


# ------------------------------------------------------------------------------------------------------------------
# Applied to Delta

COLUMNS = {"id": "bigint(20)", "name": "varchar(64)", "score": "double", "qty": "int(11)"}


def row_message(
    op: str,
    table: str,
    rows: list[dict[str, Any]],
    types: dict[str, str],
    old: Any = None,
    keys: list[str] | None = None,
) -> str:
    return json.dumps(
        {
            "data": rows,
            "database": "crm",
            "es": 1709288131000,
            "id": 1,
            "isDdl": False,
            "mysqlType": types,
            "old": old,
            "pkNames": ["id"] if keys is None else keys,
            "sql": "",
            "table": table,
            "ts": 1709288131377,
            "type": op,
        }
    )


def ddl_message(table: str, sql: str, kind: str = "ALTER") -> str:
    return json.dumps(
        {
            "data": None,
            "database": "crm",
            "es": 1709288131000,
            "id": 1,
            "isDdl": True,
            "mysqlType": None,
            "old": None,
            "pkNames": None,
            "sql": sql,
            "table": table,
            "ts": 1709288131377,
            "type": kind,
        }
    )


def scenario() -> list[str]:
    after_add = {**COLUMNS, "tier": "varchar(8)"}
    renamed = {
        "id": "bigint(20)",
        "full_name": "varchar(64)",
        "score": "double",
        "qty": "int(11)",
        "tier": "varchar(8)",
    }
    dropped = {k: v for k, v in renamed.items() if k != "score"}
    widened_qty = {**dropped, "qty": "bigint(20)"}
    return [
        row_message("INSERT", "customer", [{"id": "1", "name": "a", "score": "1.5", "qty": "7"}], COLUMNS),
        ddl_message("customer", "ALTER TABLE customer ADD COLUMN tier varchar(8) NULL"),
        row_message(
            "INSERT", "customer", [{"id": "2", "name": "b", "score": "2.5", "qty": "8", "tier": "gold"}], after_add
        ),
        ddl_message("customer", "ALTER TABLE customer RENAME COLUMN name TO full_name"),
        row_message(
            "UPDATE",
            "customer",
            [{"id": "1", "full_name": "aa", "score": "1.5", "qty": "7", "tier": None}],
            renamed,
            old=[{"full_name": "a"}],
        ),
        ddl_message("customer", "ALTER TABLE customer DROP COLUMN score"),
        row_message("INSERT", "customer", [{"id": "3", "full_name": "c", "qty": "9", "tier": "silver"}], dropped),
        # the source widened qty (int -> bigint): a value beyond int must land exactly
        row_message(
            "INSERT", "customer", [{"id": "4", "full_name": "d", "qty": "9000000000", "tier": None}], widened_qty
        ),
        ddl_message("customer", "ALTER TABLE customer MODIFY COLUMN tier bigint"),  # would lose 'gold': rejected
        ddl_message("customer", "CREATE INDEX by_tier ON customer (tier)", "CINDEX"),  # changes no column
        ddl_message("customer", "ALTER TABLE customer FROBNICATE"),  # not understood: dead letter
        ddl_message("customer", "RENAME TABLE customer TO client", "RENAME"),
        row_message("INSERT", "client", [{"id": "5", "full_name": "e", "qty": "1", "tier": "gold"}], widened_qty),
        ddl_message("client_copy", "CREATE TABLE `client_copy` LIKE `client`", "CREATE"),
        ddl_message("scratch", "CREATE TABLE scratch (id bigint primary key, flag tinyint(1), born date)", "CREATE"),
        ddl_message("scratch", "DROP TABLE scratch", "ERASE"),
        # created again with another definition: the empty lake table takes it (columns, types, key), even types that
        # Spark does not cast to (date -> bigint)
        ddl_message(
            "scratch",
            "CREATE TABLE scratch (code varchar(8), flag varchar(5), born int, PRIMARY KEY (code))",
            "CREATE",
        ),
        row_message(
            "INSERT",
            "scratch",
            [{"code": "x", "flag": "yes"}],
            {"code": "varchar(8)", "flag": "varchar(5)"},
            keys=["code"],
        ),
        ddl_message("client", "CREATE TABLE IF NOT EXISTS client (id bigint primary key)", "CREATE"),
        # A column without values takes any type, also one Spark does not cast to: date -> bigint by DDL, then bigint ->
        # date declared by the data.
        ddl_message("client", "ALTER TABLE client ADD COLUMN since date"),
        ddl_message("client", "ALTER TABLE client MODIFY COLUMN since int"),
        row_message(
            "INSERT",
            "client",
            [{"id": "6", "full_name": "f", "qty": "2", "tier": None, "since": "2024-05-01"}],
            {**widened_qty, "since": "date"},
        ),
    ]


EXPECTED_CLIENT = [
    {"id": 1, "full_name": "aa", "qty": 7, "tier": None, "since": None},
    {"id": 2, "full_name": "b", "qty": 8, "tier": "gold", "since": None},
    {"id": 3, "full_name": "c", "qty": 9, "tier": "silver", "since": None},
    {"id": 4, "full_name": "d", "qty": 9000000000, "tier": None, "since": None},
    {"id": 5, "full_name": "e", "qty": 1, "tier": "gold", "since": None},
    {"id": 6, "full_name": "f", "qty": 2, "tier": None, "since": date(2024, 5, 1)},
]


def run_scenario(spark, tmp_path: Path, batch_lines: int, **settings: Any) -> str:  # type: ignore[no-untyped-def]
    tmp_path.mkdir(parents=True, exist_ok=True)
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(line + "\n" for line in scenario()), encoding="utf-8")
    lake = str(tmp_path / "lake")
    replay(spark, lake=lake, format_name="canal-json", paths=[str(capture)], batch_lines=batch_lines, **settings)
    return lake


@pytest.mark.spark
@pytest.mark.parametrize("batch_lines", [100, 4], ids=["one-batch", "four-per-batch"])
def test_ddl_applies_at_its_position_in_the_stream(spark, tmp_path: Path, batch_lines: int) -> None:
    lake = run_scenario(spark, tmp_path, batch_lines)

    client = sorted(read_table(f"{lake}/crm/client"), key=lambda r: r["id"])
    assert client == EXPECTED_CLIENT
    assert read_table(f"{lake}/crm/customer") == []  # renamed away: rows moved
    schema = dict(spark.read.format("delta").load(f"{lake}/crm/client").dtypes)
    assert schema["qty"] == "bigint"
    assert "score" not in schema
    assert "name" not in schema
    copy = spark.read.format("delta").load(f"{lake}/crm/client_copy")
    assert copy.count() == 0
    # copied before `since` was added to client
    assert copy.dtypes == [
        (n, t) for n, t in spark.read.format("delta").load(f"{lake}/crm/client").dtypes if n != "since"
    ]
    scratch = spark.read.format("delta").load(f"{lake}/crm/scratch")
    assert read_table(f"{lake}/crm/scratch") == [{"code": "x", "flag": "yes", "born": None}]
    assert [(n, t) for n, t in scratch.dtypes if not n.startswith("_cdc_")] == [
        ("code", "string"),
        ("flag", "string"),
        ("born", "bigint"),  # Canal lands every MySQL integer as bigint, DDL columns too
    ]
    properties = dict(spark.sql(f"SHOW TBLPROPERTIES delta.`{lake}/crm/scratch`").collect())
    assert properties["cdclake.keyColumns"] == "code"

    changes = spark.read.format("delta").load(f"{lake}/_cdclake/schema_changes").orderBy("offset").collect()
    outcomes = {r["ddl"]: r["outcome"] for r in changes}
    assert outcomes["ALTER TABLE customer DROP COLUMN score"] == "applied: column score dropped"
    assert (
        outcomes["ALTER TABLE customer RENAME COLUMN name TO full_name"] == "applied: column name renamed to full_name"
    )
    assert outcomes["ALTER TABLE customer MODIFY COLUMN tier bigint"].startswith("dead letter: column tier: string")
    assert outcomes["CREATE INDEX by_tier ON customer (tier)"].startswith("ignored:")
    assert outcomes["RENAME TABLE customer TO client"] == "applied: rows moved to crm.client"
    assert (
        outcomes["CREATE TABLE `client_copy` LIKE `client`"] == "applied: table created with the columns of crm.client"
    )
    created = [r for r in changes if r["ddl"].startswith("CREATE TABLE scratch")]
    assert [r["outcome"] for r in created] == [
        "applied: table created",
        "applied: the empty lake table takes the new definition (code string, flag string, born bigint; key code)",
    ]
    assert outcomes["ALTER TABLE client MODIFY COLUMN since int"] == "applied: column since date -> bigint"
    assert schema["since"] == "date"
    assert outcomes["CREATE TABLE IF NOT EXISTS client (id bigint primary key)"] == "nothing to do: table exists"
    reasons = sorted(r["reason"] for r in spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").collect())
    assert len(reasons) == 2
    assert reasons[0].startswith("DDL not applied: DDL syntax not understood")
    assert reasons[1].startswith("DDL not applied: column tier: string -> bigint would not keep stored values")


@pytest.mark.spark
def test_ddl_policies_ignore_and_fail(spark, tmp_path: Path) -> None:
    lake = run_scenario(spark, tmp_path / "ignore", 100, ddl_policy="ignore")
    customer = sorted(read_table(f"{lake}/crm/customer"), key=lambda r: r["id"])
    # statements are recorded, not applied; columns the data brings are still added, so no value is lost
    assert [r["id"] for r in customer] == [1, 2, 3, 4]
    # the update's full image has no `name` any more (renamed at the source), so the old column is NULL for that row
    assert customer[0]["name"] is None
    assert customer[0]["full_name"] == "aa"
    assert customer[0]["score"] == 1.5
    with pytest.raises(SchemaChangeError, match=r"crm.customer .*policy 'fail'.*Fix:"):
        run_scenario(spark, tmp_path / "fail", 100, ddl_table_policies={"crm.customer": "fail"})


@pytest.mark.spark
def test_dropping_and_renaming_columns_that_steer_merges(spark, tmp_path: Path) -> None:
    """A table without key columns is matched on every column, and a keyed table on its keys: their MERGEs prune
    files by those columns' statistics. Dropping or renaming such a column rewrites the table without it (a renamed
    key column stays the key under its new name)."""
    log_types = {"at": "bigint(20)", "msg": "varchar(32)", "level": "varchar(8)"}
    renamed = {"at": "bigint(20)", "text": "varchar(32)"}
    account_types = {"id": "bigint(20)", "name": "varchar(32)"}
    messages = [
        row_message("INSERT", "log", [{"at": "1", "msg": "a", "level": "info"}], log_types, keys=[]),
        row_message("INSERT", "account", [{"id": "1", "name": "x"}], account_types),
        ddl_message("log", "ALTER TABLE log RENAME COLUMN msg TO text"),
        ddl_message("log", "ALTER TABLE log DROP COLUMN level"),
        ddl_message("account", "ALTER TABLE account RENAME COLUMN id TO account_id"),
        row_message("INSERT", "log", [{"at": "2", "text": "b"}], renamed, keys=[]),
        row_message(
            "UPDATE",
            "account",
            [{"account_id": "1", "name": "y"}],
            {"account_id": "bigint(20)", "name": "varchar(32)"},
            old=[{"name": "x"}],
            keys=["account_id"],
        ),
    ]
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(line + "\n" for line in messages), encoding="utf-8")
    lake = str(tmp_path / "lake")
    results = replay(spark, lake=lake, format_name="canal-json", paths=[str(capture)])

    assert sum(r.dead_letters for r in results) == 0
    assert sorted(read_table(f"{lake}/crm/log"), key=lambda r: r["at"]) == [
        {"at": 1, "text": "a"},
        {"at": 2, "text": "b"},
    ]
    assert read_table(f"{lake}/crm/account") == [{"account_id": 1, "name": "y"}]


def test_a_statement_that_a_second_dialect_parses_logs_no_sqlglot_fallback(caplog: pytest.LogCaptureFixture) -> None:
    """A source without a database type (Canal) gets sqlglot's default dialect, then MySQL's. The first attempt's
    fallback to an opaque command is cdclake's to handle: sqlglot's warning about it is not passed on from
    parse_ddl, while sqlglot used directly keeps it."""
    import sqlglot

    text = "ALTER TABLE `orders` ADD COLUMN `extra_1` bigint(20) NULL"
    with caplog.at_level(logging.WARNING, logger="sqlglot"):
        parsed = parse_ddl(text, db_type=None, database="shop", schema=None)
    assert [(c.kind, c.column, c.spark_type) for c in parsed.changes] == [("add_column", "extra_1", "bigint")]
    assert not [r for r in caplog.records if r.name == "sqlglot"]

    with caplog.at_level(logging.WARNING, logger="sqlglot"):
        sqlglot.parse_one(text)
    assert any("Falling back" in r.getMessage() for r in caplog.records if r.name == "sqlglot")


@pytest.mark.spark
def test_ddl_applies_at_its_log_position_in_tables_ordered_by_a_column(spark, tmp_path: Path) -> None:
    """``sequence_by`` orders row changes by ``value|position`` and a statement has its position only: compared
    whole, every row change of the batch sorted before every statement (a value key's digits are below Canal's
    ``~`` Kafka position), so the update that spells ``full_name`` went in before the rename of ``name``, and so on.
    The batch is cut into segments by the log part of the orders (``apply.log_order``). Each key's changes share its
    ``id``, so the lake ends as without the setting."""
    lake = run_scenario(spark, tmp_path, 100, sequence_by={"crm.*": "id"})
    assert sorted(read_table(f"{lake}/crm/client"), key=lambda r: r["id"]) == EXPECTED_CLIENT
    schema = dict(spark.read.format("delta").load(f"{lake}/crm/client").dtypes)
    assert "score" not in schema
    assert "name" not in schema
    reasons = sorted(r["reason"] for r in spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").collect())
    assert len(reasons) == 2, reasons
    assert reasons[0].startswith("DDL not applied: DDL syntax not understood")
    assert reasons[1].startswith("DDL not applied: column tier: string -> bigint would not keep stored values")


# MySQL column types as Canal's mysqlType spells them, with a value of each.
CANAL_COLUMNS: dict[str, tuple[str, str]] = {
    "c_int": ("int(11)", "5"),
    "c_uint": ("int(10) unsigned", "4000000000"),
    "c_tiny": ("tinyint(4)", "-3"),
    "c_flag": ("tinyint(1)", "1"),
    "c_small": ("smallint(6)", "300"),
    "c_medium": ("mediumint(8) unsigned", "16000000"),
    "c_ubig": ("bigint(20) unsigned", "18446744073709551615"),
    "c_dec": ("decimal(10,2)", "12.34"),
    "c_float": ("float", "1.5"),
    "c_double": ("double", "2.25"),
    "c_bit": ("bit(1)", "1"),
    "c_date": ("date", "2024-01-02"),
    "c_dt": ("datetime(3)", "2024-01-02 10:00:00.123"),
    "c_ts": ("timestamp(6)", "2024-01-02 10:00:00.123456"),
    "c_time": ("time", "10:11:12"),
    "c_year": ("year(4)", "2024"),
    "c_text": ("varchar(16)", "x"),
    "c_json": ("json", '{"a": 1}'),
    "c_enum": ("enum('a','b')", "a"),
    "c_blob": ("blob", "ab"),
}


@pytest.mark.spark
def test_columns_that_canal_ddl_declares_are_typed_as_canal_data_types_them(spark, tmp_path: Path) -> None:
    """Canal lands every MySQL integer as bigint, a DATETIME as timestamp_ntz, a FLOAT as double, BIT as bigint. Typed
    by the DDL parser (int, timestamp, float, boolean), a column that CREATE TABLE or ADD COLUMN declared was retyped
    by its first values, a rewrite of the whole table, and a MODIFY that keeps the source type (to add NOT NULL) was
    a dead letter on a column that data had made bigint. The DDL's columns now take the format's own types."""
    first = dict(list(CANAL_COLUMNS.items())[:10])
    added = dict(list(CANAL_COLUMNS.items())[10:])
    first_types = {"id": "bigint(20)", **{name: t for name, (t, _) in first.items()}}
    all_types = {**first_types, **{name: t for name, (t, _) in added.items()}}
    first_row = {"id": "1", **{name: v for name, (_, v) in first.items()}}
    second_row = {"id": "2", **{name: v for name, (_, v) in CANAL_COLUMNS.items()}}
    rows = [
        row_message("INSERT", "customer", [first_row], first_types),
        row_message("INSERT", "customer", [second_row], all_types),
        row_message("UPDATE", "customer", [{**second_row, "c_int": "6"}], all_types, old=[{"c_int": "5"}]),
    ]
    definitions = ", ".join(f"{name} {t}" for name, t in first_types.items())
    create = f"CREATE TABLE customer ({definitions}, PRIMARY KEY (id))"
    statements = [
        ddl_message("customer", create, "CREATE"),
        ddl_message(
            "customer", "ALTER TABLE customer " + ", ".join(f"ADD COLUMN {n} {t}" for n, (t, _) in added.items())
        ),
        ddl_message("customer", "ALTER TABLE customer MODIFY COLUMN c_int int(11) NOT NULL"),
        ddl_message("customer", "ALTER TABLE customer MODIFY COLUMN c_dt datetime(3) NOT NULL"),
    ]
    by_ddl = [statements[0], rows[0], statements[1], rows[1], statements[2], statements[3], rows[2]]
    lakes = {}
    for name, messages in {"by_ddl": by_ddl, "by_data": rows}.items():
        (tmp_path / name).mkdir()
        assert replay_lines(spark, tmp_path / name, name, messages, "canal-json", batch_lines=1) == 0
        lakes[name] = str(tmp_path / name / "lake")

    def user_types(lake: str) -> dict[str, str]:
        frame = spark.read.format("delta").load(f"{lake}/crm/customer")
        return {n: t for n, t in frame.dtypes if not n.startswith("_cdc_")}

    assert user_types(lakes["by_ddl"]) == user_types(lakes["by_data"])
    assert user_types(lakes["by_ddl"])["c_dt"] == "timestamp_ntz"
    assert user_types(lakes["by_ddl"])["c_int"] == "bigint"

    def lake_rows(lake: str) -> list[dict[str, Any]]:
        frame = spark.read.format("delta").load(f"{lake}/crm/customer")
        return sorted((r.asDict() for r in frame.select(*user_types(lake)).collect()), key=lambda r: r["id"])

    assert lake_rows(lakes["by_ddl"]) == lake_rows(lakes["by_data"])
    assert lake_rows(lakes["by_ddl"])[1]["c_dt"] == datetime(2024, 1, 2, 10, 0, 0, 123000)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{lakes['by_ddl']}/crm/customer`").collect()
    overwrites = [
        r["operation"]
        for r in history
        if (r["operationParameters"] or {}).get("mode") == "Overwrite" and r["userMetadata"] != REWRITE_METADATA
    ]
    assert overwrites == []  # no rewrite of the table for its types (a batch's row changes may rewrite its rows)
    changes = spark.read.format("delta").load(f"{lakes['by_ddl']}/_cdclake/schema_changes").collect()
    outcomes = {r["ddl"]: r["outcome"] for r in changes}
    assert outcomes[create] == "applied: table created"
    assert outcomes["ALTER TABLE customer MODIFY COLUMN c_int int(11) NOT NULL"] == "nothing to do: column unchanged"
    assert outcomes["ALTER TABLE customer MODIFY COLUMN c_dt datetime(3) NOT NULL"] == (
        "nothing to do: column unchanged"
    )


@pytest.mark.spark
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_datetime_column_the_source_adds_lands_in_the_lake_and_history_tables(
    spark, tmp_path: Path, table_format: str
) -> None:
    """Canal lands a MySQL DATETIME as timestamp_ntz. Delta refuses to add such a column to a table created without
    one unless the table has its timestampNtz feature (DELTA_FEATURES_REQUIRE_MANUAL_ENABLEMENT): the batch failed on
    every restart, whether the column came with data or with ADD COLUMN, and so did the history tables' columns."""
    types = {"id": "bigint(20)", "name": "varchar(8)"}
    with_seen = {**types, "seen": "datetime(3)"}
    lines = [
        row_message("INSERT", "customer", [{"id": "1", "name": "a"}, {"id": "2", "name": "b"}], types),
        row_message("INSERT", "customer", [{"id": "3", "name": "c", "seen": "2024-01-02 10:00:00.5"}], with_seen),
        row_message("INSERT", "orders", [{"id": "1", "name": "x"}], types),
        ddl_message("orders", "ALTER TABLE orders ADD COLUMN seen datetime(3)"),
        row_message(
            "UPDATE",
            "orders",
            [{"id": "1", "name": "x", "seen": "2024-01-03 11:00:00"}],
            {**types, "seen": "datetime(3)"},
            old=[{"seen": None}],
        ),
    ]
    # a column that holds no value yet takes the type the data declares: here by a rewrite of the table
    lines += [
        row_message("INSERT", "events", [{"id": "1", "name": "x", "seen": None}], {**types, "seen": "timestamp"}),
        row_message("INSERT", "events", [{"id": "2", "name": "y", "seen": "2024-01-04 12:00:00"}], with_seen),
    ]
    dead_letters = replay_lines(
        spark,
        tmp_path,
        "capture",
        lines,
        "canal-json",
        batch_lines=1,
        changelog=True,
        scd2=True,
        table_format=table_format,
    )
    assert dead_letters == 0
    lake = str(tmp_path / "lake")
    reader = spark.read.format(table_format)
    customer = reader.load(f"{lake}/crm/customer")
    assert dict(customer.dtypes)["seen"] == "timestamp_ntz"
    assert sorted((r["id"], r["seen"]) for r in customer.collect()) == [
        (1, None),
        (2, None),
        (3, datetime(2024, 1, 2, 10, 0, 0, 500000)),
    ]
    orders = reader.load(f"{lake}/crm/orders").collect()
    assert [(r["id"], r["seen"]) for r in orders] == [(1, datetime(2024, 1, 3, 11, 0))]
    events = reader.load(f"{lake}/crm/events")
    assert dict(events.dtypes)["seen"] == "timestamp_ntz"
    assert sorted((r["id"], r["seen"]) for r in events.collect()) == [(1, None), (2, datetime(2024, 1, 4, 12, 0))]
    for table, seen in (("customer", datetime(2024, 1, 2, 10, 0, 0, 500000)), ("orders", datetime(2024, 1, 3, 11, 0))):
        for kind in ("changelog", "scd2"):
            history = history_table(spark, lake, kind, "crm", table, table_format)  # type: ignore[arg-type]
            assert history is not None
            assert seen in [r["seen"] for r in history.collect()], (table, kind)


@pytest.mark.spark
@pytest.mark.parametrize(
    ("table_format", "type_widening", "in_place"),
    [("delta", True, True), ("delta", False, False), ("iceberg", False, True)],
    ids=["delta-with-type-widening", "delta", "iceberg"],
)
def test_a_wider_decimal_widens_the_lake_column_in_place_where_the_table_format_can(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table_format: str, type_widening: bool, in_place: bool
) -> None:
    """MySQL `MODIFY price DECIMAL(10,2)` on a decimal(5,2) column: Canal data then declares decimal(10,2), and a DDL
    statement widens the column again, to decimal(12,2). Iceberg promotes a decimal's precision in its schema alone,
    and Delta does so for a table whose owner enabled type widening: the files written before stay as they are. A
    Delta table without it is rewritten, which every Delta reader reads. Either way, rows and types are the same, and
    the history tables follow the same way (a Delta history table takes its lake table's type widening)."""
    narrow = {"id": "bigint(20)", "price": "decimal(5,2)"}
    wider = {"id": "bigint(20)", "price": "decimal(10,2)"}
    widest = {"id": "bigint(20)", "price": "decimal(12,2)"}
    statement = "ALTER TABLE item MODIFY price DECIMAL(12,2)"
    lines = [
        row_message("INSERT", "item", [{"id": "1", "price": "123.45"}, {"id": "2", "price": "-0.50"}], narrow),
        row_message("INSERT", "item", [{"id": "3", "price": "12345678.90"}], wider),
        ddl_message("item", statement),
        row_message("UPDATE", "item", [{"id": "3", "price": "9999999999.99"}], widest, old=[{"price": "12345678.90"}]),
    ]
    lake = str(tmp_path / "lake")
    reader = spark.read.format(table_format)
    files_of_first_row: dict[str, list[str]] = {"lake": [], "changelog": [], "scd2": []}
    # MERGEs, which leave the files of rows they do not change (a small table's rewrite moves every row).
    monkeypatch.setattr(DeltaSink, "REWRITE_MAX_BYTES", -1)

    def after_batch(_: Any) -> None:
        for kind, files in files_of_first_row.items():
            table = (
                reader.load(f"{lake}/crm/item")
                if kind == "lake"
                else history_table(spark, lake, kind, "crm", "item", table_format)
            )
            assert table is not None
            first = table.where("id = 1").select(F.input_file_name().alias("file")).first()
            assert first is not None
            files.append(first["file"])

    properties = {"*": {"delta.enableTypeWidening": "true"}} if type_widening else None
    dead_letters = replay_lines(
        spark,
        tmp_path,
        "capture",
        lines,
        "canal-json",
        batch_lines=1,
        on_batch=after_batch,
        changelog=True,
        scd2=True,
        table_format=table_format,
        table_properties=properties,
    )
    assert dead_letters == 0
    item = reader.load(f"{lake}/crm/item")
    assert dict(item.dtypes)["price"] == "decimal(12,2)"
    expected = [(1, Decimal("123.45")), (2, Decimal("-0.50")), (3, Decimal("9999999999.99"))]
    assert sorted((r["id"], r["price"]) for r in item.collect()) == expected
    # Written by the first batch, and no row change reads its file: it stays, unless a widening (batches 2 and 3)
    # rewrites the table. The history tables follow the lake table's choice, with the table's next row changes (the
    # DDL's widening with batch 4).
    for kind, files in files_of_first_row.items():
        moved = [files[i] != files[i - 1] for i in range(1, len(files))]
        if in_place:
            assert moved == [False, False, False], (kind, files)
        else:
            rewritten_by = [True, True, moved[2]] if kind == "lake" else [True, False, True]
            assert moved == rewritten_by, (kind, files)
    changes = spark.read.format("delta").load(f"{lake}/_cdclake/schema_changes").collect()
    outcome = {r["ddl"]: r["outcome"] for r in changes}[statement]
    widening = "applied: column price decimal(10,2) -> decimal(12,2)"
    assert outcome == (widening + ", widened in place" if in_place else widening)
    for kind in ("changelog", "scd2"):
        history = history_table(spark, lake, kind, "crm", "item", table_format)
        assert history is not None
        assert dict(history.dtypes)["price"] == "decimal(12,2)"
        assert {(r["id"], r["price"]) for r in history.collect()} >= {*expected, (3, Decimal("12345678.90"))}
