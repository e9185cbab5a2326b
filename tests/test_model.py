"""Canonical text, positions and type checks."""

from __future__ import annotations

from decimal import Decimal, localcontext

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from cdclake import model
from cdclake.spark import local_frame

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(
    ("text", "spark_type", "expected"),
    [
        ("9223372036854775807", "bigint", 9223372036854775807),
        ("-12.3400", "decimal(10,4)", __import__("decimal").Decimal("-12.3400")),
        ("AAEC", "binary", b"\x00\x01\x02"),
        ("0", "timestamp", __import__("datetime").datetime(1970, 1, 1)),
        ("1709288131123456", "timestamp", __import__("datetime").datetime(2024, 3, 1, 10, 15, 31, 123456)),
        ("2024-02-29", "date", __import__("datetime").date(2024, 2, 29)),
        ("true", "boolean", True),
        ("NaN", "double", float("nan")),
        ("x", "bigint", None),
    ],
)
def test_typed_value(spark, text: str, spark_type: str, expected: object) -> None:
    value = spark.range(1).select(model.typed_value(F.lit(text), spark_type)).first()[0]
    if isinstance(expected, float) and expected != expected:
        assert value != value
    else:
        assert value == expected


def test_text_is_valid_per_declared_type(spark) -> None:
    cases = [
        ("1", "bigint", True),
        ("1.5", "bigint", False),
        ("1e400", "double", True),
        ("%%", "binary", False),
        ("zz", "binary", True),
        (None, "bigint", True),
        ("12.5", "decimal(10,2)", True),
        ("1,5", "decimal(10,2)", False),
        ("x", "geometry", False),
        ("anything", "string", True),
    ]
    frame = spark.createDataFrame(cases, "text string, t string, ok boolean")
    result = frame.select("text", "t", "ok", model.text_is_valid(F.col("text"), F.col("t")).alias("got")).collect()
    assert [(r["text"], r["t"], r["got"]) for r in result] == [(r["text"], r["t"], r["ok"]) for r in result]


def _fits_by_python(text: str, precision: int, scale: int) -> bool:
    """The reference: Python's exact decimals. A value fits when rounding it to ``scale`` changes nothing and its
    integer part has at most ``precision - scale`` digits."""
    with localcontext() as context:
        context.prec = 1_000
        value = Decimal(text)
        if value == 0:
            return True
        if value.quantize(Decimal(1).scaleb(-scale)) != value:
            return False
        return len(str(abs(int(value)))) <= precision - scale if abs(value) >= 1 else True


@st.composite
def decimal_texts(draw: st.DrawFn) -> tuple[str, int, int]:
    """Decimal text with leading and trailing zeros, either part empty, an exponent or not; and a DECIMAL(p,s)."""
    digits = st.text("0123456789", max_size=42)
    integer, fraction = draw(digits), draw(digits)
    if not integer and not fraction:
        integer = "0"
    text = draw(st.sampled_from(["", "+", "-"])) + integer
    if fraction or draw(st.booleans()):
        text += "." + fraction
    if draw(st.booleans()):
        text += draw(st.sampled_from("eE")) + draw(st.sampled_from(["", "+", "-"])) + str(draw(st.integers(0, 60)))
    precision = draw(st.integers(1, 38))
    return text, precision, draw(st.integers(0, precision))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.lists(decimal_texts(), min_size=150, max_size=150))
def test_decimal_text_fits_as_python_decimals_say(spark, cases: list[tuple[str, int, int]]) -> None:
    """A decimal value that does not fit its declared DECIMAL(p,s) is invalid: a cast would round it or make it NULL,
    silently (``1.005`` in ``decimal(10,2)`` became ``1.01``, ``1234.5`` in ``decimal(5,2)`` NULL)."""
    rows = [(text, f"decimal({p},{s})") for text, p, s in cases]
    frame = local_frame(spark, rows, "text string, t string")
    got = [r[0] for r in frame.select(model.text_is_valid(F.col("text"), F.col("t"))).collect()]
    assert got == [_fits_by_python(text, p, s) for text, p, s in cases]


def test_decimal_text_fits_at_the_edges(spark) -> None:
    cases = [
        ("1234.5", "decimal(5,2)", False),
        ("123.45", "decimal(5,2)", True),
        ("1.005", "decimal(10,2)", False),
        ("1.0050", "decimal(10,3)", True),
        ("-0.000", "decimal(1,0)", True),
        (".5", "decimal(1,1)", True),
        ("1.5E3", "decimal(4,0)", True),
        ("1.5E3", "decimal(3,0)", False),
        ("25e-2", "decimal(2,2)", True),
        ("1e40", "decimal(38,0)", False),
        ("99999999999999999999999999999999999999", "decimal(38,0)", True),
        ("1e9999999999", "decimal(38,0)", False),  # an exponent beyond an int: not a value of any decimal type
        (".", "decimal(10,2)", False),
        ("+", "decimal(10,2)", False),
        ("1_000", "decimal(10,2)", False),
        (" 1", "decimal(10,2)", False),
        ("NaN", "decimal(10,2)", False),
        ("Infinity", "decimal(10,2)", False),
    ]
    frame = local_frame(spark, cases, "text string, t string, ok boolean")
    result = frame.select("text", "t", "ok", model.text_is_valid(F.col("text"), F.col("t")).alias("got")).collect()
    assert [(r["text"], r["t"], r["got"]) for r in result] == [(r["text"], r["t"], r["ok"]) for r in result]


def test_sortable_decimal_orders_like_numbers(spark) -> None:
    values = ["9", "10", "0009", "17092881310000000001", "12ab", "", "123456789012345678901234567"]
    frame = spark.createDataFrame([(v,) for v in values], "v string")
    got = {r["v"]: r["p"] for r in frame.select("v", model.sortable_decimal(F.col("v")).alias("p")).collect()}
    assert got["9"] < got["10"] < got["17092881310000000001"]
    assert got["9"] == got["0009"]
    assert got["12ab"] is None
    assert got[""] is None
    assert got["123456789012345678901234567"] is None  # wider than the position: reported, never truncated


def test_supported_types() -> None:
    assert model.is_supported_spark_type("decimal(38,10)")
    assert not model.is_supported_spark_type("decimal(10,12)")
    assert not model.is_supported_spark_type("map<string,string>")


def test_canonical_text_is_the_inverse_of_typed_value(spark) -> None:
    """Typed values -> canonical text -> the same values, for every supported type, edge values included."""
    from datetime import date, datetime
    from decimal import Decimal

    schema = (
        "b boolean, i tinyint, l bigint, d decimal(38,10), f float, x double, s string, bin binary, day date, "
        "ts timestamp, ntz timestamp_ntz"
    )
    rows = [
        (True, -128, -9223372036854775808, Decimal("-1234567890123456789012345678.0000000001"), 1.5, 1e300,
         "é\n", b"\x00\xff", date(1, 1, 1), datetime(1969, 12, 31, 23, 59, 59, 999999),
         datetime(2024, 2, 29, 23, 59, 59, 1)),
        (False, 0, 0, Decimal("0E-10"), float("-inf"), float("nan"), "", b"", date(9999, 12, 31),
         datetime(2024, 3, 1, 10, 15, 31, 123456), datetime(2024, 1, 1)),
        (None,) * 11,
    ]  # fmt: skip
    frame = spark.createDataFrame(rows, schema)
    fields = [(f.name, f.dataType.simpleString()) for f in frame.schema.fields]
    texts = frame.select(*(model.canonical_text(F.col(n), t).alias(n) for n, t in fields))
    again = texts.select(*(model.typed_value(F.col(n), t).alias(n) for n, t in fields))
    assert [tuple(map(repr, r)) for r in again.collect()] == [tuple(map(repr, r)) for r in frame.collect()]
    first = texts.first()
    assert first is not None
    # The canonical spellings of model's table, not merely text that converts back.
    assert (first["l"], first["d"], first["bin"], first["day"], first["ts"], first["ntz"]) == (
        "-9223372036854775808",
        "-1234567890123456789012345678.0000000001",
        "AP8=",
        "0001-01-01",
        "-1",
        "2024-02-29 23:59:59.000001",
    )
    valid = texts.select(*(model.text_is_valid(F.col(n), F.lit(t)).alias(n) for n, t in fields))
    assert all(all(row) for row in valid.collect())
