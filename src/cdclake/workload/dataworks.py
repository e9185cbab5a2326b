"""Renders a :class:`~cdclake.workload.history.SourceHistory` as DataWorks whole-database JSON Kafka messages.

Layout per ``formats/dataworks.md`` §1: ``{"schema": {...}, "payload": {...}, "version": "1.0.0"}`` with row
images nested under ``payload.before/after.dataColumn``; split updates as ``UPDATE_BEFOR`` + ``UPDATE_AFTER``
sharing one ``sequenceId``; key-less MySQL tables carry the hidden ``#alibaba_rds_row_id#`` column; Oracle
tables carry a ``rowid`` column and ``payload.scn``. :func:`render` adds what a real stream has besides
changes: heartbeats, transaction markers, failover re-sends (exact byte copies) and undecodable messages.

Choices where the vendor documentation is silent (documented so consumers do not over-fit them):

* Kafka key: compact JSON object of the primary-key values (``b'{"id":1001}'``); ``None`` for key-less tables,
  DDL, TRUNCATE, heartbeats and transaction markers.
* ``TRANSACTION_BEGIN``/``TRANSACTION_END``: all schema parts null, ``sequenceId`` null, ``eventTime`` of the
  first / last change of the transaction. DDL and TRUNCATE are never inside a transaction (implicit commit).
* Heartbeats, re-send windows and malformed messages are only placed between transactions (and never between
  the two halves of a split update).
* ``ALTER``/``TRUNCATE`` messages: ``schema`` describes the table (after the change), both row images null.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from typing import Any, Literal

from cdclake.workload._shaping import StreamBuilder, add_resend, commit_groups, cut_short_message
from cdclake.workload.history import (
    Change,
    ColumnKind,
    SourceHistory,
    TableSpec,
    datetime_to_ms,
)
from cdclake.workload.renderers import Message, RenderedStream, RenderOptions, register_renderer

UpdateMode = Literal["split", "merged", "mixed"]
"""``split``: UPDATE_BEFOR + UPDATE_AFTER; ``merged``: one UPDATE_AFTER with both; ``mixed``: random."""

DATAWORKS_TYPES: dict[ColumnKind, str] = {
    "long": "LONG",
    "string": "STRING",
    "bytes": "BYTES",
    "boolean": "BOOLEAN",
    "double": "DOUBLE",
    "timestamp": "DATE",
}
"""DataWorks ``schema.dataColumn[].type`` of each column kind."""

HIDDEN_ROW_ID = "#alibaba_rds_row_id#"
"""Hidden LONG column identifying rows of key-less MySQL (RDS) tables."""

ORACLE_ROWID = "rowid"
"""Extra STRING column of Oracle sources."""

VERSION = "1.0.0"
HEARTBEAT_VERSION = "0.0.1"

DB_VERSIONS: dict[str, str] = {"mysql": "8.0.28", "oracle": "19c"}

_MYSQL_DDL_TYPES: dict[ColumnKind, str] = {
    "long": "bigint",
    "string": "varchar(255)",
    "bytes": "blob",
    "boolean": "tinyint(1)",
    "double": "double",
    "timestamp": "datetime(3)",
}
_ORACLE_DDL_TYPES: dict[ColumnKind, str] = {
    "long": "NUMBER(19)",
    "string": "VARCHAR2(255)",
    "bytes": "BLOB",
    "boolean": "NUMBER(1)",
    "double": "BINARY_DOUBLE",
    "timestamp": "TIMESTAMP(3)",
}

_ORACLE_SCN_BASE = 58_123_400_000
_ROWID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_ROW_OPS = frozenset({"INSERT", "UPDATE_BEFOR", "UPDATE_AFTER", "DELETE"})

MALFORMED_KINDS: tuple[str, ...] = ("truncated json", "not json", "unknown op FROBNICATE", "LONG value 'abc'")
"""Kinds of undecodable messages :func:`render` inserts, in the order it cycles through them."""


@dataclass
class DataWorksOptions:
    """How :func:`render` shapes the message stream.

    Attributes:
        update_mode: Update rendering, see :data:`UpdateMode`.
        heartbeat_every: A ``MHEARTBEAT`` after (about) every this many messages; 0 disables heartbeats.
        failover_resends: How many windows of 5-30 consecutive earlier messages are re-sent (as after a
            DataWorks failover: the window just before the resume point is written again, byte for byte).
        malformed: How many undecodable messages to insert (cycling through :data:`MALFORMED_KINDS`).
        transactions: Wrap row changes in ``TRANSACTION_BEGIN``/``TRANSACTION_END`` (1-5 changes each).
    """

    update_mode: UpdateMode = "split"
    heartbeat_every: int = 50
    failover_resends: int = 0
    malformed: int = 0
    transactions: bool = False


# ----------------------------------------------------------------------------------------------------------
# Single changes


def _is_oracle(table: TableSpec) -> bool:
    return table.db_type.lower() == "oracle"


def _has_hidden_row_id(table: TableSpec) -> bool:
    return not table.primary_key and table.db_type.lower() == "mysql"


def encode_value(kind: ColumnKind, value: Any) -> Any:
    """Encodes one Python value as DataWorks writes it in JSON.

    Args:
        kind: Column kind.
        value: Python value (``None`` for SQL NULL).

    Returns:
        The JSON-ready value: int, str, base64 str (BYTES), bool, float or 13-digit epoch ms (DATE).
    """
    if value is None:
        return None
    if kind == "bytes":
        return base64.b64encode(value).decode("ascii")
    if kind == "timestamp":
        return datetime_to_ms(value)
    if kind == "double":
        return float(value)
    return value


def fake_oracle_rowid(row_id: int) -> str:
    """Returns a stable, Oracle-looking 18-character extended ROWID for row number ``row_id``.

    Layout as Oracle's: data object (6) + relative file (3) + block (6) + row in block (3), base-64 digits.
    """

    def digits(n: int, width: int) -> str:
        out = []
        for _ in range(width):
            out.append(_ROWID_ALPHABET[n % 64])
            n //= 64
        return "".join(reversed(out))

    return "AAAWxM" + digits(4, 3) + digits(0x21B + row_id // 100, 6) + digits(row_id % 100, 3)


def _oracle_row_number(change: Change, image: dict[str, Any]) -> int:
    if change.row_id is not None:
        return change.row_id
    # Hand-written history without row ids: derive a stable number from the key.
    key = json.dumps([image.get(k) for k in change.table.primary_key], default=str)
    return int.from_bytes(key.encode("utf-8")[:6].ljust(6, b"\0"), "big") % 10**9


def table_schema(table: TableSpec) -> dict[str, Any]:
    """Returns the ``schema`` object of messages about ``table``."""
    columns = [{"name": c.name, "type": DATAWORKS_TYPES[c.kind]} for c in table.columns]
    if _has_hidden_row_id(table):
        columns.append({"name": HIDDEN_ROW_ID, "type": "LONG"})
    if _is_oracle(table):
        columns.append({"name": ORACLE_ROWID, "type": "STRING"})
    return {
        "dataColumn": columns,
        "primaryKey": list(table.primary_key) if table.primary_key else None,
        "source": {
            "dbType": table.db_type,
            "dbVersion": DB_VERSIONS.get(table.db_type.lower(), "unknown"),
            "dbName": table.database,
            "schemaName": table.schema,
            "tableName": table.table,
        },
    }


def _image(change: Change, row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    table = change.table
    values = {c.name: encode_value(c.kind, row.get(c.name)) for c in table.columns}
    if _has_hidden_row_id(table):
        if change.row_id is None:
            raise ValueError(f"{change.op} on key-less {table.qualified_name} without row_id")
        values[HIDDEN_ROW_ID] = change.row_id
    if _is_oracle(table):
        values[ORACLE_ROWID] = fake_oracle_rowid(_oracle_row_number(change, row))
    return {"dataColumn": values}


def _ddl(text: str) -> dict[str, str]:
    """``payload.ddl`` with a Java-serialized-String-shaped opaque ``ddlMeta``."""
    raw = text.encode("utf-8")
    meta = b"\xac\xed\x00\x05t" + len(raw).to_bytes(2, "big") + raw  # ObjectOutputStream of a String
    return {"text": text, "ddlMeta": base64.b64encode(meta).decode("ascii")}


def ddl_text(change: Change) -> str:
    """Returns the SQL text DataWorks reports for a TRUNCATE or ADD_COLUMN change."""
    table = change.table
    if change.op == "TRUNCATE":
        if _is_oracle(table):
            return f'TRUNCATE TABLE "{table.schema}"."{table.table}"'
        return f"TRUNCATE TABLE {table.table}"
    if change.op == "ADD_COLUMN":
        col = change.added_column
        if col is None:
            raise ValueError("ADD_COLUMN change without added_column")
        if _is_oracle(table):
            sql_type = _ORACLE_DDL_TYPES[col.kind]
            return f'ALTER TABLE "{table.schema}"."{table.table}" ADD ("{col.name}" {sql_type})'
        return f"ALTER TABLE {table.table} ADD COLUMN {col.name} {_MYSQL_DDL_TYPES[col.kind]} NULL"
    raise ValueError(f"{change.op} is not DDL")


def message_key(change: Change) -> bytes | None:
    """Returns the Kafka key of a row change: compact JSON of the primary-key values, ``None`` if no key."""
    if change.op in ("TRUNCATE", "ADD_COLUMN") or not change.table.primary_key:
        return None
    image = change.after if change.after is not None else change.before
    if image is None:
        return None
    kinds = {c.name: c.kind for c in change.table.columns}
    key = {k: encode_value(kinds[k], image[k]) for k in change.table.primary_key}
    return json.dumps(key, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def render_change(
    change: Change,
    *,
    update_mode: Literal["split", "merged"] = "split",
    system_time_ms: int | None = None,
    scn: int | None = None,
) -> list[dict[str, Any]]:
    """Renders one change as DataWorks message values (JSON-ready dicts).

    Args:
        change: The change.
        update_mode: ``split`` gives UPDATE_BEFOR (before only) + UPDATE_AFTER (after only) with the same
            sequenceId; ``merged`` one UPDATE_AFTER with both images.
        system_time_ms: ``timestamp.systemTime``; defaults to the event time.
        scn: Oracle SCN for ``payload.scn`` (Oracle tables only); defaults to a value derived from the
            sequence.

    Returns:
        One message dict, two for a split update.
    """
    table = change.table
    event_time = change.event_time_ms
    timestamp = {
        "eventTime": event_time,
        "systemTime": event_time if system_time_ms is None else system_time_ms,
        "checkpointTime": event_time,
    }

    def message(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "before": _image(change, before),
            "after": _image(change, after),
            "sequenceId": str(change.sequence),
            "timestamp": dict(timestamp),
            "op": op,
            "ddl": _ddl(ddl_text(change)) if change.op in ("TRUNCATE", "ADD_COLUMN") else None,
        }
        if _is_oracle(table):
            payload["scn"] = str(scn if scn is not None else _ORACLE_SCN_BASE + change.sequence % 10**12)
        return {"schema": table_schema(table), "payload": payload, "version": VERSION}

    if change.op == "INSERT":
        return [message("INSERT", None, change.after)]
    if change.op == "DELETE":
        return [message("DELETE", change.before, None)]
    if change.op == "UPDATE":
        if update_mode == "split":
            return [message("UPDATE_BEFOR", change.before, None), message("UPDATE_AFTER", None, change.after)]
        return [message("UPDATE_AFTER", change.before, change.after)]
    if change.op == "TRUNCATE":
        return [message("TRUNCATE", None, None)]
    if change.op == "ADD_COLUMN":
        return [message("ALTER", None, None)]
    raise ValueError(f"unknown change op {change.op!r}")


def heartbeat(event_time_ms: int) -> dict[str, Any]:
    """Returns a ``MHEARTBEAT`` message value."""
    return {
        "schema": {"dataColumn": None, "primaryKey": None, "source": None},
        "payload": {
            "before": None,
            "after": None,
            "sequenceId": None,
            "timestamp": {"eventTime": event_time_ms, "checkpointTime": event_time_ms},
            "op": "MHEARTBEAT",
            "ddl": None,
        },
        "version": HEARTBEAT_VERSION,
    }


def transaction_marker(op: Literal["TRANSACTION_BEGIN", "TRANSACTION_END"], event_time_ms: int) -> dict[str, Any]:
    """Returns a ``TRANSACTION_BEGIN``/``TRANSACTION_END`` message value (layout undocumented, see module)."""
    return {
        "schema": {"dataColumn": None, "primaryKey": None, "source": None},
        "payload": {
            "before": None,
            "after": None,
            "sequenceId": None,
            "timestamp": {
                "eventTime": event_time_ms,
                "systemTime": event_time_ms,
                "checkpointTime": event_time_ms,
            },
            "op": op,
            "ddl": None,
        },
        "version": VERSION,
    }


def dumps(value: dict[str, Any]) -> bytes:
    """Serializes a message value as compact UTF-8 JSON (integers stay exact)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


# ----------------------------------------------------------------------------------------------------------
# Whole stream


def render(history: SourceHistory, options: DataWorksOptions | None = None, seed: int = 0) -> list[Message]:
    """Renders a whole history as the DataWorks Kafka message stream.

    Args:
        history: The source history.
        options: Stream shape; defaults of :class:`DataWorksOptions` if omitted.
        seed: Seed for every random choice of the rendering (update mode in ``mixed``, system-time lag,
            transaction sizes, re-send windows, malformed messages).

    Returns:
        The messages in topic order. Equal inputs give byte-identical messages.
    """
    options = options or DataWorksOptions()
    if options.heartbeat_every < 0 or options.failover_resends < 0 or options.malformed < 0:
        raise ValueError("DataWorksOptions counts must be >= 0")
    rng = random.Random(seed)
    stream = StreamBuilder()
    latest_time = history.changes[0].event_time_ms if history.changes else 0
    since_heartbeat = 0
    scn_of = {c.sequence: _ORACLE_SCN_BASE + i for i, c in enumerate(history.changes)}

    for group in commit_groups(history.changes, rng, options.transactions):
        wrapped = options.transactions and group[0].op not in ("TRUNCATE", "ADD_COLUMN")
        start = len(stream.messages)
        if wrapped:
            stream.append(
                Message(
                    None,
                    dumps(transaction_marker("TRANSACTION_BEGIN", group[0].event_time_ms)),
                    "TRANSACTION_BEGIN",
                )
            )
        for change in group:
            mode: Literal["split", "merged"]
            if options.update_mode == "mixed":
                mode = "split" if rng.random() < 0.5 else "merged"
            else:
                mode = options.update_mode
            system_time = change.event_time_ms + rng.randint(5, 900)
            key = message_key(change)
            for value in render_change(
                change, update_mode=mode, system_time_ms=system_time, scn=scn_of[change.sequence]
            ):
                description = f"{value['payload']['op']} {change.table.qualified_name}"
                stream.append(Message(key, dumps(value), description))
            latest_time = max(latest_time, change.event_time_ms)
        if wrapped:
            stream.append(
                Message(
                    None,
                    dumps(transaction_marker("TRANSACTION_END", group[-1].event_time_ms)),
                    "TRANSACTION_END",
                )
            )
        stream.mark_boundary()
        since_heartbeat += len(stream.messages) - start
        if options.heartbeat_every and since_heartbeat >= options.heartbeat_every:
            stream.append(Message(None, dumps(heartbeat(latest_time)), "heartbeat"))
            stream.mark_boundary()
            since_heartbeat = 0

    for _ in range(options.failover_resends):
        add_resend(stream, rng)
    used_sequences = {c.sequence for c in history.changes}
    for i in range(options.malformed):
        _add_malformed(stream, rng, MALFORMED_KINDS[i % len(MALFORMED_KINDS)], used_sequences)
    return stream.messages


def _add_malformed(stream: StreamBuilder, rng: random.Random, kind: str, used_sequences: set[int]) -> None:
    """Inserts one undecodable message of ``kind`` at a random boundary."""
    row_positions = [
        i
        for i, m in enumerate(stream.messages)
        if not m.is_malformed and m.value is not None and m.description.split(" ")[0] in _ROW_OPS
    ]
    if kind in ("unknown op FROBNICATE", "LONG value 'abc'") and not row_positions:
        kind = "not json"
    if kind in ("unknown op FROBNICATE", "LONG value 'abc'"):
        template_at = rng.choice(row_positions)
        template = stream.messages[template_at]
        assert template.value is not None
        value: dict[str, Any] = json.loads(template.value)
        # A fresh sequenceId: a consumer deduping by sequenceId before validating cannot lose a real change.
        sequence = int(value["payload"]["sequenceId"]) + 1
        while sequence in used_sequences:
            sequence += 1
        used_sequences.add(sequence)
        value["payload"]["sequenceId"] = str(sequence)
        if kind == "unknown op FROBNICATE":
            value["payload"]["op"] = "FROBNICATE"
        else:
            image = value["payload"]["after"] or value["payload"]["before"]
            longs = [c["name"] for c in value["schema"]["dataColumn"] if c["type"] == "LONG"]
            image["dataColumn"][rng.choice(longs)] = "abc"
        new = Message(template.key, dumps(value), f"malformed: {kind}")
        positions = [b for b in stream.boundaries if b > template_at]
    elif kind == "truncated json":
        cut = cut_short_message(stream, rng)
        if cut:
            new = Message(cut[0].key, cut[1], f"malformed: {kind}")
        else:
            new = Message(None, b'{"schema":{"dataColumn":[', f"malformed: {kind}")
        positions = stream.boundaries
    else:
        text = rng.choice(
            (
                "this is not json",
                "<html><body><h1>502 Bad Gateway</h1></body></html>",
                "INSERT INTO customer VALUES (1, 'x')",
                "\ufeff{'schema': None}",
            )
        )
        new = Message(None, text.encode("utf-8"), f"malformed: {kind}")
        positions = stream.boundaries
    stream.insert(rng.choice(positions), [new])


# ----------------------------------------------------------------------------------------------------------
# Replay files


def to_jsonl(messages: list[Message]) -> str:
    """Returns one message value per line (UTF-8 text), skipping ``None`` values.

    Well-formed values never contain a raw newline (JSON escapes it), so a line is a message.
    """
    return "".join(m.value.decode("utf-8", errors="replace") + "\n" for m in messages if m.value is not None)


def to_b64_lines(messages: list[Message]) -> str:
    """Returns the standard base64 of each message value per line, skipping ``None`` values."""
    return "".join(base64.b64encode(m.value).decode("ascii") + "\n" for m in messages if m.value is not None)


@register_renderer("dataworks-json")
def render_stream(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """The registry's view of :func:`render`: both update modes mixed; DataWorks has no changed-only images."""
    shape = DataWorksOptions(
        update_mode="mixed",
        heartbeat_every=options.heartbeat_every,
        failover_resends=options.resends,
        malformed=options.malformed,
        transactions=options.transactions,
    )
    return RenderedStream(render(history, shape, seed=seed))
