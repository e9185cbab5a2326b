"""Tests of the Debezium, Lindorm, Maxwell and OGG workload renderers (pure Python, no Spark).

Besides the stream properties (deterministic, parseable, byte-identical re-sends, increasing positions, keys), each
format gets a small independent reader that applies the messages the way the apply engine does (keys, positions,
changed-only images, truncates) and must end with exactly what the renderer's ``expected`` says the lake holds.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from cdclake.workload import HistoryConfig, Message, RenderedStream, RenderOptions, SourceHistory, render_stream
from cdclake.workload._open_common import java_double, json_text, lake_state
from cdclake.workload.history import INT64_MAX, INT64_MIN, ms_to_datetime

FORMATS = ("debezium-json", "lindorm-debezium", "maxwell-json", "ogg-json")
Row = dict[str, Any]
Truth = dict[tuple[str, str], list[Row]]

RICH = HistoryConfig(
    seed=11,
    tables=5,
    events=900,
    keys_per_table=30,
    keyless_tables=2,
    truncates=2,
    added_columns=3,
    oracle_tables=1,
    null_ratio=0.2,
)
SHAPE = RenderOptions(heartbeat_every=25, resends=3, malformed=4, transactions=True, partial_updates=True)
PLAIN = RenderOptions(heartbeat_every=0, resends=0, malformed=0, transactions=False, partial_updates=False)


@pytest.fixture(scope="module")
def rich() -> SourceHistory:
    return SourceHistory.generate(RICH)


@pytest.fixture(scope="module")
def streams(rich: SourceHistory) -> dict[str, RenderedStream]:
    return {name: render_stream(name, rich, SHAPE, seed=3) for name in FORMATS}


def data_messages(stream: RenderedStream) -> list[Message]:
    return [m for m in stream.messages if m.value is not None and not m.is_malformed and not m.is_resend]


# ----------------------------------------------------------------------------------------------------------------
# JSON text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (100.0, "100.0"),
        (0.001, "0.001"),
        (9.9e-4, "9.9E-4"),
        (9999999.0, "9999999.0"),
        (1e7, "1.0E7"),
        (1e16, "1.0E16"),
        (-1e300, "-1.0E300"),
        (1.5e-7, "1.5E-7"),
        (1.7976931348623157e308, "1.7976931348623157E308"),
        (5e-324, "5.0E-324"),
        (9007199254740993.0, "9.007199254740992E15"),
        (123456.789, "123456.789"),
    ],
)
def test_doubles_are_written_in_java_layout_and_parse_back_exactly(value: float, text: str) -> None:
    assert java_double(value) == text
    assert float(text) == value
    assert math.copysign(1.0, float(text)) == math.copysign(1.0, value)


def test_json_text_keeps_integers_exact_and_escapes_control_characters() -> None:
    text = json_text({"min": INT64_MIN, "max": INT64_MAX, "s": 'a\u0000b\nc"ü', "f": 2.5, "b": True, "n": None})
    assert (
        text
        == '{"min":-9223372036854775808,"max":9223372036854775807,"s":"a\\u0000b\\nc\\"ü","f":2.5,"b":true,"n":null}'
    )
    assert json.loads(text)["min"] == INT64_MIN


# ----------------------------------------------------------------------------------------------------------------
# Stream properties


@pytest.mark.parametrize("name", FORMATS)
def test_rendering_is_deterministic(rich: SourceHistory, name: str) -> None:
    first = render_stream(name, rich, SHAPE, seed=3)
    again = render_stream(name, rich, SHAPE, seed=3)
    other = render_stream(name, rich, SHAPE, seed=4)
    assert [(m.key, m.value, m.description) for m in first.messages] == [
        (m.key, m.value, m.description) for m in again.messages
    ]
    assert [m.value for m in first.messages] != [m.value for m in other.messages]


@pytest.mark.parametrize("name", FORMATS)
def test_every_message_is_one_json_line_and_the_malformed_ones_are_marked(
    streams: dict[str, RenderedStream], name: str
) -> None:
    stream = streams[name]
    malformed = [m for m in stream.messages if m.is_malformed]
    assert len(malformed) == SHAPE.malformed
    for message in stream.messages:
        if message.value is None:
            assert name == "debezium-json"
            assert message.description.startswith("tombstone ")
            continue
        text = message.value.decode("utf-8")
        assert "\n" not in text
        assert "\r" not in text
        if not message.is_malformed:
            assert isinstance(json.loads(text), dict), message.description
    kinds = {m.description for m in malformed}
    assert "malformed: truncated json" in kinds
    assert "malformed: not json" in kinds
    for message in malformed:
        assert message.value is not None
        try:
            parsed = json.loads(message.value)
        except ValueError:
            continue
        assert message.description not in ("malformed: truncated json", "malformed: not json")
        assert isinstance(parsed, dict)


@pytest.mark.parametrize("name", FORMATS)
def test_resends_are_byte_copies_of_earlier_messages(streams: dict[str, RenderedStream], name: str) -> None:
    stream = streams[name]
    seen: set[tuple[bytes | None, bytes | None]] = set()
    resends = 0
    for message in stream.messages:
        if message.is_resend:
            resends += 1
            assert (message.key, message.value) in seen, message.description
        seen.add((message.key, message.value))
    assert resends >= 5 * SHAPE.resends


def _debezium_position(value: dict[str, Any]) -> tuple[int, ...] | None:
    payload = value.get("payload", {})
    source = payload.get("source") if isinstance(payload, dict) else None
    if not source:
        return None
    if source["connector"] == "oracle":
        return (1, int(source["commit_scn"]), int(source["scn"]))
    return (0, int(source["file"].rsplit(".", 1)[1]), source["pos"], source["row"])


def _maxwell_position(value: dict[str, Any]) -> tuple[int, ...] | None:
    file, offset = value["position"].rsplit(":", 1)
    return (int(file.rsplit(".", 1)[1]), int(offset), value.get("xoffset", 0))


def _ogg_position(value: dict[str, Any]) -> tuple[int, ...] | None:
    assert len(value["pos"]) == 20
    return (int(value["pos"]),)


@pytest.mark.parametrize(
    ("name", "position"),
    [("debezium-json", _debezium_position), ("maxwell-json", _maxwell_position), ("ogg-json", _ogg_position)],
)
def test_positions_increase_in_stream_order(
    streams: dict[str, RenderedStream], name: str, position: Callable[[dict[str, Any]], tuple[int, ...] | None]
) -> None:
    by_connector: dict[int, list[tuple[int, ...]]] = {}
    for message in data_messages(streams[name]):
        assert message.value is not None
        found = position(json.loads(message.value))
        if found is not None:
            by_connector.setdefault(found[0] if name == "debezium-json" else 0, []).append(found)
    assert by_connector
    for positions in by_connector.values():
        assert len(positions) > 50
        assert all(a < b for a, b in itertools.pairwise(positions))
    if name == "maxwell-json":  # the binlog rotated at least once
        assert len({p[0] for p in by_connector[0]}) > 1


def test_lindorm_mutation_times_do_not_go_back(streams: dict[str, RenderedStream]) -> None:
    times = [json.loads(m.value)["payload"]["source"]["ts_ms"] for m in data_messages(streams["lindorm-debezium"])]  # type: ignore[arg-type]
    assert len(times) > 50
    assert times == sorted(times)


def test_keys_are_returned_where_the_messages_lack_them(
    rich: SourceHistory, streams: dict[str, RenderedStream]
) -> None:
    keyed = {t.qualified_name: t.primary_key for t in rich.tables if t.primary_key}
    assert streams["debezium-json"].keys == keyed  # in the Kafka key only, which capture files do not keep
    assert streams["lindorm-debezium"].keys == keyed  # the format carries no keys
    assert streams["maxwell-json"].keys == {}
    assert streams["ogg-json"].keys == {}
    for name, field in (("maxwell-json", "primary_key_columns"), ("ogg-json", "primary_keys")):
        for message in data_messages(streams[name]):
            value = json.loads(message.value)  # type: ignore[arg-type]
            if field in value:
                table = value["table"].split(".")
                expected = next(t.primary_key for t in rich.tables if t.table == table[-1])
                assert value[field] == expected


def test_debezium_kafka_keys_carry_the_primary_key_and_deletes_are_followed_by_tombstones(
    streams: dict[str, RenderedStream],
) -> None:
    messages = streams["debezium-json"].messages
    deletes = 0
    for i, message in enumerate(messages):
        if message.description.startswith("d ") and message.key is not None:
            deletes += 1
            assert messages[i + 1].value is None
            assert messages[i + 1].key == message.key
            key = json.loads(message.key)
            assert key["schema"]["name"].endswith(".Key")
            assert set(key["payload"]) in ({"id"}, {"ID"})
    assert deletes > 5


def test_every_change_kind_is_rendered(streams: dict[str, RenderedStream]) -> None:
    def kinds(name: str) -> set[str]:
        return {m.description.split(" ")[0] for m in data_messages(streams[name])}

    assert {"c", "u", "d", "t", "ddl", "heartbeat", "transaction"} <= kinds("debezium-json")
    assert kinds("lindorm-debezium") == {"c", "u", "d"}
    assert kinds("maxwell-json") == {"insert", "update", "delete", "table-alter"}
    assert kinds("ogg-json") == {"I", "U", "D", "T"}


def test_partial_updates_are_changed_only(rich: SourceHistory, streams: dict[str, RenderedStream]) -> None:
    width = {t.table: len(t.columns) for t in rich.tables}

    def payloads(name: str, prefix: str) -> list[dict[str, Any]]:
        return [json.loads(m.value) for m in data_messages(streams[name]) if m.description.startswith(prefix)]  # type: ignore[arg-type]

    placeholder = base64.b64encode(b"__debezium_unavailable_value").decode()
    debezium = [v["payload"] for v in payloads("debezium-json", "u ")]
    assert any(placeholder in p["after"].values() and placeholder in p["before"].values() for p in debezium)
    ogg = [v for v in payloads("ogg-json", "U ") if v["primary_keys"]]
    assert all(set(v["after"]) == set(v["before"]) >= set(v["primary_keys"]) for v in ogg)
    assert any(len(v["after"]) < width[v["table"].split(".")[-1]] for v in ogg)
    assert all(set(v["before"]) == set(v["primary_keys"]) for v in payloads("ogg-json", "D ") if v["primary_keys"])
    maxwell = payloads("maxwell-json", "update ")
    assert all(set(v["old"]) <= set(v["data"]) and v["old"] for v in maxwell)
    assert any(len(v["old"]) < len(v["data"]) - 1 for v in maxwell)


def test_extreme_values_are_written_exactly(rich: SourceHistory, streams: dict[str, RenderedStream]) -> None:
    keyed_mysql = {t.ident for t in rich.tables if t.primary_key and t.db_type == "MySQL"}
    longs = {
        v
        for c in rich.changes
        if c.table.ident in keyed_mysql
        for row in (c.before, c.after)
        if row
        for v in row.values()
        if type(v) is int
    }
    extremes = longs & {INT64_MIN, INT64_MAX, 2**53 + 1}
    assert extremes
    for name in FORMATS:
        text = b"\n".join(m.value for m in data_messages(streams[name]) if m.value is not None).decode()
        for value in extremes:
            assert str(value) in text, (name, value)


# ----------------------------------------------------------------------------------------------------------------
# Independent readers: messages -> lake state under the apply engine's rules


@dataclass
class Event:
    table: tuple[str, str]
    op: str  # INSERT UPDATE DELETE TRUNCATE
    keys: list[str]
    before: Row | None
    after: Row | None
    after_is_partial: bool
    position: tuple[Any, ...] | None


def _ms(value: int) -> datetime:
    return ms_to_datetime(value)


def read_debezium(message: Message) -> Event | None:
    value = json.loads(message.value)  # type: ignore[arg-type]
    payload = value["payload"]
    if "op" not in payload:
        return None
    source = payload["source"]
    fields = {f["field"]: f for f in value["schema"]["fields"][0]["fields"]}
    placeholder = base64.b64encode(b"__debezium_unavailable_value").decode()

    def typed(name: str, raw: Any) -> Any:
        field = fields[name]
        if raw is None:
            return None
        logical = field.get("name")
        if logical == "org.apache.kafka.connect.data.Decimal":
            return Decimal(int.from_bytes(base64.b64decode(raw), "big", signed=True))
        if logical == "io.debezium.time.ZonedTimestamp":
            return datetime.fromisoformat(raw.replace("Z", "+00:00")).astimezone(UTC)
        if logical == "io.debezium.time.Timestamp":
            return _ms(raw)
        if field["type"] == "bytes":
            return base64.b64decode(raw)
        if field["type"] == "float64":
            return float(raw)
        return raw

    def image(raw: Row | None) -> tuple[Row | None, bool]:
        if raw is None:
            return None, False
        kept = {k: typed(k, v) for k, v in raw.items() if v != placeholder}
        return kept, len(kept) < len(raw)

    op = {"c": "INSERT", "u": "UPDATE", "d": "DELETE", "t": "TRUNCATE"}[payload["op"]]
    before, _ = image(payload["before"])
    after, partial = image(payload["after"])
    return Event((source["db"], source["table"]), op, [], before, after, partial, _debezium_position(value))


def read_lindorm(message: Message) -> Event | None:
    value = json.loads(message.value)  # type: ignore[arg-type]
    payload = value["payload"]
    schema = {f["field"]: f for f in value["schema"]["fields"]}
    types = {f["field"]: f["type"] for which in ("before", "after") for f in schema[which]["fields"]}

    def image(raw: Row | None) -> Row | None:
        if raw is None:
            return None
        return {k: base64.b64decode(v) if types[k] == "bytes" else v for k, v in raw.items()}

    op = {"c": "INSERT", "u": "UPDATE", "d": "DELETE"}[payload["op"]]
    source = payload["source"]
    return Event(
        (source["namespace"], source["table"]), op, [], image(payload["before"]), image(payload["after"]), False, None
    )


def read_maxwell(message: Message) -> Event | None:
    value = json.loads(message.value)  # type: ignore[arg-type]
    if value["type"] not in ("insert", "update", "delete"):
        return None
    data, old = value["data"], value.get("old", {})
    op = value["type"].upper()
    before = {**data, **old} if op != "INSERT" else None
    after = data if op != "DELETE" else None
    table = (value["database"], value["table"])
    return Event(table, op, value["primary_key_columns"], before, after, False, _maxwell_position(value))


def read_ogg(message: Message) -> Event | None:
    value = json.loads(message.value)  # type: ignore[arg-type]
    parts = value["table"].split(".")
    op = {"I": "INSERT", "U": "UPDATE", "D": "DELETE", "T": "TRUNCATE"}[value["op_type"]]
    return Event(
        (parts[0], parts[-1]),
        op,
        value.get("primary_keys", []),
        value.get("before"),
        value.get("after"),
        op == "UPDATE",
        _ogg_position(value),
    )


READERS: dict[str, Callable[[Message], Event | None]] = {
    "debezium-json": read_debezium,
    "lindorm-debezium": read_lindorm,
    "maxwell-json": read_maxwell,
    "ogg-json": read_ogg,
}


def apply_events(
    events: list[Event], configured: dict[str, list[str]], columns: dict[tuple[str, str], list[str]]
) -> Truth:
    """The engine's rules: configured keys, else the message's, else the full image; changes in position order (a
    re-sent position applies once); a partial image overlays the stored row; a truncate clears the table."""
    positioned = all(e.position is not None for e in events)
    if positioned:
        unique = {e.position: e for e in events}
        events = [unique[p] for p in sorted(unique)]  # type: ignore[type-var]
    state: dict[tuple[str, str], dict[tuple[Any, ...], Row]] = {ident: {} for ident in columns}
    for event in events:
        rows = state.setdefault(event.table, {})
        names = columns[event.table]
        keys = configured.get(".".join(event.table)) or event.keys or names

        def identity(image: Row, keys: list[str] = keys) -> tuple[Any, ...]:
            return tuple(repr(image.get(k)) for k in keys)

        if event.op == "TRUNCATE":
            rows.clear()
            continue
        if event.before is not None and (event.after is None or identity(event.before) != identity(event.after)):
            rows.pop(identity(event.before), None)
        if event.after is not None:
            stored = rows.get(identity(event.after), {}) if event.after_is_partial else {}
            rows[identity(event.after)] = {**stored, **event.after}
    return {ident: [{n: row.get(n) for n in columns[ident]} for row in rows.values()] for ident, rows in state.items()}


def canonical(rows: list[Row]) -> list[str]:
    return sorted(repr(sorted(row.items())) for row in rows)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("shape", [SHAPE, PLAIN], ids=["traps", "plain"])
def test_messages_applied_independently_end_as_the_expected_lake(
    rich: SourceHistory, name: str, shape: RenderOptions
) -> None:
    stream = render_stream(name, rich, shape, seed=3)
    expected = stream.expected_truth(rich)
    columns = {t.ident: t.column_names() for t in rich.tables if t.ident in expected}
    events = [e for m in stream.messages if m.value is not None and not m.is_malformed for e in [READERS[name](m)] if e]
    actual = apply_events(events, stream.keys, columns)
    assert set(actual) == set(expected)
    for ident, rows in expected.items():
        assert canonical(actual[ident]) == canonical(rows), ident
    assert sum(len(rows) for rows in expected.values()) > 20


def test_expected_differs_from_the_truth_only_where_documented(rich: SourceHistory) -> None:
    truth = rich.truth()
    engine = lake_state(rich)  # full-image identity for key-less tables, nothing else
    keyed = {t.ident for t in rich.tables if t.primary_key}
    for ident in keyed:
        assert canonical(engine[ident]) == canonical(truth[ident])
    debezium = render_stream("debezium-json", rich, SHAPE, seed=3).expected_truth(rich)
    oracle = next(t for t in rich.tables if t.db_type == "Oracle")
    assert all(isinstance(r["ID"], Decimal) for r in debezium[oracle.ident])
    maxwell = render_stream("maxwell-json", rich, SHAPE, seed=3).expected_truth(rich)
    assert oracle.ident not in maxwell
    customer = maxwell[("crm", "customer")]
    assert all(r["vip"] in (0, 1, None) and not isinstance(r["vip"], bool) for r in customer)
    assert all(r["updated_at"] is None or len(r["updated_at"]) == 23 for r in customer)
    lindorm = render_stream("lindorm-debezium", rich, SHAPE, seed=3).expected_truth(rich)
    assert all(t.primary_key for t in rich.tables if t.ident in lindorm)


def test_debezium_key_updates_name_each_others_key_in_their_headers() -> None:
    """debezium.md 2: a primary-key update is a ``d`` with the ``__debezium.newkey`` header (the new key) and a
    ``c`` with ``__debezium.oldkey`` (the old key), each holding the key as the Kafka key is written. Re-sent copies
    keep them; no other message has headers."""
    config = HistoryConfig(seed=3, tables=2, events=200, keys_per_table=12, keyless_tables=1, key_update_ratio=0.5)
    stream = render_stream("debezium-json", SourceHistory.generate(config), RenderOptions(resends=2), seed=5)
    messages = stream.messages
    linked = [i for i, m in enumerate(messages) if m.headers and not m.is_resend]
    assert len(linked) >= 10
    for i in linked:
        message = messages[i]
        if message.description.startswith("d "):
            # the d, its tombstone (no headers), then the c of the new key, which names the d's key
            assert message.headers == (("__debezium.newkey", messages[i + 2].key),)
            assert messages[i + 1].value is None
            assert not messages[i + 1].headers
            assert messages[i + 2].headers == (("__debezium.oldkey", message.key),)
        else:
            assert message.description.startswith("c ")
            assert messages[i - 2].headers == (("__debezium.newkey", message.key),)
    originals = {(m.key, m.value): m.headers for m in messages if not m.is_resend}
    resent = [m for m in messages if m.is_resend and originals[(m.key, m.value)]]
    assert resent
    assert all(originals[(m.key, m.value)] == m.headers for m in resent)
    assert all(m.description.removeprefix("resend: ").split(" ")[0] in ("c", "d") for m in messages if m.headers)
