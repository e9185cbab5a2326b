"""qlik-avro: data messages decoded with the dataSchema of their MD message, or with a configured override.

Also the writer of the MD golden inputs (``tests/cases/qlik-avro/metadata*.input.jsonl``, binary built with
fastavro): ``python -m tests.formats.test_qlik_avro``; then ``python -m tests.formats.regenerate_golden qlik-avro``
and review the expected files. The other qlik-avro inputs come from ``tests/formats/avro_cases.py``.
"""

from __future__ import annotations

import base64
import json
import sys
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import SparkSession

from cdclake.formats import get_format
from cdclake.formats.base import TableMetadata
from cdclake.workload.qlik import METADATA_SCHEMA, METADATA_SCHEMA_ID, METADATA_SCHEMA_TEXT, avro_bytes, encode_envelope
from tests.formats.avro_cases import (
    QLIK_DATA_SCHEMA,
    QLIK_DATA_SCHEMA_TEXT,
    QLIK_SCHEMA_ID,
    _raw,
    _render,
    qlik_replay,
)
from tests.formats.golden import CASES, canonical_rows, messages_frame, read_jsonl

TABLE = {"database": "SALES", "table": "T"}

# ---------------------------------------------------------------------------------------------------------------
# MD golden inputs


def _column(ordinal: int, kind: str, length: int = 0, precision: int = 0, scale: int = 0, key: int = 0) -> Any:
    return {
        "ordinal": ordinal,
        "type": kind,
        "length": length,
        "precision": precision,
        "scale": scale,
        "primaryKeyPosition": key,
        "nullable": key == 0,
    }


QLIK_COLUMNS = {
    "ID": _column(1, "INT8", key=1),
    "NAME": _column(2, "WSTRING", 50),
    "AMOUNT": _column(3, "NUMERIC", 0, 20, 4),
    "BIG": _column(4, "UINT8"),
    "HIRED": _column(5, "DATE"),
    "AT": _column(6, "DATETIME", 0, 0, 6),
    "T": _column(7, "TIME"),
    "R8": _column(8, "REAL8"),
    "PHOTO": _column(9, "BYTES", 100),
    "OK": _column(10, "BOOLEAN", 1),
}
"""The MD of the table whose data messages tests/formats/avro_cases.py writes (QLIK_DATA_SCHEMA, logical types)."""

TEXT_SCHEMA_ID = "5E0F0E9B7D2F4C86A3E1B0D9C8F7E600"
TEXT_DATA_SCHEMA = {
    **QLIK_DATA_SCHEMA,
    "fields": [
        {
            "name": "data",
            "type": {
                "type": "record",
                "name": "Data",
                "fields": [
                    {"name": "ID", "type": ["null", "long"]},
                    {"name": "AMOUNT", "type": ["null", "string"]},
                    {"name": "BIG", "type": ["null", "string"]},
                    {"name": "HIRED", "type": ["null", "string"]},
                    {"name": "AT", "type": ["null", "string"]},
                ],
            },
        },
        *QLIK_DATA_SCHEMA["fields"][1:],
    ],
}
"""A task without "use logical data types": NUMERIC, UINT8, DATE and DATETIME travel as strings (qlik.md 5)."""
TEXT_COLUMNS = {
    "ID": _column(1, "INT8", key=1),
    "AMOUNT": _column(2, "NUMERIC", 0, 10, 2),
    "BIG": _column(3, "UINT8"),
    "HIRED": _column(4, "DATE"),
    "AT": _column(5, "DATETIME", 0, 0, 6),
}


def _md_line(
    case: str,
    schema_id: str | None,
    table: str,
    columns: Any,
    data_schema: str,
    version: int = 1,
    message_schema: str = METADATA_SCHEMA_TEXT,
) -> dict[str, Any]:
    record = {
        "schemaId": schema_id,
        "lineage": {
            "server": "qrep-01",
            "task": "t1",
            "schema": "SALES",
            "table": table,
            "tableVersion": version,
            "timestamp": "2024-03-01T09:00:00.000",
        },
        "tableStructure": {"tableColumns": columns},
        "dataSchema": data_schema,
    }
    inner = avro_bytes(METADATA_SCHEMA, record) if schema_id is not None else b"\x02"
    value = encode_envelope("MD", METADATA_SCHEMA_ID, message_schema, inner)
    readable = {"magic": "atMSG", "type": "MD", "messageSchemaId": METADATA_SCHEMA_ID, "message": {"$avro": record}}
    return {"case": case, "key": f"SALES+{table}", "value": readable, "value_b64": base64.b64encode(value).decode()}


def _text_dt(case: str, schema_id: str | None, row: dict[str, Any], seq: int) -> dict[str, Any]:
    headers = {
        "operation": "INSERT",
        "changeSequence": f"2024030111000000000000000000000{seq:04d}",
        "timestamp": "2024-03-01T11:00:00.000",
        "streamPosition": "",
        "transactionId": "00000000000000000000000000000B02",
        "changeMask": b"\x1f",
        "columnMask": b"\x1f",
        "transactionEventCounter": 1,
        "transactionLastEvent": False,
    }
    record = {"data": row, "beforeData": None, "headers": headers}
    value = encode_envelope("DT", schema_id, None, avro_bytes(TEXT_DATA_SCHEMA, record))
    readable = {"magic": "atMSG", "type": "DT", "messageSchemaId": schema_id, "message": {"$avro": _render(record)}}
    return {"case": case, "key": None, "value": readable, "value_b64": base64.b64encode(value).decode()}


def metadata_cases() -> dict[str, list[dict[str, Any]]]:
    md = _md_line(
        "MD (metadata record in the envelope's messageSchema) of SALES.T: DDL event with Spark types and key ID",
        QLIK_SCHEMA_ID,
        "T",
        QLIK_COLUMNS,
        QLIK_DATA_SCHEMA_TEXT,
    )
    text_md = _md_line(
        "MD of SALES.PLAIN, a task without logical types: its dataSchema has strings for NUMERIC/UINT8/DATE/DATETIME",
        TEXT_SCHEMA_ID,
        "PLAIN",
        TEXT_COLUMNS,
        json.dumps(TEXT_DATA_SCHEMA),
    )
    row = {"ID": 1, "AMOUNT": "5200.50", "BIG": "18446744073709551615", "HIRED": "2019-04-01", "AT": None}
    good = [
        md,
        *(
            {**line, "case": f"{line['case']} (dataSchema of the MD above; table, types and key from the MD)"}
            for line in qlik_replay()
        ),
        text_md,
        _text_dt(
            "INSERT without logical types: NUMERIC(10,2), UINT8, DATE and DATETIME strings typed by the MD",
            TEXT_SCHEMA_ID.lower(),
            {**row, "AT": "2024-03-01 10:15:31.123456"},
            1,
        ),
        _text_dt(
            "DT with messageSchemaId null and no options naming its table: dead letter",
            None,
            row,
            2,
        ),
        _text_dt(
            "DT whose MD was never read: dead letter naming its messageSchemaId",
            "00000000000000000000000000000000",
            row,
            3,
        ),
    ]
    malformed = [
        text_md,
        _text_dt(
            "NUMERIC(10,2) string with 3 fraction digits (no logical types): would be rounded -> dead letter",
            TEXT_SCHEMA_ID,
            {**row, "AMOUNT": "1.005"},
            4,
        ),
        _text_dt("DATE string that is not a date -> dead letter", TEXT_SCHEMA_ID, {**row, "HIRED": "2019-02-30"}, 5),
        _md_line(
            "MD whose dataSchema is not a usable Avro schema: recorded as DDL; its data messages become dead letters",
            "BAD0000000000000000000000000000A",
            "BROKEN",
            {"ID": _column(1, "INT8", key=1)},
            '{"type": "record", "name": "DataRecord", "fields": [{"name": "data", "type": "nosuchtype"}]}',
        ),
        _text_dt("DT of the MD with an unusable dataSchema -> dead letter", "BAD0000000000000000000000000000A", row, 6),
        _md_line("MD whose metadata record does not match its messageSchema -> dead letter", None, "X", {}, "{}"),
        _md_line(
            "MD whose messageSchema is not an Avro schema -> dead letter",
            "C0FFEE00000000000000000000000000",
            "Y",
            {"ID": _column(1, "INT8")},
            "{}",
            message_schema='{"type": "nonsense"}',
        ),
        _raw("truncated MD envelope", base64.b64decode(md["value_b64"])[:40]),
    ]
    return {"metadata": good, "metadata_malformed": malformed}


def main() -> None:
    for scenario, lines in metadata_cases().items():
        path = CASES / "qlik-avro" / f"{scenario}.input.jsonl"
        path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
        print(f"wrote {path} ({len(lines)} messages)")


# ---------------------------------------------------------------------------------------------------------------
# Tests


def test_golden_inputs_are_what_this_module_writes() -> None:
    for scenario, lines in metadata_cases().items():
        assert read_jsonl(CASES / "qlik-avro" / f"{scenario}.input.jsonl") == json.loads(json.dumps(lines)), scenario


@pytest.mark.spark
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
    assert first["key_columns"] == []  # no MD: configure keys
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


@pytest.mark.spark
def test_known_md_gives_table_key_and_replicate_types(spark: SparkSession) -> None:
    definition = json.dumps(
        {
            "schemaId": QLIK_SCHEMA_ID,
            "lineage": {"schema": "HR", "table": "STAFF", "tableVersion": 4},
            "tableStructure": {"tableColumns": QLIK_COLUMNS},
            "dataSchema": QLIK_DATA_SCHEMA_TEXT,
        }
    )
    known = [TableMetadata("qlik-avro", QLIK_SCHEMA_ID, "HR", None, "STAFF", 4, definition)]
    fmt = get_format("qlik-avro")
    assert fmt.metadata is not None
    rows = canonical_rows(fmt.metadata.decode(messages_frame(spark, qlik_replay()), {}, known))
    assert [r["error"] for r in rows] == [None] * len(rows)
    first = rows[0]
    assert (first["database"], first["table"], first["key_columns"]) == ("HR", "STAFF", ["ID"])
    assert [c[1] for c in first["columns"]] == [
        "INT8", "WSTRING(50)", "NUMERIC(20,4)", "UINT8", "DATE", "DATETIME(6)", "TIME", "REAL8", "BYTES(100)",
        "BOOLEAN",
    ]  # fmt: skip
    assert first["after"]["AMOUNT"] == str(Decimal("1234567890123456.1234"))
    # An override option wins over the MD's dataSchema; the table and key still come from the MD.
    options = {"data_schema": QLIK_DATA_SCHEMA_TEXT}
    override = canonical_rows(fmt.metadata.decode(messages_frame(spark, qlik_replay()[:1]), options, known))
    assert (override[0]["error"], override[0]["table"], override[0]["key_columns"]) == (None, "STAFF", ["ID"])


@pytest.mark.spark
def test_an_md_whose_table_version_is_not_a_number_reads_as_version_0(spark: SparkSession) -> None:
    """An MD carries the schema of its own record (``messageSchema``), so ``tableVersion`` may come as text. Text that
    is not a number is version 0, as a missing one is; a cast failed the whole batch (ANSI mode)."""
    schema = json.loads(METADATA_SCHEMA_TEXT)
    lineage = next(f for f in schema["fields"] if f["name"] == "lineage")["type"]
    next(f for f in lineage["fields"] if f["name"] == "tableVersion")["type"] = "string"
    lines = []
    for version in ("seven", "7"):
        line = _md_line(f"MD version {version}", QLIK_SCHEMA_ID, "STAFF", QLIK_COLUMNS, QLIK_DATA_SCHEMA_TEXT)
        record = line["value"]["message"]["$avro"]
        record["lineage"]["tableVersion"] = version
        envelope = encode_envelope("MD", METADATA_SCHEMA_ID, json.dumps(schema), avro_bytes(schema, record))
        lines.append({**line, "value_b64": base64.b64encode(envelope).decode()})
    fmt = get_format("qlik-avro")
    assert fmt.metadata is not None
    rows = fmt.metadata.extract(messages_frame(spark, lines), {}).collect()
    assert sorted((r["table"], r["table_version"]) for r in rows) == [("STAFF", 0), ("STAFF", 7)]


@pytest.mark.spark
def test_unknown_schema_id_is_a_dead_letter(spark: SparkSession) -> None:
    options = {"data_schemas": json.dumps({"00000000000000000000000000000000": QLIK_DATA_SCHEMA_TEXT})}
    rows = canonical_rows(get_format("qlik-avro").decode(messages_frame(spark, qlik_replay()[:1]), options))
    assert rows[0]["op"] is None
    assert f"no MD message known for messageSchemaId '{QLIK_SCHEMA_ID}'" in rows[0]["error"]


@pytest.mark.spark
def test_schema_spark_cannot_read_makes_dead_letters_of_its_messages_only(spark: SparkSession) -> None:
    """All schema ids of a batch decode in one query; a dataSchema that passes the driver's field checks but that
    Spark rejects (unknown Avro type) is found and its messages alone become dead letters."""
    unreadable = json.loads(json.dumps(TEXT_DATA_SCHEMA))
    unreadable["fields"][0]["type"]["fields"][1]["type"] = ["null", "nosuchtype"]
    bad_id = "BAD0000000000000000000000000000B"

    def metadata(schema_id: str, table: str, data_schema: str) -> TableMetadata:
        definition = json.dumps(
            {
                "schemaId": schema_id,
                "lineage": {"schema": "SALES", "table": table, "tableVersion": 1},
                "tableStructure": {"tableColumns": TEXT_COLUMNS if table != "T" else QLIK_COLUMNS},
                "dataSchema": data_schema,
            }
        )
        return TableMetadata("qlik-avro", schema_id, "SALES", None, table, 1, definition)

    known = [
        metadata(QLIK_SCHEMA_ID, "T", QLIK_DATA_SCHEMA_TEXT),
        metadata(TEXT_SCHEMA_ID, "PLAIN", json.dumps(TEXT_DATA_SCHEMA)),
        metadata(bad_id, "BROKEN", json.dumps(unreadable)),
    ]
    row = {"ID": 7, "AMOUNT": "5200.50", "BIG": "1", "HIRED": "2019-04-01", "AT": None}
    lines = [
        qlik_replay()[2],
        _text_dt("DT of PLAIN", TEXT_SCHEMA_ID, row, 1),
        _text_dt("DT of BROKEN", bad_id, row, 2),
    ]
    fmt = get_format("qlik-avro")
    assert fmt.metadata is not None
    rows = canonical_rows(fmt.metadata.decode(messages_frame(spark, lines), {}, known))
    by_table = {(r["table"], r["op"]): r for r in rows if r["table"] is not None}
    assert by_table[("T", "INSERT")]["error"] is None
    assert by_table[("T", "INSERT")]["after"]["ID"] == "3"
    assert by_table[("PLAIN", "INSERT")]["error"] is None
    assert by_table[("PLAIN", "INSERT")]["after"] == {
        "ID": "7", "AMOUNT": "5200.50", "BIG": "1", "HIRED": "2019-04-01", "AT": None,
    }  # fmt: skip
    broken = [r for r in rows if r["table"] is None]
    assert len(broken) == 1
    assert broken[0]["error"].startswith(f"the dataSchema of MD {bad_id} is not usable: ")


if __name__ == "__main__":
    main() if sys.argv[1:] == [] else sys.exit("usage: python -m tests.formats.test_qlik_avro")
