"""qlik-avro data messages decoded with a configured data schema (golden cases run without options)."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import SparkSession

from cdclake.formats import get_format
from tests.formats.avro_cases import QLIK_DATA_SCHEMA_TEXT, QLIK_SCHEMA_ID, qlik_replay
from tests.formats.golden import canonical_rows, messages_frame

pytestmark = pytest.mark.spark

TABLE = {"database": "SALES", "table": "T"}


@pytest.mark.parametrize(
    "options",
    [
        {"data_schema": QLIK_DATA_SCHEMA_TEXT, **TABLE},
        {"data_schemas": json.dumps({QLIK_SCHEMA_ID.lower(): QLIK_DATA_SCHEMA_TEXT}), **TABLE},
    ],
    ids=["data_schema", "data_schemas"],
)
def test_data_messages_decode_with_a_configured_schema(spark: SparkSession, options: dict[str, str]) -> None:
    rows = canonical_rows(get_format("qlik-avro").decode(messages_frame(spark, qlik_replay()), options))
    assert [r["error"] for r in rows] == [None] * len(rows)
    assert [(r["op"], r["sub_index"]) for r in rows] == [
        ("UPSERT", 0), ("UPSERT", 0), ("INSERT", 0), ("UPDATE", 0), ("TXN_END", 1), ("UPDATE", 0), ("TXN_END", 1),
        ("DELETE", 0), ("TXN_END", 1),
    ]  # fmt: skip
    first = rows[0]
    assert first["after"] == {
        "ID": "1",
        "NAME": "Zoë 🚀",
        "AMOUNT": "1234567890123456.1234",
        "BIG": "18446744073709551615",
        "HIRED": "2019-04-01",
        "AT": "1709288131123456",
        "T": "10:15:31.500",
        "R8": "1.5E-7",
        "PHOTO": "iVBORw==",
        "OK": "true",
    }
    assert first["database"] == "SALES"
    assert first["table"] == "T"
    assert first["position"] < rows[2]["position"]  # REFRESH sorts before every change sequence
    assert {c[0]: c[2] for c in first["columns"]} == {
        "ID": "bigint", "NAME": "string", "AMOUNT": "decimal(20,4)", "BIG": "decimal(20,0)", "HIRED": "date",
        "AT": "timestamp", "T": "string", "R8": "double", "PHOTO": "binary", "OK": "boolean",
    }  # fmt: skip
    masked = rows[5]  # columnMask 05 00: only ID (ordinal 1) and AMOUNT (ordinal 3) were captured
    assert masked["after"] == {"ID": "2", "AMOUNT": "9.9900"}
    assert masked["after_is_partial"] is True
    assert rows[7]["before"]["ID"] == "3"
    assert rows[7]["after"] is None


def test_unknown_schema_id_is_a_dead_letter(spark: SparkSession) -> None:
    options = {"data_schemas": json.dumps({"00000000000000000000000000000000": QLIK_DATA_SCHEMA_TEXT})}
    rows = canonical_rows(get_format("qlik-avro").decode(messages_frame(spark, qlik_replay()[:1]), options))
    assert "no data schema configured for messageSchemaId" in rows[0]["error"]
