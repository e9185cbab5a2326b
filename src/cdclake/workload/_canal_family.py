"""What the Canal-family workload renderers share: ``canal-json``, ``dts-canal-json`` (:mod:`.canal`) and the DRS
JSON formats (:mod:`.drs_json`) write the same flat-message skeleton (``shared/formats/canal.md`` section 5).

* vendor value encodings: Java ``Double.toString`` / PostgreSQL float text, ISO-8859-1 byte text, Java byte lists,
  wall-clock texts;
* MySQL column declarations of each column kind (``mysqlType`` with and without lengths, JDBC ``sqlType``);
* undecodable messages (the stream, its commit groups and re-sends are :mod:`cdclake.workload._shaping`'s);
* :func:`lake_truth`: what the lake holds of the source truth when a format cannot carry a value or a row identity.

A key-less table has no identity in any Canal-family message (no hidden row id column, unlike DataWorks), so the
apply engine identifies its rows by their full image: identical rows collapse into one, and a DELETE or UPDATE of
one of several identical rows removes them all. :func:`lake_truth` replays the history with that identity.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal, localcontext
from typing import Any

from cdclake.workload._shaping import SCHEMA_CHANGES, StreamBuilder, add_resend, cut_short_message
from cdclake.workload.history import Change, Column, ColumnKind, SourceHistory, TableSpec, datetime_to_ms
from cdclake.workload.renderers import Message, RenderOptions, Truth

SOURCE_UTC_OFFSET = "+08:00"
"""Time zone of the simulated MySQL server and Canal/DTS/DRS processes (Alibaba and Huawei Cloud China regions).
A fixed offset: wall-clock texts of TIMESTAMP columns map back to one instant (no DST gap or overlap)."""

SOURCE_ZONE = timezone(timedelta(hours=8))

Corrupt = Callable[[str, dict[str, Any]], dict[str, Any] | None]
"""``corrupt(kind, message)``: a spoiled copy of a parsed row message showing ``kind``, or None if it cannot."""

ROW_TYPES = frozenset({"INSERT", "UPDATE", "DELETE"})
"""Vendor ``type`` values of row messages in every Canal-family format."""

# ----------------------------------------------------------------------------------------------------------------
# Value texts


def _shortest_digits(value: float) -> tuple[str, int]:
    """Shortest round-trip significant digits of a finite positive double and its decimal exponent
    (``value ~ d.ddd x 10**exponent``), as Python's ``repr`` picks them (closest among the shortest)."""
    return _decimal_digits(Decimal(repr(value)))


def java_double_text(value: float) -> str:
    """``String.valueOf(double)`` as Java 19+ prints it (Canal canal.md section 3, DRS drs.md section 2).

    Shortest digits that round-trip, but at least two significant digits are considered (``4.9E-324``, not
    ``5.0E-324``); plain notation for 1e-3 <= |x| < 1e7 (``123456.789``, ``10357.0``), else ``d.dddE<n>``
    (``1.2510357E7``, ``1.25E-4``).
    """
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    digits, exponent = _shortest_digits(magnitude)
    if len(digits) == 1:
        # Java's rule (Double.toString javadoc, JDK 19+): when one digit suffices, the closest decimal of one or two
        # digits that rounds to the value is printed.
        with localcontext() as context:
            context.prec = 800
            exact = Decimal(magnitude)
            two = Decimal(f"{magnitude:.1e}")
            step = Decimal(1).scaleb(two.adjusted() - 1)
            candidates = [Decimal(f"{digits}e{exponent}")] + [
                c for c in (two - step, two, two + step) if c > 0 and float(c) == magnitude
            ]
            best = min(candidates, key=lambda c: abs(c - exact))
        digits, exponent = _decimal_digits(best)
    if Decimal("1e-3") <= Decimal(magnitude) < Decimal("1e7"):
        point = exponent + 1
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        if point >= len(digits):
            return f"{sign}{digits}{'0' * (point - len(digits))}.0"
        return f"{sign}{digits[:point]}.{digits[point:]}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exponent}"


def _decimal_digits(value: Decimal) -> tuple[str, int]:
    _sign, digits, exponent = value.normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    return text, len(text) - 1 + exponent


def postgres_double_text(value: float) -> str:
    """``double precision`` as PostgreSQL 12+ prints it (shortest round-trip digits, ``%g``-like layout):
    ``123456.789``, ``1e+16``, ``1.5e-07``, ``5e-324``, ``0``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign = "-" if value < 0 else ""
    digits, exponent = _shortest_digits(abs(value))
    if -4 <= exponent < 15:  # DBL_DIG: PostgreSQL switches to exponent notation from 1e15 on
        point = exponent + 1
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        if point >= len(digits):
            return f"{sign}{digits}{'0' * (point - len(digits))}"
        return f"{sign}{digits[:point]}.{digits[point:]}"
    mantissa = digits[0] + (f".{digits[1:]}" if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"


def latin1_text(value: bytes) -> str:
    """canal.md section 3: BINARY/VARBINARY/BLOB bytes mapped 1:1 to chars (ISO-8859-1)."""
    return value.decode("latin-1")


def java_byte_list(value: bytes) -> str:
    """drs.md section 2: binaries as ``"[106, 103, 111]"``; ``Arrays.toString(byte[])`` prints Java's signed bytes
    (-128..127), so 0xFF is ``-1`` (the spec expects this, unverified; the decoder accepts both)."""
    return "[" + ", ".join(str(b - 256 if b >= 128 else b) for b in value) + "]"


def wall_clock_text(value: datetime, zone: timezone, fraction_digits: int) -> str:
    """``yyyy-MM-dd HH:mm:ss[.f]`` of the instant ``value`` on the wall clock of ``zone``."""
    local = value.astimezone(zone)
    text = local.strftime("%Y-%m-%d %H:%M:%S")
    if fraction_digits:
        text += "." + f"{local.microsecond:06d}"[:fraction_digits]
    return text


def epoch_seconds_text(value: datetime) -> str:
    """drs.md section 2: DRS JSON TIMESTAMP as epoch seconds with the milliseconds, ``"1624614713.201"``."""
    ms = datetime_to_ms(value)
    return f"{ms // 1000}.{ms % 1000:03d}"


# ----------------------------------------------------------------------------------------------------------------
# MySQL column declarations


@dataclass(frozen=True)
class MysqlType:
    """How a MySQL column of one kind is declared.

    Attributes:
        full: ``mysqlType`` as open-source Canal writes it (with length / precision).
        bare: ``mysqlType`` as DTS and DRS write it (base name only).
        jdbc: ``sqlType`` (``java.sql.Types``; DRS uses 94 for DATETIME, drs.md section 2).
    """

    full: str
    bare: str
    jdbc: int


MYSQL_TYPES: dict[ColumnKind, MysqlType] = {
    "long": MysqlType("bigint(20)", "bigint", -5),
    "string": MysqlType("varchar(255)", "varchar", 12),
    # canal.md section 3: Canal reports binaries with sqlType 2004 (BLOB).
    "bytes": MysqlType("blob", "blob", 2004),
    # MySQL has no boolean type: BOOLEAN is TINYINT(1) with 0/1 (the lake column is therefore bigint).
    "boolean": MysqlType("tinyint(1)", "tinyint", -6),
    "double": MysqlType("double", "double", 8),
    "timestamp": MysqlType("datetime(3)", "datetime", 93),
}
"""Declaration of each column kind; ``timestamp`` columns become TIMESTAMP(3) where :func:`mysql_timestamp_columns`
allows it."""

MYSQL_TIMESTAMP = MysqlType("timestamp(3)", "timestamp", 93)
DRS_DATETIME_SQL_TYPE = 94
"""drs.md section 2: DRS reports DATETIME with sqlType 94 (TIMESTAMP keeps 93)."""

_MYSQL_TIMESTAMP_MIN_MS = 1_000  # 1970-01-01 00:00:01 UTC
_MYSQL_TIMESTAMP_MAX_MS = 2_147_483_647_999  # 2038-01-19 03:14:07.999 UTC


def mysql_timestamp_columns(history: SourceHistory) -> frozenset[tuple[str, str, str]]:
    """``(database, table, column)`` of the ``timestamp`` columns that can be MySQL TIMESTAMP(3) columns: every
    value the history writes lies in TIMESTAMP's range (1970-01-01 00:00:01 .. 2038-01-19 03:14:07.999 UTC). The
    others must be DATETIME(3): a real source could not hold their values in a TIMESTAMP column."""
    candidates: dict[tuple[str, str, str], bool] = {}
    for spec in history.tables:
        for column in spec.columns:
            if column.kind == "timestamp":
                candidates[(spec.database, spec.table, column.name)] = True
    for change in history.changes:
        for image in (change.before, change.after):
            for name, value in (image or {}).items():
                key = (change.table.database, change.table.table, name)
                if candidates.get(key) and value is not None:
                    ms = datetime_to_ms(value)
                    candidates[key] = _MYSQL_TIMESTAMP_MIN_MS <= ms <= _MYSQL_TIMESTAMP_MAX_MS
    return frozenset(key for key, fits in candidates.items() if fits)


def mysql_type(spec: TableSpec, column: Column, timestamp_columns: frozenset[tuple[str, str, str]]) -> MysqlType:
    """The declaration of ``column`` of ``spec``."""
    if column.kind == "timestamp" and (spec.database, spec.table, column.name) in timestamp_columns:
        return MYSQL_TIMESTAMP
    return MYSQL_TYPES[column.kind]


def mysql_ddl(change: Change, timestamp_columns: frozenset[tuple[str, str, str]]) -> str:
    """The statement a MySQL client ran for a TRUNCATE or ADD_COLUMN change (binlog QUERY event text)."""
    table = change.table
    if change.op == "TRUNCATE":
        return f"TRUNCATE TABLE `{table.table}`"
    if change.op == "ADD_COLUMN" and change.added_column is not None:
        declared = mysql_type(table, change.added_column, timestamp_columns).full
        return f"ALTER TABLE `{table.table}` ADD COLUMN `{change.added_column.name}` {declared} NULL"
    raise ValueError(f"{change.op} is not DDL")


# ----------------------------------------------------------------------------------------------------------------
# Serialisation


def compact_json(value: Any) -> bytes:
    """Compact UTF-8 JSON (non-ASCII kept; integers exact; insertion order of keys kept)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


_GSON_HTML_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "=": "\\u003d", "'": "\\u0027"}


def html_safe_json(value: Any) -> bytes:
    """drs.md section 2 (vendor table 6): DRS (Gson) escapes ``< > & = '`` as ``\\u003c`` ... in its JSON text.
    Outside strings JSON has none of these characters, so escaping the serialised text is exact."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for char, escape in _GSON_HTML_ESCAPES.items():
        text = text.replace(char, escape)
    return text.encode("utf-8")


# ----------------------------------------------------------------------------------------------------------------
# Stream shape


def is_ddl(change: Change) -> bool:
    return change.op in SCHEMA_CHANGES


def add_malformed(
    stream: StreamBuilder,
    rng: random.Random,
    kind: str,
    corrupt: Corrupt,
    dumps: Callable[[Any], bytes],
) -> None:
    """Inserts one undecodable message of ``kind`` at a boundary.

    ``truncated json`` and ``not json`` need no template; other kinds ask ``corrupt(kind, message)`` to spoil a
    copy of a random row message (None: this message cannot show it). The spoiled copy goes after its template,
    so a consumer that dedupes by a message id before validating still sees the real message first.
    """
    description = f"malformed: {kind}"
    if kind == "truncated json":
        cut = cut_short_message(stream, rng)
        value = cut[1] if cut else b'{"data":[{"id":"1"'
        stream.insert(rng.choice(stream.boundaries), [Message(None, value, description)])
        return
    if kind != "not json":
        rows = [
            i
            for i, m in enumerate(stream.messages)
            if m.value is not None and not m.is_malformed and m.description.split(" ")[0] in ROW_TYPES
        ]
        rng.shuffle(rows)
        for at in rows:
            value_bytes = stream.messages[at].value
            assert value_bytes is not None
            spoiled = corrupt(kind, json.loads(value_bytes))
            if spoiled is not None:
                after = [b for b in stream.boundaries if b > at]
                stream.insert(rng.choice(after), [Message(None, dumps(spoiled), description)])
                return
        description = "malformed: not json"
    text = rng.choice(
        (
            "this is not json",
            "<html><body><h1>502 Bad Gateway</h1></body></html>",
            "INSERT INTO customer VALUES (1, 'x')",
            "\ufeff{'data': None}",
        )
    )
    stream.insert(rng.choice(stream.boundaries), [Message(None, text.encode("utf-8"), description)])


def shape(
    stream: StreamBuilder,
    options: RenderOptions,
    rng: random.Random,
    kinds: Sequence[str],
    corrupt: Corrupt,
    dumps: Callable[[Any], bytes],
) -> None:
    """Adds the re-send windows and then the undecodable messages that ``options`` asks for, cycling through the
    malformed ``kinds`` (see :func:`add_malformed`)."""
    for _ in range(options.resends):
        add_resend(stream, rng)
    for i in range(options.malformed):
        add_malformed(stream, rng, kinds[i % len(kinds)], corrupt, dumps)


def first_row_only(value: dict[str, Any]) -> dict[str, Any]:
    """A copy of a row message with only its first row (a spoiled multi-row message would be one dead letter per
    row; the stream promises one per malformed message)."""
    copy = dict(value)
    for name in ("data", "old"):
        if isinstance(copy.get(name), list):
            copy[name] = copy[name][:1]
    return copy


def spoil_long_value(value: dict[str, Any], long_columns: list[str]) -> dict[str, Any] | None:
    """``bigint value 'abc'``: a non-number in a column declared as an integer."""
    rows = value.get("data") or value.get("old")
    if not rows or not long_columns:
        return None
    copy = first_row_only(value)
    array = "data" if copy.get("data") else "old"
    copy[array] = [dict(copy[array][0])]
    copy[array][0][long_columns[0]] = "abc"
    return copy


# ----------------------------------------------------------------------------------------------------------------
# What the lake holds

LakeValue = Callable[[TableSpec, Column, Any], Any]
"""(final table definition, column, source value) -> the value the lake column holds (``None`` stays ``None``)."""


def lake_truth(
    history: SourceHistory,
    lake_value: LakeValue,
    lake_table: Callable[[TableSpec], tuple[str, str]] = lambda spec: spec.ident,
) -> Callable[[Truth], Truth]:
    """``RenderedStream.expected`` for a Canal-family rendering.

    Keyed tables: the truth with each value as the lake holds it (``lake_value``). Key-less tables: the history
    replayed with the full image as row identity (what the apply engine does without a key, see module doc).
    ``lake_table`` maps a source table to the ``(database, table)`` the decoder files it under.
    """

    def expected(truth: Truth) -> Truth:
        result: Truth = {}
        for ident, rows in truth.items():
            spec = history.table(*ident)
            if spec.primary_key:
                mapped = [{c.name: _lake(lake_value, spec, c, row.get(c.name)) for c in spec.columns} for row in rows]
            else:
                mapped = _full_image_rows(history, spec, lake_value)
            result[lake_table(spec)] = mapped
        return result

    return expected


def mysql_lake_value(_spec: TableSpec, column: Column, value: Any) -> Any:
    """What the lake holds of a MySQL value: BOOLEAN is TINYINT(1), decoded as a bigint 1 / 0."""
    if column.kind == "boolean":
        return int(value)
    return value


def _lake(lake_value: LakeValue, spec: TableSpec, column: Column, value: Any) -> Any:
    return None if value is None else lake_value(spec, column, value)


def _full_image_rows(history: SourceHistory, spec: TableSpec, lake_value: LakeValue) -> list[dict[str, Any]]:
    """Rows of a key-less table when each row is identified by its whole (lake) image."""

    def image(row: dict[str, Any]) -> dict[str, Any]:
        return {c.name: _lake(lake_value, spec, c, row.get(c.name)) for c in spec.columns}

    def identity(row: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        return tuple((name, repr(value)) for name, value in row.items())

    rows: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for change in history.changes:
        if change.table.ident != spec.ident:
            continue
        if change.op == "TRUNCATE":
            rows.clear()
            continue
        if change.before is not None:
            rows.pop(identity(image(change.before)), None)
        if change.after is not None:
            after = image(change.after)
            rows[identity(after)] = after
    return list(rows.values())
