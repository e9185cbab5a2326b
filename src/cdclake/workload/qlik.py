"""Renders a :class:`~cdclake.workload.history.SourceHistory` as Qlik Replicate Kafka messages (``formats/qlik.md``):
``qlik-json`` (atMSG JSON envelope) and ``qlik-avro`` (Avro ``MessageEnvelope``, no schema registry).

What the stream holds, all on one topic so that a replay of one capture file works:

* an **MD message** per table version (qlik.md 2) before the table's first data message, and a new one (next
  ``tableVersion``, new ``schemaId``) at each ``ADD_COLUMN``: columns with Replicate types and ordinals, the key as
  ``primaryKeyPosition``, the Avro ``dataSchema`` of the version's data messages;
* a **DT message** per row change (qlik.md 3), referencing its MD with ``messageSchemaId``: ``changeSequence``
  (``YYYYMMDDHHmmSShh`` of the commit time + a 19-digit change number), ``timestamp`` (UTC), ``transactionId``, with
  ``options.transactions`` also ``transactionEventCounter`` / ``transactionLastEvent`` (1-5 changes per
  transaction); ``beforeData`` on every UPDATE ("include before image" on: tables without a key need it); masks by
  ordinal (qlik.md 4): ``columnMask`` all columns, ``changeMask`` the inserted / changed / key columns;
* **REFRESH** rows: the history's leading inserts (up to 10, before any other change) are rendered as the task's
  full load (no change sequence, no masks);
* with ``options.partial_updates``, about half of the updates of keyed tables are rendered as Oracle without full
  supplemental logging writes them: ``columnMask`` = key + changed columns, the other columns null (not captured);
* ``options.resends`` windows of 5-30 earlier messages written again byte for byte (between transactions), and
  ``options.malformed`` undecodable messages (description ``malformed: <kind>``).

Format limits, applied by ``RenderedStream.expected`` (the lake must hold the source truth after them):

* **TRUNCATE**: Replicate has no truncate data message (qlik.md 3) and the Kafka target cannot truncate a topic, so
  a source TRUNCATE produces no message: the rows it removed stay in the lake unless later changes touch them.
* **Tables without a key**: Replicate carries no row id, so the full row is the identity: identical rows are one.
* Tables are named by their Qlik schema (Oracle: the schema, e.g. ``SALES``; MySQL: the database).

Types (qlik.md 5): long -> INT8 (JSON number, Avro long); string -> WSTRING; bytes -> BYTES (JSON hex digits, Avro
bytes); boolean -> BOOLEAN; double -> REAL8; timestamp -> DATETIME(6) (JSON ``yyyy-MM-dd HH:mm:ss.ffffff`` wall
clock in UTC, Avro ``timestamp-micros``). Kafka key: ``SCHEMA+TABLE`` (the task setting a public consumer expects).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import random
from dataclasses import dataclass
from datetime import UTC
from typing import Any, Literal

import fastavro

from cdclake.workload._shaping import StreamBuilder, add_resend, commit_groups
from cdclake.workload.history import Change, ColumnKind, SourceHistory, TableSpec, ms_to_datetime
from cdclake.workload.renderers import Message, RenderedStream, RenderOptions, Truth, register_renderer

Encoding = Literal["json", "avro"]

MAGIC = b"atMSG"

REPLICATE_TYPES: dict[ColumnKind, tuple[str, int, int, int]] = {
    "long": ("INT8", 0, 19, 0),
    "string": ("WSTRING", 255, 0, 0),
    "bytes": ("BYTES", 2000, 0, 0),
    "boolean": ("BOOLEAN", 1, 0, 0),
    "double": ("REAL8", 0, 0, 0),
    "timestamp": ("DATETIME", 0, 0, 6),
}
"""Replicate ``type``, ``length``, ``precision``, ``scale`` of each column kind (qlik.md 2)."""

AVRO_TYPES: dict[ColumnKind, Any] = {
    "long": "long",
    "string": "string",
    "bytes": "bytes",
    "boolean": "boolean",
    "double": "double",
    "timestamp": {"type": "long", "logicalType": "timestamp-micros"},
}
"""Avro type of each column kind in a ``dataSchema`` (logical types on, qlik.md 5)."""

HEADERS_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Headers",
    "fields": [
        {
            "name": "operation",
            "type": {"type": "enum", "name": "operation", "symbols": ["INSERT", "UPDATE", "DELETE", "REFRESH"]},
        },
        {"name": "changeSequence", "type": "string"},
        {"name": "timestamp", "type": "string"},
        {"name": "streamPosition", "type": "string"},
        {"name": "transactionId", "type": "string"},
        {"name": "changeMask", "type": ["null", "bytes"]},
        {"name": "columnMask", "type": ["null", "bytes"]},
        {"name": "transactionEventCounter", "type": ["null", "long"]},
        {"name": "transactionLastEvent", "type": ["null", "boolean"]},
    ],
}
"""``headers`` record of every ``dataSchema`` (qlik.md 3)."""

METADATA_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "MetadataMessage",
    "fields": [
        {"name": "schemaId", "type": "string"},
        {
            "name": "lineage",
            "type": {
                "type": "record",
                "name": "Lineage",
                "fields": [
                    {"name": "server", "type": "string"},
                    {"name": "task", "type": "string"},
                    {"name": "schema", "type": "string"},
                    {"name": "table", "type": "string"},
                    {"name": "tableVersion", "type": "int"},
                    {"name": "timestamp", "type": "string"},
                ],
            },
        },
        {
            "name": "tableStructure",
            "type": {
                "type": "record",
                "name": "TableStructure",
                "fields": [
                    {
                        "name": "tableColumns",
                        "type": {
                            "type": "map",
                            "values": {
                                "type": "record",
                                "name": "TableColumn",
                                "fields": [
                                    {"name": "ordinal", "type": "int"},
                                    {"name": "type", "type": "string"},
                                    {"name": "length", "type": "int"},
                                    {"name": "precision", "type": "int"},
                                    {"name": "scale", "type": "int"},
                                    {"name": "primaryKeyPosition", "type": "int"},
                                    {"name": "nullable", "type": "boolean"},
                                ],
                            },
                        },
                    }
                ],
            },
        },
        {"name": "dataSchema", "type": "string"},
    ],
}
"""Avro schema of the metadata record (qlik.md 2), sent as each MD envelope's ``messageSchema``."""
METADATA_SCHEMA_TEXT = json.dumps(METADATA_SCHEMA, separators=(",", ":"))
METADATA_SCHEMA_ID = hashlib.md5(METADATA_SCHEMA_TEXT.encode()).hexdigest().upper()

ENVELOPE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "MessageEnvelope",
    "fields": [
        {"name": "magic", "type": {"type": "fixed", "name": "Magic", "size": 5}},
        {"name": "type", "type": "string"},
        {"name": "headers", "type": ["null", {"type": "map", "values": "string"}]},
        {"name": "messageSchemaId", "type": ["null", "string"]},
        {"name": "messageSchema", "type": ["null", "string"]},
        {"name": "message", "type": "bytes"},
    ],
}
"""qlik.md 1 "Avro": the envelope of every Avro message."""

SERVER = "qrep-01"
TASK = "cdclake-workload"
FULL_LOAD_ROWS = 10

MALFORMED_JSON: tuple[str, ...] = ("INT8 value 'abc'", "truncated json", "unknown operation FROBNICATE", "not json")
MALFORMED_AVRO: tuple[str, ...] = ("unknown messageSchemaId", "truncated envelope", "wrong magic", "not an envelope")
"""Kinds of undecodable messages, in the order the renderer cycles through them."""


# ----------------------------------------------------------------------------------------------------------
# Table versions and their MD messages


@dataclass(frozen=True)
class TableVersion:
    """One structure version of a source table as Replicate describes it in an MD message."""

    spec: TableSpec
    version: int

    @property
    def qlik_schema(self) -> str:
        """Qlik ``lineage.schema``: the owning schema (Oracle), else the database."""
        return self.spec.schema or self.spec.database

    @property
    def schema_id(self) -> str:
        """32 upper-case hex digits, stable for the table and version (DT ``messageSchemaId``)."""
        text = f"{self.qlik_schema}.{self.spec.table}.v{self.version}"
        return hashlib.md5(text.encode()).hexdigest().upper()

    @property
    def kafka_key(self) -> bytes:
        return f"{self.qlik_schema}+{self.spec.table}".encode()

    def ordinal(self, name: str) -> int:
        return self.spec.column_names().index(name) + 1

    def data_schema(self) -> dict[str, Any]:
        data = {
            "type": "record",
            "name": "Data",
            "fields": [{"name": c.name, "type": ["null", AVRO_TYPES[c.kind]]} for c in self.spec.columns],
        }
        return {
            "type": "record",
            "name": "DataRecord",
            "fields": [
                {"name": "data", "type": data},
                {"name": "beforeData", "type": ["null", "Data"]},
                {"name": "headers", "type": HEADERS_SCHEMA},
            ],
        }

    def metadata(self, timestamp: str) -> dict[str, Any]:
        """The MD ``message`` (qlik.md 2)."""
        columns: dict[str, Any] = {}
        for ordinal, column in enumerate(self.spec.columns, start=1):
            kind, length, precision, scale = REPLICATE_TYPES[column.kind]
            key = self.spec.primary_key.index(column.name) + 1 if column.name in self.spec.primary_key else 0
            columns[column.name] = {
                "ordinal": ordinal,
                "type": kind,
                "length": length,
                "precision": precision,
                "scale": scale,
                "primaryKeyPosition": key,
                "nullable": key == 0,
            }
        return {
            "schemaId": self.schema_id,
            "lineage": {
                "server": SERVER,
                "task": TASK,
                "schema": self.qlik_schema,
                "table": self.spec.table,
                "tableVersion": self.version,
                "timestamp": timestamp,
            },
            "tableStructure": {"tableColumns": columns},
            "dataSchema": json.dumps(self.data_schema(), separators=(",", ":")),
        }


def mask(ordinals: set[int], width: int) -> bytes:
    """qlik.md 4: bit ``ordinal - 1``; the first byte holds ordinals 1-8 (least significant bit first)."""
    out = bytearray((width + 7) // 8)
    for ordinal in ordinals:
        out[(ordinal - 1) // 8] |= 1 << ((ordinal - 1) % 8)
    return bytes(out)


def change_sequence(event_time_ms: int, number: int) -> str:
    """qlik.md 3: ``YYYYMMDDHHmmSShh`` (commit time, hundredths) + 19-digit change number: 35 digits."""
    moment = ms_to_datetime(event_time_ms)
    return moment.strftime("%Y%m%d%H%M%S") + f"{moment.microsecond // 10_000:02d}" + f"{number:019d}"


def utc_text(event_time_ms: int) -> str:
    """qlik.md 3 ``timestamp``: UTC, milliseconds, e.g. ``2023-09-11T03:23:25.000``."""
    return ms_to_datetime(event_time_ms).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]


def json_value(kind: ColumnKind, value: Any) -> Any:
    """qlik.md 5: a value as Replicate writes it in JSON."""
    if value is None:
        return None
    if kind == "bytes":
        return bytes(value).hex().upper()
    if kind == "timestamp":
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    if kind == "double":
        return float(value)
    return value


def avro_bytes(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
    return buffer.getvalue()


def dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


# ----------------------------------------------------------------------------------------------------------
# Messages


@dataclass(frozen=True)
class DataChange:
    """What one DT message says (before encoding)."""

    table: TableVersion
    operation: str
    data: dict[str, Any] | None
    before: dict[str, Any] | None
    sequence: str
    timestamp: str
    transaction_id: str
    change_mask: bytes | None
    column_mask: bytes | None
    event_counter: int | None
    last_event: bool | None


def encode_data(change: DataChange, encoding: Encoding) -> bytes:
    """A DT message (qlik.md 1, 3) in ``encoding``."""
    record = _record(change)
    if encoding == "avro":
        return encode_envelope("DT", change.table.schema_id, None, avro_bytes(change.table.data_schema(), record))
    kinds = {c.name: c.kind for c in change.table.spec.columns}
    headers = dict(record["headers"])

    def image(row: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if row is None else {name: json_value(kinds[name], value) for name, value in row.items()}

    for mask_name in ("changeMask", "columnMask"):
        value = headers[mask_name]
        headers[mask_name] = None if value is None else bytes(value).hex().upper()
    message = {"data": image(change.data), "beforeData": image(change.before), "headers": headers}
    return dumps(
        {
            "magic": MAGIC.decode(),
            "type": "DT",
            "headers": None,
            "messageSchemaId": change.table.schema_id,
            "messageSchema": None,
            "message": message,
        }
    )


def encode_metadata(table: TableVersion, timestamp: str, encoding: Encoding) -> bytes:
    """An MD message (qlik.md 1, 2) in ``encoding``."""
    metadata = table.metadata(timestamp)
    if encoding == "avro":
        return encode_envelope("MD", METADATA_SCHEMA_ID, METADATA_SCHEMA_TEXT, avro_bytes(METADATA_SCHEMA, metadata))
    return dumps(
        {
            "magic": MAGIC.decode(),
            "type": "MD",
            "headers": None,
            "messageSchemaId": METADATA_SCHEMA_ID,
            "messageSchema": METADATA_SCHEMA_TEXT,
            "message": metadata,
        }
    )


def encode_envelope(kind: str, schema_id: str | None, schema: str | None, message: bytes) -> bytes:
    """qlik.md 1 "Avro": the Avro ``MessageEnvelope`` around an inner Avro record."""
    envelope = {
        "magic": MAGIC,
        "type": kind,
        "headers": None,
        "messageSchemaId": schema_id,
        "messageSchema": schema,
        "message": message,
    }
    return avro_bytes(ENVELOPE_SCHEMA, envelope)


class _Renderer:
    def __init__(self, history: SourceHistory, options: RenderOptions, seed: int, encoding: Encoding) -> None:
        if options.resends < 0 or options.malformed < 0:
            raise ValueError("RenderOptions counts must be >= 0")
        self.history = history
        self.options = options
        self.encoding = encoding
        self.rng = random.Random(seed)
        self.stream = StreamBuilder()
        self.data: dict[int, DataChange] = {}
        """id(message) -> the DT it encodes (templates for malformed messages)."""
        self.versions: dict[tuple[str, str], TableVersion] = {}
        self.announced: set[str] = set()

    def version_of(self, spec: TableSpec) -> TableVersion:
        current = self.versions.get(spec.ident)
        if current is None:
            current = TableVersion(spec, 1)
            self.versions[spec.ident] = current
        return current

    def announce(self, table: TableVersion, event_time_ms: int) -> None:
        """The MD message of ``table`` if not sent yet (qlik.md 1: before its data messages)."""
        if table.schema_id in self.announced:
            return
        self.announced.add(table.schema_id)
        value = encode_metadata(table, utc_text(event_time_ms), self.encoding)
        self.stream.append(Message(table.kafka_key, value, f"MD {table.qlik_schema}.{table.spec.table}"))

    def emit(self, change: DataChange) -> None:
        description = f"{change.operation} {change.table.qlik_schema}.{change.table.spec.table}"
        message = Message(change.table.kafka_key, encode_data(change, self.encoding), description)
        self.stream.append(message)
        self.data[id(message)] = change

    def run(self) -> list[Message]:
        changes = self.history.changes
        leading = 0
        while leading < len(changes) and changes[leading].op == "INSERT":
            leading += 1
        full_load = min(leading, FULL_LOAD_ROWS)
        for change in changes[:full_load]:
            table = self.version_of(change.table)
            self.announce(table, change.event_time_ms)
            assert change.after is not None
            after = {name: change.after.get(name) for name in table.spec.column_names()}
            self.emit(DataChange(table, "REFRESH", after, None, "", "", "", None, None, None, None))
            self.stream.mark_boundary()
        number_of = {id(c): i + 1 for i, c in enumerate(changes)}
        for group_index, group in enumerate(commit_groups(changes[full_load:], self.rng, self.options.transactions)):
            transaction_id = f"{group_index + 1:032X}"
            for position, change in enumerate(group, start=1):
                self.render_change(change, number_of[id(change)], transaction_id, position, position == len(group))
            self.stream.mark_boundary()
        for _ in range(self.options.resends):
            add_resend(self.stream, self.rng)
        kinds = MALFORMED_AVRO if self.encoding == "avro" else MALFORMED_JSON
        for i in range(self.options.malformed):
            self.add_malformed(kinds[i % len(kinds)])
        return self.stream.messages

    def render_change(self, change: Change, number: int, transaction_id: str, counter: int, last: bool) -> None:
        if change.op == "TRUNCATE":
            return  # qlik.md 3: no truncate data message (see the module doc)
        if change.op == "ADD_COLUMN":
            # qlik.md 1: a DDL gives a new tableVersion, described by a new MD message.
            previous = self.version_of(change.table)
            table = TableVersion(change.table, previous.version + 1)
            self.versions[change.table.ident] = table
            self.announce(table, change.event_time_ms)
            return
        table = self.version_of(change.table)
        if table.spec.column_names() != change.table.column_names():  # defensive: hand-written histories
            table = TableVersion(change.table, table.version + 1)
            self.versions[change.table.ident] = table
        self.announce(table, change.event_time_ms)
        spec = table.spec
        names = spec.column_names()
        every = {table.ordinal(n) for n in names}
        keys = {table.ordinal(n) for n in spec.primary_key}

        def row(image: dict[str, Any] | None, captured: set[int] | None = None) -> dict[str, Any] | None:
            if image is None:
                return None
            return {n: (image.get(n) if captured is None or table.ordinal(n) in captured else None) for n in names}

        column_mask: set[int] = every
        if change.op == "INSERT":
            operation, data, before, changed = "INSERT", row(change.after), None, every
        elif change.op == "DELETE":
            operation, data, before, changed = "DELETE", row(change.before), None, keys
        else:
            assert change.before is not None
            assert change.after is not None
            changed = {table.ordinal(n) for n in names if change.before.get(n) != change.after.get(n)}
            captured_all = changed | keys == every
            partial = self.options.partial_updates and bool(spec.primary_key) and not captured_all
            if partial and self.rng.random() < 0.5:  # qlik.md 4: Oracle, minimal supplemental logging
                column_mask = changed | keys
            operation, data, before = "UPDATE", row(change.after, column_mask), row(change.before, column_mask)
        transactions = self.options.transactions
        self.emit(
            DataChange(
                table=table,
                operation=operation,
                data=data,
                before=before,
                sequence=change_sequence(change.event_time_ms, number),
                timestamp=utc_text(change.event_time_ms),
                transaction_id=transaction_id,
                change_mask=mask(changed, len(names)),
                column_mask=mask(column_mask, len(names)),
                event_counter=counter if transactions else None,
                last_event=last if transactions else None,
            )
        )

    def add_malformed(self, kind: str) -> None:
        """One undecodable message of ``kind`` at a random boundary after its template."""
        stream, rng = self.stream, self.rng
        templates = [
            i
            for i, m in enumerate(stream.messages)
            if id(m) in self.data and not m.is_resend and self.data[id(m)].operation != "REFRESH"
        ]
        if kind == "INT8 value 'abc'":
            templates = [i for i in templates if _captured_longs(self.data[id(stream.messages[i])])]
        if not templates:
            kind = "not an envelope" if self.encoding == "avro" else "not json"
        at = rng.choice(templates) if templates else 0
        template = stream.messages[at] if templates else None
        change = self.data[id(template)] if template is not None else None
        value: bytes
        if template is None or change is None or template.value is None or kind in ("not json", "not an envelope"):
            if self.encoding == "avro":
                value = rng.choice((b"\x00" * 40, b'{"magic": "atMSG"}', b"\xff\xfe garbage"))
            else:
                value = rng.choice(
                    (b"this is not json", b"<html><body>502 Bad Gateway</body></html>", b"\xef\xbb\xbf{'magic': None}")
                )
        elif kind in ("truncated json", "truncated envelope"):
            value = template.value[: rng.randint(1, len(template.value) - 1)]
        elif kind == "wrong magic":
            value = b"atMSX" + template.value[len(MAGIC) :]
        else:
            # A fresh changeSequence: a consumer deduplicating by sequence before validating loses no real change.
            fresh = dataclasses.replace(change, sequence=change.sequence[:16] + f"{10**18 + at:019d}")
            if kind == "unknown messageSchemaId":
                never_described = TableVersion(change.table.spec, 0)  # version 0: no MD message is ever sent for it
                value = encode_envelope(
                    "DT", never_described.schema_id, None, avro_bytes(change.table.data_schema(), _record(fresh))
                )
            else:
                parsed = json.loads(encode_data(fresh, "json"))
                if kind == "unknown operation FROBNICATE":
                    parsed["message"]["headers"]["operation"] = "FROBNICATE"
                else:  # INT8 value 'abc': a value that does not fit the MD's type
                    parsed["message"]["data"][rng.choice(_captured_longs(change))] = "abc"
                value = dumps(parsed)
        new = Message(template.key if template else None, value, f"malformed: {kind}")
        stream.insert(rng.choice([b for b in stream.boundaries if b > at] or [len(stream.messages)]), [new])


def _captured_longs(change: DataChange) -> list[str]:
    """INT8 columns whose value the DT message carries (columnMask bit set)."""
    ordinals = {change.table.ordinal(c.name): c.name for c in change.table.spec.columns if c.kind == "long"}
    captured = change.column_mask
    return [
        name
        for ordinal, name in ordinals.items()
        if change.data is not None and (captured is None or captured[(ordinal - 1) // 8] >> ((ordinal - 1) % 8) & 1)
    ]


def _record(change: DataChange) -> dict[str, Any]:
    """The data record of a DT message (qlik.md 3) with Python values (masks as bytes)."""
    headers = {
        "operation": change.operation,
        "changeSequence": change.sequence,
        "timestamp": change.timestamp,
        "streamPosition": change.sequence[-19:] if change.sequence else "",
        "transactionId": change.transaction_id,
        "changeMask": change.change_mask,
        "columnMask": change.column_mask,
        "transactionEventCounter": change.event_counter,
        "transactionLastEvent": change.last_event,
    }
    return {"data": change.data, "beforeData": change.before, "headers": headers}


# ----------------------------------------------------------------------------------------------------------
# What the lake can hold


def lake_truth(history: SourceHistory) -> Truth:
    """The final tables a consumer of the rendered stream must hold (the format limits of the module doc): the
    history replayed without TRUNCATE, rows of key-less tables identified by their values, tables named by their
    Qlik schema."""
    state: dict[tuple[str, str], dict[Any, dict[str, Any]]] = {t.ident: {} for t in history.tables}
    for change in history.changes:
        if change.op in ("TRUNCATE", "ADD_COLUMN"):
            continue
        rows = state.setdefault(change.table.ident, {})
        names = history.table(*change.table.ident).column_names()
        keys = change.table.primary_key
        if change.before is not None:
            rows.pop(_identity(change.before, keys, names), None)
        if change.after is not None:
            rows[_identity(change.after, keys, names)] = {n: change.after.get(n) for n in names}
    result: Truth = {}
    for spec in history.tables:
        ident = (spec.schema or spec.database, spec.table)
        result[ident] = list(state[spec.ident].values())
    return result


def _identity(row: dict[str, Any], keys: list[str], names: list[str]) -> tuple[Any, ...]:
    """The key values; for a table without a key, every value (columns added later are NULL in older rows)."""
    if keys:
        return tuple(row[k] for k in keys)
    return tuple(repr(row.get(n)) for n in names)


def render(history: SourceHistory, options: RenderOptions, seed: int, encoding: Encoding) -> RenderedStream:
    """Renders ``history`` as Qlik Replicate messages in ``encoding`` (see the module doc)."""
    messages = _Renderer(history, options, seed, encoding).run()

    def expected(_truth: Truth) -> Truth:
        # The format limits depend on the changes (which rows a TRUNCATE left), not only on the final truth.
        return lake_truth(history)

    return RenderedStream(messages, expected=expected)


@register_renderer("qlik-json")
def render_json(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """qlik-json: the atMSG JSON envelope; keys and types come from the MD messages (no options needed)."""
    return render(history, options, seed, "json")


@register_renderer("qlik-avro")
def render_avro(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """qlik-avro: Avro envelopes; DT messages need the MD messages' dataSchema (sent in the stream)."""
    return render(history, options, seed, "avro")
