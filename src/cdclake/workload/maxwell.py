"""Renders a :class:`~cdclake.workload.history.SourceHistory` as Maxwell's daemon JSON (``maxwell-json``).

Layout per ``formats/maxwell-ogg.md`` section 1: one flat object per row, ``{"database", "table", "type", "ts",
"xid", "xoffset", "commit", "position", "server_id", "thread_id", "primary_key", "primary_key_columns", "data",
"old"}`` as Maxwell writes it with ``output_binlog_position``, ``output_xoffset``, ``output_server_id``,
``output_thread_id``, ``output_primary_keys``, ``output_primary_key_columns`` and ``output_ddl`` on:

* ``ts`` is the binlog event time in epoch **seconds**; ``position`` ``mysql-bin.NNNNNN:offset`` of the row's event
  in a simulated binlog (file rotations included); ``xid`` the InnoDB transaction id, ``xoffset`` the row's index
  in it, ``commit: true`` on its last row (with ``options.transactions`` 1-5 rows per transaction, else one).
* ``data`` is the full row (after image; before image for a delete); an update's ``old`` holds the previous values
  of the changed columns only (Maxwell always writes it that way; ``options.partial_updates`` changes nothing).
* ADD COLUMN is a ``table-alter`` DDL record (``ts`` in **milliseconds**, ``sql``, ``def``/``old`` table
  definitions), and the column is in ``data`` of every later row of the table.
* Kafka key as Maxwell's default ``kafka_key_format=hash``: ``{"database", "table", "pk.<col>": value}``, or a
  ``_uuid`` for rows of tables without a primary key.

Column types: BIGINT, VARCHAR(255), BLOB, TINYINT(1) for booleans, DOUBLE (Java ``Double.toString`` text),
DATETIME(3).

Limits of the format (``expected``):

* Maxwell writes no types and the decoder infers them from the JSON values: DATETIME text
  (``yyyy-MM-dd HH:mm:ss.SSS``) and BLOB base64 stay ``string`` columns, booleans are the TINYINT numbers 0/1
  (``bigint``); ``expected`` holds those forms.
* TRUNCATE TABLE produces nothing (Maxwell ignores it, zendesk/maxwell#1012, #1731): the truncated rows stay in the
  lake until written again.
* No heartbeats (Maxwell keeps them in its own schema).
* Maxwell reads MySQL binlogs only: Oracle tables of the history are not rendered and ``expected`` leaves them out.
* Key-less tables (``primary_key_columns: []``): the apply engine identifies rows by their full image, so identical
  rows are one lake row (see :func:`cdclake.workload._open_common.lake_state`).
"""

from __future__ import annotations

import base64
import random
import uuid
from datetime import datetime
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
from cdclake.workload.history import Change, Column, ColumnKind, SourceHistory, TableSpec
from cdclake.workload.renderers import Message, RenderedStream, RenderOptions, Truth, register_renderer

SERVER_ID: Final = 223344
_XID_BASE: Final = 940_000

_MYSQL_TYPES: Final[dict[ColumnKind, str]] = {
    "long": "bigint",
    "string": "varchar",
    "bytes": "blob",
    "boolean": "tinyint",
    "double": "double",
    "timestamp": "datetime",
}
_DDL_TYPES: Final[dict[ColumnKind, str]] = {
    "long": "bigint",
    "string": "varchar(255)",
    "bytes": "blob",
    "boolean": "tinyint(1)",
    "double": "double",
    "timestamp": "datetime(3)",
}


def is_mysql(table: TableSpec) -> bool:
    return table.db_type.lower() == "mysql"


def encode_value(column: Column, value: Any) -> Any:
    """One value as Maxwell writes it (see the module doc)."""
    if value is None:
        return None
    if column.kind == "bytes":
        return base64.b64encode(value).decode("ascii")
    if column.kind == "boolean":
        return 1 if value else 0
    if column.kind == "double":
        return float(value)
    if column.kind == "timestamp":
        assert isinstance(value, datetime)
        return millis_text(value)
    return value


def table_definition(table: TableSpec) -> dict[str, Any]:
    """The ``def`` of a DDL record (Maxwell's schema of the table)."""
    columns: list[dict[str, Any]] = []
    for column in table.columns:
        item: dict[str, Any] = {"type": _MYSQL_TYPES[column.kind], "name": column.name}
        if column.kind in ("long", "boolean", "double"):
            item["signed"] = True
        if column.kind == "string":
            item["charset"] = "utf8mb4"
        if column.kind == "timestamp":
            item["column-length"] = 3
        columns.append(item)
    return {
        "database": table.database,
        "charset": "utf8mb4",
        "table": table.table,
        "primary-key": list(table.primary_key),
        "columns": columns,
    }


class _Writer:
    def __init__(self, options: RenderOptions, rng: random.Random) -> None:
        self.options = options
        self.rng = rng
        self.binlog = BinlogClock(rng)
        self.xid = _XID_BASE
        self.previous: dict[tuple[str, str], TableSpec] = {}

    def _key(self, table: TableSpec, row: dict[str, Any]) -> bytes:
        key: dict[str, Any] = {"database": table.database, "table": table.table}
        if table.primary_key:
            by_name = {c.name: c for c in table.columns}
            for name in table.primary_key:
                key[f"pk.{name}"] = encode_value(by_name[name], row[name])
        else:
            key["_uuid"] = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        return json_bytes(key)

    def row(self, change: Change, xoffset: int, commit: bool) -> Message:
        table = change.table
        kind = {"INSERT": "insert", "UPDATE": "update", "DELETE": "delete"}[change.op]
        data_row = change.after if change.after is not None else change.before
        assert data_row is not None
        by_name = {c.name: c for c in table.columns}
        file, pos = self.binlog.advance()
        value: dict[str, Any] = {
            "database": table.database,
            "table": table.table,
            "type": kind,
            "ts": change.event_time_ms // 1000,
            "xid": self.xid,
            "xoffset": xoffset,
        }
        if commit:
            value["commit"] = True
        value |= {
            "position": f"{file}:{pos}",
            "server_id": SERVER_ID,
            "thread_id": 88412,
            "primary_key": [encode_value(by_name[k], data_row[k]) for k in table.primary_key],
            "primary_key_columns": list(table.primary_key),
            "data": {c.name: encode_value(c, data_row.get(c.name)) for c in table.columns},
        }
        if change.op == "UPDATE":
            before, after = change.before or {}, change.after or {}
            changed = [c for c in table.columns if before.get(c.name) != after.get(c.name)]
            value["old"] = {c.name: encode_value(c, before.get(c.name)) for c in changed}
        return Message(self._key(table, data_row), json_bytes(value), f"{kind} {table.qualified_name}")

    def table_alter(self, change: Change) -> Message:
        """maxwell-ogg.md 1: the DDL record of an ADD COLUMN (``ts`` in milliseconds)."""
        table = change.table
        column = change.added_column
        assert column is not None
        old = self.previous.get(table.ident)
        old_definition = table_definition(old) if old is not None else None
        if old_definition is None:
            old_definition = table_definition(table)
            old_definition["columns"] = [c for c in old_definition["columns"] if c["name"] != column.name]
        file, pos = self.binlog.advance(150, 400)
        value = {
            "type": "table-alter",
            "database": table.database,
            "table": table.table,
            "old": old_definition,
            "def": table_definition(table),
            "ts": change.event_time_ms,
            "sql": f"ALTER TABLE {table.table} ADD COLUMN {column.name} {_DDL_TYPES[column.kind]} NULL",
            "position": f"{file}:{pos}",
        }
        key = {"database": table.database, "table": table.table}
        return Message(json_bytes(key), json_bytes(value), f"table-alter {table.qualified_name}")

    def render(self, history: SourceHistory) -> list[Message]:
        stream = StreamBuilder()
        changes = [c for c in history.changes if is_mysql(c.table)]
        for group in group_changes(changes, self.rng, self.options.transactions):
            self.binlog.advance(65, 140)  # GTID and BEGIN query events
            first = group[0]
            if first.op == "ADD_COLUMN":
                stream.append(self.table_alter(first))
            elif first.op == "TRUNCATE":
                self.binlog.advance(80, 120)  # the TRUNCATE query event Maxwell skips
            else:
                self.xid += self.rng.randint(1, 30)
                for xoffset, change in enumerate(group):
                    stream.append(self.row(change, xoffset, commit=xoffset == len(group) - 1))
                self.binlog.advance(31, 31)  # XID event
            for change in group:
                self.previous[change.table.ident] = change.table
            stream.mark_boundary()
        shape(stream, self.options, self.rng, MALFORMED_MAKERS, ("insert", "update", "delete"))
        return stream.messages


def _unknown_type(value: dict[str, Any]) -> None:
    value["type"] = "frobnicate"


def _bad_position(value: dict[str, Any]) -> None:
    value["position"] = value["position"].replace(":", ":0x")


MALFORMED_MAKERS: Final[tuple[MalformedMaker, ...]] = (
    truncated_json,
    not_json,
    edited_json("unknown type frobnicate", _unknown_type),
    edited_json("position not file:offset", _bad_position),
)
"""Kinds of undecodable messages, in the order the renderer cycles through them."""


def _expected(history: SourceHistory) -> Truth:
    def value(_table: TableSpec, column: Column, v: Any) -> Any:
        if column.kind in ("bytes", "boolean", "timestamp"):
            return encode_value(column, v)
        return v

    return lake_state(history, include=is_mysql, truncates=False, value=value)


@register_renderer("maxwell-json")
def render_stream(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """Maxwell JSON for the MySQL tables of ``history``; see the module doc for the shape and the limits."""
    messages = _Writer(options, random.Random(seed)).render(history)
    return RenderedStream(messages, expected=lambda _truth: _expected(history))
