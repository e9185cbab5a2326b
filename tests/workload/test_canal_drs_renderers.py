"""Canal-family workload renderers (canal-json, dts-canal-json, drs-json-mysql, drs-jsonc-mysql,
drs-json-relational), pure Python: stream shape, vendor value encodings, and an independent strict decoder + apply
written from the specs whose result must equal ``RenderedStream.expected_truth``."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from cdclake.workload import (
    Change,
    Column,
    HistoryConfig,
    Message,
    RenderedStream,
    RenderOptions,
    SourceHistory,
    TableSpec,
    render_stream,
    renderers,
)
from cdclake.workload._canal_family import (
    java_byte_list,
    java_double_text,
    mysql_timestamp_columns,
    postgres_double_text,
)
from cdclake.workload.canal import render_dts_canal_json
from cdclake.workload.drs_json import java_timestamp_text, postgres_timestamp_text
from cdclake.workload.history import INT64_MAX, INT64_MIN, ms_to_datetime

Row = dict[str, Any]
Truth = dict[tuple[str, str], list[Row]]

FORMATS = ("canal-json", "dts-canal-json", "drs-json-mysql", "drs-jsonc-mysql", "drs-json-relational")
DRS = ("drs-json-mysql", "drs-jsonc-mysql", "drs-json-relational")

RICH = HistoryConfig(
    seed=11,
    tables=5,
    events=900,
    keys_per_table=30,
    keyless_tables=2,
    truncates=3,
    added_columns=4,
    null_ratio=0.2,
    oracle_tables=2,
)
SHAPE = RenderOptions(heartbeat_every=30, resends=3, malformed=8, transactions=True, partial_updates=True)
PLUS_8 = timezone(timedelta(hours=8))


@pytest.fixture(scope="module")
def rich() -> SourceHistory:
    return SourceHistory.generate(RICH)


@pytest.fixture(scope="module")
def streams(rich: SourceHistory) -> dict[str, RenderedStream]:
    return {name: render_stream(name, rich, SHAPE, seed=3) for name in FORMATS}


def originals(stream: RenderedStream) -> list[Message]:
    return [m for m in stream.messages if not m.is_resend and not m.is_malformed]


def parsed(stream: RenderedStream) -> list[dict[str, Any]]:
    return [json.loads(m.value or b"") for m in originals(stream)]


# ------------------------------------------------------------------------------------------------------------
# An independent strict decoder of the specs (canal.md, dts.md section 2, drs.md sections 2-4) and an apply


class RejectedError(Exception):
    """The strict decoder refused a message."""


def _mysql_value(fmt: str, declared: str, text: str) -> Any:
    base = declared.split("(")[0].strip()
    if base in ("bigint", "tinyint"):
        if not text.lstrip("-").isdigit():
            raise RejectedError(f"bad integer {text!r}")
        return int(text)
    if base == "varchar":
        return text
    if base == "double":
        return float(text)
    if base == "blob":
        if fmt.startswith("drs"):
            inner = text.strip("[]")
            return bytes((int(b) & 0xFF) for b in inner.split(", ")) if inner else b""
        return text.encode("latin-1")
    if base == "datetime":
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    if base == "timestamp":
        if fmt == "drs-json-mysql":
            seconds = Decimal(text)
            return ms_to_datetime(int(seconds * 1000))
        return datetime.fromisoformat(text).replace(tzinfo=PLUS_8).astimezone(UTC)
    raise RejectedError(f"unknown type {declared!r}")


def _postgres_value(declared: str, text: str) -> Any:
    if declared == "bigint":
        return int(text)
    if declared == "character varying":
        return text
    if declared == "bytea":
        return bytes.fromhex(text)
    if declared == "boolean":
        return {"true": True, "false": False}[text]
    if declared == "double precision":
        return float(text)
    if declared == "timestamp with time zone":
        return datetime.fromisoformat(text).astimezone(UTC)
    raise RejectedError(f"unknown type {declared!r}")


def decode(fmt: str, message: Message, legacy: bool = False) -> tuple[dict[str, Any], list[tuple[Row | None, ...]]]:
    """One message -> (envelope, [(before, after)] per row); raises RejectedError when it is not well-formed."""
    try:
        value = json.loads(message.value or b"")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RejectedError("not json") from exc
    if not isinstance(value, dict):
        raise RejectedError("not an object")
    kind = value.get("type")
    if fmt == "drs-json-relational" and value.get("opType") != kind:
        raise RejectedError("opType differs from type")
    if value.get("isDdl"):
        allowed = {"ALTER", "TRUNCATE"} if fmt == "canal-json" else {"DDL"}
        if kind not in allowed or not value.get("sql"):
            raise RejectedError("bad DDL")
        return value, []
    if kind not in ("INSERT", "UPDATE", "DELETE"):
        raise RejectedError(f"unknown type {kind!r}")
    if fmt == "drs-json-relational":
        column_types = value["columnType"]
        if column_types:
            types: dict[str, Callable[[str], Any]] = {
                n: functools.partial(_postgres_value, t) for n, t in column_types.items()
            }
        else:  # drs.md section 4: Oracle, every value as text
            types = dict.fromkeys(value["sqlType"], str)
    else:
        types = {n: functools.partial(_mysql_value, fmt, t) for n, t in value["mysqlType"].items()}

    def image(row: Row | None, partial: bool = False) -> Row | None:
        if row is None:
            return None
        if not partial and set(row) != set(types):
            raise RejectedError("row columns differ from the declared ones")
        if not set(row) <= set(types):
            raise RejectedError("undeclared column")
        try:
            return {n: None if v is None else types[n](v) for n, v in row.items()}
        except (ValueError, KeyError) as exc:
            raise RejectedError(f"bad value: {exc}") from exc

    data, old = value.get("data"), value.get("old")
    if kind == "INSERT":
        if not data or old is not None:
            raise RejectedError("bad INSERT")
        return value, [(None, image(r)) for r in data]
    if kind == "DELETE":
        in_old = fmt in ("drs-json-mysql", "drs-json-relational") or legacy
        rows, other = (old, data) if in_old else (data, old)
        if not rows or other is not None:
            raise RejectedError("DELETE row in the wrong array")
        return value, [(image(r), None) for r in rows]
    if not data or not old or len(data) != len(old):
        raise RejectedError("UPDATE without paired old rows")
    if legacy:
        data, old = old, data
    pairs = []
    for after_row, old_row in zip(data, old, strict=True):
        after = image(after_row)
        assert after is not None
        if fmt == "canal-json":  # canal.md section 1: before = data overlaid with old (changed columns)
            before = {**after, **(image(old_row, partial=True) or {})}
        else:
            before = image(old_row)
        pairs.append((before, after))
    return value, pairs


def apply_stream(fmt: str, stream: RenderedStream, legacy: bool = False) -> tuple[Truth, list[int]]:
    """Applies a stream: DRS in `id` order (re-sent ids skipped), Canal/DTS in message order. Rows are identified by
    pkNames, else by the full image. Returns the tables and the indexes of rejected messages."""
    tables: dict[tuple[str, str], dict[Any, Row]] = {}
    columns: dict[tuple[str, str], list[str]] = {}
    rejected: list[int] = []
    last_id = -1
    for index, message in enumerate(stream.messages):
        try:
            value, rows = decode(fmt, message, legacy)
        except RejectedError:
            rejected.append(index)
            continue
        if fmt in DRS:
            if value["id"] <= last_id:
                continue
            last_id = value["id"]
        ident = (value["database"] or value["schema"], value["table"])
        state = tables.setdefault(ident, {})
        if value.get("isDdl"):
            if value["sql"].upper().startswith("TRUNCATE"):
                state.clear()
            continue
        keys = value["pkNames"]
        columns[ident] = list(value.get("mysqlType") or value.get("columnType") or value["sqlType"])

        def identity(row: Row, keys: list[str] | None = keys) -> Any:
            if keys:
                return tuple(repr(row[k]) for k in keys)
            # The full image; a column added later is NULL in older rows, so NULLs do not take part.
            return tuple(sorted((n, repr(v)) for n, v in row.items() if v is not None))

        for before, after in rows:
            if before is not None:
                state.pop(identity(before), None)
            if after is not None:
                state[identity(after)] = after
    truth = {
        ident: [{n: row.get(n) for n in columns.get(ident, [])} for row in rows.values()]
        for ident, rows in tables.items()
    }
    return truth, rejected


def canonical(rows: list[Row]) -> list[str]:
    return sorted(repr(sorted(row.items())) for row in rows)


def assert_same_tables(actual: Truth, expected: Truth) -> None:
    for ident, rows in expected.items():
        got = actual.get(ident, [])
        names = {n for row in rows for n in row}
        got = [{n: row.get(n) for n in names} for row in got]
        assert canonical(got) == canonical(rows), ident
    assert {i for i, rows in actual.items() if rows} <= set(expected)


# ------------------------------------------------------------------------------------------------------------
# Stream shape


def test_every_format_has_its_renderer() -> None:
    assert set(FORMATS) <= set(renderers())


@pytest.mark.parametrize("fmt", FORMATS)
def test_rendering_is_deterministic(rich: SourceHistory, fmt: str) -> None:
    first = render_stream(fmt, rich, SHAPE, seed=3)
    again = render_stream(fmt, rich, SHAPE, seed=3)
    other = render_stream(fmt, rich, SHAPE, seed=4)
    assert [(m.key, m.value, m.description) for m in first.messages] == [
        (m.key, m.value, m.description) for m in again.messages
    ]
    assert [m.value for m in first.messages] != [m.value for m in other.messages]
    assert first.format_options == again.format_options


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_message_parses_with_the_vendor_layout(streams: dict[str, RenderedStream], fmt: str) -> None:
    layouts = {
        "canal-json": [
            "data",
            "database",
            "es",
            "gtid",
            "id",
            "isDdl",
            "mysqlType",
            "old",
            "pkNames",
            "sql",
            "sqlType",
            "table",
            "ts",
            "type",
        ],
        "drs-json-mysql": [
            "mysqlType",
            "id",
            "es",
            "ts",
            "database",
            "table",
            "type",
            "isDdl",
            "sql",
            "sqlType",
            "data",
            "old",
            "pkNames",
        ],
    }
    layouts["drs-jsonc-mysql"] = layouts["drs-json-mysql"]
    layouts["drs-json-relational"] = ["columnType", "dbType", "schema", "opType", *layouts["drs-json-mysql"][1:]]
    for message, value in zip(originals(streams[fmt]), parsed(streams[fmt]), strict=True):
        assert message.key is None
        if fmt == "dts-canal-json":
            ddl_keys = ["database", "es", "id", "isDdl", "sql", "table", "ts", "type", "gtid"]
            row_keys = [*layouts["canal-json"][:3], *layouts["canal-json"][4:], "gtid"]
            assert list(value) == (ddl_keys if value["isDdl"] else row_keys)
        else:
            assert list(value) == layouts[fmt]
        assert message.description.startswith(f"{value['type']} ")
        assert message.description.endswith(f".{value['table']}") or " rows)" in message.description
        for row in (value.get("data") or []) + (value.get("old") or []):
            assert all(v is None or isinstance(v, str) for v in row.values()), "values are JSON strings or null"
        if fmt in DRS:
            text = (message.value or b"").decode("utf-8")
            assert not set("<>&='") & set(text), "DRS escapes < > & = ' (drs.md section 2)"


def test_canal_batches_rows_of_one_statement(streams: dict[str, RenderedStream]) -> None:
    sizes = [len(v["data"]) for v in parsed(streams["canal-json"]) if v["data"]]
    assert max(sizes) > 1
    for name in ("dts-canal-json", *DRS):
        assert {len(v["data"] or v["old"]) for v in parsed(streams[name]) if not v["isDdl"]} == {1}


@pytest.mark.parametrize("fmt", FORMATS)
def test_resends_are_byte_copies_of_earlier_messages(streams: dict[str, RenderedStream], fmt: str) -> None:
    messages = streams[fmt].messages
    resends = [i for i, m in enumerate(messages) if m.is_resend]
    assert len(resends) >= 5
    for i in resends:
        assert any(
            m.value == messages[i].value and not m.is_resend and m.description == messages[i].description[8:]
            for m in messages[:i]
        )


@pytest.mark.parametrize("fmt", FORMATS)
def test_positions_and_times_increase(streams: dict[str, RenderedStream], fmt: str) -> None:
    values = parsed(streams[fmt])
    ids = [v["id"] for v in values]
    if fmt in DRS:
        assert all(a < b for a, b in itertools.pairwise(ids)), "DRS id: strictly increasing sequence"
    else:
        assert ids == sorted(ids), "Canal batch id / DTS cache offset never go back"
        assert all(v["es"] % 1000 == 0 for v in values), "es has second resolution"
    if fmt != "drs-json-relational":
        assert [v["es"] for v in values] == sorted(v["es"] for v in values)
    assert all(v["ts"] >= v["es"] for v in values)


@pytest.mark.parametrize("fmt", FORMATS)
def test_keys_are_carried_by_pk_names(rich: SourceHistory, streams: dict[str, RenderedStream], fmt: str) -> None:
    assert streams[fmt].keys == {}
    for value in parsed(streams[fmt]):
        if not value["isDdl"]:
            schema = value.get("schema")
            spec = next(t for t in rich.tables if t.table == value["table"] and value["database"] in (t.database, ""))
            assert value["pkNames"] == (spec.primary_key or None)
            assert schema in (None, spec.schema, "public")


def test_transactions_and_gtids(rich: SourceHistory) -> None:
    marked = render_stream("canal-json", rich, SHAPE, seed=3)
    plain = render_stream("canal-json", rich, dataclasses.replace(SHAPE, transactions=False), seed=3)
    gtids = [v["gtid"] for v in parsed(marked)]
    assert all(g.count(":") == 1 for g in gtids)
    numbers = [int(g.split(":")[1]) for g in gtids]
    assert numbers == sorted(numbers)
    assert len(set(numbers)) > len(numbers) // 6
    assert {v["gtid"] for v in parsed(plain)} == {""}
    dts = parsed(render_stream("dts-canal-json", rich, dataclasses.replace(SHAPE, transactions=False), seed=3))
    assert all("gtid" not in v for v in dts)


@pytest.mark.parametrize("fmt", FORMATS)
def test_ddl_messages(rich: SourceHistory, streams: dict[str, RenderedStream], fmt: str) -> None:
    ddl = [v for v in parsed(streams[fmt]) if v["isDdl"]]
    assert len(ddl) == RICH.truncates + RICH.added_columns
    truncates = [v for v in ddl if v["sql"].startswith("TRUNCATE TABLE ")]
    assert len(truncates) == RICH.truncates
    expected_type = {"canal-json": "TRUNCATE"}.get(fmt, "DDL")
    assert {v["type"] for v in truncates} == {expected_type}
    added = [c.added_column for c in rich.changes if c.op == "ADD_COLUMN"]
    alters = [v for v in ddl if v not in truncates]
    assert {v["type"] for v in alters} == ({"ALTER"} if fmt == "canal-json" else {"DDL"})
    for column, value in zip(added, alters, strict=True):
        assert column is not None
        assert f"{column.name}" in value["sql"]
        assert value["sql"].startswith("ALTER TABLE ")
        assert value.get("data") is None
        assert value.get("mysqlType") is None


# ------------------------------------------------------------------------------------------------------------
# Row images


def test_canal_old_holds_the_changed_columns_only(rich: SourceHistory) -> None:
    partial = parsed(render_stream("canal-json", rich, SHAPE, seed=3))
    full = parsed(render_stream("canal-json", rich, dataclasses.replace(SHAPE, partial_updates=False), seed=3))
    updates = [v for v in partial if v["type"] == "UPDATE"]
    assert updates
    for value in updates:
        for data, old in zip(value["data"], value["old"], strict=True):
            assert old
            assert all(data[name] != text for name, text in old.items())
    for value in (v for v in full if v["type"] == "UPDATE"):
        assert all(set(old) == set(value["mysqlType"]) for old in value["old"])


def test_dts_current_and_legacy_layouts(rich: SourceHistory) -> None:
    current = parsed(render_stream("dts-canal-json", rich, SHAPE, seed=3))
    legacy_stream = render_dts_canal_json(rich, SHAPE, 3, legacy_old_data_swap=True)
    legacy = parsed(legacy_stream)
    assert legacy_stream.format_options["legacy_old_data_swap"] == "true"
    for now, then in zip(current, legacy, strict=True):
        if now["type"] == "UPDATE":
            assert (then["data"], then["old"]) == (now["old"], now["data"])
        elif now["type"] == "DELETE":
            assert now["old"] is None
            assert then["data"] is None
            assert then["old"] == now["data"]
        else:
            assert then == now


def test_drs_delete_row_placement(streams: dict[str, RenderedStream]) -> None:
    json_deletes = [v for v in parsed(streams["drs-json-mysql"]) if v["type"] == "DELETE"]
    jsonc_deletes = [v for v in parsed(streams["drs-jsonc-mysql"]) if v["type"] == "DELETE"]
    assert json_deletes
    assert len(json_deletes) == len(jsonc_deletes)
    for j, c in zip(json_deletes, jsonc_deletes, strict=True):
        assert j["data"] is None
        assert c["old"] is None
        assert len(j["old"]) == 1
        assert dict(j["old"][0].items()) == dict(c["data"][0].items())


def test_oracle_tables_in_drs_relational(rich: SourceHistory, streams: dict[str, RenderedStream]) -> None:
    oracle = [v for v in parsed(streams["drs-json-relational"]) if v["dbType"] == "Oracle"]
    postgres = [v for v in parsed(streams["drs-json-relational"]) if v["dbType"] == "PostgreSQL"]
    assert oracle
    assert postgres
    for value in oracle:
        assert value["database"] == ""
        assert value["schema"] == "SALES"
        assert value["columnType"] in ({}, None)
    for value in postgres:
        assert value["schema"] == "public"
        assert value["database"] in ("crm", "shop")
    expected = streams["drs-json-relational"].expected_truth(rich)
    assert ("SALES", "STORES") in expected
    assert ("ORCL", "STORES") not in expected
    oracle_rows = [row for ident, rows in expected.items() if ident[0] == "SALES" for row in rows]
    assert oracle_rows
    assert all(v is None or isinstance(v, str) for row in oracle_rows for v in row.values())
    stores = rich.table("ORCL", "STORES")
    texts = [row[c.name] for row in expected[("SALES", "STORES")] for c in stores.columns if c.kind == "string"]
    assert "" not in texts, "Oracle stores '' as NULL"


# ------------------------------------------------------------------------------------------------------------
# The streams apply to the expected truth


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("cfg", "shape"),
    [
        (RICH, SHAPE),
        (dataclasses.replace(RICH, seed=12), dataclasses.replace(SHAPE, partial_updates=False, transactions=False)),
        (HistoryConfig(seed=2, tables=2, keyless_tables=2, events=400, keys_per_table=4, truncates=2), SHAPE),
        (
            HistoryConfig(
                seed=5, tables=3, events=120, keys_per_table=15, truncates=1, added_columns=1, null_ratio=0.2
            ),
            RenderOptions(heartbeat_every=30, resends=1, malformed=2, transactions=True, partial_updates=True),
        ),
    ],
)
def test_stream_applies_to_the_expected_truth(fmt: str, cfg: HistoryConfig, shape: RenderOptions) -> None:
    history = SourceHistory.generate(cfg)
    stream = render_stream(fmt, history, shape, seed=cfg.seed)
    tables, rejected = apply_stream(fmt, stream)
    assert rejected == [i for i, m in enumerate(stream.messages) if m.is_malformed]
    assert len(rejected) == shape.malformed
    assert_same_tables(tables, stream.expected_truth(history))


def test_dts_legacy_stream_applies_to_the_expected_truth(rich: SourceHistory) -> None:
    stream = render_dts_canal_json(rich, SHAPE, 3, legacy_old_data_swap=True)
    tables, rejected = apply_stream("dts-canal-json", stream, legacy=True)
    assert rejected == [i for i, m in enumerate(stream.messages) if m.is_malformed]
    assert_same_tables(tables, stream.expected_truth(rich))


def test_keyless_duplicates_collapse_in_the_expected_truth() -> None:
    history = SourceHistory.generate(HistoryConfig(seed=9, tables=1, keyless_tables=1, events=200, keys_per_table=8))
    truth = history.truth()
    (ident,) = truth
    expected = render_stream("drs-json-relational", history, RenderOptions(), seed=0).expected_truth(history)
    distinct = {repr(sorted(r.items())) for r in truth[ident]}
    assert len(truth[ident]) > len(distinct), "the history has duplicate rows (allowed without a key)"
    assert len(expected[ident]) <= len(distinct)
    assert len({repr(sorted(r.items())) for r in expected[ident]}) == len(expected[ident])


# ------------------------------------------------------------------------------------------------------------
# Value encodings


@pytest.mark.parametrize(
    ("value", "java", "postgres"),
    [
        (0.0, "0.0", "0"),
        (0.1, "0.1", "0.1"),
        (-2.5, "-2.5", "-2.5"),
        (1 / 3, "0.3333333333333333", "0.3333333333333333"),
        (123456.789, "123456.789", "123456.789"),
        (10357.0, "10357.0", "10357"),
        (1.2510357e7, "1.2510357E7", "12510357"),
        (1.25e-4, "1.25E-4", "0.000125"),
        (0.001, "0.001", "0.001"),
        (1e7, "1.0E7", "10000000"),
        (1e16, "1.0E16", "1e+16"),
        (9007199254740993.0, "9.007199254740992E15", "9.007199254740992e+15"),
        (-1e300, "-1.0E300", "-1e+300"),
        (1.5e-7, "1.5E-7", "1.5e-07"),
        (1.7976931348623157e308, "1.7976931348623157E308", "1.7976931348623157e+308"),
        (5e-324, "4.9E-324", "5e-324"),
    ],
)
def test_double_texts(value: float, java: str, postgres: str) -> None:
    assert java_double_text(value) == java
    assert postgres_double_text(value) == postgres
    assert float(java) == value
    assert float(postgres) == value


def test_byte_and_time_texts() -> None:
    assert java_byte_list(b"") == "[]"
    assert java_byte_list(b"jgo\x00\x7f\x80\xff") == "[106, 103, 111, 0, 127, -128, -1]"
    instant = datetime(2024, 3, 1, 10, 15, 31, 250_000, tzinfo=UTC)
    assert postgres_timestamp_text(instant) == "2024-03-01 18:15:31.25+08"
    assert postgres_timestamp_text(instant.replace(microsecond=0)) == "2024-03-01 18:15:31+08"
    assert java_timestamp_text(instant) == "2024-03-01 10:15:31.25"
    assert java_timestamp_text(instant.replace(microsecond=0)) == "2024-03-01 10:15:31.0"


def _one_table_history(values: list[datetime], longs: list[int], texts: list[str], blobs: list[bytes]) -> SourceHistory:
    spec = TableSpec(
        "shop",
        "t",
        [
            Column("id", "long"),
            Column("at", "timestamp"),
            Column("n", "long"),
            Column("s", "string"),
            Column("b", "bytes"),
            Column("ok", "boolean"),
            Column("d", "double"),
        ],
        ["id"],
    )
    changes = [
        Change(
            "INSERT",
            spec,
            None,
            {"id": i, "at": at, "n": n, "s": s, "b": b, "ok": i % 2 == 0, "d": 1e16},
            1_000 + i,
            1_709_288_131_000 + i,
            None,
        )
        for i, (at, n, s, b) in enumerate(zip(values, longs, texts, blobs, strict=True))
    ]
    return SourceHistory([spec], changes)


def test_mysql_value_encodings() -> None:
    instants = [datetime(2024, 3, 1, 10, 15, 31, 250_000, tzinfo=UTC), ms_to_datetime(1_000_000_000_000)]
    history = _one_table_history(
        instants, [INT64_MIN, INT64_MAX], ["Zoë 张三 ✓ <&>='", "\u0000nul\u0001ctl"], [b"\xff\xd8", b""]
    )
    assert mysql_timestamp_columns(history) == {("shop", "t", "at")}
    rows = {name: parsed(render_stream(name, history, RenderOptions(), seed=0))[0]["data"][0] for name in FORMATS}
    assert rows["canal-json"] == {
        "id": "0",
        "at": "2024-03-01 18:15:31.250",
        "n": str(INT64_MIN),
        "s": "Zoë 张三 ✓ <&>='",
        "b": "ÿØ",
        "ok": "1",
        "d": "1.0E16",
    }
    assert rows["dts-canal-json"] == rows["canal-json"]
    assert rows["drs-json-mysql"] == {**rows["canal-json"], "at": "1709288131.250", "b": "[-1, -40]"}
    assert rows["drs-jsonc-mysql"] == {**rows["canal-json"], "at": "2024-03-01 18:15:31", "b": "[-1, -40]"}
    assert rows["drs-json-relational"] == {
        **rows["canal-json"],
        "at": "2024-03-01 18:15:31.25+08",
        "b": "ffd8",
        "ok": "true",
        "d": "1e+16",
    }
    canal = parsed(render_stream("canal-json", history, RenderOptions(), seed=0))[0]
    assert canal["mysqlType"]["at"] == "timestamp(3)"
    assert canal["sqlType"]["at"] == 93
    drs = parsed(render_stream("drs-json-mysql", history, RenderOptions(), seed=0))[0]
    assert drs["mysqlType"]["at"] == "timestamp"
    assert drs["sqlType"]["at"] == 93
    jsonc = render_stream("drs-jsonc-mysql", history, RenderOptions(), seed=0)
    assert jsonc.format_options == {"source_timezone": "+08:00"}
    (ident,) = jsonc.expected_truth(history)
    at_values = [row["at"] for row in jsonc.expected_truth(history)[ident]]
    assert at_values == [instants[0].replace(microsecond=0), instants[1]], "JSON-C TIMESTAMP drops the fraction"
    assert [row["ok"] for row in jsonc.expected_truth(history)[ident]] == [1, 0], "TINYINT(1) in the lake"


def test_datetime_columns_beyond_2038() -> None:
    late = ms_to_datetime(4_102_444_799_999)  # 2099-12-31T23:59:59.999Z: no MySQL TIMESTAMP can hold it
    history = _one_table_history([late], [1], ["x"], [b"x"])
    assert mysql_timestamp_columns(history) == frozenset()
    canal = parsed(render_stream("canal-json", history, RenderOptions(), seed=0))[0]
    assert canal["mysqlType"]["at"] == "datetime(3)"
    assert canal["data"][0]["at"] == "2099-12-31 23:59:59.999"
    drs = parsed(render_stream("drs-json-mysql", history, RenderOptions(), seed=0))[0]
    assert drs["sqlType"]["at"] == 94, "drs.md section 2: DATETIME = 94"
