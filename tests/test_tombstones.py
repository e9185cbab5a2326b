"""The tombstone gate (DeltaSink.gate) reads only the tombstones that can still reject a change of the batch.

A change is kept when its order is >= its key's tombstone and > its table's truncate mark. The pipeline passes each
table's lowest order in the batch (TablePlan.first_order), and the gate skips every tombstone ordered below it: the
result must be what reading every tombstone gives, and a stream in source order must not read old tombstone files.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from cdclake import apply
from cdclake.sinks.delta import DeltaSink
from cdclake.spark import local_frame, session_settings

pytestmark = pytest.mark.spark

FOLDED_SCHEMA = f"{apply.TABLE_ID} string, {apply.ROW_KEY} string, `{apply.ORDER}` string"
TOMBSTONE_SCHEMA = "table_id string, row_key string, position string"


def _write_tombstones(spark, sink: DeltaSink, rows: list[tuple[str, str, str]]) -> None:  # type: ignore[no-untyped-def]
    frame = local_frame(spark, rows, TOMBSTONE_SCHEMA).selectExpr(
        "*", "CAST(NULL AS timestamp) AS event_time", "current_timestamp() AS recorded_at"
    )
    sink.append(sink.TOMBSTONES, frame, None)


def _gated(  # type: ignore[no-untyped-def]
    spark, sink: DeltaSink, folded: list[tuple[str, str, str]], lowest: Mapping[str, str | None]
) -> set[tuple[str, str, str]]:
    frame = local_frame(spark, folded, FOLDED_SCHEMA)
    return {tuple(row) for row in sink.gate(frame, lowest).select(apply.TABLE_ID, apply.ROW_KEY, apply.ORDER).collect()}


def _order(rng: random.Random, prefix: str) -> str:
    return f"{prefix}{rng.randrange(1000):04d}/{rng.randrange(2)}"


def test_reading_from_each_tables_lowest_order_keeps_what_reading_every_tombstone_keeps(spark, tmp_path: Path) -> None:
    """A random lake: tables whose orders start with digits, ``~`` (Kafka coordinates) or ``!`` (full loads),
    tombstones and truncate marks below, at and above each table's lowest order, tables outside the batch."""
    rng = random.Random(7)
    sink = DeltaSink(spark, str(tmp_path / "lake"))
    tables = [f"db\x1fs\x1ft{i}" for i in range(24)]
    prefixes = {table: rng.choice(["0", "1", "~", "!"]) for table in tables}
    folded = [
        (table, json.dumps([key]), _order(rng, prefixes[table]))
        for table in tables[:20]
        for key in rng.sample(range(40), 12)
    ]
    lowest = {table: min(order for t, _, order in folded if t == table) for table in tables[:20]}
    tombstones = []
    for table in tables:
        for key in range(40):
            for _ in range(rng.randrange(3)):
                tombstones.append((table, json.dumps([key]), _order(rng, rng.choice([prefixes[table], "0", "~"]))))
        if rng.random() < 0.3:
            tombstones.append((table, "", _order(rng, prefixes[table])))
        elif table in lowest and rng.random() < 0.5:
            tombstones.append((table, "", lowest[table]))  # a truncate at the lowest order voids that change
    half = len(tombstones) // 2
    _write_tombstones(spark, sink, tombstones[:half])
    _write_tombstones(spark, sink, tombstones[half:])

    # Independent reference: the rule itself over every tombstone, in Python.
    newest: dict[tuple[str, str], str] = {}
    for table, key, position in tombstones:
        newest[(table, key)] = max(position, newest.get((table, key), ""))
    expected = {
        (table, key, order)
        for table, key, order in folded
        if order >= newest.get((table, key), "") and order > newest.get((table, ""), "")
    }
    assert 0 < len(expected) < len(folded), "the instance must keep some changes and reject others"

    every_tombstone = _gated(spark, sink, folded, dict.fromkeys(lowest))
    assert every_tombstone == expected
    # The pipeline's bounds, and the same with some tables unbounded (a mix of both kinds of condition).
    assert _gated(spark, sink, folded, lowest) == expected
    mixed = {table: None if index % 3 == 0 else order for index, (table, order) in enumerate(lowest.items())}
    assert _gated(spark, sink, folded, mixed) == expected


def test_a_batch_newer_than_every_tombstone_reads_no_tombstone_file(spark, tmp_path: Path) -> None:
    """The bound reaches Delta's data skipping: the files of older tombstones are not even opened (they are removed
    from disk here, so reading one would fail), while a batch older than them still reads and applies them."""
    sink = DeltaSink(spark, str(tmp_path / "lake"))
    table = "db\x1f\x1ft"
    _write_tombstones(spark, sink, [(table, json.dumps([k]), f"{100 + k:06d}/1") for k in range(20)])
    _write_tombstones(spark, sink, [(table, "", "000150/1")])
    folded = [(table, json.dumps([k]), f"{300 + k:06d}/1") for k in range(30)]
    assert _gated(spark, sink, folded, {table: "000300/1"}) == set(folded)

    # A truncate at exactly the batch's lowest order still rejects the change at that order.
    assert _gated(spark, sink, [(table, json.dumps([40]), "000150/1")], {table: "000150/1"}) == set()
    late = [(table, json.dumps([k]), f"{120:06d}/1") for k in (5, 25)]
    # Key 5's tombstone (000105/1) is older than the change but the truncate (000150/1) is newer: both rejected.
    assert _gated(spark, sink, late, {table: "000120/1"}) == set()

    log = Path(sink.system_path(sink.TOMBSTONES))
    for line in (log / "_delta_log" / f"{0:020d}.json").read_text(encoding="utf-8").splitlines():
        added = json.loads(line).get("add")
        if added:
            (log / added["path"]).unlink()
    assert _gated(spark, sink, folded, {table: "000300/1"}) == set(folded)
    with pytest.raises(Exception, match=r"(?i)(FileNotFound|does not exist|FAILED_READ_FILE)"):
        _gated(spark, sink, folded, {table: None})


def test_expiry_forgets_only_tombstones_older_than_the_retention(spark, tmp_path: Path) -> None:
    """``expire_tombstones`` deletes the tombstones recorded more than the retention ago and keeps the others (it
    skips the DELETE while the table is younger than the retention: nothing in it can be older)."""
    sink = DeltaSink(spark, str(tmp_path / "lake"))
    table = "db\x1f\x1ft"

    def keys() -> set[str]:
        return {row.row_key for row in spark.read.format("delta").load(sink.system_path(sink.TOMBSTONES)).collect()}

    sink.expire_tombstones(1)  # no tombstone table yet: nothing to do
    _write_tombstones(spark, sink, [(table, json.dumps([1]), "000001/1")])
    sink.expire_tombstones(3600)
    assert keys() == {json.dumps([1])}

    time.sleep(7)
    _write_tombstones(spark, sink, [(table, json.dumps([2]), "000002/1")])
    # Key 1 was recorded more than 7 s ago; key 2 just now (a 6 s margin for a slow machine between the two calls).
    sink.expire_tombstones(6)
    assert keys() == {json.dumps([2])}

    # A table whose first commit file Delta's log clean-up removed (after a checkpoint): its age is unknown, so the
    # DELETE runs (retention 0: every tombstone was recorded before it).
    path = sink.system_path(sink.TOMBSTONES)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '1')")
    _write_tombstones(spark, sink, [(table, json.dumps([3]), "000003/1")])
    first_commit = Path(path) / "_delta_log" / f"{0:020d}.json"
    assert list(first_commit.parent.glob("*.checkpoint.parquet"))
    first_commit.unlink()
    sink.expire_tombstones(0)
    assert keys() == set()


def test_a_batch_above_every_tombstone_reads_nothing_while_every_writers_new_tombstones_still_reject(
    spark, tmp_path: Path
) -> None:
    """The gate's per-table bounds (TombstoneBounds): read in full once, then followed from the tombstones table's
    commit files, whoever wrote them. A batch whose tables no tombstone reaches returns the folded changes untouched
    (no read at all); a tombstone that another writer appended since (``dlq replay`` beside ``run``), a compaction of
    the table, and a file written without statistics all leave the gate rejecting exactly what it must."""
    lake = str(tmp_path / "lake")
    sink, other_writer = DeltaSink(spark, lake), DeltaSink(spark, lake)
    orders, customers = "db\x1f\x1forders", "db\x1f\x1fcustomers"
    _write_tombstones(spark, sink, [(orders, json.dumps([k]), f"{100 + k:06d}/1") for k in range(10)])
    bounds = sink.tombstone_bounds

    def gated(folded: list[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
        lowest: dict[str, str | None] = {}
        for table, _, order in folded:
            lowest[table] = min(order, lowest.get(table) or order)
        return _gated(spark, sink, folded, lowest)

    newer = [(orders, json.dumps([1]), "000200/1"), (customers, json.dumps([1]), "000050/1")]
    frame = local_frame(spark, newer, FOLDED_SCHEMA)
    assert sink.gate(frame, {orders: "000200/1", customers: "000050/1"}) is frame
    assert bounds.full_reads == 1
    assert gated([(orders, json.dumps([5]), "000104/1"), (orders, json.dumps([6]), "000107/1")]) == {
        (orders, json.dumps([6]), "000107/1")
    }

    # Another writer's tombstones: a key of a table that had none, and a truncate above the batch below.
    _write_tombstones(spark, other_writer, [(customers, json.dumps([1]), "000300/1"), (orders, "", "000250/1")])
    assert gated(newer) == set()
    assert gated([(customers, json.dumps([2]), "000060/1")]) == {(customers, json.dumps([2]), "000060/1")}
    assert bounds.full_reads == 1

    # A compaction adds files without data change: the bounds stay, and stay right.
    path = sink.system_path(sink.TOMBSTONES)
    spark.sql(f"OPTIMIZE delta.`{path}`")
    late = (orders, json.dumps([3]), "000240/1")
    assert gated([late]) == set()
    assert gated([(orders, json.dumps([3]), "000251/1")]) == {(orders, json.dumps([3]), "000251/1")}
    assert bounds.full_reads == 1

    # A file without statistics cannot be bounded from the log: the bounds are read in full again.
    with session_settings(spark, {"spark.databricks.delta.stats.collect": "false"}):
        _write_tombstones(spark, other_writer, [(customers, json.dumps([7]), "000900/1")])
    assert gated([(customers, json.dumps([7]), "000800/1")]) == set()
    assert bounds.full_reads == 2
    above = local_frame(spark, [(orders, json.dumps([1]), "001000/1")], FOLDED_SCHEMA)
    assert sink.gate(above, {orders: "001000/1"}) is above
