"""DRS DDS (MongoDB) quirks that golden cases cannot show: the Mongo-shell rewrites on text they must not touch."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from cdclake.formats.drs_dds import shell_to_json

# (shell text, JSON text): constructors in a value's place, with and without `new`, and look-alikes that stay.
REWRITES = [
    ('{"_id": ObjectId("5f1a")}', '{"_id": "5f1a"}'),
    ('{"a": new ObjectId("ab")}', '{"a": "ab"}'),
    ('{"a": new  Date(12), "b": Date(-5)}', '{"a": 12, "b": -5}'),
    ('{"a": ISODate("2020-01-01T00:00:00Z")}', '{"a": "2020-01-01T00:00:00Z"}'),
    ('{"a": new BinData(0, "AA==")}', '{"a": {"$binary":"AA==","$type":"0"}}'),
    ('{"a": new NumberDecimal("1.5e3")}', '{"a": "1.5e3"}'),
    ('{"a": NumberDecimal("-Infinity"), "b": NumberDecimal("NaN")}', '{"a": "-Infinity", "b": "NaN"}'),
    ('{"a": [NumberLong("5"), NumberInt(7)]}', '{"a": [5, 7]}'),
    ('{"a": {"b": new Timestamp(1, 2)}}', '{"a": {"b": {"$timestamp":{"t":1,"i":2}}}}'),
    ('{"a": new UUID("x")}', '{"a": "x"}'),
    ('{\n  "a":\n    NumberLong(3)\n}', '{\n  "a":\n    3\n}'),
    # Inside a string value: left as it is (a constructor with a quoted argument has escaped quotes there).
    ('{"note": "retry after Date(1700000000)"}', '{"note": "retry after Date(1700000000)"}'),
    ('{"note": "NumberLong(5) and Timestamp(1, 2)"}', '{"note": "NumberLong(5) and Timestamp(1, 2)"}'),
    ('{"note": "see ObjectId(\\"ab\\")"}', '{"note": "see ObjectId(\\"ab\\")"}'),
    ('{"note": "renew NumberInt(4)"}', '{"note": "renew NumberInt(4)"}'),
    # The limit (drs_dds module): a string that itself puts one in a value's place is rewritten.
    ('{"note": "a: Date(5), b"}', '{"note": "a: 5, b"}'),
    # Not whole constructors: left as they are (the JSON parse then fails: a dead letter).
    ('{"a": new Date(abc)}', '{"a": new Date(abc)}'),
    ('{"a": new ObjectId("zz")}', '{"a": new ObjectId("zz")}'),
    ('{"a": newDate(1)}', '{"a": newDate(1)}'),
    ('{"a": xDate(5)}', '{"a": xDate(5)}'),
]


@pytest.mark.spark
def test_shell_rewrites_turn_constructors_into_json_and_leave_look_alikes(spark) -> None:
    frame = spark.createDataFrame([(text,) for text, _ in REWRITES], "text string")
    rewritten = dict(frame.select("text", shell_to_json(F.col("text")).alias("json")).collect())
    assert rewritten == dict(REWRITES)
