"""``sequence_by``: a column of the row orders a table's changes instead of the log position (Canal JSON has none,
so without it the Kafka order decides)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from cdclake import apply
from cdclake.apply import sequence_key
from cdclake.devtools.verify import read_table
from cdclake.runner import replay
from cdclake.sinks.delta import OP_COLUMN
from cdclake.sinks.history import IS_CURRENT_COLUMN, ROW_KEY_COLUMN, VALID_FROM_COLUMN, VALID_TO_COLUMN
from cdclake.spark import local_frame
from tests.e2e.helpers import history_table, lake_reader, replay_lines, scd2_reader
from tests.test_ddl import ddl_message, row_message

pytestmark = pytest.mark.spark

TYPES = {"id": "bigint(20)", "version": "bigint(20)", "v": "varchar(8)"}
NOTES = {"id": "bigint(20)", "v": "varchar(8)"}


def messages() -> list[str]:
    # Delivered out of order: version 10 first, then the older versions 9 and -1 (a negative version too).
    return [
        row_message("INSERT", "t", [{"id": "1", "version": "10", "v": "new"}], TYPES),
        row_message("INSERT", "t", [{"id": "1", "version": "9", "v": "old"}], TYPES),
        row_message("INSERT", "t", [{"id": "2", "version": "-1", "v": "b-old"}], TYPES),
        row_message("INSERT", "t", [{"id": "2", "version": "-5", "v": "b-older"}], TYPES),
        row_message("INSERT", "u", [{"id": "1", "version": "10", "v": "first"}], TYPES),
        row_message("INSERT", "u", [{"id": "1", "version": "9", "v": "last"}], TYPES),
    ]


@pytest.mark.parametrize("batch_lines", [100, 1], ids=["one-batch", "one-per-batch"])
def test_sequence_by_orders_by_the_column_not_the_arrival(spark, tmp_path: Path, batch_lines: int) -> None:
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(m + "\n" for m in messages()), encoding="utf-8")
    lake = str(tmp_path / "lake")
    replay(
        spark,
        lake=lake,
        format_name="canal-json",
        paths=[str(capture)],
        batch_lines=batch_lines,
        sequence_by={"crm.t*": "version"},  # a pattern, as in `tables`: t, not u
    )
    assert sorted(read_table(f"{lake}/crm/t"), key=lambda r: r["id"]) == [
        {"id": 1, "version": 10, "v": "new"},
        {"id": 2, "version": -1, "v": "b-old"},
    ]
    # a table without sequence_by keeps the arrival order
    assert read_table(f"{lake}/crm/u") == [{"id": 1, "version": 9, "v": "last"}]


def test_a_column_named_for_a_table_that_it_does_not_have_makes_dead_letters(spark, tmp_path: Path) -> None:
    """A misspelt column sorted every change as NULL: the arrival order, silently. Named for the table, its changes
    become dead letters that say why (through a pattern, which may match tables without the column, the table keeps
    the format's order with a warning: tests/e2e/test_check.py). The case of a name does not matter."""
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(m + "\n" for m in messages()), encoding="utf-8")
    lake = str(tmp_path / "lake")
    results = replay(
        spark,
        lake=lake,
        format_name="canal-json",
        paths=[str(capture)],
        sequence_by={"crm.t": "Versoin", "crm.*": "VERSION"},
    )
    assert sum(r.dead_letters for r in results) == 4
    reasons = {r["reason"] for r in read_table(f"{lake}/_cdclake/dead_letters")}
    assert reasons == {"sequence_by column Versoin is not a column of crm.t: fix the `sequence_by` setting"}
    assert read_table(f"{lake}/crm/u") == [{"id": 1, "version": 10, "v": "first"}]

    # The fix, without the pipeline's configuration: `cdclake dlq replay --sequence-by crm.t=version`.
    from typer.testing import CliRunner

    from cdclake.cli import main as cli_main

    fixed = CliRunner().invoke(cli_main.app, ["dlq", "replay", "--lake", lake, "--sequence-by", "crm.t=version"])
    assert fixed.exit_code == 0, fixed.output
    assert "4 dead letters, 4 applied, 0 failed again" in " ".join(fixed.output.split())
    assert sorted(read_table(f"{lake}/crm/t"), key=lambda r: r["id"]) == [
        {"id": 1, "version": 10, "v": "new"},
        {"id": 2, "version": -1, "v": "b-old"},
    ]


def _decimal_texts(rng: random.Random) -> list[str]:
    """Decimal and double spellings: signs, leading and trailing zeros, exponents, long digit strings, and values
    that are prefixes of each other's digits (1.5, 1.51, 15, 150)."""
    fixed = ["0", "-0.0", "0.000", "1.5", "1.51", "15", "150", "-1.5", "-1.51", "-15", "9", "10", "-9", "-10"]
    fixed += ["1.0E10", "1.5e-7", "-2.5E+3", "0.001", "1E-3", "99999999999999999999", "18446744073709551615"]
    fixed += ["12345678901234567890123456789012345678", "-0.00000000000000000000000000000000000001", "NaN"]
    fixed += ["Infinity", "-Infinity", "1.7976931348623157E308", "4.9E-324", "-4.9E-324"]
    drawn = []
    for _ in range(200):
        integer = str(rng.randrange(10 ** rng.randrange(1, 20)))
        fraction = str(rng.randrange(10 ** rng.randrange(0, 12))).zfill(rng.randrange(0, 4))
        exponent = rng.choice(["", "", f"E{rng.randrange(-30, 30)}", f"e+{rng.randrange(0, 9)}"])
        sign = rng.choice(["", "-"])
        drawn.append(f"{sign}{'0' * rng.randrange(0, 3)}{integer}{'.' + fraction if fraction else ''}{exponent}")
    return fixed + drawn


def _texts(rng: random.Random) -> list[str]:
    """Strings that are prefixes of each other, with U+0000, U+0001, the separator ``|``, spaces and characters
    beyond the BMP."""
    fixed = ["", "a", "ab", "a|", "a\x00", "a\x01", "a\x00b", "a\x01b", "a b", "v1", "v10", "v9", "é", "\U0001f600"]
    alphabet = "ab|\x00\x01 ~é\U0001f600"
    return fixed + ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 6))) for _ in range(150)]


def _wall_clocks(rng: random.Random) -> list[str]:
    """``timestamp_ntz`` canonical text: the fraction has as many digits as it needs, or none."""
    drawn = []
    for _ in range(150):
        moment = datetime(2024, 1, 1) + timedelta(seconds=rng.randrange(3), microseconds=rng.randrange(1_000_000))
        text = moment.isoformat(sep=" ")
        drawn.append(text.rstrip("0") if "." in text else text)  # Spark casts drop the fraction's trailing zeros
    return ["2024-01-01 00:00:00", "2024-01-01 00:00:00.5", "2024-01-01 00:00:00.000001", *drawn]


def _python_order(spark_type: str) -> Callable[[str], Any]:
    if spark_type == "double" or spark_type.startswith("decimal("):
        return lambda text: (1, Decimal(0)) if text == "NaN" else (0, Decimal(text))  # Spark: NaN above all
    if spark_type == "timestamp_ntz":
        return datetime.fromisoformat
    if spark_type == "bigint":
        return int
    return lambda text: text  # code point order, which is UTF-8 byte order


@pytest.mark.parametrize(
    ("spark_type", "values"),
    [
        ("decimal(38,10)", _decimal_texts),
        ("double", _decimal_texts),
        ("string", _texts),
        ("timestamp_ntz", _wall_clocks),
        ("bigint", lambda rng: [str(rng.randrange(-(2**63), 2**63)) for _ in range(100)] + ["9", "10", "-9", "-10"]),
    ],
)
def test_sequence_keys_sort_as_their_values_and_the_appended_position_only_breaks_ties(
    spark, spark_type: str, values: Callable[[random.Random], list[str]]
) -> None:
    """Every value twice, with two positions after it: sorted by key and position as Spark sorts the text, the rows
    come in the order of the values (Python's Decimal, datetime, int, str as the reference), then the positions."""
    drawn = values(random.Random(7))
    rows = [(text, position) for text in drawn for position in ("1", "2")]
    frame = local_frame(spark, rows, "value string, position string").withColumn(
        "order", F.concat(sequence_key(F.col("value"), F.lit(spark_type)), F.lit("|"), F.col("position"))
    )
    assert frame.where(F.col("order").isNull()).count() == 0
    got = [(row["value"], row["position"]) for row in frame.orderBy("order").collect()]
    value_order = _python_order(spark_type)
    expected = sorted(rows, key=lambda row: (value_order(row[0]), row[1]))
    # equal values spelt otherwise (1.5 and 1.50) may come in either spelling's order: compare what the order says
    assert [(value_order(v), p) for v, p in got] == [(value_order(v), p) for v, p in expected]


def test_sequence_by_orders_decimal_and_wall_clock_columns_by_value(spark, tmp_path: Path) -> None:
    """A MySQL BIGINT UNSIGNED version is decimal(20,0) and a DATETIME(3) is timestamp_ntz: as text, version 9
    sorted after 10 and 10:00:00 after 10:00:00.5, so the older change won."""
    types = {"id": "bigint(20)", "version": "bigint(20) unsigned", "at": "datetime(3)", "v": "varchar(8)"}
    lines = [
        row_message("INSERT", "t", [{"id": "1", "version": "10", "at": "2024-01-01 10:00:00", "v": "new"}], types),
        row_message("INSERT", "t", [{"id": "1", "version": "9", "at": "2024-01-01 10:00:00.5", "v": "old"}], types),
        row_message("INSERT", "u", [{"id": "1", "version": "10", "at": "2024-01-01 10:00:00.5", "v": "new"}], types),
        row_message("INSERT", "u", [{"id": "1", "version": "9", "at": "2024-01-01 10:00:00", "v": "old"}], types),
    ]
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    lake = str(tmp_path / "lake")
    replay(
        spark,
        lake=lake,
        format_name="canal-json",
        paths=[str(capture)],
        batch_lines=1,
        sequence_by={"crm.t": "version", "crm.u": "at"},
    )
    for table in ("t", "u"):
        assert [row["v"] for row in read_table(f"{lake}/crm/{table}")] == ["new"], table


def _ogg(op: str, pos: int, *, before: dict[str, Any] | None = None, after: dict[str, Any] | None = None) -> str:
    message: dict[str, Any] = {
        "table": "SALES.ORDERS",
        "op_type": op,
        "op_ts": "2024-03-01 10:15:31.000000",
        "current_ts": "2024-03-01T10:15:33.126000",
        "pos": f"{pos:020d}",
        "primary_keys": ["ID"],
    }
    message.update({k: v for k, v in (("before", before), ("after", after)) if v is not None})
    return json.dumps(message)


@pytest.mark.parametrize("batch_lines", [100, 1], ids=["one-batch", "one-per-batch"])
def test_changes_without_the_sequence_column_take_the_before_image_or_become_dead_letters(
    spark, tmp_path: Path, batch_lines: int
) -> None:
    """OGG's default trail holds an update's key and changed columns only, and a delete's keys (maxwell-ogg.md 2). A
    change without the column sorted as NULL, before the stored version: the MERGE passed over it, and every delete
    of the table was lost without a word. An update whose before image has the column takes its value from there
    (the column did not change); a change that carries it nowhere is a dead letter that says why."""
    lines = [
        _ogg("I", 1, after={"ID": 1, "VERSION": 5, "V": "a"}),
        _ogg("U", 2, before={"ID": 1, "VERSION": 5, "V": "a"}, after={"ID": 1, "V": "b"}),  # GETUPDATEBEFORES
        _ogg("U", 3, before={"ID": 1}, after={"ID": 1, "V": "c"}),
        _ogg("I", 4, after={"ID": 2, "VERSION": 1, "V": "x"}),
        _ogg("D", 5, before={"ID": 2}),
        _ogg("I", 6, after={"ID": 3, "VERSION": 1, "V": "y"}),
        _ogg("D", 7, before={"ID": 3, "VERSION": 1, "V": "y"}),  # NOCOMPRESSDELETES
    ]
    capture = tmp_path / "ogg.jsonl"
    capture.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    lake = str(tmp_path / "lake")
    if batch_lines == 100:  # a dry run finds them first, as `cdclake check` does
        from typer.testing import CliRunner

        from cdclake.cli import main as cli_main

        args = ["replay", "--dry-run", "--lake", lake, "--format", "ogg-json", "--sequence-by", "SALES.ORDERS=version"]
        dry = CliRunner().invoke(cli_main.app, [*args, str(capture)])
        assert dry.exit_code == 1, dry.output
        found = " ".join(dry.output.split())
        assert (
            "2 events of SALES.SALES.ORDERS would be dead letters: the change does not carry the sequence_by" in found
        )
    replay(
        spark,
        lake=lake,
        format_name="ogg-json",
        paths=[str(capture)],
        batch_lines=batch_lines,
        sequence_by={"SALES.ORDERS": "version"},
    )
    assert sorted(read_table(f"{lake}/SALES/ORDERS"), key=lambda row: row["ID"]) == [
        {"ID": 1, "VERSION": 5, "V": "b"},
        {"ID": 2, "VERSION": 1, "V": "x"},
    ]
    dead = {row["offset"]: row["reason"] for row in read_table(f"{lake}/_cdclake/dead_letters")}
    assert sorted(dead) == [2, 4]
    assert all(
        reason.startswith("the change does not carry the sequence_by column version") for reason in dead.values()
    )


@pytest.mark.parametrize(
    ("batch_lines", "table_format"),
    [(100, "delta"), (2, "delta"), (2, "iceberg")],
    ids=["one-batch", "three-batches", "three-batches-iceberg"],
)
def test_a_truncate_voids_what_the_log_wrote_before_it_whatever_the_versions(
    spark, tmp_path: Path, batch_lines: int, table_format: str
) -> None:
    """A row change of a ``sequence_by`` table is ordered by ``version key|position``, a TRUNCATE by its position
    only. Compared whole, a row stayed or went by its version: version 100 (``000100...``) sorted after the
    truncate's position (``000...03``) and survived it, and a late copy of a change the log wrote before the
    truncate landed after it. Now the truncate compares log positions (``apply.log_order``), in the batch, in the
    lake table's DELETE and in the tombstone gate.

    The table's SCD2 history placed the truncate among each key's versions by the same whole comparison, so
    version 100 stayed current there; now its chain goes by log epoch (the truncates before a change), then by
    version: version 100, the truncate, version 1."""
    lines = [
        _ogg("I", 1, after={"ID": 1, "VERSION": 100, "V": "before"}),
        _ogg("I", 2, after={"ID": 2, "VERSION": 1, "V": "before"}),
        _ogg("T", 3),
        _ogg("I", 4, after={"ID": 3, "VERSION": 2, "V": "after"}),
        _ogg("I", 5, after={"ID": 1, "VERSION": 1, "V": "after"}),  # a lower version than the truncated row's
        _ogg("I", 2, after={"ID": 2, "VERSION": 1, "V": "before"}),  # redelivered late: the log wrote it before
    ]
    capture = tmp_path / "ogg.jsonl"
    capture.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    lake = str(tmp_path / "lake")
    replay(
        spark,
        lake=lake,
        format_name="ogg-json",
        paths=[str(capture)],
        batch_lines=batch_lines,
        sequence_by={"SALES.ORDERS": "version"},
        table_format=table_format,  # type: ignore[arg-type]
        scd2=True,
    )
    rows = lake_reader(spark, table_format)(f"{lake}/SALES/ORDERS")
    assert sorted(rows, key=lambda row: row["ID"]) == [
        {"ID": 1, "VERSION": 1, "V": "after"},
        {"ID": 3, "VERSION": 2, "V": "after"},
    ]
    live = scd2_reader(spark, lake, table_format)(f"{lake}/SALES/ORDERS")
    assert sorted(live, key=lambda row: row["ID"]) == sorted(rows, key=lambda row: row["ID"])
    versions = history_table(spark, lake, "scd2", "SALES", "ORDERS", table_format)
    assert versions is not None
    chains: dict[int | None, list[dict[str, Any]]] = {}
    for row in versions.collect():
        chains.setdefault(row["ID"] if row[ROW_KEY_COLUMN] is not None else None, []).append(row.asDict())
    truncate_at = {row[VALID_FROM_COLUMN] for row in chains.pop(None)}  # the truncate's marker row
    assert len(truncate_at) == 1

    def linked(chain: list[dict[str, Any]]) -> list[tuple[int, str]]:
        """The key's rows from the first version on, each closed where the next one starts: (VERSION, op)."""
        starts = {row[VALID_FROM_COLUMN]: row for row in chain}
        row = next(r for r in chain if r[VALID_FROM_COLUMN] not in {o[VALID_TO_COLUMN] for o in chain})
        walked = [row]
        while row[VALID_TO_COLUMN] is not None:
            row = starts[row[VALID_TO_COLUMN]]
            walked.append(row)
        assert len(walked) == len(chain)
        assert [r[IS_CURRENT_COLUMN] for r in walked] == [False] * (len(walked) - 1) + [True]
        return [(r["VERSION"], r[OP_COLUMN]) for r in walked]

    assert linked(chains[1]) == [(100, "UPSERT"), (100, "TRUNCATE"), (1, "UPSERT")]
    assert linked(chains[2]) == [(1, "UPSERT"), (1, "TRUNCATE")]
    assert linked(chains[3]) == [(2, "UPSERT")]
    assert {row[VALID_FROM_COLUMN] for row in chains[1] + chains[2] if row[OP_COLUMN] == "TRUNCATE"} == truncate_at


def _replay_ogg(spark, tmp_path: Path, name: str, lines: list[str], **settings: Any) -> int:  # type: ignore[no-untyped-def]
    """Replays OGG JSON ``lines`` (:func:`tests.e2e.helpers.replay_lines`)."""
    return replay_lines(spark, tmp_path, name, lines, "ogg-json", **settings)


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_lake_table_written_in_one_order_refuses_changes_ordered_otherwise(
    spark, tmp_path: Path, table_format: str
) -> None:
    """A lake table records the ordering its rows were written with (``cdclake.sequenceBy``). Once ``sequence_by``
    orders its source table otherwise, the stored ``version|position`` orders and the new bare positions would
    compare as text: the update below (position 3) sorted before the stored version (``000100...10|...``) and was
    dropped without a word. Now its row changes are dead letters that say why and how to fix it; its truncates
    still apply, by the log part of the stored orders. A table from before the property takes the setting as it
    is."""
    lake = str(tmp_path / "lake")

    def run(name: str, lines: list[str], sequence_by: dict[str, str]) -> int:
        return _replay_ogg(spark, tmp_path, name, lines, sequence_by=sequence_by, table_format=table_format)

    def rows() -> list[tuple[int, int, str]]:
        stored = lake_reader(spark, table_format)(f"{lake}/SALES/ORDERS")
        return sorted((row["ID"], row["VERSION"], row["V"]) for row in stored)

    by_version = {"SALES.ORDERS": "version"}
    inserts = [_ogg("I", 1, after={"ID": 1, "VERSION": 10, "V": "a"}), _ogg("I", 2, after={"ID": 2, "VERSION": 1})]
    assert run("a", inserts, by_version) == 0
    update = [_ogg("U", 3, before={"ID": 1, "VERSION": 10, "V": "a"}, after={"ID": 1, "VERSION": 11, "V": "b"})]
    if table_format == "delta":  # a dry run finds it first, as `cdclake check` does
        from typer.testing import CliRunner

        from cdclake.cli import main as cli_main

        (tmp_path / "b.jsonl").write_text(update[0] + "\n", encoding="utf-8")
        args = ["replay", "--dry-run", "--lake", lake, "--format", "ogg-json", str(tmp_path / "b.jsonl")]
        dry = CliRunner().invoke(cli_main.app, args)
        assert dry.exit_code == 1, dry.output
        assert "was written with SALES.SALES.ORDERS's changes ordered by its column version" in " ".join(
            dry.output.split()
        )
    assert run("b", update, {}) == 1
    assert rows() == [(1, 10, "a"), (2, 1, None)]
    (reason,) = {row["reason"] for row in read_table(f"{lake}/_cdclake/dead_letters")}
    assert reason.startswith(
        "the lake table SALES/ORDERS was written with SALES.SALES.ORDERS's changes ordered by its column version, but "
        "sequence_by now orders them by the format's position"
    )
    assert "Set sequence_by for SALES.SALES.ORDERS back to `version`" in reason

    assert run("b", update, by_version) == 0  # the setting back: the same change applies
    assert rows() == [(1, 11, "b"), (2, 1, None)]
    # A truncate goes by the log whatever the setting: compared whole, `000100...11|...03/1` sorted after it.
    assert run("c", [_ogg("T", 4)], {}) == 0
    assert rows() == []

    if table_format == "delta":  # a table from before the property: written as the setting says now
        spark.sql(f"ALTER TABLE delta.`{lake}/SALES/ORDERS` UNSET TBLPROPERTIES ('cdclake.sequenceBy')")
        assert run("d", [_ogg("I", 5, after={"ID": 3, "VERSION": 1, "V": "c"})], {}) == 0
        assert rows() == [(3, 1, "c")]
        recorded = spark.sql(f"SHOW TBLPROPERTIES delta.`{lake}/SALES/ORDERS` ('cdclake.sequenceBy')").first()
        assert recorded is not None
        assert recorded["value"] == ""


def test_a_null_version_sorts_before_every_value(spark, tmp_path: Path) -> None:
    """A NULL in the ``sequence_by`` column sorts before every value (``apply.NULL_SEQUENCE_KEY``). Its order was
    ``|position``, above every value's (``|`` is above digits): the change that gave a NULL version its first value
    was dropped as older, without a word, and a change to NULL overwrote every version. Orders stored that way
    (rows and SCD2 versions, rewritten so below) compare as NULLs' (``apply.comparable_order``)."""
    lake = str(tmp_path / "lake")

    def run(name: str, lines: list[str]) -> None:
        _replay_ogg(spark, tmp_path, name, lines, sequence_by={"SALES.ORDERS": "version"}, scd2=True)

    run(
        "a",
        [
            _ogg("I", 1, after={"ID": 1, "VERSION": None, "V": "null"}),
            _ogg("I", 2, after={"ID": 2, "VERSION": None, "V": "null, stored the old way"}),
            _ogg("I", 3, after={"ID": 3, "VERSION": 5, "V": "five"}),
        ],
    )
    path = f"{lake}/SALES/ORDERS"
    scd2 = f"{lake}/_cdclake/scd2/SALES/ORDERS"
    # Key 2 as cdclake wrote it before: the empty NULL key.
    spark.sql(f"UPDATE delta.`{path}` SET _cdc_position = substr(_cdc_position, 2) WHERE ID = 2")
    spark.sql(f"UPDATE delta.`{scd2}` SET {VALID_FROM_COLUMN} = substr({VALID_FROM_COLUMN}, 2) WHERE ID = 2")
    stored = spark.sql(f"SELECT _cdc_position FROM delta.`{path}` WHERE ID = 2").collect()
    assert [row[0][:1] for row in stored] == ["|"]
    run(
        "b",
        [
            _ogg("U", 4, before={"ID": 1, "VERSION": None}, after={"ID": 1, "VERSION": 1, "V": "one"}),
            _ogg("U", 5, before={"ID": 2, "VERSION": None}, after={"ID": 2, "VERSION": 2, "V": "two"}),
            _ogg("U", 6, before={"ID": 3, "VERSION": 5}, after={"ID": 3, "VERSION": None, "V": "null again"}),
        ],
    )
    rows = sorted((row["ID"], row["VERSION"], row["V"]) for row in read_table(path))
    assert rows == [(1, 1, "one"), (2, 2, "two"), (3, 5, "five")]
    live = scd2_reader(spark, lake, "delta")(path)
    assert sorted((row["ID"], row["VERSION"], row["V"]) for row in live) == rows
    versions = history_table(spark, lake, "scd2", "SALES", "ORDERS")
    assert versions is not None
    chains: dict[int, list[tuple[int | None, bool]]] = {}
    for row in versions.orderBy(apply.comparable_order(F.col(VALID_FROM_COLUMN))).collect():
        chains.setdefault(row["ID"], []).append((row["VERSION"], row[IS_CURRENT_COLUMN]))
    # The change to NULL is older than version 5: it goes before it in the key's history.
    assert chains == {1: [(None, False), (1, True)], 2: [(None, False), (2, True)], 3: [(None, False), (5, True)]}


@pytest.mark.parametrize(
    ("table_format", "batch_lines", "sequence_by"),
    [("delta", 1, {"crm.orders": "version"}), ("iceberg", 100, {"crm.*": "version"})],
    ids=["delta-one-per-batch-only-orders-by-version", "iceberg-one-batch-both-by-version"],
)
def test_rows_a_rename_moves_keep_their_order_in_the_table_and_its_history(
    spark, tmp_path: Path, table_format: str, batch_lines: int, sequence_by: dict[str, str]
) -> None:
    """A cut-over as online schema change tools make it (here without ``ddl.online_schema_change``): the copy table
    becomes ``crm.orders`` (ordered by ``version``), whose rows move to ``orders_old``.

    * Lake table: with only ``orders`` ordered by ``version``, the copy table's rows moved with their bare positions,
      which compared as text with ``version|position`` orders: the next update of a moved row was dropped as older,
      without a word. Now a moved row's order is converted to the ordering of the table it moves into
      (``apply.reordered``), both ways (``orders``' rows into ``orders_old``, ordered by the log).
    * SCD2 table: the moved rows' versions started at the statement's bare position, and the truncate at that
      position closed them (it came after them in its epoch): the lake held ``(2, 7)`` and the SCD2 table's live
      version was the older update ``(2, 3)``. Now they are ordered as the lake rows, after the truncate.
    * A table a pattern orders by a column it lacks keeps the log's order; renamed, its new lake table recorded the
      column, so its next update was a dead letter ("ordered otherwise"). Now it records the log's order."""
    ddl = "RENAME TABLE `crm`.`orders` TO `crm`.`orders_old`, `crm`.`orders_copy` TO `crm`.`orders`"
    lines = [
        row_message("INSERT", "orders", [{"id": "1", "version": "5", "v": "a"}], TYPES),
        row_message(
            "INSERT",
            "orders_copy",
            [{"id": "1", "version": "5", "v": "a"}, {"id": "2", "version": "7", "v": "b"}],
            TYPES,
        ),
        ddl_message("orders", ddl, "RENAME"),
        row_message("UPDATE", "orders", [{"id": "1", "version": "6", "v": "new"}], TYPES, old=[{"version": "5"}]),
        # an older version: sequence_by passes it over
        row_message("UPDATE", "orders", [{"id": "2", "version": "3", "v": "older"}], TYPES, old=[{"version": "7"}]),
        # a lower version: applied where the log orders the table, passed over where the version does
        row_message("UPDATE", "orders_old", [{"id": "1", "version": "4", "v": "log"}], TYPES, old=[{"version": "5"}]),
        # a table without the column: through a pattern it keeps the log's order, under its new name too
        row_message("INSERT", "notes", [{"id": "1", "v": "a"}], NOTES),
        ddl_message("notes", "RENAME TABLE `crm`.`notes` TO `crm`.`notes_new`", "RENAME"),
        row_message("UPDATE", "notes_new", [{"id": "1", "v": "b"}], NOTES, old=[{"v": "a"}]),
    ]
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    lake = str(tmp_path / "lake")
    results = replay(
        spark,
        lake=lake,
        format_name="canal-json",
        paths=[str(capture)],
        batch_lines=batch_lines,
        sequence_by=sequence_by,
        table_format=table_format,
        scd2=True,
    )
    assert sum(r.dead_letters for r in results) == 0

    def rows(read: Callable[[str], list[dict[str, Any]]], table: str) -> list[tuple[int, int, str]]:
        return sorted((row["id"], row["version"], row["v"]) for row in read(f"{lake}/crm/{table}"))

    lake_rows, live_versions = lake_reader(spark, table_format), scd2_reader(spark, lake, table_format)
    assert rows(lake_rows, "orders") == [(1, 6, "new"), (2, 7, "b")]
    assert rows(lake_rows, "orders_old") == [(1, 4, "log") if "crm.*" not in sequence_by else (1, 5, "a")]
    for table in ("orders", "orders_old"):
        assert rows(live_versions, table) == rows(lake_rows, table), table
    assert [(row["id"], row["v"]) for row in lake_rows(f"{lake}/crm/notes_new")] == [(1, "b")]
