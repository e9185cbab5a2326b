"""Renders a :class:`~cdclake.workload.history.SourceHistory` as Huawei DRS JSON: ``drs-json-mysql``,
``drs-jsonc-mysql`` and ``drs-json-relational`` (``shared/formats/drs.md`` sections 2-4, vendor page "Kafka
message format").

Every message holds one row (the vendor examples do; DRS numbers events, not batches); keys in the order of the
vendor examples; ``id`` = DRS's event sequence number, +1 per message (the decoders' ordering position); ``es`` = the
source commit time (ms), ``ts`` = a little later; JSON text with ``< > & = '`` escaped as ``\\u003c`` ... (Gson,
vendor table 6). ADD COLUMN and TRUNCATE are ``type: DDL`` messages with the statement in ``sql`` (the new column
appears in later messages); DRS has no TRUNCATE type and no heartbeats or transaction markers (``heartbeat_every``,
``transactions`` and ``partial_updates`` do not apply: ``old`` is always the full before row). No ``INIT`` full-load
rows (the history starts empty). Kafka keys are null (undocumented).

MySQL (``drs-json-mysql`` / ``drs-jsonc-mysql``, sections 2-3): ``mysqlType`` bare names, ``sqlType`` JDBC with
DATETIME = 94; integers as text, double as Java ``Double.toString``, binaries as Java byte lists (signed, ``[-1,
0]``), booleans as TINYINT(1) ``"1"``/``"0"``; ``timestamp`` columns as DATETIME text ``yyyy-MM-dd HH:mm:ss.SSS``
(UTC wall clock), or as TIMESTAMP when every value fits its 1970-2038 range: epoch seconds ``"1709288131.250"``
(JSON), ``yyyy-MM-dd HH:mm:ss`` on the server's wall clock (+08:00, told to the decoder as ``source_timezone``)
(JSON-C). DELETE: the row in ``old`` (JSON) or in ``data`` (JSON-C). The history's Oracle tables are rendered as
MySQL tables of the same names.

Relational (``drs-json-relational``, section 4): the history's MySQL-templated tables are rendered as a PostgreSQL
source (database = the history's database, schema ``public``; ``columnType`` bigint / character varying / bytea /
boolean / double precision / timestamp with time zone; bytea as bare lowercase hex, booleans ``"true"``/
``"false"``, doubles as PostgreSQL prints them, timestamps as PostgreSQL's ``2024-03-01 18:15:31.25+08``; ``es`` =
commit time of the *previous* transaction, as DRS does for PostgreSQL). Oracle tables (``HistoryConfig.
oracle_tables``) are rendered as DRS does for Oracle: ``database`` and ``columnType`` empty, ``schema`` set, values
as text (NUMBER digits, BINARY_DOUBLE in Java notation, BLOB as lowercase hex, NUMBER(1) booleans ``"1"``/``"0"``,
TIMESTAMP as ``java.sql.Timestamp`` text). ``sqlType`` holds DRS-internal codes: the observed ones (boolean 8,
bytea 15) and placeholders for the rest (the decoder ignores them when ``columnType`` is present). A PostgreSQL
source cannot store U+0000 in text; the history's strings are rendered as they are (the JSON escapes them).

Limits of the formats (``RenderedStream.expected``):

* MySQL BOOLEAN is TINYINT(1): the lake column is ``bigint`` holding 1 / 0.
* JSON-C prints TIMESTAMP without fraction (drs.md section 3): such columns lose their milliseconds.
* Oracle columns have no type in the message: the lake holds every Oracle value as the text DRS sends, under the
  schema name (``database`` is empty for Oracle), and an empty string is NULL (Oracle stores '' as NULL).
* No row identity for key-less tables: the lake identifies their rows by the full image, so identical rows
  collapse into one (:mod:`cdclake.workload._canal_family`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from cdclake.workload._canal_family import (
    DRS_DATETIME_SQL_TYPE,
    MYSQL_TIMESTAMP,
    SOURCE_UTC_OFFSET,
    SOURCE_ZONE,
    Corrupt,
    epoch_seconds_text,
    html_safe_json,
    is_ddl,
    java_byte_list,
    java_double_text,
    lake_truth,
    mysql_ddl,
    mysql_lake_value,
    mysql_timestamp_columns,
    mysql_type,
    postgres_double_text,
    shape,
    spoil_long_value,
    wall_clock_text,
)
from cdclake.workload._shaping import StreamBuilder, commit_groups
from cdclake.workload.history import Change, Column, ColumnKind, SourceHistory, TableSpec
from cdclake.workload.renderers import Message, RenderedStream, RenderOptions, register_renderer

Variant = Literal["json", "jsonc"]

FIRST_ID = 27_000
"""First DRS event sequence number of a rendering (plus a seeded offset)."""

# ----------------------------------------------------------------------------------------------------------------
# MySQL


def mysql_text(column: Column, value: Any, timestamp_type: bool, variant: Variant) -> str | None:
    """A MySQL value as DRS JSON / JSON-C prints it (drs.md sections 2-3)."""
    if value is None:
        return None
    if column.kind in ("long", "string"):
        return str(value)
    if column.kind == "bytes":
        return java_byte_list(value)
    if column.kind == "boolean":
        return "1" if value else "0"
    if column.kind == "double":
        return java_double_text(value)
    if not timestamp_type:
        return wall_clock_text(value, UTC, 3)  # DATETIME(3): the wall clock as stored (the source writes UTC)
    if variant == "json":
        return epoch_seconds_text(value)
    return wall_clock_text(value, SOURCE_ZONE, 0)  # drs.md section 3: "yyyy-MM-dd HH:mm:ss", no fraction


def render_drs_mysql(history: SourceHistory, options: RenderOptions, seed: int, variant: Variant) -> RenderedStream:
    """DRS JSON (``variant="json"``) or JSON-C (``"jsonc"``) for a MySQL source."""
    other = "data" if variant == "json" else "old"
    malformed_kinds = (
        f"DELETE row in {other}",
        "truncated json",
        "unknown type FROBNICATE",
        "bigint value 'abc'",
        "not json",
    )
    timestamp_columns = mysql_timestamp_columns(history)

    def is_timestamp(table: TableSpec, column: Column) -> bool:
        return mysql_type(table, column, timestamp_columns) is MYSQL_TIMESTAMP

    def image(table: TableSpec, row: dict[str, Any] | None) -> list[dict[str, str | None]] | None:
        if row is None:
            return None
        return [{c.name: mysql_text(c, row.get(c.name), is_timestamp(table, c), variant) for c in table.columns}]

    def message(change: Change, sequence: int, rng: random.Random) -> dict[str, Any]:
        table = change.table
        types = [(c.name, mysql_type(table, c, timestamp_columns)) for c in table.columns]
        value: dict[str, Any] = {
            "mysqlType": {name: t.bare for name, t in types},
            "id": sequence,
            "es": change.event_time_ms,
            "ts": change.event_time_ms + rng.randint(50, 1500),
            "database": table.database,
            "table": table.table,
            "type": change.op,
            "isDdl": False,
            "sql": "",
            "sqlType": {name: DRS_DATETIME_SQL_TYPE if t.bare == "datetime" else t.jdbc for name, t in types},
            "data": image(table, change.after),
            "old": image(table, change.before),
            "pkNames": list(table.primary_key) or None,
        }
        if is_ddl(change):
            sql = mysql_ddl(change, timestamp_columns)
            value.update(mysqlType=None, type="DDL", isDdl=True, sql=sql, sqlType=None, pkNames=None)
        elif change.op == "DELETE" and variant == "jsonc":
            # drs.md section 3: JSON-C puts the deleted row in data (JSON: in old).
            value["data"], value["old"] = value["old"], None
        return value

    def corrupt(kind: str, value: dict[str, Any]) -> dict[str, Any] | None:
        if kind.startswith("DELETE row in"):
            # drs.md section 3: a DELETE with its row in the other array is the other variant's message.
            if value.get("type") != "DELETE":
                return None
            row = value["old"] if variant == "json" else value["data"]
            return {**value, "data": row if variant == "json" else None, "old": None if variant == "json" else row}
        if kind == "unknown type FROBNICATE":
            return {**value, "type": "FROBNICATE"}
        if kind == "bigint value 'abc'":
            declared = value.get("mysqlType") or {}
            return spoil_long_value(value, [n for n, t in declared.items() if t == "bigint"])
        raise ValueError(f"unknown malformed kind {kind!r}")

    stream = _render(history, options, seed, message, corrupt, malformed_kinds)

    def lake_value(table: TableSpec, column: Column, value: Any) -> Any:
        if variant == "jsonc" and column.kind == "timestamp" and is_timestamp(table, column):
            return value.replace(microsecond=0)
        return mysql_lake_value(table, column, value)

    return RenderedStream(
        stream.messages,
        format_options={"source_timezone": SOURCE_UTC_OFFSET},
        expected=lake_truth(history, lake_value),
    )


# ----------------------------------------------------------------------------------------------------------------
# Relational: PostgreSQL and Oracle


POSTGRES_TYPES: dict[ColumnKind, tuple[str, int]] = {
    "long": ("bigint", 3),
    "string": ("character varying", 10),
    "bytes": ("bytea", 15),
    "boolean": ("boolean", 8),
    "double": ("double precision", 6),
    "timestamp": ("timestamp with time zone", 17),
}
"""``columnType`` and DRS-internal ``sqlType`` of each kind (drs.md section 4 observed boolean 8 and bytea 15; the
other codes are placeholders)."""

ORACLE_TYPES: dict[ColumnKind, tuple[str, int]] = {
    "long": ("NUMBER(19)", 2),
    "string": ("VARCHAR2(255)", 12),
    "bytes": ("BLOB", 2004),
    "boolean": ("NUMBER(1)", 2),
    "double": ("BINARY_DOUBLE", 101),
    "timestamp": ("TIMESTAMP(3)", 93),
}
"""Oracle declaration (for DDL text) and an illustrative ``sqlType`` of each kind (drs.md section 4: Oracle's codes
are not documented)."""


def is_oracle(table: TableSpec) -> bool:
    return table.db_type.lower() == "oracle"


def postgres_timestamp_text(value: datetime) -> str:
    """``timestamp with time zone`` as PostgreSQL prints it on a +08:00 session: fraction without trailing zeros
    (none if zero), then the offset (``2024-03-01 18:15:31.25+08``)."""
    local = value.astimezone(SOURCE_ZONE)
    text = local.strftime("%Y-%m-%d %H:%M:%S")
    if local.microsecond:
        text += "." + f"{local.microsecond:06d}".rstrip("0")
    offset = local.utcoffset()
    assert offset is not None
    minutes = int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    hours, rest = divmod(abs(minutes), 60)
    return f"{text}{sign}{hours:02d}" + (f":{rest:02d}" if rest else "")


def java_timestamp_text(value: datetime) -> str:
    """``java.sql.Timestamp.toString()`` of the UTC wall clock: fraction without trailing zeros, at least ``.0``."""
    text = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{f'{value.microsecond:06d}'.rstrip('0') or '0'}"


def postgres_text(column: Column, value: Any) -> str | None:
    """A PostgreSQL value as DRS prints it (drs.md section 4)."""
    if value is None:
        return None
    if column.kind in ("long", "string"):
        return str(value)
    if column.kind == "bytes":
        return bytes(value).hex()  # bare lowercase hex, no \x
    if column.kind == "boolean":
        return "true" if value else "false"
    if column.kind == "double":
        return postgres_double_text(value)
    return postgres_timestamp_text(value)


def oracle_text(column: Column, value: Any) -> str | None:
    """An Oracle value as DRS sends it: text (Oracle stores '' as NULL)."""
    if value is None or value == "":
        return None
    if column.kind in ("long", "string"):
        return str(value)
    if column.kind == "bytes":
        return bytes(value).hex()
    if column.kind == "boolean":
        return "1" if value else "0"
    if column.kind == "double":
        return java_double_text(value)
    return java_timestamp_text(value)


def relational_ddl(change: Change) -> str:
    table = change.table
    schema = table.schema if is_oracle(table) else "public"
    name = f'"{schema}"."{table.table}"'
    if change.op == "TRUNCATE":
        return f"TRUNCATE TABLE {name}"
    column = change.added_column
    if change.op != "ADD_COLUMN" or column is None:
        raise ValueError(f"{change.op} is not DDL")
    if is_oracle(table):
        return f'ALTER TABLE {name} ADD ("{column.name}" {ORACLE_TYPES[column.kind][0]})'
    return f'ALTER TABLE {name} ADD COLUMN "{column.name}" {POSTGRES_TYPES[column.kind][0]}'


@register_renderer("drs-json-relational")
def render_relational(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """DRS JSON for Oracle and PostgreSQL sources (see the module doc for how tables map to them)."""
    previous_commit: dict[str, int] = {}

    def message(change: Change, sequence: int, rng: random.Random) -> dict[str, Any]:
        table = change.table
        oracle = is_oracle(table)
        text = oracle_text if oracle else postgres_text
        types = ORACLE_TYPES if oracle else POSTGRES_TYPES

        def image(row: dict[str, Any] | None) -> list[dict[str, str | None]] | None:
            return None if row is None else [{c.name: text(c, row.get(c.name)) for c in table.columns}]

        # drs.md section 4: for PostgreSQL, es is the commit time of the previous transaction.
        es = change.event_time_ms if oracle else previous_commit.get("postgres", history.changes[0].event_time_ms)
        vendor_type = "DDL" if is_ddl(change) else change.op
        value: dict[str, Any] = {
            "columnType": {} if oracle else {c.name: types[c.kind][0] for c in table.columns},
            "dbType": "Oracle" if oracle else "PostgreSQL",
            "schema": table.schema if oracle else "public",
            "opType": vendor_type,
            "id": sequence,
            "es": es,
            "ts": change.event_time_ms + rng.randint(50, 1500),
            "database": "" if oracle else table.database,
            "table": table.table,
            "type": vendor_type,
            "isDdl": is_ddl(change),
            "sql": "",
            "sqlType": {c.name: types[c.kind][1] for c in table.columns},
            "data": image(change.after),
            "old": image(change.before),  # drs.md section 4: DELETE row placement as in JSON (old)
            "pkNames": list(table.primary_key) or None,
        }
        if is_ddl(change):
            value.update(columnType=None, sql=relational_ddl(change), sqlType=None, pkNames=None)
        return value

    def on_commit(group: list[Change]) -> None:
        postgres = [c for c in group if not is_oracle(c.table)]
        if postgres:
            previous_commit["postgres"] = postgres[-1].event_time_ms

    def corrupt(kind: str, value: dict[str, Any]) -> dict[str, Any] | None:
        if kind == "DELETE row in data":
            if value.get("type") != "DELETE":
                return None
            return {**value, "data": value["old"], "old": None}
        if kind == "unknown type FROBNICATE":
            return {**value, "type": "FROBNICATE", "opType": "FROBNICATE"}
        if kind == "bigint value 'abc'":
            declared = value.get("columnType") or {}
            return spoil_long_value(value, [n for n, t in declared.items() if t == "bigint"])
        raise ValueError(f"unknown malformed kind {kind!r}")

    kinds = ("DELETE row in data", "truncated json", "unknown type FROBNICATE", "bigint value 'abc'", "not json")
    stream = _render(history, options, seed, message, corrupt, kinds, on_commit)

    def lake_value(table: TableSpec, column: Column, value: Any) -> Any:
        return oracle_text(column, value) if is_oracle(table) else value

    def lake_table(table: TableSpec) -> tuple[str, str]:
        # drs.md section 4: database is empty for Oracle; the decoder files the table under its schema.
        return (table.schema or table.database, table.table) if is_oracle(table) else table.ident

    return RenderedStream(stream.messages, expected=lake_truth(history, lake_value, lake_table))


# ----------------------------------------------------------------------------------------------------------------
# Stream


def _render(
    history: SourceHistory,
    options: RenderOptions,
    seed: int,
    message: Callable[[Change, int, random.Random], dict[str, Any]],
    corrupt: Corrupt,
    malformed_kinds: tuple[str, ...],
    on_commit: Callable[[list[Change]], None] | None = None,
) -> StreamBuilder:
    rng = random.Random(seed)
    stream = StreamBuilder()
    sequence = FIRST_ID + rng.randrange(1000)
    for group in commit_groups(history.changes, rng, transactions=True):
        for change in group:
            sequence += 1
            value = message(change, sequence, rng)
            description = f"{value['type']} {change.table.qualified_name}"
            stream.append(Message(None, html_safe_json(value), description))
        if on_commit is not None:
            on_commit(group)
        stream.mark_boundary()
    shape(stream, options, rng, malformed_kinds, corrupt, html_safe_json)
    return stream


@register_renderer("drs-json-mysql")
def render_drs_json_mysql(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """DRS JSON for a MySQL source (drs.md section 2)."""
    return render_drs_mysql(history, options, seed, "json")


@register_renderer("drs-jsonc-mysql")
def render_drs_jsonc_mysql(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """DRS JSON-C for a MySQL source (drs.md section 3)."""
    return render_drs_mysql(history, options, seed, "jsonc")
