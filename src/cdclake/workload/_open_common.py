"""Pieces the renderers of the open formats share (Debezium, Lindorm, Maxwell, OGG): Java-style JSON text,
transaction grouping, undecodable messages, MySQL binlog positions, and the lake state the apply engine reaches where
a format cannot carry the source truth. The message stream and its failover re-sends are
:mod:`cdclake.workload._shaping`'s.

Not a renderer itself (the leading underscore keeps :func:`cdclake.workload.renderers.renderers` from importing it
as one).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from cdclake.workload._shaping import SCHEMA_CHANGES, StreamBuilder, add_resend, cut_short
from cdclake.workload.history import Change, Column, SourceHistory, TableSpec
from cdclake.workload.renderers import Message, RenderOptions, Truth

# ----------------------------------------------------------------------------------------------------------------
# JSON text as the Java vendors write it


class RawJson(str):
    """Text written into a JSON document as it is (a number already formatted)."""

    __slots__ = ()


def java_double(value: float) -> str:
    """``Double.toString`` layout (what Jackson writes for a Java ``double``): plain notation with at least one
    fraction digit for 1e-3 <= |x| < 1e7 (``100.0``, ``0.001``), else ``d.dddE[-]n`` (``1.0E16``, ``-2.5E-7``).
    The digits are the shortest that round-trip, so the text parses back to exactly ``value``."""
    if not math.isfinite(value):
        raise ValueError(f"{value!r} has no JSON number form")
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    exact = Decimal(repr(abs(value))).normalize()
    _, digit_tuple, exponent = exact.as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    scientific_exponent = len(digits) - 1 + exponent
    if 1e-3 <= abs(value) < 1e7:
        text = format(exact, "f")
        return sign + (text if "." in text else text + ".0")
    mantissa = digits[0] + "." + (digits[1:] or "0")
    return f"{sign}{mantissa}E{scientific_exponent}"


def json_text(value: Any) -> str:
    """Compact JSON text of ``value``: floats in :func:`java_double` layout, integers exact, strings in UTF-8 with
    control characters escaped (``\\u0000``, ``\\n``), :class:`RawJson` verbatim, dict order kept."""
    if value is None:
        return "null"
    if isinstance(value, RawJson):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return java_double(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        members = (f"{json.dumps(str(k), ensure_ascii=False)}:{json_text(v)}" for k, v in value.items())
        return "{" + ",".join(members) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(json_text(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def json_bytes(value: Any) -> bytes:
    """:func:`json_text` as UTF-8 bytes (a Kafka key or value)."""
    return json_text(value).encode("utf-8")


def millis_text(moment: datetime, separator: str = " ") -> str:
    """``yyyy-MM-dd HH:mm:ss.SSS`` (UTC wall clock of an aware datetime)."""
    return moment.strftime(f"%Y-%m-%d{separator}%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


# ----------------------------------------------------------------------------------------------------------------
# Commit groups, undecodable messages, re-sends (the stream is a :class:`cdclake.workload._shaping.StreamBuilder`)


def group_changes(changes: Sequence[Change], rng: random.Random, transactions: bool) -> list[list[Change]]:
    """Commit groups: DML transactions of 1-5 changes of one source product (a transaction never spans two
    databases products), DDL alone; without ``transactions`` every change commits alone."""
    if not transactions:
        return [[c] for c in changes]
    groups: list[list[Change]] = []
    current: list[Change] = []
    target = rng.randint(1, 5)
    for change in changes:
        if current and (change.op in SCHEMA_CHANGES or change.table.db_type != current[0].table.db_type):
            groups.append(current)
            current = []
            target = rng.randint(1, 5)
        if change.op in SCHEMA_CHANGES:
            groups.append([change])
            continue
        current.append(change)
        if len(current) >= target:
            groups.append(current)
            current = []
            target = rng.randint(1, 5)
    if current:
        groups.append(current)
    return groups


MalformedMaker = Callable[[random.Random, Message], tuple[Message, bool] | None]
"""Builds one undecodable message from a template message (a real one of the stream); returns it and whether it
must come after its template (it reuses the template's identity), or ``None`` if the template does not suit."""


def truncated_json(rng: random.Random, template: Message) -> tuple[Message, bool] | None:
    """A message cut short (a producer killed mid-write): never valid JSON, still valid UTF-8."""
    if template.value is None:
        return None
    return Message(template.key, cut_short(rng, template.value), "malformed: truncated json"), False


def not_json(rng: random.Random, template: Message) -> tuple[Message, bool] | None:
    """Something else written to the topic by mistake."""
    del template
    text = rng.choice(
        (
            "this is not json",
            "<html><body><h1>502 Bad Gateway</h1></body></html>",
            "INSERT INTO customer VALUES (1, 'x')",
            "\ufeff{'op': None}",
        )
    )
    return Message(None, text.encode("utf-8"), "malformed: not json"), False


def add_malformed(
    stream: StreamBuilder,
    rng: random.Random,
    count: int,
    makers: Sequence[MalformedMaker],
    is_template: Callable[[Message], bool],
) -> None:
    """Inserts ``count`` undecodable messages at random boundaries, cycling through ``makers``; each is built from a
    random real message accepted by ``is_template`` (a maker that cannot use any falls back to :func:`not_json`)."""
    for index in range(count):
        maker = makers[index % len(makers)]
        candidates = [
            i
            for i, m in enumerate(stream.messages)
            if m.value is not None and not m.is_malformed and not m.is_resend and is_template(m)
        ]
        made: tuple[Message, bool] | None = None
        template_at = 0
        rng.shuffle(candidates)
        for template_at in candidates[:20]:
            made = maker(rng, stream.messages[template_at])
            if made is not None:
                break
        if made is None:
            made = not_json(rng, Message(None, None, ""))
            assert made is not None
        message, after_template = made
        positions = [b for b in stream.boundaries if b > template_at] if after_template else stream.boundaries
        stream.insert(rng.choice(positions or stream.boundaries), [message])


def edited_json(kind: str, edit: Callable[[Any], None]) -> MalformedMaker:
    """A maker that parses the template's JSON value, spoils it in place with ``edit`` and writes it back with the
    template's key (description ``malformed: <kind>``); it goes after its template."""

    def make(rng: random.Random, template: Message) -> tuple[Message, bool] | None:
        del rng
        assert template.value is not None
        value = json.loads(template.value)
        edit(value)
        return Message(template.key, json_bytes(value), f"malformed: {kind}"), True

    return make


def shape(
    stream: StreamBuilder,
    options: RenderOptions,
    rng: random.Random,
    makers: Sequence[MalformedMaker],
    row_types: Collection[str],
) -> None:
    """Adds the re-send windows and then the undecodable messages that ``options`` asks for; the latter are built
    from row messages, those whose description starts with one of ``row_types``."""
    for _ in range(options.resends):
        add_resend(stream, rng)
    add_malformed(stream, rng, options.malformed, makers, lambda m: m.description.split(" ")[0] in row_types)


# ----------------------------------------------------------------------------------------------------------------
# MySQL binlog positions


@dataclass
class BinlogClock:
    """Binlog coordinates of successive events: ``mysql-bin.NNNNNN`` files of about ``file_size`` bytes, event
    positions growing by plausible event sizes, a rotation to the next file now and then."""

    rng: random.Random
    file_number: int = 3
    pos: int = 4
    file_size: int = 40_000

    @property
    def file(self) -> str:
        return f"mysql-bin.{self.file_number:06d}"

    def advance(self, low: int = 60, high: int = 700) -> tuple[str, int]:
        """Skips one event of ``low``-``high`` bytes; returns the coordinates of the next one."""
        self.pos += self.rng.randint(low, high)
        if self.pos > self.file_size:
            self.file_number += 1
            self.pos = 4 + 120 + 71  # after the magic number, the format description and previous-GTIDs events
        return self.file, self.pos


# ----------------------------------------------------------------------------------------------------------------
# What the lake holds when a format cannot carry the truth


def _identity(table: TableSpec, final_columns: list[str], row: dict[str, Any]) -> tuple[Any, ...]:
    """The apply engine's row identity: the key values, or without a key the whole image (every column of the
    table's final definition, NULL where the image has none)."""
    names = table.primary_key or final_columns
    return tuple((n, row.get(n)) for n in names)


def lake_state(
    history: SourceHistory,
    *,
    include: Callable[[TableSpec], bool] = lambda _t: True,
    truncates: bool = True,
    value: Callable[[TableSpec, Column, Any], Any] = lambda _t, _c, v: v,
) -> Truth:
    """The tables the apply engine ends with for ``history``.

    Differs from :meth:`SourceHistory.truth` where a format forces it to: tables left out (``include``), TRUNCATE
    not in the stream (``truncates=False``: truncated rows stay until written again), values the format can only
    carry in another form (``value(table, column, v)``, applied to non-NULL values), and key-less tables, whose
    rows the engine identifies by their full image: identical rows are one lake row, and an update or delete of
    one of several identical source rows changes that lake row.
    """
    final = {t.ident: t for t in history.tables if include(t)}
    state: dict[tuple[str, str], dict[tuple[Any, ...], dict[str, Any]]] = {ident: {} for ident in final}
    for change in history.changes:
        ident = change.table.ident
        if ident not in final:
            continue
        rows = state[ident]
        names = final[ident].column_names()
        if change.op == "TRUNCATE":
            if truncates:
                rows.clear()
            continue
        if change.op == "ADD_COLUMN":
            continue
        if change.before is not None:
            rows.pop(_identity(change.table, names, change.before), None)
        if change.after is not None:
            rows[_identity(change.table, names, change.after)] = dict(change.after)
    result: Truth = {}
    for ident, rows in state.items():
        table = final[ident]
        result[ident] = [
            {c.name: None if row.get(c.name) is None else value(table, c, row[c.name]) for c in table.columns}
            for row in rows.values()
        ]
    return result


def tables_with(history: SourceHistory, predicate: Callable[[TableSpec], bool]) -> Iterable[TableSpec]:
    """The final definitions of the tables that satisfy ``predicate``."""
    return (t for t in history.tables if predicate(t))
