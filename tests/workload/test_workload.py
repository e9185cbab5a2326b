"""Tests of the source-history simulator and its DataWorks rendering (pure Python, no Spark)."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import itertools
import json
import math
import random
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from cdclake.workload import (
    Change,
    DataWorksOptions,
    HistoryConfig,
    Message,
    SourceHistory,
    render,
    render_change,
    to_b64_lines,
    to_jsonl,
)
from cdclake.workload.dataworks import (
    HIDDEN_ROW_ID,
    MALFORMED_KINDS,
    ORACLE_ROWID,
    UpdateMode,
    fake_oracle_rowid,
)
from cdclake.workload.history import INT64_MAX, INT64_MIN, ms_to_datetime

Row = dict[str, Any]
Truth = dict[tuple[str, str], list[Row]]

RICH = HistoryConfig(
    seed=11,
    tables=5,
    events=1500,
    keys_per_table=30,
    keyless_tables=2,
    truncates=2,
    added_columns=3,
    oracle_tables=1,
)
"""A history exercising every feature."""

ROW_OPS = {"INSERT", "UPDATE_BEFOR", "UPDATE_AFTER", "DELETE"}
KNOWN_OPS = ROW_OPS | {"TRUNCATE", "ALTER", "MHEARTBEAT", "TRANSACTION_BEGIN", "TRANSACTION_END"}
TYPES = {"LONG", "STRING", "BYTES", "BOOLEAN", "DOUBLE", "DATE"}


@pytest.fixture(scope="module")
def rich() -> SourceHistory:
    return SourceHistory.generate(RICH)


# ------------------------------------------------------------------------------------------------------------
# Helpers: an independent apply of the changes, and a strict DataWorks decoder + apply


def canonical(rows: list[Row]) -> list[str]:
    """Order-independent, type-preserving form of a list of rows (multiset comparison)."""
    return sorted(repr(sorted(row.items())) for row in rows)


def assert_same_truth(actual: Truth, expected: Truth) -> None:
    assert set(actual) <= set(expected)
    for ident, rows in expected.items():
        got = actual.get(ident, [])
        assert len(got) == len(rows), ident
        assert canonical(got) == canonical(rows), ident


def apply_changes(history: SourceHistory) -> Truth:
    """Replays the history's changes independently: state by pk or row id, last writer wins by sequence."""
    shuffled = list(history.changes)
    random.Random(5).shuffle(shuffled)
    state: dict[tuple[str, str], dict[Any, Row]] = {t.ident: {} for t in history.tables}
    columns: dict[tuple[str, str], list[str]] = {}
    for change in sorted(shuffled, key=lambda c: c.sequence):
        ident = (change.table.database, change.table.table)
        columns[ident] = [c.name for c in change.table.columns]
        rows = state[ident]
        if change.op == "TRUNCATE":
            rows.clear()
        elif change.op == "ADD_COLUMN":
            pass
        else:
            image = change.after or change.before
            assert image is not None
            key = tuple(image[k] for k in change.table.primary_key) if change.table.primary_key else change.row_id
            assert key is not None
            if change.op == "DELETE":
                del rows[key]
            elif change.op == "INSERT":
                assert key not in rows, f"insert of existing row {key}"
                rows[key] = dict(image)
            else:
                assert change.before is not None
                assert rows[key] == {n: change.before.get(n) for n in rows[key]}, "before image mismatch"
                rows[key] = dict(image)
    return {
        ident: [{n: r.get(n) for n in columns.get(ident, history.table(*ident).column_names())} for r in rows.values()]
        for ident, rows in state.items()
    }


class RejectedError(Exception):
    """The strict decoder refused a message."""


def decode_value(type_: str, value: Any) -> Any:
    """Decodes one DataWorks JSON value strictly; raises RejectedError on a type mismatch."""
    if value is None:
        return None
    if type_ == "LONG":
        if not isinstance(value, int) or isinstance(value, bool) or not INT64_MIN <= value <= INT64_MAX:
            raise RejectedError(f"bad LONG {value!r}")
        return value
    if type_ == "STRING":
        if not isinstance(value, str):
            raise RejectedError(f"bad STRING {value!r}")
        return value
    if type_ == "BYTES":
        if not isinstance(value, str):
            raise RejectedError(f"bad BYTES {value!r}")
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error as exc:
            raise RejectedError(f"bad base64 {value!r}") from exc
    if type_ == "BOOLEAN":
        if not isinstance(value, bool):
            raise RejectedError(f"bad BOOLEAN {value!r}")
        return value
    if type_ == "DOUBLE":
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise RejectedError(f"bad DOUBLE {value!r}")
        return float(value)
    if type_ == "DATE":
        if not isinstance(value, int) or isinstance(value, bool) or len(str(value)) != 13:
            raise RejectedError(f"bad DATE {value!r}")
        return ms_to_datetime(value)
    raise RejectedError(f"unknown type {type_!r}")


def parse(message: Message) -> dict[str, Any]:
    """Parses and validates one message; raises RejectedError unless it is a well-formed DataWorks message."""
    if message.value is None:
        raise RejectedError("tombstone")
    try:
        obj = json.loads(message.value.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RejectedError("not json") from exc
    if not isinstance(obj, dict) or set(obj) != {"schema", "payload", "version"}:
        raise RejectedError("not an envelope")
    schema, payload = obj["schema"], obj["payload"]
    if set(schema) != {"dataColumn", "primaryKey", "source"}:
        raise RejectedError("bad schema")
    if not {"before", "after", "sequenceId", "timestamp", "op", "ddl"} <= set(payload):
        raise RejectedError("bad payload")
    op = payload["op"]
    if op not in KNOWN_OPS:
        raise RejectedError(f"unknown op {op!r}")
    ts = payload["timestamp"]
    if not isinstance(ts["eventTime"], int) or not isinstance(ts["checkpointTime"], int):
        raise RejectedError("bad timestamp")
    if op in ("MHEARTBEAT", "TRANSACTION_BEGIN", "TRANSACTION_END"):
        if schema != {"dataColumn": None, "primaryKey": None, "source": None} or payload["sequenceId"] is not None:
            raise RejectedError("bad control message")
        expected_version = "0.0.1" if op == "MHEARTBEAT" else "1.0.0"
        if obj["version"] != expected_version:
            raise RejectedError("bad version")
        return obj
    if obj["version"] != "1.0.0" or not isinstance(payload["sequenceId"], str):
        raise RejectedError("bad version or sequenceId")
    if not payload["sequenceId"].isdigit():
        raise RejectedError("bad sequenceId")
    types = {c["name"]: c["type"] for c in schema["dataColumn"]}
    if not set(types.values()) <= TYPES:
        raise RejectedError("bad column type")
    source = schema["source"]
    if set(source) != {"dbType", "dbVersion", "dbName", "schemaName", "tableName"}:
        raise RejectedError("bad source")
    before, after = payload["before"], payload["after"]
    shapes = {
        "INSERT": (False, True),
        "UPDATE_BEFOR": (True, False),
        "DELETE": (True, False),
        "TRUNCATE": (False, False),
        "ALTER": (False, False),
    }
    if op in shapes and ((before is not None), (after is not None)) != shapes[op]:
        raise RejectedError(f"bad images for {op}")
    if op == "UPDATE_AFTER" and after is None:
        raise RejectedError("UPDATE_AFTER without after")
    if op in ("TRUNCATE", "ALTER"):
        if not isinstance(payload["ddl"], dict) or set(payload["ddl"]) != {"text", "ddlMeta"}:
            raise RejectedError("bad ddl")
    elif payload["ddl"] is not None:
        raise RejectedError("ddl on a row message")
    for image in (before, after):
        if image is None:
            continue
        if set(image) != {"dataColumn"} or set(image["dataColumn"]) != set(types):
            raise RejectedError("image columns differ from schema")
        image["dataColumn"] = {n: decode_value(types[n], v) for n, v in image["dataColumn"].items()}
    return obj


def decode_stream(messages: list[Message]) -> tuple[Truth, list[int]]:
    """Applies a DataWorks stream: dedupe by (table, sequenceId, op), upsert by pk or hidden row id.

    Returns:
        The final tables (user columns only) and the indexes of the rejected messages.
    """
    tables: dict[tuple[str, str], dict[Any, Row]] = {}
    columns: dict[tuple[str, str], list[str]] = {}
    seen: set[tuple[str, str, str, str]] = set()
    rejected: list[int] = []
    pending_before: dict[tuple[tuple[str, str], str], Row] = {}
    for i, message in enumerate(messages):
        try:
            obj = parse(message)
        except RejectedError:
            rejected.append(i)
            continue
        payload, schema = obj["payload"], obj["schema"]
        op = payload["op"]
        if op in ("MHEARTBEAT", "TRANSACTION_BEGIN", "TRANSACTION_END"):
            continue
        source = schema["source"]
        ident = (source["dbName"], source["tableName"])
        dedupe = (*ident, payload["sequenceId"], op)
        if dedupe in seen:
            continue
        seen.add(dedupe)
        names = [c["name"] for c in schema["dataColumn"] if c["name"] not in (HIDDEN_ROW_ID, ORACLE_ROWID)]
        columns[ident] = names
        rows = tables.setdefault(ident, {})
        pk = schema["primaryKey"]

        def identity(image: Row, pk: list[str] | None = pk) -> Any:
            return tuple(image[k] for k in pk) if pk else image[HIDDEN_ROW_ID]

        before = payload["before"]["dataColumn"] if payload["before"] else None
        after = payload["after"]["dataColumn"] if payload["after"] else None
        if op == "TRUNCATE":
            rows.clear()
        elif op == "ALTER":
            for row in rows.values():
                for name in names:
                    row.setdefault(name, None)
        elif op == "UPDATE_BEFOR":
            assert before is not None
            pending_before[(ident, payload["sequenceId"])] = before
        elif op == "DELETE":
            assert before is not None
            rows.pop(identity(before), None)
        else:  # INSERT, UPDATE_AFTER
            assert after is not None
            if op == "UPDATE_AFTER":
                old = before if before is not None else pending_before.pop((ident, payload["sequenceId"]), None)
                if old is not None and identity(old) != identity(after):
                    rows.pop(identity(old), None)
            rows[identity(after)] = dict(after)
    truth = {
        ident: [{n: row.get(n) for n in columns[ident]} for row in rows.values()] for ident, rows in tables.items()
    }
    return truth, rejected


def well_formed(messages: list[Message]) -> list[tuple[Message, dict[str, Any]]]:
    return [(m, parse(m)) for m in messages if not m.is_malformed]


# ------------------------------------------------------------------------------------------------------------
# History


def test_history_is_deterministic() -> None:
    a = SourceHistory.generate(RICH)
    b = SourceHistory.generate(dataclasses.replace(RICH))
    assert a.changes == b.changes
    assert a.tables == b.tables
    assert a.truth() == b.truth()
    c = SourceHistory.generate(dataclasses.replace(RICH, seed=12))
    assert a.changes != c.changes


def test_history_sequence_and_time(rich: SourceHistory) -> None:
    sequences = [c.sequence for c in rich.changes]
    assert all(x < y for x, y in itertools.pairwise(sequences))
    assert all(INT64_MIN <= s <= INT64_MAX for s in sequences)
    times = [c.event_time_ms for c in rich.changes]
    assert all(x <= y for x, y in itertools.pairwise(times))
    assert times[0] == RICH.start_time_ms
    assert len(rich.changes) == RICH.events + RICH.truncates + RICH.added_columns


def test_history_tables(rich: SourceHistory) -> None:
    assert len(rich.tables) == RICH.tables + RICH.oracle_tables
    assert sum(not t.primary_key for t in rich.tables) == RICH.keyless_tables
    kinds = set()
    for table in rich.tables:
        assert 4 <= len(table.columns) <= 8 + RICH.added_columns
        kinds |= {c.kind for c in table.columns}
        if table.primary_key:
            pk = table.primary_key[0]
            assert pk.lower() == "id"
            assert [c.kind for c in table.columns if c.name == pk] == ["long"]
    assert kinds == {"long", "string", "bytes", "boolean", "double", "timestamp"}
    assert {t.database for t in rich.tables} >= {"crm", "shop"}
    oracle = [t for t in rich.tables if t.db_type == "Oracle"]
    assert len(oracle) == 1
    assert oracle[0].schema is not None


def test_history_values_cover_edge_cases(rich: SourceHistory) -> None:
    values: dict[str, list[Any]] = {}
    nulls = 0
    for change in rich.changes:
        for image in (change.before, change.after):
            if image is None:
                continue
            assert set(image) == set(change.table.column_names())
            for col in change.table.columns:
                value = image[col.name]
                if value is None:
                    nulls += 1
                    assert col.name not in change.table.primary_key
                    continue
                values.setdefault(col.kind, []).append(value)
    assert nulls > 0
    longs = values["long"]
    assert all(type(v) is int and INT64_MIN <= v <= INT64_MAX for v in longs)
    assert any(v > 2**53 for v in longs)
    assert any(v < 0 for v in longs)
    strings = values["string"]
    assert all(isinstance(v, str) for v in strings)
    assert "" in strings
    assert "Zoë 张三 ✓" in strings
    assert any('"' in v for v in strings)
    assert any("\\" in v for v in strings)
    assert any("\n" in v for v in strings)
    assert not any(ch in v for v in strings for ch in "\u2028\u2029\x85")
    assert all(isinstance(v, bytes) for v in values["bytes"])
    assert b"" in values["bytes"]
    assert all(isinstance(v, bool) for v in values["boolean"])
    doubles = values["double"]
    assert all(type(v) is float and math.isfinite(v) for v in doubles)
    assert {0.1, -1e300, 1.5e-7} <= set(doubles)
    for ts in values["timestamp"]:
        assert isinstance(ts, datetime)
        assert ts.tzinfo == UTC
        assert ts.microsecond % 1000 == 0


def test_history_ops(rich: SourceHistory) -> None:
    ops = Counter(c.op for c in rich.changes)
    assert ops["TRUNCATE"] == RICH.truncates
    assert ops["ADD_COLUMN"] == RICH.added_columns
    assert ops["INSERT"]
    assert ops["UPDATE"]
    assert ops["DELETE"]
    for change in rich.changes:
        if change.op == "UPDATE":
            assert change.before is not None
            assert change.after is not None
            changed = [n for n in change.before if change.before[n] != change.after[n]]
            assert changed, "an update must change something"
            assert not set(changed) & set(change.table.primary_key)
        elif change.op == "INSERT":
            assert change.before is None
            assert change.after is not None
        elif change.op == "DELETE":
            assert change.before is not None
            assert change.after is None
        else:
            assert change.before is None
            assert change.after is None
        if change.op == "ADD_COLUMN":
            assert change.added_column is not None
            assert change.table.columns[-1] == change.added_column
        if change.op in ("INSERT", "UPDATE", "DELETE") and (
            not change.table.primary_key or change.table.db_type == "Oracle"
        ):
            assert change.row_id is not None


def test_history_reinserts_deleted_keys(rich: SourceHistory) -> None:
    deleted: set[tuple[tuple[str, str], Any]] = set()
    reinserted = 0
    for change in rich.changes:
        if not change.table.primary_key:
            continue
        if change.op == "DELETE":
            assert change.before is not None
            deleted.add((change.table.ident, change.before["id" if "id" in change.before else "ID"]))
        elif change.op == "INSERT":
            assert change.after is not None
            reinserted += (change.table.ident, change.after.get("id", change.after.get("ID"))) in deleted
    assert reinserted > 0


def test_truth_equals_independent_apply(rich: SourceHistory) -> None:
    truth = rich.truth()
    assert set(truth) == {t.ident for t in rich.tables}
    assert_same_truth(apply_changes(rich), truth)


@pytest.mark.parametrize(
    "cfg",
    [
        HistoryConfig(),
        HistoryConfig(seed=3, tables=1, keyless_tables=0, events=50, keys_per_table=3),
        HistoryConfig(seed=4, tables=2, keyless_tables=2, events=400, keys_per_table=5, delete_ratio=0.4),
        HistoryConfig(seed=5, events=300, truncates=4, added_columns=4, null_ratio=0.5, oracle_tables=2),
        HistoryConfig(seed=6, events=0),
    ],
)
def test_truth_equals_independent_apply_configs(cfg: HistoryConfig) -> None:
    history = SourceHistory.generate(cfg)
    assert_same_truth(apply_changes(history), history.truth())


def test_truth_shape(rich: SourceHistory) -> None:
    truth = rich.truth()
    assert truth == rich.truth()
    for ident, rows in truth.items():
        table = rich.table(*ident)
        for row in rows:
            assert list(row) == table.column_names()
            assert HIDDEN_ROW_ID not in row
            assert ORACLE_ROWID not in row
        if table.primary_key:
            keys = [tuple(r[k] for k in table.primary_key) for r in rows]
            assert keys == sorted(keys)
            assert len(set(keys)) == len(keys)
    # Columns added later are NULL for rows not written since.
    added = [c for c in rich.changes if c.op == "ADD_COLUMN"]
    assert any(
        row[c.added_column.name] is None for c in added if c.added_column for row in truth[c.table.ident]
    ) or not any(truth[c.table.ident] for c in added)
    # Key-less tables hold exact duplicates somewhere.
    keyless = [t.ident for t in rich.tables if not t.primary_key]
    assert any(len(canonical(truth[k])) != len(set(canonical(truth[k]))) for k in keyless)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="keyless_tables"):
        SourceHistory.generate(HistoryConfig(tables=1, keyless_tables=2))
    with pytest.raises(ValueError, match="update_ratio"):
        SourceHistory.generate(HistoryConfig(update_ratio=0.8, delete_ratio=0.3))


# ------------------------------------------------------------------------------------------------------------
# DataWorks rendering

FULL = DataWorksOptions(update_mode="mixed", heartbeat_every=40, failover_resends=4, malformed=8, transactions=True)


def test_render_is_deterministic(rich: SourceHistory) -> None:
    a = render(rich, FULL, seed=9)
    b = render(SourceHistory.generate(RICH), dataclasses.replace(FULL), seed=9)
    assert a == b
    assert [m.value for m in a] == [m.value for m in b]
    assert render(rich, FULL, seed=10) != a


def test_render_example_shape() -> None:
    history = SourceHistory.generate(HistoryConfig(seed=1, tables=1, keyless_tables=0, events=1))
    change = history.changes[0]
    assert change.table.ident == ("crm", "customer")
    (value,) = render_change(change, system_time_ms=change.event_time_ms + 731)
    assert list(value) == ["schema", "payload", "version"]
    assert list(value["payload"]) == ["before", "after", "sequenceId", "timestamp", "op", "ddl"]
    assert value["schema"]["primaryKey"] == ["id"]
    assert value["schema"]["source"] == {
        "dbType": "MySQL",
        "dbVersion": "8.0.28",
        "dbName": "crm",
        "schemaName": None,
        "tableName": "customer",
    }
    assert value["payload"]["timestamp"] == {
        "eventTime": change.event_time_ms,
        "systemTime": change.event_time_ms + 731,
        "checkpointTime": change.event_time_ms,
    }
    assert value["payload"]["sequenceId"] == str(change.sequence)
    assert value["version"] == "1.0.0"


@pytest.mark.parametrize("mode", ["split", "merged", "mixed"])
def test_rendered_messages_are_well_formed(rich: SourceHistory, mode: UpdateMode) -> None:
    options = dataclasses.replace(FULL, update_mode=mode)
    messages = render(rich, options, seed=2)
    for message, obj in well_formed(messages):
        payload, schema = obj["payload"], obj["schema"]
        op = payload["op"]
        assert message.description.removeprefix("resend: ").split(" ")[0] in (op, "heartbeat")
        if op in ROW_OPS | {"TRUNCATE", "ALTER"}:
            source = schema["source"]
            assert message.description.endswith(f"{source['dbName']}.{source['tableName']}")
            names = [c["name"] for c in schema["dataColumn"]]
            if schema["primaryKey"] is None:
                assert names[-1] == HIDDEN_ROW_ID
                assert message.key is None
            elif op in ROW_OPS:
                image = (payload["after"] or payload["before"])["dataColumn"]
                assert message.key is not None
                assert json.loads(message.key) == {k: image[k] for k in schema["primaryKey"]}
            if source["dbType"] == "Oracle":
                assert names[-1] == ORACLE_ROWID
                assert payload["scn"].isdigit()
                assert source["schemaName"] is not None
        if op == "TRUNCATE":
            assert payload["ddl"]["text"] == f"TRUNCATE TABLE {schema['source']['tableName']}" or (
                schema["source"]["dbType"] == "Oracle"
            )
        if op == "ALTER":
            assert payload["ddl"]["text"].startswith("ALTER TABLE ")
        if payload["ddl"]:
            assert base64.b64decode(payload["ddl"]["ddlMeta"], validate=True)
    ops = Counter(obj["payload"]["op"] for _, obj in well_formed(messages))
    if mode == "split":
        assert ops["UPDATE_BEFOR"] == ops["UPDATE_AFTER"] > 0
    elif mode == "merged":
        assert ops["UPDATE_BEFOR"] == 0
        assert ops["UPDATE_AFTER"] > 0
    else:
        assert 0 < ops["UPDATE_BEFOR"] < ops["UPDATE_AFTER"]


def test_large_longs_are_exact_json_integers(rich: SourceHistory) -> None:
    messages = render(rich, DataWorksOptions(), seed=0)
    text = to_jsonl(messages)
    assert str(2**53 + 1) in text
    assert str(INT64_MIN) in text or str(INT64_MAX) in text
    parsed = [json.loads(line) for line in text.splitlines()]
    sequence_ids = [p["payload"]["sequenceId"] for p in parsed if p["payload"]["sequenceId"]]
    assert any(int(s) > 2**53 for s in sequence_ids)


@pytest.mark.parametrize("mode", ["split", "merged", "mixed"])
def test_split_updates_and_sequence_order(rich: SourceHistory, mode: UpdateMode) -> None:
    options = DataWorksOptions(update_mode=mode, heartbeat_every=25, transactions=True)  # no resends
    parsed = [obj for _, obj in well_formed(render(rich, options, seed=4))]
    rows = [p for p in parsed if p["payload"]["sequenceId"] is not None]
    for i, p in enumerate(rows):
        op = p["payload"]["op"]
        if op == "UPDATE_BEFOR":
            nxt = rows[i + 1]["payload"]
            assert nxt["op"] == "UPDATE_AFTER"
            assert nxt["before"] is None
            assert nxt["sequenceId"] == p["payload"]["sequenceId"]
            assert p["payload"]["after"] is None
        if op == "UPDATE_AFTER" and p["payload"]["before"] is None:
            assert rows[i - 1]["payload"]["op"] == "UPDATE_BEFOR"
    sequences = [int(p["payload"]["sequenceId"]) for p in rows if p["payload"]["op"] != "UPDATE_BEFOR"]
    assert all(x < y for x, y in itertools.pairwise(sequences))
    assert len(sequences) == len(rich.changes)


def test_sequence_ids_with_resends(rich: SourceHistory) -> None:
    messages = render(rich, FULL, seed=8)
    originals = [obj for m, obj in well_formed(messages) if not m.is_resend]
    sequences = [int(o["payload"]["sequenceId"]) for o in originals if o["payload"]["sequenceId"] is not None]
    for x, y in itertools.pairwise(sequences):
        assert x <= y
    assert Counter(Counter(sequences).values()) <= Counter({1: len(sequences), 2: len(sequences)})


def test_heartbeats(rich: SourceHistory) -> None:
    messages = render(rich, DataWorksOptions(heartbeat_every=30), seed=1)
    latest = 0
    beats = 0
    for message, obj in well_formed(messages):
        payload = obj["payload"]
        if payload["op"] == "MHEARTBEAT":
            beats += 1
            assert message.key is None
            assert message.description == "heartbeat"
            assert payload["timestamp"]["eventTime"] == latest == payload["timestamp"]["checkpointTime"]
            assert obj["version"] == "0.0.1"
        else:
            latest = max(latest, payload["timestamp"]["eventTime"])
    assert beats >= len(messages) // 33  # one per >= 30 messages, plus itself, groups of up to 2
    assert not any(m.description == "heartbeat" for m in render(rich, DataWorksOptions(heartbeat_every=0)))


def test_transactions(rich: SourceHistory) -> None:
    messages = render(rich, DataWorksOptions(transactions=True, heartbeat_every=20), seed=6)
    open_txn = False
    sizes = []
    for _, obj in well_formed(messages):
        op = obj["payload"]["op"]
        if op == "TRANSACTION_BEGIN":
            assert not open_txn
            open_txn, size = True, 0
        elif op == "TRANSACTION_END":
            assert open_txn
            assert size > 0
            open_txn = False
            sizes.append(size)
        elif op in ROW_OPS:
            assert open_txn
            size += op != "UPDATE_BEFOR"
        else:
            assert not open_txn, f"{op} inside a transaction"
    assert not open_txn
    assert max(sizes) > 1
    assert min(sizes) >= 1


def test_resends_are_exact_copies(rich: SourceHistory) -> None:
    options = DataWorksOptions(failover_resends=6)
    messages = render(rich, options, seed=3)
    plain = render(rich, DataWorksOptions(), seed=3)
    assert [m for m in messages if not m.is_resend] == plain
    runs = 0
    for i, message in enumerate(messages):
        if message.is_resend:
            earlier = {(m.key, m.value) for m in messages[:i]}
            assert (message.key, message.value) in earlier
            runs += i == 0 or not messages[i - 1].is_resend
    resent = sum(m.is_resend for m in messages)
    assert 1 <= runs <= 6
    assert 6 * 5 <= resent <= 6 * 30


def test_malformed_messages(rich: SourceHistory) -> None:
    messages = render(rich, dataclasses.replace(FULL, malformed=12), seed=5)
    malformed = [i for i, m in enumerate(messages) if m.is_malformed]
    assert len(malformed) == 12
    assert {messages[i].description.removeprefix("malformed: ") for i in malformed} == set(MALFORMED_KINDS)
    for i in malformed:
        with pytest.raises(RejectedError):
            parse(messages[i])
    without = [m for m in messages if not m.is_malformed]
    assert without == render(rich, dataclasses.replace(FULL, malformed=0), seed=5)


@pytest.mark.parametrize(
    ("cfg", "options"),
    [
        (HistoryConfig(), DataWorksOptions()),
        (RICH, DataWorksOptions(update_mode="split")),
        (RICH, DataWorksOptions(update_mode="merged", heartbeat_every=0)),
        (RICH, FULL),
        (dataclasses.replace(RICH, seed=99), dataclasses.replace(FULL, failover_resends=10, malformed=20)),
        (
            HistoryConfig(seed=5, events=300, truncates=4, added_columns=4, null_ratio=0.5, oracle_tables=2),
            dataclasses.replace(FULL, update_mode="split"),
        ),
        (HistoryConfig(seed=2, tables=2, keyless_tables=2, events=500, keys_per_table=4), FULL),
    ],
)
def test_rendered_stream_applies_to_truth(cfg: HistoryConfig, options: DataWorksOptions) -> None:
    history = SourceHistory.generate(cfg)
    messages = render(history, options, seed=cfg.seed)
    decoded, rejected = decode_stream(messages)
    assert rejected == [i for i, m in enumerate(messages) if m.is_malformed]
    assert_same_truth(decoded, history.truth())


def test_keyless_and_oracle_row_identity(rich: SourceHistory) -> None:
    messages = render(rich, DataWorksOptions(update_mode="merged"), seed=0)
    by_change: dict[int, list[dict[str, Any]]] = {}
    for _, obj in well_formed(messages):
        if obj["payload"]["sequenceId"] is not None:
            by_change.setdefault(int(obj["payload"]["sequenceId"]), []).append(obj)
    keyless_seen = oracle_seen = 0
    for change in rich.changes:
        if change.op not in ("INSERT", "UPDATE", "DELETE"):
            continue
        (obj,) = by_change[change.sequence]
        images = [i["dataColumn"] for i in (obj["payload"]["before"], obj["payload"]["after"]) if i]
        assert change.row_id is not None or change.table.primary_key
        for image in images:
            if not change.table.primary_key:
                keyless_seen += 1
                assert image[HIDDEN_ROW_ID] == change.row_id
            if change.table.db_type == "Oracle":
                oracle_seen += 1
                assert change.row_id is not None
                assert image[ORACLE_ROWID] == fake_oracle_rowid(change.row_id)
                assert len(image[ORACLE_ROWID]) == 18
    assert keyless_seen
    assert oracle_seen
    scns = [int(o[0]["payload"]["scn"]) for o in by_change.values() if "scn" in o[0]["payload"]]
    assert scns == sorted(scns)
    assert len(set(scns)) == len(scns)
    assert len({fake_oracle_rowid(n) for n in range(5000)}) == 5000


def test_add_column_rendering(rich: SourceHistory) -> None:
    messages = render(rich, DataWorksOptions(), seed=0)
    objs = [obj for _, obj in well_formed(messages)]
    for change in (c for c in rich.changes if c.op == "ADD_COLUMN"):
        assert change.added_column is not None
        name = change.added_column.name
        (at,) = [i for i, o in enumerate(objs) if o["payload"]["sequenceId"] == str(change.sequence)]
        alter = objs[at]
        assert alter["payload"]["op"] == "ALTER"
        assert alter["payload"]["before"] is None
        assert alter["payload"]["after"] is None
        assert name in alter["payload"]["ddl"]["text"]
        if change.table.db_type != "Oracle":
            assert alter["payload"]["ddl"]["text"].startswith(f"ALTER TABLE {change.table.table} ADD COLUMN {name} ")
            assert alter["payload"]["ddl"]["text"].endswith(" NULL")
        assert name in [c["name"] for c in alter["schema"]["dataColumn"]]
        source = alter["schema"]["source"]
        before = [
            o
            for o in objs[:at]
            if o["schema"]["source"] and (o["schema"]["source"]["tableName"] == source["tableName"])
        ]
        after = [
            o
            for o in objs[at + 1 :]
            if o["schema"]["source"] and (o["schema"]["source"]["tableName"] == source["tableName"])
        ]
        assert all(name not in [c["name"] for c in o["schema"]["dataColumn"]] for o in before)
        assert all(name in [c["name"] for c in o["schema"]["dataColumn"]] for o in after)


def test_replay_files(rich: SourceHistory) -> None:
    messages = render(rich, FULL, seed=1)
    with_value = [m for m in messages if m.value is not None]
    jsonl = to_jsonl(messages)
    lines = jsonl.split("\n")
    assert lines[-1] == ""
    assert len(lines) - 1 == len(with_value)
    for line, message in zip(lines, with_value, strict=False):
        assert line.encode("utf-8") == message.value or message.is_malformed
    b64 = to_b64_lines(messages).splitlines()
    assert [base64.b64decode(line) for line in b64] == [m.value for m in with_value]
    assert to_jsonl([Message(None, None, "tombstone")]) == ""


def test_render_change_split_pair(rich: SourceHistory) -> None:
    update: Change = next(c for c in rich.changes if c.op == "UPDATE")
    split = render_change(update)
    assert [m["payload"]["op"] for m in split] == ["UPDATE_BEFOR", "UPDATE_AFTER"]
    assert split[0]["payload"]["sequenceId"] == split[1]["payload"]["sequenceId"]
    assert split[0]["payload"]["after"] is None
    assert split[1]["payload"]["before"] is None
    (merged,) = render_change(update, update_mode="merged")
    assert merged["payload"]["op"] == "UPDATE_AFTER"
    assert merged["payload"]["before"] == split[0]["payload"]["before"]
    assert merged["payload"]["after"] == split[1]["payload"]["after"]
