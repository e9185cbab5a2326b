"""Renders a :class:`~cdclake.workload.history.SourceHistory` as Alibaba DTS SharePlex JSON (``dts-shareplex-json``).

Spec: ``formats/dts.md`` section 3. One JSON object per row change, as DTS writes it for an Oracle-style source::

    {"meta": {"time", "userid", "op", "scn", "rowid", "trans", "seq", "size", "idx", "table", "posttime"},
     "data": {...}, "key": {...}}

* ``ins``: ``data`` = the new row. ``del``: ``data`` = the deleted row.
* ``upd``: ``data`` = only the changed columns (new values); ``key`` = the before values that locate the row: the
  primary key plus the old values of the changed columns (as in the vendor sample), every column for a key-less
  table. SharePlex has no full-image updates, so ``options.partial_updates`` changes nothing.
* ``meta.table`` = ``OWNER.TABLE`` (the owner is the table's schema, else its database); ``meta.rowid`` = an
  Oracle extended ROWID of the physical row (a new one per INSERT; a row re-inserted after a delete or truncate gets
  a new one); ``meta.scn`` = the commit SCN and ``meta.trans`` the transaction id, shared by the changes of one
  transaction (``options.transactions``: 1-5 changes, else one each), ``meta.seq`` / ``size`` / ``idx`` their
  place in it; ``meta.time`` = commit time UTC ``yyyy-MM-ddTHH:mm:ss``.
* TRUNCATE: ``meta.op`` ``"truncate"``, no data (3: the doc lists TRUNCATE, its wire spelling is unknown).
* ADD COLUMN: SharePlex JSON has no DDL message; later changes carry the new column.
* No heartbeats and no transaction markers exist in the format: those options are ignored.

Value text (3: "values are strings or null"; the encodings are not documented, these are the choices): ``long``
decimal digits; ``double`` the shortest text that reads back as the same double (Python ``repr``, e.g. ``1e+16``);
``boolean`` ``1`` / ``0`` (Oracle NUMBER(1)); ``bytes`` upper-case hex (Oracle RAW text); ``timestamp``
``yyyy-MM-ddTHH:mm:ss.fff`` (UTC); ``string`` as is.

Limits of the format, mapped in :attr:`RenderedStream.expected`:

* The messages carry no types: every column lands as ``string`` holding the text above.
* Rows are identified by ROWID (the only identity the format carries, column ``_cdc_row_id``).
* An unknown-spelling TRUNCATE is counted, not applied: the rows it removed stay in the lake, next to rows
  inserted again later under new ROWIDs.
* The lake table lives under the owner: ``<owner>/<table>``.

Choice where the spec is silent: the Kafka key is null (as in the vendor sample).
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any, Final

from cdclake.workload import _lake_model, _shaping
from cdclake.workload.history import Change, ColumnKind, SourceHistory, TableSpec, datetime_to_ms, ms_to_datetime
from cdclake.workload.renderers import Message, RenderedStream, RenderOptions, register_renderer

OPS: Final = {"INSERT": "ins", "UPDATE": "upd", "DELETE": "del", "TRUNCATE": "truncate"}
"""dts.md 3: ``meta.op`` of each change kind (``truncate``: spelling undocumented)."""

FIRST_SCN: Final = 58_123_400_001
USER_ID: Final = 84
ROWID_DIGITS: Final = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
ROWS_PER_BLOCK: Final = 100
MALFORMED_KINDS: Final = ("truncated json", "not json", "meta.scn 'abc'", "'upd' without data")


def owner(table: TableSpec) -> str:
    """The Oracle owner of ``table``: its schema, else its database."""
    return table.schema or table.database


def oracle_rowid(data_object: int, row_number: int) -> str:
    """An 18-character extended ROWID: data object (6) + relative file (3) + block (6) + row in block (3), in
    Oracle's base-64 digits."""

    def digits(number: int, width: int) -> str:
        out = []
        for _ in range(width):
            out.append(ROWID_DIGITS[number % 64])
            number //= 64
        return "".join(reversed(out))

    block, row = divmod(row_number, ROWS_PER_BLOCK)
    return digits(data_object, 6) + digits(4, 3) + digits(0x21B + block, 6) + digits(row, 3)


def value_text(kind: ColumnKind, value: Any) -> str | None:
    """A column value as SharePlex JSON text (see the module doc)."""
    if value is None:
        return None
    if kind == "long":
        return str(value)
    if kind == "double":
        return repr(float(value))
    if kind == "boolean":
        return "1" if value else "0"
    if kind == "bytes":
        return bytes(value).hex().upper()
    if kind == "timestamp":
        ms = datetime_to_ms(value)
        return ms_to_datetime(ms).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}"
    if kind == "string":
        return str(value)
    raise ValueError(f"unknown column kind {kind!r}")


def _utc_text(ms: int) -> str:
    return datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def dumps(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class _Renderer:
    def __init__(self, history: SourceHistory, options: RenderOptions, seed: int) -> None:
        self.history = history
        self.options = options
        self.rng = random.Random(seed)
        self.stream = _shaping.StreamBuilder()
        self.rows = _lake_model.physical_rows(history)
        self.index_of = {id(change): i for i, change in enumerate(history.changes)}
        self.data_objects = {t.ident: 74_000 + 17 * i for i, t in enumerate(history.tables)}
        self.scn = FIRST_SCN
        self.row_messages: list[dict[str, Any]] = []

    def image(self, change: Change, row: dict[str, Any], columns: list[str] | None = None) -> dict[str, Any]:
        kinds = {c.name: c.kind for c in change.table.columns}
        names = columns if columns is not None else change.table.column_names()
        return {name: value_text(kinds[name], row.get(name)) for name in names}

    def message(self, change: Change, meta: dict[str, Any]) -> dict[str, Any]:
        table = change.table
        if change.op == "TRUNCATE":
            return {"meta": meta, "data": None}
        row_number = self.rows[self.index_of[id(change)]]
        assert row_number is not None
        meta["rowid"] = oracle_rowid(self.data_objects[table.ident], row_number)
        if change.op == "INSERT":
            assert change.after is not None
            return {"meta": meta, "data": self.image(change, change.after)}
        if change.op == "DELETE":
            assert change.before is not None
            return {"meta": meta, "data": self.image(change, change.before)}
        assert change.before is not None
        assert change.after is not None
        changed = [c for c in table.column_names() if change.before.get(c) != change.after.get(c)]
        locate = table.primary_key + [c for c in changed if c not in table.primary_key]
        if not table.primary_key:
            locate = table.column_names()
        return {
            "meta": meta,
            "data": self.image(change, change.after, changed),
            "key": self.image(change, change.before, locate),
        }

    def render_group(self, group: list[Change]) -> None:
        rendered = [c for c in group if c.op != "ADD_COLUMN"]  # dts.md 3: no DDL message for ADD COLUMN
        if not rendered:
            return
        self.scn += self.rng.randint(1, 40)
        commit_ms = rendered[-1].event_time_ms
        trans = f"{self.rng.randint(1, 12)}.{self.rng.randint(0, 31)}.{self.rng.randint(10_000, 99_999)}"
        size = len(rendered)
        for seq, change in enumerate(rendered, start=1):
            meta: dict[str, Any] = {
                "time": _utc_text(commit_ms),
                "userid": USER_ID,
                "op": OPS[change.op],
                "scn": str(self.scn),
                "rowid": None,
                "trans": trans,
                "seq": seq,
                "size": size,
                "idx": f"{seq}/{size}",
                "table": f"{owner(change.table)}.{change.table.table}",
                "posttime": _utc_text(commit_ms + self.rng.randint(300, 3000)),
            }
            value = self.message(change, meta)
            if value["meta"]["rowid"] is None:
                del value["meta"]["rowid"]
            else:
                self.row_messages.append(value)
            self.stream.append(Message(None, dumps(value), f"{change.op} {change.table.qualified_name}"))
        self.stream.mark_boundary()

    def malformed(self, index: int, rng: random.Random) -> Message:
        kind = MALFORMED_KINDS[index % len(MALFORMED_KINDS)]
        if not self.row_messages and kind != "not json":
            kind = "not json"
        if kind == "not json":
            return Message(
                None, b"ORA-01555: snapshot too old: rollback segment number 9 too small", f"malformed: {kind}"
            )
        template: dict[str, Any] = json.loads(json.dumps(rng.choice(self.row_messages)))
        if kind == "truncated json":
            text = dumps(template)
            return Message(None, text[: rng.randint(1, len(text) - 1)], f"malformed: {kind}")
        if kind == "meta.scn 'abc'":
            template["meta"]["scn"] = "abc"
        else:
            template["meta"]["op"] = "upd"
            template.pop("data", None)
            template.pop("key", None)
        return Message(None, dumps(template), f"malformed: {kind}")

    def render(self) -> RenderedStream:
        for group in _shaping.commit_groups(self.history.changes, self.rng, self.options.transactions):
            self.render_group(group)
        _shaping.shape(self.stream, self.options, self.rng, self.malformed)
        expected = _lake_model.expected_tables(
            self.history,
            "physical_row",
            applies_truncate=False,
            to_lake=lake_row,
            lake_table=lambda table: (owner(table), table.table),
        )
        return RenderedStream(self.stream.messages, expected=expected)


def lake_row(table: TableSpec, identity: Any, row: dict[str, Any]) -> dict[str, Any]:
    del identity  # the ROWID lands in _cdc_row_id, which is cdclake's own column
    return {c.name: value_text(c.kind, row.get(c.name)) for c in table.columns}


@register_renderer("dts-shareplex-json")
def render_stream(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """The history as a DTS SharePlex JSON stream (see the module doc)."""
    return _Renderer(history, options, seed).render()
