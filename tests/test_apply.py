"""The fold: all changes of a key in a batch, in source order, reduced to one."""

from __future__ import annotations

from datetime import datetime

import pytest
from pyspark.sql import functions as F

from cdclake import apply, model

pytestmark = pytest.mark.spark

COLUMNS = [("id", "LONG", "bigint"), ("a", "STRING", "string"), ("b", "STRING", "string")]


def _event(op, position, offset, before=None, after=None, partial=False, table="t"):
    return {
        "format": "test",
        "op": op,
        "vendor_op": op,
        "db_type": None,
        "database": "d",
        "schema": None,
        "table": table,
        "key_columns": ["id"],
        "before": before,
        "after": after,
        "after_is_partial": partial,
        "columns": [{"name": n, "vendor_type": v, "spark_type": s} for n, v, s in COLUMNS],
        "position": position,
        "event_time": datetime(2024, 1, 1),
        "txn_id": None,
        "ddl": None,
        "topic": "k",
        "partition": 0,
        "offset": offset,
        "sub_index": 0,
        "kafka_timestamp": None,
        "error": None,
        "raw_key": None,
        "raw_value": None,
    }


def _fold(spark, events):
    frame = spark.createDataFrame(events, model.CANONICAL_SCHEMA)
    rows = apply.fold(apply.row_changes(frame)).orderBy(apply.ROW_KEY).collect()
    return {r[apply.ROW_KEY]: (r[apply.KIND], r[apply.IMAGE], r[apply.PARTIAL], r[apply.ORDER]) for r in rows}


def test_changes_apply_in_position_order_not_arrival_order(spark) -> None:
    folded = _fold(
        spark,
        [
            _event("UPDATE", "0003", 0, after={"id": "1", "a": "third", "b": None}),
            _event("INSERT", "0001", 1, after={"id": "1", "a": "first", "b": None}),
            _event("UPDATE", "0002", 2, after={"id": "1", "a": "second", "b": None}),
        ],
    )
    assert folded['["1"]'][:2] == ("UPSERT", {"id": "1", "a": "third", "b": None})


def test_split_update_halves_and_a_late_duplicate_first_half(spark) -> None:
    full = {"id": "1", "a": "x", "b": "y"}
    folded = _fold(
        spark,
        [
            _event("UPDATE", "0005", 0, before={"id": "1", "a": "old", "b": "y"}),  # UPDATE_BEFOR
            _event("UPDATE", "0005", 1, after=full),  # UPDATE_AFTER
            _event("UPDATE", "0005", 2, before={"id": "1", "a": "old", "b": "y"}),  # re-sent BEFOR, later offset
        ],
    )
    kind, image, partial, order = folded['["1"]']
    assert (kind, image, partial) == ("UPSERT", full, False)
    assert order == "0005/1"  # the second half's order: a re-sent first half ("0005/0") can never delete the row


def test_primary_key_change_deletes_the_old_key(spark) -> None:
    folded = _fold(
        spark,
        [
            _event(
                "UPDATE", "0007", 0, before={"id": "1", "a": "x", "b": None}, after={"id": "2", "a": "x", "b": None}
            ),
        ],
    )
    assert folded['["1"]'][0] == "DELETE"
    assert folded['["2"]'][:2] == ("UPSERT", {"id": "2", "a": "x", "b": None})


def test_partial_images_overlay_in_order_and_keep_absent_columns(spark) -> None:
    folded = _fold(
        spark,
        [
            _event("UPDATE", "0002", 0, after={"id": "1", "a": "A2"}, partial=True),
            _event("UPDATE", "0003", 1, after={"id": "1", "b": None}, partial=True),
            _event("INSERT", "0001", 2, after={"id": "2", "a": "a", "b": "b"}),
            _event("UPDATE", "0002", 3, after={"id": "2", "b": "B"}, partial=True),
            _event("DELETE", "0001", 4, before={"id": "3", "a": "a", "b": "b"}),
            _event("UPDATE", "0002", 5, after={"id": "3", "a": "A"}, partial=True),
        ],
    )
    # Only partial images: still partial, absent columns keep the stored row's values; NULL is a value.
    assert folded['["1"]'][:3] == ("UPSERT", {"id": "1", "a": "A2", "b": None}, True)
    # On top of a full image in the same batch: complete.
    assert folded['["2"]'][:3] == ("UPSERT", {"id": "2", "a": "a", "b": "B"}, False)
    # After a delete: starts from nothing; absent columns are NULL, not the deleted row's.
    assert folded['["3"]'][:3] == ("UPSERT", {"id": "3", "a": "A"}, False)


def test_kafka_order_is_the_fallback_position(spark) -> None:
    folded = _fold(
        spark,
        [
            _event("INSERT", None, 10, after={"id": "1", "a": "later", "b": None}),
            _event("INSERT", None, 9, after={"id": "1", "a": "earlier", "b": None}),
        ],
    )
    _kind, image, _, order = folded['["1"]']
    assert image["a"] == "later"
    assert order.startswith("~")  # sorts after every vendor position


def test_plan_tables_collects_columns_keys_truncates_and_lowest_orders(spark) -> None:
    truncate = _event("TRUNCATE", "0009", 3)
    truncate.update(before=None, after=None, columns=None, key_columns=None)
    older = _event("DELETE", "0000", 4, before={"id": "2"})
    older["columns"] = [{"name": "id", "vendor_type": "LONG", "spark_type": "bigint"}]  # a summary row of its own
    events = [
        _event("INSERT", "0001", 0, after={"id": "1", "a": "x", "b": None}),
        truncate,
        _event("INSERT", "0001", 1, after={"id": "1"}, table="u"),
        older,
    ]
    events[2]["columns"] = [{"name": "id", "vendor_type": "LONG", "spark_type": "bigint"}]
    plans = {p.table: p for p in apply.plan_tables(spark.createDataFrame(events, model.CANONICAL_SCHEMA))}
    assert plans["t"].columns == [("id", "bigint"), ("a", "string"), ("b", "string")]
    assert plans["t"].key_columns == ["id"]
    assert plans["t"].truncate_order == "0009/1"
    assert plans["u"].columns == [("id", "bigint")]
    assert plans["u"].truncate_order is None
    # The lowest order of each table's row events (the TRUNCATE is not one), across its summary rows.
    assert plans["t"].first_order == "0000/1"
    assert plans["u"].first_order == "0001/1"


def test_configured_keys_override_and_whole_row_fallback(spark) -> None:
    event = _event("INSERT", "1", 0, after={"id": "1", "a": "x", "b": None})
    event["key_columns"] = []
    frame = spark.createDataFrame([event], model.CANONICAL_SCHEMA)
    assert frame.select(apply.effective_keys(frame, {})).first()[0] == []
    assert frame.select(apply.effective_keys(frame, {"d.t": ["a"]})).first()[0] == ["a"]
    assert frame.select(apply.effective_keys(frame, {"t": ["b", "a"]})).first()[0] == ["b", "a"]
    assert frame.select(apply.effective_keys(frame, {"other.t": ["b"]})).first()[0] == []


def test_keyless_row_key_ignores_declared_nulls_and_column_order(spark) -> None:
    """Key-less rows are identified by their non-NULL values: a message declaring a column added later (NULL in
    the row) or one that leaves NULL cells out names the same row."""
    images = [
        {"id": "1", "a": "x"},
        {"id": "1", "a": "x", "b": None},
        {"B": None, "A": "x", "ID": "1"},
        {"id": "1", "a": "y"},
        {"id": "1", "a": None, "b": "x"},
    ]
    frame = spark.createDataFrame([(image,) for image in images], "image map<string,string>")
    no_keys = F.array().cast("array<string>")
    keys = [row[0] for row in frame.select(apply.key_of(F.col("image"), no_keys)).collect()]
    assert keys[0] == keys[1] == keys[2]
    assert len({keys[0], keys[3], keys[4]}) == 3
    by_id = frame.select(apply.key_of(F.col("image"), F.array(F.lit("id")))).collect()
    assert {row[0] for row in by_id[:2]} == {'["1"]'}


def test_tables_sharing_a_merge_keep_the_latest_change_of_a_key(spark) -> None:
    """Routed shards share one MERGE (apply.latest_per_key): their keys should be disjoint; a key in two of them
    keeps the change of the highest order, whichever table sent it, as merging the tables in turn would."""
    events = [
        _event("INSERT", "0002", 0, after={"id": "1", "a": "shard-0", "b": None}, table="orders_0"),
        _event("INSERT", "0001", 1, after={"id": "1", "a": "shard-1", "b": None}, table="orders_1"),
        _event("INSERT", "0003", 2, after={"id": "2", "a": "shard-1", "b": None}, table="orders_1"),
        _event("DELETE", "0004", 3, before={"id": "3", "a": "x", "b": None}, table="orders_0"),
    ]
    frame = spark.createDataFrame(events, model.CANONICAL_SCHEMA)
    latest = apply.latest_per_key(apply.fold(apply.row_changes(frame))).collect()
    assert sorted((r[apply.ROW_KEY], r[apply.KIND], r[apply.IMAGE].get("a"), r[apply.TABLE_ID]) for r in latest) == [
        ('["1"]', "UPSERT", "shard-0", apply.table_id_of("d", None, "orders_0")),
        ('["2"]', "UPSERT", "shard-1", apply.table_id_of("d", None, "orders_1")),
        ('["3"]', "DELETE", "x", apply.table_id_of("d", None, "orders_0")),
    ]
