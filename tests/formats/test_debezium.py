"""Quirks of the Debezium family, Maxwell and OGG that golden files do not show well."""

from __future__ import annotations

import base64
import copy
import json
import logging
from decimal import Decimal, localcontext

import pytest

from cdclake.formats import decode_batch, get_format
from tests.conftest import SHARED
from tests.formats.golden import CASES, canonical_rows, messages_frame, read_jsonl

EXAMPLES = SHARED / "formats" / "examples"
MINE = {
    "debezium-json": "debezium.jsonl",
    "lindorm-debezium": "lindorm-debezium.jsonl",
    "maxwell-json": "maxwell.jsonl",
    "ogg-json": "ogg-json.jsonl",
}


@pytest.mark.parametrize(("name", "file_name"), sorted(MINE.items()))
def test_sniff_accepts_own_examples_and_rejects_the_others(name: str, file_name: str) -> None:
    sniff = get_format(name).sniff
    assert sniff is not None
    for line in read_jsonl(EXAMPLES / file_name):
        assert sniff(line["value"]), (name, line["case"])
    for other_name, other_file in MINE.items():
        if other_name == name:
            continue
        for line in read_jsonl(EXAMPLES / other_file):
            if line["value"] is None:  # a tombstone is Debezium's
                continue
            assert not sniff(line["value"]), (name, other_name, line["case"])


def test_sniff_rejects_dataworks_and_canal_shapes() -> None:
    for file_name in ("dataworks-json.jsonl", "canal-flat.jsonl"):
        for line in read_jsonl(EXAMPLES / file_name):
            for name in MINE:
                sniff = get_format(name).sniff
                assert sniff is not None
                assert not sniff(line["value"]), (name, file_name, line["case"])


def _two_complement(unscaled: int) -> str:
    size = (unscaled.bit_length() + 8) // 8
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


@pytest.mark.spark
def test_connect_decimal_bytes_are_exact_for_any_length(spark) -> None:
    from pyspark.sql import functions as F

    from cdclake.formats._json_images import unscaled_text

    cases = [
        (0, 0),
        (-1, 0),
        (127, 2),
        (128, 2),
        (-128, 2),
        (-129, 3),
        (255, 1),
        (2**63, 0),
        (-(2**63) - 1, 4),
        (2**127 - 1, 10),
        (-(2**127), 38),
        (10**64 + 7, 30),  # MySQL DECIMAL(65,30): beyond Spark's 38 digits, still exact text
        (5, -2),
    ]
    rows = [(_two_complement(u), s) for u, s in cases]
    frame = spark.createDataFrame(rows, "b string, s int")
    got = [r[0] for r in frame.select(unscaled_text(F.col("b"), F.col("s"))).collect()]
    with localcontext() as context:
        context.prec = 100
        want = [Decimal(u).scaleb(-s) for u, s in cases]
        assert [Decimal(g) for g in got] == want
    assert got[:5] == ["0", "-1", "1.27", "1.28", "-1.28"]
    assert got[-1] == "500"


@pytest.mark.spark
def test_connect_decimals_past_the_limits_are_values_that_do_not_fit(spark) -> None:
    """A scale beyond MAX_DECIMAL_SCALE (a corrupt 2**31 - 1 padded the text with that many zeros: the driver ran out
    of memory) or bytes beyond MAX_UNSCALED_BYTES (quadratic: 4 KiB took 35 s) read as NULL, which the decoder
    reports as a value that does not fit; up to the limits the text stays exact."""
    from pyspark.sql import functions as F

    from cdclake.formats._json_images import MAX_DECIMAL_SCALE, MAX_UNSCALED_BYTES, unscaled_text
    from cdclake.spark import local_frame

    longest = 2 ** (8 * MAX_UNSCALED_BYTES - 1) - 1
    cases = [
        (5, MAX_DECIMAL_SCALE),
        (5, -MAX_DECIMAL_SCALE),
        (longest, 2),
        (5, MAX_DECIMAL_SCALE + 1),
        (5, -MAX_DECIMAL_SCALE - 1),
        (5, 2**31 - 1),
        (5, -(2**31)),
        (2 ** (8 * MAX_UNSCALED_BYTES), 0),  # one byte more
    ]
    frame = local_frame(spark, [(_two_complement(u), s) for u, s in cases], "b string, s int")
    got = [r[0] for r in frame.select(unscaled_text(F.col("b"), F.col("s"))).collect()]
    assert got[3:] == [None] * 5
    with localcontext() as context:
        context.prec = 3000
        assert [Decimal(g) for g in got[:3]] == [Decimal(u).scaleb(-s) for u, s in cases[:3]]
    assert got[1] == "5" + "0" * MAX_DECIMAL_SCALE

    golden = read_jsonl(CASES / "debezium-json" / "insert.input.jsonl")[0]
    golden["value"]["payload"]["after"]["num"] = {"scale": 2**31 - 1, "value": "+w=="}
    frame = messages_frame(spark, [golden])
    (row,) = canonical_rows(decode_batch(get_format("debezium-json"), frame, {}))
    assert "column num does not fit" in row["error"], row["error"]


@pytest.mark.spark
def test_connect_times_keep_hours_past_99_and_any_long(spark) -> None:
    """MySQL TIME reaches 838:59:59, sent as microseconds (MicroTime), milliseconds (Time, int32) or nanoseconds
    (NanoTime) since midnight: every digit of the hours is kept (they were cut to two, so 838 became 83), and the ends
    of a long are text, not an overflow that fails the batch."""
    golden = read_jsonl(CASES / "debezium-json" / "insert.input.jsonl")[0]
    after_fields = next(f for f in golden["value"]["schema"]["fields"] if f["field"] == "after")["fields"]
    after_fields += [
        {"field": "millis", "type": "int32", "optional": True, "name": "io.debezium.time.Time"},
        {"field": "nanos", "type": "int64", "optional": True, "name": "io.debezium.time.NanoTime"},
    ]
    values = [  # alarm (MicroTime), millis, nanos
        (3_020_399_000_000, 1_800_000_000, 3_020_399_000_000_000),
        (-3_020_399_000_001, -1_800_000_001, -3_020_399_000_001_000),
        (-(2**63), None, None),
        (2**63 - 1, None, None),
    ]
    lines = []
    for alarm, millis, nanos in values:
        line = copy.deepcopy(golden)
        line["value"]["payload"]["after"].update(alarm=alarm, millis=millis, nanos=nanos)
        lines.append(line)
    rows = canonical_rows(decode_batch(get_format("debezium-json"), messages_frame(spark, lines), {}))
    assert [r["error"] for r in rows] == [None] * 4
    assert [(r["after"]["alarm"], r["after"].get("millis"), r["after"].get("nanos")) for r in rows] == [
        ("838:59:59.000000", "500:00:00.000000", "838:59:59.000000"),
        ("-838:59:59.000001", "-500:00:00.001000", "-838:59:59.000001"),
        ("-2562047788:00:54.775808", None, None),
        ("2562047788:00:54.775807", None, None),
    ]


@pytest.mark.spark
def test_unavailable_placeholder_is_configurable(spark) -> None:
    value = {
        "before": None,
        "after": {"id": 1, "body": "<n/a>", "title": "t"},
        "source": {"connector": "postgresql", "db": "d", "schema": "s", "table": "t", "lsn": 5, "ts_ms": 1},
        "op": "u",
    }
    frame = messages_frame(spark, [{"key": None, "value": value}])
    (row,) = canonical_rows(
        decode_batch(get_format("debezium-json"), frame, {"unavailable_value_placeholder": "<n/a>"})
    )
    assert row["after"] == {"id": "1", "title": "t"}
    assert row["after_is_partial"] is True


@pytest.mark.spark
def test_a_create_with_unavailable_values_left_unpaired_is_an_insert_and_a_warning_names_its_table(
    spark, caplog: pytest.LogCaptureFixture
) -> None:
    """debezium.md 2 and 6: a ``c`` with unavailable values is the second half of a primary-key update. Paired with
    its ``d`` (same PostgreSQL or MySQL position, same batch) it becomes an UPDATE from the old key; left unpaired
    (its ``d`` in an earlier batch, or Oracle, whose SCN may be shared) it stays an insert, whose row lacks the
    columns the log left out. That used to happen without a word; now a warning per table says how many."""

    def change(op: str, at: int, image: dict[str, object], connector: str = "postgresql") -> dict[str, object]:
        source: dict[str, object] = {"connector": connector, "db": "appdb", "schema": "public", "ts_ms": 1}
        source |= {"table": "articles", "lsn": at} if connector == "postgresql" else {"table": "notes", "scn": at}
        images = {"before": image, "after": None} if op == "d" else {"before": None, "after": image}
        return {"key": {"id": image["id"]}, "value": {**images, "source": source, "op": op, "ts_ms": 1}}

    unavailable = "__debezium_unavailable_value"
    key_only = {"title": None, "body": None}
    lines = [
        change("d", 200, {"id": 1, **key_only}),  # its c is at 200 too: paired
        change("c", 200, {"id": 2, "title": "t", "body": unavailable}),
        change("c", 300, {"id": 4, "title": "t", "body": unavailable}),  # its d was in an earlier batch
        change("d", 7, {"id": 5, **key_only}, "oracle"),  # same SCN, but Oracle's SCN may be shared
        change("c", 7, {"id": 6, "title": "t", "body": unavailable}, "oracle"),
        change("c", 8, {"id": 7, "title": "t", "body": "whole"}, "oracle"),  # a whole create: nothing to say
    ]
    with caplog.at_level(logging.WARNING, logger="cdclake.formats.debezium"):
        rows = canonical_rows(decode_batch(get_format("debezium-json"), messages_frame(spark, lines), {}))
    creates = {row["after"]["id"]: row["op"] for row in rows if row["vendor_op"] == "c"}
    assert creates == {"2": "UPDATE", "4": "INSERT", "6": "INSERT", "7": "INSERT"}
    warnings = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("1 Debezium create(s) of appdb.public.articles carry unavailable values")
    assert "(connector: postgresql)" in warnings[0]
    assert warnings[1].startswith("1 Debezium create(s) of appdb.public.notes carry unavailable values")
    assert "(connector: oracle)" in warnings[1]


@pytest.mark.spark
def test_the_key_headers_make_a_primary_key_update_one_update(spark, caplog: pytest.LogCaptureFixture) -> None:
    """debezium.md 2: a primary-key update is a ``d`` with the ``__debezium.newkey`` header and a ``c`` with
    ``__debezium.oldkey``. The ``c`` becomes an UPDATE whose before image is the old key, for any connector and
    without its ``d`` in the batch; the ``d`` an OTHER event of its table, not applied. Headers in the header
    converter's forms: Kafka Connect's default (a JSON object) and the JsonConverter's with the Connect schema around
    the payload. A header that is no JSON object leaves a message as it looks."""
    unavailable = "__debezium_unavailable_value"

    def change(op: str, at: int, image: dict[str, object], key: str | None, connector: str = "postgresql") -> dict:
        source: dict[str, object] = {"connector": connector, "db": "appdb", "schema": "public", "ts_ms": 1}
        source |= {"table": "articles", "lsn": at} if connector == "postgresql" else {"table": "notes", "scn": at}
        images = {"before": image, "after": None} if op == "d" else {"before": None, "after": image}
        line: dict[str, object] = {
            "key": {"id": image["id"]},
            "value": {**images, "source": source, "op": op, "ts_ms": 1},
        }
        if key is not None:
            line["headers"] = {f"__debezium.{'newkey' if op == 'd' else 'oldkey'}": key, "other": "x"}
        return line

    wrapped = json.dumps(
        {"schema": {"type": "struct", "fields": [{"field": "id", "type": "int32"}]}, "payload": {"id": 5}}
    )
    lines = [
        change("c", 300, {"id": 4, "title": "t", "body": unavailable}, '{"id":3}'),  # its d in another batch
        change("d", 7, {"id": 5, "title": None, "body": None}, '{"id":6}', "oracle"),
        change("c", 7, {"id": 6, "title": "t", "body": unavailable}, wrapped, "oracle"),
        change("c", 8, {"id": 7, "title": "t", "body": "whole"}, '{"id":70}', "oracle"),  # whole: still a key change
        change("d", 9, {"id": 80, "title": None, "body": None}, "Struct{id=8}"),  # not JSON: as they look
        change("c", 9, {"id": 8, "title": "t", "body": "whole"}, "Struct{id=80}"),
        change("c", 10, {"id": 9, "title": "t", "body": "whole"}, None),
    ]
    with caplog.at_level(logging.WARNING, logger="cdclake.formats.debezium"):
        rows = canonical_rows(decode_batch(get_format("debezium-json"), messages_frame(spark, lines), {}))
    assert [
        (row["vendor_op"], row["op"], row["table"], row["before"], (row["after"] or {}).get("id")) for row in rows
    ] == [
        ("c", "UPDATE", "articles", {"id": "3"}, "4"),
        ("d", "OTHER", "notes", None, None),
        ("c", "UPDATE", "notes", {"id": "5"}, "6"),
        ("c", "UPDATE", "notes", {"id": "70"}, "7"),
        ("d", "DELETE", "articles", {"id": "80", "title": None, "body": None}, None),
        ("c", "INSERT", "articles", None, "8"),
        ("c", "INSERT", "articles", None, "9"),
    ]
    assert all(row["error"] is None for row in rows)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == []


def _connect_value(after_fields: object, before_fields: object) -> dict[str, object]:
    """A wrapped Debezium value whose schema lists ``after_fields`` and ``before_fields`` for the two images."""
    return {
        "schema": {
            "type": "struct",
            "fields": [
                {"field": "before", "type": "struct", "optional": True, "fields": before_fields},
                {"field": "after", "type": "struct", "optional": True, "fields": after_fields},
                {"field": "source", "type": "struct", "fields": [{"field": "db", "type": "string", "default": {}}]},
                {"field": "op", "type": "string"},
            ],
        },
        "payload": {
            "before": {"id": 1, "amount": "ThY=", "gone": 5},
            "after": {"id": 1, "amount": "ThY="},
            "source": {"connector": "mysql", "db": "d", "table": "t", "file": "b.000001", "pos": 4, "ts_ms": 1},
            "op": "u",
        },
    }


@pytest.mark.spark
def test_connect_schema_typed_and_as_variant_declare_the_same_columns(spark) -> None:
    """The typed parse of the Connect schema (CONNECT_SCHEMA), and the VARIANT one for schemas it cannot read, give
    the same columns: after's fields, then those only before declares (a column an update dropped)."""
    decimal = {
        "field": "amount",
        "type": "bytes",
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
    }
    after = [{"field": "id", "type": "int64", "optional": False}, decimal]
    before = [*after, {"field": "gone", "type": "int32"}]
    typed = _connect_value(after, before)
    # Only the VARIANT parse can read this one: the source block's fields are text (the spec's examples do this).
    as_variant = _connect_value(after, before)
    as_variant["schema"]["fields"][2]["fields"] = "<omitted>"  # type: ignore[index]
    # Images whose field lists are not lists count as undeclared: the other image's fields are used.
    after_unreadable = _connect_value("<same as before>", before)
    frame = messages_frame(spark, [{"key": {"id": 1}, "value": v} for v in (typed, as_variant, after_unreadable)])
    rows = canonical_rows(decode_batch(get_format("debezium-json"), frame, {}))
    expected = [
        ["id", "int64", "bigint"],
        ["amount", "org.apache.kafka.connect.data.Decimal", "decimal(10,2)"],
        ["gone", "int32", "int"],
    ]
    for row in rows:
        assert row["error"] is None
        assert row["columns"] == expected
        assert row["after"] == {"id": "1", "amount": "199.90"}
        assert row["before"] == {"id": "1", "amount": "199.90", "gone": "5"}


@pytest.mark.spark
def test_inferred_types_follow_the_json_kind_of_each_value(spark) -> None:
    """Schemaless images: a column's type comes from its JSON kind (after's value, else before's), read from the
    VARIANT. ``120.0`` is a fraction although the VARIANT keeps it as DECIMAL(3,0); an integer beyond 64 bits stays
    an integer (its value then does not fit: a dead letter); after's columns come first. The Debezium and the
    Maxwell/OGG builders declare the same columns."""
    from pyspark.sql import functions as F

    from cdclake.formats._json_images import fields_columns, inferred_columns, inferred_fields, inferred_kinds

    after = (
        '{"a": 1, "b": 1.5, "c": 120.0, "d": "x", "e": true, "f": {"k": 1}, "g": [1], "h": null, '
        '"i": 92233720368547758070, "j": 1e3, "k": 123456789012345678901234567890123456789012}'
    )
    before = '{"h": 5, "z": "only before"}'
    image = "MAP<STRING, VARIANT>"
    images = spark.createDataFrame([(after, before)], "a string, b string").select(
        F.from_json("a", image).alias("after"), F.from_json("b", image).alias("before")
    )
    kinds = images.select(inferred_kinds(F.col("before"), F.col("after")).alias("kinds"))
    direct = inferred_columns(F.col("kinds"))
    row = kinds.select(direct.alias("direct"), fields_columns(inferred_fields(F.col("kinds"))).alias("fields")).first()
    assert row is not None
    declared = [(c["name"], c["vendor_type"], c["spark_type"]) for c in row["direct"]]
    assert declared == [
        ("a", "integer", "bigint"),
        ("b", "number", "double"),
        ("c", "number", "double"),
        ("d", "string", "string"),
        ("e", "boolean", "boolean"),
        ("f", "object", "string"),
        ("g", "array", "string"),
        ("h", "integer", "bigint"),
        ("i", "integer", "bigint"),
        ("j", "number", "double"),
        ("k", "number", "double"),
        ("z", "string", "string"),
    ]
    assert [(c["name"], c["vendor_type"], c["spark_type"]) for c in row["fields"]] == declared
