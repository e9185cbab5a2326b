"""DRS DDS (MongoDB) quirks that golden cases cannot show: the Mongo-shell rewrites on text they must not touch."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from cdclake.formats.drs_dds import shell_to_json

# (shell text, JSON text): constructors with and without `new`, and look-alikes that stay as they are.
REWRITES = [
    ('{"_id": ObjectId("5f1a")}', '{"_id": "5f1a"}'),
    ('new ObjectId("ab")', '"ab"'),
    ("x new  Date(12)", "x 12"),
    ("new Date(-5)", "-5"),
    ('ISODate("2020-01-01T00:00:00Z")', '"2020-01-01T00:00:00Z"'),
    ('new BinData(0, "AA==")', '{"$binary":"AA==","$type":"0"}'),
    ('new NumberDecimal("1.5e3")', "1.5e3"),
    ('NumberLong("5") NumberInt(7)', "5 7"),
    ("new Timestamp(1, 2)", '{"$timestamp":{"t":1,"i":2}}'),
    ('new UUID("x")', '"x"'),
    # `new` belongs to the constructor only as a whole word, and only before a whole constructor.
    ('renew ObjectId("ab")', 'renew "ab"'),
    ("_new Date(3)", "_new 3"),
    ("new Date(abc)", "new Date(abc)"),
    ('new ObjectId("zz")', 'new ObjectId("zz")'),
    ("newDate(1)", "newDate(1)"),
    # Date only as a word of its own (Java's \b: a letter, digit or `_` before it joins the word).
    ("éDate(5)", "éDate(5)"),
    ("x_Date(5)", "x_Date(5)"),
    ("9Date(5)", "9Date(5)"),
]


@pytest.mark.spark
def test_shell_rewrites_turn_constructors_into_json_and_leave_look_alikes(spark) -> None:
    frame = spark.createDataFrame([(text,) for text, _ in REWRITES], "text string")
    rewritten = dict(frame.select("text", shell_to_json(F.col("text")).alias("json")).collect())
    assert rewritten == dict(REWRITES)
