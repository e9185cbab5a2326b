"""The Qlik Replicate renderers (qlik-json, qlik-avro): pure Python, no Spark. Every message is read back with an
independent reader (json / fastavro) following qlik.md, MD before DT, masks by ordinal, resends are byte copies."""

from __future__ import annotations

import base64
import io
import json
from collections import Counter
from datetime import datetime
from typing import Any

import fastavro
import pytest

from cdclake.workload import HistoryConfig, Message, RenderOptions, SourceHistory, render_stream
from cdclake.workload.qlik import (
    ENVELOPE_SCHEMA,
    MALFORMED_AVRO,
    MALFORMED_JSON,
    change_sequence,
    lake_truth,
    mask,
)
from cdclake.workload.renderers import renderers, to_lines

HISTORY = HistoryConfig(
    seed=3,
    tables=4,
    events=400,
    keys_per_table=20,
    keyless_tables=1,
    truncates=2,
    added_columns=2,
    oracle_tables=1,
    null_ratio=0.2,
)
SHAPE = RenderOptions(resends=3, malformed=8, transactions=True, partial_updates=True)
FORMATS = ("qlik-json", "qlik-avro")


@pytest.fixture(scope="module")
def history() -> SourceHistory:
    return SourceHistory.generate(HISTORY)


def _envelope(value: bytes, encoding: str) -> dict[str, Any]:
    if encoding == "json":
        parsed: dict[str, Any] = json.loads(value)
        return parsed
    record: dict[str, Any] = fastavro.schemaless_reader(io.BytesIO(value), fastavro.parse_schema(ENVELOPE_SCHEMA))
    return record


def _avro(data: bytes, schema_text: str) -> dict[str, Any]:
    reader = io.BytesIO(data)
    record: dict[str, Any] = fastavro.schemaless_reader(reader, fastavro.parse_schema(json.loads(schema_text)))
    assert reader.read() == b"", "trailing bytes after the Avro record"
    return record


def _read(messages: list[Message], encoding: str) -> list[tuple[Message, str, dict[str, Any]]]:
    """(message, type, inner record) of every well-formed message, checked like a consumer with an MD cache would."""
    metadata: dict[str, dict[str, Any]] = {}
    read = []
    for message in messages:
        if message.is_malformed:
            continue
        assert message.value is not None
        envelope = _envelope(message.value, encoding)
        assert envelope["magic"] in ("atMSG", b"atMSG")
        assert envelope["headers"] is None
        inner = envelope["message"]
        if envelope["type"] == "MD":
            if encoding == "avro":
                inner = _avro(inner, envelope["messageSchema"])
            else:
                assert json.loads(envelope["messageSchema"])["name"] == "MetadataMessage"
            metadata[inner["schemaId"]] = inner
        else:
            assert envelope["type"] == "DT"
            md = metadata[envelope["messageSchemaId"]]  # qlik.md 1: the MD precedes its data messages
            if encoding == "avro":
                inner = _avro(inner, md["dataSchema"])
            columns = md["tableStructure"]["tableColumns"]
            assert list(inner["data"]) == sorted(columns, key=lambda name: columns[name]["ordinal"])
        read.append((message, envelope["type"], inner))
    return read


@pytest.mark.parametrize("format_name", FORMATS)
def test_renderer_is_registered_and_deterministic(history: SourceHistory, format_name: str) -> None:
    assert format_name in renderers()
    first = render_stream(format_name, history, SHAPE, seed=9)
    again = render_stream(format_name, history, SHAPE, seed=9)
    other = render_stream(format_name, history, SHAPE, seed=10)
    assert [(m.key, m.value, m.description) for m in first.messages] == [
        (m.key, m.value, m.description) for m in again.messages
    ]
    assert [m.value for m in first.messages] != [m.value for m in other.messages]
    assert first.keys == {}  # keys come from the MD messages
    assert first.format_options == {}


@pytest.mark.parametrize("format_name", FORMATS)
def test_every_message_parses_and_references_a_preceding_md(history: SourceHistory, format_name: str) -> None:
    encoding = format_name.removeprefix("qlik-")
    stream = render_stream(format_name, history, SHAPE, seed=9)
    read = _read(stream.messages, encoding)
    kinds = Counter(kind for _, kind, _ in read)
    # One MD per table version: every table that changed gets version 1, each ADD_COLUMN one more.
    changed_tables = {c.table.ident for c in history.changes if c.op != "TRUNCATE"}
    added = sum(1 for c in history.changes if c.op == "ADD_COLUMN")
    distinct_md = {inner["schemaId"] for _, kind, inner in read if kind == "MD"}
    assert len(distinct_md) == len(changed_tables) + added
    assert kinds["DT"] > 0
    operations = Counter(inner["headers"]["operation"] for _, kind, inner in read if kind == "DT")
    assert set(operations) == {"INSERT", "UPDATE", "DELETE", "REFRESH"}
    row_changes = sum(1 for c in history.changes if c.op in ("INSERT", "UPDATE", "DELETE"))
    originals = [inner for message, kind, inner in read if kind == "DT" and not message.is_resend]
    assert len(originals) == row_changes  # TRUNCATE has no data message (qlik.md 3)
    for inner in originals:
        headers = inner["headers"]
        if headers["operation"] == "REFRESH":
            assert headers["changeSequence"] == ""
            assert headers["columnMask"] is None
        else:
            assert len(headers["changeSequence"]) == 35
            assert headers["changeSequence"].isdigit()
            assert headers["transactionId"]
    sequences = [i["headers"]["changeSequence"] for i in originals if i["headers"]["changeSequence"]]
    assert sequences == sorted(sequences)
    assert len(set(sequences)) == len(sequences)
    last_events = [i for i in originals if i["headers"]["transactionLastEvent"]]
    assert 0 < len(last_events) < len(sequences)  # transactions of 1-5 changes


@pytest.mark.parametrize("format_name", FORMATS)
def test_masks_follow_the_md_ordinals(history: SourceHistory, format_name: str) -> None:
    encoding = format_name.removeprefix("qlik-")
    read = _read(render_stream(format_name, history, SHAPE, seed=9).messages, encoding)
    partial = 0
    for _, kind, inner in read:
        if kind != "DT" or inner["headers"]["operation"] == "REFRESH":
            continue
        raw = inner["headers"]["columnMask"]
        column_mask = bytes.fromhex(raw) if encoding == "json" else raw
        width = len(inner["data"])
        assert len(column_mask) == (width + 7) // 8
        captured = {n for n in range(1, width + 1) if column_mask[(n - 1) // 8] >> ((n - 1) % 8) & 1}
        if captured != set(range(1, width + 1)):
            partial += 1
            assert inner["headers"]["operation"] == "UPDATE"
            missing = [name for ordinal, name in enumerate(inner["data"], start=1) if ordinal not in captured]
            assert all(inner["data"][name] is None for name in missing)  # not captured: null, not a value
    assert partial > 0  # partial_updates renders Oracle-style updates with uncaptured columns
    assert mask({1, 2, 4}, 4) == bytes.fromhex("0B")  # qlik.md 4: the documented example
    assert mask(set(range(1, 10)), 9) == bytes.fromhex("FF01")  # first byte = ordinals 1-8


@pytest.mark.parametrize("format_name", FORMATS)
def test_resends_are_byte_copies_and_malformed_messages_do_not_parse(history: SourceHistory, format_name: str) -> None:
    encoding = format_name.removeprefix("qlik-")
    messages = render_stream(format_name, history, SHAPE, seed=9).messages
    originals = [m.value for m in messages if not m.is_resend and not m.is_malformed]
    resent = [m for m in messages if m.is_resend]
    assert len(resent) >= 5
    assert all(m.value in originals for m in resent)
    malformed = [m for m in messages if m.is_malformed]
    assert len(malformed) == SHAPE.malformed
    kinds = MALFORMED_AVRO if encoding == "avro" else MALFORMED_JSON
    assert {m.description.removeprefix("malformed: ") for m in malformed} == set(kinds)
    for message in malformed:
        assert message.value is not None
        assert message.value not in originals
        kind = message.description.removeprefix("malformed: ")
        if kind == "not json":
            with pytest.raises(ValueError):
                json.loads(message.value)
        elif kind == "unknown operation FROBNICATE":
            assert json.loads(message.value)["message"]["headers"]["operation"] == "FROBNICATE"
        elif kind == "INT8 value 'abc'":
            assert "abc" in json.loads(message.value)["message"]["data"].values()
        elif kind == "unknown messageSchemaId":
            schema_ids = {_envelope(m, "avro")["messageSchemaId"] for m in originals if m is not None}
            assert _envelope(message.value, "avro")["messageSchemaId"] not in schema_ids
        elif kind == "wrong magic":
            assert message.value.startswith(b"atMSX")
        elif kind in ("truncated envelope", "truncated json"):
            assert any(o is not None and o.startswith(message.value) and o != message.value for o in originals)
        else:  # not an envelope: unreadable, or not the atMSG magic
            try:
                magic = _envelope(message.value, "avro")["magic"]
            except (ValueError, EOFError, UnicodeDecodeError):
                magic = None
            assert magic != b"atMSG"


def test_values_as_replicate_writes_them_in_json(history: SourceHistory) -> None:
    read = _read(render_stream("qlik-json", history, SHAPE, seed=9).messages, "json")
    md = next(inner for _, kind, inner in read if kind == "MD" and inner["lineage"]["table"] == "customer")
    columns = md["tableStructure"]["tableColumns"]
    assert columns["id"] == {
        "ordinal": 1, "type": "INT8", "length": 0, "precision": 19, "scale": 0, "primaryKeyPosition": 1,
        "nullable": False,
    }  # fmt: skip
    assert {name: c["type"] for name, c in columns.items()} == {
        "id": "INT8", "name": "WSTRING", "avatar": "BYTES", "vip": "BOOLEAN", "score": "REAL8",
        "updated_at": "DATETIME", "note": "WSTRING",
    }  # fmt: skip
    rows = [i["data"] for _, kind, i in read if kind == "DT" and i["data"].keys() == columns.keys()]
    avatars = [r["avatar"] for r in rows if r["avatar"]]
    assert avatars
    assert all(a == a.upper() and bytes.fromhex(a) is not None for a in avatars)  # BYTES as hex digits
    stamps = [r["updated_at"] for r in rows if r["updated_at"]]
    assert all(datetime.strptime(s, "%Y-%m-%d %H:%M:%S.%f") for s in stamps)  # DATETIME wall clock
    oracle = {inner["lineage"]["schema"] for _, kind, inner in read if kind == "MD"}
    assert "SALES" in oracle  # Oracle tables are named by their schema


def test_capture_lines_round_trip(history: SourceHistory) -> None:
    avro = render_stream("qlik-avro", history, SHAPE, seed=9).messages
    lines = to_lines(avro, binary=True).splitlines()
    assert [base64.b64decode(line) for line in lines] == [m.value for m in avro]
    text = to_lines(render_stream("qlik-json", history, SHAPE, seed=9).messages).splitlines()
    assert len(text) == len(render_stream("qlik-json", history, SHAPE, seed=9).messages)


def test_change_sequence_is_35_digits_in_time_order() -> None:
    early = change_sequence(1_709_288_131_250, 42)
    assert early == "2024030110153125" + "0000000000000000042"
    assert change_sequence(1_709_288_131_250, 43) > early
    assert change_sequence(1_709_288_131_260, 1) > early


def test_expected_keeps_truncated_rows_and_merges_identical_keyless_rows(history: SourceHistory) -> None:
    truth = history.truth()
    expected = render_stream("qlik-json", history, SHAPE, seed=9).expected_truth(history)
    assert expected == lake_truth(history)
    truncated = {c.table.ident for c in history.changes if c.op == "TRUNCATE"}
    assert truncated
    for spec in history.tables:
        ident = (spec.schema or spec.database, spec.table)
        rows, source = expected[ident], truth[spec.ident]
        if spec.ident not in truncated and spec.primary_key:
            assert sorted(map(repr, rows)) == sorted(map(repr, source))
        if not spec.primary_key:
            assert len({repr(r) for r in rows}) == len(rows)  # full-row identity: no duplicates
    extra = 0
    for spec in history.tables:
        if spec.ident in truncated and spec.primary_key:
            rows = {repr(r) for r in expected[(spec.schema or spec.database, spec.table)]}
            assert {repr(r) for r in truth[spec.ident]} <= rows  # the rows a TRUNCATE removed stay
            extra += len(rows) - len(truth[spec.ident])
    assert extra > 0
