"""Renders a :class:`~cdclake.workload.history.SourceHistory` as Alibaba DTS Avro messages (``dts-avro``).

Spec: ``formats/dts.md`` section 1, schema ``formats/dts-record.avsc`` (written out below from the ``.avsc``; a unit
test keeps the two identical). Each Kafka value is the plain Avro binary of one ``Record`` (1.1), as a DTS sync task
or subscription channel with a MySQL source writes it:

* INSERT / UPDATE / DELETE: ``objectName`` ``db.table`` (a dot inside a name escaped as ``\\u002E``, 1.4), ``fields``
  with MySQL binlog type codes, full ``beforeImages`` / ``afterImages`` (1.8), ``tags.pk_uk_info`` with the primary
  key (``{}`` for a key-less table, 1.5), ``sourcePosition`` ``<offset>@<binlog file>`` increasing along the
  stream (the binlog rotates now and then, between transactions), ``id`` increasing, ``sourceTimestamp`` and
  ``bornTimestamp`` in epoch seconds (1.2).
* Values (1.6, 1.7): ``long`` = BIGINT -> ``Integer`` (precision 8 = storage bytes); ``boolean`` = TINYINT(1) ->
  ``Integer`` ``"1"``/``"0"``; ``string`` = VARCHAR utf8mb4 -> ``Character``; ``bytes`` = BLOB ->
  ``BinaryObject``; ``double`` = DOUBLE -> ``Float``; ``timestamp`` = DATETIME(3) -> ``DateTime`` (all parts,
  ``millis`` in microseconds for MySQL); NULL -> the union's null branch.
* Transactions (``options.transactions``): ``BEGIN`` and ``COMMIT`` records around 1-5 changes, with a GTID tag.
* ``HEARTBEAT`` records and NOOP placeholders (at most 48 bytes, 1.1) alternate every ``heartbeat_every`` messages.
* ADD COLUMN: a ``DDL`` record (``objectName`` = database only, SQL text in ``afterImages``, 1.3); later records
  carry the new field. TRUNCATE: a ``DDL`` record ``TRUNCATE TABLE ...``, all a MySQL source produces (the table
  name is only in the SQL, 1.4; cdclake parses it and empties the table at its position).
* ``options.partial_updates``: binlog_row_image=NOBLOB on tables with a primary key: a BLOB column an UPDATE does
  not change is not logged, ``EmptyObject.NONE`` in both images (1.6: keep the stored value).

Limits of the format, mapped in :attr:`RenderedStream.expected` (what the lake holds instead of the truth):

* BIGINT arrives as decimal text that may be BIGINT UNSIGNED, so ``long`` columns land as ``decimal(20,0)``
  (exact); TINYINT(1) is an integer, so ``boolean`` columns land as ``0`` / ``1``.
* A key-less table has no row id in DTS Avro (no ``pk_uk_info``, 1.8): the full image is the row identity, so
  identical rows collapse into one and an UPDATE or DELETE of one of them hits all of them.

Choices where the spec is silent: Kafka keys are null (1.1: not used); ``safeSourcePosition`` is the position of
the transaction's first record; ``sourceTxid`` is ``"0"`` (as observed for MySQL); tags carry ``metaVersion`` (bumped
by ADD COLUMN) and ``readerThroughoutTime``; every table, Oracle ones of a history included, is rendered as a MySQL
table ``<database>.<table>`` (DTS's Oracle type codes are undocumented, 1.7).
"""

from __future__ import annotations

import copy
import json
import random
from decimal import Decimal
from typing import Any, Final

from cdclake.workload import _avro, _lake_model, _shaping
from cdclake.workload.history import Change, ColumnKind, SourceHistory, TableSpec, datetime_to_ms
from cdclake.workload.renderers import Message, RenderedStream, RenderOptions, register_renderer

NAMESPACE: Final = "com.alibaba.dts.formats.avro"

_record = _avro.record_schema

_OPTIONAL_INT: Final = ["null", "int"]
_VALUE_UNION: Final[list[Any]] = [
    "null",
    _record("Integer", ("precision", "int"), ("value", "string")),
    _record("Character", ("charset", "string"), ("value", "bytes")),
    _record("Decimal", ("value", "string"), ("precision", "int"), ("scale", "int")),
    _record("Float", ("value", "double"), ("precision", "int"), ("scale", "int")),
    _record("Timestamp", ("timestamp", "long"), ("millis", "int")),
    {
        "type": "record",
        "name": "DateTime",
        "fields": [
            {"name": part, "type": _OPTIONAL_INT, "default": None}
            for part in ("year", "month", "day", "hour", "minute", "second", "millis")
        ],
    },
    _record("TimestampWithTimeZone", ("value", "DateTime"), ("timezone", "string")),
    _record("BinaryGeometry", ("type", "string"), ("value", "bytes")),
    _record("TextGeometry", ("type", "string"), ("value", "string")),
    _record("BinaryObject", ("type", "string"), ("value", "bytes")),
    _record("TextObject", ("type", "string"), ("value", "string")),
    {"type": "enum", "name": "EmptyObject", "symbols": ["NULL", "NONE"]},
]
SOURCE_TYPES: Final = (
    "MySQL", "Oracle", "SQLServer", "PostgreSQL", "MongoDB", "Redis", "DB2", "PPAS", "DRDS", "HBASE", "HDFS",
    "FILE", "OTHER",
)  # fmt: skip
OPERATIONS: Final = (
    "INSERT", "UPDATE", "DELETE", "DDL", "BEGIN", "COMMIT", "ROLLBACK", "ABORT", "HEARTBEAT", "CHECKPOINT",
    "COMMAND", "FILL", "FINISH", "CONTROL", "RDB", "NOOP", "INIT",
)  # fmt: skip

SCHEMA: Final[dict[str, Any]] = {
    "type": "record",
    "name": "Record",
    "namespace": NAMESPACE,
    "fields": [
        {"name": "version", "type": "int"},
        {"name": "id", "type": "long"},
        {"name": "sourceTimestamp", "type": "long"},
        {"name": "sourcePosition", "type": "string"},
        {"name": "safeSourcePosition", "type": "string", "default": ""},
        {"name": "sourceTxid", "type": "string", "default": ""},
        {
            "name": "source",
            "type": _record(
                "Source",
                ("sourceType", {"type": "enum", "name": "SourceType", "symbols": list(SOURCE_TYPES)}),
                ("version", "string"),
            ),
        },
        {"name": "operation", "type": {"type": "enum", "name": "Operation", "symbols": list(OPERATIONS)}},
        {"name": "objectName", "type": ["null", "string"], "default": None},
        {"name": "processTimestamps", "type": ["null", {"type": "array", "items": "long"}], "default": None},
        {"name": "tags", "type": {"type": "map", "values": "string"}, "default": {}},
        {
            "name": "fields",
            "type": [
                "null",
                "string",
                {"type": "array", "items": _record("Field", ("name", "string"), ("dataTypeNumber", "int"))},
            ],
            "default": None,
        },
        {"name": "beforeImages", "type": ["null", "string", {"type": "array", "items": _VALUE_UNION}], "default": None},
        {
            "name": "afterImages",
            "type": [
                "null",
                "string",
                {"type": "array", "items": ["null", *(f"{NAMESPACE}.{branch['name']}" for branch in _VALUE_UNION[1:])]},
            ],
            "default": None,
        },
        {"name": "bornTimestamp", "type": "long", "default": 0},
    ],
}
"""``formats/dts-record.avsc`` without its documentation strings."""

MYSQL_TYPE_CODES: Final[dict[ColumnKind, int]] = {
    "long": 8,  # BIGINT
    "boolean": 1,  # TINYINT(1)
    "string": 253,  # VAR_STRING (VARCHAR)
    "bytes": 252,  # BLOB
    "double": 5,  # DOUBLE
    "timestamp": 12,  # DATETIME
}
"""dts.md 1.7: MySQL binlog column type code of each column kind."""

MYSQL_DDL_TYPES: Final[dict[ColumnKind, str]] = {
    "long": "bigint",
    "boolean": "tinyint(1)",
    "string": "varchar(255)",
    "bytes": "blob",
    "double": "double",
    "timestamp": "datetime(3)",
}
MYSQL_VERSION: Final = "8.0.28"
SERVER_UUID: Final = "3b4cd6e2-5a1f-11ee-9c2a-00163e0a1f2b"
FIRST_BINLOG_FILE: Final = 78
BINLOG_ROTATE_BYTES: Final = 16_384
"""Small on purpose: a rendered stream crosses a few binlog files, so positions compare file numbers too."""
NOOP_MAX_BYTES: Final = 48

MALFORMED_KINDS: Final = ("truncated record", "not avro", "Integer value 'abc'", "afterImages shorter than fields")


def _union(branch: str, value: Any) -> tuple[str, Any]:
    """An explicitly chosen branch of the value union (fastavro's ``(name, value)`` notation)."""
    return (f"{NAMESPACE}.{branch}", value)


def encode_value(kind: ColumnKind, value: Any) -> Any:
    """One column value as the DTS value union (dts.md 1.6) for a MySQL column of ``kind``."""
    if value is None:
        return None
    if kind == "long":
        return _union("Integer", {"precision": 8, "value": str(value)})
    if kind == "boolean":
        return _union("Integer", {"precision": 1, "value": "1" if value else "0"})
    if kind == "string":
        return _union("Character", {"charset": "utf8mb4", "value": value.encode("utf-8")})
    if kind == "bytes":
        return _union("BinaryObject", {"type": "BLOB", "value": bytes(value)})
    if kind == "double":
        # MySQL DOUBLE metadata: display width 22, NOT_FIXED_DEC (31) decimals.
        return _union("Float", {"value": float(value), "precision": 22, "scale": 31})
    if kind == "timestamp":
        ms = datetime_to_ms(value)
        wall = value
        return _union(
            "DateTime",
            {
                "year": wall.year,
                "month": wall.month,
                "day": wall.day,
                "hour": wall.hour,
                "minute": wall.minute,
                "second": wall.second,
                "millis": (ms % 1000) * 1000,  # dts.md 1.6: microseconds for MySQL sources
            },
        )
    raise ValueError(f"unknown column kind {kind!r}")


NOT_LOGGED: Final = "NONE"
"""dts.md 1.6 ``EmptyObject.NONE``: the value was not logged (binlog_row_image=NOBLOB). Written as the bare symbol:
the only branch of the value union a string fits is the enum (fastavro rejects the ``(name, symbol)`` form for an
enum defined inside ``beforeImages``)."""


def object_name(*parts: str) -> str:
    """dts.md 1.4: parts joined with ``.``; a dot inside a part is written as the literal text ``\\u002E``."""
    return ".".join(part.replace(".", "\\u002E") for part in parts)


def pk_uk_info(table: TableSpec) -> str:
    """dts.md 1.5: ``{"PRIMARY": [...]}``, ``{}`` for a key-less table."""
    info = {"PRIMARY": list(table.primary_key)} if table.primary_key else {}
    return json.dumps(info, separators=(",", ":"))


def ddl_text(change: Change) -> str:
    """The SQL a MySQL source logs for a TRUNCATE or ADD COLUMN change."""
    table = change.table
    if change.op == "TRUNCATE":
        return f"TRUNCATE TABLE `{table.table}`"
    column = change.added_column
    if change.op != "ADD_COLUMN" or column is None:
        raise ValueError(f"{change.op} is not DDL")
    return f"ALTER TABLE `{table.table}` ADD COLUMN `{column.name}` {MYSQL_DDL_TYPES[column.kind]} NULL"


_WRITER: Final = _avro.SchemalessWriter(SCHEMA)


def to_avro(record: dict[str, Any]) -> bytes:
    """Plain Avro binary of one DTS record (dts.md 1.1: no container, no framing)."""
    return _WRITER.write(record)


class _Binlog:
    """Source positions of a MySQL binlog: ``<offset>@<file number>``, rotating between transactions."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.file = FIRST_BINLOG_FILE
        self.offset = 4  # after the binlog magic bytes

    def next(self) -> str:
        self.offset += self.rng.randint(60, 700)
        return f"{self.offset}@{self.file}"

    def current(self) -> str:
        return f"{self.offset}@{self.file}"

    def maybe_rotate(self) -> None:
        if self.offset >= BINLOG_ROTATE_BYTES:
            self.file += 1
            self.offset = 4


class _Renderer:
    def __init__(self, history: SourceHistory, options: RenderOptions, seed: int) -> None:
        self.history = history
        self.options = options
        self.rng = random.Random(seed)
        self.binlog = _Binlog(self.rng)
        self.stream = _shaping.StreamBuilder()
        self.record_id = 1_000_000
        self.transaction = 0
        self.meta_versions: dict[tuple[str, str], int] = {}
        self.row_records: list[dict[str, Any]] = []
        self.latest_seconds = history.changes[0].event_time_ms // 1000 if history.changes else 0
        self.heartbeats = 0

    def record(
        self, operation: str, seconds: int, safe_position: str, position: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        self.record_id += 1
        record: dict[str, Any] = {
            "version": 0,
            "id": self.record_id,
            "sourceTimestamp": seconds,
            "sourcePosition": position or self.binlog.next(),
            "safeSourcePosition": safe_position,
            "sourceTxid": "0",
            "source": {"sourceType": "MySQL", "version": MYSQL_VERSION},
            "operation": operation,
            "objectName": None,
            "processTimestamps": None,
            "tags": {},
            "fields": None,
            "beforeImages": None,
            "afterImages": None,
            "bornTimestamp": seconds,
        }
        record.update(fields)
        return record

    def emit(self, record: dict[str, Any], description: str) -> None:
        self.stream.append(Message(None, to_avro(record), description))

    def row_record(self, change: Change, safe_position: str) -> dict[str, Any]:
        table = change.table
        seconds = change.event_time_ms // 1000
        columns = table.columns
        before = [encode_value(c.kind, (change.before or {}).get(c.name)) for c in columns]
        after = [encode_value(c.kind, (change.after or {}).get(c.name)) for c in columns]
        if change.op == "UPDATE" and self.options.partial_updates and table.primary_key:
            assert change.before is not None
            assert change.after is not None
            for i, column in enumerate(columns):
                unchanged = change.before.get(column.name) == change.after.get(column.name)
                if column.kind == "bytes" and unchanged:
                    before[i] = after[i] = NOT_LOGGED
        reader_time = change.event_time_ms + self.rng.randint(3, 800)
        return self.record(
            change.op,
            seconds,
            safe_position,
            objectName=object_name(table.database, table.table),
            tags={
                "pk_uk_info": pk_uk_info(table),
                "metaVersion": str(self.meta_versions.get(table.ident, 1)),
                "readerThroughoutTime": str(reader_time),
            },
            fields=[{"name": c.name, "dataTypeNumber": MYSQL_TYPE_CODES[c.kind]} for c in columns],
            beforeImages=before if change.before is not None else None,
            afterImages=after if change.after is not None else None,
        )

    def gtid_tags(self) -> dict[str, str]:
        return {"GTID": f"{SERVER_UUID}:{self.transaction}", "thread_id": str(4000 + self.transaction % 97)}

    def render_group(self, group: list[Change]) -> None:
        self.binlog.maybe_rotate()
        self.transaction += 1
        first = group[0]
        if first.op in _shaping.SCHEMA_CHANGES:
            if first.op == "ADD_COLUMN":
                self.meta_versions[first.table.ident] = self.meta_versions.get(first.table.ident, 1) + 1
            seconds = first.event_time_ms // 1000
            position = self.binlog.next()
            ddl = self.record(
                "DDL",
                seconds,
                position,
                position,
                objectName=object_name(first.table.database),
                tags={**self.gtid_tags(), "commitTimestamp": str(seconds)},
                afterImages=ddl_text(first),
            )
            self.emit(ddl, f"DDL {first.table.qualified_name} ({first.op})")
        else:
            wrapped = self.options.transactions
            safe_position = self.binlog.next() if wrapped else ""
            if wrapped:
                begin_seconds = first.event_time_ms // 1000
                self.emit(
                    self.record("BEGIN", begin_seconds, safe_position, safe_position, tags=self.gtid_tags()), "BEGIN"
                )
            for change in group:
                record = self.row_record(change, safe_position)
                if not wrapped:  # a change outside a transaction is its own resume point
                    record["safeSourcePosition"] = record["sourcePosition"]
                self.row_records.append(record)
                self.emit(record, f"{change.op} {change.table.qualified_name}")
            if wrapped:
                commit_seconds = group[-1].event_time_ms // 1000
                self.emit(self.record("COMMIT", commit_seconds, safe_position, tags=self.gtid_tags()), "COMMIT")
        self.latest_seconds = max(self.latest_seconds, group[-1].event_time_ms // 1000)
        self.stream.mark_boundary()

    def progress_marker(self) -> None:
        """A HEARTBEAT record, or a NOOP placeholder of at most 48 bytes (dts.md 1.1), alternately."""
        self.heartbeats += 1
        position = self.binlog.current()
        if self.heartbeats % 2:
            heartbeat = self.record(
                "HEARTBEAT",
                self.latest_seconds,
                position,
                position,
                tags={"readerThroughoutTime": str(self.latest_seconds * 1000 + self.rng.randint(0, 999))},
            )
            self.emit(heartbeat, "heartbeat")
        else:
            noop = self.record("NOOP", self.latest_seconds, "", position, bornTimestamp=0)
            noop["source"] = {"sourceType": "MySQL", "version": ""}
            value = to_avro(noop)
            if len(value) > NOOP_MAX_BYTES:
                raise AssertionError(f"NOOP placeholder of {len(value)} bytes")
            self.stream.append(Message(None, value, "NOOP placeholder"))
        self.stream.mark_boundary()

    def malformed(self, index: int, rng: random.Random) -> Message:
        kind = MALFORMED_KINDS[index % len(MALFORMED_KINDS)]
        if not self.row_records and kind != "not avro":
            kind = "not avro"
        if kind == "not avro":
            page = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
            return Message(None, page, f"malformed: {kind}")
        template = copy.deepcopy(rng.choice(self.row_records))
        self.record_id += 1
        template["id"] = self.record_id
        if kind == "truncated record":
            value = to_avro(template)
            # Longer than 48 bytes, or it would be a NOOP placeholder rather than a broken record.
            return Message(None, value[: rng.randint(NOOP_MAX_BYTES + 1, len(value) - 1)], f"malformed: {kind}")
        image = template["afterImages"] if template["afterImages"] is not None else template["beforeImages"]
        if kind == "Integer value 'abc'" and not _avro.spoil_integer(image, rng, NAMESPACE):
            kind = "afterImages shorter than fields"
        if kind == "afterImages shorter than fields":
            del image[-1]
        return Message(None, to_avro(template), f"malformed: {kind}")

    def render(self) -> RenderedStream:
        since_marker = 0
        for group in _shaping.commit_groups(self.history.changes, self.rng, self.options.transactions):
            before = len(self.stream.messages)
            self.render_group(group)
            since_marker += len(self.stream.messages) - before
            if self.options.heartbeat_every and since_marker >= self.options.heartbeat_every:
                self.progress_marker()
                since_marker = 0
        _shaping.shape(self.stream, self.options, self.rng, self.malformed)
        expected = _lake_model.expected_tables(self.history, "full_image", applies_truncate=True, to_lake=lake_row)
        return RenderedStream(self.stream.messages, expected=expected)


def lake_value(kind: ColumnKind, value: Any) -> Any:
    """A source value as the lake holds it after DTS Avro (see the module doc)."""
    if value is None:
        return None
    if kind == "long":
        return Decimal(value)
    if kind == "boolean":
        return int(value)
    return value


def lake_row(table: TableSpec, identity: Any, row: dict[str, Any]) -> dict[str, Any]:
    del identity  # DTS Avro adds no identity column
    return {c.name: lake_value(c.kind, row.get(c.name)) for c in table.columns}


@register_renderer("dts-avro")
def render_stream(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """The history as a DTS Avro stream of a MySQL source (see the module doc)."""
    return _Renderer(history, options, seed).render()
