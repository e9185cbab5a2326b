"""Which source tables a pipeline lands: ``tables: {include: [...], exclude: [...]}``.

A whole-database or whole-instance stream (DTS, DRS, DataWorks) carries every table of the source, scratch and
audit tables included; the filter keeps the ones the lake should have. Patterns are matched against the same names
as every other per-table setting (``keys``, ``ddl.tables``, ``history``): ``table``, ``db.table`` (``db`` is the
database or, for sources without one, the schema), ``schema.table`` and ``db.schema.table``. A pattern is a glob:
``*`` matches any run of characters (dots included), ``?`` one character, everything else itself (case-sensitive,
like the source names).

A table is landed when no ``include`` is given or one matches, and no ``exclude`` matches. The filter is decided on
the driver, once per table and batch (from the batch's summary), and applied as a ``table IN (...)`` condition:
no per-row Python.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property


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
