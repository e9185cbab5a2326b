"""Which source tables a pipeline lands (``tables: {include: [...], exclude: [...]}``), where (``routes``), and the
per-table settings (``keys``, ``sequence_by``, ``ddl.tables``: :class:`PerTable`).

A whole-database or whole-instance stream (DTS, DRS, DataWorks) carries every table of the source, scratch and
audit tables included; the filter keeps the ones the lake should have. Patterns are matched against the same names
as every other per-table setting (``keys``, ``sequence_by``, ``ddl.tables``, ``history``, ``routes``): ``table``,
``db.table`` (``db`` is the database or, for sources without one, the schema), ``schema.table`` and
``db.schema.table``. A pattern is a glob: ``*`` matches any run of characters (dots included), ``?`` one character,
everything else itself (case-sensitive, like the source names).

A table is landed when no ``include`` is given or one matches, and no ``exclude`` matches. The filter is decided on
the driver, once per table and batch (from the batch's summary), and applied as a ``table IN (...)`` condition:
no per-row Python.

Routes (:class:`TableRoutes`) name the lake table of a source table: by default ``<database>/<table>``; a rule
can rename it (``ods.{database}_{table}``) or merge several source tables into one (sharded ``orders_00..63`` into
``shop.orders``). Only the lake's naming changes: the events, progress and status keep the source names.

Online schema change tools (:class:`OnlineSchemaChange`, ``ddl.online_schema_change``) copy a table into a ghost
table, alter the ghost, and swap it in with ``RENAME TABLE``; their helper tables are known by their names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Final, Generic, NamedTuple, TypeVar


def table_names(database: str | None, schema: str | None, table: str) -> set[str]:
    """The names a per-table setting may use for a source table (see the module doc)."""
    names = {table}
    if database or schema:
        names.add(f"{database or schema}.{table}")
    if schema:
        names.add(f"{schema}.{table}")
    if database and schema:
        names.add(f"{database}.{schema}.{table}")
    return names


def is_pattern(name: str) -> bool:
    """Whether a table name of a setting has wildcards (``*``, ``?``)."""
    return "*" in name or "?" in name


def glob_regex(pattern: str) -> str:
    """The regular expression of a table pattern, to be matched against a whole name. Its escapes (Python's
    ``re.escape``: a backslash before punctuation only) mean the same in Java's regex syntax, so Spark's ``rlike``
    matches exactly what :func:`_glob` does."""
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)


def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(glob_regex(pattern), re.DOTALL)


def _matches(patterns: Iterable[re.Pattern[str]], names: Iterable[str]) -> bool:
    """Whether one of the compiled ``patterns`` matches one of a table's ``names`` (:func:`table_names`) whole."""
    return any(p.fullmatch(name) for p in patterns for name in names)


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
        return (not self.include or _matches(self._include, names)) and not _matches(self._exclude, names)


# ---------------------------------------------------------------------------------------------------------------------
# Per-table settings: `keys`, `sequence_by`, `ddl.tables`

Value = TypeVar("Value")


@dataclass(frozen=True)
class PerTable(Generic[Value]):
    """A per-table setting (``keys``, ``sequence_by``, ``ddl.tables``): table names or patterns (as in
    :class:`TableFilter`) -> value.

    A table takes the value of the most specific entry that matches one of its names, so the order of a YAML
    mapping matters only between equally specific entries: a name without wildcards wins over a pattern, and of
    two names the one with more parts (``db.schema.table``, then ``db.table`` or ``schema.table``, then
    ``table``); of two patterns, the one with more literal characters (``shop.orders_*`` before ``shop.*`` before
    ``*``); of equals, the one listed first.
    Sharded tables take one setting from a pattern, and one shard can still be set apart by its name.
    """

    entries: tuple[tuple[str, Value], ...] = ()

    @classmethod
    def of(cls, setting: Mapping[str, Value]) -> PerTable[Value]:
        return cls(tuple(setting.items()))

    def __bool__(self) -> bool:
        return bool(self.entries)

    @cached_property
    def ranked(self) -> Sequence[tuple[str, Value]]:
        """The entries, the one that wins first."""

        def rank(indexed: tuple[int, tuple[str, Value]]) -> tuple[int, int, int]:
            index, (name, _value) = indexed
            if is_pattern(name):
                return 1, -sum(c not in "*?" for c in name), index
            return 0, -name.count("."), index

        return [entry for _index, entry in sorted(enumerate(self.entries), key=rank)]

    @cached_property
    def _matchers(self) -> Sequence[tuple[re.Pattern[str], Value]]:
        return [(_glob(name), value) for name, value in self.ranked]

    def value_for(self, database: str | None, schema: str | None, table: str) -> Value | None:
        """The table's value (see the class doc), or None when no entry matches."""
        entry = self.entry_for(database, schema, table)
        return None if entry is None else entry[1]

    def entry_for(self, database: str | None, schema: str | None, table: str) -> tuple[str, Value] | None:
        """The entry (name or pattern, value) that gives the table its value, or None when no entry matches."""
        names = table_names(database, schema, table)
        for (pattern, _value), entry in zip(self._matchers, self.ranked, strict=True):
            if _matches([pattern], names):
                return entry
        return None


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
        return _matches(self._patterns, table_names(database, schema, table))

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


# ---------------------------------------------------------------------------------------------------------------------
# Online schema change: the helper tables of gh-ost and pt-online-schema-change

GHOST_TABLES: Final = ("_{table}_gho", "_{table}_new")
"""The ghost tables of gh-ost (``_t_gho``) and pt-online-schema-change (``_t_new``): a copy of ``t`` that the tool
alters, fills with ``t``'s rows and changes, and renames to ``t`` at the cut-over."""
TRASH_TABLES: Final = ("_{table}_ghc", "_{table}_del", "_{table}_old")
"""The other helper tables: gh-ost's changelog (``_t_ghc``) and the name ``t`` is renamed to at the cut-over
(gh-ost ``_t_del``, pt-online-schema-change ``_t_old``), dropped afterwards."""


def check_helper_template(template: str) -> str | None:
    """Why ``template`` is not a helper table template (a table name with one ``{table}``), or None."""
    if template.count("{table}") != 1:
        return f"{template!r} must hold {{table}} once (the name of the table being changed)"
    literal = template.replace("{table}", "")
    if not literal:
        return f"{template!r} names the table itself: add a prefix or suffix"
    if "{" in literal or "}" in literal or "." in literal:
        return f"{template!r} has a brace or a dot outside {{table}} (the helper is in the table's own database)"
    return None


def _template_regex(template: str) -> re.Pattern[str]:
    before, after = template.split("{table}")
    return re.compile(f"{glob_regex(before)}(.+){glob_regex(after)}", re.DOTALL)


@dataclass(frozen=True)
class OnlineSchemaChange:
    """The helper tables of online schema change tools, by name templates (``{table}``: the table being changed;
    ``*`` and ``?`` as in table patterns). See cdclake.evolve for what the pipeline does with them."""

    ghost_tables: tuple[str, ...] = GHOST_TABLES
    trash_tables: tuple[str, ...] = TRASH_TABLES

    def __post_init__(self) -> None:
        for template in (*self.ghost_tables, *self.trash_tables):
            problem = check_helper_template(template)
            if problem:
                raise ValueError(f"online schema change: {problem}")

    @cached_property
    def _ghosts(self) -> Sequence[re.Pattern[str]]:
        return [_template_regex(t) for t in self.ghost_tables]

    @cached_property
    def _trash(self) -> Sequence[re.Pattern[str]]:
        return [_template_regex(t) for t in self.trash_tables]

    @staticmethod
    def _original(patterns: Sequence[re.Pattern[str]], table: str) -> str | None:
        for pattern in patterns:
            match = pattern.fullmatch(table)
            if match:
                return match.group(1)
        return None

    def ghost_of(self, table: str) -> str | None:
        """The name of the table that ``table`` is the ghost of, or None."""
        return self._original(self._ghosts, table)

    def trash_of(self, table: str) -> str | None:
        """The name of the table that ``table`` is another helper table of, or None."""
        return self._original(self._trash, table)

    def is_helper(self, table: str | None) -> bool:
        return table is not None and (self.ghost_of(table) is not None or self.trash_of(table) is not None)


class SequenceByProblem(NamedTuple):
    """Why a table's changes cannot be ordered by its ``sequence_by`` column (:func:`sequence_by_problem`)."""

    text: str
    warning_only: bool
    """A pattern gave the column (it may match tables without it): the table keeps the format's order, and that is
    only worth a warning. Otherwise the table's row events are dead letters."""


def sequence_by_problem(
    sequence_by: Mapping[str, str], ident: tuple[str | None, str | None, str], columns: Sequence[str]
) -> SequenceByProblem | None:
    """Why the table's changes cannot be ordered by its ``sequence_by`` column, or None: the table has no such
    column among ``columns`` (in any case, as ``apply.sequenced`` reads it), so every change would sort as NULL, by
    the format's position instead, and nothing would say so."""
    entry = PerTable.of(sequence_by).entry_for(*ident)
    if entry is None or entry[1].lower() in {name.lower() for name in columns}:
        return None
    setting, column = entry
    name = ".".join(part for part in ident if part)
    if is_pattern(setting):
        text = f"sequence_by pattern {setting}: {name} has no column {column}; keeping its position"
        return SequenceByProblem(text, warning_only=True)
    text = f"sequence_by column {column} is not a column of {name}: fix the `sequence_by` setting"
    return SequenceByProblem(text, warning_only=False)
