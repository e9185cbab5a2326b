"""Format-independent, seeded simulation of a source database's change history.

A :class:`SourceHistory` is the list of committed source changes (inserts, updates, deletes, truncates and
``ADD COLUMN`` DDL) of a handful of tables, in commit order, together with the table definitions. Renderers
(for example :mod:`cdclake.workload.dataworks`) turn it into vendor CDC messages; :meth:`SourceHistory.truth`
gives the exact final content of every source table, to compare a lake table with.

Everything is derived from :class:`HistoryConfig` (including its seed) with :class:`random.Random`, so the
same configuration always yields the same history, on every platform and Python version >= 3.11.
"""

from __future__ import annotations

import dataclasses
import random
import string
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

ColumnKind = Literal["long", "string", "bytes", "boolean", "double", "timestamp"]
"""Logical column type.

Python values: int, str, bytes, bool, float (finite), datetime (UTC, millisecond precision).
"""

ChangeOp = Literal["INSERT", "UPDATE", "DELETE", "TRUNCATE", "ADD_COLUMN"]
"""Kind of a committed source change."""

COLUMN_KINDS: tuple[ColumnKind, ...] = ("long", "string", "bytes", "boolean", "double", "timestamp")
"""Every :data:`ColumnKind`, in a fixed order."""

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""The Unix epoch as an aware datetime."""

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Column:
    """One column of a source table.

    Attributes:
        name: Column name as the source spells it.
        kind: Logical type of the column's values.
    """

    name: str
    kind: ColumnKind


@dataclass
class TableSpec:
    """Definition of a source table at one point of the history.

    A :class:`Change` refers to the definition that was current when it was committed; an ``ADD_COLUMN``
    change creates a new :class:`TableSpec` (the old one is never mutated by the generator).

    Attributes:
        database: Source database (MySQL schema, Oracle database/service name).
        table: Table name.
        columns: User columns in order. Hidden row ids / Oracle rowids are not columns.
        primary_key: Names of the primary-key columns; ``[]`` for a key-less table.
        schema: Owning schema (Oracle), ``None`` for MySQL.
        db_type: Source product, e.g. ``"MySQL"`` or ``"Oracle"``.
    """

    database: str
    table: str
    columns: list[Column]
    primary_key: list[str]
    schema: str | None = None
    db_type: str = "MySQL"

    @property
    def qualified_name(self) -> str:
        """``database.table``, e.g. ``"crm.customer"``."""
        return f"{self.database}.{self.table}"

    @property
    def ident(self) -> tuple[str, str]:
        """``(database, table)``: the key of this table in :meth:`SourceHistory.truth`."""
        return (self.database, self.table)

    def column_names(self) -> list[str]:
        """Returns the user column names in order."""
        return [c.name for c in self.columns]


@dataclass(frozen=True)
class Change:
    """One committed source change, in commit order.

    Attributes:
        op: What happened.
        table: Table definition at the time of the change (for ``ADD_COLUMN``: after adding the column).
        before: Full row image before the change (all user columns of ``table``); UPDATE and DELETE only.
        after: Full row image after the change; INSERT and UPDATE only.
        sequence: Source log position; strictly increasing across the whole history.
        event_time_ms: Commit time in epoch milliseconds; non-decreasing.
        row_id: Identity of the physical row for tables that have one: the hidden row id of key-less MySQL
            tables (``#alibaba_rds_row_id#``) and the row number behind the Oracle ``ROWID``. Assigned at
            insert, stable for the row's lifetime, never reused. ``None`` otherwise and for
            TRUNCATE/ADD_COLUMN.
        added_column: The new column, for ``ADD_COLUMN`` only.
    """

    op: ChangeOp
    table: TableSpec
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    sequence: int
    event_time_ms: int
    row_id: int | None
    added_column: Column | None = None


@dataclass
class HistoryConfig:
    """Parameters of :meth:`SourceHistory.generate`.

    Attributes:
        seed: Seed of the random generator; equal configurations give equal histories.
        tables: Number of MySQL tables (key-less ones included).
        events: Number of row changes (INSERT/UPDATE/DELETE); truncates and added columns come on top.
        keys_per_table: Size of each keyed table's primary-key pool (also the row cap of key-less tables).
        update_ratio: Probability that a row change is an UPDATE (when the table has rows).
        delete_ratio: Probability that a row change is a DELETE (when the table has rows).
        null_ratio: Probability that a non-key value is NULL.
        keyless_tables: How many of ``tables`` have no primary key.
        truncates: Number of TRUNCATE TABLE changes.
        added_columns: Number of ADD COLUMN changes.
        start_time_ms: Event time of the first change (epoch ms).
        oracle_tables: Number of additional Oracle tables (schema set, upper-case names, primary key ``ID``).
        extra_columns: Non-key columns added to every table after its template columns (row width for benchmarks):
            ``x01``, ``x02``... (upper-case on Oracle), kinds cycling through :data:`COLUMN_KINDS`.
        key_update_ratio: Probability that an UPDATE of a keyed table also gives the row a primary key no row holds
            (``UPDATE t SET id = <new>``): the row moves to the new key and the old one is free again. 0 (the
            default) draws no extra random numbers, so histories without key updates stay as they were.
        clock_step_ms: When set, the clock advances by exactly this many milliseconds per change (fractions
            accumulate), so change ``i`` happens at ``start_time_ms + floor(i * clock_step_ms)``: a steady source
            rate, e.g. to pace a producer at event time. ``None``: the irregular default clock.
    """

    seed: int = 0
    tables: int = 3
    events: int = 500
    keys_per_table: int = 50
    update_ratio: float = 0.5
    delete_ratio: float = 0.1
    null_ratio: float = 0.1
    keyless_tables: int = 1
    truncates: int = 0
    added_columns: int = 0
    start_time_ms: int = 1_709_288_131_000
    oracle_tables: int = 0
    extra_columns: int = 0
    clock_step_ms: float | None = None
    key_update_ratio: float = 0.0

    def validate(self) -> None:
        """Raises ``ValueError`` if the configuration is inconsistent."""
        for name in ("tables", "events", "keys_per_table", "keyless_tables", "truncates", "added_columns"):
            if getattr(self, name) < 0:
                raise ValueError(f"HistoryConfig.{name} must be >= 0")
        if self.oracle_tables < 0:
            raise ValueError("HistoryConfig.oracle_tables must be >= 0")
        if self.extra_columns < 0:
            raise ValueError("HistoryConfig.extra_columns must be >= 0")
        if self.clock_step_ms is not None and not 0.0 <= self.clock_step_ms <= 86_400_000.0:
            raise ValueError("HistoryConfig.clock_step_ms must be within [0, 86400000] (or None)")
        if self.keyless_tables > self.tables:
            raise ValueError("HistoryConfig.keyless_tables must be <= tables")
        for name in ("update_ratio", "delete_ratio", "null_ratio", "key_update_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"HistoryConfig.{name} must be within [0, 1]")
        if self.update_ratio + self.delete_ratio > 1.0:
            raise ValueError("HistoryConfig.update_ratio + delete_ratio must be <= 1")
        if self.tables + self.oracle_tables == 0 and self.events + self.truncates + self.added_columns > 0:
            raise ValueError("a history with changes needs at least one table")
        if self.keys_per_table == 0 and self.events > 0:
            raise ValueError("HistoryConfig.keys_per_table must be > 0 when events > 0")
        if not 0 <= self.start_time_ms <= 9_000_000_000_000:
            raise ValueError("HistoryConfig.start_time_ms must be a plausible epoch-millisecond value")


# ----------------------------------------------------------------------------------------------------------
# Table catalogue

_KEYED_TEMPLATES: list[tuple[str, str, list[Column]]] = [
    (
        "crm",
        "customer",
        [
            Column("id", "long"),
            Column("name", "string"),
            Column("avatar", "bytes"),
            Column("vip", "boolean"),
            Column("score", "double"),
            Column("updated_at", "timestamp"),
            Column("note", "string"),
        ],
    ),
    (
        "shop",
        "orders",
        [
            Column("id", "long"),
            Column("customer_id", "long"),
            Column("amount", "double"),
            Column("status", "string"),
            Column("paid", "boolean"),
            Column("created_at", "timestamp"),
        ],
    ),
    (
        "shop",
        "events",
        [
            Column("id", "long"),
            Column("kind", "string"),
            Column("payload", "bytes"),
            Column("occurred_at", "timestamp"),
            Column("weight", "double"),
        ],
    ),
    (
        "shop",
        "inventory",
        [
            Column("id", "long"),
            Column("sku", "string"),
            Column("qty", "long"),
            Column("price", "double"),
            Column("active", "boolean"),
            Column("photo", "bytes"),
            Column("restocked_at", "timestamp"),
            Column("memo", "string"),
        ],
    ),
    (
        "crm",
        "address",
        [
            Column("id", "long"),
            Column("street", "string"),
            Column("city", "string"),
            Column("zip", "string"),
            Column("is_primary", "boolean"),
        ],
    ),
]

_KEYLESS_TEMPLATES: list[tuple[str, str, list[Column]]] = [
    (
        "crm",
        "audit_log",
        [
            Column("actor", "string"),
            Column("action", "string"),
            Column("detail", "bytes"),
            Column("logged_at", "timestamp"),
            Column("level", "long"),
        ],
    ),
    (
        "shop",
        "syslog",
        [
            Column("msg", "string"),
            Column("severity", "string"),
            Column("code", "long"),
            Column("ts", "timestamp"),
            Column("ok", "boolean"),
            Column("ratio", "double"),
        ],
    ),
]

_ORACLE_TEMPLATES: list[tuple[str, str, list[Column]]] = [
    (
        "SALES",
        "STORES",
        [
            Column("ID", "long"),
            Column("CITY", "string"),
            Column("AREA", "double"),
            Column("OPENED_AT", "timestamp"),
            Column("LOGO", "bytes"),
            Column("IS_OPEN", "boolean"),
        ],
    ),
    (
        "SALES",
        "REGIONS",
        [
            Column("ID", "long"),
            Column("NAME", "string"),
            Column("BUDGET", "double"),
            Column("MANAGER_ID", "long"),
        ],
    ),
]

_ORACLE_DATABASE = "ORCL"


def _from_templates(templates: list[tuple[str, str, list[Column]]], count: int) -> list[tuple[str, str, list[Column]]]:
    """Takes ``count`` templates round-robin; repeats get a ``_<n>`` table-name suffix."""
    out: list[tuple[str, str, list[Column]]] = []
    for i in range(count):
        db, name, cols = templates[i % len(templates)]
        round_ = i // len(templates)
        out.append((db, name if round_ == 0 else f"{name}_{round_ + 1}", list(cols)))
    return out


def build_tables(cfg: HistoryConfig) -> list[TableSpec]:
    """Returns the initial table definitions of a history with configuration ``cfg`` (no randomness)."""
    specs: list[TableSpec] = []
    for db, name, cols in _from_templates(_KEYED_TEMPLATES, cfg.tables - cfg.keyless_tables):
        specs.append(TableSpec(db, name, cols + _extra_columns(cfg.extra_columns), [cols[0].name]))
    for db, name, cols in _from_templates(_KEYLESS_TEMPLATES, cfg.keyless_tables):
        specs.append(TableSpec(db, name, cols + _extra_columns(cfg.extra_columns), []))
    for schema, name, cols in _from_templates(_ORACLE_TEMPLATES, cfg.oracle_tables):
        extra = _extra_columns(cfg.extra_columns, upper=True)
        specs.append(TableSpec(_ORACLE_DATABASE, name, cols + extra, [cols[0].name], schema=schema, db_type="Oracle"))
    return specs


def _extra_columns(count: int, *, upper: bool = False) -> list[Column]:
    """``count`` padding columns ``x01``, ``x02``... with kinds cycling through :data:`COLUMN_KINDS`."""
    width = max(2, len(str(count)))
    columns = [Column(f"x{i + 1:0{width}d}", COLUMN_KINDS[i % len(COLUMN_KINDS)]) for i in range(count)]
    return [Column(c.name.upper(), c.kind) for c in columns] if upper else columns


# ----------------------------------------------------------------------------------------------------------
# Values

_SPECIAL_STRINGS: tuple[str, ...] = (
    "Zoë 张三 ✓",
    "",
    'say "hi"',
    "back\\slash",
    "C:\\temp\\new",
    "line1\nline2",
    "tab\there",
    "cr\r\nlf",
    "O'Brien",
    "null",
    "NULL",
    " padded ",
    "😀 emoji 🎉",
    "Ünïcödé ñ ß",
    "日本語テキスト",
    '{"json": [1, 2]}',
    "<tag a='1'>&amp;</tag>",
    "\u0000nul\u0001ctl",
)
"""Strings that trip up encoders. No U+2028/U+2029/U+0085 (they break line-oriented replay files)."""

_SPECIAL_LONGS: tuple[int, ...] = (
    0,
    -1,
    2**31,
    -(2**31) - 1,
    2**53,
    2**53 + 1,
    -(2**53) - 1,
    INT64_MAX,
    INT64_MIN,
    1_234_567_890_123_456_789,
)

_SPECIAL_DOUBLES: tuple[float, ...] = (
    0.0,
    0.1,
    -1e300,
    1.5e-7,
    1.7976931348623157e308,
    5e-324,
    -2.5,
    1e16,
    123456.789,
    9007199254740993.0,
    1 / 3,
)

_SPECIAL_KEYS: tuple[int, ...] = (2**53, 2**53 + 1, -42, INT64_MAX, INT64_MIN, 0)
"""Primary-key values that lose identity as doubles or sit at the int64 boundaries."""

_TS_MIN_MS = 1_000_000_000_000  # 2001-09-09: 13-digit epoch ms from here on
_TS_MAX_MS = 4_102_444_799_999  # 2099-12-31T23:59:59.999Z


def ms_to_datetime(ms: int) -> datetime:
    """Converts epoch milliseconds to an aware UTC datetime (exact, no float arithmetic)."""
    return EPOCH + timedelta(milliseconds=ms)


def datetime_to_ms(value: datetime) -> int:
    """Converts an aware datetime to epoch milliseconds (exact; sub-millisecond parts are floored)."""
    return (value - EPOCH) // timedelta(milliseconds=1)


def _random_value(rng: random.Random, kind: ColumnKind) -> Any:
    """Returns a random non-NULL value of ``kind``, with a fair share of edge cases."""
    special = rng.random() < 0.25
    if kind == "long":
        if special:
            return rng.choice(_SPECIAL_LONGS)
        if rng.random() < 0.1:
            return rng.randint(INT64_MIN, INT64_MAX)
        return rng.randint(-1_000, 1_000_000)
    if kind == "string":
        if special:
            return rng.choice(_SPECIAL_STRINGS)
        alphabet = string.ascii_letters + string.digits + " -_.,"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24)))
    if kind == "bytes":
        if special:
            return rng.choice((b"", b"\x00", b"\xff\xfe\xfd", b"\xff\xd8\xff\xe0"))
        return rng.randbytes(rng.randint(0, 24))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "double":
        if special:
            return rng.choice(_SPECIAL_DOUBLES)
        return round(rng.uniform(-1e6, 1e6), rng.randint(0, 6))
    if kind == "timestamp":
        if special:
            return ms_to_datetime(rng.choice((_TS_MIN_MS, _TS_MAX_MS, 1_709_288_131_000, 1_709_251_200_000)))
        return ms_to_datetime(rng.randint(_TS_MIN_MS, _TS_MAX_MS))
    raise ValueError(f"unknown column kind {kind!r}")


def _different_value(rng: random.Random, kind: ColumnKind, old: Any) -> Any:
    """Returns a random non-NULL value of ``kind`` different from ``old``."""
    if kind == "boolean":
        return (not old) if old is not None else rng.random() < 0.5
    for _ in range(20):
        value = _random_value(rng, kind)
        if value != old:
            return value
    if kind == "long":
        return 7 if old != 7 else 8
    if kind == "string":
        return f"{old}!"
    if kind == "bytes":
        return bytes(old) + b"!"
    if kind == "double":
        return 7.5 if old != 7.5 else 8.5
    return ms_to_datetime(_TS_MIN_MS if old != ms_to_datetime(_TS_MIN_MS) else _TS_MAX_MS)


# ----------------------------------------------------------------------------------------------------------
# Generation


@dataclass
class _TableState:
    """Mutable generator state of one table."""

    spec: TableSpec
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # identity (pk value or row id) -> row
    row_ids: dict[int, int] = field(default_factory=dict)  # keyed tables with physical row ids: pk -> row id
    fresh_keys: list[int] = field(default_factory=list)  # never used primary keys
    freed_keys: list[int] = field(default_factory=list)  # deleted/truncated keys (re-insert candidates)
    next_row_id: int = 1
    added: int = 0
    _order: list[int] = field(default_factory=list)  # identities, for O(1) random choice
    _position: dict[int, int] = field(default_factory=dict)  # identity -> index in _order

    def add(self, identity: int, row: dict[str, Any]) -> None:
        self.rows[identity] = row
        self._position[identity] = len(self._order)
        self._order.append(identity)

    def remove(self, identity: int) -> dict[str, Any]:
        index = self._position.pop(identity)
        last = self._order.pop()
        if last != identity:
            self._order[index] = last
            self._position[last] = index
        return self.rows.pop(identity)

    def clear(self) -> None:
        self.rows.clear()
        self.row_ids.clear()
        self._order.clear()
        self._position.clear()

    def pick(self, rng: random.Random) -> int:
        return self._order[rng.randrange(len(self._order))]

    @property
    def keyed(self) -> bool:
        return bool(self.spec.primary_key)

    @property
    def has_row_ids(self) -> bool:
        return not self.spec.primary_key or self.spec.db_type.lower() == "oracle"


def _key_pool(index: int, size: int) -> list[int]:
    """Primary-key pool of the ``index``-th table: mostly small ids plus a few edge values."""
    base = 1000 * (index + 1)
    pool = [base + i for i in range(size)]
    specials = list(_SPECIAL_KEYS[: min(len(_SPECIAL_KEYS), size // 4)])
    if size >= 2 and not specials:
        specials = [2**53, 2**53 + 1]
    for i, key in enumerate(specials):
        pool[-(i + 1)] = key
    return pool


def _sort_key(row: dict[str, Any], names: list[str]) -> tuple[tuple[bool, Any], ...]:
    """Total order over rows of one table: NULLs last, per column in ``names`` order."""
    return tuple((row.get(n) is None, row.get(n) if row.get(n) is not None else 0) for n in names)


class SourceHistory:
    """Committed changes of a simulated source database plus the table definitions.

    Build one with :meth:`generate`; a hand-written history (``SourceHistory(tables, changes)``) works the
    same way as long as its changes follow the :class:`Change` contract.

    Attributes:
        tables: Final definition of every table (after all ``ADD_COLUMN`` changes).
        changes: All committed changes in commit (= ``sequence``) order.
    """

    def __init__(self, tables: list[TableSpec], changes: list[Change]) -> None:
        """Wraps already generated tables and changes."""
        self.tables = tables
        self.changes = changes

    def __repr__(self) -> str:
        return f"SourceHistory(tables={[t.qualified_name for t in self.tables]}, changes={len(self.changes)})"

    @classmethod
    def generate(cls, cfg: HistoryConfig | None = None) -> SourceHistory:
        """Generates a deterministic history.

        Args:
            cfg: Parameters; the defaults of :class:`HistoryConfig` if omitted.

        Returns:
            The history; equal configurations give equal histories.

        Raises:
            ValueError: If ``cfg`` is inconsistent.
        """
        cfg = cfg or HistoryConfig()
        cfg.validate()
        return _Generator(cfg).run()

    def table(self, database: str, table: str) -> TableSpec:
        """Returns the final definition of ``database.table``.

        Raises:
            KeyError: If there is no such table.
        """
        for spec in self.tables:
            if spec.ident == (database, table):
                return spec
        raise KeyError(f"{database}.{table}")

    def truth(self) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """Returns the final content of every table, computed by replaying :attr:`changes`.

        Returns:
            ``(database, table)`` -> rows. Each row maps every user column of the table's final definition
            to its value (``None`` for columns added after the row was last written); hidden row ids are not
            included. Rows are sorted by primary key, key-less tables by all values. Key-less tables may hold
            duplicate rows: compare them as multisets (sorting both sides is enough).
        """
        state: dict[tuple[str, str], dict[Any, dict[str, Any]]] = {t.ident: {} for t in self.tables}
        for change in self.changes:
            rows = state.setdefault(change.table.ident, {})
            if change.op == "TRUNCATE":
                rows.clear()
                continue
            if change.op == "ADD_COLUMN":
                assert change.added_column is not None
                for row in rows.values():
                    row.setdefault(change.added_column.name, None)
                continue
            image = change.after if change.after is not None else change.before
            assert image is not None, f"{change.op} without a row image"
            identity = _identity(change.table, image, change.row_id)
            if change.op == "DELETE":
                rows.pop(identity, None)
                continue
            if change.op == "UPDATE" and change.before is not None:
                old_identity = _identity(change.table, change.before, change.row_id)
                if old_identity != identity:  # primary-key update
                    rows.pop(old_identity, None)
            assert change.after is not None
            rows[identity] = dict(change.after)
        result: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for ident, rows in state.items():
            spec = self.table(*ident)
            names = spec.column_names()
            order = [*spec.primary_key, *(n for n in names if n not in spec.primary_key)]
            final = [{n: row.get(n) for n in names} for row in rows.values()]
            result[ident] = sorted(final, key=lambda r: _sort_key(r, order))
        return result


def _identity(spec: TableSpec, row: dict[str, Any], row_id: int | None) -> Any:
    """Row identity used by :meth:`SourceHistory.truth`: the key tuple, else the row id."""
    if spec.primary_key:
        return tuple(row[k] for k in spec.primary_key)
    if row_id is None:
        raise ValueError(f"change on key-less table {spec.qualified_name} without row_id")
    return ("#row", row_id)


class _Generator:
    """Produces the changes of one :class:`SourceHistory`."""

    def __init__(self, cfg: HistoryConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.states = [_TableState(spec) for spec in build_tables(cfg)]
        for i, st in enumerate(self.states):
            if st.keyed:
                st.fresh_keys = _key_pool(i, cfg.keys_per_table)
        self.changes: list[Change] = []
        self.time_ms = cfg.start_time_ms
        self.last_sequence = -1

    # -- clock -----------------------------------------------------------------------------------------------
    def _tick(self) -> tuple[int, int]:
        """Advances the clock; returns ``(sequence, event_time_ms)`` of the next change."""
        if self.cfg.clock_step_ms is not None:
            self.time_ms = self.cfg.start_time_ms + int(len(self.changes) * self.cfg.clock_step_ms)
        elif self.changes:
            r = self.rng.random()
            if r >= 0.7:
                self.time_ms += self.rng.randint(51, 5000)
            elif r >= 0.2:
                self.time_ms += self.rng.randint(1, 50)
        # DataWorks-like: time in ms * 1e6 + a counter; consecutive values differ below double precision.
        sequence = max(self.time_ms * 1_000_000, self.last_sequence + 1)
        self.last_sequence = sequence
        return sequence, self.time_ms

    def _emit(
        self,
        op: ChangeOp,
        st: _TableState,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        row_id: int | None,
        added_column: Column | None = None,
    ) -> None:
        sequence, event_time = self._tick()
        self.changes.append(
            Change(
                op=op,
                table=st.spec,
                before=dict(before) if before is not None else None,
                after=dict(after) if after is not None else None,
                sequence=sequence,
                event_time_ms=event_time,
                row_id=row_id,
                added_column=added_column,
            )
        )

    # -- values ----------------------------------------------------------------------------------------------
    def _value(self, kind: ColumnKind) -> Any:
        return None if self.rng.random() < self.cfg.null_ratio else _random_value(self.rng, kind)

    def _new_row(self, st: _TableState, key: int | None) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for col in st.spec.columns:
            if col.name in st.spec.primary_key:
                row[col.name] = key
            else:
                row[col.name] = self._value(col.kind)
        return row

    # -- operations ------------------------------------------------------------------------------------------
    def run(self) -> SourceHistory:
        cfg = self.cfg
        total = cfg.events + cfg.truncates + cfg.added_columns
        specials: list[str] = ["TRUNCATE"] * cfg.truncates + ["ADD_COLUMN"] * cfg.added_columns
        self.rng.shuffle(specials)
        # Keep DDL away from the very start and end so there are rows to truncate and rows written afterwards.
        lo, hi = total // 10, max(total // 10 + len(specials), total * 9 // 10)
        candidates = list(range(lo, min(hi, total)))
        if len(candidates) < len(specials):
            candidates = list(range(total))
        positions = sorted(self.rng.sample(candidates, len(specials)))
        scheduled = dict(zip(positions, specials, strict=True))
        for step in range(total):
            kind = scheduled.get(step)
            if kind == "TRUNCATE":
                self._truncate()
            elif kind == "ADD_COLUMN":
                self._add_column()
            else:
                self._row_change()
        return SourceHistory([st.spec for st in self.states], self.changes)

    def _row_change(self) -> None:
        st = self.rng.choice(self.states)
        r = self.rng.random()
        if not st.rows:
            self._insert(st)
        elif r < self.cfg.delete_ratio:
            self._delete(st)
        elif r < self.cfg.delete_ratio + self.cfg.update_ratio:
            self._update(st)
        else:
            self._insert(st)

    def _insert(self, st: _TableState) -> None:
        if st.keyed:
            if not st.fresh_keys and not st.freed_keys:
                self._update(st)
                return
            use_freed = bool(st.freed_keys) and (not st.fresh_keys or self.rng.random() < 0.5)
            pool = st.freed_keys if use_freed else st.fresh_keys
            index = self.rng.randrange(len(pool))
            pool[index], pool[-1] = pool[-1], pool[index]
            key = pool.pop()
            row = self._new_row(st, key)
            row_id: int | None = None
            if st.has_row_ids:
                row_id = st.next_row_id
                st.next_row_id += 1
                st.row_ids[key] = row_id
            st.add(key, row)
            self._emit("INSERT", st, None, row, row_id)
            return
        if len(st.rows) >= self.cfg.keys_per_table:
            self._update(st)
            return
        if st.rows and self.rng.random() < 0.2:  # exact duplicate of an existing row (allowed without a key)
            row = dict(st.rows[st.pick(self.rng)])
        else:
            row = self._new_row(st, None)
        row_id = st.next_row_id
        st.next_row_id += 1
        st.add(row_id, row)
        self._emit("INSERT", st, None, row, row_id)

    def _update(self, st: _TableState) -> None:
        identity = st.pick(self.rng)
        before = st.rows[identity]
        after = dict(before)
        non_key = [c for c in st.spec.columns if c.name not in st.spec.primary_key]
        chosen = self.rng.sample(non_key, self.rng.randint(1, len(non_key)))
        for col in chosen:
            if before[col.name] is not None and self.rng.random() < self.cfg.null_ratio:
                after[col.name] = None
            else:
                after[col.name] = _different_value(self.rng, col.kind, before[col.name])
        new_key = self._moved_key(st)
        if new_key is None:
            st.rows[identity] = after
            row_id = st.row_ids.get(identity) if st.keyed else identity
        else:
            # A primary-key update: the same physical row (its row id moves with it) under a key no row holds.
            for name in st.spec.primary_key:
                after[name] = new_key
            st.remove(identity)
            st.add(new_key, after)
            st.freed_keys.append(identity)
            row_id = st.row_ids.pop(identity, None)
            if row_id is not None:
                st.row_ids[new_key] = row_id
        self._emit("UPDATE", st, before, after, row_id)

    def _moved_key(self, st: _TableState) -> int | None:
        """A key no row holds, for an UPDATE that changes the row's primary key (``key_update_ratio``); None for
        an UPDATE that keeps it."""
        if not st.keyed or self.cfg.key_update_ratio <= 0.0 or self.rng.random() >= self.cfg.key_update_ratio:
            return None
        pool = st.freed_keys if st.freed_keys and (not st.fresh_keys or self.rng.random() < 0.5) else st.fresh_keys
        if not pool:
            return None
        index = self.rng.randrange(len(pool))
        pool[index], pool[-1] = pool[-1], pool[index]
        return pool.pop()

    def _delete(self, st: _TableState) -> None:
        identity = st.pick(self.rng)
        before = st.remove(identity)
        row_id = st.row_ids.pop(identity, None) if st.keyed else identity
        if st.keyed:
            st.freed_keys.append(identity)
        self._emit("DELETE", st, before, None, row_id)

    def _truncate(self) -> None:
        with_rows = [st for st in self.states if st.rows]
        st = self.rng.choice(with_rows or self.states)
        if st.keyed:
            st.freed_keys.extend(st.rows)
        st.clear()
        self._emit("TRUNCATE", st, None, None, None)

    def _add_column(self) -> None:
        st = self.rng.choice(self.states)
        st.added += 1
        kind = self.rng.choice(COLUMN_KINDS)
        name = f"extra_{st.added}"
        if st.spec.db_type.lower() == "oracle":
            name = name.upper()
        col = Column(name, kind)
        st.spec = dataclasses.replace(st.spec, columns=[*st.spec.columns, col], primary_key=list(st.spec.primary_key))
        for row in st.rows.values():
            row[name] = None
        self._emit("ADD_COLUMN", st, None, None, None, added_column=col)
