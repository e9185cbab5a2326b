"""Renders a :class:`~cdclake.workload.history.SourceHistory` as open-source Canal flat messages (``canal-json``,
``shared/formats/canal.md``) and as DTS Canal JSON (``dts-canal-json``, ``shared/formats/dts.md`` section 2).

The source is MySQL (Canal and DTS read the binlog); the history's Oracle tables (``HistoryConfig.oracle_tables``)
are rendered as MySQL tables of the same names. Per message, as the vendor writes it:

* Canal: one message per binlog rows event: consecutive rows of one table and one operation inside a transaction
  share a message (``data`` / ``old`` arrays, canal.md section 1); keys sorted (fastjson); ``mysqlType`` with
  lengths (``bigint(20)``); ``id`` = Canal batch id (shared by many messages); ``es`` of second resolution;
  ``old`` = the changed columns' previous values with ``RenderOptions.partial_updates`` (Canal's own behaviour),
  else the full before row (a superset some Canal-compatible producers send; it decodes to the same change);
  TRUNCATE as ``type: TRUNCATE`` and ADD COLUMN as ``type: ALTER`` (isDdl, the statement in ``sql``), the new
  column in later messages. ``gtid`` = ``<server uuid>:<n>`` per transaction with ``RenderOptions.transactions``,
  else ``""``.
* DTS: one row per message; ``mysqlType`` bare (``bigint``); ``old`` = the full before row (dts.md section 2:
  "old contains all columns by default"); ``type: DDL`` for both TRUNCATE and ADD COLUMN, with only the DDL keys
  of the vendor example; ``id`` = DTS cache offset, one per transaction; ``es`` of second resolution; ``gtid``
  only with ``RenderOptions.transactions``. :func:`render_dts_canal_json` can also write the pre-2022-03-20 layout
  (``legacy_old_data_swap``: UPDATE data = before / old = after, DELETE row in ``old``).

Values (canal.md section 3; dts.md: "every column value is a JSON string or null"): integers as decimal text,
double as Java ``String.valueOf``, binaries as ISO-8859-1 text, booleans as TINYINT(1) ``"1"``/``"0"``,
``timestamp`` columns as DATETIME(3) text (UTC wall clock), or TIMESTAMP(3) text on the server's wall clock
(+08:00, told to the decoder as ``source_timezone``) when every value fits TIMESTAMP's 1970-2038 range.

Limits of the formats (``RenderedStream.expected``):

* MySQL BOOLEAN is TINYINT(1): the lake column is ``bigint`` holding 1 / 0.
* Neither format has a row identity for key-less tables (no hidden row id): the lake identifies their rows by the
  full image, so identical rows collapse into one (:mod:`cdclake.workload._canal_family`).

Not rendered: heartbeats (Canal's MHEARTBEAT is not published by the flat-message converter, DTS Canal JSON has
none), transaction markers (dropped by Canal, absent in DTS), DTS ``INIT`` full-load rows (the history starts
empty). Kafka keys are null (Canal's default partitioner sends none; DTS's key is not documented).
"""

from __future__ import annotations

import random
from datetime import UTC
from typing import Any

from cdclake.workload._canal_family import (
    MYSQL_TIMESTAMP,
    SOURCE_UTC_OFFSET,
    SOURCE_ZONE,
    compact_json,
    first_row_only,
    is_ddl,
    java_double_text,
    lake_truth,
    latin1_text,
    mysql_ddl,
    mysql_lake_value,
    mysql_timestamp_columns,
    mysql_type,
    shape,
    spoil_long_value,
    wall_clock_text,
)
from cdclake.workload._shaping import StreamBuilder, commit_groups
from cdclake.workload.history import Change, Column, SourceHistory, TableSpec
from cdclake.workload.renderers import Message, RenderedStream, RenderOptions, register_renderer

SERVER_UUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
"""``server_uuid`` of the simulated MySQL source (GTIDs are ``<uuid>:<transaction number>``)."""

CANAL_MALFORMED_KINDS: tuple[str, ...] = (
    "old pairs with no data row",
    "truncated json",
    "unknown type FROBNICATE",
    "bigint value 'abc'",
    "not json",
)
"""Undecodable Canal messages, in the order the renderer cycles through them."""

DTS_MALFORMED_KINDS: tuple[str, ...] = (
    "UPDATE without old",
    "truncated json",
    "unknown type FROBNICATE",
    "bigint value 'abc'",
    "not json",
)
"""Undecodable DTS Canal JSON messages, in the order the renderer cycles through them."""


def mysql_text(column: Column, value: Any, timestamp_type: bool) -> str | None:
    """A value as Canal and DTS print it (canal.md section 3)."""
    if value is None:
        return None
    if column.kind in ("long", "string"):
        return str(value)
    if column.kind == "bytes":
        return latin1_text(value)
    if column.kind == "boolean":
        return "1" if value else "0"
    if column.kind == "double":
        return java_double_text(value)
    # DATETIME(3): the wall clock as stored (the source writes UTC); TIMESTAMP(3): the server's wall clock.
    return wall_clock_text(value, SOURCE_ZONE if timestamp_type else UTC, 3)


class _MysqlRows:
    """Row images and column declarations of one history's MySQL tables."""

    def __init__(self, history: SourceHistory) -> None:
        self.timestamp_columns = mysql_timestamp_columns(history)

    def image(self, table: TableSpec, row: dict[str, Any]) -> dict[str, str | None]:
        return {
            c.name: mysql_text(c, row.get(c.name), mysql_type(table, c, self.timestamp_columns) is MYSQL_TIMESTAMP)
            for c in table.columns
        }

    def declarations(self, table: TableSpec, *, full: bool) -> tuple[dict[str, str], dict[str, int]]:
        types = [(c.name, mysql_type(table, c, self.timestamp_columns)) for c in table.columns]
        return {n: t.full if full else t.bare for n, t in types}, {n: t.jdbc for n, t in types}


def bigint_columns(message: dict[str, Any]) -> list[str]:
    """Columns a Canal / DTS row message declares as BIGINT."""
    declared = message.get("mysqlType") or {}
    return [name for name, declared_type in declared.items() if str(declared_type).startswith("bigint")]


def _statements(group: list[Change]) -> list[list[Change]]:
    """Consecutive row changes of one table and operation in a transaction: one binlog rows event each."""
    events: list[list[Change]] = []
    for change in group:
        last = events[-1][-1] if events else None
        if (
            last is not None
            and not is_ddl(change)
            and last.op == change.op
            and last.table.ident == change.table.ident
            and last.table.columns == change.table.columns
        ):
            events[-1].append(change)
        else:
            events.append([change])
    return events


def _describe(vendor_type: str, table: TableSpec, rows: int) -> str:
    return f"{vendor_type} {table.qualified_name}" + (f" ({rows} rows)" if rows > 1 else "")


# ----------------------------------------------------------------------------------------------------------------
# canal-json


def canal_corrupt(kind: str, message: dict[str, Any]) -> dict[str, Any] | None:
    """A spoiled copy of a Canal row message showing ``kind`` (None: this message cannot show it)."""
    if kind == "old pairs with no data row":
        # canal.md section 1: old[i] pairs with data[i]; an extra old row cannot be paired.
        if message.get("type") != "UPDATE":
            return None
        spoiled = first_row_only(message)
        spoiled["old"] = [spoiled["old"][0], spoiled["old"][0]]
        return spoiled
    if kind == "unknown type FROBNICATE":
        spoiled = first_row_only(message)
        spoiled["type"] = "FROBNICATE"
        return spoiled
    if kind == "bigint value 'abc'":
        return spoil_long_value(message, bigint_columns(message))
    raise ValueError(f"unknown malformed kind {kind!r}")


@register_renderer("canal-json")
def render_canal_json(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """Open-source Canal flat messages (``canal.mq.flatMessage=true``) for ``history``."""
    rng = random.Random(seed)
    rows = _MysqlRows(history)
    stream = StreamBuilder()
    batch_id = 1 + rng.randrange(1000)
    for number, group in enumerate(commit_groups(history.changes, rng, transactions=True), start=1):
        gtid = f"{SERVER_UUID}:{number}" if options.transactions else ""
        if rng.random() < 0.5:  # a Canal batch holds the entries of one or more transactions
            batch_id += 1
        for event in _statements(group):
            stream.append(_canal_message(event, rows, options, gtid, batch_id, rng))
        stream.mark_boundary()
    shape(stream, options, rng, CANAL_MALFORMED_KINDS, canal_corrupt, compact_json)
    return RenderedStream(
        stream.messages,
        format_options={"source_timezone": SOURCE_UTC_OFFSET},
        expected=lake_truth(history, mysql_lake_value),
    )


def _canal_message(
    event: list[Change], rows: _MysqlRows, options: RenderOptions, gtid: str, batch_id: int, rng: random.Random
) -> Message:
    first = event[0]
    table = first.table
    es = first.event_time_ms // 1000 * 1000  # canal.md section 1: binlog event time, second resolution
    value: dict[str, Any] = {
        "data": None,
        "database": table.database,
        "es": es,
        "gtid": gtid,
        "id": batch_id,
        "isDdl": is_ddl(first),
        "mysqlType": None,
        "old": None,
        "pkNames": None,
        "sql": "",
        "sqlType": None,
        "table": table.table,
        "ts": event[-1].event_time_ms + rng.randint(5, 900),
        "type": first.op if not is_ddl(first) else ("TRUNCATE" if first.op == "TRUNCATE" else "ALTER"),
    }
    if is_ddl(first):
        value["sql"] = mysql_ddl(first, rows.timestamp_columns)
        return Message(None, compact_json(value), _describe(value["type"], table, 1))
    mysql_types, sql_types = rows.declarations(table, full=True)
    value["mysqlType"], value["sqlType"] = mysql_types, sql_types
    value["pkNames"] = list(table.primary_key) or None
    if first.op == "UPDATE":
        value["data"] = [rows.image(table, c.after or {}) for c in event]
        befores = [rows.image(table, c.before or {}) for c in event]
        if options.partial_updates:
            # canal.md section 1: old = only the columns whose value changed, with their previous values.
            befores = [
                {name: text for name, text in before.items() if after[name] != text}
                for before, after in zip(befores, value["data"], strict=True)
            ]
        value["old"] = befores
    elif first.op == "INSERT":
        value["data"] = [rows.image(table, c.after or {}) for c in event]
    else:  # DELETE: canal.md section 1, the deleted row is in data
        value["data"] = [rows.image(table, c.before or {}) for c in event]
    return Message(None, compact_json(value), _describe(first.op, table, len(event)))


# ----------------------------------------------------------------------------------------------------------------
# dts-canal-json


def dts_corrupt(kind: str, message: dict[str, Any]) -> dict[str, Any] | None:
    """A spoiled copy of a DTS row message showing ``kind`` (None: this message cannot show it)."""
    if kind == "UPDATE without old":
        # dts.md section 2: old is the full before row of an UPDATE; without it the change is incomplete.
        if message.get("type") != "UPDATE":
            return None
        return {**message, "old": None}
    if kind == "unknown type FROBNICATE":
        return {**message, "type": "FROBNICATE"}
    if kind == "bigint value 'abc'":
        return spoil_long_value(message, bigint_columns(message))
    raise ValueError(f"unknown malformed kind {kind!r}")


def render_dts_canal_json(
    history: SourceHistory, options: RenderOptions, seed: int, *, legacy_old_data_swap: bool = False
) -> RenderedStream:
    """DTS Canal JSON for ``history``; ``legacy_old_data_swap`` writes the layout of instances created before
    2022-03-20 (dts.md section 2) and sets the decoder option of the same name."""
    rng = random.Random(seed)
    rows = _MysqlRows(history)
    stream = StreamBuilder()
    cache_offset = 1 + rng.randrange(1000)
    for number, group in enumerate(commit_groups(history.changes, rng, transactions=True), start=1):
        cache_offset += 1
        for change in group:
            value = _dts_message(change, rows, legacy_old_data_swap, cache_offset, rng)
            if options.transactions:
                value["gtid"] = f"{SERVER_UUID}:{number}"
            stream.append(Message(None, compact_json(value), _describe(value["type"], change.table, 1)))
        stream.mark_boundary()
    shape(stream, options, rng, DTS_MALFORMED_KINDS, dts_corrupt, compact_json)
    format_options = {"source_timezone": SOURCE_UTC_OFFSET}
    if legacy_old_data_swap:
        format_options["legacy_old_data_swap"] = "true"
    return RenderedStream(
        stream.messages, format_options=format_options, expected=lake_truth(history, mysql_lake_value)
    )


@register_renderer("dts-canal-json")
def render_dts_canal_json_current(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """DTS Canal JSON of an instance created (or restarted) on or after 2022-03-20 (dts.md section 2)."""
    return render_dts_canal_json(history, options, seed)


def _dts_message(
    change: Change, rows: _MysqlRows, legacy: bool, cache_offset: int, rng: random.Random
) -> dict[str, Any]:
    table = change.table
    es = change.event_time_ms // 1000 * 1000  # dts.md section 2: "second resolution, ends in 000"
    ts = change.event_time_ms + rng.randint(5, 900)
    if is_ddl(change):
        # The vendor's DDL example has only these keys (no data / types / pkNames).
        return {
            "database": table.database,
            "es": es,
            "id": cache_offset,
            "isDdl": True,
            "sql": mysql_ddl(change, rows.timestamp_columns),
            "table": table.table,
            "ts": ts,
            "type": "DDL",
        }
    before = rows.image(table, change.before) if change.before is not None else None
    after = rows.image(table, change.after) if change.after is not None else None
    data: list[dict[str, str | None] | None] | None
    old: list[dict[str, str | None] | None] | None
    if change.op == "INSERT":
        data, old = [after], None
    elif change.op == "UPDATE":
        data, old = ([before], [after]) if legacy else ([after], [before])
    else:
        data, old = (None, [before]) if legacy else ([before], None)
    mysql_types, sql_types = rows.declarations(table, full=False)
    return {
        "data": data,
        "database": table.database,
        "es": es,
        "id": cache_offset,
        "isDdl": False,
        "mysqlType": mysql_types,
        "old": old,
        "pkNames": list(table.primary_key) or None,
        "sql": "",
        "sqlType": sql_types,
        "table": table.table,
        "ts": ts,
        "type": change.op,
    }
