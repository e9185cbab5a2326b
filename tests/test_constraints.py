"""A lake table's own CHECK constraints (README "What lands in the lake"): a row that does not meet one becomes a
dead letter naming it, and the rest of the batch lands (Delta would otherwise fail the whole MERGE, on every
restart); a column change that would leave a constraint reading a missing column is not applied. After the owner
drops the constraint, the dead letters replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdclake import model
from cdclake.constraints import columns_used, condition_on_image, violation_reason
from cdclake.dlq import replay_dead_letters
from cdclake.exceptions import ConstraintViolationError
from cdclake.runner import replay
from cdclake.sinks import TableFormat, lake_sink
from cdclake.sinks.delta import MergeStatement, written_rows
from cdclake.spark import local_frame

COLUMNS = [("id", "bigint"), ("v", "string"), ("n", "bigint"), ("Weird Col", "date"), ("raw", "binary")]


def test_columns_used_are_the_table_columns_a_condition_reads() -> None:
    assert columns_used("n > 0 AND length(v) <= 3", COLUMNS) == ["v", "n"]
    assert columns_used("`weird col` >= DATE'2020-01-01'", COLUMNS) == ["Weird Col"]
    assert columns_used("N IS NOT NULL", COLUMNS) == ["n"]
    # Text sqlglot cannot parse: every column named in it as a word, to be safe.
    assert columns_used("n >>>> (v", COLUMNS) == ["v", "n"]


def test_a_condition_on_the_image_reads_each_column_typed_as_the_table_column() -> None:
    assert condition_on_image("n > 0", COLUMNS) == "TRY_CAST(`after`['n'] AS BIGINT) > 0"
    assert (
        condition_on_image("`weird col` IS NOT NULL OR raw IS NULL", COLUMNS)
        == "NOT TRY_CAST(`after`['Weird Col'] AS DATE) IS NULL OR TRY_TO_BINARY(`after`['raw'], 'base64') IS NULL"
    )
    # Not evaluated before the MERGE (left to Delta): a column the table lacks, a qualified name, unparseable text.
    assert condition_on_image("missing > 0", COLUMNS) is None
    assert condition_on_image("t.n > 0", COLUMNS) is None
    assert condition_on_image("n >>>> (v", COLUMNS) is None


@pytest.mark.spark
def test_partial_images_are_checked_only_when_they_carry_the_columns_read(spark: SparkSession) -> None:
    events = spark.createDataFrame(
        [
            ("INSERT", {"id": "1", "n": "-1"}, False),  # does not meet positive
            ("INSERT", {"id": "2"}, False),  # full image without n: n is NULL, which does not meet it either
            ("UPDATE", {"id": "3", "v": "x"}, True),  # partial, without n: the row keeps its stored n
            ("UPDATE", {"id": "4", "n": "0"}, True),  # partial with n
            ("DELETE", None, False),  # a delete writes no row
            ("UPSERT", {"id": "6", "n": "9"}, False),
        ],
        f"{model.OP} string, {model.AFTER} map<string,string>, {model.AFTER_IS_PARTIAL} boolean",
    )
    reason, unchecked = violation_reason(
        # A condition sqlglot parses but Spark does not accept (an unknown function) is left unchecked too.
        {"positive": "n > 0", "elsewhere": "other.n > 0", "odd": "no_such_function(n) > 0"},
        COLUMNS,
        "shop/orders",
        events,
    )
    assert reason is not None
    assert unchecked == ["elsewhere", "odd"]
    rows = events.select(F.col(model.AFTER)["id"].alias("id"), reason.alias("reason")).collect()
    message = (
        "the row does not meet CHECK constraint positive (n > 0) of lake table shop/orders: correct it at the source, "
        "or change the constraint (ALTER TABLE ... DROP CONSTRAINT positive), then replay this dead letter"
    )
    assert [(r["id"], r["reason"]) for r in rows] == [
        ("1", message),
        ("2", message),
        ("3", None),
        ("4", message),
        (None, None),
        ("6", None),
    ]


def _message(op: str, sequence: int, row: dict[str, Any] | None = None, ddl: str | None = None) -> str:
    """A DataWorks message of MySQL table ``shop.orders`` (key ``id``)."""
    types = {int: "LONG", str: "STRING", type(None): "LONG"}
    columns = row or {"id": None}
    message: dict[str, Any] = {
        "schema": {
            "dataColumn": [{"name": name, "type": types[type(value)]} for name, value in columns.items()],
            "primaryKey": ["id"],
            "source": {"dbType": "MySQL", "dbName": "shop", "tableName": "orders"},
        },
        "payload": {
            "before": {"dataColumn": row} if op == "DELETE" else None,
            "after": None if op == "DELETE" or row is None else {"dataColumn": row},
            "sequenceId": str(sequence),
            "timestamp": {"eventTime": 1_709_288_131_000 + sequence},
            "op": op,
            "ddl": None if ddl is None else {"text": ddl},
        },
        "version": "1.0.0",
    }
    return json.dumps(message)


@pytest.mark.spark
def test_rows_that_do_not_meet_a_check_constraint_become_dead_letters_until_the_owner_changes_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = str(tmp_path / "lake")
    table = f"{lake}/shop/orders"

    def land(name: str, *messages: str) -> None:
        _land(spark, tmp_path, "dataworks-json", name, *messages)

    def rows() -> list[tuple[Any, ...]]:
        frame = spark.read.format("delta").load(table)
        names = [c for c in frame.columns if not c.startswith("_cdc_")]
        return sorted(tuple(r) for r in frame.select(*names).collect())

    land(
        "1-before",
        _message("INSERT", 1, {"id": 1, "v": "a", "n": 5}),
        _message("INSERT", 2, {"id": 2, "v": "b", "n": 7}),
    )
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT positive CHECK (n > 0)")
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT short CHECK (length(v) <= 3)")
    land(
        "2-with-constraints",
        _message("INSERT", 3, {"id": 3, "v": "c", "n": -1}),
        _message("INSERT", 4, {"id": 4, "v": "d", "n": None}),
        _message("UPDATE_AFTER", 5, {"id": 1, "v": "long", "n": 6}),
        _message("INSERT", 6, {"id": 5, "v": "ok", "n": 2}),
        _message("DELETE", 7, {"id": 2, "v": "b", "n": 7}),
    )
    # The column the constraint reads is dropped at the source: not applied while the constraint reads it.
    land(
        "3-drop-column",
        _message("ALTER", 8, ddl="ALTER TABLE orders DROP COLUMN n"),
        _message("INSERT", 9, {"id": 6, "v": "x", "n": 3}),
    )
    assert rows() == [(1, "a", 5), (5, "ok", 2), (6, "x", 3)]

    def not_met(name: str, condition: str) -> str:
        return (
            f"the row does not meet CHECK constraint {name} ({condition}) of lake table shop/orders: correct it at "
            f"the source, or change the constraint (ALTER TABLE ... DROP CONSTRAINT {name}), then replay this dead "
            "letter"
        )

    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").orderBy("topic", "offset").collect()
    assert [(Path(r["topic"]).name, r["offset"], r["reason"]) for r in dead] == [
        ("2-with-constraints.jsonl", 0, not_met("positive", "n > 0")),
        ("2-with-constraints.jsonl", 1, not_met("positive", "n > 0")),
        # Delta keeps the condition as its parser's tokens.
        ("2-with-constraints.jsonl", 2, not_met("short", "length ( v ) <= 3")),
        (
            "3-drop-column.jsonl",
            0,
            "DDL not applied: column n is read by CHECK constraint positive (n > 0) of the lake table; drop the "
            "constraint (ALTER TABLE ... DROP CONSTRAINT positive), then replay this dead letter",
        ),
    ]
    changes = spark.read.format("delta").load(f"{lake}/_cdclake/schema_changes").collect()
    assert [r["outcome"] for r in changes] == [
        "dead letter: column n is read by CHECK constraint positive (n > 0) of the lake table; drop the constraint "
        "(ALTER TABLE ... DROP CONSTRAINT positive), then replay this dead letter"
    ]

    # The owner drops `positive`: the rows it refused and the column drop replay; `short` still refuses the update.
    spark.sql(f"ALTER TABLE delta.`{table}` DROP CONSTRAINT positive")
    report = replay_dead_letters(spark, lake)
    assert (report.selected, report.applied, [f.offset for f in report.failures]) == (4, 3, [2])
    assert rows() == [(1, "a"), (3, "c"), (4, "d"), (5, "ok"), (6, "x")]

    # A condition over cdclake's own columns cannot be read off an image: it is checked on the row the MERGE would
    # write, which carries them.
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT early CHECK (_cdc_position < '{'0' * 22}10')")
    land("4-cdclake-columns", _message("INSERT", 10, {"id": 7, "v": "y"}))
    assert rows() == [(1, "a"), (3, "c"), (4, "d"), (5, "ok"), (6, "x")]
    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").where("topic LIKE '%4-cdclake-columns%'")
    assert [r["reason"] for r in dead.collect()] == [_row_not_met("early", f"_cdc_position < '{'0' * 22}10'")]


@pytest.mark.spark
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_table_made_by_hand_gets_cdclakes_columns_and_what_its_columns_declare_refuses_rows_as_dead_letters(
    spark: SparkSession, tmp_path: Path, table_format: TableFormat
) -> None:
    lake = str(tmp_path / "lake")
    sink = lake_sink(spark, lake, table_format)
    # Made by hand before the first run: rows of its own, a NOT NULL column, none of cdclake's columns (every MERGE
    # into it failed, as did every NULL written to `v`).
    if table_format == "delta":
        identifier = f"delta.`{sink.table_path('shop', None, 'orders')}`"
    else:
        identifier = sink.identifier("shop", None, "orders")
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {identifier.rsplit('.', 1)[0]}")
    delta = table_format == "delta"
    varchar = ", w VARCHAR(5)" if delta else ""  # Iceberg has no varchar(n)
    spark.sql(f"CREATE TABLE {identifier} (id BIGINT, v STRING NOT NULL{varchar}) USING {table_format}")
    spark.sql(f"INSERT INTO {identifier} (id, v) VALUES (1, 'old'), (9, 'kept')")
    messages = [
        _message("UPDATE_AFTER", 1, {"id": 1, "v": "new"}),
        _message("INSERT", 2, {"id": 3, "v": None}),
        _message("INSERT", 3, {"id": 4, "v": "d"}),
    ]
    if delta:  # a varchar(5) holds 5 characters, trailing blanks included (Delta's invariant on a MERGE)
        messages += [
            _message("INSERT", 4, {"id": 5, "v": "e", "w": "abcde"}),
            _message("INSERT", 5, {"id": 6, "v": "f", "w": "abcd  "}),
        ]
    capture = tmp_path / "changes.jsonl"
    capture.write_text("\n".join(messages) + "\n", encoding="utf-8")
    replay(spark, lake=lake, format_name="dataworks-json", paths=[str(capture)], table_format=table_format)

    def rows() -> list[tuple[Any, ...]]:
        return sorted((r["id"], r["v"]) for r in sink.read("shop", "orders").collect())

    landed = [(1, "new"), (4, "d"), *([(5, "e")] if delta else []), (9, "kept")]
    assert rows() == landed
    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").orderBy("offset").collect()
    assert [r["reason"] for r in dead] == [
        "the row does not meet the NOT NULL of column v of lake table shop/orders: correct it at the source, or allow "
        "NULL in the column (ALTER TABLE ... ALTER COLUMN v DROP NOT NULL), then replay this dead letter",
        *(
            [
                "the row does not meet the varchar(5) type of column w of lake table shop/orders: correct it at the "
                "source, or widen the column (ALTER TABLE ... ALTER COLUMN w TYPE STRING), then replay this dead "
                "letter"
            ]
            if delta
            else []
        ),
    ]
    # The owner allows NULL (and longer text): the dead letters replay.
    spark.sql(f"ALTER TABLE {identifier} ALTER COLUMN v DROP NOT NULL")
    if delta:
        spark.sql(f"ALTER TABLE {identifier} ALTER COLUMN w TYPE STRING")
    assert replay_dead_letters(spark, lake, table_format=table_format).applied == len(dead)
    assert rows() == sorted([*landed, (3, None), *([(6, "f")] if delta else [])])


@pytest.mark.spark
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_table_made_by_hand_with_its_own_timestamp_kinds_and_computed_columns_takes_the_rows(
    spark: SparkSession, tmp_path: Path, table_format: TableFormat
) -> None:
    """A table made by hand with TIMESTAMP for a MySQL DATETIME (a wall clock: taken as UTC) and TIMESTAMP_NTZ for a
    MySQL TIMESTAMP (an instant: its UTC wall clock), and on Delta an identity and a generated column, which Delta
    computes. Before, each of the table's row events was a dead letter (the timestamps' types did not fit), and then
    every MERGE failed (DELTA_IDENTITY_COLUMNS_UPDATE_NOT_SUPPORTED, a generated column's NULL)."""
    from datetime import date, datetime

    from tests.test_ddl import ddl_message, row_message

    lake = str(tmp_path / "lake")
    sink = lake_sink(spark, lake, table_format)
    delta = table_format == "delta"
    if delta:
        identifier = f"delta.`{sink.table_path('crm', None, 'events')}`"
    else:
        identifier = sink.identifier("crm", None, "events")
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {identifier.rsplit('.', 1)[0]}")
    computed = ", sk BIGINT NOT NULL GENERATED ALWAYS AS IDENTITY, day DATE GENERATED ALWAYS AS (CAST(at AS DATE))"
    spark.sql(
        f"CREATE TABLE {identifier} (id BIGINT, at TIMESTAMP, seen TIMESTAMP_NTZ{computed if delta else ''}) "
        f"USING {table_format}"
    )
    spark.sql(
        f"INSERT INTO {identifier} (id, at, seen) VALUES (1, TIMESTAMP'2024-01-01 10:00:00Z', "
        "TIMESTAMP_NTZ'2024-01-01 10:00:00'), (9, TIMESTAMP'2024-01-02 10:00:00Z', TIMESTAMP_NTZ'2024-01-02 10:00:00')"
    )
    types = {"id": "bigint(20)", "at": "datetime", "seen": "timestamp"}  # canal: timestamp_ntz and timestamp
    messages = [
        row_message(
            "UPDATE",
            "events",
            [{"id": "1", "at": "2024-01-05 23:30:00", "seen": "2024-01-05 10:00:00.5"}],
            types,
            old=[{"at": "2024-01-01 10:00:00"}],
        ),
        row_message(
            "INSERT", "events", [{"id": "3", "at": "2024-01-03 00:15:00", "seen": "2024-01-03 00:15:00"}], types
        ),
    ]
    capture = tmp_path / "changes.jsonl"
    capture.write_text("\n".join(messages) + "\n", encoding="utf-8")
    for _ in range(2):  # run again: nothing changes
        replay(spark, lake=lake, format_name="canal-json", paths=[str(capture)], table_format=table_format)
        rows = sorted(
            tuple(r[c] for c in ("id", "at", "seen", *(("sk", "day") if delta else ())))
            for r in sink.read("crm", "events").collect()
        )
        # The process's time zone is UTC (tests/conftest.py): Python shows an instant as its UTC wall clock.
        assert rows == [
            (
                1,
                datetime(2024, 1, 5, 23, 30),
                datetime(2024, 1, 5, 10, 0, 0, 500000),
                *((1, date(2024, 1, 5)) if delta else ()),
            ),
            (3, datetime(2024, 1, 3, 0, 15), datetime(2024, 1, 3, 0, 15), *((3, date(2024, 1, 3)) if delta else ())),
            (9, datetime(2024, 1, 2, 10, 0), datetime(2024, 1, 2, 10, 0), *((2, date(2024, 1, 2)) if delta else ())),
        ]
    assert sink.read_system("dead_letters") is None
    # A DDL statement that gives a column the other timestamp kind (MySQL TIMESTAMP is an instant) keeps the
    # column's kind: its values are converted. It was a dead letter (the stored values would not be kept as they are).
    ddl = ddl_message("events", "ALTER TABLE events MODIFY seen TIMESTAMP(3) NOT NULL")
    (tmp_path / "ddl.jsonl").write_text(ddl + "\n", encoding="utf-8")
    replay(spark, lake=lake, format_name="canal-json", paths=[str(tmp_path / "ddl.jsonl")], table_format=table_format)
    changes = sink.read_system("schema_changes")
    assert changes is not None
    assert [r["outcome"] for r in changes.collect()] == [
        "nothing to do: column seen keeps timestamp_ntz (timestamp values are converted)"
    ]
    assert sink.read_system("dead_letters") is None


@pytest.mark.spark
def test_delta_tables_made_by_hand_with_default_columns_the_source_lacks_fill_them_as_their_owner_declared(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Tables made by hand with columns of their own that the source table lacks, with a DEFAULT: a row inserted
    without such a column takes the DEFAULT, a row updated without it keeps its value, and a message that carries
    the column writes its value (NULL into a NOT NULL one is a dead letter). Before, each upsert wrote NULL there,
    and into a NOT NULL one made every row a dead letter. A DDL rewrite keeps the DEFAULTs (`events`). A DDL change
    that would rewrite a table with an identity column or a NOT NULL column (`orders`) is a dead letter saying so:
    the rewrite failed the batch (identity) or silently dropped the NOT NULL. (Iceberg's Spark catalog here does not
    take DEFAULTs: UNSUPPORTED_FEATURE.TABLE_OPERATION.)"""
    from tests.test_ddl import ddl_message, row_message

    lake = str(tmp_path / "lake")
    sink = lake_sink(spark, lake, "delta")

    def create(table: str, columns: str) -> None:
        identifier = f"delta.`{sink.table_path('crm', None, table)}`"
        spark.sql(
            f"CREATE TABLE {identifier} ({columns}) USING delta "
            "TBLPROPERTIES ('delta.feature.allowColumnDefaults' = 'supported')"
        )
        spark.sql(f"INSERT INTO {identifier} (id, v) VALUES (9, 'i')")

    create("events", "id BIGINT, v STRING, src STRING DEFAULT 'erp', loaded_at TIMESTAMP DEFAULT current_timestamp()")
    spark.sql(f"UPDATE delta.`{sink.table_path('crm', None, 'events')}` SET src = 'legacy'")
    create("orders", "id BIGINT, v STRING, qty INT NOT NULL DEFAULT 1, sk BIGINT GENERATED ALWAYS AS IDENTITY")
    create("notes", "id BIGINT, v STRING, src STRING DEFAULT 'erp'")  # no key: rows are matched on every column
    types = {"id": "bigint(20)", "v": "varchar(8)"}
    with_qty = {**types, "qty": "int(11)"}
    messages = [
        row_message("INSERT", "events", [{"id": "1", "v": "a"}, {"id": "2", "v": "b"}], types),
        row_message(
            "UPDATE", "events", [{"id": "1", "v": "a2"}, {"id": "9", "v": "i2"}], types, old=[{"v": "a"}, {"v": "i"}]
        ),
        row_message("DELETE", "events", [{"id": "2", "v": "b"}], types),
        row_message("INSERT", "events", [{"id": "3", "v": "c", "src": "crm"}], {**types, "src": "varchar(8)"}),
        row_message("INSERT", "orders", [{"id": "1", "v": "a"}], types),
        row_message(
            "INSERT", "orders", [{"id": "2", "v": "b", "qty": "5"}, {"id": "3", "v": "c", "qty": None}], with_qty
        ),
        row_message("UPDATE", "orders", [{"id": "9", "v": "i2"}], types, old=[{"v": "i"}]),
        row_message("INSERT", "notes", [{"id": "1", "v": "a"}, {"id": "2", "v": "b"}], types, keys=[]),
        # Second batch: a rename of events' column (a rewrite), a drop of orders' column (not applied).
        ddl_message("events", "ALTER TABLE events RENAME COLUMN v TO note"),
        row_message("INSERT", "events", [{"id": "5", "note": "e"}], {"id": "bigint(20)", "note": "varchar(8)"}),
        ddl_message("orders", "ALTER TABLE orders DROP COLUMN v"),
        row_message("INSERT", "orders", [{"id": "4"}], {"id": "bigint(20)"}),
        row_message("DELETE", "notes", [{"id": "1", "v": "a"}, {"id": "9", "v": "i"}], types, keys=[]),
    ]
    capture = tmp_path / "changes.jsonl"
    capture.write_text("\n".join(messages) + "\n", encoding="utf-8")
    replay(spark, lake=lake, format_name="canal-json", paths=[str(capture)], batch_lines=8)

    events = sink.read("crm", "events")
    assert events.columns[:4] == ["id", "note", "src", "loaded_at"]
    assert sorted((r["id"], r["note"], r["src"], r["loaded_at"] is not None) for r in events.collect()) == [
        (1, "a2", "erp", True),
        (3, "c", "crm", True),
        (5, "e", "erp", True),
        (9, "i2", "legacy", True),
    ]
    orders = sorted((r["id"], r["v"], r["qty"], r["sk"]) for r in sink.read("crm", "orders").collect())
    # Identity values: 9's kept by its update; the other rows' in the order Delta inserts them.
    assert [row[:3] for row in orders] == [(1, "a", 1), (2, "b", 5), (4, None, 1), (9, "i2", 1)]
    assert orders[-1][3] == 1
    assert len({row[3] for row in orders}) == 4
    # A delete matches a key-less row on the columns its image has: the DEFAULT column is not one of them.
    assert [(r["id"], r["v"], r["src"]) for r in sink.read("crm", "notes").collect()] == [(2, "b", "erp")]
    dead = sink.read_system("dead_letters")
    assert dead is not None
    assert sorted(r["reason"] for r in dead.collect()) == [
        "DDL not applied: rewriting the lake table for it would lose what its owner declared (NOT NULL of column qty; "
        "identity column sk); make the change by hand (ALTER TABLE ...; a Delta table needs "
        "'delta.columnMapping.mode' = 'name' to drop or rename a column), or drop those declarations, then replay "
        "this dead letter",
        "the row does not meet the NOT NULL of column qty of lake table crm/orders: correct it at the source, or "
        "allow NULL in the column (ALTER TABLE ... ALTER COLUMN qty DROP NOT NULL), then replay this dead letter",
    ]


@pytest.mark.spark
def test_a_ddl_change_that_would_rewrite_an_iceberg_table_made_by_hand_without_its_not_null_is_a_dead_letter(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark writes a replacing Iceberg table's columns optional, so a DDL rewrite of a table made by hand with a
    required column would silently drop its NOT NULL (as on Delta): the change is a dead letter saying so, and the
    batch's rows land. The DDL statement comes before the table's first row change, when the table has none of
    cdclake's columns yet (the rewrite selected them, and failed the batch)."""
    from tests.test_ddl import ddl_message, row_message

    lake = str(tmp_path / "lake")
    sink = lake_sink(spark, lake, "iceberg")
    identifier = sink.identifier("crm", None, "orders")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {identifier.rsplit('.', 1)[0]}")
    spark.sql(f"CREATE TABLE {identifier} (id BIGINT, v STRING, qty BIGINT NOT NULL) USING iceberg")
    spark.sql(f"INSERT INTO {identifier} VALUES (9, 'i', 1)")
    messages = [
        ddl_message("orders", "ALTER TABLE orders DROP COLUMN v"),
        row_message("INSERT", "orders", [{"id": "4", "qty": "7"}], {"id": "bigint(20)", "qty": "bigint(20)"}),
    ]
    capture = tmp_path / "changes.jsonl"
    capture.write_text("\n".join(messages) + "\n", encoding="utf-8")
    replay(spark, lake=lake, format_name="canal-json", paths=[str(capture)], table_format="iceberg")

    orders = sink.read("crm", "orders")
    assert not orders.schema["qty"].nullable
    assert sorted((r["id"], r["v"], r["qty"]) for r in orders.collect()) == [(4, None, 7), (9, "i", 1)]
    dead = sink.read_system("dead_letters")
    assert dead is not None
    assert [r["reason"] for r in dead.collect()] == [
        "DDL not applied: rewriting the lake table for it would lose what its owner declared (NOT NULL of column qty); "
        "make the change by hand (ALTER TABLE ...; a Delta table needs 'delta.columnMapping.mode' = 'name' to drop "
        "or rename a column), or drop those declarations, then replay this dead letter"
    ]


@pytest.mark.spark
def test_the_rows_a_merge_would_write_are_its_updates_and_inserts_as_it_leaves_them(spark: SparkSession) -> None:
    """``written_rows`` emulates a MERGE without writing: a matched row as its update leaves it (a column the update
    does not set keeps its stored value), an unmatched one as inserted (NULL where the insert sets nothing); a
    delete and a change whose update condition does not hold write no row."""
    stored = [(1, "a", 10, "kept"), (2, "b", 20, "x"), (3, "c", 30, "y")]
    target = local_frame(spark, stored, "id bigint, v string, n bigint, note string")
    changes = [
        ("k1", "U", 1, None, 11, True),  # updates row 1
        ("k2", "D", 2, None, None, False),  # deletes row 2
        ("k3", "U", 3, "old", 0, False),  # older than row 3: left alone
        ("k4", "U", 4, "new", 40, False),  # inserts row 4
    ]
    source = local_frame(spark, changes, "key string, kind string, id bigint, v string, n bigint, newer boolean")
    statement = MergeStatement(
        source=source,
        matched_on="t.id <=> s.id",
        insert_values={"`id`": "s.id", "`v`": "s.v", "`n`": "s.n"},
        insert_when="s.kind = 'U'",
        delete_when="s.kind = 'D'",
        update_when="s.kind = 'U' AND s.newer",
        update_set={"`v`": "coalesce(s.v, t.v)", "`n`": "s.n"},  # `note` is not set: it keeps its value
    )
    rows = written_rows(statement, target, ["id", "v", "n", "note"], ["key"])
    assert sorted(tuple(row) for row in rows.collect()) == [(1, "a", 11, "kept", "k1"), (4, "new", 40, None, "k4")]


def _land(spark: SparkSession, tmp_path: Path, format_name: str, name: str, *messages: str) -> None:
    """Replays ``messages`` (one batch, captured as ``<name>.jsonl``) into the lake at ``tmp_path / "lake"``."""
    capture = tmp_path / f"{name}.jsonl"
    capture.write_text("\n".join(messages) + "\n", encoding="utf-8")
    replay(spark, lake=str(tmp_path / "lake"), format_name=format_name, paths=[str(capture)])


def _row_not_met(name: str, condition: str, table: str = "shop/orders") -> str:
    return (
        "the row that the batch's changes of this key write (the stored row with them applied) does not meet CHECK "
        f"constraint {name} ({condition}) of lake table {table}: correct it at the source, or change the constraint "
        f"(ALTER TABLE ... DROP CONSTRAINT {name}), then replay these dead letters"
    )


def _ogg(op: str, position: int, after: dict[str, Any]) -> str:
    """An Oracle GoldenGate JSON message of table ``SHOP.ORDERS`` (key ``ID``); an update's after image holds only
    the columns it names (a compressed update: partial, maxwell-ogg.md 2)."""
    return json.dumps(
        {
            "table": "SHOP.ORDERS",
            "op_type": op,
            "op_ts": "2024-03-01 10:15:31.000000",
            "pos": f"{position:020d}",
            "primary_keys": ["ID"],
            "after": after,
        }
    )


@pytest.mark.spark
def test_rows_that_partial_images_write_are_checked_with_their_stored_values(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A partial image keeps the stored values of the columns it lacks, so whether its row meets a constraint
    depends on them, and on the batch's other changes of the key: such rows are checked as the MERGE would write
    them. Before, Delta refused the MERGE, so the whole batch, on every restart."""
    lake = str(tmp_path / "lake")
    table = f"{lake}/SHOP/ORDERS"

    def land(name: str, *messages: str) -> None:
        _land(spark, tmp_path, "ogg-json", name, *messages)

    def rows() -> list[tuple[Any, ...]]:
        return sorted(tuple(r) for r in spark.read.format("delta").load(table).select("ID", "A", "B", "N").collect())

    land(
        "1-rows",
        _ogg("I", 1, {"ID": 1, "A": 1, "B": 5, "N": 3}),
        _ogg("I", 2, {"ID": 2, "A": 2, "B": 6, "N": 4}),
        _ogg("I", 3, {"ID": 4, "A": 1, "B": 9, "N": 1}),
    )
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT lt CHECK (A < B)")
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT positive CHECK (N > 0)")
    land(
        "2-partial",
        _ogg("U", 4, {"ID": 1, "A": 7}),  # 7 < the stored B 5 does not hold
        _ogg("U", 5, {"ID": 2, "A": 3}),  # holds alone (3 < 6), but not with the next change of the key
        _ogg("U", 6, {"ID": 2, "B": 2}),  # the row written: A 3, B 2
        _ogg("U", 7, {"ID": 3, "A": 1, "B": 2}),  # no stored row: N is NULL, which does not meet positive
        _ogg("U", 8, {"ID": 4, "A": 2}),  # 2 < 9: lands
        _ogg("I", 9, {"ID": 5, "A": 1, "B": 2, "N": 1}),
    )
    # Each refused key keeps its stored row; the rest of the batch landed.
    assert rows() == [(1, 1, 5, 3), (2, 2, 6, 4), (4, 2, 9, 1), (5, 1, 2, 1)]
    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").orderBy("offset").collect()
    lt, positive = _row_not_met("lt", "A < B", "SHOP/ORDERS"), _row_not_met("positive", "N > 0", "SHOP/ORDERS")
    assert [(r["offset"], r["reason"]) for r in dead] == [(0, lt), (1, lt), (2, lt), (3, positive)]

    # The owner drops `lt`: the refused changes replay in their order; key 3 still has no N.
    spark.sql(f"ALTER TABLE delta.`{table}` DROP CONSTRAINT lt")
    report = replay_dead_letters(spark, lake)
    assert (report.selected, report.applied, [f.offset for f in report.failures]) == (4, 3, [3])
    assert rows() == [(1, 7, 5, 3), (2, 3, 2, 4), (4, 2, 9, 1), (5, 1, 2, 1)]


@pytest.mark.spark
def test_a_key_whose_row_changes_because_another_key_was_refused_is_checked_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Refusing a key takes out every event that writes it, and an update that changed its key also wrote the old
    key: without it, the old key's row is another. The check runs again on the rows left, until nothing more is
    refused. Before, key 1's row was checked only with the move (deleted: fine) and Delta refused the MERGE that
    wrote it without the move, so the batch, on every restart."""
    lake = str(tmp_path / "lake")
    table = f"{lake}/SHOP/ORDERS"
    _land(
        spark,
        tmp_path,
        "ogg-json",
        "1",
        _ogg("I", 1, {"ID": 1, "A": 1, "B": 5, "N": 3}),
        _ogg("I", 2, {"ID": 2, "A": 1, "B": 5, "N": 3}),
    )
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT lt CHECK (A < B)")
    # Key 1 -> 6 with A 9: the columns the image lacks come from key 1's row (B 5), and 9 < 5 does not hold.
    moved = json.loads(_ogg("U", 5, {"ID": 6, "A": 9}))
    moved["before"] = {"ID": 1}
    _land(
        spark,
        tmp_path,
        "ogg-json",
        "2",
        _ogg("U", 4, {"ID": 1, "A": 7}),  # 7 < the stored B 5 does not hold, unless the key moves away next
        json.dumps(moved),
        _ogg("U", 6, {"ID": 2, "A": 2}),  # 2 < 5: lands
    )
    rows = spark.read.format("delta").load(table).select("ID", "A", "B", "N").orderBy("ID").collect()
    assert [tuple(r) for r in rows] == [(1, 1, 5, 3), (2, 2, 5, 3)]
    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").orderBy("offset").collect()
    lt = _row_not_met("lt", "A < B", "SHOP/ORDERS")
    assert [(r["offset"], r["reason"]) for r in dead] == [(0, lt), (1, lt)]


@pytest.mark.spark
def test_a_condition_that_cannot_be_checked_before_the_merge_stops_the_batch_with_one_clear_error(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When cdclake cannot evaluate a condition itself (here: as if Spark did not accept it over the rows), Delta
    checks it at the MERGE, and the batch stops with one clear error instead of Delta's stack trace."""
    from cdclake import pipeline

    table = f"{tmp_path}/lake/SHOP/ORDERS"
    _land(spark, tmp_path, "ogg-json", "1", _ogg("I", 1, {"ID": 1, "A": 1, "B": 5, "N": 3}))
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT lt CHECK (A < B)")
    monkeypatch.setattr(pipeline, "unmet_on_rows", lambda constraints, _rows: (None, sorted(constraints)))
    with pytest.raises(ConstraintViolationError) as raised:
        _land(spark, tmp_path, "ogg-json", "2", _ogg("U", 2, {"ID": 1, "A": 7}))
    assert str(raised.value).startswith(
        f"MERGE into {table} failed: [DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint lt "
    )
    assert "correct the row at the source or change the constraint, then restart" in str(raised.value)
