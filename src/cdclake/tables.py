"""Which source tables a pipeline lands (``tables: {include: [...], exclude: [...]}``), and where (``routes``).

A whole-database or whole-instance stream (DTS, DRS, DataWorks) carries every table of the source, scratch and
audit tables included; the filter keeps the ones the lake should have. Patterns are matched against the same names
as every other per-table setting (``keys``, ``ddl.tables``, ``history``): ``table``, ``db.table`` (``db`` is the
database or, for sources without one, the schema), ``schema.table`` and ``db.schema.table``. A pattern is a glob:
``*`` matches any run of characters (dots included), ``?`` one character, everything else itself (case-sensitive,
like the source names).

A table is landed when no ``include`` is given or one matches, and no ``exclude`` matches. The filter is decided on
the driver, once per table and batch (from the batch's summary), and applied as a ``table IN (...)`` condition:
no per-row Python.

Routes (:class:`TableRoutes`) name the lake table of a source table: by default ``<database>/<table>``; a rule
can rename it (``ods.{database}_{table}``) or merge several source tables into one (sharded ``orders_00..63`` into
``shop.orders``). Only the lake's naming changes: the events, progress and status keep the source names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Final


def table_names(database: str | None, schema: str | None, table: str) -> set[str]:
    """The names a per-table setting may use for a source table (see the module doc)."""
    names = {table, f"{database or schema}.{table}"}
    if schema:
        names.add(f"{schema}.{table}")
    if database and schema:
        names.add(f"{database}.{schema}.{table}")
    return names


def _glob(pattern: str) -> re.Pattern[str]:
    parts = [".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern]
    return re.compile("".join(parts), re.DOTALL)


def check_pattern(pattern: str) -> str | None:
    """Why ``pattern`` is not a table pattern, or None."""
    if not pattern or not pattern.strip():
        return "an empty pattern"
    if pattern != pattern.strip():
        return f"{pattern!r} has leading or trailing blanks"
    if any(not part for part in pattern.split(".")):
        return f"{pattern!r} has an empty name part (db.table, db.schema.table or table, with * and ?)"
    return None


@dataclass(frozen=True)
class TableFilter:
    """The ``tables`` setting: glob patterns of tables to land (``include``, default all) and to leave out."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @classmethod
    def of(cls, include: Iterable[str] = (), exclude: Iterable[str] = ()) -> TableFilter:
        return cls(tuple(include), tuple(exclude))

    @property
    def selects_all(self) -> bool:
        return not self.include and not self.exclude

    @cached_property
    def _include(self) -> Sequence[re.Pattern[str]]:
        return [_glob(p) for p in self.include]

    @cached_property
    def _exclude(self) -> Sequence[re.Pattern[str]]:
        return [_glob(p) for p in self.exclude]

    def admits(self, database: str | None, schema: str | None, table: str | None) -> bool:
        """Whether the table's changes land in the lake. Events of no table (heartbeats, transaction boundaries,
        database-level statements) always pass."""
        if table is None or self.selects_all:
            return True
        names = table_names(database, schema, table)

        def matches(patterns: Sequence[re.Pattern[str]]) -> bool:
            return any(p.fullmatch(name) for p in patterns for name in names)

        return (not self.include or matches(self._include)) and not matches(self._exclude)


# ---------------------------------------------------------------------------------------------------------------------
# Routes: which lake table a source table lands in


PLACEHOLDERS: Final = ("database", "schema", "table")
_PLACEHOLDER: Final = re.compile(r"\{([^{}]*)\}")


def check_target(target: str) -> str | None:
    """Why ``target`` is not a route target (``table`` or ``db.table``, with placeholders), or None."""
    if not target or target != target.strip():
        return f"{target!r} is empty or has leading or trailing blanks"
    parts = target.split(".")
    if len(parts) > 2 or any(not part for part in parts):
        return f"{target!r} is not `table` or `db.table` (the lake has two name levels)"
    for name in _PLACEHOLDER.findall(target):
        if name not in PLACEHOLDERS:
            return f"{target!r} has an unknown placeholder {{{name}}} (known: {{database}}, {{schema}}, {{table}})"
    literal = _PLACEHOLDER.sub("", target)
    if "{" in literal or "}" in literal:
        return f"{target!r} has an unmatched brace"
    return None


@dataclass(frozen=True)
class TableRoute:
    """One rule of the ``routes`` setting: the source tables matching one of ``tables`` (patterns as in
    :class:`TableFilter`) land in the lake table ``to``: ``db.table``, or ``table`` to keep the source's database.
    ``{database}``, ``{schema}`` and ``{table}`` in ``to`` stand for the source table's names (``{database}`` is the
    schema for sources that name only one level; an absent name is empty, and a part that comes out empty keeps
    the source's name)."""

    tables: tuple[str, ...]
    to: str

    def __post_init__(self) -> None:
        for pattern in self.tables:
            problem = check_pattern(pattern)
            if problem:
                raise ValueError(f"route to {self.to!r}: {problem}")
        if not self.tables:
            raise ValueError(f"route to {self.to!r}: no table pattern")
        problem = check_target(self.to)
        if problem:
            raise ValueError(f"route: {problem}")

    @cached_property
    def _patterns(self) -> Sequence[re.Pattern[str]]:
        return [_glob(p) for p in self.tables]

    def matches(self, database: str | None, schema: str | None, table: str) -> bool:
        return any(p.fullmatch(name) for p in self._patterns for name in table_names(database, schema, table))

    def target(self, database: str | None, schema: str | None, table: str) -> tuple[str | None, str]:
        """The lake (database, table) of a source table this rule matches; database None: the source's own."""
        values = {"database": database or schema or "", "schema": schema or "", "table": table}
        parts = [_PLACEHOLDER.sub(lambda m: values[m.group(1)], part) for part in self.to.split(".")]
        return (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])


@dataclass(frozen=True)
class TableRoutes:
    """The ``routes`` setting: ordered rules, the first that matches a source table names its lake table; tables no
    rule matches land in ``<database>/<table>``. Several source tables routed to one lake table share it, as tables
    of one name in several schemas do (README "What lands in the lake")."""

    rules: tuple[TableRoute, ...] = ()

    @classmethod
    def of(cls, rules: Iterable[tuple[Iterable[str], str]] = ()) -> TableRoutes:
        return cls(tuple(TableRoute(tuple(tables), to) for tables, to in rules))

    def lake_name(self, database: str | None, schema: str | None, table: str) -> tuple[str | None, str]:
        """The lake (database, table) names of a source table, before they are made path-safe: the first matching
        rule's target, else the source's database (or schema) and table."""
        own = database or schema
        for rule in self.rules:
            if rule.matches(database, schema, table):
                lake_database, lake_table = rule.target(database, schema, table)
                return lake_database or own, lake_table or table
        return own, table
