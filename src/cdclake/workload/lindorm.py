"""Renders a :class:`~cdclake.workload.history.SourceHistory` as Alibaba Lindorm subscription messages
(``lindorm-debezium``, "Debezium format v2.0", SQL tables).

Layout per ``formats/lindorm-debezium.md``: ``{"schema", "payload": {"op", "ts_ms", "before", "after", "source":
{"version", "db", "namespace", "table", "ts_ms"}}}`` with ops ``c``/``u``/``d``. Each history table is a Lindorm
wide table in the namespace named like its database; ``source.ts_ms`` is the mutation time (the change's event
time), ``payload.ts_ms`` the later write to Kafka. Messages have no Kafka key.

Choices where the spec is silent:

* ``schema`` is filled in (the vendor page: "included by default"), generated from the payload: an ``after`` and a
  ``before`` struct listing the columns present in that image (an absent image gets the other one's list, as in the
  vendor sample of an insert). Types: BIGINT ``int64``, VARCHAR ``string``, VARBINARY ``bytes`` (base64 text),
  BOOLEAN ``boolean``, DOUBLE ``float64`` (Java ``Double.toString`` text), TIMESTAMP ``int64`` epoch milliseconds
  (the spec: the schema types "describe the JSON types"; no logical type names).
* NULL is not a value in a wide table, it is a missing cell: images leave NULL columns out. An update that sets a
  column to NULL is therefore an ``after`` without the column (the spec's "column deletion" trap), and an insert
  simply lacks its NULL columns.

Limits of the format (what ``keys`` and ``expected`` say):

* No primary key in the messages: ``keys`` gives each keyed table's key columns (from the table DDL).
* A TIMESTAMP is an epoch-millisecond number without a type name: the lake column is ``bigint`` and ``expected``
  holds the milliseconds.
* No truncate, DDL, heartbeat or transaction records exist (spec "Operations"): a TRUNCATE is not in the stream, so
  the truncated rows stay in the lake until written again; ADD COLUMN shows only as a new column in later images.
* No position: the Kafka order is the order. Re-send windows are written right after the window they copy (a
  producer resuming from its last checkpoint), so replaying them again ends in the same state.
* Lindorm SQL tables always have a primary key (``CREATE TABLE`` requires one): a key-less history table has no
  Lindorm counterpart, so it is not rendered and ``expected`` leaves it out.
* HBase tables (``ROW`` + ``family_qualifier`` columns, raw bytes) are not rendered.
"""

from __future__ import annotations

import base64
import random
from datetime import datetime
from typing import Any, Final

from cdclake.workload._open_common import (
    MalformedMaker,
    edited_json,
    json_bytes,
    lake_state,
    not_json,
    shape,
    truncated_json,
)
from cdclake.workload._shaping import StreamBuilder
from cdclake.workload.history import Change, Column, SourceHistory, TableSpec, datetime_to_ms
from cdclake.workload.renderers import Message, RenderedStream, RenderOptions, Truth, register_renderer

INSTANCE: Final = "ld-bp1cdclake0w0rk"
"""``source.db``: the Lindorm instance id."""
FORMAT_VERSION: Final = "v2.0"

_SCHEMA_TYPES: Final = {
    "long": "int64",
    "string": "string",
    "bytes": "bytes",
    "boolean": "boolean",
    "double": "float64",
    "timestamp": "int64",
}


def encode_value(column: Column, value: Any) -> Any:
    """One value as the subscription writes it (see the module doc)."""
    if value is None:
        return None
    if column.kind == "bytes":
        return base64.b64encode(value).decode("ascii")
    if column.kind == "timestamp":
        assert isinstance(value, datetime)
        return datetime_to_ms(value)
    if column.kind == "double":
        return float(value)
    return value


def image(table: TableSpec, row: dict[str, Any] | None) -> dict[str, Any] | None:
    """The cells of a row: NULL columns are absent."""
    if row is None:
        return None
    return {c.name: encode_value(c, row.get(c.name)) for c in table.columns if row.get(c.name) is not None}


def payload_schema(table: TableSpec, before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """The ``schema`` generated from a payload (field list of each image, Connect-style)."""
    by_name = {c.name: c for c in table.columns}

    def struct(present: dict[str, Any] | None, other: dict[str, Any] | None, name: str) -> dict[str, Any]:
        listed = present if present is not None else other or {}
        fields = [
            {"type": _SCHEMA_TYPES[by_name[n].kind], "optional": n not in table.primary_key, "field": n} for n in listed
        ]
        return {"type": "struct", "fields": fields, "optional": True, "field": name}

    source = [
        {"type": "string", "optional": False, "field": "version"},
        {"type": "string", "optional": False, "field": "db"},
        {"type": "string", "optional": False, "field": "namespace"},
        {"type": "string", "optional": False, "field": "table"},
        {"type": "int64", "optional": False, "field": "ts_ms"},
    ]
    return {
        "type": "struct",
        "optional": False,
        "fields": [
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": False, "field": "ts_ms"},
            struct(before, after, "before"),
            struct(after, before, "after"),
            {"type": "struct", "optional": False, "field": "source", "fields": source},
        ],
    }


def render_change(change: Change, written_ms: int) -> Message | None:
    """One change as a subscription message; ``None`` for what Lindorm does not publish (TRUNCATE, ADD COLUMN)."""
    op = {"INSERT": "c", "UPDATE": "u", "DELETE": "d"}.get(change.op)
    if op is None:
        return None
    table = change.table
    before, after = image(table, change.before), image(table, change.after)
    payload = {
        "op": op,
        "ts_ms": written_ms,
        "before": before,
        "after": after,
        "source": {
            "version": FORMAT_VERSION,
            "db": INSTANCE,
            "namespace": table.database,
            "table": table.table,
            "ts_ms": change.event_time_ms,
        },
    }
    value = {"schema": payload_schema(table, before, after), "payload": payload}
    return Message(None, json_bytes(value), f"{op} {table.qualified_name}")


def _unknown_op(value: dict[str, Any]) -> None:
    value["payload"]["op"] = "x"


def _no_namespace(value: dict[str, Any]) -> None:
    del value["payload"]["source"]["namespace"]


MALFORMED_MAKERS: Final[tuple[MalformedMaker, ...]] = (
    truncated_json,
    not_json,
    edited_json("unknown op x", _unknown_op),
    edited_json("no source.namespace", _no_namespace),
)
"""Kinds of undecodable messages, in the order the renderer cycles through them."""


def _expected(history: SourceHistory) -> Truth:
    def value(_table: TableSpec, column: Column, v: Any) -> Any:
        return datetime_to_ms(v) if column.kind == "timestamp" else v

    return lake_state(history, include=lambda t: bool(t.primary_key), truncates=False, value=value)


@register_renderer("lindorm-debezium")
def render_stream(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """Lindorm subscription messages for ``history``; no heartbeats, transactions or changed-only images exist in
    the format (those options are ignored). See the module doc for the limits."""
    rng = random.Random(seed)
    stream = StreamBuilder()
    for change in history.changes:
        if not change.table.primary_key:
            continue
        message = render_change(change, change.event_time_ms + rng.randint(2, 400))
        if message is not None:
            stream.append(message)
            stream.mark_boundary()
    shape(stream, options, rng, MALFORMED_MAKERS, ("c", "u", "d"))
    keys = {t.qualified_name: list(t.primary_key) for t in history.tables if t.primary_key}
    return RenderedStream(stream.messages, keys=keys, expected=lambda _truth: _expected(history))
