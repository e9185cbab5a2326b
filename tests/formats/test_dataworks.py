"""DataWorks JSON decoding beyond the golden cases."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import functions as F

from cdclake.formats import get_format
from tests.formats.golden import messages_frame


def _insert(after: dict[str, Any]) -> dict[str, Any]:
    columns = [("id", "LONG"), ("name", "STRING"), ("updated_at", "DATE"), ("score", "DOUBLE")]
    return {
        "schema": {
            "dataColumn": [{"name": n, "type": t} for n, t in columns],
            "primaryKey": ["id"],
            "source": {"dbType": "MySQL", "dbName": "crm", "schemaName": None, "tableName": "customer"},
        },
        "payload": {
            "before": None,
            "after": {"dataColumn": after},
            "sequenceId": "1",
            "timestamp": {"eventTime": 1709288131000},
            "op": "INSERT",
            "ddl": None,
        },
    }


@pytest.mark.spark
def test_date_values_are_re_encoded_whether_the_image_lists_its_columns_in_schema_order_or_not(spark) -> None:
    """An image in the order of ``schema.dataColumn`` pairs its values with the declared types by position (a lookup
    per value costs the square of the table's width); one in another order looks each type up by name. Both give
    the same canonical image: DATE epoch milliseconds as microseconds (dataworks.md), the rest unchanged."""
    in_order = {"id": 1, "name": "a", "updated_at": 1709288131000, "score": 87.5}
    reordered = {"score": 87.5, "updated_at": 1709288131000, "name": "a", "id": 1}
    assert list(in_order) != list(reordered)
    lines = [{"case": str(i), "key": None, "value": _insert(after)} for i, after in enumerate((in_order, reordered))]
    decoded = get_format("dataworks-json").decode(messages_frame(spark, lines), {}).orderBy("offset")
    # The keys as an array: a map collected into Python comes through a hash map, without its order.
    rows = decoded.select("error", "after", F.map_keys("after").alias("names")).collect()

    expected = {"id": "1", "name": "a", "updated_at": "1709288131000000", "score": "87.5"}
    assert [row["error"] for row in rows] == [None, None]
    assert [row["after"] for row in rows] == [expected, expected]
    assert [row["names"] for row in rows] == [list(in_order), list(reordered)]  # each image keeps its own order
