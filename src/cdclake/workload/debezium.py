"""Renders a :class:`~cdclake.workload.history.SourceHistory` as Debezium 2.7 JSON messages (``debezium-json``).

Layout per ``formats/debezium.md``: the MySQL connector for MySQL tables, the Oracle connector for Oracle tables,
JsonConverter with ``schemas.enable=true`` (section 1): every key and value is ``{"schema", "payload"}``, so the
decoder knows each column's type from the Connect schema instead of guessing it from JSON values. One stream holds
what Debezium spreads over several topics (table topics, ``<prefix>.transaction``, the schema-change topic
``<prefix>``, ``__debezium-heartbeat.<prefix>``), in the order the connector writes them.

Column types (the source DDL each kind stands for, and its Connect encoding, section 5):

========= ==================================== =============================================================
kind      MySQL / Oracle column                Connect schema -> JSON value
========= ==================================== =============================================================
long      BIGINT / NUMBER(19)                  int64 -> number / Decimal(19,0) -> base64 unscaled bytes
string    VARCHAR(255) / VARCHAR2(255 CHAR)    string -> string
bytes     BLOB / BLOB                          bytes -> base64
boolean   BIT(1) / BOOLEAN (Oracle 23ai)       boolean -> true/false
double    DOUBLE / BINARY_DOUBLE               float64 -> number (Java ``Double.toString`` text)
timestamp TIMESTAMP(3) / TIMESTAMP(3)          ZonedTimestamp -> ``2024-03-01T10:15:31.250Z`` / Timestamp -> ms
========= ==================================== =============================================================

Stream shape:

* Positions: MySQL ``source.file``/``pos``/``row`` from a simulated binlog (file rotations included) and a GTID per
  transaction; Oracle ``scn`` per change and ``commit_scn`` per transaction.
* ``options.transactions``: ``provide.transaction.metadata=true``: BEGIN/END records around each transaction and a
  ``transaction`` block ``{id, total_order, data_collection_order}`` in its events; else ``transaction: null``.
* An update of the primary key is a ``d`` of the old key (with its tombstone) and a ``c`` of the new one
  (section 2); the ``c`` carries every column.
* Deletes of keyed rows are followed by a Kafka tombstone (same key, value ``None``; ``tombstones.on.delete``
  default). Key-less tables have a null key and no tombstones.
* TRUNCATE is an ``op: "t"`` event (``skipped.operations`` emptied); ADD_COLUMN is a schema-change record
  (``include.schema.changes=true``: ``databaseName``, ``ddl``, ``tableChanges``) and the column is in the value
  schema of every later event of the table.
* ``options.partial_updates``: MySQL with ``binlog_row_image=NOBLOB`` (and Oracle LOBs not in the redo): an update's
  unchanged BLOB columns and a delete's BLOB columns arrive as the placeholder, base64 of
  ``__debezium_unavailable_value`` for ``bytes`` columns (section 6). Only for tables with a primary key: a key-less
  table logs its full row as the key equivalent, and its rows are identified by their full image.
* Heartbeats ``{"ts_ms"}`` (``heartbeat.interval.ms``) between transactions; re-send windows (byte copies, as after
  a connector restart from an older offset) and undecodable messages (``malformed: ...``) at transaction
  boundaries.

Limits (what :attr:`RenderedStream.keys` and ``expected`` say):

* Keys travel in the Kafka key (section 4); ``cdclake replay`` capture files keep values only, so every keyed
  table's key columns are also returned in ``keys``.
* Key-less tables: the apply engine identifies a row by its full image, so identical source rows are one lake row
  (``expected`` is the engine's result, see :func:`cdclake.workload._open_common.lake_state`).
* Oracle NUMBER(19) arrives as a Connect Decimal: the lake column is ``decimal(19,0)`` (``expected`` holds
  ``Decimal`` values for Oracle ``long`` columns).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import random
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

from cdclake.workload._open_common import (
    BinlogClock,
    MalformedMaker,
    edited_json,
    group_changes,
    json_bytes,
    lake_state,
    millis_text,
    not_json,
    shape,
    truncated_json,
)
from cdclake.workload._shaping import StreamBuilder
from cdclake.workload.history import Change, Column, ColumnKind, SourceHistory, TableSpec, datetime_to_ms
from cdclake.workload.renderers import Message, RenderedStream, RenderOptions, Truth, register_renderer

VERSION: Final = "2.7.3.Final"
TOPIC_PREFIX: Final = "cdclake"
"""``topic.prefix``: ``source.name``, schema names ``<prefix>.<db>.<table>.Value``."""
SERVER_ID: Final = 223344
SERVER_UUID: Final = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
PLACEHOLDER: Final = "__debezium_unavailable_value"
"""debezium.md 6: the default ``unavailable.value.placeholder``."""

_ORACLE_SCN_BASE: Final = 58_123_400_000
_ZONED: Final = "io.debezium.time.ZonedTimestamp"
_TIMESTAMP: Final = "io.debezium.time.Timestamp"
_DECIMAL: Final = "org.apache.kafka.connect.data.Decimal"

_MYSQL_TYPES: Final[dict[ColumnKind, str]] = {
    "long": "BIGINT",
    "string": "VARCHAR(255)",
    "bytes": "BLOB",
    "boolean": "BIT(1)",
    "double": "DOUBLE",
    "timestamp": "TIMESTAMP(3)",
}
_ORACLE_TYPES: Final[dict[ColumnKind, str]] = {
    "long": "NUMBER(19)",
    "string": "VARCHAR2(255 CHAR)",
    "bytes": "BLOB",
    "boolean": "BOOLEAN",
    "double": "BINARY_DOUBLE",
    "timestamp": "TIMESTAMP(3)",
}
_JDBC_TYPES: Final[dict[ColumnKind, int]] = {
    "long": -5,
    "string": 12,
    "bytes": 2004,
    "boolean": -7,
    "double": 8,
    "timestamp": 93,
}


def _is_oracle(table: TableSpec) -> bool:
    return table.db_type.lower() == "oracle"


# ----------------------------------------------------------------------------------------------------------------
# Connect schemas and values


def column_schema(table: TableSpec, column: Column) -> dict[str, Any]:
    """The Connect field of one column (debezium.md 5)."""
    optional = column.name not in table.primary_key
    oracle = _is_oracle(table)
    field: dict[str, Any]
    if column.kind == "long" and oracle:
        field = {
            "type": "bytes",
            "optional": optional,
            "name": _DECIMAL,
            "version": 1,
            "parameters": {"scale": "0", "connect.decimal.precision": "19"},
        }
    elif column.kind == "timestamp":
        field = (
            {"type": "int64", "optional": optional, "name": _TIMESTAMP, "version": 1}
            if oracle
            else {"type": "string", "optional": optional, "name": _ZONED, "version": 1}
        )
    else:
        connect = {"long": "int64", "string": "string", "bytes": "bytes", "boolean": "boolean", "double": "float64"}
        field = {"type": connect[column.kind], "optional": optional}
    field["field"] = column.name
    return field


def _unscaled_base64(value: int) -> str:
    """Decimal(scale 0): the big-endian two's-complement bytes of the integer (``BigInteger.toByteArray``)."""
    size = (value + (value < 0)).bit_length() // 8 + 1
    return base64.b64encode(value.to_bytes(size, "big", signed=True)).decode("ascii")


def encode_value(table: TableSpec, column: Column, value: Any) -> Any:
    """One value as Debezium writes it (see the module table)."""
    if value is None:
        return None
    kind = column.kind
    if kind == "long":
        return _unscaled_base64(value) if _is_oracle(table) else int(value)
    if kind == "bytes":
        return base64.b64encode(value).decode("ascii")
    if kind == "double":
        return float(value)
    if kind == "timestamp":
        assert isinstance(value, datetime)
        return datetime_to_ms(value) if _is_oracle(table) else millis_text(value, "T") + "Z"
    return value


def _names(table: TableSpec) -> tuple[str, str]:
    """(Value schema name, data collection) of a table."""
    if _is_oracle(table):
        return f"{TOPIC_PREFIX}.{table.schema}.{table.table}", f"{table.database}.{table.schema}.{table.table}"
    return f"{TOPIC_PREFIX}.{table.database}.{table.table}", f"{table.database}.{table.table}"


def _source_schema(oracle: bool) -> dict[str, Any]:
    def f(field_name: str, typ: str, optional: bool = False, **extra: Any) -> dict[str, Any]:
        return {"type": typ, "optional": optional, **extra, "field": field_name}

    snapshot = f(
        "snapshot",
        "string",
        True,
        name="io.debezium.data.Enum",
        version=1,
        parameters={"allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},
        default="false",
    )
    common = [
        f("version", "string"),
        f("connector", "string"),
        f("name", "string"),
        f("ts_ms", "int64"),
        snapshot,
        f("db", "string"),
        f("sequence", "string", True),
        f("ts_us", "int64", True),
        f("ts_ns", "int64", True),
    ]
    if oracle:
        extra = [
            f("schema", "string"),
            f("table", "string"),
            f("txId", "string", True),
            f("scn", "string", True),
            f("commit_scn", "string", True),
            f("lcr_position", "string", True),
            f("rs_id", "string", True),
            f("ssn", "int32", True),
            f("redo_thread", "int32", True),
            f("user_name", "string", True),
        ]
        name = "io.debezium.connector.oracle.Source"
    else:
        extra = [
            f("table", "string", True),
            f("server_id", "int64"),
            f("gtid", "string", True),
            f("file", "string"),
            f("pos", "int64"),
            f("row", "int32"),
            f("thread", "int64", True),
            f("query", "string", True),
        ]
        name = "io.debezium.connector.mysql.Source"
    return {"type": "struct", "fields": common + extra, "optional": False, "name": name, "field": "source"}


_TRANSACTION_SCHEMA: Final = {
    "type": "struct",
    "fields": [
        {"type": "string", "optional": False, "field": "id"},
        {"type": "int64", "optional": False, "field": "total_order"},
        {"type": "int64", "optional": False, "field": "data_collection_order"},
    ],
    "optional": True,
    "name": "event.block",
    "version": 1,
    "field": "transaction",
}


def envelope_schema(table: TableSpec) -> dict[str, Any]:
    """The value schema of the table's data events (``<prefix>.<db>.<table>.Envelope``)."""
    value_name, _ = _names(table)
    image = [column_schema(table, c) for c in table.columns]

    def image_field(which: str) -> dict[str, Any]:
        return {"type": "struct", "fields": image, "optional": True, "name": f"{value_name}.Value", "field": which}

    return {
        "type": "struct",
        "fields": [
            image_field("before"),
            image_field("after"),
            _source_schema(_is_oracle(table)),
            _TRANSACTION_SCHEMA,
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
            {"type": "int64", "optional": True, "field": "ts_us"},
            {"type": "int64", "optional": True, "field": "ts_ns"},
        ],
        "optional": False,
        "name": f"{value_name}.Envelope",
        "version": 2,
    }


def key_of(table: TableSpec, row: dict[str, Any]) -> bytes | None:
    """The Kafka key: the primary key as a Connect struct (debezium.md 4); ``None`` without a primary key."""
    if not table.primary_key:
        return None
    value_name, _ = _names(table)
    by_name = {c.name: c for c in table.columns}
    fields = [{**column_schema(table, by_name[k]), "optional": False} for k in table.primary_key]
    schema = {"type": "struct", "fields": fields, "optional": False, "name": f"{value_name}.Key"}
    payload = {k: encode_value(table, by_name[k], row[k]) for k in table.primary_key}
    return json_bytes({"schema": schema, "payload": payload})


# ----------------------------------------------------------------------------------------------------------------
# The stream


class _Writer:
    """Renders the changes of a history in order, keeping the connectors' positions."""

    def __init__(self, options: RenderOptions, rng: random.Random) -> None:
        self.options = options
        self.rng = rng
        self.binlog = BinlogClock(rng)
        self.scn = _ORACLE_SCN_BASE
        self.gtid_number = 1000
        self.stream = StreamBuilder()

    # -- positions -----------------------------------------------------------------------------------------------
    def _source(self, change: Change, position: dict[str, Any]) -> dict[str, Any]:
        table = change.table
        ts_ms = change.event_time_ms
        common: dict[str, Any] = {
            "version": VERSION,
            "connector": "oracle" if _is_oracle(table) else "mysql",
            "name": TOPIC_PREFIX,
            "ts_ms": ts_ms,
            "snapshot": "false",
            "db": table.database,
            "sequence": None,
            "ts_us": ts_ms * 1000,
            "ts_ns": ts_ms * 1_000_000,
        }
        if _is_oracle(table):
            return {
                **common,
                "schema": table.schema,
                "table": table.table,
                "txId": position["txn"],
                "scn": str(position["scn"]),
                "commit_scn": str(position["commit_scn"]),
                "lcr_position": None,
                "rs_id": None,
                "ssn": 0,
                "redo_thread": 1,
                "user_name": "APP",
            }
        return {
            **common,
            "table": table.table,
            "server_id": SERVER_ID,
            "gtid": position["txn"],
            "file": position["file"],
            "pos": position["pos"],
            "row": 0,
            "thread": 88412,
            "query": None,
        }

    def _positions(self, group: list[Change]) -> tuple[str, list[dict[str, Any]]]:
        """Transaction id and per-change position fields of one commit group."""
        if _is_oracle(group[0].table):
            txn = f"{self.rng.randrange(16**4):04x}001b{self.rng.randrange(16**8):08x}"
            scns = []
            for _ in group:
                self.scn += self.rng.randint(1, 40)
                scns.append(self.scn)
            self.scn += self.rng.randint(1, 5)
            return txn, [{"txn": txn, "scn": s, "commit_scn": self.scn} for s in scns]
        self.gtid_number += 1
        txn = f"{SERVER_UUID}:{self.gtid_number}"
        self.binlog.advance(65, 140)  # GTID and BEGIN query events
        positions = []
        for _ in group:
            file, pos = self.binlog.advance()
            positions.append({"txn": txn, "file": file, "pos": pos})
        self.binlog.advance(31, 31)  # XID event
        return txn, positions

    # -- messages ------------------------------------------------------------------------------------------------
    def _unavailable(self, change: Change) -> set[str]:
        """debezium.md 6: columns that arrive as the unavailable-value placeholder (NOBLOB, see the module doc)."""
        table = change.table
        if not self.options.partial_updates or not table.primary_key or change.op not in ("UPDATE", "DELETE"):
            return set()
        blobs = {c.name for c in table.columns if c.kind == "bytes" and c.name not in table.primary_key}
        if change.op == "DELETE":
            return blobs
        before, after = change.before or {}, change.after or {}
        return {n for n in blobs if before.get(n) == after.get(n)}

    def _image(self, change: Change, row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row is None:
            return None
        table = change.table
        unavailable = self._unavailable(change)
        placeholder_bytes = base64.b64encode(PLACEHOLDER.encode()).decode("ascii")
        return {
            c.name: placeholder_bytes if c.name in unavailable else encode_value(table, c, row.get(c.name))
            for c in table.columns
        }

    def data_event(self, change: Change, position: dict[str, Any], transaction: dict[str, Any] | None) -> list[Message]:
        table = change.table
        if change.op == "UPDATE" and _changes_key(change):
            # debezium.md 2: an update of the primary key is a `d` of the old key (and its tombstone), then a `c` of
            # the new one, at the update's position, which name each other's key in the `__debezium.newkey` (on the
            # `d`) and `__debezium.oldkey` (on the `c`) headers, as the key converter writes a key. The `c` carries
            # every column here: the renderer does not model unavailable values on it (tests/test_key_changes.py
            # covers those, with and without the headers).
            deleted = dataclasses.replace(change, op="DELETE", after=None)
            created = dataclasses.replace(change, op="INSERT", before=None)
            old_key, new_key = key_of(table, change.before or {}), key_of(table, change.after or {})

            def linked(half: Change, header: str, other_key: bytes | None) -> list[Message]:
                return [
                    dataclasses.replace(m, headers=((header, other_key),))
                    if m.value is not None and other_key is not None
                    else m
                    for m in self.data_event(half, position, transaction)
                ]

            return [*linked(deleted, "__debezium.newkey", new_key), *linked(created, "__debezium.oldkey", old_key)]
        op = {"INSERT": "c", "UPDATE": "u", "DELETE": "d", "TRUNCATE": "t"}[change.op]
        processed_ms = change.event_time_ms + self.rng.randint(3, 900)
        payload = {
            "before": self._image(change, change.before),
            "after": self._image(change, change.after),
            "source": self._source(change, position),
            "transaction": transaction,
            "op": op,
            "ts_ms": processed_ms,
            "ts_us": processed_ms * 1000,
            "ts_ns": processed_ms * 1_000_000,
        }
        row = change.after if change.after is not None else change.before
        key = key_of(table, row) if row is not None else None
        description = f"{op} {table.qualified_name}"
        messages = [Message(key, json_bytes({"schema": envelope_schema(table), "payload": payload}), description)]
        if op == "d" and key is not None:
            messages.append(Message(key, None, f"tombstone {table.qualified_name}"))
        return messages

    def schema_change(self, change: Change, position: dict[str, Any]) -> Message:
        """debezium.md 3: the schema-change record of an ADD COLUMN."""
        table = change.table
        column = change.added_column
        assert column is not None
        oracle = _is_oracle(table)
        connector = "oracle" if oracle else "mysql"
        types = _ORACLE_TYPES if oracle else _MYSQL_TYPES
        if oracle:
            ddl = f'ALTER TABLE "{table.schema}"."{table.table}" ADD "{column.name}" {types[column.kind]}'
            table_id = f'"{table.database}"."{table.schema}"."{table.table}"'
        else:
            ddl = f"ALTER TABLE {table.table} ADD COLUMN {column.name} {types[column.kind]} NULL"
            table_id = f'"{table.database}"."{table.table}"'
        columns: list[dict[str, Any]] = [
            {
                "name": c.name,
                "jdbcType": _JDBC_TYPES[c.kind],
                "typeName": types[c.kind].split("(")[0],
                "typeExpression": types[c.kind].split("(")[0],
                "charsetName": None,
                "position": i + 1,
                "optional": c.name not in table.primary_key,
                "autoIncremented": False,
                "generated": False,
                "comment": None,
                "hasDefaultValue": c.name not in table.primary_key,
                "enumValues": [],
            }
            for i, c in enumerate(table.columns)
        ]
        payload = {
            "source": self._source(change, position),
            "ts_ms": change.event_time_ms + self.rng.randint(3, 900),
            "databaseName": table.database,
            "schemaName": table.schema if oracle else None,
            "ddl": ddl,
            "tableChanges": [
                {
                    "type": "ALTER",
                    "id": table_id,
                    "table": {
                        "defaultCharsetName": None if oracle else "utf8mb4",
                        "primaryKeyColumnNames": list(table.primary_key),
                        "columns": columns,
                        "attributes": [],
                        "comment": None,
                    },
                }
            ],
        }
        schema = {
            "type": "struct",
            "fields": [
                _source_schema(oracle),
                {"type": "int64", "optional": False, "field": "ts_ms"},
                {"type": "string", "optional": True, "field": "databaseName"},
                {"type": "string", "optional": True, "field": "schemaName"},
                {"type": "string", "optional": True, "field": "ddl"},
                {
                    "type": "array",
                    "items": {"type": "struct", "optional": False, "name": "io.debezium.connector.schema.Change"},
                    "optional": False,
                    "field": "tableChanges",
                },
            ],
            "optional": False,
            "name": f"io.debezium.connector.{connector}.SchemaChangeValue",
            "version": 1,
        }
        key = {
            "schema": {
                "type": "struct",
                "fields": [{"type": "string", "optional": False, "field": "databaseName"}],
                "optional": False,
                "name": f"io.debezium.connector.{connector}.SchemaChangeKey",
            },
            "payload": {"databaseName": table.database},
        }
        return Message(
            json_bytes(key),
            json_bytes({"schema": schema, "payload": payload}),
            f"ddl {table.qualified_name}",
        )

    def transaction_record(self, status: str, txn: str, group: list[Change], ts_ms: int) -> Message:
        """debezium.md 3: BEGIN / END on ``<prefix>.transaction``."""
        collections: dict[str, int] = {}
        for change in group:
            collections[_names(change.table)[1]] = collections.get(_names(change.table)[1], 0) + 1
        end = status == "END"
        payload = {
            "status": status,
            "id": txn,
            "event_count": len(group) if end else None,
            "data_collections": (
                [{"data_collection": k, "event_count": v} for k, v in collections.items()] if end else None
            ),
            "ts_ms": ts_ms,
        }
        schema = {
            "type": "struct",
            "fields": [
                {"type": "string", "optional": False, "field": "status"},
                {"type": "string", "optional": False, "field": "id"},
                {"type": "int64", "optional": True, "field": "event_count"},
                {
                    "type": "array",
                    "items": {
                        "type": "struct",
                        "fields": [
                            {"type": "string", "optional": False, "field": "data_collection"},
                            {"type": "int64", "optional": False, "field": "event_count"},
                        ],
                        "optional": False,
                    },
                    "optional": True,
                    "field": "data_collections",
                },
                {"type": "int64", "optional": False, "field": "ts_ms"},
            ],
            "optional": False,
            "name": "io.debezium.connector.common.TransactionMetadataValue",
            "version": 1,
        }
        key = {
            "schema": {
                "type": "struct",
                "fields": [{"type": "string", "optional": False, "field": "id"}],
                "optional": False,
                "name": "io.debezium.connector.common.TransactionMetadataKey",
                "version": 1,
            },
            "payload": {"id": txn},
        }
        return Message(json_bytes(key), json_bytes({"schema": schema, "payload": payload}), f"transaction {status}")

    def heartbeat(self, ts_ms: int) -> Message:
        """debezium.md 3: ``{"ts_ms"}`` on ``__debezium-heartbeat.<prefix>``."""
        key = {
            "schema": {
                "type": "struct",
                "fields": [{"type": "string", "optional": False, "field": "serverName"}],
                "optional": False,
                "name": "io.debezium.connector.common.ServerNameKey",
            },
            "payload": {"serverName": TOPIC_PREFIX},
        }
        value = {
            "schema": {
                "type": "struct",
                "fields": [{"type": "int64", "optional": False, "field": "ts_ms"}],
                "optional": False,
                "name": "io.debezium.connector.common.Heartbeat",
            },
            "payload": {"ts_ms": ts_ms},
        }
        return Message(json_bytes(key), json_bytes(value), "heartbeat")

    def render(self, history: SourceHistory) -> list[Message]:
        options, stream = self.options, self.stream
        since_heartbeat = 0
        latest_ms = history.changes[0].event_time_ms if history.changes else 0
        for group in group_changes(history.changes, self.rng, options.transactions):
            start = len(stream.messages)
            txn, positions = self._positions(group)
            if group[0].op == "ADD_COLUMN":
                stream.append(self.schema_change(group[0], positions[0]))
            else:
                wrapped = options.transactions and group[0].op != "TRUNCATE"
                if wrapped:
                    stream.append(self.transaction_record("BEGIN", txn, group, group[0].event_time_ms))
                per_collection: dict[str, int] = {}
                for order, (change, position) in enumerate(zip(group, positions, strict=True), start=1):
                    block = None
                    if wrapped:
                        collection = _names(change.table)[1]
                        per_collection[collection] = per_collection.get(collection, 0) + 1
                        block = {"id": txn, "total_order": order, "data_collection_order": per_collection[collection]}
                    for message in self.data_event(change, position, block):
                        stream.append(message)
                if wrapped:
                    stream.append(self.transaction_record("END", txn, group, group[-1].event_time_ms))
            latest_ms = max(latest_ms, group[-1].event_time_ms)
            stream.mark_boundary()
            since_heartbeat += len(stream.messages) - start
            if options.heartbeat_every and since_heartbeat >= options.heartbeat_every:
                stream.append(self.heartbeat(latest_ms + self.rng.randint(1, 999)))
                stream.mark_boundary()
                since_heartbeat = 0
        shape(stream, options, self.rng, MALFORMED_MAKERS, ("c", "u", "d"))
        return stream.messages


# ----------------------------------------------------------------------------------------------------------------
# Undecodable messages


def _unknown_op(value: dict[str, Any]) -> None:
    """A data event with an op letter Debezium does not have."""
    value["payload"]["op"] = "x"


def _value_misfit(rng: random.Random, template: Message) -> tuple[Message, bool] | None:
    """A data event whose int64 column holds text."""
    assert template.value is not None
    value = json.loads(template.value)
    fields = value["schema"]["fields"][0]["fields"]
    int64 = [f["field"] for f in fields if f["type"] == "int64" and "name" not in f]
    image = value["payload"]["after"] or value["payload"]["before"]
    candidates = [n for n in int64 if image.get(n) is not None]
    if not candidates:
        return None
    image[rng.choice(candidates)] = "abc"
    return Message(template.key, json_bytes(value), "malformed: int64 value 'abc'"), True


MALFORMED_MAKERS: Final[tuple[MalformedMaker, ...]] = (
    truncated_json,
    not_json,
    edited_json("unknown op x", _unknown_op),
    _value_misfit,
)
"""Kinds of undecodable messages, in the order the renderer cycles through them."""


def _expected(history: SourceHistory) -> Truth:
    def value(table: TableSpec, column: Column, v: Any) -> Any:
        return Decimal(v) if column.kind == "long" and _is_oracle(table) else v

    return lake_state(history, value=value)


@register_renderer("debezium-json")
def render_stream(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """Debezium JSON (with the Connect schema) for ``history``; see the module doc for the shape and the limits."""
    messages = _Writer(options, random.Random(seed)).render(history)
    keys = {t.qualified_name: list(t.primary_key) for t in history.tables if t.primary_key}
    return RenderedStream(messages, keys=keys, expected=lambda _truth: _expected(history))


def _changes_key(change: Change) -> bool:
    """Whether an UPDATE moves its row to another primary key."""
    before, after = change.before or {}, change.after or {}
    return bool(change.table.primary_key) and any(before.get(k) != after.get(k) for k in change.table.primary_key)
