"""Apache Iceberg lake tables (``table_format: iceberg``): the only module that knows Iceberg.

The lake tables are Iceberg tables (format version 2) in a Spark catalog: by default a Hadoop catalog whose
warehouse is the lake directory, so a table lives at ``<lake>/<database>/<table>`` as with Delta; or a catalog the
session already has (``iceberg_catalog``: a REST, Glue, Hive or Nessie catalog configured with Spark's
``spark.sql.catalog.<name>.*`` settings), whose namespace ``<database>`` holds table ``<table>``. cdclake's own
bookkeeping tables under ``<lake>/_cdclake`` (tombstones, progress, dead letters, schema changes, pending
transactions) stay Delta tables: they are written by :class:`~cdclake.sinks.delta.DeltaSink`, which this sink
extends.

Row changes are applied as in Delta: one ``MERGE INTO`` per table and batch (:func:`~cdclake.sinks.delta.
merge_statement`), gated by each row's recorded order. Tables are merge-on-read (``write.merge.mode``,
``write.update.mode``, ``write.delete.mode``): a MERGE writes the changed rows and position deletes instead of
rewriting the files that held them, Iceberg's counterpart of Delta's deletion vectors. Iceberg has no automatic
compaction, so after a MERGE that leaves a table with about :attr:`IcebergSink.COMPACT_EVERY` commits since its
last rewrite (:meth:`IcebergSink.compact_after`), its data files are rewritten with their deletes applied
(``rewrite_data_files``). The count is read from the table's snapshots, so that runs shorter than that many MERGEs
(scheduled ``available_now`` runs) add up.

Exactly once: each commit of a batch carries the snapshot summary property ``cdclake.txn.<app id>`` = batch id
(Iceberg's ``spark.sql.iceberg.snapshot-property.*`` session settings), and a write whose table already has a
snapshot with that batch id, or a later one, is skipped; this is Delta's idempotent-writer rule (``txnAppId`` /
``txnVersion``). Expiring snapshots is safe as long as the newest snapshots of the last batch remain.
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.errors import AnalysisException
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType, _parse_datatype_string

from cdclake import apply, model
from cdclake.apply import TablePlan
from cdclake.exceptions import ConfigError
from cdclake.model import quote
from cdclake.sinks.delta import (
    KEY_COLUMNS_PROPERTY,
    METADATA_COLUMNS,
    POSITION_COLUMN,
    SEQUENCE_BY_PROPERTY,
    ColumnPath,
    DeltaSink,
    MergeStatement,
    Txn,
    fitted_segment,
    merge_statement,
    metadata_columns_to_add,
    ordering_of,
    rewritten_rows,
    source_properties,
    sql_string,
    type_at,
)
from cdclake.sinks.partitioning import Partitioning, fitting, from_iceberg, on_columns, partitioned
from cdclake.spark import in_session
from cdclake.tables import PerTable, TableRoutes

log = logging.getLogger(__name__)

_URL_ENCODER_CHANGED: Final = "[^A-Za-z0-9.*_ -]"
"""The characters Java's ``URLEncoder`` writes as ``%XX`` (each byte of their UTF-8); a space becomes ``+``."""

MARKER_PREFIX: Final = "cdclake.txn."
"""Snapshot summary property of a batch's commit: ``cdclake.txn.<app id>`` = the batch id."""
_SNAPSHOT_PROPERTY: Final = "spark.sql.iceberg.snapshot-property."

TABLE_PROPERTIES: Final = {
    "format-version": "2",
    # Merge-on-read: a MERGE, UPDATE or DELETE writes position deletes, not whole files again.
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
}
"""Properties of every lake table this sink creates."""

_KEPT_PROPERTIES: Final = ("cdclake.", "write.", "read.", "commit.", "history.")
"""Table properties a rewrite carries over (a user's settings among them); Iceberg's reserved ones it does not."""

_CONFLICT_MESSAGE: Final = re.compile(r"conflicting|found new delete|missing (required|data) files", re.IGNORECASE)
"""Iceberg's ValidationException messages about a concurrent commit (``Found conflicting files ...``, ``Cannot
commit, found new delete for replaced data file ...``, ``Missing required files to delete ...``, ``Cannot commit,
missing data files ...``); the class also reports other problems, which a second attempt would not solve."""

_STORED_TYPES: Final = {"tinyint": "int", "smallint": "int"}

_DECIMAL: Final = re.compile(r"decimal\((\d+),(\d+)\)")


def _promotes(current: str, wanted: str) -> bool:
    """Whether Iceberg promotes a column of (Spark) type ``current`` to ``wanted`` in its schema alone."""
    if _STORED_TYPES.get(current, current) == "int" and wanted == "bigint":
        return True
    if current == "float" and wanted == "double":
        return True
    source, target = _DECIMAL.fullmatch(current), _DECIMAL.fullmatch(wanted)
    return (
        source is not None
        and target is not None
        and source.group(2) == target.group(2)
        and int(target.group(1)) > int(source.group(1))
    )


Identity = tuple[str | None, str | None, str]
"""A source table: (database, schema, table)."""


def _column_list(columns: Sequence[tuple[str, str]]) -> str:
    """``name type, ...`` for SQL text: names quoted, and every type one of cdclake's Spark types (a type reaches
    the statement as text, so nothing else may)."""
    for name, spark_type in columns:
        if not model.is_supported_spark_type(spark_type):
            raise ValueError(f"column {name!r}: {spark_type!r} is not a Spark type cdclake writes")
    return ", ".join(f"{quote(name)} {spark_type}" for name, spark_type in columns)


def _marker_setting(txn: Txn) -> str:
    return f"{_SNAPSHOT_PROPERTY}{MARKER_PREFIX}{txn.app_id}"


class IcebergSink(DeltaSink):
    """Writes lake tables as Iceberg tables; bookkeeping stays in Delta (see the module doc).

    Args:
        spark: the session.
        lake: the lake directory: the bookkeeping tables' home, and the warehouse of the default catalog.
        catalog: a Spark catalog the session already has, for the lake tables; None for a Hadoop catalog at
            ``lake`` (registered in the session under ``cdclake_<hash of lake>``).
    """

    TABLE_FORMAT: str = "iceberg"
    COMPACT_EVERY: int = 50
    """A table's data files are rewritten, deletes applied, after a MERGE once it has this many commits since its
    last rewrite on average (:meth:`compact_after`), counted on its snapshots by any writer and run (the count Delta's
    auto compaction waits for, ``spark.databricks.delta.autoCompact.minNumFiles``)."""

    def __init__(
        self,
        spark: SparkSession,
        lake: str,
        catalog: str | None = None,
        routes: TableRoutes | None = None,
        table_properties: PerTable[dict[str, str]] | None = None,
        partition_by: PerTable[Partitioning] | None = None,
    ) -> None:
        super().__init__(
            spark,
            lake,
            deletion_vectors="never",
            routes=routes,
            table_properties=table_properties,
            partition_by=partition_by,
        )
        if catalog is None:
            catalog = "cdclake_" + hashlib.sha1(self.lake.encode("utf-8")).hexdigest()[:12]
            prefix = f"spark.sql.catalog.{catalog}"
            spark.conf.set(prefix, "org.apache.iceberg.spark.SparkCatalog")
            spark.conf.set(f"{prefix}.type", "hadoop")
            spark.conf.set(f"{prefix}.warehouse", self.lake)
        elif spark.conf.get(f"spark.sql.catalog.{catalog}", None) is None:
            raise ConfigError(
                "iceberg_catalog",
                f"the Spark session has no catalog {catalog!r}",
                f"configure it (spark.sql.catalog.{catalog}=org.apache.iceberg.spark.SparkCatalog and its settings, "
                "e.g. under `spark:` or with spark-submit --conf), or leave iceberg_catalog out for a catalog at "
                "the lake",
            )
        self.catalog = catalog
        # (table path, marker app id) -> the newest batch id that the table's snapshots record for it.
        self._committed: dict[tuple[str, str], int | None] = {}
        # The marker of the enclosing idempotent() block, which the batch's concurrent MERGEs share.
        self._marker: Txn | None = None
        # Table path -> (a snapshot id, the commits from the table's last rewrite up to that snapshot): where the
        # previous count stopped, so that the next one walks only the snapshots added since.
        self._since_rewrite: dict[str, tuple[int, int]] = {}

    # ---------------------------------------------------------------------------------------------------------
    # Names

    # A table is known by its path, ``<lake>/<namespace>/<table>`` (DeltaSink.table_path: its location in the default
    # catalog), as everywhere in the pipeline; its catalog name has the same two safe names.

    def _names(self, path: str) -> tuple[str, str]:
        namespace, table = path.removeprefix(self.lake + "/").split("/")
        return namespace, table

    def _namespace(self, database: str | None, schema: str | None, table: str) -> str:
        return f"{quote(self.catalog)}.{quote(self.lake_names(database, schema, table)[0])}"

    def identifier(self, database: str | None, schema: str | None, table: str) -> str:
        """The table's quoted Spark SQL name: ``catalog.namespace.table``."""
        return self._identifier_of(self.table_path(database, schema, table))

    def _identifier_of(self, path: str) -> str:
        namespace, table = self._names(path)
        return f"{quote(self.catalog)}.{quote(namespace)}.{quote(table)}"

    # ---------------------------------------------------------------------------------------------------------
    # Exactly once

    @contextmanager
    def idempotent(self, txn: Txn | None) -> Iterator[None]:
        """Marks the lake-table commits inside the block with ``txn``; one already recorded is skipped."""
        if txn is None:
            yield
            return
        previous, self._marker = self._marker, txn
        # One marker at a time: a commit inside a nested block must not also carry the outer block's marker, or
        # the outer block's own commit to that table would later be taken as done.
        if previous is not None:
            self.spark.conf.unset(_marker_setting(previous))
        self.spark.conf.set(_marker_setting(txn), str(txn.version))
        try:
            yield
        finally:
            self.spark.conf.unset(_marker_setting(txn))
            self._marker = previous
            if previous is not None:
                self.spark.conf.set(_marker_setting(previous), str(previous.version))

    def _done(self, path: str, txn: Txn | None) -> bool:
        """Whether the table at ``path`` already has a commit of ``txn`` or of a later batch."""
        if txn is None:
            return False
        key = (path, txn.app_id)
        if key not in self._committed:
            summary = F.col("summary")[MARKER_PREFIX + txn.app_id].cast("bigint")
            row = self.spark.table(f"{self._identifier_of(path)}.snapshots").select(F.max(summary)).first()
            self._committed[key] = None if row is None else row[0]
        recorded = self._committed[key]
        return recorded is not None and recorded >= txn.version

    @contextmanager
    def _commit(self, path: str, txn: Txn | None) -> Iterator[None]:
        """One commit to the table at ``path`` marked with ``txn`` (the enclosing block's marker, or its own
        block); records it, or forgets what was known of the table if it failed (it may have committed)."""
        try:
            if txn is None or txn == self._marker:
                yield
            else:
                with self.idempotent(txn):
                    yield
        except BaseException:
            if txn is not None:
                self._committed.pop((path, txn.app_id), None)
            raise
        if txn is not None:
            self._committed[(path, txn.app_id)] = txn.version

    def _committing_once(self, path: str, txn: Txn | None, operation: str, write: Callable[[], None]) -> None:
        """``write``, one commit to the table at ``path`` marked with ``txn``, skipped when the table has that commit
        already; again after a concurrent commit conflicts with it (a rewrite_data_files, a DELETE by hand): each
        attempt looks first whether its commit is there, and ``write`` reads the table anew."""

        def attempt() -> None:
            if self._done(path, txn):
                return
            with self._commit(path, txn):
                write()

        self._committing(path, operation, attempt)

    # ---------------------------------------------------------------------------------------------------------
    # Tables

    def _user_table_exists(self, path: str) -> bool:
        return bool(self.spark.catalog.tableExists(self._identifier_of(path)))

    def ensure_table(self, plan: TablePlan, *, defer_creation: bool = False) -> list[tuple[str, str]]:
        """Creates the table or adds the plan's new columns; returns the table's (name, type) user columns.

        Args:
            defer_creation: a table that does not exist yet is not created here: its first :meth:`merge` creates it
                with its rows, in one commit (:meth:`awaits_creation`). The columns returned are then the plan's.
        """
        path = self.table_path(plan.database, plan.schema, plan.table)
        cached = self._columns.get(path)
        if (
            cached is not None
            and path in self._source_properties_checked
            and {n.lower() for n, _ in plan.columns} <= {n.lower() for n, _ in cached}
        ):
            return cached
        self._awaiting_creation.discard(path)
        if self._user_table_exists(path):
            if path not in self._source_properties_checked:
                self._reconcile_properties(path, plan, self._properties(path))
                stored_names = {f.name.lower() for f in self.spark.table(self._identifier_of(path)).schema.fields}
                if lacking := metadata_columns_to_add(path, stored_names):
                    self._add_columns(path, lacking)
        else:
            if defer_creation:
                return self._leave_to_first_write(path, plan)
            self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {self._namespace(plan.database, plan.schema, plan.table)}")
            # Identifiers are validated by the decoders (or cdclake.ddl) and quoted here.
            listed = _column_list([*plan.columns, *METADATA_COLUMNS])
            props = ", ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in self._creation_properties(plan).items())
            identifier = self._identifier_of(path)
            partitioning = self.creation_partitioning(plan, plan.columns)
            partitioned = (
                f" PARTITIONED BY ({', '.join(field.sql(quote) for field in partitioning)})" if partitioning else ""
            )
            self.spark.sql(
                f"CREATE TABLE IF NOT EXISTS {identifier} ({listed}) USING iceberg{partitioned} TBLPROPERTIES ({props})"
            )
            self._recorded_ordering[path] = ordering_of(plan)
        self._source_properties_checked.add(path)
        self._columns.pop(path, None)
        stored = self.columns(plan.database, plan.schema, plan.table) or []
        existing = {name.lower() for name, _ in stored}
        missing = [(name, t) for name, t in plan.columns if name.lower() not in existing]
        if missing:
            self._add_columns(path, missing)
            stored = self.columns(plan.database, plan.schema, plan.table) or []
        return stored

    def _creation_properties(self, plan: TablePlan, partitioning: Partitioning = ()) -> dict[str, str]:
        """The table properties of a lake table cdclake creates for ``plan`` (whatever its partitioning)."""
        return {
            **TABLE_PROPERTIES,
            **self.user_properties(plan),
            **source_properties(plan),
            SEQUENCE_BY_PROPERTY: ordering_of(plan),
        }

    def _known_properties(self, table_properties: PerTable[dict[str, str]]) -> PerTable[dict[str, str]]:
        """Iceberg takes any property; it checks the values of those it uses when it uses them."""
        return table_properties

    def _set_properties(self, path: str, properties: Mapping[str, str]) -> None:
        listed = ", ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in properties.items())
        self.spark.sql(f"ALTER TABLE {self._identifier_of(path)} SET TBLPROPERTIES ({listed})")

    def create_with_rows(
        self, path: str, rows: DataFrame, properties: Mapping[str, str], partitioning: Partitioning = ()
    ) -> bool:
        """Creates the table at ``path`` holding ``rows``, with ``properties`` and ``partitioning`` (``CREATE TABLE
        ... AS SELECT``, atomic in Iceberg's catalogs): one snapshot, marked with the enclosing :meth:`idempotent`
        block's marker. False, having changed nothing, when the table exists by then (another writer created it)."""
        namespace, _ = self._names(path)
        self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote(self.catalog)}.{quote(namespace)}")
        writer = in_session(rows, self.spark).writeTo(self._identifier_of(path)).using("iceberg")
        for name, value in properties.items():
            writer = writer.tableProperty(name, value)
        try:
            with self._commit(path, self._marker):
                partitioned(writer, partitioning).create()
        except (Py4JJavaError, CapturedException):
            if not self._user_table_exists(path):
                raise
            log.info("%s was created by another writer meanwhile: its rows go in by a MERGE", path)
            return False
        return True

    def columns(self, database: str | None, schema: str | None, table: str) -> list[tuple[str, str]] | None:
        """The (name, type) user columns of a lake table, or ``None`` if it does not exist."""
        path = self.table_path(database, schema, table)
        if path in self._columns:
            return self._columns[path]
        if not self._user_table_exists(path):
            return None
        return self._remember_columns(path, self.spark.table(self._identifier_of(path)).schema.fields)

    def _add_columns(self, path: str, columns: Sequence[tuple[str, str]]) -> None:
        stored = {f.name.lower() for f in self.spark.table(self._identifier_of(path)).schema.fields}
        new = [(name, t) for name, t in columns if name.lower() not in stored]
        if new:
            self.spark.sql(f"ALTER TABLE {self._identifier_of(path)} ADD COLUMNS ({_column_list(new)})")
        self._columns.pop(path, None)

    def widen_path_in_place(
        self, path: str, changes: Mapping[ColumnPath, str], *, like: str | None = None
    ) -> dict[ColumnPath, str]:
        """Iceberg's own type promotions change the table's schema only, and every Iceberg reader reads the values of
        older files as the new type (spec, "Schema Evolution": int -> long, float -> double, decimal(P,S) ->
        decimal(P',S) with P' > P). The other widenings (an integer into a decimal, a decimal's scale) are left to
        the rewrite. Every Iceberg table promotes so: ``like`` changes nothing."""
        if not changes:
            return {}
        current = self.spark.table(self._identifier_of(path)).schema

        def promoted(column: ColumnPath, wanted: str) -> bool:
            return _promotes(type_at(current, column).simpleString(), _parse_datatype_string(wanted).simpleString())

        promotions = {column: wanted for column, wanted in changes.items() if promoted(column, wanted)}
        return self._alter_column_types(self._identifier_of(path), promotions)

    @staticmethod
    def stored_type(spark_type: str) -> str:
        """Iceberg has no 8- or 16-bit integers: Spark's Iceberg catalog stores tinyint and smallint as int."""
        return _STORED_TYPES.get(spark_type, spark_type)

    def column_has_values(self, database: str | None, schema: str | None, table: str, column: str) -> bool:
        frame = self.read(database, table, schema)
        return not frame.where(F.col(quote(column)).isNotNull()).isEmpty()

    def _properties(self, path: str) -> dict[str, str]:
        """The table properties of the Iceberg table at ``path``."""
        rows = self.spark.sql(f"SHOW TBLPROPERTIES {self._identifier_of(path)}").collect()
        return {row["key"]: row["value"] for row in rows}

    def check_constraints(self, database: str | None, schema: str | None, table: str) -> dict[str, str]:
        """Iceberg tables have no CHECK constraints; their NOT NULL (required) columns are checked as conditions
        (:func:`~cdclake.constraints.declared_checks`), as the sink last read the table's schema."""
        return dict(self._declared_checks.get(self.table_path(database, schema, table), {}))

    def key_columns(self, database: str | None, schema: str | None, table: str) -> list[str]:
        path = self.table_path(database, schema, table)
        recorded = self._properties(path).get(KEY_COLUMNS_PROPERTY, "")
        return [k for k in recorded.split(",") if k]

    def recorded_key_columns(self, database: str | None, schema: str | None, table: str) -> list[str] | None:
        path = self.table_path(database, schema, table)
        if not self._user_table_exists(path):
            return None
        return self.key_columns(database, schema, table) or None

    def rewrite(
        self,
        database: str | None,
        schema: str | None,
        table: str,
        columns: Sequence[tuple[str, Column]],
        txn: Txn | None,
        key_columns: Sequence[str] | None = None,
        renamed: Mapping[str, str] | None = None,
    ) -> None:
        """Replaces the table with new user columns (``name``, expression over the current row), keeping cdclake's
        columns, the table's properties and its partitioning (as DeltaSink.rewrite does): one snapshot, as Delta's
        rewrite is one commit."""
        path = self.table_path(database, schema, table)
        partitioning = on_columns(self._partitioning(path), [name for name, _ in columns], renamed)
        keys = None
        if key_columns is not None:
            names = {name.lower() for name, _ in columns}
            keys = ",".join(k for k in key_columns if k.lower() in names)
        # Read anew on every attempt: after a conflict, the rows are the other writer's.
        self._committing_once(
            path,
            txn,
            "rewrite",
            lambda: self._replace(path, rewritten_rows(self.read_path(path), columns), keys, partitioning),
        )
        self._columns.pop(path, None)

    def _replace(
        self, path: str, rows: DataFrame, key_columns: str | None = None, partitioning: Partitioning | None = None
    ) -> None:
        """Replaces the table at ``path`` with ``rows`` (their schema), keeping its properties (``cdclake.keyColumns``
        set to ``key_columns`` if given) and, unless ``partitioning`` is given, the partition fields of its columns
        that ``rows`` still have: one snapshot. ``rows`` may read the table itself: Iceberg reads the snapshot that
        is current when the write plans, and the replace's commit does not change it."""
        if partitioning is None:
            partitioning = on_columns(self._partitioning(path), rows.columns)
        partitioning = self._fitting(path, partitioning, rows.schema)
        properties = {
            k: v for k, v in self._properties(path).items() if k in TABLE_PROPERTIES or k.startswith(_KEPT_PROPERTIES)
        }
        if key_columns is not None:
            properties[KEY_COLUMNS_PROPERTY] = key_columns
        writer = rows.writeTo(self._identifier_of(path)).using("iceberg")
        for name, value in properties.items():
            writer = writer.tableProperty(name, value)
        partitioned(writer, partitioning).createOrReplace()

    def copy_rows(self, source: Identity, target: Identity, txn: Txn | None) -> None:
        """Replaces the rows of ``target`` with those of ``source`` (a renamed table), once per ``txn``."""
        target_path = self.table_path(*target)
        self._committing_once(
            target_path,
            txn,
            "copy",
            lambda: (
                self.in_recorded_order(self.read(source[0], source[2], source[1]), source, target)
                .writeTo(self._identifier_of(target_path))
                .overwrite(F.lit(True))
            ),
        )
        self._columns.pop(target_path, None)

    def clear(self, plan: TablePlan, txn: Txn | None) -> None:
        """Deletes every row written before ``plan.truncate_order`` and remembers it (see DeltaSink.clear)."""
        if self._user_table_exists(self.table_path(plan.database, plan.schema, plan.table)):
            self.truncate(plan, txn)
        self._remember_cleared(plan, txn)

    def truncate(self, plan: TablePlan, txn: Txn | None) -> None:
        """Deletes every row written before the plan's TRUNCATE."""
        assert plan.truncate_order is not None
        path = self.table_path(plan.database, plan.schema, plan.table)
        marker = None if txn is None else Txn(f"{txn.app_id}/truncate", txn.version)
        position = POSITION_COLUMN
        if self.rows_ordered_by_column(plan):  # the log part of each row's order (apply.log_order), in SQL
            position = f"substring_index({POSITION_COLUMN}, {sql_string(apply.SEQUENCE_SEPARATOR)}, -1)"
        condition = f"{position} < {sql_string(plan.truncate_order)}"
        self._committing_once(path, marker, "DELETE", lambda: self._execute_delete(path, condition))

    def _execute_delete(self, path: str, condition: str) -> None:
        """``DELETE FROM`` the table at ``path`` ``WHERE condition`` (SQL text built by this sink): one commit."""
        self.spark.sql(f"DELETE FROM {self._identifier_of(path)} WHERE {condition}")

    def merge(self, plan: TablePlan, table_columns: Sequence[tuple[str, str]], changes: DataFrame) -> None:
        """One ``MERGE INTO`` of the folded, gated changes of one table (see DeltaSink.merge); inside
        :meth:`idempotent`, skipped when the table already has the batch's commit."""
        path = self.table_path(plan.database, plan.schema, plan.table)
        statement = merge_statement(plan, table_columns, changes, self._shuffle_partitions(), path)
        if self._created_by_first_write(path, plan, table_columns, statement):
            return
        self.merge_rows(path, statement)
        self.merged(path)

    def merge_rows(
        self, path: str, statement: MergeStatement, matched_on: Column | None = None, *, whole: bool = False
    ) -> None:
        """Executes ``statement`` as a ``MERGE INTO`` of the table at ``path``, one commit marked with the enclosing
        :meth:`idempotent` block's marker; skipped when the table already has that commit. ``matched_on`` is not
        supported (SQL text only); ``whole`` is ignored (an Iceberg MERGE is one job already, merge-on-read)."""
        if matched_on is not None:
            raise ValueError("IcebergSink.merge_rows takes the statement's own condition only")
        self._committing_once(path, self._marker, "MERGE", lambda: self._execute_merge(path, statement, None))

    @staticmethod
    def _conflict_name(error: Exception, causes: Sequence[Any]) -> str | None:
        """Iceberg's refusal of a commit that conflicts with a concurrent one (its validation of the files the
        operation read, or a commit that failed after Iceberg's own retries), by the exception's class name."""
        for cause in causes:
            name = str(cause.getClass().getName())
            message = str(cause.getMessage() or "")
            if name == "org.apache.iceberg.exceptions.CommitFailedException" or (
                name == "org.apache.iceberg.exceptions.ValidationException" and _CONFLICT_MESSAGE.search(message)
            ):
                return str(cause.getClass().getSimpleName())
        return None

    def _execute_merge(self, path: str, statement: MergeStatement, matched_on: Column | None) -> None:
        """The ``MERGE INTO`` of ``statement`` (its own condition; ``merge_rows`` refuses ``matched_on``): one
        commit, marked with the enclosing :meth:`idempotent` block's marker."""
        # A view per MERGE (the batch's MERGEs run concurrently), in this sink's session: its settings hold the
        # batch's marker, and a streaming batch's frames belong to the query's own copy of the session.
        view = f"cdclake_merge_source_{uuid.uuid4().hex}"
        in_session(statement.source, self.spark).createOrReplaceTempView(view)
        clauses = []
        if statement.delete_when is not None:
            clauses.append(f"WHEN MATCHED AND {statement.delete_when} THEN DELETE")
        if statement.update_when is not None:
            update = ", ".join(f"{column} = {value}" for column, value in statement.update_set.items())
            clauses.append(f"WHEN MATCHED AND {statement.update_when} THEN UPDATE SET {update}")
        insert_when = "" if statement.insert_when is None else f" AND {statement.insert_when}"
        insert_columns = ", ".join(statement.insert_values)
        insert_values = ", ".join(statement.insert_values.values())
        clauses.append(f"WHEN NOT MATCHED{insert_when} THEN INSERT ({insert_columns}) VALUES ({insert_values})")
        try:
            self.spark.sql(
                f"MERGE INTO {self._identifier_of(path)} t USING {view} s ON {statement.matched_on} "
                + " ".join(clauses)
            )
        finally:
            self.spark.catalog.dropTempView(view)

    def merged(self, path: str) -> None:
        """After a MERGE into the table at ``path``: rewrites its data files with their deletes applied once it has
        :meth:`compact_after` commits since its last rewrite.

        A count or a rewrite that fails is logged, not raised: the MERGE has committed, and failing the batch for
        its upkeep would only run it again (the count still stands, so the next MERGE tries again)."""
        try:
            if self._commits_since_rewrite(path) >= self.compact_after(path):
                self.compact(path)
        except (Py4JError, CapturedException) as exc:
            log.warning("compaction of %s after its MERGE failed, left for a later MERGE: %s", path, exc)

    @classmethod
    def compact_after(cls, path: str) -> int:
        """How many commits since its last rewrite the table at ``path`` waits for: :attr:`COMPACT_EVERY` on average,
        give or take a quarter, set by the path. Tables written together would otherwise all reach the count in
        the same batch and be compacted one after another there; each table's own count keeps them apart, and
        stays the same in every run."""
        spread = max(1, cls.COMPACT_EVERY // 2)
        return cls.COMPACT_EVERY - spread // 2 + zlib.crc32(path.encode("utf-8")) % spread

    def _iceberg_table(self, path: str) -> Any:
        """The Iceberg ``Table`` (JVM object) of the lake table at ``path``, as the session's catalog has it."""
        jvm = self.spark._jvm
        assert jvm is not None
        return jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            self.spark._jsparkSession, self._identifier_of(path)
        )

    @staticmethod
    def _fitting(path: str, partitioning: Partitioning, schema: StructType) -> Partitioning:
        """The fields of ``partitioning`` whose transform takes their column's type in ``schema``; the others are left
        out with a warning (a column without values retyped to a type its transform does not take, e.g. ``days()`` of
        a column that became a string: Iceberg would refuse the whole rewrite)."""
        types = {f.name.lower(): f.dataType.simpleString() for f in schema.fields}
        fit, problems = fitting(partitioning, types, "iceberg")
        for problem in problems:
            log.warning("%s: a partition field is left out: %s", path, problem)
        return fit

    def _computed_columns(self, path: str) -> frozenset[str]:
        return frozenset()  # Iceberg tables compute no column values

    def rewrite_loses(self, database: str | None, schema: str | None, table: str) -> list[str]:
        # Spark makes every column of a replacing table optional (it writes the rows' schema as nullable), so a
        # required (NOT NULL) column of a table made by hand would lose it; Iceberg has no computed columns.
        meta = {name for name, _ in METADATA_COLUMNS}
        fields = self.read_path(self.table_path(database, schema, table)).schema.fields
        return [f"NOT NULL of column {f.name}" for f in fields if not f.nullable and f.name not in meta]

    def _names_folders_at_creation(self, columns: Sequence[tuple[str, str]]) -> bool:
        return True

    def _folder_partitioning(self, path: str) -> Partitioning:
        # The table as the session's catalog holds it (Iceberg's catalog keeps loaded tables): no file list is built,
        # as Delta's DESCRIBE DETAIL builds one. Iceberg names a partition's folder after its values in every table.
        return self._partitioning(path)

    def partition_folder_bytes(self, column: str, value: Column) -> Column:
        """The length in bytes of the folder name ``column=value`` of a partition, as Iceberg writes it
        (``PartitionSpec.partitionToPath``: ``URLEncoder`` in UTF-8): letters, digits, ``.-*_`` and a space (``+``)
        take one byte, every other byte of the value's UTF-8 three (``%XX``)."""
        name = len(column.encode("utf-8")) * 3 - len(re.sub(_URL_ENCODER_CHANGED, "", column)) * 2
        kept = F.octet_length(F.regexp_replace(value, _URL_ENCODER_CHANGED, ""))
        return F.lit(name + 1) + F.octet_length(value) * 3 - kept * 2

    def _partitioning(self, path: str) -> Partitioning:
        """The partition fields of the Iceberg table at ``path`` (its current spec). A field cdclake does not write
        (``truncate``, ``void``: a spec changed by hand) is left out with a warning: a rewrite loses it."""
        table = self._iceberg_table(path)
        schema, fields = table.schema(), []
        for spec_field in table.spec().fields():
            transform, column = (
                str(spec_field.transform().toString()),
                str(schema.findColumnName(spec_field.sourceId())),
            )
            field = from_iceberg(transform, column)
            if field is None:
                log.warning(
                    "%s: partition field %s(%s) is not one cdclake writes; a rewrite leaves it out",
                    path,
                    transform,
                    column,
                )
            else:
                fields.append(field)
        return tuple(fields)

    def _commits_since_rewrite(self, path: str) -> int:
        """The commits of the table at ``path`` after its newest ``replace`` snapshot (a ``rewrite_data_files``, by
        this sink or anyone), or after this sink's last compaction of it, counted up to :meth:`compact_after`.

        Read from the table's metadata in the driver (no Spark job): the parent chain of its current snapshot, walked
        back only to where the previous count stopped. A chain cut short by expired snapshots counts what is left.
        """
        table = self._iceberg_table(path)
        snapshot = table.currentSnapshot()
        current = None if snapshot is None else int(snapshot.snapshotId())
        known_id, known_count = self._since_rewrite.get(path, (None, 0))
        count, enough = 0, self.compact_after(path)
        while snapshot is not None and count < enough:
            if int(snapshot.snapshotId()) == known_id:
                count += known_count
                break
            if str(snapshot.operation()) == "replace":
                break
            count += 1
            parent = snapshot.parentId()
            snapshot = None if parent is None else table.snapshot(parent)
        count = min(count, enough)
        if current is not None:
            self._since_rewrite[path] = (current, count)
        return count

    def compact(self, path: str) -> None:
        """Rewrites the table's small files and the files that have deletes (Iceberg's ``rewrite_data_files``)."""
        # Qualified by the catalog: a name without one is first looked up as <catalog>.<table> (and logged as a
        # missing catalog). The parts are safe names (letters, digits, _).
        name = ".".join((self.catalog, *self._names(path)))
        self.spark.sql(
            f"CALL {quote(self.catalog)}.system.rewrite_data_files(table => {sql_string(name)}, "
            "options => map('min-input-files', '2', 'delete-file-threshold', '1', 'remove-dangling-deletes', 'true'))"
        ).collect()
        # The count starts again here even when there was nothing to rewrite (no new snapshot), or the next MERGE
        # would try again, and each MERGE after it.
        snapshot = self._iceberg_table(path).currentSnapshot()
        if snapshot is not None:
            self._since_rewrite[path] = (int(snapshot.snapshotId()), 0)

    # Deletion vectors and key ranges are Delta's: a merge-on-read table needs neither.
    def prepare_deletion_vectors(self, path: str) -> None:
        del path

    def key_ranges_pay(self, path: str) -> bool:
        del path
        return False

    # ---------------------------------------------------------------------------------------------------------
    # History tables (cdclake.sinks.history)

    def history_path_of(self, kind: str, table_path: str) -> str:
        """``<lake>/<namespace>/_<kind>_<table>``: table ``_<kind>_<table>`` beside the lake table, in its namespace.
        One level of namespace, as every catalog has (Glue and Hive have no nested ones); no source table's name
        starts with ``_`` (:func:`~cdclake.sinks.delta.safe_name`)."""
        namespace, lake_table = self._names(table_path)
        return f"{self.lake}/{namespace}/{fitted_segment(f'_{kind}_{lake_table}')}"

    def table_schema(self, path: str) -> StructType | None:
        return self.spark.table(self._identifier_of(path)).schema if self._user_table_exists(path) else None

    def read_path(self, path: str) -> DataFrame:
        return self.spark.table(self._identifier_of(path))

    def create_history_table(
        self, path: str, schema: StructType, properties: Mapping[str, str], statistics: Sequence[str]
    ) -> None:
        """Creates the table at ``path`` unless it exists."""
        namespace, _ = self._names(path)
        self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote(self.catalog)}.{quote(namespace)}")
        # The columns go as a schema, not as SQL text: struct field names are not quoted in a type's text.
        writer = self.spark.createDataFrame([], schema).writeTo(self._identifier_of(path)).using("iceberg")
        for name, value in self.history_table_properties(properties, statistics).items():
            writer = writer.tableProperty(name, value)
        try:
            writer.create()
        except AnalysisException as exc:  # a concurrent run created it first
            if "already exists" not in str(exc).lower():
                raise

    def history_table_properties(self, properties: Mapping[str, str], statistics: Sequence[str]) -> dict[str, str]:
        """The table properties of a history table (``statistics`` is Delta's: Iceberg keeps column metrics without
        being told)."""
        del statistics
        return {**TABLE_PROPERTIES, **properties}

    def allow_columns(self, path: str, schema: StructType) -> None:
        """Nothing to do: Iceberg tables keep any column name (they name columns by field id), and any of cdclake's
        types without a table feature."""

    def add_history_columns(self, path: str, listed: str) -> None:
        self.spark.sql(f"ALTER TABLE {self._identifier_of(path)} ADD COLUMNS ({listed})")

    def replace_rows(self, path: str, rows: DataFrame) -> None:
        self._replace(path, rows)

    # ---------------------------------------------------------------------------------------------------------
    # Maintenance (cdclake.maintain)

    def expire(self, path: str, retain_hours: int) -> int:
        """Expires the snapshots of the Iceberg table at ``path`` older than ``retain_hours`` (the current one always
        stays, so the last batch's marker does), deleting the files only they referenced, then the files under the
        table that no snapshot references and that are that old, and at least a day old (a killed write's); returns
        how many files went."""
        name = sql_string(".".join((self.catalog, *self._names(path))))
        procedures = f"{quote(self.catalog)}.system"
        expired = self.spark.sql(
            f"CALL {procedures}.expire_snapshots(table => {name}, older_than => {self._hours_ago(retain_hours)}, "
            "retain_last => 1)"
        ).first()
        assert expired is not None
        removed = sum(int(count or 0) for count in expired)  # data, delete, manifest and statistics files
        # The procedure refuses orphans younger than a day (they may belong to a write still going on).
        older_than = self._hours_ago(max(retain_hours, 24))
        orphans = self.spark.sql(f"CALL {procedures}.remove_orphan_files(table => {name}, older_than => {older_than})")
        return removed + orphans.count()

    def _hours_ago(self, hours: int) -> str:
        """A TIMESTAMP literal ``hours`` before now, in the session's time zone (which reads it)."""
        zone = ZoneInfo(self.spark.conf.get("spark.sql.session.timeZone") or "UTC")
        moment = (datetime.now(UTC) - timedelta(hours=hours)).astimezone(zone).replace(tzinfo=None)
        return f"TIMESTAMP {sql_string(moment.isoformat(sep=' '))}"

    # ---------------------------------------------------------------------------------------------------------
    # Reading back

    def read(self, database: str | None, table: str, schema: str | None = None) -> DataFrame:
        return self.spark.table(self.identifier(database, schema, table))

    def row_count(self, path: str) -> int:
        return self.spark.table(self._identifier_of(path)).count()
