"""Renders a :class:`~cdclake.workload.history.SourceHistory` as Oracle GoldenGate for Big Data JSON, operation
modeled (``ogg-json``).

Layout per ``formats/maxwell-ogg.md`` section 2: ``{"table", "op_type", "op_ts", "current_ts", "pos",
"primary_keys", "tokens", "before", "after"}`` with ``includePrimaryKeys`` and ``includeTokens``:

* ``table``: ``CATALOG.SCHEMA.TABLE`` for Oracle tables (``ORCL.SALES.STORES``, a pluggable database), ``db.table``
  for MySQL tables (GoldenGate for MySQL); ``op_type`` ``I``/``U``/``D``/``T``; ``op_ts`` the commit time in UTC
  ``yyyy-MM-dd HH:mm:ss.ffffff``; ``current_ts`` the later formatting time ``yyyy-MM-ddTHH:mm:ss.ffffff``; ``pos``
  the trail position, 10 digits of trail file sequence number then 10 digits of RBA (the trail rolls over to the
  next file now and then); ``tokens.R`` the Oracle ROWID (Oracle tables).
* Images: insert ``after``, delete ``before``, update both, truncate none. By default full images
  (NOCOMPRESSUPDATES, GETUPDATEBEFORES, NOCOMPRESSDELETES). With ``options.partial_updates`` the trail's default
  compression: an update holds the key and the changed columns in both images, a delete only the key (tables with a
  primary key; a key-less table logs all its columns, they are its key).
* ``options.transactions``: meta columns ``xid``, ``csn`` (commit SCN), ``txind`` (``B``/``M``/``E``, ``W`` for a
  one-operation transaction) and ``op_seqno`` (``metaColumnsTemplate``); 1-5 operations per transaction.
* ADD COLUMN produces no record (the formatter emits no DDL, section 2): the column is in later images.
* Values: numbers as JSON numbers (BINARY_DOUBLE in Java ``Double.toString`` text), strings, BLOB/RAW as base64,
  booleans as NUMBER(1)/TINYINT(1) 0/1, TIMESTAMP(3) in the trail's ``yyyy-MM-dd:HH:mm:ss.fffffffff`` text.
* No Kafka key (the default ``keyMappingTemplate`` is configuration dependent; none is assumed), no heartbeats
  (GoldenGate heartbeat tables are not part of the history).

Limits of the format (``expected``): no column types are written, so timestamps, BLOBs (base64) and booleans (0/1)
land as the ``string``/``bigint`` columns their JSON values suggest; key-less tables are identified by their full
image, so identical rows are one lake row (:func:`cdclake.workload._open_common.lake_state`).
"""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from cdclake.workload._open_common import (
    MalformedMaker,
    edited_json,
    group_changes,
    json_bytes,
    lake_state,
    not_json,
    shape,
    truncated_json,
)
from cdclake.workload._shaping import StreamBuilder
from cdclake.workload.dataworks import fake_oracle_rowid
from cdclake.workload.history import Change, Column, SourceHistory, TableSpec, ms_to_datetime
from cdclake.workload.renderers import Message, RenderedStream, RenderOptions, Truth, register_renderer

_CSN_BASE: Final = 58_123_400_000


def _is_oracle(table: TableSpec) -> bool:
    return table.db_type.lower() == "oracle"


def qualified_table(table: TableSpec) -> str:
    """``table`` of a record: ``CATALOG.SCHEMA.TABLE`` (Oracle) or ``db.table`` (MySQL)."""
    if _is_oracle(table) and table.schema:
        return f"{table.database}.{table.schema}.{table.table}"
    return f"{table.database}.{table.table}"


def trail_timestamp(moment: datetime) -> str:
    """A TIMESTAMP value in the trail's text form ``yyyy-MM-dd:HH:mm:ss.fffffffff``."""
    return moment.strftime("%Y-%m-%d:%H:%M:%S.") + f"{moment.microsecond * 1000:09d}"


def encode_value(column: Column, value: Any) -> Any:
    """One value as the JSON formatter writes it (see the module doc)."""
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
        return trail_timestamp(value)
    return value


def micros_text(epoch_ms: int, separator: str) -> str:
    """``op_ts`` / ``current_ts`` text: ``yyyy-MM-dd<separator>HH:mm:ss.ffffff`` in UTC."""
    moment = ms_to_datetime(epoch_ms)
    return moment.strftime(f"%Y-%m-%d{separator}%H:%M:%S.") + f"{moment.microsecond:06d}"


@dataclass
class _Trail:
    """Trail positions: file sequence number and relative byte address."""

    rng: random.Random
    sequence: int = 7
    rba: int = 1_200
    file_size: int = 200_000

    def advance(self) -> str:
        self.rba += self.rng.randint(180, 1500)
        if self.rba > self.file_size:
            self.sequence += 1
            self.rba = 1_200
        return f"{self.sequence:010d}{self.rba:010d}"


class _Writer:
    def __init__(self, options: RenderOptions, rng: random.Random) -> None:
        self.options = options
        self.rng = rng
        self.trail = _Trail(rng)
        self.csn = _CSN_BASE

    def _images(self, change: Change) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        table = change.table
        compressed = self.options.partial_updates and bool(table.primary_key)

        def image(row: dict[str, Any] | None, keep: set[str] | None) -> dict[str, Any] | None:
            if row is None:
                return None
            return {c.name: encode_value(c, row.get(c.name)) for c in table.columns if keep is None or c.name in keep}

        if not compressed or change.op == "INSERT":
            return image(change.before, None), image(change.after, None)
        keys = set(table.primary_key)
        if change.op == "DELETE":
            return image(change.before, keys), None
        before, after = change.before or {}, change.after or {}
        changed = keys | {c.name for c in table.columns if before.get(c.name) != after.get(c.name)}
        return image(change.before, changed), image(change.after, changed)

    def record(self, change: Change, meta: dict[str, Any] | None) -> Message:
        table = change.table
        op_type = {"INSERT": "I", "UPDATE": "U", "DELETE": "D", "TRUNCATE": "T"}[change.op]
        value: dict[str, Any] = {
            "table": qualified_table(table),
            "op_type": op_type,
            "op_ts": micros_text(change.event_time_ms, " "),
            "current_ts": micros_text(change.event_time_ms + self.rng.randint(300, 4000), "T"),
            "pos": self.trail.advance(),
        }
        if meta is not None:
            value |= meta
        if change.op != "TRUNCATE":
            value["primary_keys"] = list(table.primary_key)
            if _is_oracle(table) and change.row_id is not None:
                value["tokens"] = {"R": fake_oracle_rowid(change.row_id)}
            before, after = self._images(change)
            if before is not None:
                value["before"] = before
            if after is not None:
                value["after"] = after
        return Message(None, json_bytes(value), f"{op_type} {table.qualified_name}")

    def render(self, history: SourceHistory) -> list[Message]:
        stream = StreamBuilder()
        transactions = self.options.transactions
        for group in group_changes(history.changes, self.rng, transactions):
            operations = [c for c in group if c.op != "ADD_COLUMN"]
            self.csn += self.rng.randint(2, 60)
            xid = f"{self.rng.randint(1, 20)}.{self.rng.randint(0, 33)}.{self.rng.randint(1000, 99999)}"
            for index, change in enumerate(operations):
                meta = None
                if transactions:
                    last = index == len(operations) - 1
                    indicator = "W" if len(operations) == 1 else "B" if index == 0 else "E" if last else "M"
                    meta = {"xid": xid, "csn": str(self.csn), "txind": indicator, "op_seqno": index + 1}
                stream.append(self.record(change, meta))
            stream.mark_boundary()
        shape(stream, self.options, self.rng, MALFORMED_MAKERS, ("I", "U", "D"))
        return stream.messages


def _unknown_op_type(value: dict[str, Any]) -> None:
    value["op_type"] = "X"


def _bad_pos(value: dict[str, Any]) -> None:
    value["pos"] = value["pos"][:10] + "-" + value["pos"][10:]


MALFORMED_MAKERS: Final[tuple[MalformedMaker, ...]] = (
    truncated_json,
    not_json,
    edited_json("unknown op_type X", _unknown_op_type),
    edited_json("pos not digits", _bad_pos),
)
"""Kinds of undecodable messages, in the order the renderer cycles through them."""


def _expected(history: SourceHistory) -> Truth:
    def value(_table: TableSpec, column: Column, v: Any) -> Any:
        if column.kind in ("bytes", "boolean", "timestamp"):
            return encode_value(column, v)
        return v

    return lake_state(history, value=value)


@register_renderer("ogg-json")
def render_stream(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """OGG JSON for ``history``; see the module doc for the shape and the limits. Heartbeats are not rendered."""
    messages = _Writer(options, random.Random(seed)).render(history)
    return RenderedStream(messages, expected=lambda _truth: _expected(history))
