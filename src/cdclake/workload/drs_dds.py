"""Renders a :class:`~cdclake.workload.history.SourceHistory` as Huawei DRS JSON for DDS/MongoDB (``drs-json-dds``).

Spec: ``formats/drs.md`` section 5. Each source table is a MongoDB collection ``<database>.<table>``; each row a
document whose ``_id`` is the primary-key value (key-less tables: an ``ObjectId`` generated when the row is
inserted) and whose other fields are the remaining columns (NULL as ``null``). One JSON message per oplog entry::

    {"id", "op", "dbType": "MongoDB", "db", "coll", "value": "<shell text>", "where": "<shell text>" | null,
     "recordType", "extra", "es", "ts", "clusterTime": "<seconds>:<increment>"}

* INSERT: ``recordType`` ``insert``, ``value`` = the document.
* UPDATE: ``recordType`` ``replace`` with the whole new document, or (``options.partial_updates``, three updates in
  four) ``update`` with ``{"$unset": {changed to NULL: true}, "$set": {changed fields}}``; ``where`` = ``{"_id"}``.
* DELETE: ``recordType`` ``doc``, ``value`` = ``{"_id"}``, ``where`` null.
* A primary-key UPDATE: a DELETE of the old ``_id`` and an INSERT of the whole new document (``_id`` is immutable in
  MongoDB, so that is how an application changes it).
* TRUNCATE: MongoDB has none; emptying a collection (``deleteMany({})``) writes one delete per document, and so
  does this renderer. ADD COLUMN: documents simply carry the new field from then on (no DDL in MongoDB).
* Transactions (``options.transactions``): the 1-5 operations of a multi-document transaction share the
  ``clusterTime`` of its ``applyOps`` oplog entry and are ordered by ``id`` (5: clusterTime, then id). Otherwise each
  operation has its own clusterTime (seconds of the commit time, increment counting within the second).
* No heartbeats exist in the format.

Document text is what the MongoDB Java driver writes in shell mode (``JsonMode.SHELL``; the layout of the drs.md
samples, ``{"_id": ObjectId("..."), "nick": "Zoë"}``): int64 ``NumberLong(n)`` (``NumberLong("n")`` beyond
int32), doubles as Java ``Double.toString``, ``ISODate("yyyy-MM-ddTHH:mm:ss.SSSZ")``, binaries
``new BinData(0, "<base64>")``, strings JSON-escaped with every character outside letters, digits, punctuation,
symbols and spaces as ``\\uXXXX`` (emoji therefore as escaped surrogate pairs).

What the lake holds (:attr:`RenderedStream.expected`): the decoder keeps each top-level field as a ``string`` column
(``formats/drs_dds.py``), so each cell is the value's text: ``long`` decimal digits, ``boolean`` ``true``/``false``,
``timestamp`` the ISODate text, ``bytes`` ``{"$binary":"<base64>","$type":"0"}``, ``double`` its JSON number read
back (exponent notation as written, e.g. ``1.0E16``; plain decimals without trailing zeros, ``2.0`` -> ``2``),
``string`` itself. The primary-key column is ``_id``; a key-less table gains ``_id`` (the ObjectId's hex).
Composite primary keys (an embedded ``_id`` document) are not rendered.

Choices where the spec is silent: Kafka keys are null; ``extra`` equals ``recordType``; ``ts`` is ``es`` plus a
small delivery lag.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import unicodedata
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, Final

from cdclake.workload import _lake_model, _shaping
from cdclake.workload.history import Change, ColumnKind, SourceHistory, TableSpec, datetime_to_ms, ms_to_datetime
from cdclake.workload.renderers import Message, RenderedStream, RenderOptions, register_renderer

FIRST_ID: Final = 800_001
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MALFORMED_KINDS: Final = ("truncated json", "not json", "unknown op FROBNICATE", "update operator $inc")

# java.lang.Character types that the Java driver's JSON writer prints as they are; everything else is \\uXXXX.
_PRINTED_CATEGORIES: Final = frozenset(
    {"Lu", "Ll", "Lt", "Lo", "Nd", "Nl", "No", "Zs", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So"}
)
_SHORT_ESCAPES: Final = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def json_string(text: str) -> str:
    """A JSON string as the Java driver's writer escapes it (per UTF-16 code unit, like ``String.charAt``)."""
    out = ['"']
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        code = int.from_bytes(units[i : i + 2], "big")
        char = chr(code)
        if char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif 0xD800 <= code <= 0xDFFF or unicodedata.category(char) not in _PRINTED_CATEGORIES:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def java_double(value: float) -> str:
    """``Double.toString`` (JDK 19+ spec: the shortest decimal that reads back, two digits when one would do but a
    two-digit one is closer; plain notation for 1e-3 <= |x| < 1e7, else ``d.dddE[-]n``)."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if str(value).startswith("-") else "0.0"
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    shortest = Decimal(repr(magnitude))
    digits = "".join(str(d) for d in shortest.as_tuple().digits).rstrip("0") or "0"
    exponent = shortest.adjusted()  # value = d.ddd x 10^exponent
    if len(digits) == 1:
        exact = Decimal(magnitude)
        two = (exact.scaleb(1 - exponent)).to_integral_value(rounding=ROUND_HALF_EVEN)
        if two != int(digits) * 10 and float(two.scaleb(exponent - 1)) == magnitude:
            digits = str(int(two))
    if Decimal("0.001") <= Decimal(magnitude) < Decimal(10_000_000):
        if exponent >= 0:
            whole = digits[: exponent + 1].ljust(exponent + 1, "0")
            fraction = digits[exponent + 1 :] or "0"
        else:
            whole = "0"
            fraction = "0" * (-exponent - 1) + digits
        return f"{sign}{whole}.{fraction}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exponent}"


def shell_value(kind: ColumnKind, value: Any) -> str:
    """One value in the Java driver's shell-mode syntax (see the module doc)."""
    if value is None:
        return "null"
    if kind == "long":
        return f"NumberLong({value})" if INT32_MIN <= value <= INT32_MAX else f'NumberLong("{value}")'
    if kind == "double":
        return java_double(float(value))
    if kind == "boolean":
        return "true" if value else "false"
    if kind == "string":
        return json_string(value)
    if kind == "bytes":
        return f'new BinData(0, "{base64.b64encode(bytes(value)).decode("ascii")}")'
    if kind == "timestamp":
        return f'ISODate("{iso_date(value)}")'
    raise ValueError(f"unknown column kind {kind!r}")


def iso_date(value: Any) -> str:
    """``yyyy-MM-dd'T'HH:mm:ss.SSS'Z'`` in UTC (the Java driver's ISODate text)."""
    ms = datetime_to_ms(value)
    return ms_to_datetime(ms).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def document(fields: list[tuple[str, str]]) -> str:
    """``{"name": value, ...}`` with the Java driver's separators."""
    return "{" + ", ".join(f"{json_string(name)}: {value}" for name, value in fields) + "}"


def lake_text(kind: ColumnKind, value: Any) -> str | None:
    """What the lake's string column holds for a value (see the module doc)."""
    if value is None:
        return None
    if kind == "long":
        return str(value)
    if kind == "double":
        written = java_double(float(value))
        # A JSON number without exponent is read as an exact decimal, which drops trailing fraction zeros.
        return written if "E" in written else written.rstrip("0").rstrip(".")
    if kind == "boolean":
        return "true" if value else "false"
    if kind == "string":
        return str(value)
    if kind == "bytes":
        return json.dumps(
            {"$binary": base64.b64encode(bytes(value)).decode("ascii"), "$type": "0"}, separators=(",", ":")
        )
    if kind == "timestamp":
        return iso_date(value)
    raise ValueError(f"unknown column kind {kind!r}")


def object_ids(history: SourceHistory, seed: int) -> dict[tuple[tuple[str, str], int], str]:
    """``((database, table), row id)`` -> ObjectId hex of every row of a key-less table: 4 bytes of insert time,
    5 bytes per collection (the generating process), 3 bytes of the row id."""
    ids: dict[tuple[tuple[str, str], int], str] = {}
    for change in history.changes:
        table = change.table
        if change.op == "INSERT" and not table.primary_key and change.row_id is not None:
            process = hashlib.sha1(f"{seed}/{table.qualified_name}".encode()).digest()[:5]
            raw = (
                (change.event_time_ms // 1000).to_bytes(4, "big") + process + (change.row_id % 2**24).to_bytes(3, "big")
            )
            ids[(table.ident, change.row_id)] = raw.hex()
    return ids


class _Renderer:
    def __init__(self, history: SourceHistory, options: RenderOptions, seed: int) -> None:
        for table in history.tables:
            if len(table.primary_key) > 1:
                raise ValueError(f"{table.qualified_name}: composite primary keys are not rendered as _id documents")
        self.history = history
        self.options = options
        self.rng = random.Random(seed)
        self.stream = _shaping.StreamBuilder()
        self.object_ids = object_ids(history, seed)
        self.message_id = FIRST_ID - 1
        self.clock = (0, 0)  # (seconds, increment) of the last oplog entry
        self.live: dict[tuple[str, str], dict[Any, str]] = {}  # collection -> identity -> _id shell text
        self.templates: list[dict[str, Any]] = []

    def id_text(self, change: Change, row: dict[str, Any]) -> tuple[Any, str]:
        """(identity, ``_id`` shell text) of the document of ``row``."""
        table = change.table
        if table.primary_key:
            key = table.primary_key[0]
            kind = next(c.kind for c in table.columns if c.name == key)
            return (row[key],), shell_value(kind, row[key])
        assert change.row_id is not None
        return ("row", change.row_id), f'ObjectId("{self.object_ids[(table.ident, change.row_id)]}")'

    def full_document(self, change: Change, row: dict[str, Any], id_text: str) -> str:
        table = change.table
        fields = [("_id", id_text)]
        fields += [
            (c.name, shell_value(c.kind, row.get(c.name))) for c in table.columns if c.name not in table.primary_key
        ]
        return document(fields)

    def tick(self, seconds: int) -> str:
        """The clusterTime of the next oplog entry: its commit second, the increment counting within a second."""
        last_seconds, increment = self.clock
        self.clock = (seconds, 1) if seconds > last_seconds else (last_seconds, increment + 1)
        return f"{self.clock[0]}:{self.clock[1]}"

    def emit(
        self,
        change: Change,
        op: str,
        record_type: str,
        value: str,
        where: str | None,
        cluster_time: str,
        es: int,
    ) -> None:
        self.message_id += 1
        message = {
            "id": self.message_id,
            "op": op,
            "dbType": "MongoDB",
            "db": change.table.database,
            "coll": change.table.table,
            "value": value,
            "where": where,
            "recordType": record_type,
            "extra": record_type,
            "es": es,
            "ts": es + self.rng.randint(40, 900),
            "clusterTime": cluster_time,
        }
        self.templates.append(message)
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        self.stream.append(Message(None, text, f"{op} {change.table.qualified_name} ({record_type})"))

    def render_change(self, change: Change, cluster_time: str | None, es: int) -> None:
        table = change.table
        live = self.live.setdefault(table.ident, {})
        if change.op == "ADD_COLUMN":
            return
        if change.op == "TRUNCATE":
            for identity, id_text in list(live.items()):  # deleteMany({}): one oplog delete per document
                self.emit(change, "DELETE", "doc", document([("_id", id_text)]), None, self.tick(es // 1000), es)
                del live[identity]
            return
        time = cluster_time or self.tick(es // 1000)
        if change.op == "INSERT":
            assert change.after is not None
            identity, id_text = self.id_text(change, change.after)
            live[identity] = id_text
            self.emit(change, "INSERT", "insert", self.full_document(change, change.after, id_text), None, time, es)
        elif change.op == "DELETE":
            assert change.before is not None
            identity, id_text = self.id_text(change, change.before)
            live.pop(identity, None)
            self.emit(change, "DELETE", "doc", document([("_id", id_text)]), None, time, es)
        else:
            assert change.before is not None
            assert change.after is not None
            identity, id_text = self.id_text(change, change.before)
            new_identity, new_id_text = self.id_text(change, change.after)
            if new_identity != identity:
                # MongoDB cannot change a document's `_id`: a key update is a delete and an insert of the document.
                live.pop(identity, None)
                self.emit(change, "DELETE", "doc", document([("_id", id_text)]), None, time, es)
                live[new_identity] = new_id_text
                value = self.full_document(change, change.after, new_id_text)
                self.emit(change, "INSERT", "insert", value, None, cluster_time or self.tick(es // 1000), es)
                return
            where = document([("_id", id_text)])
            kinds = {c.name: c.kind for c in table.columns}
            changed = [c for c in table.column_names() if change.before.get(c) != change.after.get(c)]
            if self.options.partial_updates and changed and self.rng.random() < 0.75:
                unset = [(c, "true") for c in changed if change.after.get(c) is None]
                set_ = [(c, shell_value(kinds[c], change.after[c])) for c in changed if change.after.get(c) is not None]
                operators = []
                if unset:
                    operators.append(("$unset", document(unset)))
                if set_:
                    operators.append(("$set", document(set_)))
                self.emit(change, "UPDATE", "update", document(operators), where, time, es)
            else:
                value = self.full_document(change, change.after, id_text)
                self.emit(change, "UPDATE", "replace", value, where, time, es)

    def render_group(self, group: list[Change]) -> None:
        if self.options.transactions and len(group) > 1:
            commit_ms = group[-1].event_time_ms
            cluster_time = self.tick(commit_ms // 1000)  # one applyOps entry for the whole transaction
            for change in group:
                self.render_change(change, cluster_time, commit_ms)
        else:
            for change in group:
                self.render_change(change, None, change.event_time_ms)
        self.stream.mark_boundary()

    def malformed(self, index: int, rng: random.Random) -> Message:
        kind = MALFORMED_KINDS[index % len(MALFORMED_KINDS)]
        if not self.templates and kind != "not json":
            kind = "not json"
        if kind == "not json":
            return Message(
                None, b"MongoServerError: Transaction numbers are only allowed on a replica set", f"malformed: {kind}"
            )
        updates = [t for t in self.templates if t["where"] is not None]
        if kind == "update operator $inc" and not updates:
            kind = "unknown op FROBNICATE"
        template = dict(rng.choice(updates if kind == "update operator $inc" else self.templates))
        self.message_id += 1
        template["id"] = self.message_id
        if kind == "truncated json":
            text = json.dumps(template, ensure_ascii=False).encode("utf-8")
            return Message(None, text[: rng.randint(1, len(text) - 1)], f"malformed: {kind}")
        if kind == "unknown op FROBNICATE":
            template["op"] = "FROBNICATE"
        else:
            # An operator DRS passes through as it is: it cannot be applied without the stored document.
            template.update(recordType="update", extra="update")
            template["value"] = document([("$inc", document([("counter", "NumberLong(1)")]))])
        return Message(None, json.dumps(template, ensure_ascii=False).encode("utf-8"), f"malformed: {kind}")

    def render(self) -> RenderedStream:
        for group in _shaping.commit_groups(self.history.changes, self.rng, self.options.transactions):
            self.render_group(group)
        _shaping.shape(self.stream, self.options, self.rng, self.malformed)
        oids = self.object_ids

        def lake_row(table: TableSpec, identity: Any, row: dict[str, Any]) -> dict[str, Any]:
            if table.primary_key:
                key = table.primary_key[0]
                kinds = {c.name: c.kind for c in table.columns}
                lake = {"_id": lake_text(kinds[key], row[key])}
            else:
                lake = {"_id": oids[(table.ident, identity[1])]}
            lake.update(
                {c.name: lake_text(c.kind, row.get(c.name)) for c in table.columns if c.name not in table.primary_key}
            )
            return lake

        expected = _lake_model.expected_tables(self.history, "source", applies_truncate=True, to_lake=lake_row)
        return RenderedStream(self.stream.messages, expected=expected)


@register_renderer("drs-json-dds")
def render_stream(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """The history as a DRS DDS (MongoDB) JSON stream (see the module doc)."""
    return _Renderer(history, options, seed).render()
