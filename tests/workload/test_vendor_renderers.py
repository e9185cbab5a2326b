"""The DTS Avro, DRS Avro, DTS SharePlex JSON and DRS DDS workload renderers, in pure Python (no Spark): output is
deterministic, every message decodes with an independent reader (fastavro with the shared ``.avsc`` files, ``json``)
back to the history's values, re-sends are byte copies, positions increase, and the consumer is told what the
format does not carry."""

from __future__ import annotations

import base64
import io
import json
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import fastavro
import fastavro.schema
import pytest

from cdclake.workload import (
    HistoryConfig,
    Message,
    RenderedStream,
    RenderOptions,
    SourceHistory,
    _lake_model,
    drs_avro,
    drs_dds,
    dts_avro,
    render_stream,
    shareplex,
)
from cdclake.workload.history import Change, TableSpec
from tests.conftest import SHARED

VENDOR_FORMATS = ("dts-avro", "drs-avro", "dts-shareplex-json", "drs-json-dds")
HISTORY = HistoryConfig(
    seed=3, tables=4, events=400, keys_per_table=25, keyless_tables=1, truncates=2, added_columns=2, null_ratio=0.2
)
SHAPE = RenderOptions(heartbeat_every=20, resends=3, malformed=4, transactions=True, partial_updates=True)
PLAIN = RenderOptions(heartbeat_every=0, resends=0, malformed=0, transactions=False, partial_updates=False)


@pytest.fixture(scope="module")
def history() -> SourceHistory:
    return SourceHistory.generate(HISTORY)


@pytest.fixture(scope="module")
def streams(history: SourceHistory) -> dict[str, RenderedStream]:
    return {name: render_stream(name, history, SHAPE, seed=9) for name in VENDOR_FORMATS}


def _shared_schema(file_name: str) -> Any:
    return fastavro.parse_schema(json.loads((SHARED / "formats" / file_name).read_text()))


DTS_SCHEMA = _shared_schema("dts-record.avsc")
DRS_SCHEMA = _shared_schema("drs-record.avsc")


def _avro(value: bytes, schema: Any) -> dict[str, Any]:
    return fastavro.schemaless_reader(io.BytesIO(value), schema)  # type: ignore[no-any-return]


def _drs_record(value: bytes) -> dict[str, Any]:
    assert value[:10] == drs_avro.SINGLE_OBJECT_MARKER + drs_avro.FINGERPRINT
    return _avro(value[10:], DRS_SCHEMA)


def _row_changes(history: SourceHistory) -> list[Change]:
    return [c for c in history.changes if c.op in ("INSERT", "UPDATE", "DELETE")]


def _originals(stream: RenderedStream) -> list[Message]:
    return [m for m in stream.messages if not m.is_resend and not m.is_malformed]


def _rows_of(stream: RenderedStream) -> list[Message]:
    return [m for m in _originals(stream) if m.description.split(" ")[0] in ("INSERT", "UPDATE", "DELETE")]


# ----------------------------------------------------------------------------------------------------------------
# Every renderer


@pytest.mark.parametrize("name", VENDOR_FORMATS)
def test_equal_inputs_give_byte_identical_streams(history: SourceHistory, name: str) -> None:
    first = render_stream(name, history, SHAPE, seed=9)
    again = render_stream(name, history, SHAPE, seed=9)
    other = render_stream(name, history, SHAPE, seed=10)
    assert [(m.key, m.value, m.description) for m in first.messages] == [
        (m.key, m.value, m.description) for m in again.messages
    ]
    assert [m.value for m in first.messages] != [m.value for m in other.messages]


@pytest.mark.parametrize("name", VENDOR_FORMATS)
def test_resends_are_byte_copies_of_earlier_messages(streams: dict[str, RenderedStream], name: str) -> None:
    messages = streams[name].messages
    resends = [i for i, m in enumerate(messages) if m.is_resend]
    assert len(resends) >= 5
    for i in resends:
        earlier = {(m.key, m.value) for m in messages[:i] if not m.is_resend}
        assert (messages[i].key, messages[i].value) in earlier


@pytest.mark.parametrize("name", VENDOR_FORMATS)
def test_every_row_change_is_rendered_once_and_malformed_as_asked(
    history: SourceHistory, streams: dict[str, RenderedStream], name: str
) -> None:
    stream = streams[name]
    assert sum(m.is_malformed for m in stream.messages) == SHAPE.malformed
    described = Counter(" ".join(m.description.split(" ")[:2]) for m in _rows_of(stream))
    rendered = Counter(f"{c.op} {c.table.qualified_name}" for c in _row_changes(history))
    if name == "drs-json-dds":  # a TRUNCATE is one delete per document
        truncated = described - rendered
        assert set(truncated) <= {f"DELETE {t.qualified_name}" for t in history.tables}
        assert sum(truncated.values()) > 0
        described -= truncated
    assert described == rendered


@pytest.mark.parametrize("name", VENDOR_FORMATS)
def test_expected_tables_keep_every_source_row(
    history: SourceHistory, streams: dict[str, RenderedStream], name: str
) -> None:
    expected = streams[name].expected_truth(history)
    truth = history.truth()
    assert len(expected) == len(truth)
    for table in history.tables:
        rows = expected[(table.database, table.table)]
        assert all(not column.startswith("_cdc_") for row in rows for column in row)
        if name == "drs-json-dds":  # same identities as the source, truncates applied
            assert len(rows) == len(truth[table.ident])
        if table.primary_key:
            key = table.primary_key[0]
            lake_keys = {str(row["_id" if name == "drs-json-dds" else key]) for row in rows}
            assert {str(row[key]) for row in truth[table.ident]} <= lake_keys


def test_lake_model_with_source_semantics_is_the_truth() -> None:
    for seed in range(4):
        config = HistoryConfig(seed=seed, tables=4, events=300, keyless_tables=2, truncates=2, added_columns=2)
        config.oracle_tables = 1
        history = SourceHistory.generate(config)
        _lake_model.check_against_truth(history, history.truth())
        broken = {ident: rows[1:] for ident, rows in history.truth().items()}
        with pytest.raises(AssertionError):
            _lake_model.check_against_truth(history, broken)


def test_lake_model_without_truncate_keeps_the_truncated_rows() -> None:
    history = SourceHistory.generate(HistoryConfig(seed=1, tables=2, events=200, keyless_tables=0, truncates=1))
    truncate_index = next(i for i, c in enumerate(history.changes) if c.op == "TRUNCATE")
    table = history.changes[truncate_index].table
    before = SourceHistory(history.tables, history.changes[:truncate_index]).truth()[table.ident]
    kept = _lake_model.simulate(history, "source", applies_truncate=False)[table.ident]
    truth_keys = {row["id"] for row in history.truth()[table.ident]}
    kept_keys = {row["id"] for _, row in kept}
    assert kept_keys == truth_keys | {row["id"] for row in before}


# ----------------------------------------------------------------------------------------------------------------
# DTS Avro


def _dts_value(kind: str, item: Any) -> Any:
    """A decoded DTS value union -> the history's Python value (for the column kinds the renderer writes)."""
    if item is None:
        return None
    if kind == "long":
        return int(item["value"])
    if kind == "boolean":
        return {"1": True, "0": False}[item["value"]]
    if kind == "string":
        assert item["charset"] == "utf8mb4"
        return item["value"].decode("utf-8")
    if kind == "bytes":
        assert item["type"] == "BLOB"
        return item["value"]
    if kind == "double":
        return item["value"]
    moment = datetime(item["year"], item["month"], item["day"], item["hour"], item["minute"], item["second"])
    return moment.replace(tzinfo=UTC) + timedelta(microseconds=item["millis"])


def test_dts_schema_is_the_shared_avsc() -> None:
    ours = fastavro.schema.to_parsing_canonical_form(fastavro.parse_schema(dts_avro.SCHEMA))
    assert ours == fastavro.schema.to_parsing_canonical_form(DTS_SCHEMA)


def test_dts_records_decode_to_the_history(history: SourceHistory, streams: dict[str, RenderedStream]) -> None:
    stream = streams["dts-avro"]
    records = [_avro(m.value, DTS_SCHEMA) for m in _rows_of(stream) if m.value is not None]
    changes = _row_changes(history)
    assert len(records) == len(changes)
    none_values = 0
    for record, change in zip(records, changes, strict=True):
        table = change.table
        assert record["operation"] == change.op
        assert record["objectName"] == f"{table.database}.{table.table}"
        assert record["sourceTimestamp"] == change.event_time_ms // 1000 == record["bornTimestamp"]
        info = json.loads(record["tags"]["pk_uk_info"])
        assert info == ({"PRIMARY": table.primary_key} if table.primary_key else {})
        assert [f["name"] for f in record["fields"]] == table.column_names()
        for images, image in (("beforeImages", change.before), ("afterImages", change.after)):
            if image is None:
                assert record[images] is None
                continue
            for column, item in zip(table.columns, record[images], strict=True):
                if item == "NONE":  # binlog_row_image=NOBLOB: an unchanged BLOB of an UPDATE
                    none_values += 1
                    assert change.op == "UPDATE"
                    assert column.kind == "bytes"
                    assert table.primary_key
                    assert change.before is not None
                    assert change.after is not None
                    assert change.before[column.name] == change.after[column.name]
                    continue
                assert _dts_value(column.kind, item) == image.get(column.name)
    assert none_values > 0


def test_dts_stream_shape(history: SourceHistory, streams: dict[str, RenderedStream]) -> None:
    stream = streams["dts-avro"]
    for message in stream.messages:
        assert message.value is not None
        if message.is_malformed:
            assert len(message.value) > dts_avro.NOOP_MAX_BYTES  # else it would be a NOOP placeholder
            if message.description.endswith(("truncated record", "not avro")):
                with pytest.raises(Exception):  # noqa: B017 - any decoding error will do
                    _avro(message.value, DTS_SCHEMA)
            continue
        record = _avro(message.value, DTS_SCHEMA)
        if message.description == "NOOP placeholder":
            assert len(message.value) <= dts_avro.NOOP_MAX_BYTES
            assert record["operation"] == "NOOP"
    operations = Counter(_avro(m.value, DTS_SCHEMA)["operation"] for m in _originals(stream) if m.value)
    assert operations["BEGIN"] == operations["COMMIT"] > 0
    assert operations["HEARTBEAT"] > 0
    assert operations["NOOP"] > 0
    ddl = [_avro(m.value, DTS_SCHEMA) for m in _originals(stream) if m.description.startswith("DDL")]
    assert len(ddl) == HISTORY.truncates + HISTORY.added_columns
    assert {r["objectName"] for r in ddl} <= {t.database for t in history.tables}
    assert any(str(r["afterImages"]).startswith("TRUNCATE TABLE") for r in ddl)
    assert any(" ADD COLUMN " in str(r["afterImages"]) for r in ddl)


def test_dts_positions_and_ids_increase(streams: dict[str, RenderedStream]) -> None:
    records = [_avro(m.value, DTS_SCHEMA) for m in _originals(streams["dts-avro"]) if m.value]
    ids = [r["id"] for r in records]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    positions = []
    for record in records:
        offset, file_number = record["sourcePosition"].split("@")
        positions.append((int(file_number), int(offset)))
        if record["operation"] in ("INSERT", "UPDATE", "DELETE"):
            safe_offset, safe_file = record["safeSourcePosition"].split("@")
            assert (int(safe_file), int(safe_offset)) <= positions[-1]
    assert positions == sorted(positions)
    assert len({file_number for file_number, _ in positions}) > 1  # the binlog rotated


def test_dts_without_options_has_no_markers_or_none_values(history: SourceHistory) -> None:
    stream = render_stream("dts-avro", history, PLAIN, seed=1)
    operations = Counter(_avro(m.value, DTS_SCHEMA)["operation"] for m in stream.messages if m.value)
    assert set(operations) == {"INSERT", "UPDATE", "DELETE", "DDL"}
    for message in stream.messages:
        record = _avro(message.value or b"", DTS_SCHEMA)
        assert "NONE" not in (record["afterImages"] or [])


def test_dts_expected_maps_bigint_to_decimal_and_tinyint_to_int(history: SourceHistory) -> None:
    expected = render_stream("dts-avro", history, PLAIN).expected_truth(history)
    customer = expected[("crm", "customer")]
    assert all(isinstance(row["id"], Decimal) for row in customer)
    assert {row["vip"] for row in customer} <= {0, 1, None}
    assert all(not isinstance(row["vip"], bool) for row in customer)


# ----------------------------------------------------------------------------------------------------------------
# DRS Avro


def _drs_value(kind: str, item: Any) -> Any:
    if item is None:
        return None
    if kind == "long":
        return int(item["value"])
    if kind == "boolean":
        assert item["precision"] == 1
        return item["value"] == "1"
    if kind == "string":
        return item["value"].decode("utf-8")
    if kind == "bytes":
        return item["value"]
    if kind == "double":
        return item["value"]
    return datetime.fromtimestamp(item["timestamp"], UTC) + timedelta(microseconds=item["millis"])


def test_drs_schema_is_the_shared_avsc_with_its_fingerprint() -> None:
    ours = fastavro.schema.to_parsing_canonical_form(fastavro.parse_schema(drs_avro.SCHEMA))
    assert ours == fastavro.schema.to_parsing_canonical_form(DRS_SCHEMA)
    # drs.md 1.1: CRC-64-AVRO 0xCC78AC4009A39E4E, written little-endian after C3 01 (fastavro prints those bytes).
    assert bytes.fromhex(fastavro.schema.fingerprint(ours, "CRC-64-AVRO")) == drs_avro.FINGERPRINT
    assert (0xCC78AC4009A39E4E).to_bytes(8, "little") == drs_avro.FINGERPRINT


def test_drs_records_decode_to_the_history(history: SourceHistory, streams: dict[str, RenderedStream]) -> None:
    stream = streams["drs-avro"]
    records = [_drs_record(m.value) for m in _rows_of(stream) if m.value is not None]
    changes = _row_changes(history)
    assert len(records) == len(changes)
    for record, change in zip(records, changes, strict=True):
        table = change.table
        assert record["operation"] == change.op
        assert record["tableName"] == f'"{table.database}"."{table.table}"'
        assert record["updateTimestamp"] == change.event_time_ms
        assert record["columnCount"] == len(table.columns) == len(record["fields"])
        for images, image in (("beforeImages", change.before), ("afterImages", change.after)):
            if image is None:
                assert record[images] is None
                continue
            values = [_drs_value(c.kind, item) for c, item in zip(table.columns, record[images], strict=True)]
            assert values == [image.get(c.name) for c in table.columns]
    seqnos = [_drs_record(m.value)["seqno"] for m in _originals(stream) if m.value]
    assert seqnos == sorted(set(seqnos))
    ddl = [_drs_record(m.value) for m in _originals(stream) if m.value and m.description.startswith("DDL")]
    assert len(ddl) == HISTORY.truncates + HISTORY.added_columns
    assert all(
        r["operation"] == "DDL" and r["afterImages"][0]["value"].startswith((b"TRUNCATE", b"ALTER")) for r in ddl
    )


def test_drs_returns_the_keys_it_does_not_carry(history: SourceHistory, streams: dict[str, RenderedStream]) -> None:
    keys = streams["drs-avro"].keys
    assert keys == {t.qualified_name: t.primary_key for t in history.tables if t.primary_key}
    assert keys


def test_drs_plain_binary_and_malformed_values(history: SourceHistory, streams: dict[str, RenderedStream]) -> None:
    plain = drs_avro.render(history, PLAIN, seed=2, single_object=False)
    assert all(m.value is not None and not m.value.startswith(drs_avro.SINGLE_OBJECT_MARKER) for m in plain.messages)
    assert {_avro(m.value or b"", DRS_SCHEMA)["operation"] for m in plain.messages} == {
        "INSERT",
        "UPDATE",
        "DELETE",
        "DDL",
    }
    broken = [m for m in streams["drs-avro"].messages if m.is_malformed]
    kinds = {m.description.removeprefix("malformed: ") for m in broken}
    assert kinds == set(drs_avro.MALFORMED_KINDS)
    for message in broken:
        value = message.value or b""
        if message.description.endswith("foreign fingerprint"):
            assert value[2:10] != drs_avro.FINGERPRINT
        elif message.description.endswith("Integer value 'abc'"):
            record = _drs_record(value)
            assert any(isinstance(v, dict) and v.get("value") == "abc" for v in record["afterImages"] or [])
        else:
            with pytest.raises(Exception):  # noqa: B017 - any decoding error will do
                _drs_record(value) if value.startswith(drs_avro.SINGLE_OBJECT_MARKER) else _avro(value, DRS_SCHEMA)


# ----------------------------------------------------------------------------------------------------------------
# DTS SharePlex JSON


def test_shareplex_messages(history: SourceHistory, streams: dict[str, RenderedStream]) -> None:
    stream = streams["dts-shareplex-json"]
    messages = [json.loads(m.value or b"") for m in _rows_of(stream)]
    changes = _row_changes(history)
    assert len(messages) == len(changes)
    rowids: dict[tuple[str, str], dict[tuple[Any, ...], str]] = {}
    for message, change in zip(messages, changes, strict=True):
        table, meta = change.table, message["meta"]
        kinds = {c.name: c.kind for c in table.columns}
        assert meta["op"] == {"INSERT": "ins", "UPDATE": "upd", "DELETE": "del"}[change.op]
        assert meta["table"] == f"{table.database}.{table.table}"
        assert re.fullmatch(r"[A-Za-z0-9+/]{18}", meta["rowid"])
        assert meta["idx"] == f"{meta['seq']}/{meta['size']}"
        assert meta["time"] >= datetime.fromtimestamp(change.event_time_ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        identity = _lake_model.primary_key(table, change.after or change.before or {}) or (change.row_id,)
        live = rowids.setdefault(table.ident, {})
        if change.op == "INSERT":
            assert meta["rowid"] not in live.values()
            live[identity] = meta["rowid"]
            assert message["data"] == {c: shareplex.value_text(kinds[c], v) for c, v in (change.after or {}).items()}
        elif change.op == "DELETE":
            assert live.pop(identity) == meta["rowid"]
            assert message["data"] == {c: shareplex.value_text(kinds[c], v) for c, v in (change.before or {}).items()}
        else:
            assert change.before is not None
            assert change.after is not None
            assert live[identity] == meta["rowid"]
            changed = {c for c in table.column_names() if change.before[c] != change.after.get(c)}
            assert set(message["data"]) == changed
            assert set(table.primary_key) <= set(message["key"])
            for column, text in message["key"].items():
                assert text == shareplex.value_text(kinds[column], change.before[column])
    truncates = [json.loads(m.value or b"") for m in _originals(stream) if m.description.startswith("TRUNCATE")]
    assert [t["meta"]["op"] for t in truncates] == ["truncate"] * HISTORY.truncates
    positions = [(int(m["meta"]["scn"]), m["meta"]["trans"], m["meta"]["seq"]) for m in messages + truncates]
    assert len(set(positions)) == len(positions)
    ordered = [
        (int(json.loads(m.value or b"")["meta"]["scn"]), json.loads(m.value or b"")["meta"]["seq"])
        for m in _originals(stream)
    ]
    assert ordered == sorted(ordered)


def test_shareplex_value_text() -> None:
    assert shareplex.value_text("bytes", b"\x00\xff") == "00FF"
    assert shareplex.value_text("boolean", False) == "0"
    assert shareplex.value_text("double", 1e16) == "1e+16"
    assert (
        shareplex.value_text("timestamp", datetime(2024, 3, 1, 2, 15, 31, 7000, tzinfo=UTC))
        == "2024-03-01T02:15:31.007"
    )
    assert shareplex.value_text("long", -(2**63)) == "-9223372036854775808"
    assert shareplex.value_text("string", None) is None
    assert shareplex.oracle_rowid(74000, 5) != shareplex.oracle_rowid(74017, 5)


def test_shareplex_oracle_tables_land_under_their_owner() -> None:
    config = HistoryConfig(seed=4, tables=1, events=60, keyless_tables=0, oracle_tables=1)
    history = SourceHistory.generate(config)
    stream = render_stream("dts-shareplex-json", history, PLAIN)
    oracle = next(t for t in history.tables if t.schema)
    assert (oracle.schema, oracle.table) in stream.expected_truth(history)
    assert any(
        json.loads(m.value or b"")["meta"]["table"] == f"{oracle.schema}.{oracle.table}" for m in stream.messages
    )


# ----------------------------------------------------------------------------------------------------------------
# DRS JSON DDS


_SHELL = (
    (r'ObjectId\("([0-9a-f]{24})"\)', r'"\1"'),
    (r'ISODate\("([^"]*)"\)', r'"\1"'),
    (r'NumberLong\("?(-?\d+)"?\)', r"\1"),
    (r'new BinData\(0, "([^"]*)"\)', r'{"$binary": "\1"}'),
)


def _shell_json(text: str) -> dict[str, Any]:
    """Mongo-shell text -> JSON (a rewrite written for this test, independent of the decoder's)."""
    for pattern, replacement in _SHELL:
        text = re.sub(pattern, replacement, text)
    return json.loads(text)  # type: ignore[no-any-return]


def _mongo_value(kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "bytes":
        return {"$binary": base64.b64encode(value).decode()}
    if kind == "timestamp":
        return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    return value


def _document(table: TableSpec, row: dict[str, Any]) -> dict[str, Any]:
    return {c.name: _mongo_value(c.kind, row.get(c.name)) for c in table.columns if c.name not in table.primary_key}


def test_dds_documents(history: SourceHistory, streams: dict[str, RenderedStream]) -> None:
    stream = streams["drs-json-dds"]
    messages = [json.loads(m.value or b"") for m in _originals(stream)]
    record_types = Counter(m["recordType"] for m in messages)
    assert record_types["update"] > 0
    assert record_types["replace"] > 0
    changes = _row_changes(history)
    pending = 0
    truncate_deletes = 0
    documents: dict[tuple[str, str], dict[Any, dict[str, Any]]] = {}
    for message in messages:
        assert message["dbType"] == "MongoDB"
        assert message["extra"] == message["recordType"]
        collection = documents.setdefault((message["db"], message["coll"]), {})
        value = _shell_json(message["value"])
        change = changes[pending] if pending < len(changes) else None
        if message["op"] == "DELETE":
            assert message["where"] is None
            assert message["recordType"] == "doc"
            del collection[value["_id"]]
            own = change is not None and change.op == "DELETE" and change.table.table == message["coll"]
            if own and change is not None and change.table.primary_key:
                own = value["_id"] == (change.before or {})[change.table.primary_key[0]]
            if own:
                pending += 1
            else:  # one of the deletes that empty a collection for a TRUNCATE
                truncate_deletes += 1
            continue
        assert change is not None
        assert change.after is not None
        assert change.op == message["op"]
        pending += 1
        if message["op"] == "INSERT":
            collection[value["_id"]] = value
            if change.table.primary_key:
                assert value["_id"] == change.after[change.table.primary_key[0]]
            stored = value
        else:
            identity = _shell_json(message["where"])["_id"]
            if message["recordType"] == "replace":
                collection[identity] = value
            else:
                assert set(value) <= {"$set", "$unset"}
                collection[identity].update(value.get("$set", {}))
                for field in value.get("$unset", {}):
                    collection[identity][field] = None
            stored = collection[identity]
        expected = _document(change.table, change.after)
        assert {k: stored.get(k) for k in expected} == expected
    assert pending == len(changes)
    assert truncate_deletes > 0
    keys = [(int(m["clusterTime"].split(":")[0]), int(m["clusterTime"].split(":")[1]), m["id"]) for m in messages]
    assert keys == sorted(keys)
    assert len({k[2] for k in keys}) == len(keys)
    shared = Counter(m["clusterTime"] for m in messages)
    assert max(shared.values()) > 1  # transactions share the clusterTime of their applyOps entry


def test_dds_without_partial_updates_replaces_whole_documents(history: SourceHistory) -> None:
    stream = render_stream("drs-json-dds", history, PLAIN)
    record_types = {json.loads(m.value or b"")["recordType"] for m in stream.messages}
    assert record_types == {"insert", "replace", "doc"}


def test_dds_expected_has_id_columns(history: SourceHistory, streams: dict[str, RenderedStream]) -> None:
    expected = streams["drs-json-dds"].expected_truth(history)
    for table in history.tables:
        rows = expected[table.ident]
        assert all(set(row) == {"_id"} | (set(table.column_names()) - set(table.primary_key)) for row in rows)
        assert all(isinstance(row["_id"], str) for row in rows)
        if not table.primary_key:
            assert all(re.fullmatch(r"[0-9a-f]{24}", row["_id"]) for row in rows)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0.0"),
        (0.1, "0.1"),
        (-1e300, "-1.0E300"),
        (1.5e-7, "1.5E-7"),
        (1.7976931348623157e308, "1.7976931348623157E308"),
        (5e-324, "4.9E-324"),
        (1e16, "1.0E16"),
        (9007199254740993.0, "9.007199254740992E15"),
        (1e7, "1.0E7"),
        (1234567.0, "1234567.0"),
        (0.001, "0.001"),
        (0.00099, "9.9E-4"),
        (-2.5, "-2.5"),
        (1 / 3, "0.3333333333333333"),
    ],
)
def test_java_double_text(value: float, text: str) -> None:
    assert drs_dds.java_double(value) == text
    assert float(text) == value


def test_java_json_string_escapes() -> None:
    assert drs_dds.json_string('a"b\\c\n\t') == '"a\\"b\\\\c\\n\\t"'
    assert drs_dds.json_string("\u0000x\u0001") == '"\\u0000x\\u0001"'
    assert drs_dds.json_string("😀") == '"\\ud83d\\ude00"'
    assert drs_dds.json_string("Zoë 张三 ß") == '"Zoë 张三 ß"'
    assert json.loads(drs_dds.json_string("😀 \u0000")) == "😀 \u0000"
