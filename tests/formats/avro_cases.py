"""Writes the golden *inputs* of the Avro formats (binary built with fastavro): ``python -m tests.formats.avro_cases``.

Each input line is ``{"case", "key", "value": <readable rendering>, "value_b64": <the exact binary>}`` (the binary
wins, see tests/formats/golden.py). Shared examples (``shared/formats/examples``) are copied in as they are.
Regenerate the expected files afterwards with ``python -m tests.formats.regenerate_golden <name>`` and review them.
"""

from __future__ import annotations

import base64
import io
import json
import sys
from collections.abc import Callable
from datetime import date, time
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro

from tests.conftest import SHARED
from tests.formats.golden import CASES

EXAMPLES = SHARED / "formats" / "examples"
DTS = "com.alibaba.dts.formats.avro."
DRS = "com.huawei.hwclouds.drs.avro."


def _schema(name: str) -> Any:
    return fastavro.parse_schema(json.loads((SHARED / "formats" / name).read_text()))


def _avro(schema: Any, record: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, schema, record)
    return buffer.getvalue()


def _render(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$b64": base64.b64encode(value).decode()}
    if isinstance(value, tuple):  # (branch name, record) -> {"name": record}
        return {value[0]: _render(value[1])}
    if isinstance(value, dict):
        return {k: _render(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v) for v in value]
    if isinstance(value, (Decimal, date, time)):  # datetime is a date
        return value.isoformat() if not isinstance(value, Decimal) else str(value)
    return value


def _line(case: str, schema: Any, record: dict[str, Any], key: Any = None) -> dict[str, Any]:
    return {
        "case": case,
        "key": key,
        "value": _render(record),
        "value_b64": base64.b64encode(_avro(schema, record)).decode(),
    }


def _raw(case: str, data: bytes | None) -> dict[str, Any]:
    if data is None:
        return {"case": case, "key": None, "value": None}
    return {"case": case, "key": None, "value": None, "value_b64": base64.b64encode(data).decode()}


def _shared(file_name: str, operation: str | None = None, index: int | None = None) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in (EXAMPLES / file_name).read_text().splitlines() if x.strip()]
    picked = [
        line
        for i, line in enumerate(lines)
        if (operation is None or line["value"]["operation"] == operation) and (index is None or i == index)
    ]
    for line in picked:
        line["case"] = "shared example: " + line["case"]
    return picked


# ---------------------------------------------------------------------------------------------------------------
# DTS Avro (shared/formats/dts.md section 1)


def _dts_value(kind: str, **fields: Any) -> tuple[str, Any]:
    if kind == "EmptyObject":
        return (DTS + kind, fields["symbol"])
    return (DTS + kind, fields)


def _i(text: str, precision: int = 8) -> tuple[str, Any]:
    return _dts_value("Integer", precision=precision, value=text)


def _c(text: str, charset: str = "utf8mb4") -> tuple[str, Any]:
    return _dts_value("Character", charset=charset, value=text.encode("utf-8" if "utf8" in charset else charset))


def _dts(operation: str, record_id: int, **extra: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "version": 0,
        "id": record_id,
        "sourceTimestamp": 1709288131,
        "sourcePosition": f"{90000 + record_id % 10000}@12",
        "safeSourcePosition": "90000@12",
        "sourceTxid": "0",
        "source": {"sourceType": "MySQL", "version": "8.0.34"},
        "operation": operation,
        "objectName": None,
        "processTimestamps": None,
        "tags": {},
        "fields": None,
        "beforeImages": None,
        "afterImages": None,
        "bornTimestamp": 1709288131,
    }
    record.update(extra)
    return record


ACCOUNT_FIELDS = [
    {"name": "id", "dataTypeNumber": 8},
    {"name": "name", "dataTypeNumber": 253},
    {"name": "balance", "dataTypeNumber": 246},
    {"name": "born", "dataTypeNumber": 10},
    {"name": "seen_at", "dataTypeNumber": 7},
    {"name": "avatar", "dataTypeNumber": 252},
]
PK_ID = {"pk_uk_info": '{"PRIMARY":["id"]}'}


def _account(
    account_id: str,
    name: str | None,
    balance: str | None,
    born: tuple[int, int, int] | None = (1990, 5, 17),
    seen: tuple[int, int] | None = (1709288100, 5),
    avatar: bytes | None = b"\x00\xff",
) -> list[Any]:
    return [
        _i(account_id),
        None if name is None else _c(name),
        None if balance is None else _dts_value("Decimal", value=balance, precision=30, scale=9),
        None if born is None else _dts_value("DateTime", year=born[0], month=born[1], day=born[2]),
        None if seen is None else _dts_value("Timestamp", timestamp=seen[0], millis=seen[1]),
        None if avatar is None else _dts_value("BinaryObject", type="BLOB", value=avatar),
    ]


# (column, MySQL charset, text) of the charsets golden case: each text encoded with the charset's Python codec.
CHARSET_TEXTS = [
    ("gbk", "gbk", "张三的账户"),
    ("gb18030", "gb18030", "丁\ufffd𠀀"),  # GB18030 holds U+FFFD and every Unicode character
    ("big5", "big5", "臺灣銀行"),
    ("sjis", "sjis", "東京タワー"),
    ("euckr", "euckr", "서울"),
    ("latin2", "latin2", "Łódź"),
    ("cp1251", "cp1251", "Москва"),
    ("utf16", "utf16", "Zoë 🚀"),
    ("upper_case", "GBK", "上海"),
]
CHARSET_CODECS = {"utf16": "utf-16-be"}


def _encoded(charset: str, text: str) -> bytes:
    return text.encode(CHARSET_CODECS.get(charset, charset))


def _bogus_operation_schema() -> Any:
    raw = json.loads((SHARED / "formats" / "dts-record.avsc").read_text())
    for field in raw["fields"]:
        if field["name"] == "operation":
            field["type"]["symbols"].append("BOGUS")
    return fastavro.parse_schema(raw)


def dts_cases() -> dict[str, list[dict[str, Any]]]:
    s = _schema("dts-record.avsc")
    kinds_fields = [
        {"name": "id", "dataTypeNumber": 3},
        {"name": "u64", "dataTypeNumber": 8},
        {"name": "ratio", "dataTypeNumber": 5},
        {"name": "t", "dataTypeNumber": 11},
        {"name": "y", "dataTypeNumber": 13},
        {"name": "dt", "dataTypeNumber": 12},
        {"name": "latin", "dataTypeNumber": 254},
        {"name": "bin", "dataTypeNumber": 254},
        {"name": "tags", "dataTypeNumber": 248},
        {"name": "geo", "dataTypeNumber": 255},
        {"name": "wkt", "dataTypeNumber": 255},
        {"name": "gone", "dataTypeNumber": 253},
    ]
    kinds_after = [
        _i("7", 4),
        _i("18446744073709551615"),
        _dts_value("Float", value=float("nan"), precision=0, scale=0),
        _dts_value("DateTime", hour=838, minute=59, second=59, millis=0),
        _dts_value("DateTime", year=2024),
        _dts_value("DateTime", year=2024, month=2, day=29, hour=23, minute=59, second=59, millis=999999),
        # MySQL's latin1 is cp1252 (dts.md 1.6): 0x80-0x9F are letters and signs, but the five bytes cp1252 leaves
        # undefined stay C1 controls (0x81 here).
        _dts_value("Character", charset="latin1", value="café €“x”’–".encode("cp1252") + b"\x81"),
        _dts_value("Character", charset="binary", value=b"\x01\x02"),
        _dts_value("TextObject", type="SET", value="a,b"),
        _dts_value("BinaryGeometry", type="POINT", value=b"\x01\x01\x00\x00\x00"),
        _dts_value("TextGeometry", type="POINT", value="POINT(1 2)"),
        _dts_value("EmptyObject", symbol="NULL"),
    ]
    insert = [
        *_shared("dts-avro.jsonl", "INSERT"),
        _line(
            "INSERT: DECIMAL(30,9) beyond 2^53 exact, DATE (type 10), TIMESTAMP seconds + micros, BLOB, emoji",
            s,
            _dts(
                "INSERT",
                7800001,
                objectName="bank.accounts",
                tags=PK_ID,
                fields=ACCOUNT_FIELDS,
                afterImages=_account("9007199254740993", "Zoë 🚀 张三", "12345678901234567890.123456789"),
            ),
        ),
        _line(
            "INSERT: every other branch: BIGINT UNSIGNED max, double NaN, TIME 838h, YEAR, DATETIME(6), latin1, "
            "binary charset, SET TextObject, geometry WKB/WKT, EmptyObject NULL",
            s,
            _dts(
                "INSERT",
                7800002,
                objectName="bank.kinds",
                tags={"pk_uk_info": '{"PRIMARY":["id"],"uk_u64":["u64"]}'},
                fields=kinds_fields,
                afterImages=kinds_after,
            ),
        ),
        _line(
            "INSERT: MySQL charsets beyond UTF-8 (dts.md 1.6 gbk, gb18030, big5; also sjis, euckr, latin2, cp1251, "
            "MySQL's big-endian utf16), a real U+FFFD in gb18030, upper-case charset names",
            s,
            _dts(
                "INSERT",
                7800005,
                objectName="bank.charsets",
                tags=PK_ID,
                fields=[
                    {"name": "id", "dataTypeNumber": 8},
                    *({"name": column, "dataTypeNumber": 253} for column, _, _ in CHARSET_TEXTS),
                ],
                afterImages=[
                    _i("1"),
                    *(
                        _dts_value("Character", charset=charset, value=_encoded(charset, text))
                        for _, charset, text in CHARSET_TEXTS
                    ),
                ],
            ),
        ),
        _line(
            "INSERT from Oracle: 3-part objectName with an escaped dot, DateTime fraction in NANOseconds, "
            "TimestampWithTimeZone, no pk_uk_info but a unique index",
            s,
            _dts(
                "INSERT",
                7800003,
                source={"sourceType": "Oracle", "version": "19c"},
                sourcePosition="1234567",
                sourceTxid="7.12.3344",
                objectName="ORCL.HR.EMP\\u002ELOG",
                tags={"pk_uk_info": '{"UK_EMP":["EMP_NO"]}'},
                fields=[
                    {"name": "EMP_NO", "dataTypeNumber": 2},
                    {"name": "AT", "dataTypeNumber": 12},
                    {"name": "AT_TZ", "dataTypeNumber": 13},
                ],
                afterImages=[
                    _dts_value("Decimal", value="42", precision=0, scale=0),
                    _dts_value("DateTime", year=2024, month=3, day=1, hour=10, minute=0, second=0, millis=123456789),
                    _dts_value(
                        "TimestampWithTimeZone",
                        value={
                            "year": 2024,
                            "month": 3,
                            "day": 1,
                            "hour": 18,
                            "minute": 0,
                            "second": 0,
                            "millis": 500000000,
                        },
                        timezone="+08:00",
                    ),
                ],
            ),
        ),
        _line(
            "INSERT from a PolarDB-X shard: logical names in tags l_db_name / l_tb_name win over objectName",
            s,
            _dts(
                "INSERT",
                7800004,
                objectName="bank_0005.accounts_11",
                tags={**PK_ID, "l_db_name": "bank", "l_tb_name": "accounts"},
                fields=ACCOUNT_FIELDS,
                afterImages=_account("5", None, None, None, None, None),
            ),
        ),
    ]
    before = _account("9007199254740993", "Zoë 🚀 张三", "12345678901234567890.123456789")
    update = [
        *_shared("dts-avro.jsonl", "UPDATE"),
        _line(
            "UPDATE: full before and after; NULLs in the after image",
            s,
            _dts(
                "UPDATE",
                7800010,
                objectName="bank.accounts",
                tags=PK_ID,
                fields=ACCOUNT_FIELDS,
                beforeImages=before,
                afterImages=_account("9007199254740993", "Zoë", "-0.000000001", None, None, b""),
            ),
        ),
        _line(
            "UPDATE with EmptyObject NONE (value not logged): column left out of after, after_is_partial",
            s,
            _dts(
                "UPDATE",
                7800011,
                objectName="bank.accounts",
                tags=PK_ID,
                fields=ACCOUNT_FIELDS,
                beforeImages=before,
                afterImages=[*before[:5], _dts_value("EmptyObject", symbol="NONE")],
            ),
        ),
    ]
    delete = [
        *_shared("dts-avro.jsonl", "DELETE"),
        _line(
            "DELETE with PK: before image only",
            s,
            _dts("DELETE", 7800020, objectName="bank.accounts", tags=PK_ID, fields=ACCOUNT_FIELDS, beforeImages=before),
        ),
    ]
    ddl = [
        *_shared("dts-avro.jsonl", "DDL"),
        _line(
            "COMMAND (MongoDB) -> DDL; objectName db only",
            s,
            _dts(
                "COMMAND",
                7800030,
                source={"sourceType": "MongoDB", "version": "6.0"},
                sourcePosition="1709288131:1",
                objectName="app",
                afterImages='{"create": "profiles"}',
            ),
        ),
        _line(
            "DDL with an escaped dot in the database name",
            s,
            _dts("DDL", 7800031, objectName="my\\u002Edb", afterImages="CREATE TABLE t (id int primary key)"),
        ),
    ]
    heartbeat = [
        *_shared("dts-avro.jsonl", "BEGIN"),
        *_shared("dts-avro.jsonl", "COMMIT"),
        *_shared("dts-avro.jsonl", "HEARTBEAT"),
        *[
            _line(f"{op} -> OTHER", s, _dts(op, 7800040 + i, tags={"padding": "x" * 40}))
            for i, op in enumerate(["ROLLBACK", "ABORT", "CHECKPOINT", "FILL", "FINISH", "CONTROL", "RDB", "NOOP"])
        ],
        _raw("NOOP placeholder of 20 bytes (<= 48): skipped as OTHER, not an error", bytes(range(20))),
        _line("a record of <= 48 bytes is a placeholder too: skipped", s, _dts("HEARTBEAT", 1)),
    ]
    snapshot = [
        _line(
            "INIT (full-load row) -> UPSERT",
            s,
            _dts(
                "INIT",
                7800050,
                objectName="bank.accounts",
                tags=PK_ID,
                fields=ACCOUNT_FIELDS,
                afterImages=_account("1", "Ann", "10.500000000"),
            ),
        ),
    ]
    good = _avro(
        s,
        _dts("INSERT", 7800060, objectName="bank.accounts", tags=PK_ID, fields=ACCOUNT_FIELDS, afterImages=before),
    )
    malformed = [
        _raw("null Kafka value", None),
        _raw("corrupt binary (> 48 bytes of garbage)", b"\xff" * 64),
        _raw("truncated record", good[: len(good) // 2]),
        _raw("operation enum index out of range (17)", _avro(_bogus_operation_schema(), _dts("BOGUS", 7800070))),
        _line(
            "afterImages shorter than fields",
            s,
            _dts(
                "INSERT", 7800061, objectName="bank.accounts", tags=PK_ID, fields=ACCOUNT_FIELDS, afterImages=before[:3]
            ),
        ),
        _line(
            "unsupported charset armscii8 (no Java charset)",
            s,
            _dts(
                "INSERT",
                7800062,
                objectName="bank.accounts",
                tags=PK_ID,
                fields=ACCOUNT_FIELDS,
                afterImages=[before[0], _dts_value("Character", charset="armscii8", value=b"\xb1"), *before[2:]],
            ),
        ),
        _line(
            "Character gbk bytes that are not GBK (a lead byte without its trail byte)",
            s,
            _dts(
                "INSERT",
                7800073,
                objectName="bank.accounts",
                tags=PK_ID,
                fields=ACCOUNT_FIELDS,
                afterImages=[before[0], _dts_value("Character", charset="gbk", value=b"\xd5\xc5\x81 "), *before[2:]],
            ),
        ),
        _line(
            "Character utf8mb4 bytes that are not UTF-8",
            s,
            _dts(
                "INSERT",
                7800063,
                objectName="bank.accounts",
                tags=PK_ID,
                fields=ACCOUNT_FIELDS,
                afterImages=[before[0], _dts_value("Character", charset="utf8mb4", value=b"\xc3\x28"), *before[2:]],
            ),
        ),
        _line(
            "Integer text that is not a number",
            s,
            _dts(
                "INSERT",
                7800064,
                objectName="bank.accounts",
                tags=PK_ID,
                fields=ACCOUNT_FIELDS,
                afterImages=[_i("12abc"), *before[1:]],
            ),
        ),
        _line(
            "objectName with 4 parts",
            s,
            _dts("INSERT", 7800065, objectName="a.b.c.d", tags=PK_ID, fields=ACCOUNT_FIELDS, afterImages=before),
        ),
        _line(
            "INSERT without afterImages",
            s,
            _dts("INSERT", 7800066, objectName="bank.accounts", tags=PK_ID, fields=ACCOUNT_FIELDS),
        ),
        _line(
            "row event with database-only objectName",
            s,
            _dts("DELETE", 7800067, objectName="bank", tags=PK_ID, fields=ACCOUNT_FIELDS, beforeImages=before),
        ),
        _line(
            "pk_uk_info that is not JSON",
            s,
            _dts(
                "INSERT",
                7800068,
                objectName="bank.accounts",
                tags={"pk_uk_info": "PRIMARY=id"},
                fields=ACCOUNT_FIELDS,
                afterImages=before,
            ),
        ),
        _line(
            "Decimal with more integer digits than DECIMAL(5,2) holds (a cast would make it NULL)",
            s,
            _dts(
                "INSERT",
                7800071,
                objectName="bank.accounts",
                tags=PK_ID,
                fields=ACCOUNT_FIELDS,
                afterImages=[*before[:2], _dts_value("Decimal", value="1234.5", precision=5, scale=2), *before[3:]],
            ),
        ),
        _line(
            "Decimal with more fraction digits than DECIMAL(10,2) holds (a cast would round it to 1.01)",
            s,
            _dts(
                "INSERT",
                7800072,
                objectName="bank.accounts",
                tags=PK_ID,
                fields=ACCOUNT_FIELDS,
                afterImages=[*before[:2], _dts_value("Decimal", value="1.005", precision=10, scale=2), *before[3:]],
            ),
        ),
        _line(
            "DATE with a MySQL zero date (not a valid date)",
            s,
            _dts(
                "INSERT",
                7800069,
                objectName="bank.accounts",
                tags=PK_ID,
                fields=ACCOUNT_FIELDS,
                afterImages=[*before[:3], _dts_value("DateTime", year=0, month=0, day=0), *before[4:]],
            ),
        ),
    ]
    return {
        "insert": insert,
        "update": update,
        "delete": delete,
        "ddl": ddl,
        "heartbeat": heartbeat,
        "snapshot": snapshot,
        "malformed": malformed,
    }


def dts_replay() -> list[dict[str, Any]]:
    """Replay scenario of dts-avro: insert, update, NONE-partial update, NOOP placeholder, delete, upsert."""
    s = _schema("dts-record.avsc")
    fields = [
        {"name": "id", "dataTypeNumber": 3},
        {"name": "name", "dataTypeNumber": 253},
        {"name": "amount", "dataTypeNumber": 246},
        {"name": "photo", "dataTypeNumber": 252},
    ]

    def row(i: str, name: str | None, amount: str, photo: Any) -> list[Any]:
        return [
            _i(i, 4),
            None if name is None else _c(name),
            _dts_value("Decimal", value=amount, precision=12, scale=2),
            photo,
        ]

    def blob(data: bytes) -> Any:
        return _dts_value("BinaryObject", type="BLOB", value=data)

    none = _dts_value("EmptyObject", symbol="NONE")

    def msg(op: str, rid: int, pos: int, before: Any = None, after: Any = None) -> dict[str, Any]:
        return _dts(
            op,
            rid,
            sourcePosition=f"{pos}@7",
            objectName="shop.orders",
            tags=PK_ID,
            fields=fields,
            beforeImages=before,
            afterImages=after,
        )

    r1 = row("1", "Zoë", "10.00", blob(b"\x01"))
    r2 = row("2", "Bob", "20.00", blob(b"\x02"))
    r1b = row("1", "Zoë 张", "11.50", blob(b"\x01"))
    r2b = row("2", "Bob", "25.00", none)
    return [
        _line("begin", s, _dts("BEGIN", 1, sourcePosition="100@7", tags={"thread_id": "1" * 30})),
        _line("insert 1", s, msg("INSERT", 2, 110, after=r1)),
        _line("insert 2", s, msg("INSERT", 3, 120, after=r2)),
        _line("commit", s, _dts("COMMIT", 4, sourcePosition="130@7", tags={"thread_id": "1" * 30})),
        _raw("NOOP placeholder: skipped", b"\x00" * 30),
        _line("update 1: name and amount", s, msg("UPDATE", 5, 140, before=r1, after=r1b)),
        _line("update 2: photo not logged (NONE) keeps its value", s, msg("UPDATE", 6, 150, before=r2, after=r2b)),
        _line("INIT upsert of 3", s, msg("INIT", 7, 160, after=row("3", None, "0.01", None))),
        _line("delete 1", s, msg("DELETE", 8, 170, before=r1b)),
    ]


# ---------------------------------------------------------------------------------------------------------------
# DRS Avro (shared/formats/drs.md section 1)

SINGLE_OBJECT_HEADER = bytes.fromhex("C3014E9EA30940AC78CC")


def _drs_value(kind: str, **fields: Any) -> tuple[str, Any]:
    return (DRS + kind, fields)


def _drs(operation: str, seqno: int, **extra: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "version": "1.0",
        "seqno": seqno,
        "shardId": 0,
        "eventid": f"evt-{seqno}",
        "updateTimestamp": 1714979289000 + seqno,
        "tableName": '"shop"."things"',
        "operation": operation,
        "columnCount": 0,
        "fields": None,
        "beforeImages": None,
        "afterImages": None,
    }
    record.update(extra)
    if record["fields"] is not None:
        record["columnCount"] = len(record["fields"])
    return record


def _single_object(line: dict[str, Any]) -> dict[str, Any]:
    copy = dict(line)
    copy["case"] = line["case"] + " [single-object encoding: C3 01 + fingerprint + body]"
    body = base64.b64decode(line.get("value_b64") or line["value_avro_b64"])
    copy.pop("value_avro_b64", None)
    copy.pop("value_avro_single_object_b64", None)
    copy["value_b64"] = base64.b64encode(SINGLE_OBJECT_HEADER + body).decode()
    return copy


THING_FIELDS = [
    {"name": "id", "dataTypeNumber": -5},
    {"name": "label", "dataTypeNumber": 12},
    {"name": "qty", "dataTypeNumber": 4},
    {"name": "price", "dataTypeNumber": 3},
    {"name": "ratio", "dataTypeNumber": 8},
    {"name": "seen", "dataTypeNumber": 93},
    {"name": "day", "dataTypeNumber": 91},
    {"name": "at", "dataTypeNumber": 94},
    {"name": "mask", "dataTypeNumber": -7},
    {"name": "blob", "dataTypeNumber": 2004},
]


def _thing(thing_id: str, label: str | None, price: str | None, nulls: bool = False) -> list[Any]:
    if nulls:
        return [_drs_value("Integer", precision=8, value=thing_id), *([None] * 9)]
    return [
        _drs_value("Integer", precision=8, value=thing_id),
        None if label is None else _drs_value("Character", charset="utf8mb4", value=label.encode()),
        _drs_value("Integer", precision=4, value="-2147483648"),
        None if price is None else _drs_value("Decimal", value=price, precision=38, scale=10),
        _drs_value("Float", value=1.25e-4, precision=0, scale=0),
        _drs_value("Timestamp", timestamp=1714979289, millis=123456),
        _drs_value("Date", value="2024-05-06"),
        _drs_value("Date", value="2024-05-06 07:08:09"),
        _drs_value("Bit", precision=8, value="10100101"),
        _drs_value("BinaryObject", type="BLOB", value=b"\x00\xff\x80"),
    ]


def drs_cases() -> dict[str, list[dict[str, Any]]]:
    s = _schema("drs-record.avsc")
    shared = {line["value"]["operation"]: line for line in _shared("drs-avro.jsonl")}
    big = "1234567890123456789012345678.1234567890"
    insert = [
        shared["INSERT"],
        _single_object(shared["INSERT"]),
        _line(
            "INSERT: BIGINT (-5) beyond int64, DECIMAL(38,10) exact, INT min, double, Timestamp, DATE (91), "
            "DATETIME (94), BIT(8), BLOB, unicode",
            s,
            _drs("INSERT", 601, fields=THING_FIELDS, afterImages=_thing("18446744073709551615", "Zoë 🚀 张三", big)),
        ),
        _line(
            "INSERT: SQL NULLs everywhere but the key; 3-part quoted tableName",
            s,
            _drs(
                "INSERT",
                602,
                tableName='"db"."sch"."things"',
                fields=THING_FIELDS,
                afterImages=_thing("2", None, None, nulls=True),
            ),
        ),
        _line(
            "INSERT: unquoted one-part tableName (no database unless the database option gives one); "
            "Timestamp in milliseconds (>= 1e11)",
            s,
            _drs(
                "INSERT",
                603,
                tableName="things",
                fields=[*THING_FIELDS[:1], {"name": "seen", "dataTypeNumber": 93}],
                afterImages=[
                    _drs_value("Integer", precision=8, value="3"),
                    _drs_value("Timestamp", timestamp=1714979289123, millis=0),
                ],
            ),
        ),
        _line(
            "INSERT: Timestamps in milliseconds near the ends of the timestamp range (+-9,100,000,000,000,999 ms, past "
            "what a double holds exactly: the seconds are an exact floor division, not a rounded one)",
            s,
            _drs(
                "INSERT",
                607,
                tableName="things",
                fields=[
                    *THING_FIELDS[:1],
                    {"name": "seen", "dataTypeNumber": 93},
                    {"name": "seen_first", "dataTypeNumber": 93},
                ],
                afterImages=[
                    _drs_value("Integer", precision=8, value="7"),
                    _drs_value("Timestamp", timestamp=9_100_000_000_000_999, millis=0),
                    _drs_value("Timestamp", timestamp=-9_100_000_000_000_999, millis=0),
                ],
            ),
        ),
        _line(
            "INSERT: a label in GBK and one in Big5 (Character charsets beyond UTF-8, decoded as DTS's are)",
            s,
            _drs(
                "INSERT",
                604,
                tableName="things",
                fields=[*THING_FIELDS[:2], {"name": "label_tw", "dataTypeNumber": 12}],
                afterImages=[
                    _drs_value("Integer", precision=8, value="4"),
                    _drs_value("Character", charset="gbk", value="华为云".encode("gbk")),
                    _drs_value("Character", charset="big5", value="華為雲".encode("big5")),
                ],
            ),
        ),
    ]
    update = [
        shared["UPDATE"],
        _single_object(shared["UPDATE"]),
        _line(
            "UPDATE: before and after; label set to NULL",
            s,
            _drs(
                "UPDATE",
                604,
                fields=THING_FIELDS,
                beforeImages=_thing("1", "a", "1.5"),
                afterImages=_thing("1", None, "2.5"),
            ),
        ),
    ]
    delete = [
        shared["DELETE"],
        _single_object(shared["DELETE"]),
        _line(
            "DELETE: before only",
            s,
            _drs("DELETE", 605, fields=THING_FIELDS, beforeImages=_thing("1", None, "2.5")),
        ),
    ]
    ddl = [
        _line(
            "DDL: statement taken from the first Character value of afterImages (location unconfirmed)",
            s,
            _drs(
                "DDL",
                606,
                tableName='"shop"."things"',
                afterImages=[
                    _drs_value("Character", charset="utf8mb4", value=b"ALTER TABLE things ADD COLUMN note text")
                ],
            ),
        ),
        _line("DDL without images: ddl null", s, _drs("DDL", 607, tableName=None)),
        _line(
            "DDL in GBK (a Chinese column comment) decodes as DTS's Character values do",
            s,
            _drs(
                "DDL",
                620,
                tableName='"shop"."things"',
                afterImages=[
                    _drs_value(
                        "Character", charset="gbk", value="ALTER TABLE things ADD COLUMN 备注 text".encode("gbk")
                    )
                ],
            ),
        ),
    ]
    good = _avro(s, _drs("INSERT", 608, fields=THING_FIELDS, afterImages=_thing("1", "a", "1")))
    malformed = [
        _raw("null Kafka value", None),
        _raw("corrupt binary", b"\xff" * 64),
        _raw("truncated record", good[: len(good) // 2]),
        _raw("single-object header with another schema's fingerprint", bytes.fromhex("C3010102030405060708") + good),
        _line("unknown operation", s, _drs("MERGE", 609, fields=THING_FIELDS, afterImages=_thing("1", "a", "1"))),
        _line(
            "DDL in GBK with bytes that are not GBK: a dead letter, not a statement with U+FFFD in it",
            s,
            _drs(
                "DDL",
                621,
                tableName='"shop"."things"',
                afterImages=[_drs_value("Character", charset="gbk", value=b"ALTER TABLE things ADD COLUMN \x81 text")],
            ),
        ),
        _line(
            "afterImages longer than fields",
            s,
            _drs("INSERT", 610, fields=THING_FIELDS[:2], afterImages=_thing("1", "a", "1")),
        ),
        _line(
            "tableName with 4 parts",
            s,
            _drs("INSERT", 611, tableName="a.b.c.d", fields=THING_FIELDS, afterImages=_thing("1", "a", "1")),
        ),
        _line(
            "BIT(1) value that is not 0/1",
            s,
            _drs(
                "INSERT",
                612,
                fields=[THING_FIELDS[0], {"name": "flag", "dataTypeNumber": -7}],
                afterImages=[
                    _drs_value("Integer", precision=8, value="1"),
                    _drs_value("Bit", precision=1, value="2"),
                ],
            ),
        ),
        _line(
            "DATETIME text that is not a timestamp",
            s,
            _drs(
                "INSERT",
                613,
                fields=[THING_FIELDS[0], THING_FIELDS[7]],
                afterImages=[
                    _drs_value("Integer", precision=8, value="1"),
                    _drs_value("Date", value="0000-00-00 00:00:00"),
                ],
            ),
        ),
        _line("UPDATE without images", s, _drs("UPDATE", 614, fields=THING_FIELDS)),
    ]
    return {"insert": insert, "update": update, "delete": delete, "ddl": ddl, "malformed": malformed}


def drs_replay() -> list[dict[str, Any]]:
    """Replay scenario of drs-avro (keys from options.json): insert, update, delete; both framings."""
    s = _schema("drs-record.avsc")
    fields = [
        {"name": "id", "dataTypeNumber": 4},
        {"name": "title", "dataTypeNumber": 12},
        {"name": "price", "dataTypeNumber": 3},
        {"name": "made_at", "dataTypeNumber": 94},
    ]

    def row(i: str, title: str | None, price: str) -> list[Any]:
        return [
            _drs_value("Integer", precision=4, value=i),
            None if title is None else _drs_value("Character", charset="utf8mb4", value=title.encode()),
            _drs_value("Decimal", value=price, precision=8, scale=2),
            _drs_value("Date", value="2024-05-06 07:08:09"),
        ]

    def msg(op: str, seq: int, before: Any = None, after: Any = None) -> dict[str, Any]:
        return _drs(op, seq, tableName='"inventory"."items"', fields=fields, beforeImages=before, afterImages=after)

    return [
        _line("insert 7", s, msg("INSERT", 1, after=row("7", "Ωmega", "12.50"))),
        _single_object(_line("insert 8", s, msg("INSERT", 2, after=row("8", "b", "1.00")))),
        _line("update 7", s, msg("UPDATE", 3, before=row("7", "Ωmega", "12.50"), after=row("7", None, "10.00"))),
        _single_object(_line("delete 8", s, msg("DELETE", 4, before=row("8", "b", "1.00")))),
        _line("insert 9", s, msg("INSERT", 5, after=row("9", "nine", "9.99"))),
    ]


# ---------------------------------------------------------------------------------------------------------------
# Qlik Avro (shared/formats/qlik.md sections 1 "Avro", 3-5)

QLIK_ENVELOPE = fastavro.parse_schema(
    {
        "type": "record",
        "name": "MessageEnvelope",
        "fields": [
            {"name": "magic", "type": {"type": "fixed", "name": "Magic", "size": 5}},
            {"name": "type", "type": "string"},
            {"name": "headers", "type": ["null", {"type": "map", "values": "string"}]},
            {"name": "messageSchemaId", "type": ["null", "string"]},
            {"name": "messageSchema", "type": ["null", "string"]},
            {"name": "message", "type": "bytes"},
        ],
    }
)
QLIK_SCHEMA_ID = "7B2C0E9B7D2F4C86A3E1B0D9C8F7E6A5"
QLIK_HEADERS = {
    "type": "record",
    "name": "Headers",
    "fields": [
        {
            "name": "operation",
            "type": {"type": "enum", "name": "operation", "symbols": ["INSERT", "UPDATE", "DELETE", "REFRESH"]},
        },
        {"name": "changeSequence", "type": "string"},
        {"name": "timestamp", "type": "string"},
        {"name": "streamPosition", "type": "string"},
        {"name": "transactionId", "type": "string"},
        {"name": "changeMask", "type": ["null", "bytes"]},
        {"name": "columnMask", "type": ["null", "bytes"]},
        {"name": "transactionEventCounter", "type": ["null", "long"]},
        {"name": "transactionLastEvent", "type": ["null", "boolean"]},
    ],
}
QLIK_DATA_SCHEMA = {
    "type": "record",
    "name": "DataRecord",
    "fields": [
        {
            "name": "data",
            "type": {
                "type": "record",
                "name": "Data",
                "fields": [
                    {"name": "ID", "type": ["null", "long"]},
                    {"name": "NAME", "type": ["null", "string"]},
                    {
                        "name": "AMOUNT",
                        "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 4}],
                    },
                    {
                        "name": "BIG",
                        "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 0}],
                    },
                    {"name": "HIRED", "type": ["null", {"type": "int", "logicalType": "date"}]},
                    {"name": "AT", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
                    {"name": "T", "type": ["null", {"type": "int", "logicalType": "time-millis"}]},
                    {"name": "R8", "type": ["null", "double"]},
                    {"name": "PHOTO", "type": ["null", "bytes"]},
                    {"name": "OK", "type": ["null", "boolean"]},
                ],
            },
        },
        {"name": "beforeData", "type": ["null", "Data"]},
        {"name": "headers", "type": QLIK_HEADERS},
    ],
}
QLIK_DATA_SCHEMA_TEXT = json.dumps(QLIK_DATA_SCHEMA)


def _qlik_dt(
    case: str,
    op: str,
    data: dict[str, Any] | None,
    before: dict[str, Any] | None = None,
    seq: int | None = 1,
    column_mask: bytes | None = b"\xff\x03",
    last: bool | None = True,
) -> dict[str, Any]:
    headers = {
        "operation": op,
        "changeSequence": "" if seq is None else "20240301110000000000" + f"{seq:015d}",
        "timestamp": "" if seq is None else "2024-03-01T11:00:00.000",
        "streamPosition": "",
        "transactionId": "" if seq is None else "00000000000000000000000000000B01",
        "changeMask": column_mask,
        "columnMask": column_mask,
        "transactionEventCounter": None if seq is None else 1,
        "transactionLastEvent": None if seq is None else last,
    }
    record = {"data": data, "beforeData": before, "headers": headers}
    inner = _avro(fastavro.parse_schema(json.loads(QLIK_DATA_SCHEMA_TEXT)), record)
    envelope = {
        "magic": b"atMSG",
        "type": "DT",
        "headers": None,
        "messageSchemaId": QLIK_SCHEMA_ID,
        "messageSchema": None,
        "message": inner,
    }
    line = _line(case, QLIK_ENVELOPE, envelope)
    line["value"] = {**line["value"], "message": {"$avro": _render(record)}}
    return line


def _qlik_row(i: int, **changes: Any) -> dict[str, Any]:
    import datetime as dt

    row = {
        "ID": i,
        "NAME": "Zoë 🚀",
        "AMOUNT": Decimal("1234567890123456.1234"),
        "BIG": Decimal("18446744073709551615"),
        "HIRED": dt.date(2019, 4, 1),
        "AT": dt.datetime(2024, 3, 1, 10, 15, 31, 123456, tzinfo=dt.UTC),
        "T": dt.time(10, 15, 31, 500000),
        "R8": 1.5e-7,
        "PHOTO": b"\x89PNG",
        "OK": True,
    }
    row.update(changes)
    return row


def qlik_cases() -> dict[str, list[dict[str, Any]]]:
    md_record = b"(metadata record bytes: decoding them needs the Qlik metadata schema)"
    md = _line(
        "MD envelope -> DDL event (no statement: the metadata record is not decoded)",
        QLIK_ENVELOPE,
        {
            "magic": b"atMSG",
            "type": "MD",
            "headers": None,
            "messageSchemaId": "METADATA-SCHEMA-ID",
            "messageSchema": '{"type":"record","name":"MetadataMessage","fields":[]}',
            "message": md_record,
        },
    )
    note = " [golden cases run without options: every DT message is a dead letter naming its schema id; "
    note += "see tests/formats/test_qlik_avro.py and the replay scenario for decoding with data_schema]"
    return {
        "insert": [_qlik_dt("INSERT" + note, "INSERT", _qlik_row(1))],
        "update": [_qlik_dt("UPDATE" + note, "UPDATE", _qlik_row(1, NAME="x"), before=_qlik_row(1), seq=2)],
        "delete": [_qlik_dt("DELETE" + note, "DELETE", _qlik_row(1), seq=3)],
        "snapshot": [_qlik_dt("REFRESH" + note, "REFRESH", _qlik_row(2), seq=None, column_mask=None)],
        "ddl": [md],
        "malformed": [
            _raw("null Kafka value", None),
            _raw("not an envelope", b"\x00" * 40),
            _raw("wrong magic", b"\x0aatMSX" + b"\x04DT" + b"\x00\x00\x00\x00"),
            _raw("JSON instead of Avro", b'{"magic": "atMSG"}'),
        ],
    }


def qlik_replay() -> list[dict[str, Any]]:
    """Replay scenario of qlik-avro (options: data_schema, table, keys)."""
    return [
        _qlik_dt("REFRESH 1", "REFRESH", _qlik_row(1), seq=None, column_mask=None),
        _qlik_dt("REFRESH 2", "REFRESH", _qlik_row(2), seq=None, column_mask=None),
        _qlik_dt("INSERT 3", "INSERT", _qlik_row(3, NAME=None, PHOTO=None), seq=1, last=False),
        _qlik_dt("UPDATE 1 with before image", "UPDATE", _qlik_row(1, NAME="eins"), before=_qlik_row(1), seq=2),
        # columnMask 0x05 0x00: only ID (1) and AMOUNT (3) captured; NAME, PHOTO... keep their stored values
        _qlik_dt(
            "UPDATE 2, columnMask 0500: only ID and AMOUNT captured",
            "UPDATE",
            _qlik_row(2, NAME=None, AMOUNT=Decimal("9.9900"), PHOTO=None, OK=None),
            seq=3,
            column_mask=b"\x05\x00",
        ),
        _qlik_dt("DELETE 3", "DELETE", _qlik_row(3, NAME=None, PHOTO=None), seq=4),
    ]


WRITERS: dict[str, tuple[Callable[[], dict[str, list[dict[str, Any]]]], Callable[[], list[dict[str, Any]]]]] = {
    "dts-avro": (dts_cases, dts_replay),
    "drs-avro": (drs_cases, drs_replay),
    "qlik-avro": (qlik_cases, qlik_replay),
}


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    print(f"wrote {path} ({len(lines)} messages)")


def main(names: list[str]) -> None:
    for name in names or list(WRITERS):
        cases, replay = WRITERS[name]
        for scenario, lines in cases().items():
            _write(CASES / name / f"{scenario}.input.jsonl", lines)
        _write(CASES / name / "replay" / "input.jsonl", replay())


if __name__ == "__main__":
    main(sys.argv[1:])
