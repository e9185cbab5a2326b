"""cdclake.spark.local_frame builds the same rows as ``spark.createDataFrame``, without a Python worker."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdclake.spark import local_frame

pytestmark = pytest.mark.spark

SCHEMA = (
    "name string, small int, big bigint, ratio double, flag boolean, amount decimal(12,3), at timestamp, "
    "local_at timestamp_ntz, day date, raw binary, counts map<string,bigint>, tags array<string>, "
    "columns array<struct<name:string, ordinal:int, at:timestamp>>"
)

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_moment = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1))
_row = st.tuples(
    st.none() | _text,
    st.none() | st.integers(-(2**31), 2**31 - 1),
    st.none() | st.integers(-(2**63), 2**63 - 1),
    st.none() | st.floats(allow_nan=False, allow_infinity=False),
    st.none() | st.booleans(),
    st.none() | st.decimals(min_value=-(10**8), max_value=10**8, places=3),
    st.none() | _moment | _moment.map(lambda moment: moment.replace(tzinfo=timezone(timedelta(hours=5, minutes=30)))),
    st.none() | _moment,
    st.none() | st.dates(min_value=date(1, 1, 1)),
    st.none() | st.binary(max_size=8),
    st.none() | st.dictionaries(_text, st.none() | st.integers(-(2**63), 2**63 - 1), max_size=3),
    st.none() | st.lists(st.none() | _text, max_size=3),
    st.none() | st.lists(st.tuples(_text, st.none() | st.integers(0, 99), st.none() | _moment), max_size=2),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_row, max_size=4))
def test_rows_equal_create_data_frame(spark, rows: list[tuple]) -> None:
    built = local_frame(spark, rows, SCHEMA)
    reference = spark.createDataFrame(rows, SCHEMA)
    assert built.schema == reference.schema
    assert built.collect() == reference.collect()


def test_structs_from_dicts_and_the_empty_frame(spark) -> None:
    rows = [{"name": "a", "at": datetime(2024, 3, 1, 10, 15, 31, 250000, tzinfo=UTC)}, {"name": "b"}]
    frame = local_frame(spark, rows, "name string, at timestamp, n int")
    assert [tuple(r) for r in frame.collect()] == [
        ("a", datetime(2024, 3, 1, 10, 15, 31, 250000), None),
        ("b", None, None),
    ]
    empty = local_frame(spark, [], "topic string, partition int")
    assert empty.columns == ["topic", "partition"]
    assert empty.count() == 0


@pytest.mark.parametrize(
    "row",
    [("not a number",), (2**31,), (1.5,)],
    ids=["text", "too-large", "fraction"],
)
def test_a_value_that_does_not_fit_is_an_error_not_null(spark, row: tuple) -> None:
    with pytest.raises(Exception, match="MALFORMED_RECORD_IN_PARSING"):
        local_frame(spark, [row], "n int").collect()


def test_bad_shapes_are_refused_on_the_driver(spark) -> None:
    with pytest.raises(ValueError, match="2 values for the 1 fields"):
        local_frame(spark, [("a", "b")], "name string")
    with pytest.raises(TypeError, match="string keys only"):
        local_frame(spark, [({1: "x"},)], "m map<int,string>")
