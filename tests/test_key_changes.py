"""An UPDATE that changes a row's primary key, sent with a partial after image (OGG's compressed updates: the key and
the changed columns only, maxwell-ogg.md 2; Debezium's unavailable values, Qlik's column masks, DTS LOBs).

The columns the image lacks are the row's, but the row is the old key's: the new key's lake row must take them from
there, from the lake table or from the batch's earlier changes of the old key. Before, it took NULLs without a word.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from cdclake.workload import (
    Change,
    Column,
    TableSpec,
    render_change,
)
from tests.e2e.helpers import history_table, lake_reader, replay_lines, scd2_reader
from tests.test_sequence_by import _ogg, _replay_ogg

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_key_change_with_a_partial_image_keeps_the_columns_it_lacks(
    spark, tmp_path: Path, table_format: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The key changes of the module doc, in the lake table and in the batch, chained, taken again and re-sent; and
    one whose old key has no row anywhere, which keeps NULLs and is the one key change a warning is about."""

    def run(name: str, lines: list[str]) -> int:
        with caplog.at_level(logging.WARNING, logger="cdclake.apply"):
            return _replay_ogg(spark, tmp_path, name, lines, table_format=table_format)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "cdclake.apply"]

    def rows() -> list[tuple[int, str | None, int | None, str | None]]:
        stored = lake_reader(spark, table_format)(f"{tmp_path / 'lake'}/SALES/ORDERS")
        return sorted((row["ID"], row["CUSTOMER"], row["AMOUNT"], row["NOTE"]) for row in stored)

    first = [
        _ogg("I", 1, after={"ID": 1, "CUSTOMER": "a", "AMOUNT": 10, "NOTE": "n1"}),
        _ogg("I", 2, after={"ID": 2, "CUSTOMER": "b", "AMOUNT": 20, "NOTE": "n2"}),
    ]
    assert run("a", first) == 0
    second = [
        # From the lake table's row: 1 -> 11 with a new amount.
        _ogg("U", 3, before={"ID": 1}, after={"ID": 11, "AMOUNT": 15}),
        # From the batch: 3 is inserted and changed, then moves to 33 with a note.
        _ogg("I", 4, after={"ID": 3, "CUSTOMER": "c", "AMOUNT": 30, "NOTE": "n3"}),
        _ogg("U", 5, before={"ID": 3}, after={"ID": 3, "AMOUNT": 31}),
        _ogg("U", 6, before={"ID": 3}, after={"ID": 33, "NOTE": "z"}),
        # The old key is taken again in the same batch: the moved row is still the one 2 was before it.
        _ogg("U", 7, before={"ID": 2}, after={"ID": 22, "NOTE": "m"}),
        _ogg("I", 8, after={"ID": 2, "CUSTOMER": "new", "AMOUNT": 5, "NOTE": None}),
        # The new key changes again (a partial image on the moved row).
        _ogg("U", 9, before={"ID": 22}, after={"ID": 22, "AMOUNT": 21}),
    ]
    assert run("b", second) == 0
    assert rows() == [
        (2, "new", 5, None),
        (11, "a", 15, "n1"),
        (22, "b", 21, "m"),
        (33, "c", 31, "z"),
    ]
    third = [
        # One row through three keys in one batch, each move partial: each starts from the one before.
        _ogg("U", 10, before={"ID": 11}, after={"ID": 12, "NOTE": "x"}),
        _ogg("U", 11, before={"ID": 12}, after={"ID": 13, "AMOUNT": 16}),
        _ogg("U", 12, before={"ID": 13}, after={"ID": 14, "CUSTOMER": "A"}),
        # A failover's copy of the move to 33 (applied in the last batch; 3 holds no row now): it changes nothing.
        second[3],
        # Then through 40 keys more (a hot row of a key-less table moves on each update), with a change between
        # two moves: more links than the rounds that once made one link whole each (MAX_MOVE_ROUNDS).
        *(
            _ogg("U", 13 + i, before={"ID": 99 + i if i else 14}, after={"ID": 100 + i, "AMOUNT": 100 + i})
            for i in range(20)
        ),
        _ogg("U", 33, before={"ID": 119}, after={"ID": 119, "NOTE": "mid"}),
        *(_ogg("U", 34 + i, before={"ID": 99 + i}, after={"ID": 100 + i, "AMOUNT": 100 + i}) for i in range(20, 40)),
        # A key the lake never held (its history started later): nothing to take the other columns from.
        _ogg("U", 74, before={"ID": 500}, after={"ID": 501, "NOTE": "o"}),
    ]
    assert warnings() == []
    assert run("c", third) == 0
    assert rows() == [
        (2, "new", 5, None),
        (22, "b", 21, "m"),
        (33, "c", 31, "z"),
        (139, "A", 139, "mid"),
        (501, None, None, "o"),
    ]
    (warning,) = warnings()
    # OGG's table SALES.ORDERS: catalog and schema both SALES.
    assert warning.startswith("1 key change(s) of SALES.SALES.ORDERS from a partial image found no row of their")


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_key_change_next_to_a_truncate_takes_the_row_the_truncate_left(
    spark, tmp_path: Path, table_format: str
) -> None:
    """A TRUNCATE in the same batch as key changes with partial images. A key change after it moves a row the
    truncate cleared: the lake row read before the batch's MERGEs still held it, and the new key took its stale
    columns. A key change before it is void for the lake table (the truncate clears both keys) but a version of its
    SCD2 table: that version took NULLs in the columns its image lacked, as it was never made whole."""
    lake = str(tmp_path / "lake")

    def run(name: str, lines: list[str]) -> int:
        return _replay_ogg(spark, tmp_path, name, lines, table_format=table_format, scd2=["SALES.ORDERS"])

    assert (
        run(
            "a",
            [
                _ogg("I", 1, after={"ID": 1, "CUSTOMER": "a", "AMOUNT": 10, "NOTE": "n1"}),
                _ogg("I", 2, after={"ID": 2, "CUSTOMER": "b", "AMOUNT": 20, "NOTE": "n2"}),
            ],
        )
        == 0
    )
    second = [
        _ogg("U", 3, before={"ID": 2}, after={"ID": 22, "AMOUNT": 21}),
        _ogg("T", 4),
        # Key 1 is gone since the truncate (its re-insert is not in the log this run reads).
        _ogg("U", 5, before={"ID": 1}, after={"ID": 11, "AMOUNT": 15}),
    ]
    assert run("b", second) == 0
    stored = lake_reader(spark, table_format)(f"{lake}/SALES/ORDERS")
    assert sorted((row["ID"], row["CUSTOMER"], row["AMOUNT"], row["NOTE"]) for row in stored) == [(11, None, 15, None)]
    scd2 = history_table(spark, lake, "scd2", "SALES", "ORDERS", table_format)
    assert scd2 is not None
    versions = sorted(
        (
            (
                row["ID"],
                row["CUSTOMER"],
                row["AMOUNT"],
                row["NOTE"],
                int(row["_cdc_valid_from"].split("/")[0]),
                row["_cdc_valid_to"] and int(row["_cdc_valid_to"].split("/")[0]),
                row["_cdc_is_deleted"],
            )
            for row in scd2.where("_cdc_row_key IS NOT NULL").collect()
        ),
        key=repr,
    )
    assert versions == sorted(
        [
            (1, "a", 10, "n1", 1, 4, False),
            (1, "a", 10, "n1", 4, 5, True),  # closed by the truncate
            (1, None, None, None, 5, None, True),  # the key change's deletion of the old key
            (11, None, 15, None, 5, None, False),
            (2, "b", 20, "n2", 2, 3, False),
            (2, "b", 20, "n2", 3, None, True),
            (22, "b", 21, "n2", 3, 4, False),  # made whole from key 2's row, before the truncate
            (22, "b", 21, "n2", 4, None, True),
        ],
        key=repr,
    )


def _debezium_pg(
    op: str, lsn: int, *, before: dict[str, Any] | None = None, after: dict[str, Any] | None = None
) -> str:
    """A Debezium PostgreSQL change event of ``appdb.public.articles`` (schemas.enable=false) at ``lsn``."""
    source = {"connector": "postgresql", "name": "pg", "ts_ms": 1709288400000, "db": "appdb", "schema": "public"}
    source |= {"table": "articles", "txId": 991900 + lsn, "lsn": lsn}
    return json.dumps({"before": before, "after": after, "source": source, "op": op, "ts_ms": 1709288400031})


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_debezium_key_change_keeps_the_columns_its_create_lacks(spark, tmp_path: Path, table_format: str) -> None:
    """debezium.md 2 and 6: PostgreSQL sends an update of the primary key as a ``d`` of the old key and a ``c`` of the
    new one at the same ``lsn``; a TOASTed column the update left alone is unavailable in the ``c``. Alone, the
    ``c`` was an insert without that column: the moved row lost its value (NULL), without a word. Paired with its
    ``d``, it takes the value from the old key's row: the lake table's, or the batch's earlier change of it."""
    lake = str(tmp_path / "lake")
    unavailable = "__debezium_unavailable_value"

    def run(name: str, lines: list[str]) -> int:
        keys = {"appdb.public.articles": ["id"]}
        return replay_lines(
            spark, tmp_path, name, lines, "debezium-json", keys=keys, scd2=list(keys), table_format=table_format
        )

    assert run("a", [_debezium_pg("c", 100, after={"id": 1, "title": "first", "body": "a long text"})]) == 0
    key_only = {"title": None, "body": None}  # the before image of a d under the default replica identity
    second = [
        # 1 -> 2 (the lake table's row), its title changed too.
        _debezium_pg("d", 200, before={"id": 1, **key_only}),
        _debezium_pg("c", 200, after={"id": 2, "title": "second", "body": unavailable}),
        # 3 is inserted in this batch, then moved to 4 (the batch's change).
        _debezium_pg("c", 300, after={"id": 3, "title": "third", "body": "its own text"}),
        _debezium_pg("d", 400, before={"id": 3, **key_only}),
        _debezium_pg("c", 400, after={"id": 4, "title": "third", "body": unavailable}),
    ]
    assert run("b", second) == 0
    stored = lake_reader(spark, table_format)(f"{lake}/appdb/articles")
    expected = [(2, "second", "a long text"), (4, "third", "its own text")]
    assert sorted((row["id"], row["title"], row["body"]) for row in stored) == expected
    live = scd2_reader(spark, lake, table_format)(f"{lake}/appdb/articles")
    assert sorted((row["id"], row["title"], row["body"]) for row in live) == expected


def test_a_debezium_key_change_named_by_its_headers_is_made_whole_in_either_order(
    spark, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """debezium.md 2: the ``d`` and ``c`` of a primary-key update have different Kafka keys, so they may land in
    different partitions and batches, in either order. The ``c`` names its old key in the ``__debezium.oldkey``
    header and moves the old key's row whenever it comes; the ``d`` (``__debezium.newkey``) is not applied, so the
    row is still there to move and keeps the column the ``c`` lacks. Without the headers the ``c`` was an insert,
    its body NULL, with a warning. The headers come from a capture file of Kafka records (``kcat -J``'s form: names
    and values in turn)."""
    lake = str(tmp_path / "lake")
    unavailable = "__debezium_unavailable_value"
    key_only = {"title": None, "body": None}

    def record(value: str | None, key: int, header: str | None = None, other_key: int = 0) -> str:
        headers = None if header is None else [f"__debezium.{header}", json.dumps({"id": other_key})]
        return json.dumps({"key": json.dumps({"id": key}), "payload": value, "headers": headers})

    def run(name: str, lines: list[str]) -> int:
        keys = {"appdb.public.articles": ["id"]}
        with caplog.at_level(logging.WARNING):
            return replay_lines(
                spark, tmp_path, name, lines, "debezium-json", keys=keys, scd2=list(keys), encoding="records"
            )

    def rows() -> list[tuple[int, str, str]]:
        stored = lake_reader(spark, "delta")(f"{lake}/appdb/articles")
        return sorted((row["id"], row["title"], row["body"]) for row in stored)

    first = [
        record(_debezium_pg("c", 100, after={"id": 1, "title": "one", "body": "text 1"}), 1),
        record(_debezium_pg("c", 101, after={"id": 3, "title": "three", "body": "text 3"}), 3),
    ]
    assert run("a", first) == 0
    second = [
        # 1 -> 2: the d comes first, and alone.
        record(_debezium_pg("d", 200, before={"id": 1, **key_only}), 1, "newkey", 2),
        record(None, 1),  # its tombstone
        # 3 -> 4: the c comes first, and alone.
        record(_debezium_pg("c", 300, after={"id": 4, "title": "four", "body": unavailable}), 4, "oldkey", 3),
    ]
    assert run("b", second) == 0
    assert rows() == [(1, "one", "text 1"), (4, "four", "text 3")]
    third = [
        record(_debezium_pg("c", 200, after={"id": 2, "title": "two", "body": unavailable}), 2, "oldkey", 1),
        record(_debezium_pg("d", 300, before={"id": 3, **key_only}), 3, "newkey", 4),
        record(None, 3),
    ]
    assert run("c", third) == 0
    expected = [(2, "two", "text 1"), (4, "four", "text 3")]
    assert rows() == expected
    live = scd2_reader(spark, lake, "delta")(f"{lake}/appdb/articles")
    assert sorted((row["id"], row["title"], row["body"]) for row in live) == expected
    assert [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("cdclake")
    ] == []


def test_a_debezium_key_change_under_other_configured_keys_is_applied_by_its_after_image_with_a_warning(
    spark, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table whose configured ``keys`` (``slug``) are not Debezium's key (``id``): a key change's ``c`` names the
    old row by ``id`` alone (its ``__debezium.oldkey`` header), so the old ``slug`` is unknown. Before, the change
    retired a made-up NULL key (a tombstone of the key `[null]`) and said nothing. Now the ``c`` updates the row
    its after image keys: right when ``slug`` stayed, and the row it left stays when ``slug`` changed too, which
    the warning names with the fix (a dry run too)."""
    from typer.testing import CliRunner

    from cdclake.cli import main as cli_main

    lake = str(tmp_path / "lake")

    def record(value: str | None, key: int, header: str | None = None, other_key: int = 0) -> str:
        headers = None if header is None else [f"__debezium.{header}", json.dumps({"id": other_key})]
        return json.dumps({"key": json.dumps({"id": key}), "payload": value, "headers": headers})

    def article(row_id: int, slug: str, title: str) -> dict[str, Any]:
        return {"id": row_id, "slug": slug, "title": title}

    def run(name: str, lines: list[str]) -> int:
        keys = {"appdb.public.articles": ["slug"]}
        settings = {"keys": keys, "changelog": list(keys), "scd2": list(keys), "encoding": "records"}
        with caplog.at_level(logging.WARNING):
            return replay_lines(spark, tmp_path, name, lines, "debezium-json", **settings)

    first = [
        record(_debezium_pg("c", 100, after=article(1, "alpha", "one")), 1),
        record(_debezium_pg("c", 101, after=article(3, "gamma", "three")), 3),
    ]
    assert run("a", first) == 0
    key_only = {"slug": None, "title": None}
    second = [
        # id 1 -> 2, its slug kept.
        record(_debezium_pg("d", 200, before={"id": 1, **key_only}), 1, "newkey", 2),
        record(None, 1),
        record(_debezium_pg("c", 200, after=article(2, "alpha", "two")), 2, "oldkey", 1),
        # id 3 -> 4, and its slug changed too: the row keyed gamma cannot be found.
        record(_debezium_pg("c", 300, after=article(4, "delta", "four")), 4, "oldkey", 3),
        record(_debezium_pg("d", 300, before={"id": 3, **key_only}), 3, "newkey", 4),
    ]
    # A dry run (`cdclake check`'s report) names them as the run's warning does, and refuses nothing.
    capture = tmp_path / "b-dry.jsonl"
    capture.write_text("".join(line + "\n" for line in second), encoding="utf-8")
    monkeypatch.delenv("COLUMNS", raising=False)  # one line per message (cli.main._console)
    monkeypatch.setattr(cli_main, "out", cli_main._console())
    args = ["replay", "--dry-run", "--format", "debezium-json", "--lake", lake, "--input-encoding", "records"]
    dry = CliRunner().invoke(cli_main.app, [*args, "--keys", "appdb.public.articles=slug", str(capture)])
    assert dry.exit_code == 0, dry.output
    printed = " ".join(dry.stdout.split())
    assert "warning: 2 update(s) of appdb.public.articles changed the source's key" in printed
    caplog.clear()
    assert run("b", second) == 0
    stored = lake_reader(spark, "delta")(f"{lake}/appdb/articles")
    expected = [(2, "alpha", "two"), (3, "gamma", "three"), (4, "delta", "four")]
    assert sorted((row["id"], row["slug"], row["title"]) for row in stored) == expected
    live = scd2_reader(spark, lake, "delta")(f"{lake}/appdb/articles")
    assert sorted((row["id"], row["slug"], row["title"]) for row in live) == expected
    changelog = history_table(spark, lake, "changelog", "appdb", "articles")
    assert changelog is not None
    logged = sorted((r["_cdc_op"], r["slug"]) for r in changelog.where("_cdc_op <> 'INSERT'").collect())
    assert logged == [("UPDATE", "alpha"), ("UPDATE", "delta")]
    tombstones = Path(lake, "_cdclake", "tombstones")
    assert not (tombstones / "_delta_log").is_dir() or spark.read.format("delta").load(str(tombstones)).count() == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("cdclake")]
    assert len(warnings) == 1
    assert warnings[0].startswith("2 update(s) of appdb.public.articles changed the source's key")
    assert "configured key column(s) slug" in warnings[0]
    assert "Set `keys` for the table" in warnings[0]


ACCOUNTS = TableSpec("crm", "accounts", [Column("id", "long"), Column("name", "string")], ["id"], None, "MySQL")


def _dataworks_split(sequence: int, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """An UPDATE of ``crm.accounts`` as DataWorks splits it: ``UPDATE_BEFOR`` (the before image), then
    ``UPDATE_AFTER`` (the after image), both at ``sequence`` (dataworks.md 1)."""
    update = Change("UPDATE", ACCOUNTS, before, after, sequence, 1709288131000 + sequence, None)
    return [json.dumps(value) for value in render_change(update, update_mode="split")]


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_split_update_that_changes_the_key_ends_the_old_keys_version(
    spark, tmp_path: Path, table_format: str
) -> None:
    """A DataWorks split update (``UPDATE_BEFOR`` of the old key, ``UPDATE_AFTER`` of the new one at the same
    ``sequenceId``) that changes the primary key: the old key's SCD2 version must end there, as its lake row does.
    Before, the first half was taken for one whose second half replaces it (none did: its key has no later change),
    and the old key stayed a live version beside the new one. Likewise a first half whose second half is in the next
    batch: the key is absent in the SCD2 table until then, as it is in the lake table."""
    lake = str(tmp_path / "lake")

    def run(name: str, lines: list[str]) -> list[tuple[int, str]]:
        assert replay_lines(spark, tmp_path, name, lines, "dataworks-json", scd2=True, table_format=table_format) == 0
        path = f"{lake}/crm/accounts"
        stored = sorted((row["id"], row["name"]) for row in lake_reader(spark, table_format)(path))
        live = sorted((row["id"], row["name"]) for row in scd2_reader(spark, lake, table_format)(path))
        assert live == stored
        return live

    inserts = [
        Change("INSERT", ACCOUNTS, None, {"id": key, "name": name}, key, 1709288131000 + key, None)
        for key, name in ((1, "ann"), (2, "bob"))
    ]
    assert run("a", [json.dumps(render_change(insert)[0]) for insert in inserts]) == [(1, "ann"), (2, "bob")]
    # 1 -> 5, its name changed too; then the batch ends between the halves of an update of 2 that keeps the key.
    move = _dataworks_split(3, {"id": 1, "name": "ann"}, {"id": 5, "name": "anna"})
    first_half, second_half = _dataworks_split(4, {"id": 2, "name": "bob"}, {"id": 2, "name": "bobby"})
    assert run("b", [*move, first_half]) == [(5, "anna")]
    assert run("c", [second_half]) == [(2, "bobby"), (5, "anna")]
