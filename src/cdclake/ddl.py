"""Source DDL text -> validated schema changes, and the type rules of schema evolution. Sink-agnostic.

DDL text arrives inside messages: it is untrusted and never executed. :func:`parse_ddl` parses it with sqlglot in
the source's dialect and keeps only the changes cdclake knows how to apply to a lake table:

==================  ====================================================================================
change              statements (MySQL / Oracle / PostgreSQL / SQL Server spellings sqlglot understands)
==================  ====================================================================================
``add_column``      ``ALTER TABLE t ADD [COLUMN] c type``, Oracle ``ADD (c type, ...)``
``drop_column``     ``ALTER TABLE t DROP [COLUMN] c``
``rename_column``   ``ALTER TABLE t RENAME COLUMN a TO b``, MySQL ``CHANGE [COLUMN] a b type``
``modify_column``   MySQL ``MODIFY [COLUMN] c type``, Oracle ``MODIFY (c type)``, ``ALTER COLUMN c [SET DATA] TYPE t``
``create_table``    ``CREATE TABLE t (c type, ...)``, ``CREATE TABLE t LIKE other``
``drop_table``      ``DROP TABLE t``
``rename_table``    ``ALTER TABLE a RENAME TO b``, MySQL ``RENAME TABLE a TO b``
``truncate``        ``TRUNCATE TABLE t``
==================  ====================================================================================

Anything else (indexes, grants, constraints, comments, views, ...) does not change a lake table: it is recorded
and otherwise ignored. A statement that cannot be parsed is reported as such (the pipeline records it and, for
statements that look like table changes, dead-letters the message).

Types: :func:`spark_type_of` maps a SQL column type to the Spark type the lake uses, or ``None`` when the mapping
would lose information (the column is then typed by the first data that declares it). :func:`widened` says
whether a table column may change from one type to another without losing any stored value.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

ChangeKind = Literal[
    "add_column",
    "drop_column",
    "rename_column",
    "modify_column",
    "create_table",
    "drop_table",
    "rename_table",
    "truncate",
]


@dataclass(frozen=True)
class TableName:
    """A table as a statement names it, completed with the event's database/schema where it names none."""

    database: str | None
    schema: str | None
    table: str


@dataclass(frozen=True)
class SchemaChange:
    """One validated change of one table.

    Attributes:
        kind: see the module doc.
        table: the table changed (for ``rename_table``: the old name).
        column: column concerned (column changes).
        new_name: new column name (``rename_column``; also ``modify_column`` from MySQL ``CHANGE``).
        spark_type: new column type, ``None`` if the SQL type has no lossless Spark type.
        new_table: ``rename_table`` target.
        columns: ``create_table`` columns (name, Spark type or None).
        like: ``create_table``: the table whose columns the new one copies (``CREATE TABLE t LIKE other``).
        key_columns: ``create_table``: the statement's primary key (column or table constraint), when every one
            of its columns has a Spark type; else empty.
        if_not_exists: ``create_table``: ``CREATE TABLE IF NOT EXISTS`` (an existing table is left as it is).
        sql_type: ``add_column`` / ``modify_column``: the column's SQL type as the source's dialect spells it
            (``int(11) unsigned``), which a format may type its own way (:func:`typed_as`).
        column_sql_types: ``create_table``: the SQL type of each of ``columns``, likewise.
    """

    kind: ChangeKind
    table: TableName
    column: str | None = None
    new_name: str | None = None
    spark_type: str | None = None
    new_table: TableName | None = None
    columns: tuple[tuple[str, str | None], ...] = field(default_factory=tuple)
    like: TableName | None = None
    key_columns: tuple[str, ...] = ()
    if_not_exists: bool = False
    sql_type: str | None = None
    column_sql_types: tuple[str | None, ...] = ()


@dataclass(frozen=True)
class ParsedDdl:
    """Result of :func:`parse_ddl`: the changes, or why there are none."""

    changes: tuple[SchemaChange, ...] = ()
    ignored: str | None = None
    """Why the statement changes no lake table (not an error), e.g. ``CREATE INDEX``."""
    error: str | None = None
    """Why the statement could not be understood although it looks like a table change."""


DIALECTS: dict[str, str] = {
    "mysql": "mysql",
    "mariadb": "mysql",
    "polardb": "mysql",
    "oracle": "oracle",
    "postgresql": "postgres",
    "postgres": "postgres",
    "gaussdb": "postgres",
    "sqlserver": "tsql",
    "sql server": "tsql",
    "mssql": "tsql",
}
"""Source database type (case-insensitive, as formats report it) -> sqlglot dialect."""

_COMMENT = re.compile(r"/\*(?!!).*?\*/", re.S)
"""A ``/* ... */`` comment, except MySQL's executable ``/*! ... */``: tools mark their statements with one
(gh-ost: ``rename /* gh-ost */ table ...``)."""
_TABLE_CHANGE = re.compile(r"^\s*(ALTER\s+TABLE|CREATE\s+TABLE|DROP\s+TABLE|RENAME\s+TABLE|TRUNCATE)\b", re.I)
_RENAME_TABLES = re.compile(r"^\s*RENAME\s+TABLE\s+(.+?)\s*;?\s*$", re.I | re.S)
_ORACLE_MODIFY = re.compile(r"^\s*ALTER\s+TABLE\s+(\S+)\s+MODIFY\s*\((.*)\)\s*;?\s*$", re.I | re.S)


def dialect_of(db_type: str | None) -> str | None:
    return DIALECTS.get((db_type or "").strip().lower())


_PARSE_FAILURES: Final = (SqlglotError, RecursionError)
"""What sqlglot raises on text it cannot parse. It parses nested expressions by recursion, and about 50 nested
parentheses (a DEFAULT or a type's parameters) exceed Python's recursion limit: a statement from a message is then a
DDL that does not parse, not an exception that stops the batch."""


def _parse_problem(what: str, exc: BaseException) -> str:
    reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).splitlines()[0][:200]
    return f"cannot parse {what}: {reason}"


def parse_ddl(text: str, *, db_type: str | None, database: str | None, schema: str | None) -> ParsedDdl:
    """Parses one DDL statement of a source into schema changes (never executes anything)."""
    dialect = dialect_of(db_type)
    names = _Names(dialect, database, schema)
    bare = _COMMENT.sub(" ", text)
    rename = _RENAME_TABLES.match(bare)
    if rename:  # MySQL's RENAME TABLE a TO b[, c TO d]: sqlglot keeps it as an opaque command
        names.dialect = names.dialect or "mysql"  # MySQL's statement (backquoted names), from a source of no type
        return _rename_tables(rename.group(1), names)
    modify = _ORACLE_MODIFY.match(bare)
    if modify:  # Oracle's MODIFY (c type, ...): parsed as the column list of a CREATE TABLE
        return _oracle_modify(modify.group(1), modify.group(2), names)
    statements: list[Any] = []
    problem = "empty DDL text"
    # A source that does not say what it is (Canal speaks MySQL's binlog) gets a second chance in MySQL's dialect.
    for attempt in [dialect] if dialect else [None, "mysql"]:
        try:
            with _sqlglot_fallbacks_quiet():
                statements = [s for s in sqlglot.parse(text, read=attempt) if s is not None]
        except _PARSE_FAILURES as exc:
            problem = _parse_problem("DDL", exc)
            continue
        if not (len(statements) == 1 and isinstance(statements[0], exp.Command)):
            names.dialect = attempt
            break
    else:
        if not statements:
            return _unparsed(bare, problem)
    if len(statements) != 1:
        return _unparsed(bare, f"expected one DDL statement, found {len(statements)}")
    statement = statements[0]
    if isinstance(statement, exp.Alter) and (statement.args.get("kind") or "").upper() == "TABLE":
        return _alter(statement, names)
    if isinstance(statement, exp.Create) and (statement.args.get("kind") or "").upper() == "TABLE":
        return _create(statement, names)
    if isinstance(statement, exp.Drop) and (statement.args.get("kind") or "").upper() == "TABLE":
        tables = statement.args.get("tables") or statement.expressions
        return ParsedDdl(tuple(SchemaChange("drop_table", names.table(t)) for t in tables))
    if isinstance(statement, exp.TruncateTable):
        return ParsedDdl(tuple(SchemaChange("truncate", names.table(t)) for t in statement.expressions))
    if isinstance(statement, exp.Command):
        return _unparsed(bare, "DDL syntax not understood")
    return ParsedDdl(ignored=f"{statement.key.upper()} statement does not change a table's columns")


class _QuietWhileParsing(logging.Filter):
    """Drops sqlglot's records in the threads that are inside :func:`_sqlglot_fallbacks_quiet`."""

    def __init__(self) -> None:
        super().__init__()
        self.parsing = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not getattr(self.parsing, "active", False)


_QUIET = _QuietWhileParsing()
logging.getLogger("sqlglot").addFilter(_QUIET)


@contextmanager
def _sqlglot_fallbacks_quiet() -> Iterator[None]:
    """Without sqlglot's records below ERROR, chiefly its warning that it keeps a statement as an opaque command
    ("contains unsupported syntax. Falling back to parsing as a 'Command'"): parse_ddl tries MySQL's dialect next,
    or records the statement as not understood (schema_changes, and a dead letter or an error per the DDL policy).
    A MySQL ALTER from a source that does not name its database type (Canal) logged it on every column it added,
    and then applied the change. Per thread, so that other threads' use of sqlglot keeps its warnings."""
    _QUIET.parsing.active = True
    try:
        yield
    finally:
        _QUIET.parsing.active = False


def _unparsed(bare: str, reason: str) -> ParsedDdl:
    """``bare``: the statement without its comments."""
    if _TABLE_CHANGE.match(bare):
        return ParsedDdl(error=reason)
    return ParsedDdl(ignored=f"not a table change ({reason})")


class _Names:
    """Identifier normalisation: Oracle folds unquoted names to upper case, PostgreSQL to lower case."""

    def __init__(self, dialect: str | None, database: str | None, schema: str | None) -> None:
        self.dialect = dialect
        self.database = database
        self.schema = schema

    def identifier(self, node: exp.Expression | None) -> str:
        if node is None:
            raise ValueError("missing identifier")
        if isinstance(node, exp.Column | exp.ColumnDef):
            node = node.this
        name = node.name if isinstance(node, exp.Identifier) else str(node.name or node)
        quoted = isinstance(node, exp.Identifier) and bool(node.args.get("quoted"))
        if not quoted and self.dialect == "oracle":
            return name.upper()
        if not quoted and self.dialect == "postgres":
            return name.lower()
        return name

    def sql_type(self, kind: exp.Expression | None) -> str | None:
        """A column type as the statement's dialect spells it, lower case (``decimal(10, 2)``, ``int(11) unsigned``
        in MySQL's)."""
        if not isinstance(kind, exp.DataType):
            return None
        return kind.sql(dialect=self.dialect).lower()

    def table(self, node: exp.Expression) -> TableName:
        if isinstance(node, exp.Schema):
            node = node.this
        if not isinstance(node, exp.Table):
            raise ValueError(f"not a table name: {node.sql()}")
        name = self.identifier(node.this)
        qualifier = self.identifier(node.args["db"]) if node.args.get("db") else None
        if self.dialect in ("oracle", "postgres", "tsql"):  # a qualifier is a schema there
            return TableName(self.database, qualifier or self.schema, name)
        return TableName(qualifier or self.database, self.schema, name)


def _alter(statement: exp.Alter, names: _Names) -> ParsedDdl:
    table = names.table(statement.this)
    changes: list[SchemaChange] = []
    for action in statement.args.get("actions") or []:
        definitions = action.expressions if isinstance(action, exp.Schema) else [action]
        for item in definitions:
            change = _alter_action(item, table, names)
            if isinstance(change, str):
                return ParsedDdl(error=change)
            if change is not None:
                changes.append(change)
    if not changes:
        return ParsedDdl(ignored="ALTER TABLE without column or name changes")
    return ParsedDdl(tuple(changes))


def _alter_action(action: exp.Expression, table: TableName, names: _Names) -> SchemaChange | str | None:
    """One ALTER TABLE action -> a change; ``None`` for actions that change no column; text for an error."""
    if isinstance(action, exp.ColumnDef):
        return SchemaChange(
            "add_column",
            table,
            names.identifier(action),
            spark_type=spark_type_of(action.kind),
            sql_type=names.sql_type(action.kind),
        )
    if isinstance(action, exp.Drop):
        if (action.args.get("kind") or "").upper() != "COLUMN":
            return None  # DROP INDEX / CONSTRAINT / PRIMARY KEY
        columns = action.args.get("tables") or action.expressions
        if len(columns) != 1:
            return "DROP COLUMN with several columns in one action"
        return SchemaChange("drop_column", table, names.identifier(columns[0]))
    if isinstance(action, exp.RenameColumn):
        return SchemaChange(
            "rename_column", table, names.identifier(action.this), new_name=names.identifier(action.args["to"])
        )
    if isinstance(action, exp.ModifyColumn):
        definition = action.this
        new_name = names.identifier(definition)
        old = action.args.get("rename_from")
        column = names.identifier(old) if old is not None else new_name
        return SchemaChange(
            "modify_column",
            table,
            column,
            new_name=new_name if new_name != column else None,
            spark_type=spark_type_of(definition.kind),
            sql_type=names.sql_type(definition.kind),
        )
    if isinstance(action, exp.AlterColumn):
        dtype = action.args.get("dtype")
        if dtype is None:
            return None  # SET DEFAULT / DROP NOT NULL / COMMENT: no change of the lake column
        return SchemaChange(
            "modify_column",
            table,
            names.identifier(action.this),
            spark_type=spark_type_of(dtype),
            sql_type=names.sql_type(dtype),
        )
    if isinstance(action, exp.AlterRename):
        return SchemaChange("rename_table", table, new_table=names.table(action.this))
    return None


def _create(statement: exp.Create, names: _Names) -> ParsedDdl:
    schema = statement.this
    if_not_exists = bool(statement.args.get("exists"))
    # MySQL's CREATE TABLE t LIKE other; PostgreSQL's CREATE TABLE t (LIKE other) is a column list of one LIKE.
    like = statement.find(exp.LikeProperty)
    if like is not None and isinstance(like.this, exp.Table):
        created = schema.this if isinstance(schema, exp.Schema) else schema
        change = SchemaChange(
            "create_table", names.table(created), like=names.table(like.this), if_not_exists=if_not_exists
        )
        return ParsedDdl((change,))
    if not isinstance(schema, exp.Schema):
        return ParsedDdl(ignored="CREATE TABLE without a column list (e.g. AS SELECT / LIKE)")
    definitions = [c for c in schema.expressions if isinstance(c, exp.ColumnDef)]
    columns = tuple((names.identifier(c), spark_type_of(c.kind)) for c in definitions)
    if not columns:
        return ParsedDdl(ignored="CREATE TABLE without column definitions")
    change = SchemaChange(
        "create_table",
        names.table(schema),
        columns=columns,
        key_columns=_primary_key(schema, definitions, columns, names),
        if_not_exists=if_not_exists,
        column_sql_types=tuple(names.sql_type(c.kind) for c in definitions),
    )
    return ParsedDdl((change,))


def _primary_key(
    schema: exp.Schema,
    definitions: list[exp.ColumnDef],
    columns: tuple[tuple[str, str | None], ...],
    names: _Names,
) -> tuple[str, ...]:
    """The columns of the statement's primary key, as the statement's column definitions spell them; empty when it
    has none, or names a column that is not defined or has no Spark type (the keys then come with data)."""
    named = [
        names.identifier(definition)
        for definition in definitions
        if any(isinstance(c.args.get("kind"), exp.PrimaryKeyColumnConstraint) for c in definition.constraints)
    ]
    for constraint in schema.find_all(exp.PrimaryKey):
        named.extend(names.identifier(e.this if isinstance(e, exp.Ordered) else e) for e in constraint.expressions)
    typed = {name.lower(): name for name, spark_type in columns if spark_type is not None}
    keys = tuple(dict.fromkeys(typed.get(name.lower(), "") for name in named))
    return () if "" in keys else keys


def _rename_tables(pairs: str, names: _Names) -> ParsedDdl:
    changes = []
    for pair in pairs.split(","):
        parts = re.split(r"\s+TO\s+", pair.strip(), flags=re.I)
        if len(parts) != 2:
            return ParsedDdl(error=f"cannot parse RENAME TABLE pair {pair.strip()!r}")
        try:
            old, new = (sqlglot.parse_one(p, read=names.dialect, into=exp.Table) for p in parts)
        except _PARSE_FAILURES as exc:
            return ParsedDdl(error=_parse_problem("RENAME TABLE", exc))
        changes.append(SchemaChange("rename_table", names.table(old), new_table=names.table(new)))
    return ParsedDdl(tuple(changes))


def _oracle_modify(table_text: str, definitions: str, names: _Names) -> ParsedDdl:
    try:
        create = sqlglot.parse_one(f"CREATE TABLE {table_text} ({definitions})", read=names.dialect)
    except _PARSE_FAILURES as exc:
        return ParsedDdl(error=_parse_problem("MODIFY", exc))
    parsed = _create(create, names) if isinstance(create, exp.Create) else ParsedDdl(error="cannot parse MODIFY")
    if parsed.error or not parsed.changes:
        return ParsedDdl(error=parsed.error or "MODIFY without column definitions")
    created = parsed.changes[0]
    return ParsedDdl(
        tuple(
            SchemaChange("modify_column", created.table, name, spark_type=t, sql_type=sql_type)
            for (name, t), sql_type in zip(created.columns, created.column_sql_types, strict=True)
        )
    )


def invalid_name(name: str, *, column: bool) -> str | None:
    """Why an identifier from DDL text cannot name a lake table or column (the decoders' rules), or ``None``."""
    if not name or len(name) > 255 or re.search(r"[\x00-\x1f\x7f]", name):
        return f"invalid identifier {name!r}"
    if column and name.lower().startswith("_cdc_") and name != "_cdc_row_id":
        return f"column name {name!r} uses cdclake's reserved prefix _cdc_"
    return None


# ------------------------------------------------------------------------------------------------------------------
# Types

_T = exp.DataType.Type
_SIMPLE: dict[object, str] = {
    _T.BOOLEAN: "boolean",
    _T.TINYINT: "tinyint",
    _T.UTINYINT: "smallint",
    _T.SMALLINT: "smallint",
    _T.USMALLINT: "int",
    _T.MEDIUMINT: "int",
    _T.UMEDIUMINT: "int",
    _T.INT: "int",
    _T.UINT: "bigint",
    _T.BIGINT: "bigint",
    _T.UBIGINT: "decimal(20,0)",
    _T.FLOAT: "float",
    _T.DOUBLE: "double",
    _T.DATE: "date",
    _T.DATETIME: "timestamp",
    _T.DATETIME64: "timestamp",
    _T.TIMESTAMP: "timestamp",
    _T.TIMESTAMPTZ: "timestamp",
    _T.TIMESTAMPLTZ: "timestamp",
    _T.TIMESTAMP_S: "timestamp",
    _T.TIMESTAMP_MS: "timestamp",
}
_TEXT = {
    _T.CHAR,
    _T.NCHAR,
    _T.VARCHAR,
    _T.NVARCHAR,
    _T.TEXT,
    _T.MEDIUMTEXT,
    _T.LONGTEXT,
    _T.TINYTEXT,
    _T.JSON,
    _T.UUID,
    _T.ENUM,
    _T.SET,
}
_BINARY = {_T.BINARY, _T.VARBINARY, _T.BLOB, _T.MEDIUMBLOB, _T.LONGBLOB, _T.TINYBLOB, _T.IMAGE}


def spark_type_of(kind: exp.Expression | None) -> str | None:
    """The lake's Spark type for a SQL column type, or ``None`` if no Spark type holds every value exactly."""
    if not isinstance(kind, exp.DataType):
        return None
    params = [p.this for p in kind.expressions if isinstance(p, exp.DataTypeParam)]
    numbers = [int(p.name) for p in params if isinstance(p, exp.Literal) and p.name.isdigit()]
    this = kind.this
    if this in (_T.TINYINT, _T.BIT) and numbers == [1]:
        return "boolean"  # MySQL's BOOLEAN is tinyint(1); bit(1) is a flag
    if this in (_T.DECIMAL, _T.BIGDECIMAL):
        if not numbers:
            return None  # Oracle NUMBER without precision: any scale, no exact decimal type
        precision, scale = numbers[0], numbers[1] if len(numbers) > 1 else 0
        if precision > 38 or scale > precision or scale < 0:
            return None
        return f"decimal({precision},{scale})"
    if this in _TEXT:
        return "string"
    if this in _BINARY:
        return "binary"
    return _SIMPLE.get(this)


def sql_types_of(parsed: ParsedDdl) -> set[str]:
    """The SQL types (as :attr:`SchemaChange.sql_type` spells them) that the changes of ``parsed`` give columns."""
    spelled = [c.sql_type for c in parsed.changes] + [t for c in parsed.changes for t in c.column_sql_types]
    return {t for t in spelled if t is not None}


def typed_as(parsed: ParsedDdl, spark_types: Mapping[str, str | None]) -> ParsedDdl:
    """``parsed`` with the Spark type that ``spark_types`` (SQL type as spelled -> Spark type: how a format types the
    columns of its data, ``CdcFormat.ddl_types``) gives each column, where it gives one; the parser's elsewhere."""

    def typed(sql_type: str | None, parser_type: str | None) -> str | None:
        return (spark_types.get(sql_type) if sql_type is not None else None) or parser_type

    changes = tuple(
        replace(
            change,
            spark_type=typed(change.sql_type, change.spark_type),
            columns=tuple(
                (name, typed(sql_type, parser_type))
                for (name, parser_type), sql_type in zip(change.columns, change.column_sql_types, strict=True)
            ),
        )
        for change in parsed.changes
    )
    return replace(parsed, changes=changes)


_INTEGERS = ("tinyint", "smallint", "int", "bigint")
_INTEGER_DIGITS = {"tinyint": 3, "smallint": 5, "int": 10, "bigint": 19}
_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")


def widened(current: str, wanted: str) -> bool:
    """Whether a column of type ``current`` may become ``wanted`` keeping every stored value exactly.

    Integers widen to larger integers and to decimals with enough integer digits; float to double; a decimal to a
    decimal with at least as many integer and fraction digits. Nothing else (no text, no narrowing).
    """
    if current == wanted:
        return False
    if current in _INTEGERS and wanted in _INTEGERS:
        return _INTEGERS.index(wanted) > _INTEGERS.index(current)
    if current == "float" and wanted == "double":
        return True
    target = _DECIMAL.fullmatch(wanted)
    if target is None:
        return False
    precision, scale = int(target.group(1)), int(target.group(2))
    if current in _INTEGERS:
        return precision - scale >= _INTEGER_DIGITS[current]
    source = _DECIMAL.fullmatch(current)
    if source is None:
        return False
    return precision - scale >= int(source.group(1)) - int(source.group(2)) and scale >= int(source.group(2))


def common_type(current: str, declared: set[str]) -> str | None:
    """The narrowest of ``declared`` (plus ``current``) that every other one widens to, or ``None``."""
    candidates = sorted(declared | {current})
    for candidate in candidates:
        if all(t == candidate or widened(t, candidate) for t in candidates):
            return candidate
    return None
