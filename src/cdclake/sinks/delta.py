"""Delta Lake sink: the only module that knows Delta.

Layout under the lake directory::

    <lake>/<database>/<table>          one Delta table per source table (names sanitised, see safe_name)
    <lake>/_cdclake/tombstones         deleted keys and truncated tables, with their order (gate late events)
    <lake>/_cdclake/progress           one row per batch and table / Kafka partition: counts, positions, times
    <lake>/_cdclake/dead_letters       messages that could not be decoded or applied, raw bytes and reason
    <lake>/_cdclake/schema_changes     DDL events as received
    <lake>/_cdclake/pending_transactions  raw messages of open source transactions (transaction-consistent mode)

Exactly once: every commit of a batch carries a marker (:class:`Txn`: the pipeline's app id and the batch id), so a
batch re-run after a crash skips the commits that already happened. Lake tables' commits carry it as Delta's
idempotent-writer marker (``txnAppId`` / ``txnVersion``); bookkeeping appends carry it in their rows
(:meth:`DeltaSink.append` says why). On top of that, row changes are gated by order, so re-applying a change is a
no-op.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import statistics
import sys
import threading
import time
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar, get_args

from delta import exceptions as delta_exceptions
from delta.tables import DeltaTable
from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.errors import AnalysisException
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import Column, DataFrame, DataFrameWriter, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    MapType,
    StructField,
    StructType,
    TimestampNTZType,
    _parse_datatype_string,
)

from cdclake import apply, model
from cdclake.apply import TablePlan
from cdclake.config import absolute_location
from cdclake.constraints import declared_checks
from cdclake.exceptions import ConfigError, ConstraintViolationError
from cdclake.model import quote
from cdclake.sinks._tombstone_bounds import TombstoneBounds, commit_file
from cdclake.sinks.partitioning import (
    PartitionField,
    Partitioning,
    described,
    fitting,
    missing_columns,
    on_columns,
    partitioned,
)
from cdclake.spark import cloned_session, in_session, jvm_causes, local_frame, session_settings
from cdclake.tables import PerTable, TableRoutes

log = logging.getLogger(__name__)

TYPE_WIDENING_PROPERTY: Final = "delta.enableTypeWidening"
"""A Delta table property: with it, a column is widened in place (:meth:`DeltaSink.widen_in_place`)."""

POSITION_COLUMN: Final = "_cdc_position"
"""Order of the change that wrote the row (see cdclake.apply); later changes must have an order >= it."""
EVENT_TIME_COLUMN: Final = "_cdc_event_time"
"""Source time of the change that wrote the row."""
OP_COLUMN: Final = "_cdc_op"
"""Kind of the last change applied to the row (always UPSERT for live rows)."""
METADATA_COLUMNS: Final = (
    (POSITION_COLUMN, "string"),
    (EVENT_TIME_COLUMN, "timestamp"),
    (OP_COLUMN, "string"),
)

TABLE_PROPERTIES: Final = {
    # The compaction policy. Every micro-batch adds small files (a MERGE rewrites only the files it touches, an append
    # adds one per task), and every later MERGE or read pays for each file. Delta's auto compaction bin-packs a
    # table's small files right after the commit that brings them to 50 (spark.databricks.delta.autoCompact.*).
    "delta.autoOptimize.autoCompact": "true",
    # Delta's optimized write: a commit's rows are shuffled once more and written as one file per 512 MiB
    # (spark.databricks.delta.optimizeWrite.binSize) instead of one per shuffle partition. Fewer small files to
    # compact, and a new table's first commit no longer gets compacted at once: auto compaction compacts every table
    # on its first file-adding commit in a process, and that was an OPTIMIZE rewriting the creation's files into one.
    # Measured on 2 cores, batches after the first, time with / time without (python -m benchmarks.ab, variant
    # no-optimize-write as A): 10 tables 0.96, 1 table 0.89, 100 tables 0.85, 1 table in 250,000-event batches 0.86.
    # python -m benchmarks.first_write, a new table created with its rows: 1.73 -> 1.06 s, its next MERGE
    # 1.64 -> 0.71 s; created empty and then MERGEd into: 2.99 -> 2.20 s.
    "delta.autoOptimize.optimizeWrite": "true",
}
"""Properties of every table cdclake creates (lake tables, history tables, bookkeeping tables)."""

MARKER_APP_COLUMN: Final = "_cdc_txn_app_id"
MARKER_VERSION_COLUMN: Final = "_cdc_txn_version"
MARKER_COLUMNS: Final = (MARKER_APP_COLUMN, MARKER_VERSION_COLUMN)
"""Columns of the rows of a bookkeeping append: the commit marker (:class:`Txn`) of the append that wrote them
(:meth:`DeltaSink.append`); null in rows appended without one. :meth:`DeltaSink.read_system` leaves them out."""

AUTO_COMPACT_MODIFIED_PARTITIONS_ONLY: Final = "spark.databricks.delta.autoCompact.modifiedPartitionsOnly.enabled"
"""Delta's auto compaction mode: by default (true) it compacts every table on the first commit that adds files to it
in the process, then again when the process has seen it gain ``minNumFiles`` small files; set to false, only the
latter (AGENTS.md: Delta 4.4's auto compaction)."""

TXN_APP_ID: Final = "spark.databricks.delta.write.txnAppId"
TXN_VERSION: Final = "spark.databricks.delta.write.txnVersion"
"""The session settings of Delta's idempotent-writer marker (:meth:`DeltaSink.idempotent`)."""


@dataclass
class _AppendedVersions:
    """App id -> newest marker version among a bookkeeping table's appends of version ``since`` or later (an app id
    not listed has none of them)."""

    since: int
    newest: dict[str, int]


DeletionVectors = Literal["auto", "always", "never"]
"""When lake and history tables use Delta deletion vectors (:class:`DeltaSink`): ``auto`` once their MERGEs rewrite
enough."""
DELETION_VECTOR_MODES: Final = get_args(DeletionVectors)
ENABLE_DELETION_VECTORS: Final = "delta.enableDeletionVectors"


_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
_FOLDER_ESCAPED: Final = re.compile("[\\x01-\\x1f\\x7f\"#%'*/:=?\\\\{\\[\\]^]")
"""The characters Spark's ``ExternalCatalogUtils.escapePathName`` writes as ``%XX`` in a partition folder's name (on
systems other than Windows); the pattern is read by Python and by Java alike."""


COLUMN_MAPPING_MODE: Final = "delta.columnMapping.mode"
_UNMAPPED_REFUSED: Final = re.compile(r"[ ,;{}()\n\t=]")
"""The characters a Delta table without column mapping refuses in a column name
(DELTA_INVALID_CHARACTERS_IN_COLUMN_NAMES: Parquet's old field-name rules). Sources have them: SQL Server's
``Order Date``, a MongoDB document's ``first name``, ``price(usd)``."""


def needs_column_mapping(schema: DataType | Iterable[str]) -> bool:
    """Whether a Delta table with these columns (a schema, nested fields included, or column names) needs column
    mapping: one of the names has a character :data:`_UNMAPPED_REFUSED` lists. cdclake creates such a table with
    ``delta.columnMapping.mode`` ``name`` (the table keeps the source's names; Parquet files get generated ones), and
    switches it on for an existing table when a column with such a name is added. Every other table is left without
    it: readers older than Delta 1.2 (reader version 2) cannot read a column-mapped table."""
    return any(_UNMAPPED_REFUSED.search(name) for name in _names_in(schema))


def _names_in(schema: DataType | Iterable[str]) -> Iterator[str]:
    if isinstance(schema, StructType):
        for field in schema.fields:
            yield field.name
            yield from _names_in(field.dataType)
    elif isinstance(schema, ArrayType):
        yield from _names_in(schema.elementType)
    elif isinstance(schema, MapType):
        yield from _names_in(schema.keyType)
        yield from _names_in(schema.valueType)
    elif not isinstance(schema, DataType):
        yield from schema


def column_mapped(properties: Mapping[str, str], schema: DataType | Iterable[str]) -> dict[str, str]:
    """``properties`` of a Delta table to be created with ``schema``, with column mapping when its names need it
    (:func:`needs_column_mapping`)."""
    return {**properties, COLUMN_MAPPING_MODE: "name"} if needs_column_mapping(schema) else dict(properties)


MAX_SEGMENT_BYTES: Final = 255
"""The longest file or folder name of the common file systems (ext4, XFS, APFS; HDFS by default,
``dfs.namenode.fs-limits.max-component-length``). A lake table's folder is named after its source table, and a
route (``ods.crm_{table}``) or an Iceberg history table (``_scd2_<table>``) adds to a name that may already be 255
characters long: past the limit, the table's creation failed the batch, and every restart failed on it again."""


def _name_digest(name: str) -> str:
    return hashlib.sha1(name.encode("utf-8")).hexdigest()[:8]


def fitted_segment(name: str) -> str:
    """``name`` as a path segment within :data:`MAX_SEGMENT_BYTES`: as it is when it fits, else its first 200
    characters and a short hash of the whole name, so two long names never share a table. Only names that no file
    system here could hold change, so no existing table moves."""
    if len(name.encode("utf-8")) <= MAX_SEGMENT_BYTES:
        return name
    return f"{name.encode('utf-8')[:200].decode('utf-8', 'ignore')}_{_name_digest(name)}"


def safe_name(name: str | None, default: str = "default") -> str:
    """A path segment made of letters, digits and ``_``. A name that had to change gets a short hash suffix, so
    two different source names never share a lake table (``a-b`` and ``a_b`` stay apart); so does one too long
    for a path segment (:func:`fitted_segment`)."""
    if not name:
        return default
    cleaned = _UNSAFE.sub("_", name)
    if cleaned == name and not name.startswith("_"):
        return fitted_segment(name)
    return f"{cleaned.strip('_')[:100] or 'x'}_{_name_digest(name)}"


def sql_string(text: str) -> str:
    """A Spark SQL string literal (backslash escapes, Spark's default parser mode)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


KEYLESS_STATS_COLUMNS: Final = 31


def _pruned_columns(columns: Sequence[tuple[str, str]], key_columns: Sequence[str]) -> list[str]:
    """The matched columns a MERGE prunes files by (statistics, :func:`_key_ranges`): the key columns, or a key-less
    table's first :data:`KEYLESS_STATS_COLUMNS` columns (it is matched on all of them)."""
    return list(key_columns) or [name for name, _ in columns][:KEYLESS_STATS_COLUMNS]


def _stats_columns(
    columns: Sequence[tuple[str, str]], key_columns: Sequence[str], partitioning: Partitioning = ()
) -> list[str]:
    """``delta.dataSkippingStatsColumns`` for MERGE file pruning: the :func:`_pruned_columns` that have min/max
    statistics, plus the position. Not the table's partition columns: Delta refuses them in the list
    (DELTA_COLUMN_DATA_SKIPPING_NOT_SUPPORTED_PARTITIONED_COLUMN), and prunes by their values anyway."""
    types = {name.lower(): spark_type for name, spark_type in columns}
    partition_columns = {field.column.lower() for field in partitioning}
    matched = [k for k in _pruned_columns(columns, key_columns) if k.lower() not in partition_columns]
    return [quote(k) for k in matched if _has_statistics(types.get(k.lower()))] + [POSITION_COLUMN]


def _has_statistics(spark_type: str | None) -> bool:
    """Whether Delta keeps min/max statistics for a column of this type (none for binary or boolean)."""
    return spark_type not in (None, "binary", "boolean")


def _unquoted(identifier: str) -> str:
    """The identifier that ``identifier`` names, quoted by :func:`quote` or not."""
    if len(identifier) > 1 and identifier.startswith("`") and identifier.endswith("`"):
        return identifier[1:-1].replace("``", "`")
    return identifier


@dataclass(frozen=True)
class Txn:
    """Idempotent-writer identity of one batch's commits."""

    app_id: str
    version: int


Item = TypeVar("Item")
Result = TypeVar("Result")


def in_turns(
    items: Iterable[Item], path_of: Callable[[Item], str], identity_of: Callable[[Item], str]
) -> list[list[Item]]:
    """``items`` (one commit each) in turns that write each table path at most once: turn ``k`` holds the ``k``-th
    item of every path, in the order of ``identity_of`` (unique per item), so that a re-run of the batch gives
    every item the turn, and so the commit marker (:func:`turn_marker`), that it had.

    A batch writes its tables concurrently, and two commits to one table at once conflict. Nearly always there is
    one turn; more only when source tables share a lake table (``<database>/<table>``: two schemas of one database
    with a table of the same name, such as PostgreSQL's ``public.orders`` and ``archive.orders``)."""
    turns: list[list[Item]] = []
    taken: dict[str, int] = {}
    for item in sorted(items, key=identity_of):
        path = path_of(item)
        turn = taken.get(path, 0)
        taken[path] = turn + 1
        if turn == len(turns):
            turns.append([])
        turns[turn].append(item)
    return turns


def turn_marker(txn: Txn | None, turn: int) -> Txn | None:
    """The commit marker of a batch's ``turn`` (see :func:`in_turns`): the batch's own for the first, a marker of
    its own for each later one, since Delta skips a commit whose marker the table has already recorded."""
    return txn if txn is None or turn == 0 else Txn(f"{txn.app_id}/turn{turn}", txn.version)


def concurrently(work: Callable[[Item], Result], items: Sequence[Item], threads: int) -> list[Result]:
    """``work`` of every item, ``threads`` at a time; the results in ``items`` order. An error is raised once every
    item has run (the others' commits stand; a re-run of the batch skips them by their markers)."""
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        futures = [pool.submit(work, item) for item in items]
    return [future.result() for future in futures]


_CONFLICTS: Final = (
    delta_exceptions.ConcurrentAppendException,
    delta_exceptions.ConcurrentDeleteDeleteException,
    delta_exceptions.ConcurrentDeleteReadException,
    delta_exceptions.ConcurrentTransactionException,
    delta_exceptions.ConcurrentWriteException,
    delta_exceptions.DeltaConcurrentModificationException,
    delta_exceptions.MetadataChangedException,
    delta_exceptions.ProtocolChangedException,
)


_ORDERED_LITERAL_TYPES: Final = frozenset({"tinyint", "smallint", "int", "bigint", "string", "date", "timestamp"})


def _has_ordered_literals(spark_type: str) -> bool:
    """Whether a key column of this type gets a range predicate (:func:`_key_ranges`): types with min/max statistics
    whose values come back from Spark exactly (no floating point: NaN and -0.0 do not order as literals)."""
    return spark_type in _ORDERED_LITERAL_TYPES or spark_type.startswith("decimal(")


def _key_ranges(source: DataFrame, keys: Sequence[tuple[str, int, str]]) -> list[Column]:
    """Target-only MERGE conditions: each matched column of the target (the key columns, or a key-less table's first
    columns) within the range of the source's values in it.

    Delta skips the files a MERGE reads by the conditions on the target alone (``getTargetOnlyPredicates``); the
    key match ``t.k <=> s.k`` is not one, so without these every MERGE reads every file of its table. With them, a
    batch of new and recently written keys (an auto-increment or time-ordered key) reads only the newest files,
    whatever the table's size. A target row outside the range matches no source row anyway: the MERGE's outcome is
    the same. The range comes from the typed source columns themselves (one aggregation over the batch's changes of
    the table), so literal and values compare exactly; a NULL key (``<=>`` matches NULL to NULL) keeps the target's
    NULL rows in. Only for tables large enough to gain from them (:meth:`DeltaSink.key_ranges_pay`).

    Args:
        source: the MERGE source, with the typed key columns ``_c<index>``.
        keys: (column name, index, Spark type) of the matched columns to range.
    """
    if not keys:
        return []
    aggregates: list[Column] = []
    for _, index, spark_type in keys:
        value = F.col(f"_c{index}")
        # Instants and days as epoch numbers: Python datetimes and dates go through the session's time zone and
        # java.sql.Date's Julian calendar before 1582, not Spark's proleptic Gregorian one.
        ordered = F.unix_micros(value) if spark_type == "timestamp" else value
        ordered = F.unix_date(value) if spark_type == "date" else ordered
        aggregates += [F.min(ordered), F.max(ordered), F.max(value.isNull())]
    bounds = source.agg(*aggregates).first()
    assert bounds is not None  # an aggregation without grouping has one row
    conditions = []
    for position, (name, _, spark_type) in enumerate(keys):
        low, high, has_null = bounds[3 * position : 3 * position + 3]
        target = F.col(f"t.{quote(name)}")

        def literal(value: object, spark_type: str = spark_type) -> Column:
            if spark_type == "timestamp":
                return F.timestamp_micros(F.lit(value))
            if spark_type == "date":
                return F.date_from_unix_date(F.lit(value))
            return F.lit(value).cast(spark_type)

        within = None if low is None else (target >= literal(low)) & (target <= literal(high))
        if has_null:
            within = target.isNull() if within is None else within | target.isNull()
        if within is not None:
            conditions.append(within)
    return conditions


@dataclass(frozen=True)
class MergeStatement:
    """The parts of one MERGE, as Spark SQL text over the target ``t`` and the source ``s``: the folded changes of a
    lake table (:func:`merge_statement`) or a history table's rows (``cdclake.sinks.history``). Executed by the sink
    that stores the table (:meth:`DeltaSink.merge_rows`), so the Delta and Iceberg sinks share it. A clause without
    its condition (``None``) is left out, except the insert, which then inserts every unmatched row."""

    source: DataFrame
    matched_on: str
    insert_values: Mapping[str, str]
    """Quoted target column -> its value."""
    insert_when: str | None = None
    delete_when: str | None = None
    update_when: str | None = None
    update_set: Mapping[str, str] = field(default_factory=dict)
    """Quoted target column -> its new value."""


_GENERATION_METADATA: Final = "delta.generationExpression"
_IDENTITY_METADATA: Final = "delta.identity.start"
_COMPUTED_METADATA: Final = (_GENERATION_METADATA, _IDENTITY_METADATA)
"""Column metadata keys of the columns Delta computes (:meth:`DeltaSink._computed_columns`)."""

DEFAULT_METADATA: Final = "CURRENT_DEFAULT"
"""Column metadata key of a column's DEFAULT expression (Spark SQL text), as Spark keeps it in a table's schema
(``ResolveDefaultColumns``) and a Delta table's DataFrame keeps (:meth:`DeltaSink.column_defaults`; Iceberg's Spark
catalog takes no DEFAULT here)."""


NO_CONSTRAINT_PROPAGATION: Final = {"spark.sql.constraintPropagation.enabled": "false"}
"""Session settings while MERGEs are planned: a lake table's (:meth:`DeltaSink.merging`) and a history table's
(``cdclake.sinks.history``). Catalyst's constraint propagation infers predicates through every alias of a plan, at a
cost that grows with the square of the aliases (Spark's doc of the setting warns of it), and a MERGE source has
several per table column, planned several times by Delta. What it would infer here (IsNotNull of the join columns)
skips no file: the statements' own conditions bound what they read. Measured (AGENTS.md):

* the SCD2 MERGE source of one table of 208 columns took 6.3-7.1 s to optimise with it, 1.1-1.3 s without (80% of
  it in PruneFilters, which asks every Filter's child for its constraints);
* 3 DataWorks tables of 208 columns, batches of 12,525 events (``python -m benchmarks.ab --variant
  no-constraint-propagation --tables 3 --extra-columns 200 --events-per-batch 10000``, the setting on whole
  batches): MERGE step 26.6 -> 20.4 s over three steady batches, decoding unchanged (so it keeps the setting);
* 100 tables of 5-8 columns: within the tool's order effect (B/A 0.87 with the setting second, 1.02 with it first).
"""


_IMAGE_IN_TABLE_ORDER: Final = "_image_in_table_order"
"""A MERGE source's staged column: whether the row's image lists exactly the table's columns, in their order."""


def _in_table_order(image: Column, names: Sequence[str]) -> Column:
    """Whether ``image`` lists exactly ``names``, in their order. Staged once per row as :data:`_IMAGE_IN_TABLE_ORDER`,
    apart from the columns that read it: Spark copies an expression into each place that uses it, and a copy of the
    names' array per table column makes a plan (and every task's binary) that grows with the square of the width."""
    return F.map_keys(image) == F.array(*(F.lit(name) for name in names))


def _image_columns(image: Column, in_order: Column, names: Sequence[str]) -> list[tuple[Column, Column]]:
    """Per name in ``names``: the ``image``'s value (NULL when it lacks the name) and whether the image has the name.

    An image ``in_order`` (:func:`_in_table_order`) is read by position: the usual full row image, since a table
    cdclake creates takes its columns in the order the source declares them. Another image looks each name up. Spark
    finds a map key by scanning the keys, so a lookup per column costs the square of the table's width on every row.
    """
    keys, values = F.map_keys(image), F.map_values(image)
    return [
        (F.when(in_order, F.get(values, index)).otherwise(image[name]), in_order | F.array_contains(keys, F.lit(name)))
        for index, name in enumerate(names)
    ]


def merge_statement(
    plan: TablePlan,
    table_columns: Sequence[tuple[str, str]],
    changes: DataFrame,
    partitions: int,
    table: str,
    carried: Sequence[str] = (),
    computed: Collection[str] = (),
    defaults: Mapping[str, str] | None = None,
) -> MergeStatement:
    """The MERGE of one table's folded, gated ``changes`` into a table with ``table_columns``: a delete or an upsert
    applies only when its order is at least the row's recorded one; a partial image keeps the columns it lacks.

    Args:
        partitions: at most this many source partitions (so files, when the target has none to rewrite).
        table: the table's name, for the error of a key column it lacks.
        carried: columns of ``changes`` kept in the source as they are (:func:`written_rows` passes them on).
        computed: columns whose values the table computes (generated, identity): neither set nor matched on.
        defaults: columns with a DEFAULT (name -> its Spark SQL expression, as the table's owner declared it) that
            an image may lack (the source table has no such column): a row inserted without one takes its DEFAULT, a
            row updated without one keeps its value, and a key-less row is matched on the other columns.
    """
    defaults = defaults or {}  # Delta allows no DEFAULT on a computed column
    source_columns: list[Column] = [
        F.col(apply.KIND).alias("_k"),
        F.col(apply.PARTIAL).alias("_partial"),
        F.col(apply.ORDER).alias(POSITION_COLUMN),
        F.col(model.EVENT_TIME).alias(EVENT_TIME_COLUMN),
        F.col(apply.KIND).alias(OP_COLUMN),
    ]
    names = [name for name, _ in table_columns]
    image, in_order = F.col(apply.IMAGE), F.col(_IMAGE_IN_TABLE_ORDER)
    image_columns = _image_columns(image, in_order, names)
    for index, ((_, spark_type), (value, present)) in enumerate(zip(table_columns, image_columns, strict=True)):
        source_columns.append(model.typed_value(value, spark_type).alias(f"_c{index}"))
        source_columns.append(present.alias(f"_p{index}"))
    staged = changes.coalesce(partitions)
    if names:
        staged = staged.withColumn(_IMAGE_IN_TABLE_ORDER, _in_table_order(image, names))
    source = staged.select(*source_columns, *carried)
    index_of = {name.lower(): i for i, (name, _) in enumerate(table_columns)}
    missing_keys = [k for k in plan.key_columns if k.lower() not in index_of]
    if missing_keys:
        raise RuntimeError(f"key columns {missing_keys} are not columns of {table}")
    # A table without key columns is matched on the whole row (apply.key_of): every column, NULL-safe, so that
    # a column the message does not declare matches the row's NULL in it.
    match_on = plan.key_columns or [name for name, _ in table_columns if name not in computed]
    matched_on = []
    for name in match_on:
        i = index_of[name.lower()]
        same = f"t.{quote(name)} <=> s._c{i}"
        # Key columns are in every image (an image without one is a dead letter): only a whole-row match skips one.
        matched_on.append(f"(NOT s._p{i} OR {same})" if name in defaults and not plan.key_columns else same)
    # The stored order as it compares now (apply.comparable_order: a NULL sequence_by value stored the old way).
    newer = f"s.{POSITION_COLUMN} >= coalesce({apply.comparable_order_sql(f't.{POSITION_COLUMN}')}, '')"
    update_set: dict[str, str] = {}
    insert_values: dict[str, str] = {}
    for i, (name, spark_type) in enumerate(table_columns):
        if name in computed:
            continue
        lacking = f"NOT s._p{i}" if name in defaults else f"s._partial AND NOT s._p{i}"
        update_set[quote(name)] = f"CASE WHEN {lacking} THEN t.{quote(name)} ELSE s._c{i} END"
        insert_values[quote(name)] = (
            f"CASE WHEN s._p{i} THEN s._c{i} ELSE CAST(({defaults[name]}) AS {spark_type}) END"
            if name in defaults
            else f"s._c{i}"
        )
    for meta, _ in METADATA_COLUMNS:
        update_set[meta] = f"s.{meta}"
        insert_values[meta] = f"s.{meta}"
    # The source, per change: ``_k`` (kind), ``_partial``, cdclake's columns, and per table column ``_c<i>`` (its
    # typed value) and ``_p<i>`` (whether the image has it).
    return MergeStatement(
        source=source,
        matched_on=" AND ".join(matched_on),
        insert_values=insert_values,
        insert_when=f"s._k = '{apply.UPSERT}'",
        delete_when=f"s._k = '{apply.DELETE}' AND {newer}",
        update_when=f"s._k = '{apply.UPSERT}' AND {newer}",
        update_set=update_set,
    )


def rewritten_rows(table: DataFrame, columns: Sequence[tuple[str, Column]]) -> DataFrame:
    """The rows of a lake ``table`` as a rewrite writes them: its new user ``columns`` (name, expression over the
    current row), then cdclake's columns, those it has (a table made by hand has none before its first row change;
    a DDL statement may come first)."""
    kept = [F.col(name) for name, _ in METADATA_COLUMNS if name in table.columns]
    return table.select(*(expr.alias(name) for name, expr in columns), *kept)


def inserted_rows(statement: MergeStatement, schema: StructType) -> DataFrame:
    """The rows ``statement`` would insert into an empty table of ``schema`` (every column of the table, cdclake's
    own included): a new table's first rows, with exactly the table's columns, in its order and of its types (NULL
    in a column the statement does not insert, as a MERGE leaves it)."""
    values = {name.lower(): value for name, value in statement.insert_values.items()}
    source = statement.source.alias("s")
    if statement.insert_when is not None:
        source = source.where(F.expr(statement.insert_when))

    def value_of(field: StructField) -> Column:
        value = values.get(quote(field.name).lower(), values.get(field.name.lower()))
        return (F.lit(None) if value is None else F.expr(value)).cast(field.dataType).alias(field.name)

    return source.select(*map(value_of, schema.fields))


def written_rows(
    statement: MergeStatement, target: DataFrame, columns: Sequence[str], carried: Sequence[str]
) -> DataFrame:
    """The rows ``statement`` would write into the table that ``target`` reads, without writing them: per source row
    that updates or inserts one, the row's ``columns`` as the MERGE would leave them (a partial image's missing
    columns, and those the update does not set, from the stored row) and the source's ``carried`` columns. Rows the
    MERGE deletes or leaves alone are not in it. Delta enforces a table's CHECK constraints on exactly these rows."""
    matched = "_cdc_check_matched"
    stored = target.withColumn(matched, F.lit(True)).alias("t")
    joined = statement.source.alias("s").join(stored, F.expr(statement.matched_on), "left")

    def row(values: Mapping[str, str], unset: str) -> list[Column]:
        # The statement names its target columns quoted (cdclake's own unquoted), as the table spells them. A column
        # it does not set keeps its stored value in an update, and is NULL in an insert.
        named = {_unquoted(column).lower(): value for column, value in values.items()}
        kept = [F.col(f"s.{quote(name)}").alias(name) for name in carried]
        return [F.expr(named.get(name.lower(), unset.format(quote(name)))).alias(name) for name in columns] + kept

    is_matched = F.col(f"t.{matched}").isNotNull()
    updated = joined.where(is_matched & F.expr(statement.update_when or "true"))
    inserted = joined.where(~is_matched & F.expr(statement.insert_when or "true"))
    return updated.select(*row(statement.update_set, "t.{}")).unionByName(
        inserted.select(*row(statement.insert_values, "NULL"))
    )


def rows_after(statement: MergeStatement, target: DataFrame) -> DataFrame | None:
    """Every row of the table that ``target`` reads as ``statement`` would leave it, in the table's columns and types:
    a full outer join of its rows with the source, where a matched row is deleted, updated or kept by the statement's
    clauses in their order (delete, then update), an unmatched stored row is kept, and an unmatched source row is
    inserted when its condition holds. Written in place of the table (:meth:`DeltaSink.rewrites_whole`). None when
    the statement's inserted values are not exactly the table's columns, or it updates a column the table lacks: a
    column the MERGE would leave NULL or to its DEFAULT, or one it would refuse, is left to the MERGE."""
    inserted_values = {_unquoted(column).lower(): value for column, value in statement.insert_values.items()}
    updated_values = {_unquoted(column).lower(): value for column, value in statement.update_set.items()}
    columns = {name.lower() for name in target.columns}
    if columns != set(inserted_values) or not set(updated_values) <= columns:
        return None
    stored, changed = "_cdc_stored", "_cdc_changed"
    joined = (
        target.withColumn(stored, F.lit(True))
        .alias("t")
        .join(statement.source.withColumn(changed, F.lit(True)).alias("s"), F.expr(statement.matched_on), "full_outer")
    )
    matched = f"coalesce(t.{stored} AND s.{changed}, false)"
    deleted = f"({matched} AND coalesce({statement.delete_when or 'false'}, false))"
    updated = f"({matched} AND NOT {deleted} AND coalesce({statement.update_when or 'false'}, false))"
    inserted = f"(t.{stored} IS NULL AND coalesce({statement.insert_when or 'true'}, false))"

    def value_of(field: StructField) -> Column:
        kept = f"t.{quote(field.name)}"
        update = updated_values.get(field.name.lower(), kept)
        insert = inserted_values[field.name.lower()]
        value = f"CASE WHEN {updated} THEN {update} WHEN t.{stored} THEN {kept} ELSE {insert} END"
        return F.expr(value).cast(field.dataType).alias(field.name)

    kept_rows = joined.where(f"NOT {deleted} AND (t.{stored} OR {inserted})")
    return kept_rows.select(*map(value_of, target.schema.fields))


KEY_COLUMNS_PROPERTY: Final = "cdclake.keyColumns"
"""The table property with the key columns a table was created with (comma-separated; empty for a key-less table)."""


SEQUENCE_BY_PROPERTY: Final = "cdclake.sequenceBy"
"""The table property with the ordering a lake table's rows were written with (:func:`ordering_of`): the
``sequence_by`` column, lower-cased, or empty for the format's position. Their ``_cdc_position`` is ``value|position``
in the one case, the bare position in the other, and orders of two orderings do not compare (``apply.sequenced``)."""


def ordering_of(plan: TablePlan) -> str:
    """The value of :data:`SEQUENCE_BY_PROPERTY` for the ordering of ``plan``'s row changes."""
    return (plan.sequence_column or "").lower()


def source_properties(plan: TablePlan) -> dict[str, str]:
    """cdclake's table properties of a table it creates for ``plan`` (a lake table or its history tables): the
    source table's dotted name (``cdclake.source``) and its key columns (:data:`KEY_COLUMNS_PROPERTY`)."""
    return {
        "cdclake.source": ".".join(p for p in (plan.database, plan.schema, plan.table) if p),
        KEY_COLUMNS_PROPERTY: ",".join(plan.key_columns),
    }


def _differing(wanted: Mapping[str, str], stored: Mapping[str, str]) -> dict[str, str]:
    """The ``wanted`` properties that ``stored`` lacks or holds with another value. Delta matches ``delta.*`` keys in
    any case, and spells them otherwise on the way in (``delta.feature.allowcolumndefaults``, once Delta has checked
    it) than on the way out (``delta.feature.allowColumnDefaults``): compared exactly, such a key would be set again
    by every run."""

    def folded(key: str) -> str:
        return key.lower() if key.lower().startswith("delta.") else key

    held = {folded(k): v for k, v in stored.items()}
    return {k: v for k, v in wanted.items() if held.get(folded(k)) != v}


ColumnPath = tuple[str, ...]
"""A column, ``(name,)``, or a field of a struct column, ``(struct, field)``."""


def type_at(schema: StructType, column: ColumnPath) -> DataType:
    """The type of the column or struct field at ``column`` in ``schema`` (names as the schema spells them)."""
    data_type = schema[column[0]].dataType
    for name in column[1:]:
        assert isinstance(data_type, StructType)
        data_type = data_type[name].dataType
    return data_type


def holds_timestamp_ntz(data_type: DataType) -> bool:
    """Whether ``data_type`` holds ``timestamp_ntz`` values (in a struct's field too)."""
    if isinstance(data_type, StructType):
        return any(holds_timestamp_ntz(f.dataType) for f in data_type.fields)
    return isinstance(data_type, TimestampNTZType)


def metadata_columns_to_add(path: str, existing: Collection[str]) -> list[tuple[str, str]]:
    """The :data:`METADATA_COLUMNS` that the lake table at ``path``, with columns ``existing`` (lower case), lacks.

    A table that cdclake did not create (made by hand before the first run, say, with its own properties or
    partitioning) lacks them, and every MERGE into it failed, on every restart. With them added, its stored rows have
    no position, which every change is newer than (:func:`merge_statement`): the first change of a key applies."""
    lacking = [(name, spark_type) for name, spark_type in METADATA_COLUMNS if name.lower() not in existing]
    if lacking:
        log.warning(
            "%s: lake table was not created by cdclake; adding its columns %s (the rows it holds have no position: "
            "the first change of each key replaces or deletes its row)",
            path,
            ", ".join(name for name, _ in lacking),
        )
    return lacking


def _partitioned(writer: DataFrameWriter, partitioning: Partitioning) -> DataFrameWriter:
    """``writer`` (Delta's path writer) partitioned by the identity fields ``partitioning``. An overwrite that
    changes the schema (``overwriteSchema``) sets the table's partitioning too: to none unless it is given."""
    return writer.partitionBy(*(field.column for field in partitioning)) if partitioning else writer


def _already_exists(error: Exception) -> bool:
    """Whether ``error`` is Spark's refusal to create a table that its catalog finds there."""
    return isinstance(error, AnalysisException) and "ALREADY_EXISTS" in str(error.getCondition() or "")


def _may_gate(lowest_orders: Mapping[str, str | None]) -> Column:
    """Over the tombstones table: the tombstones of the tables of ``lowest_orders`` that are ordered at or after the
    table's lowest order (all of a table's tombstones when that is None).

    A change is kept when its order is >= its key's tombstone and > its table's truncate, so a tombstone ordered
    below every change of its table can never reject one. Tables are grouped by the first character of their
    lowest order, one bound (the group's lowest) per group: the orders of one source share their first character
    (digits, ``~`` for Kafka coordinates, ``!`` for full loads), so a lake fed by several sources keeps a tight
    bound for each, while every tombstone read is tested against a handful of groups, not against every table.
    """
    table_id, position = F.col(apply.TABLE_ID), F.col("position")
    unbounded = sorted(t for t, order in lowest_orders.items() if order is None)
    groups: dict[str, list[str]] = {}
    for table, order in sorted(lowest_orders.items()):
        if order is not None:
            groups.setdefault(order[:1], []).append(table)
    condition = table_id.isin(*unbounded) if unbounded else F.lit(False)
    for tables in groups.values():
        lowest = min(lowest_orders[table] or "" for table in tables)
        condition = condition | (table_id.isin(*tables) & (position >= F.lit(lowest)))
    return condition


REWRITE_METADATA: Final = "cdclake: a batch's row changes, the table's rows rewritten"
"""The ``userMetadata`` of a commit that wrote a batch's changes by rewriting the table's rows
(:meth:`DeltaSink.rewrites_whole`), so that its history tells it from an overwrite by hand or a type rewrite."""

_RECORDING_FEATURES: Final = (ENABLE_DELETION_VECTORS, "delta.enableChangeDataFeed", "delta.enableRowTracking")
"""Table properties under which a table records what a MERGE changes (deleted rows, change rows, row ids), which a
rewrite of its rows would not (:meth:`DeltaSink.rewrites_whole`)."""


def _records_rows(metadata: Any) -> bool:
    """Whether a Delta table's metadata (JVM ``Metadata``) sets any of :data:`_RECORDING_FEATURES`."""
    configuration = metadata.configuration()
    for key in _RECORDING_FEATURES:
        value = configuration.get(key)
        if value.isDefined() and str(value.get()).strip().lower() == "true":
            return True
    return False


def _table_bytes(table: DataFrame) -> int:
    """The bytes of the files of the Delta table read by ``table`` (Spark's size estimate of the relation, which
    Delta takes from the table's snapshot: no query). Unknown (not a classic Spark session) counts as large."""
    try:
        return int(table._jdf.queryExecution().analyzed().stats().sizeInBytes())
    except (AttributeError, Py4JError):
        return sys.maxsize


class DeltaSink:
    """Writes batches of folded changes and bookkeeping rows into a lake directory of Delta tables.

    Args:
        spark: the session.
        lake: the lake directory (local path or any Hadoop file system URI).
        deletion_vectors: when lake tables and history tables (``cdclake.sinks.history``) use deletion vectors,
            so that a MERGE marks the rows it replaces or deletes instead of rewriting the files that hold them
            (copy-on-write):

            * ``auto`` (default): tables start copy-on-write; one whose recent MERGEs rewrote a median of at least
              :attr:`DELETION_VECTORS_REWRITE_BYTES` per MERGE switches to deletion vectors, for good (before its
              next batch's MERGE). Copy-on-write rewrites every file a change touches, whole, so its cost grows
              with the table's files; a MERGE with deletion vectors costs a fixed extra pass (python -m
              benchmarks.deletion_vectors).
            * ``always``: every such table uses them (tables created before are switched on first use).
            * ``never``: cdclake creates tables without them and never switches one (for readers that cannot
              apply deletion vectors); a table that has them keeps them.

            Switching upgrades the table's Delta protocol (reader 3, writer 7, feature ``deletionVectors``), which
            readers need to support (Spark with Delta 2.3 or later, Trino, DuckDB, delta-rs through DataFusion).
        routes: which lake table each source table lands in.
        table_properties: the lake tables' own properties, per source table name or pattern (``table_properties``
            setting, checked by ``cdclake.sinks.check_table_properties``): set when a table is created, and on an
            existing table whose values differ (:meth:`_reconcile_properties`). A property left out of the setting
            later is left as the table has it.
        partition_by: the partitioning of the lake tables cdclake creates, per source table name or pattern
            (``partition_by`` setting, parsed by ``cdclake.sinks.partitioning.check_partition_by``). An existing
            table keeps its own; rewrites keep it (:meth:`rewrite`).
    """

    DELETION_VECTORS_REWRITE_BYTES: int = 4 * 1024 * 1024
    """``auto``: the median bytes rewritten per MERGE (Delta's ``numTargetBytesRemoved``) over a table's recent
    MERGEs from which it switches to deletion vectors. Measured on 2 cores, 10,000 upserts per MERGE (python -m
    benchmarks.deletion_vectors): where copy-on-write MERGEs rewrote 3 MiB, deletion vectors took 1.03x their time,
    7.5 MiB 0.84x, 30 MiB 0.49x, 137 MiB 0.22x; on the benchmark workload's small tables (well under 1 MiB per
    MERGE) 1.6-1.7x."""
    KEY_RANGES_MIN_BYTES: int = 256 * 1024 * 1024
    """A MERGE gets the key-range conditions on the target (:meth:`key_ranges_pay`) when the table's files hold at
    least this many bytes. Measured on 2 cores, 10,000 upserts of new and recent ids per MERGE into a copy-on-write
    table (python -m benchmarks.key_ranges), seconds without the ranges / with them: 147 MiB 0.9x, 416 MiB 1.1x,
    820 MiB 1.3x (1.4x at 100 million rows); on the benchmark workload's 100 small tables, whole batches took 0.84x
    the time without them."""
    REWRITE_MAX_BYTES: int = 4 * 1024 * 1024
    """A table whose files hold fewer bytes than this takes a batch's changes by a rewrite of all its rows
    (:meth:`rewrites_whole`) instead of a MERGE. Such a table is one file or a few, which a MERGE of any update or
    delete rewrites anyway (copy-on-write); the rewrite skips the MERGE's search for the files it touches (its scans
    of the table and the source's broadcast) and writes in one task. The same size as
    :attr:`DELETION_VECTORS_REWRITE_BYTES`: a MERGE of such a table never rewrites enough for ``auto`` to switch it to
    deletion vectors, and a larger table keeps the MERGEs that rule looks at. A table with deletion vectors, a change
    data feed, row tracking or computed columns keeps its MERGEs: a rewrite would lose what they record (rows marked
    deleted, change rows, row ids) or could not write its computed columns. Above this size a MERGE pays: it
    rewrites only the files its keys touch.

    The scaling workload's 100 small tables, steady batches of 31,260 DataWorks messages, both ways interleaved in
    one process (``python -m benchmarks.ab --variant merge-small-tables``, three batches after the first, 2 cores,
    2026-12-08): rewrites / MERGEs 0.80 with the rewrites second, MERGEs / rewrites 1.12 with the MERGEs second (the
    tool's order effect alone has been 0.90-0.96), so about 0.85 either way round; the MERGE step 0.79 and 1.14
    (about 0.83). The rewrite's first version (a task per partition of the join, and Delta's optimized write) measured
    0.83 and 1.14 the same way."""
    DELETION_VECTORS_CHECK_EVERY: int = 25
    """``auto``: a table's recent MERGEs are looked at after one in this many of its MERGEs by this sink (reading
    the table's history costs about 0.1 s). Which one depends on the table's path, so that a batch of many tables
    looks at a few of them, not at all of them at once, and on a number drawn for each sink, so that runs of fewer
    MERGEs than that (scheduled ``available_now`` runs) look at each table in turn, not always at the same ones. In
    every mode, the same MERGE also makes :meth:`key_ranges_pay` read the table's size again (:meth:`merged`)."""
    DELETION_VECTORS_RECENT_COMMITS: int = 10
    """``auto``: how many of a table's newest commits are looked at (its MERGEs among them)."""
    TABLE_FORMAT: str = "delta"
    """The format of the lake tables (the ``table_format`` setting)."""
    CONFLICT_ATTEMPTS: int = 5
    """How often a MERGE, truncate or rewrite is tried when another writer's commit conflicts with it (Delta's
    ``ConcurrentModificationException``s: an OPTIMIZE, a DELETE by hand, a ``dlq replay`` beside ``run``), waiting
    1, 2, 4 and 8 s in between; then the batch fails, to be run again."""

    def __init__(
        self,
        spark: SparkSession,
        lake: str,
        deletion_vectors: DeletionVectors = "auto",
        routes: TableRoutes | None = None,
        table_properties: PerTable[dict[str, str]] | None = None,
        partition_by: PerTable[Partitioning] | None = None,
    ) -> None:
        if deletion_vectors not in DELETION_VECTOR_MODES:
            raise ValueError(f"deletion_vectors must be one of {', '.join(DELETION_VECTOR_MODES)}")
        self.spark = spark
        self.lake = absolute_location(lake).rstrip("/")
        self.system_dir = f"{self.lake}/_cdclake"
        self.deletion_vectors = deletion_vectors
        self.routes = routes or TableRoutes()
        self.table_properties = self._known_properties(table_properties or PerTable())
        self.partition_by = partition_by or PerTable()
        # User columns of the tables this sink has seen, so a batch without new columns does not re-read the log.
        self._columns: dict[str, list[tuple[str, str]]] = {}
        # path -> what its user columns declare, as checks (cdclake.constraints.declared_checks), read with _columns.
        self._declared_checks: dict[str, dict[str, str]] = {}
        # path -> its columns whose values Delta computes (generated, identity), read with _columns.
        self._computed: dict[str, frozenset[str]] = {}
        # path -> its columns with a DEFAULT (name -> expression), read with _columns.
        self._defaults: dict[str, dict[str, str]] = {}
        # Deletion vectors: a MERGE counter per table path (from a number of the path's and one of the sink's), the
        # paths to switch before their next MERGE, and those known to use them. Written from the MERGE threads, one
        # path per thread.
        self._merges: dict[str, int] = {}
        self._merges_offset = random.randrange(self.DELETION_VECTORS_CHECK_EVERY)
        # Bytes of each table's files when last read (key_ranges_pay), forgotten every DELETION_VECTORS_CHECK_EVERY
        # MERGEs. Written from the MERGE threads, one path per thread.
        self._table_sizes: dict[str, int] = {}
        self._switch_to_deletion_vectors: set[str] = set()
        self._with_deletion_vectors: set[str] = set()
        # Paths of the tables that ensure_table(defer_creation=True) found missing: their first write creates them.
        self._awaiting_creation: set[str] = set()
        # Lake tables whose properties ensure_table has looked at in this process (_reconcile_properties).
        self._source_properties_checked: set[str] = set()
        # Lake table path -> the ordering its rows were written with (SEQUENCE_BY_PROPERTY), for those looked at.
        self._recorded_ordering: dict[str, str] = {}
        # (lake table path, ordering) pairs that ordering_conflict found the table holding orders of another one for.
        self._ordering_refused: set[tuple[str, str]] = set()
        # Bookkeeping table path -> the newest marker versions appended there (read from its rows once, then kept
        # from this sink's own appends); None for a table from before the marker columns (Delta's markers).
        self._appended: dict[str, _AppendedVersions | None] = {}
        self._appended_lock = threading.Lock()
        # Bookkeeping tables that did not exist at this sink's first append to them: created in this process.
        self._created_here: set[str] = set()
        self.tombstone_bounds = TombstoneBounds(spark, self.system_path(self.TOMBSTONES), self._hadoop_path)
        """How far up each table's tombstones reach: the tables :meth:`gate` needs to read them for."""
        self.conflicts_retried = 0
        """Commits tried again after a concurrent commit conflicted with them (:attr:`CONFLICT_ATTEMPTS`)."""

    # ---------------------------------------------------------------------------------------------------------
    # Paths

    def lake_names(self, database: str | None, schema: str | None, table: str) -> tuple[str, str]:
        """The path-safe (database, table) names of a source table's lake table: its :attr:`routes` target, by default
        its database (sources without a database name use their schema, else ``default``) and table."""
        lake_database, lake_table = self.routes.lake_name(database, schema, table)
        return safe_name(lake_database), safe_name(lake_table)

    def table_path(self, database: str | None, schema: str | None, table: str) -> str:
        """``<lake>/<database>/<table>`` (see :meth:`lake_names`)."""
        return "/".join((self.lake, *self.lake_names(database, schema, table)))

    def system_path(self, name: str) -> str:
        return f"{self.system_dir}/{name}"

    # ---------------------------------------------------------------------------------------------------------
    # Commits

    @contextmanager
    def idempotent(self, txn: Txn | None) -> Iterator[None]:
        """Marks the DML commits inside the block with ``txn`` (Delta skips them if already committed)."""
        if txn is None:
            yield
            return
        conf = self.spark.conf
        conf.set(TXN_APP_ID, txn.app_id)
        conf.set(TXN_VERSION, str(txn.version))
        try:
            yield
        finally:
            conf.unset(TXN_APP_ID)
            conf.unset(TXN_VERSION)

    def append(self, name: str, rows: DataFrame, txn: Txn | None) -> None:
        """Appends to a bookkeeping table under ``_cdclake`` (created on first use), once per ``txn``: skipped when
        the table holds an append of ``txn.app_id`` with that version or a later one (Delta's idempotent-writer rule).

        The rows carry the marker (:data:`MARKER_APP_COLUMN`, :data:`MARKER_VERSION_COLUMN`) instead of Delta's
        writer options: with those, Delta looks the app's last version up in the table's full state on every append,
        a log-replay job that made a 2-row append take 0.74 s instead of 0.27-0.30 s on 2 cores (AGENTS.md). The
        newest version per app id is read from the rows once per sink and table (those of versions from the first
        append's up; an append of an older version reads again), then kept from the sink's own appends: a
        pipeline's app id has one writer at a time (its checkpoint's, or its replay's own), and the only batch
        Structured Streaming runs again is the first one after a start. After an append fails, the rows are read
        again (it may have committed). A table from before these columns keeps Delta's writer options in this
        sink, since its earlier appends are marked only there; its rows get the columns from then on.

        The append runs in a clone of the session without :meth:`idempotent`'s settings: the batch's background
        bookkeeping thread appends while the batch's thread is inside such a block, and Delta takes a write without
        writer options as marked by the session's settings (it would record, and look up, the lake commits' marker
        in the bookkeeping table); one that started between the block's setting of the two keys failed outright
        (``DELTA_INVALID_IDEMPOTENT_WRITES_OPTIONS``)."""
        path = self.system_path(name)
        writer_options: dict[str, str] = {}
        if txn is not None:
            appended = self._appended_versions(path, txn.version)
            if appended is None:
                writer_options = {"txnAppId": txn.app_id, "txnVersion": str(txn.version)}
            elif appended.newest.get(txn.app_id, -1) >= txn.version:
                log.info("skipping append %s of %s to %s: already appended", txn.version, txn.app_id, name)
                return
            rows = rows.withColumns(
                {
                    MARKER_APP_COLUMN: F.lit(txn.app_id),
                    MARKER_VERSION_COLUMN: F.lit(txn.version).cast("bigint"),
                }
            )
        clone = cloned_session(self.spark, without=(TXN_APP_ID, TXN_VERSION))
        if path in self._created_here:
            # A table this process created holds only the small files the process has counted: Delta's compaction of
            # it on its first file-adding commit in the process would find nothing to do, at about 0.5-1 s for each
            # bookkeeping table of a new lake (a 3-table DataWorks replay's first batch: waiting for the bookkeeping
            # 1.98-2.16 -> 0.75-0.91 s, progress 0.81-0.94 -> 0.36-0.43 s). Compaction by count still applies; a
            # table found existing keeps the first compaction, which is what compacts it when runs are short.
            clone.conf.set(AUTO_COMPACT_MODIFIED_PARTITIONS_ONLY, "false")
        unmarked = in_session(rows, clone)
        writer = unmarked.write.format("delta").mode("append").option("mergeSchema", "true").options(**TABLE_PROPERTIES)
        try:
            writer.options(**writer_options).save(path)
        except BaseException:
            with self._appended_lock:
                if self._appended.get(path) is not None:
                    del self._appended[path]
            raise
        if txn is not None:
            with self._appended_lock:
                appended = self._appended.get(path)
                if appended is not None:
                    appended.newest[txn.app_id] = max(appended.newest.get(txn.app_id, -1), txn.version)

    def _appended_versions(self, path: str, version: int) -> _AppendedVersions | None:
        """The newest marker versions of the appends to the bookkeeping table at ``path``, known at least from
        ``version`` up (see :meth:`append`); None when the table has rows from before the marker columns."""
        with self._appended_lock:
            if path in self._appended:
                known = self._appended[path]
                if known is None or version >= known.since:
                    return known
            known = self._read_appended_versions(path, version)
            self._appended[path] = known
            return known

    def _read_appended_versions(self, path: str, since: int) -> _AppendedVersions | None:
        if not self._exists(path):
            self._created_here.add(path)
            return _AppendedVersions(since, {})
        table = self.spark.read.format("delta").load(path)
        if MARKER_APP_COLUMN not in table.columns:
            return None
        # Only versions from ``since`` up: by the files' statistics of the version column, a table appended to in
        # batch order reads its newest files only, however many batches it holds.
        newest = (
            table.where(F.col(MARKER_VERSION_COLUMN) >= since)
            .groupBy(MARKER_APP_COLUMN)
            .agg(F.max(MARKER_VERSION_COLUMN))
            .collect()
        )
        return _AppendedVersions(since, {row[0]: row[1] for row in newest})

    def replace_partition(
        self,
        name: str,
        rows: DataFrame,
        partition: tuple[str, str],
        *,
        keep: tuple[str, int] | None,
        txn: Txn | None,
    ) -> None:
        """Replaces one partition of a bookkeeping table (partitioned by ``partition[0]``, created on first use)
        with ``rows``, once per ``txn``: every row of partition value ``partition[1]`` goes, except those whose
        integer column ``keep[0]`` equals ``keep[1]``; every row of ``rows`` must be in that partition and must not
        have that ``keep`` value. One commit, so readers see the old or the new rows, never a mix."""
        column, value = partition
        condition = f"{quote(column)} = {sql_string(value)}"
        if keep is not None:
            condition += f" AND {quote(keep[0])} <> {int(keep[1])}"
        writer = (
            rows.write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", condition)
            .option("mergeSchema", "true")
            .options(**TABLE_PROPERTIES)
            .partitionBy(column)
        )
        if txn is not None:
            writer = writer.option("txnAppId", txn.app_id).option("txnVersion", txn.version)
        writer.save(self.system_path(name))

    # ---------------------------------------------------------------------------------------------------------
    # Tables

    def _exists(self, path: str) -> bool:
        return DeltaTable.isDeltaTable(self.spark, path)

    def ensure_table(self, plan: TablePlan, *, defer_creation: bool = False) -> list[tuple[str, str]]:
        """Creates the table or adds the plan's new columns; returns the table's (name, type) user columns.

        Args:
            defer_creation: a table that does not exist yet is not created here: its first :meth:`merge` creates it
                with its rows, in one commit (:meth:`awaits_creation`). The columns returned are then the plan's.
        """
        path = self.table_path(plan.database, plan.schema, plan.table)
        self.prepare_deletion_vectors(path)
        cached = self._columns.get(path)
        if (
            cached is not None
            and path in self._source_properties_checked
            and {n.lower() for n, _ in plan.columns} <= {n.lower() for n, _ in cached}
        ):
            return cached
        self._awaiting_creation.discard(path)
        if self._exists(path):
            if path not in self._source_properties_checked:
                self._reconcile_properties(path, plan, self._properties(path))
        else:
            if defer_creation:
                return self._leave_to_first_write(path, plan)
            fields = [
                StructField(name, _parse_datatype_string(spark_type))
                for name, spark_type in [*plan.columns, *METADATA_COLUMNS]
            ]
            builder = DeltaTable.createIfNotExists(self.spark).location(path).addColumns(StructType(fields))
            partitioning = self.creation_partitioning(plan, plan.columns)
            properties = column_mapped(self._creation_properties(plan, partitioning), StructType(fields))
            for name, value in properties.items():
                builder = builder.property(name, value)
            if partitioning:
                builder = builder.partitionedBy(*(field.column for field in partitioning))
            builder.execute()
            self._recorded_ordering[path] = ordering_of(plan)
        self._source_properties_checked.add(path)
        schema = DeltaTable.forPath(self.spark, path).toDF().schema
        existing = {f.name.lower() for f in schema.fields}
        missing = [(name, t) for name, t in plan.columns if name.lower() not in existing]
        missing += metadata_columns_to_add(path, existing)
        if missing:
            self._add_columns(path, missing)
            schema = DeltaTable.forPath(self.spark, path).toDF().schema
        return self._remember_columns(path, schema.fields)

    def _reconcile_properties(self, path: str, plan: TablePlan, stored: Mapping[str, str]) -> None:
        """Sets, in one commit, what the existing lake table at ``path`` (with properties ``stored``) lacks or has
        otherwise; :meth:`ensure_table` asks once per table and process:

        * the values of the ``table_properties`` setting that differ (:meth:`user_properties`): the setting is
          what the lake's owner wants the tables to have, so a changed value reaches existing tables;
        * cdclake's source properties (:func:`source_properties`, from ``plan``) if it lacks them. A table cdclake
          created lacks them only when it was created beside a killed creation's files and its process was killed
          again before the commit that adds them (:meth:`_create_beside_leftovers`); a table created by hand may
          too. Without them a later rename or ``CREATE TABLE ... LIKE`` of the source table would not know its key
          columns.
        * the ordering of its rows (:data:`SEQUENCE_BY_PROPERTY`) if it lacks it: a table created before cdclake
          recorded it is taken to be ordered as ``sequence_by`` orders it now. Another recorded ordering is left to
          :meth:`ordering_conflict`.
        """
        changed = _differing(self.user_properties(plan), stored)
        if changed:
            log.info("%s: table properties set from the table_properties setting: %s", path, sorted(changed))
        if "cdclake.source" not in stored:
            log.warning("%s lacks cdclake's table properties (cdclake.source, %s): set now", path, KEY_COLUMNS_PROPERTY)
            changed.update(source_properties(plan))
        recorded = stored.get(SEQUENCE_BY_PROPERTY)
        if recorded is None:
            recorded = changed[SEQUENCE_BY_PROPERTY] = ordering_of(plan)
        self._recorded_ordering[path] = recorded
        if changed:
            self._set_properties(path, changed)

    def _known_properties(self, table_properties: PerTable[dict[str, str]]) -> PerTable[dict[str, str]]:
        """``table_properties`` with each ``delta.*`` key in the spelling Delta stores it in, once Delta has accepted
        it and its value (``DeltaConfigs.validateConfigurations``, no I/O). Raises :class:`ConfigError` naming the
        entry for a property Delta does not know or a value it refuses: found when the pipeline starts, not when
        its first new table is created mid-stream."""
        if not table_properties:
            return table_properties
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        known: list[tuple[str, dict[str, str]]] = []
        for pattern, properties in table_properties.entries:
            given = jvm.java.util.HashMap()
            for key, value in properties.items():
                given.put(key, value)
            try:
                accepted = jvm.org.apache.spark.sql.delta.DeltaConfigs.validateConfigurations(
                    jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(given)
                )
            except (Py4JJavaError, CapturedException) as exc:
                # PySpark's own text of Delta's error (its getMessage() looks Delta's error class up in Spark's).
                message = exc.java_exception.getMessage() if isinstance(exc, Py4JJavaError) else str(exc)
                reason = " ".join(str(message).split("\nJVM stacktrace:")[0].split())
                raise ConfigError(
                    f"table_properties.{pattern}",
                    f"Delta refuses these table properties: {reason}",
                    "use the property names and values of Delta's table properties documentation (e.g. "
                    "`delta.enableChangeDataFeed: true`, `delta.logRetentionDuration: interval 30 days`)",
                ) from None
            pairs, normalized = accepted.iterator(), {}
            while pairs.hasNext():
                pair = pairs.next()
                normalized[str(pair._1())] = str(pair._2())
            known.append((pattern, normalized))
        return PerTable(tuple(known))

    def user_properties(self, plan: TablePlan) -> dict[str, str]:
        """The properties that the ``table_properties`` setting gives the lake table of ``plan``'s source table."""
        return dict(self.table_properties.value_for(plan.database, plan.schema, plan.table) or {})

    def properties_to_set(self, database: str | None, schema: str | None, table: str) -> dict[str, str]:
        """The ``table_properties`` values that the source table's existing lake table lacks or has otherwise: what
        the next run sets (:meth:`_reconcile_properties`; ``cdclake check`` reports them)."""
        wanted = self.table_properties.value_for(database, schema, table)
        if not wanted:
            return {}
        return _differing(wanted, self._properties(self.table_path(database, schema, table)))

    def ordering_conflict(self, plan: TablePlan) -> str | None:
        """The ordering that the lake table of ``plan``'s source table was written with (:func:`ordering_of`: a
        column, or ``""`` for the format's position) when ``sequence_by`` now orders the source table otherwise,
        else None. Known for the tables :meth:`ensure_table` has looked at (once per table and process).

        Its stored orders and the new ones do not compare: ``value|position`` against a bare position, or values of
        two columns, compared as text, would overwrite newer rows and drop newer changes as older, silently. Nor can
        the stored orders be converted: each row holds only its newest version, which the old ordering chose, and
        its SCD2 history would have to be placed again in another order. The pipeline makes the table's row changes
        dead letters that say so (``pipeline.ordering_changed_problem``).

        A table that holds no order yet (:meth:`holds_orders`) takes the new ordering instead: one created by a batch
        whose row changes were all refused (for a misspelt ``sequence_by`` column, say), or by a ``CREATE TABLE``
        under a pattern whose column it lacks. Looked at once per table, ordering and process."""
        path = self.table_path(plan.database, plan.schema, plan.table)
        recorded, wanted = self._recorded_ordering.get(path), ordering_of(plan)
        if recorded is None or recorded == wanted:
            return None
        if (path, wanted) not in self._ordering_refused:
            if not self.holds_orders(plan.database, plan.schema, plan.table):
                log.info("%s holds no rows yet: its rows are ordered by %r from now on", path, wanted)
                self._set_properties(path, {SEQUENCE_BY_PROPERTY: wanted})
                self._recorded_ordering[path] = wanted
                return None
            self._ordering_refused.add((path, wanted))
        return recorded

    def holds_orders(self, database: str | None, schema: str | None, table: str) -> bool:
        """Whether the source table's existing lake table has rows, or the tombstones table a deleted key of it: orders
        that later changes are compared with (:meth:`ordering_conflict`). A truncate's tombstone compares log
        positions whatever the ordering."""
        if not self.read(database, table, schema).isEmpty():
            return True
        path = self.system_path(self.TOMBSTONES)
        if not self._exists(path):
            return False
        of_table = F.col(apply.TABLE_ID) == apply.table_id_of(database, schema, table)
        return not self.spark.read.format("delta").load(path).where(of_table & (F.col(apply.ROW_KEY) != "")).isEmpty()

    def recorded_ordering(self, database: str | None, schema: str | None, table: str) -> str | None:
        """The ordering an existing lake table's rows were written with (:data:`SEQUENCE_BY_PROPERTY`), or None when
        the table is missing or does not record it (``cdclake check``; a run changes a recorded ordering only while
        the table holds no orders, :meth:`ordering_conflict`)."""
        path = self.table_path(database, schema, table)
        if path in self._recorded_ordering:
            return self._recorded_ordering[path]
        if self.columns(database, schema, table) is None:
            return None
        return self._properties(path).get(SEQUENCE_BY_PROPERTY)

    def _leave_to_first_write(self, path: str, plan: TablePlan) -> list[tuple[str, str]]:
        """Leaves the missing table at ``path`` to its first :meth:`merge` (``ensure_table``'s ``defer_creation``);
        returns the plan's columns, their types in Spark's canonical spelling (as a created table reports them)."""
        self._awaiting_creation.add(path)
        return [(name, _parse_datatype_string(spark_type).simpleString()) for name, spark_type in plan.columns]

    def _creation_properties(self, plan: TablePlan, partitioning: Partitioning = ()) -> dict[str, str]:
        """The table properties of a lake table cdclake creates for ``plan``, partitioned by ``partitioning``."""
        return {
            **TABLE_PROPERTIES,
            **self.user_properties(plan),
            **source_properties(plan),
            SEQUENCE_BY_PROPERTY: ordering_of(plan),
            # MERGE prunes files by key; statistics on every column cost ~40% of a small MERGE for nothing.
            "delta.dataSkippingStatsColumns": ",".join(self._stats_columns(plan, partitioning)),
            ENABLE_DELETION_VECTORS: self.deletion_vectors_at_creation,
        }

    def creation_partitioning(self, plan: TablePlan, columns: Sequence[tuple[str, str]]) -> Partitioning:
        """The partitioning that the ``partition_by`` setting gives the lake table cdclake creates for ``plan``'s
        source table with user ``columns`` (name, Spark type), each column spelt as the table spells it. A field whose
        column the table lacks, or whose transform does not apply to the column's type, is left out with a warning
        (``cdclake check`` names them before a run): the table is still created, and its rows land."""
        wanted = self.partition_by.value_for(plan.database, plan.schema, plan.table) or ()
        usable, problems = self._creation_fields(wanted, columns)
        if problems:
            log.warning(
                "%s: partition_by gives %s; the table is created without the fields it cannot have: %s",
                self.table_path(plan.database, plan.schema, plan.table),
                described(wanted),
                "; ".join(problems),
            )
        return usable

    def _creation_fields(
        self, wanted: Partitioning, columns: Sequence[tuple[str, str]]
    ) -> tuple[Partitioning, list[str]]:
        """The fields of ``wanted`` that a table of ``columns`` can have (spelt as it spells them), and why the others
        cannot be (:meth:`creation_partitioning`)."""
        if not wanted:
            return (), []
        names = [name for name, _ in columns]
        problems = [f"no column {name}" for name in missing_columns(wanted, names)]
        types = {name.lower(): _parse_datatype_string(spark_type).simpleString() for name, spark_type in columns}
        usable, unfit = fitting(on_columns(wanted, names), types, self.TABLE_FORMAT)
        return usable, problems + unfit

    def partitioning(self, database: str | None, schema: str | None, table: str) -> Partitioning:
        """The partition fields of an existing lake table (none for an unpartitioned one)."""
        return self._partitioning(self.table_path(database, schema, table))

    def folder_columns(self, plan: TablePlan, columns: Sequence[tuple[str, str]]) -> list[str]:
        """The string columns whose values name folders of the plan's lake table (with user ``columns``): its
        identity partition fields, as the table has them, or as cdclake will create it. One value too long for a
        folder name (:meth:`partition_folder_bytes`) fails the write of the whole batch, so the pipeline makes its
        event a dead letter. Only tables that ``partition_by`` names are looked at (every table a run partitions,
        unless its owner partitioned one by hand). A table that does not exist (``cdclake check``) is taken as it
        would be created."""
        wanted = self.partition_by.value_for(plan.database, plan.schema, plan.table)
        if not wanted:
            return []
        if self.awaits_creation(plan) or self.columns(plan.database, plan.schema, plan.table) is None:
            if not self._names_folders_at_creation(columns):
                return []
            fields = self._creation_fields(wanted, columns)[0]
        else:
            fields = self._folder_partitioning(self.table_path(plan.database, plan.schema, plan.table))
        types = {name.lower(): spark_type for name, spark_type in columns}
        return [f.column for f in fields if f.transform == "identity" and types.get(f.column.lower()) == "string"]

    def _names_folders_at_creation(self, columns: Sequence[tuple[str, str]]) -> bool:
        """Whether a table created with user ``columns`` names its folders after partition values: not when it is
        created column-mapped (:meth:`_folder_partitioning`)."""
        return not needs_column_mapping(name for name, _ in columns)

    def _folder_partitioning(self, path: str) -> Partitioning:
        """The partition fields of the table at ``path`` whose values name its folders, as the session last saw it
        (Delta's cached snapshot, which this sink's commits and every MERGE's own read keep current): a few JVM
        calls, where :meth:`_partitioning` (``DESCRIBE DETAIL``) builds the table's state, 0.5-0.7 s after each
        commit. None for a column-mapped table: Delta writes its files under random two-character folders, whatever
        the partition values (``delta.columnMapping.mode``; a partition value of 300 bytes lands there)."""

        def folder_fields(metadata: Any) -> Partitioning:
            mode = metadata.configuration().get(COLUMN_MAPPING_MODE)
            if mode.isDefined() and mode.get() != "none":
                return ()
            columns = metadata.partitionColumns()
            return tuple(PartitionField(columns.apply(i)) for i in range(columns.size()))

        fields = self._from_cached_metadata(path, folder_fields)
        if fields is not None:
            return fields
        # Delta's internal API changed: the public one then.
        if self._properties(path).get(COLUMN_MAPPING_MODE, "none") != "none":
            return ()
        return self._partitioning(path)

    def _from_cached_metadata(self, path: str, read: Callable[[Any], Result]) -> Result | None:
        """``read`` of the metadata (JVM ``Metadata``) of the Delta table at ``path`` as the session last saw it
        (Delta's cached snapshot, no I/O); None when Delta's internal API, which another Delta release may change,
        is not there."""
        jvm = self.spark._jvm
        assert jvm is not None
        try:
            delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self.spark._jsparkSession, path)
            return read(delta_log.unsafeVolatileSnapshot().metadata())
        except Py4JError:
            return None

    def partition_folder_bytes(self, column: str, value: Column) -> Column:
        """The length in bytes of the folder name ``column=value`` of a partition, as Delta (Spark's
        ``ExternalCatalogUtils.escapePathName``) writes it: these characters become ``%XX``, the rest stay UTF-8."""
        name = _FOLDER_ESCAPED.sub("%XX", column)
        return F.lit(len(name.encode("utf-8")) + 1) + F.octet_length(
            F.regexp_replace(value, _FOLDER_ESCAPED.pattern, "%XX")
        )

    def _partitioning(self, path: str) -> Partitioning:
        row = DeltaTable.forPath(self.spark, path).detail().select("partitionColumns").first()
        return tuple(PartitionField(name) for name in (row[0] if row is not None else None) or [])

    def awaits_creation(self, plan: TablePlan) -> bool:
        """Whether ``ensure_table(plan, defer_creation=True)`` left the plan's table to its first :meth:`merge`."""
        return self.table_path(plan.database, plan.schema, plan.table) in self._awaiting_creation

    # ---------------------------------------------------------------------------------------------------------
    # Schema changes (validated changes from cdclake.ddl / type reconciliation; never DDL text from a message)

    def columns(self, database: str | None, schema: str | None, table: str) -> list[tuple[str, str]] | None:
        """The (name, type) user columns of a lake table, or ``None`` if it does not exist."""
        path = self.table_path(database, schema, table)
        if path in self._columns:
            return self._columns[path]
        if not self._exists(path):
            return None
        return self._remember_columns(path, DeltaTable.forPath(self.spark, path).toDF().schema.fields)

    def _remember_columns(self, path: str, fields: Sequence[StructField]) -> list[tuple[str, str]]:
        """Keeps the user columns of the table at ``path`` (its schema's ``fields``), and what they declare (NOT
        NULL, ``varchar(n)``) for :meth:`check_constraints`, until the sink changes the table; returns the user
        columns."""
        meta = {name for name, _ in METADATA_COLUMNS}
        self._columns[path] = [(f.name, f.dataType.simpleString()) for f in fields if f.name not in meta]
        self._computed[path] = self._computed_columns(path)
        self._defaults[path] = {
            f.name: str(f.metadata[DEFAULT_METADATA])
            for f in fields
            if f.name not in meta and f.metadata.get(DEFAULT_METADATA) is not None
        }
        # A computed column's NOT NULL holds by its own values, which no image has.
        self._declared_checks[path] = declared_checks(StructType(list(fields)), meta | self._computed[path])
        return self._columns[path]

    def _stored_fields(self, path: str) -> list[dict[str, Any]] | None:
        """The fields of the schema of the Delta table at ``path`` as Delta stores them (JSON objects: ``name``,
        ``nullable``, ``metadata`` with what a DataFrame's schema drops, such as generation expressions), from its
        cached snapshot (:meth:`_from_cached_metadata`); None when that cannot be read."""
        fields: list[dict[str, Any]] | None = self._from_cached_metadata(
            path, lambda metadata: json.loads(metadata.schema().json())["fields"]
        )
        return fields

    def _computed_columns(self, path: str) -> frozenset[str]:
        """The columns of the table at ``path`` whose values Delta computes: generated columns (``GENERATED ALWAYS
        AS (expr)``) and identity columns. Only a table made by hand has them. A MERGE that sets one fails whole
        (DELTA_IDENTITY_COLUMNS_UPDATE_NOT_SUPPORTED; a generated column's value must be its expression's, and one
        the source lacks would be NULL), so cdclake's MERGEs leave them to Delta (:func:`merge_statement`). Read from
        Delta's snapshot: a DataFrame's schema does not carry this metadata."""
        fields = self._stored_fields(path)
        if fields is None:
            log.warning("%s: cannot read which columns Delta computes; cdclake's MERGEs set every column", path)
            return frozenset()
        return frozenset(f["name"] for f in fields if set(f.get("metadata") or {}) & set(_COMPUTED_METADATA))

    def column_defaults(self, database: str | None, schema: str | None, table: str) -> dict[str, str]:
        """The user columns of a lake table that have a DEFAULT, with its expression (name -> Spark SQL text), as the
        sink last read the table's columns. Only a table made by hand has them (``ingested_at TIMESTAMP DEFAULT
        current_timestamp()``, ``tenant STRING DEFAULT 'acme'``): a row whose image lacks such a column (the source
        table has none) takes the DEFAULT when inserted and keeps its value when updated (:func:`merge_statement`),
        where writing the image as it is would leave NULL."""
        return self._defaults.get(self.table_path(database, schema, table), {})

    def rewrite_loses(self, database: str | None, schema: str | None, table: str) -> list[str]:
        """What the owner of a lake table (made by hand) declared on its columns that :meth:`rewrite` would not keep,
        described: a rewrite writes the rows as a DataFrame, and Delta writes its columns nullable, without generation
        expressions, and refuses an identity column's values (DELTA_IDENTITY_COLUMNS_EXPLICIT_INSERT_NOT_SUPPORTED).
        A DEFAULT is kept (the DataFrame's schema carries it), so are CHECK constraints (table properties). Tables
        cdclake creates declare none of these."""
        path = self.table_path(database, schema, table)
        fields = self._stored_fields(path)
        meta = {name for name, _ in METADATA_COLUMNS}
        lost = []
        for field_ in fields or []:
            name, metadata = field_["name"], field_.get("metadata") or {}
            if name in meta:
                continue
            if _IDENTITY_METADATA in metadata:
                lost.append(f"identity column {name}")
            elif _GENERATION_METADATA in metadata:
                lost.append(f"generated column {name} AS ({metadata[_GENERATION_METADATA]})")
            elif not field_.get("nullable", True):
                lost.append(f"NOT NULL of column {name}")
        return lost

    def column_has_values(self, database: str | None, schema: str | None, table: str, column: str) -> bool:
        """Whether any live row has a non-NULL value in ``column``."""
        frame = self.spark.read.format("delta").load(self.table_path(database, schema, table))
        return not frame.where(F.col(quote(column)).isNotNull()).isEmpty()

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
        """Rewrites a table with new user columns (``name``, expression over the current row), keeping cdclake's
        columns and the table's partitioning (a ``renamed`` column's fields, old -> new name, under its new name; a
        dropped column's fields left out): the one way to drop, rename or retype a column that every Delta reader
        understands (no column mapping or type-widening table features). Costs a full rewrite; schema changes are
        rare."""
        path = self.table_path(database, schema, table)
        current = self._partitioning(path)
        partitioning = on_columns(current, [name for name, _ in columns], renamed)

        def save() -> None:
            # Read anew on every attempt: after a conflict, the rows are the other writer's.
            rows = rewritten_rows(self.spark.read.format("delta").load(path), columns)
            writer = _partitioned(rows.write.format("delta").mode("overwrite"), partitioning)
            writer = writer.option("overwriteSchema", "true")
            if txn is not None:
                writer = writer.option("txnAppId", txn.app_id).option("txnVersion", txn.version)
            writer.save(path)

        new_schema = rewritten_rows(self.spark.read.format("delta").load(path), columns).schema
        self.allow_columns(path, new_schema)
        self._unlist_statistics_of_changed(database, schema, table, new_schema, current)
        self._committing(path, "rewrite", save)
        self._columns.pop(path, None)
        if key_columns is not None:
            rewritten = self.columns(database, schema, table) or []
            names = {name.lower() for name, _ in rewritten}
            keys = [k for k in key_columns if k.lower() in names]
            self._set_statistics_columns(path, rewritten, keys, partitioning, record_keys=True)

    def _unlist_statistics_of_changed(
        self,
        database: str | None,
        schema: str | None,
        table: str,
        new_schema: StructType,
        partitioning: Partitioning,
    ) -> None:
        """Takes the columns that a rewrite drops, renames, or gives a type without min/max statistics (e.g. string
        -> binary) out of ``delta.dataSkippingStatsColumns`` first: Delta refuses to write a table whose list names a
        column it does not have (DELTA_COLUMN_NOT_FOUND_IN_SCHEMA; a table without key columns lists them all) or a
        column of such a type (DELTA_COLUMN_DATA_SKIPPING_NOT_SUPPORTED_TYPE). The rewrite then sets the list for
        its new columns."""
        new_types = {f.name.lower(): f.dataType.simpleString() for f in new_schema.fields}
        stored = self.columns(database, schema, table) or []
        losing = {
            name.lower()
            for name, spark_type in stored
            if _has_statistics(spark_type)
            and (name.lower() not in new_types or not _has_statistics(new_types[name.lower()]))
        }
        if not losing:
            return
        kept = [(name, spark_type) for name, spark_type in stored if name.lower() not in losing]
        keys = [k for k in self.key_columns(database, schema, table) if k.lower() not in losing]
        path = self.table_path(database, schema, table)
        self._set_statistics_columns(path, kept, keys, partitioning, record_keys=False)

    def _set_statistics_columns(
        self,
        path: str,
        columns: Sequence[tuple[str, str]],
        keys: Sequence[str],
        partitioning: Partitioning,
        *,
        record_keys: bool,
    ) -> None:
        """Sets ``delta.dataSkippingStatsColumns`` for ``columns`` of a table partitioned by ``partitioning`` (see
        :func:`_stats_columns`) and, with ``record_keys``, the recorded key columns (``cdclake.keyColumns``)."""
        listed = ",".join(_stats_columns(columns, keys, partitioning))
        properties = [f"'delta.dataSkippingStatsColumns' = {sql_string(listed)}"]
        if record_keys:
            properties.insert(0, f"{sql_string(KEY_COLUMNS_PROPERTY)} = {sql_string(','.join(keys))}")
        self.spark.sql(f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES ({', '.join(properties)})")

    def widen_in_place(
        self, database: str | None, schema: str | None, table: str, changes: Mapping[str, str]
    ) -> dict[str, str]:
        """Widens the columns of ``changes`` (name -> wider type, each a :func:`cdclake.ddl.widened` change) without
        rewriting the table's files where the table format lets every reader of the table read its stored values as
        the new type; returns the changes made. The caller rewrites the table for the others."""
        path = self.table_path(database, schema, table)
        done = self.widen_path_in_place(path, {(name,): wanted for name, wanted in changes.items()})
        if done:
            self._columns.pop(path, None)
        return {column[0]: wanted for column, wanted in done.items()}

    def widen_path_in_place(
        self, path: str, changes: Mapping[ColumnPath, str], *, like: str | None = None
    ) -> dict[ColumnPath, str]:
        """``widen_in_place`` of the table at ``path``, for top-level columns and fields of struct columns (a column
        path -> its wider type). A Delta table whose owner enabled type widening (``delta.enableTypeWidening``,
        e.g. by ``table_properties``) records the new type in its log, one commit per column, and its readers
        convert the values of older files as they read them (Delta 3.2 or later reads such a table). Without it
        every change is left to the rewrite, which any reader reads. Delta refuses to retype a column that a CHECK
        constraint or a generated column reads: that one is rewritten too.

        ``like``: the table whose choice this one follows (a history table its lake table's): when that one has type
        widening and this one has not, this one gets it first (one commit)."""
        if not changes:
            return {}
        if not self._type_widening(path):
            if like is None or not self._type_widening(like):
                return {}
            self._set_properties(path, {TYPE_WIDENING_PROPERTY: "true"})
        return self._alter_column_types(f"delta.{quote(path)}", changes)

    def _alter_column_types(self, table: str, changes: Mapping[ColumnPath, str]) -> dict[ColumnPath, str]:
        """``ALTER TABLE table ALTER COLUMN ... TYPE ...`` for each of ``changes`` (column path -> type); returns the
        changes made. One the table format refuses (before any commit) is left out: the caller's rewrite makes it."""
        done: dict[ColumnPath, str] = {}
        for column, wanted in changes.items():
            # The type is rendered by Spark from its parse, and the names are quoted: nothing of a message is run.
            rendered = _parse_datatype_string(wanted).simpleString()
            named = ".".join(quote(part) for part in column)
            try:
                self.spark.sql(f"ALTER TABLE {table} ALTER COLUMN {named} TYPE {rendered}")
            except (CapturedException, Py4JJavaError) as exc:
                log.info("%s: column %s not widened in place (%s); the table is rewritten", table, named, exc)
                continue
            done[column] = wanted
        return done

    def _type_widening(self, path: str) -> bool:
        """Whether there is a Delta table at ``path`` with type widening enabled."""
        return self._exists(path) and self._properties(path).get(TYPE_WIDENING_PROPERTY, "").strip().lower() == "true"

    @staticmethod
    def stored_type(spark_type: str) -> str:
        """The type a lake table column declared as ``spark_type`` has (Delta keeps every type as declared)."""
        return spark_type

    def check_constraints(self, database: str | None, schema: str | None, table: str) -> dict[str, str]:
        """The CHECK constraints of a lake table (name -> Spark SQL condition; ``cdclake.constraints``), read anew on
        every call: the lake's owner adds and drops them with ``ALTER TABLE ... ADD/DROP CONSTRAINT`` at any time.
        Delta keeps them as ``delta.constraints.<name>`` table properties. What its columns declare too (NOT NULL,
        ``varchar(n)``: :func:`~cdclake.constraints.declared_checks`), as the sink last read its schema with its
        columns (Delta cannot make a column NOT NULL or shorter later; a column its owner relaxes still refuses such
        values in this process until the sink reads the schema again, and the dead letters replay)."""
        path = self.table_path(database, schema, table)
        rows = self.spark.sql(f"SHOW TBLPROPERTIES delta.{quote(path)}").collect()
        prefix = "delta.constraints."
        checks = {row["key"][len(prefix) :]: row["value"] for row in rows if row["key"].startswith(prefix)}
        return {**checks, **self._declared_checks.get(path, {})}

    def rows_written(
        self, plan: TablePlan, table_columns: Sequence[tuple[str, str]], changes: DataFrame, carried: Sequence[str]
    ) -> DataFrame:
        """The rows that :meth:`merge` of ``changes`` (one table's folded, gated changes) would write into the lake
        table, with every column of the table (cdclake's own too) and the ``carried`` columns of ``changes``
        (:func:`written_rows`). Nothing is written."""
        path = self.table_path(plan.database, plan.schema, plan.table)
        computed = self._computed.get(path, frozenset())
        statement = merge_statement(
            plan, table_columns, changes, self._shuffle_partitions(), path, carried, computed, self._defaults.get(path)
        )
        target = self.read(plan.database, plan.table, plan.schema)
        return written_rows(statement, target, target.columns, carried)

    def key_columns(self, database: str | None, schema: str | None, table: str) -> list[str]:
        """The key columns recorded when cdclake created the table."""
        recorded = self._properties(self.table_path(database, schema, table)).get(KEY_COLUMNS_PROPERTY, "")
        return [k for k in recorded.split(",") if k]

    def copy_rows(
        self,
        source: tuple[str | None, str | None, str],
        target: tuple[str | None, str | None, str],
        txn: Txn | None,
    ) -> None:
        """Replaces the rows of ``target`` with those of ``source`` (a renamed table), once per ``txn``."""
        rows = self.in_recorded_order(self.spark.read.format("delta").load(self.table_path(*source)), source, target)
        target_path = self.table_path(*target)
        # The target keeps its partitioning (created for the new name: ensure_table).
        kept = on_columns(self._partitioning(target_path), rows.columns)
        self.allow_columns(target_path, rows.schema)
        writer = _partitioned(rows.write.format("delta").mode("overwrite"), kept).option("overwriteSchema", "true")
        if txn is not None:
            writer = writer.option("txnAppId", txn.app_id).option("txnVersion", txn.version)
        self._committing(target_path, "copy", lambda: writer.save(target_path))
        self._columns.pop(target_path, None)

    def in_recorded_order(
        self,
        rows: DataFrame,
        source: tuple[str | None, str | None, str],
        target: tuple[str | None, str | None, str],
    ) -> DataFrame:
        """``rows`` of the lake table ``source`` with their orders in the ordering ``target`` records
        (:data:`SEQUENCE_BY_PROPERTY`; :func:`cdclake.apply.reordered`), for :meth:`copy_rows`: they are all it
        holds from then on. As they were when either table does not record one, or both record the same."""
        moved_from, into = self.recorded_ordering(*source), self.recorded_ordering(*target)
        if moved_from is None or into is None or moved_from == into:
            return rows
        log.info(
            "the rows of %s move into %s, whose rows are ordered by %s, not by %s: their orders are converted",
            ".".join(p for p in source if p),
            ".".join(p for p in target if p),
            f"column {into}" if into else "the format's position",
            f"column {moved_from}" if moved_from else "the format's position",
        )
        columns = [(f.name, f.dataType.simpleString()) for f in rows.schema.fields]
        order = apply.reordered(F.col(POSITION_COLUMN), into, columns, lambda name: F.col(quote(name)))
        return rows.withColumn(POSITION_COLUMN, order)

    def clear(self, plan: TablePlan, txn: Txn | None) -> None:
        """Deletes every row written before ``plan.truncate_order`` and remembers it (a dropped or truncated table):
        events older than that order never bring rows back."""
        if self._exists(self.table_path(plan.database, plan.schema, plan.table)):
            self.truncate(plan, txn)
        self._remember_cleared(plan, txn)

    def _remember_cleared(self, plan: TablePlan, txn: Txn | None) -> None:
        """Records the tombstone of a table cleared at ``plan.truncate_order``."""
        empty = local_frame(
            self.spark,
            [],
            f"{apply.TABLE_ID} string, {apply.ROW_KEY} string, {apply.KIND} string, {apply.ORDER} string, "
            f"{model.EVENT_TIME} timestamp",
        )
        self.record_tombstones(empty, [plan], None if txn is None else Txn(f"{txn.app_id}/cleared", txn.version))

    def _add_columns(self, path: str, columns: Sequence[tuple[str, str]]) -> None:
        # Identifiers are validated (decoder or cdclake.ddl) and quoted here; the statement is built, never taken
        # from a message.
        listed = ", ".join(f"{quote(name)} {t}" for name, t in columns)
        self.allow_columns(path, StructType([StructField(n, _parse_datatype_string(t)) for n, t in columns]))
        try:
            self.spark.sql(f"ALTER TABLE delta.{quote(path)} ADD COLUMNS ({listed})")
        except AnalysisException as exc:  # a concurrent run added them first
            if "already exists" not in str(exc):
                raise
        self._columns.pop(path, None)

    def add_columns(
        self, database: str | None, schema: str | None, table: str, columns: Sequence[tuple[str, str]]
    ) -> None:
        """Adds columns (name, Spark type) to an existing table."""
        self._add_columns(self.table_path(database, schema, table), columns)

    @staticmethod
    def _stats_columns(plan: TablePlan, partitioning: Partitioning = ()) -> list[str]:
        """Key columns with min/max statistics (Delta keeps none for binary or boolean), plus the position. A table
        without key columns is matched on every column, so it keeps statistics on all of them (up to Delta's limit
        of 32 indexed columns). Partition columns have none (:func:`_stats_columns`)."""
        return _stats_columns(plan.columns, plan.key_columns, partitioning)

    def truncate(self, plan: TablePlan, txn: Txn | None) -> None:
        """Deletes every row the log wrote before the plan's TRUNCATE (:meth:`rows_ordered_by_column`)."""
        assert plan.truncate_order is not None
        path = self.table_path(plan.database, plan.schema, plan.table)
        marker = None if txn is None else Txn(f"{txn.app_id}/truncate", txn.version)
        condition = self.truncated_by(plan)
        with self.idempotent(marker):
            self._committing(path, "DELETE", lambda: self._delete_where(path, condition))

    def truncated_by(self, plan: TablePlan) -> Column:
        """Whether a stored row of ``plan``'s lake table (as :meth:`read` gives it) is one the plan's TRUNCATE
        deletes: written before it by the log part of its order."""
        assert plan.truncate_order is not None
        position = F.col(POSITION_COLUMN)
        return (apply.log_order(position) if self.rows_ordered_by_column(plan) else position) < F.lit(
            plan.truncate_order
        )

    def rows_ordered_by_column(self, plan: TablePlan) -> bool:
        """Whether the stored rows of ``plan``'s lake table may hold ``value|position`` orders, whose log part a
        TRUNCATE compares (``TablePlan.ordered_by_column``): when ``sequence_by`` orders the table by a column, or
        when its rows were written so (:meth:`ordering_conflict`: its row changes are refused, its truncates not)."""
        recorded = self._recorded_ordering.get(self.table_path(plan.database, plan.schema, plan.table))
        return plan.ordered_by_column or bool(recorded)

    def _delete_where(self, path: str, condition: Column) -> None:
        """One attempt at deleting the rows of the table at ``path`` that meet ``condition``: one commit."""
        DeltaTable.forPath(self.spark, path).delete(condition)

    @contextmanager
    def merging(self, tables: int, concurrency: int) -> Iterator[None]:
        """Session settings for one batch's MERGEs of ``tables`` tables, ``concurrency`` at a time; restored after.

        * Shuffle partitions are divided among the concurrent MERGEs: each MERGE's join and file writes use
          ``partitions // min(tables, concurrency)`` (at least 1), so many small tables at once do not each pay for
          as many tasks, and write as many files, as the cores can run (the cores are busy with the other MERGEs),
          while a batch of one table keeps them all.
        * No source materialisation: Delta copies a MERGE source it cannot prove deterministic before its two passes
          over it. The pipeline's MERGE sources are local checkpoints, computed once and never recomputed (a lost
          block fails the batch, which is then re-run), so the copy is pure cost: a Spark job per table. Delta
          refuses an uncopied source whose plan holds cached data, so a source must be checkpointed, not persisted.
        * :data:`NO_CONSTRAINT_PROPAGATION`.
        """
        share = max(1, self._shuffle_partitions() // max(1, min(tables, concurrency)))
        with session_settings(
            self.spark,
            {
                "spark.sql.shuffle.partitions": str(share),
                "spark.databricks.delta.merge.materializeSource": "none",
                **NO_CONSTRAINT_PROPAGATION,
            },
        ):
            yield

    def _shuffle_partitions(self) -> int:
        return int(self.spark.conf.get("spark.sql.shuffle.partitions") or "200")

    def merge(self, plan: TablePlan, table_columns: Sequence[tuple[str, str]], changes: DataFrame) -> None:
        """One MERGE of the folded, gated changes of one table, guarded by each row's recorded order.

        Run it inside :meth:`idempotent` so that a re-run of the batch skips it. Several tables' merges of one batch
        may run concurrently inside the same block: they share the batch's marker, one commit per table.
        """
        path = self.table_path(plan.database, plan.schema, plan.table)
        computed = self._computed.get(path, frozenset())
        statement = merge_statement(
            plan, table_columns, changes, self._shuffle_partitions(), path, (), computed, self._defaults.get(path)
        )
        if self._created_by_first_write(path, plan, table_columns, statement):
            return
        if self.rewrites_whole(path):
            self.merge_rows(path, statement, whole=True)
            self.merged(path)
            return
        condition = F.expr(statement.matched_on)
        if self.key_ranges_pay(path):
            index_of = {name.lower(): i for i, (name, _) in enumerate(table_columns)}
            pruned = [(k, index_of[k.lower()]) for k in _pruned_columns(table_columns, plan.key_columns)]
            ranged = [(k, i, table_columns[i][1]) for k, i in pruned if _has_ordered_literals(table_columns[i][1])]
            for within in _key_ranges(statement.source, ranged):
                condition = condition & within
        self.merge_rows(path, statement, condition)
        self.merged(path)

    def _created_by_first_write(
        self, path: str, plan: TablePlan, table_columns: Sequence[tuple[str, str]], statement: MergeStatement
    ) -> bool:
        """For a table left to its first write (:meth:`awaits_creation`): creates it with the rows ``statement``
        would insert (:meth:`_create_with_rows`), and True. False when the table is not waiting, or when another
        writer has created it meanwhile (then with its columns and this plan's: the rows go in by a MERGE)."""
        if path not in self._awaiting_creation:
            return False
        self._awaiting_creation.remove(path)
        if self._create_with_rows(path, plan, table_columns, statement):
            self.merged(path)
            return True
        self.ensure_table(plan)
        return False

    def _create_with_rows(
        self, path: str, plan: TablePlan, table_columns: Sequence[tuple[str, str]], statement: MergeStatement
    ) -> bool:
        """Creates the table at ``path`` with the rows that ``statement`` would insert into it, empty: one commit
        (``CREATE TABLE ... AS SELECT``, with the enclosing :meth:`idempotent` block's marker), instead of a creation
        and a MERGE. False, having changed nothing, when the table exists by then (another writer created it).

        Measured on 2 cores, warm, 200 rows (python -m benchmarks.first_write): created and then MERGEd into,
        2.99 s; created with its rows, 1.73 s (2.20 s and 1.06 s since optimized writes). Version 0 is written only
        if absent, so two writers that both find the table missing cannot both create it: the second sees a conflict
        and MERGEs instead. (A plain append after an empty creation would not do: a concurrent MERGE of the same key
        would not conflict with it.)
        """
        stored = [(name, self.stored_type(spark_type)) for name, spark_type in table_columns]
        schema = StructType(
            [StructField(name, _parse_datatype_string(spark_type)) for name, spark_type in [*stored, *METADATA_COLUMNS]]
        )
        partitioning = self.creation_partitioning(plan, stored)
        rows, properties = inserted_rows(statement, schema), self._creation_properties(plan, partitioning)
        if not self.create_with_rows(path, rows, properties, partitioning):
            return False
        self._columns[path] = stored
        self._source_properties_checked.add(path)
        self._recorded_ordering[path] = ordering_of(plan)
        return True

    def create_with_rows(
        self, path: str, rows: DataFrame, properties: Mapping[str, str], partitioning: Partitioning = ()
    ) -> bool:
        """Creates the table at ``path`` holding ``rows``, with ``properties`` and ``partitioning``: one commit,
        marked with the enclosing :meth:`idempotent` block's marker. False, having changed nothing, when the table
        exists by then."""
        marker = self._marker_options()
        properties = column_mapped(properties, rows.schema)
        writer = rows.writeTo(f"delta.{quote(path)}").using("delta").options(**marker)
        for name, value in properties.items():
            writer = writer.tableProperty(name, value)
        try:
            partitioned(writer, partitioning).create()
        except (Py4JJavaError, CapturedException) as exc:
            if self._conflict_name(exc, jvm_causes(exc)) is None and not _already_exists(exc):
                raise
            if self._exists(path):
                log.info("%s was created by another writer meanwhile: its rows go in by a MERGE", path)
                return False
            self._create_beside_leftovers(path, rows, properties, marker, partitioning)
        return True

    def _marker_options(self) -> dict[str, str]:
        """The marker of the enclosing :meth:`idempotent` block as options of a DataFrame write (as :meth:`append`
        gives its own), which Delta then skips if the table has it; none outside such a block."""
        app_id = self.spark.conf.get(TXN_APP_ID, None)
        return {"txnAppId": app_id, "txnVersion": str(self.spark.conf.get(TXN_VERSION))} if app_id else {}

    def _create_beside_leftovers(
        self,
        path: str,
        rows: DataFrame,
        properties: Mapping[str, str],
        marker: Mapping[str, str],
        partitioning: Partitioning,
    ) -> None:
        """Creates the table at ``path`` with ``rows`` where files but no Delta table are: a creation with rows that
        was killed before its commit left its data files, and Spark's catalog then holds the path for a table that
        exists (``TABLE_OR_VIEW_ALREADY_EXISTS``). Delta's path writer does not look at files no commit lists, so
        it creates the table there; it takes only ``delta.*`` properties, so cdclake's own follow in a second commit
        (if the process is killed before it, the next run's :meth:`ensure_table` adds them). Deleting the files
        instead would not be safe: they may be another writer's, about to commit."""
        log.warning("%s holds files but no Delta table (a write killed before its commit): created beside them", path)
        delta_properties = {k: v for k, v in properties.items() if k.startswith("delta.")}
        writer = rows.write.format("delta").mode("errorifexists").options(**delta_properties, **marker)
        _partitioned(writer, partitioning).save(path)
        self._set_properties(path, {k: v for k, v in properties.items() if k not in delta_properties})

    def merge_rows(
        self, path: str, statement: MergeStatement, matched_on: Column | None = None, *, whole: bool = False
    ) -> None:
        """Executes ``statement`` on the table at ``path`` (``matched_on`` instead of the statement's own, if given),
        again when another writer's commit conflicts with it (:attr:`CONFLICT_ATTEMPTS`). ``whole``: by a rewrite of
        the table's rows (:meth:`rewrites_whole`) where the statement allows one (:func:`rows_after`)."""

        def execute() -> None:
            if not (whole and self._rewrite_whole(path, statement)):
                self._execute_merge(path, statement, matched_on)

        try:
            self._committing(path, "MERGE", execute)
        except (Py4JJavaError, CapturedException) as exc:
            violated = next(
                (c for c in jvm_causes(exc) if c.getClass().getSimpleName() == "DeltaInvariantViolationException"),
                None,
            )
            if violated is None:
                raise
            # Delta's own message names the constraint and the row's values.
            delta_message = " ".join(str(violated.getMessage()).split())
            raise ConstraintViolationError(
                f"MERGE into {path} failed: {delta_message} (cdclake checks a lake table's CHECK constraints before "
                "the MERGE, but not a condition Spark does not accept over the table's rows, nor one added during the "
                "batch: correct the row at the source or change the constraint, then restart)"
            ) from exc

    def _committing(self, path: str, operation: str, commit: Callable[[], None]) -> None:
        """Runs ``commit``, one Delta commit to the table at ``path``; again when Delta refuses it because another
        writer committed to the table meanwhile (an OPTIMIZE, a DELETE by hand, ``cdclake dlq replay`` beside
        ``run``), up to :attr:`CONFLICT_ATTEMPTS` times. A refused commit changed nothing: the operation runs again
        on the table as the other writer left it (a MERGE's position guard keeps that writer's newer rows)."""
        for attempt in range(1, self.CONFLICT_ATTEMPTS + 1):
            try:
                commit()
                return
            except (Py4JJavaError, CapturedException) as exc:
                conflict = self._conflict_name(exc, jvm_causes(exc))
                if conflict is None or attempt == self.CONFLICT_ATTEMPTS:
                    raise
                log.warning(
                    "%s of %s met a concurrent commit (%s); attempt %d of %d",
                    operation,
                    path,
                    conflict,
                    attempt + 1,
                    self.CONFLICT_ATTEMPTS,
                )
                self.conflicts_retried += 1
                time.sleep(min(0.5 * 2**attempt, 8.0))

    @staticmethod
    def _conflict_name(error: Exception, causes: Sequence[Any]) -> str | None:
        """The name of Delta's conflict with a concurrent commit that ``error`` is (the transaction committed nothing
        and may run again), or None. Delta's Python package raises its own classes for them; a JVM error that reaches
        Python unconverted is one when it extends ``java.util.ConcurrentModificationException``, as they all do."""
        if isinstance(error, _CONFLICTS):
            return type(error).__name__
        for cause in causes:
            cls = cause.getClass()
            while cls is not None:
                if str(cls.getName()) == "java.util.ConcurrentModificationException":
                    return str(cause.getClass().getSimpleName())
                cls = cls.getSuperclass()
        return None

    def _execute_merge(self, path: str, statement: MergeStatement, matched_on: Column | None) -> None:
        builder = (
            DeltaTable.forPath(self.spark, path)
            .alias("t")
            .merge(statement.source.alias("s"), statement.matched_on if matched_on is None else matched_on)
        )
        if statement.delete_when is not None:
            builder = builder.whenMatchedDelete(condition=statement.delete_when)
        if statement.update_when is not None:
            builder = builder.whenMatchedUpdate(condition=statement.update_when, set=dict(statement.update_set))
        values: dict[str, str | Column] = dict(statement.insert_values)
        if statement.insert_when is None:
            builder = builder.whenNotMatchedInsert(values=values)
        else:
            builder = builder.whenNotMatchedInsert(condition=statement.insert_when, values=values)
        builder.execute()

    def rewrites_whole(self, path: str) -> bool:
        """Whether the table at ``path`` takes a batch's changes by a rewrite of its rows (:meth:`_rewrite_whole`)
        instead of a MERGE: when its files hold fewer than :attr:`REWRITE_MAX_BYTES` (read as :meth:`key_ranges_pay`
        reads them) and it has nothing a rewrite would lose: no deletion vectors, change data feed or row tracking
        (:data:`_RECORDING_FEATURES`, in the table's metadata as the session last saw it) and no computed column."""
        if self._computed.get(path) or path in self._with_deletion_vectors:
            return False
        if self._table_size(path) >= self.REWRITE_MAX_BYTES or self.key_ranges_pay(path):
            return False
        kept_by_merge = self._from_cached_metadata(path, _records_rows)
        return kept_by_merge is False

    def _rewrite_whole(self, path: str, statement: MergeStatement) -> bool:
        """Writes the rows of the table at ``path`` as ``statement`` would leave them (:func:`rows_after`) in place
        of its rows: one commit, marked as the enclosing :meth:`idempotent` block marks a MERGE. False, having done
        nothing, when the statement needs a MERGE.

        Safe beside other writers: Delta reads the table for the write inside the write's own transaction (the
        scan of a table that the active transaction writes goes through that transaction, Delta 4.4
        ``PrepareDeltaScan.getDeltaScanGenerator``, and the commit's ``readVersion`` is the version read), and an
        overwrite reads the whole table, so any commit in between makes it a conflict (:meth:`_committing`).
        ``partitionOverwriteMode`` is static whatever the session says: a dynamic overwrite would keep the
        partitions whose rows were all deleted."""
        rows = rows_after(statement, self.spark.read.format("delta").load(path))
        if rows is None:
            return False
        # One task and one file, as the table is small, instead of a task per partition of the join and Delta's
        # optimized write (a shuffle of its own) bringing the rows together again.
        writer = rows.coalesce(1).write.format("delta").mode("overwrite").option("partitionOverwriteMode", "static")
        writer = writer.option("optimizeWrite", "false").option("userMetadata", REWRITE_METADATA)
        writer.options(**self._marker_options()).save(path)
        return True

    def key_ranges_pay(self, path: str) -> bool:
        """Whether a MERGE into the table at ``path`` gets the key-range conditions (:func:`_key_ranges`): when its
        files hold at least :attr:`KEY_RANGES_MIN_BYTES` (read on the table's first MERGE by this sink, and again
        after one in :attr:`DELETION_VECTORS_CHECK_EVERY` of them, see :meth:`merged`).

        The ranges save reading the key columns of the files outside them. That costs little in a small table,
        while the ranges cost a compilation: Delta's file skipping and the target's filter run with the range's
        bounds as constants in their generated code, and Spark inlines integer, date and timestamp constants, so
        every MERGE of such a table compiles new classes instead of reusing the last batch's.
        """
        return self._table_size(path) >= self.KEY_RANGES_MIN_BYTES

    def _table_size(self, path: str) -> int:
        """The bytes of the files of the table at ``path``, as last read (:meth:`merged` forgets them now and then)."""
        size = self._table_sizes.get(path)
        if size is None:
            size = self._table_sizes[path] = _table_bytes(DeltaTable.forPath(self.spark, path).toDF())
        return size

    # ---------------------------------------------------------------------------------------------------------
    # History tables (cdclake.sinks.history): stored like this sink's lake tables, known by path

    def history_path(self, kind: str, database: str | None, schema: str | None, table: str) -> str:
        """The ``kind`` history table of a source table (see :meth:`history_path_of`)."""
        return self.history_path_of(kind, self.table_path(database, schema, table))

    def history_path_of(self, kind: str, table_path: str) -> str:
        """``<lake>/_cdclake/<kind>/<database>/<table>`` for the lake table at ``table_path``: beside the
        bookkeeping, where no source table can be."""
        return self.system_path(f"{kind}/{table_path.removeprefix(self.lake + '/')}")

    def table_schema(self, path: str) -> StructType | None:
        """The schema of the table at ``path``, or ``None`` if there is none."""
        return DeltaTable.forPath(self.spark, path).toDF().schema if self._exists(path) else None

    def read_path(self, path: str) -> DataFrame:
        return self.spark.read.format("delta").load(path)

    def create_history_table(
        self, path: str, schema: StructType, properties: Mapping[str, str], statistics: Sequence[str]
    ) -> None:
        """Creates the table at ``path`` unless it exists; ``statistics``: the quoted columns to keep min/max
        statistics for (the MERGE conditions and lookups)."""
        builder = DeltaTable.createIfNotExists(self.spark).location(path).addColumns(schema)
        for name, value in column_mapped(self.history_table_properties(properties, statistics), schema).items():
            builder = builder.property(name, value)
        builder.execute()

    def history_table_properties(self, properties: Mapping[str, str], statistics: Sequence[str]) -> dict[str, str]:
        """The table properties of a history table: cdclake's ``properties``, and ``statistics``, the quoted columns
        to keep min/max statistics for."""
        return {
            **TABLE_PROPERTIES,
            **properties,
            "delta.dataSkippingStatsColumns": ",".join(statistics),
            ENABLE_DELETION_VECTORS: self.deletion_vectors_at_creation,
        }

    def allow_columns(self, path: str, schema: StructType) -> None:
        """Prepares the existing table at ``path`` for a write that gives it the columns of ``schema``: one commit each
        for what it lacks, kept by later overwrites (Delta upgrades the table's protocol with them).

        * Column mapping, when their names need it (:func:`needs_column_mapping`) and the table has none yet.
        * Delta's ``timestampNtz`` feature, when a column holds ``timestamp_ntz`` values. Delta gives it by itself to
          a table created with such a column, but refuses to add one to a table without it, by ``ADD COLUMNS`` or by
          an overwrite (``DELTA_FEATURES_REQUIRE_MANUAL_ENABLEMENT``): a MySQL DATETIME column that a source added,
          which Canal, DTS, DRS and Qlik land as ``timestamp_ntz``, failed the batch on every restart.
        """
        if needs_column_mapping(schema) and self._properties(path).get(COLUMN_MAPPING_MODE, "none") == "none":
            log.info("%s: column mapping switched on, for column names Delta stores only with it", path)
            self._set_properties(path, {COLUMN_MAPPING_MODE: "name"})
        if holds_timestamp_ntz(schema):
            detail = self.spark.sql(f"DESCRIBE DETAIL delta.{quote(path)}").head()
            if detail is not None and "timestampNtz" not in (detail["tableFeatures"] or []):
                log.info("%s: Delta's timestampNtz table feature switched on, for a timestamp_ntz column", path)
                self._set_properties(path, {"delta.feature.timestampNtz": "supported"})

    def add_history_columns(self, path: str, listed: str) -> None:
        """``ALTER TABLE ... ADD COLUMNS (<listed>)`` on the table at ``path``; ``listed`` is built by the caller from
        quoted names and cdclake's types, never taken from a message (the caller has called
        :meth:`allow_columns` for them)."""
        try:
            self.spark.sql(f"ALTER TABLE delta.{quote(path)} ADD COLUMNS ({listed})")
        except AnalysisException as exc:  # a concurrent run added them first
            if "already exists" not in str(exc):
                raise

    def replace_rows(self, path: str, rows: DataFrame) -> None:
        """Replaces the table at ``path`` with ``rows`` and their schema, keeping its properties and partitioning: one
        commit."""
        kept = on_columns(self._partitioning(path), rows.columns)
        self.allow_columns(path, rows.schema)
        _partitioned(rows.write.format("delta").mode("overwrite"), kept).option("overwriteSchema", "true").save(path)

    # ---------------------------------------------------------------------------------------------------------
    # Maintenance (cdclake.maintain)

    def system_tables(self) -> list[str]:
        """Paths of the bookkeeping tables under ``<lake>/_cdclake`` (every direct child that is a Delta table)."""
        folder, fs = self._hadoop_path(self.system_dir)
        if not fs.exists(folder):
            return []
        children = sorted(str(status.getPath().getName()) for status in fs.listStatus(folder) if status.isDirectory())
        return [path for path in map(self.system_path, children) if self._exists(path)]

    def vacuum(self, path: str, retain_hours: int) -> int:
        """Deletes the files of the Delta table at ``path`` that no version of the last ``retain_hours`` references
        (and files no commit ever referenced, such as a killed write's, once that old); returns how many.

        Delta refuses a retention under its 7-day safety interval unless told otherwise: the caller chose it, so the
        check is off for that call (a writer still running a longer commit could lose its files).
        """
        settings = {
            "spark.databricks.delta.retentionDurationCheck.enabled": str(retain_hours >= 168).lower(),
            # Delta lists the table's directories with this many tasks (Spark's default: 10,000, for tables with
            # many partition directories); cdclake's tables are not partitioned, and 10,000 tasks took ~25 s per
            # small table on 2 cores.
            "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(
                max(8, self.spark.sparkContext.defaultParallelism)
            ),
        }
        with session_settings(self.spark, settings):
            self.spark.sql(f"VACUUM delta.{quote(path)} RETAIN {int(retain_hours)} HOURS").collect()
        # Delta logs the vacuum as two commits (VACUUM START, VACUUM END) with what it deleted.
        ended = (
            DeltaTable.forPath(self.spark, path)
            .history(2)
            .where(F.col("operation") == "VACUUM END")
            .select(F.col("operationMetrics")["numDeletedFiles"])
            .first()
        )
        return int(ended[0] or 0) if ended is not None else 0

    def expire(self, path: str, retain_hours: int) -> int:
        """Removes what a lake or history table at ``path`` keeps only for versions older than ``retain_hours``;
        returns how many files went. Delta: :meth:`vacuum`."""
        return self.vacuum(path, retain_hours)

    # ---------------------------------------------------------------------------------------------------------
    # Deletion vectors (the ``deletion_vectors`` mode), for the lake tables and the history tables

    @property
    def deletion_vectors_at_creation(self) -> str:
        """``delta.enableDeletionVectors`` of a table cdclake creates: explicit either way, so that a session
        default does not decide instead of the ``deletion_vectors`` mode."""
        return str(self.deletion_vectors == "always").lower()

    def prepare_deletion_vectors(self, path: str) -> None:
        """Before a batch writes the table at ``path`` (outside the batch's commit marker): switches it to deletion
        vectors if ``auto`` marked it (:meth:`review_rewrites`), or if ``always`` finds it without them."""
        if path in self._switch_to_deletion_vectors:
            self._use_deletion_vectors(path)
        elif self.deletion_vectors == "always" and path not in self._with_deletion_vectors and self._exists(path):
            if self._has_deletion_vectors(path):
                self._with_deletion_vectors.add(path)
            else:
                self._use_deletion_vectors(path)

    def merged(self, path: str) -> None:
        """After a MERGE into the table at ``path``: counts it and, after one in :attr:`DELETION_VECTORS_CHECK_EVERY`
        of them, forgets the table's size (:meth:`key_ranges_pay` reads it again) and, under ``auto``, looks at its
        recent MERGEs.

        A look that fails is logged, not raised: the MERGE has committed, and failing the batch for a performance
        rule would only run it again. The table is looked at again after as many MERGEs."""
        merges = self._merges.get(path, zlib.crc32(path.encode("utf-8")) + self._merges_offset)
        self._merges[path] = merges + 1
        if merges % self.DELETION_VECTORS_CHECK_EVERY:
            return
        self._table_sizes.pop(path, None)
        if self.deletion_vectors == "auto" and path not in self._with_deletion_vectors:
            try:
                self.review_rewrites(path)
            except (Py4JError, CapturedException) as exc:
                log.warning("deletion vectors: the look at %s's recent MERGEs failed, left for later: %s", path, exc)

    def review_rewrites(self, path: str) -> bool:
        """``auto``'s rule: marks the table at ``path`` for deletion vectors, and returns True, when its recent
        MERGEs rewrote a median of at least :attr:`DELETION_VECTORS_REWRITE_BYTES` each.

        Only marks it: the switch is a commit of its own, made before the table's next MERGE by
        :meth:`prepare_deletion_vectors`, which runs before a batch's MERGEs, outside their commit marker (under it,
        Delta would skip the switch on a re-run).
        """
        metrics = self.recent_merges(path)
        if any(int(m.get("numTargetDeletionVectorsAdded") or 0) for m in metrics):
            self._with_deletion_vectors.add(path)  # switched already (another run, or by hand)
            return False
        rewritten = [int(m.get("numTargetBytesRemoved") or 0) for m in metrics]
        if not rewritten or statistics.median(rewritten) < self.DELETION_VECTORS_REWRITE_BYTES:
            return False
        self._switch_to_deletion_vectors.add(path)
        return True

    def recent_merges(self, path: str) -> list[dict[str, str]]:
        """Operation metrics of the MERGEs among the newest :attr:`DELETION_VECTORS_RECENT_COMMITS` commits of the
        table at ``path`` (what ``auto`` looks at)."""
        recent = (
            DeltaTable.forPath(self.spark, path)
            .history(self.DELETION_VECTORS_RECENT_COMMITS)
            .where(F.col("operation") == "MERGE")
            .select("operationMetrics")
            .collect()
        )
        return [row[0] or {} for row in recent]

    def _use_deletion_vectors(self, path: str) -> None:
        """Turns deletion vectors on for the table at ``path`` (a protocol upgrade when it has none yet)."""
        self.spark.sql(f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES ('{ENABLE_DELETION_VECTORS}' = 'true')")
        self._switch_to_deletion_vectors.discard(path)
        self._with_deletion_vectors.add(path)

    def _has_deletion_vectors(self, path: str) -> bool:
        return str(self._properties(path).get(ENABLE_DELETION_VECTORS, "false")).lower() == "true"

    def _set_properties(self, path: str, properties: Mapping[str, str]) -> None:
        """Sets ``properties`` on the Delta table at ``path``: one commit."""
        listed = ", ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in properties.items())
        self.spark.sql(f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES ({listed})")

    def _properties(self, path: str) -> dict[str, str]:
        """The table properties of the Delta table at ``path`` (the Iceberg sink reads its own tables'). ``SHOW
        TBLPROPERTIES``, not ``DeltaTable.detail``, which also sizes the table: 14 against 51 ms per table, warm
        (:meth:`ensure_table` asks once per table)."""
        rows = self.spark.sql(f"SHOW TBLPROPERTIES delta.{quote(path)}").collect()
        return {str(row["key"]): str(row["value"]) for row in rows}

    # ---------------------------------------------------------------------------------------------------------
    # Tombstones

    TOMBSTONES: Final = "tombstones"

    def _tombstones(self, lowest_orders: Mapping[str, str | None]) -> DataFrame | None:
        """The newest tombstone per key (and per truncated table, under row key ``""``) of the tables of
        ``lowest_orders`` that can still reject a change: see :meth:`gate`."""
        path = self.system_path(self.TOMBSTONES)
        if not self._exists(path):
            return None
        log = self.spark.read.format("delta").load(path)
        return (
            log.where(_may_gate(lowest_orders))
            .groupBy(apply.TABLE_ID, apply.ROW_KEY)
            .agg(F.max("position").alias("position"))
        )

    def gate(self, folded: DataFrame, lowest_orders: Mapping[str, str | None]) -> DataFrame:
        """Drops folded changes older than their key's tombstone or their table's truncate (in the log:
        :func:`apply.log_order`).

        Args:
            folded: the batch's folded changes (``apply.fold``).
            lowest_orders: table id -> the lowest order among the table's changes in ``folded`` (``TablePlan.
                first_order``), or None when not known. A tombstone ordered below it cannot reject any of them, so
                only the newer ones are read: with Delta's file statistics of ``position``, a stream in source order
                reads no tombstone file at all, where reading them all grew with every delete of the retention
                period (1,000 changes over 10 tables: 1.6 s at 1 million tombstones, 5.3 s at 10 million; now
                0.24 s at both, ``python -m benchmarks.gate``). Tables that no tombstone reaches that far are left
                out, and when that is all of them the tombstones table is not read at all
                (:class:`~cdclake.sinks._tombstone_bounds.TombstoneBounds`).
        """
        gated = self.tombstone_bounds.tables_to_gate(lowest_orders)
        if not gated:
            return folded
        tombstones = self._tombstones({table: lowest_orders[table] for table in gated})
        if tombstones is None:
            return folded
        by_key = tombstones.where(F.col(apply.ROW_KEY) != "").select(
            apply.TABLE_ID, apply.ROW_KEY, apply.comparable_order(F.col("position")).alias("_tomb")
        )
        by_table = tombstones.where(F.col(apply.ROW_KEY) == "").select(
            apply.TABLE_ID, F.col("position").alias("_trunc")
        )
        joined = folded.join(by_key, [apply.TABLE_ID, apply.ROW_KEY], "left").join(
            F.broadcast(by_table), [apply.TABLE_ID], "left"
        )
        keep = (F.col("_tomb").isNull() | (F.col(apply.ORDER) >= F.col("_tomb"))) & (
            F.col("_trunc").isNull() | (apply.log_order(F.col(apply.ORDER)) > F.col("_trunc"))
        )
        return joined.where(keep).drop("_tomb", "_trunc")

    def record_tombstones(self, folded: DataFrame, truncates: Sequence[TablePlan], txn: Txn | None) -> None:
        """Appends tombstones for the deleted keys and truncated tables of a batch.

        Append-only on purpose: a tombstone never has to be removed for correctness. A key written again after its
        delete carries a newer order in its row, and the row gate rejects anything older than that; the tombstone
        only matters while the row is absent. Old tombstones go by retention (:meth:`expire_tombstones`).
        """
        now = F.current_timestamp()
        deleted = folded.where(F.col(apply.KIND) == apply.DELETE).select(
            apply.TABLE_ID,
            apply.ROW_KEY,
            F.col(apply.ORDER).alias("position"),
            F.col(model.EVENT_TIME).alias("event_time"),
        )
        if truncates:
            rows = [(p.table_id, "", p.truncate_order) for p in truncates]
            marks = local_frame(self.spark, rows, "table_id string, row_key string, position string")
            deleted = deleted.unionByName(marks.select("*", F.lit(None).cast("timestamp").alias("event_time")))
        self.append(self.TOMBSTONES, deleted.withColumn("recorded_at", now), txn)

    def expire_tombstones(self, retention_seconds: int) -> None:
        """Forgets tombstones recorded more than ``retention_seconds`` ago. After that, a late event older than the
        delete could bring the row back: choose a retention longer than any redelivery delay.

        Nothing to forget while the table itself is younger than the retention (each tombstone is recorded at its
        append, after the table's creation), so the DELETE is skipped: a new pipeline expires on its first batch (and
        every ``cdclake replay`` on its first), and the DELETE's planning and file-skipping query took 0.23-0.42 s
        there. The table's age is that of its first commit file: one file-system call, 0.006 s, where reading
        ``DESCRIBE DETAIL``'s ``createdAt`` took 0.18 s on a warm, idle 2-core machine (median of 10)."""
        path = self.system_path(self.TOMBSTONES)
        created_ms = self._created_at_ms(path)
        if created_ms is None and not self._exists(path):
            return
        if created_ms is not None and time.time() * 1000 - created_ms < retention_seconds * 1000:
            return
        cutoff = F.current_timestamp() - F.make_interval(secs=F.lit(retention_seconds))
        DeltaTable.forPath(self.spark, path).delete(F.col("recorded_at") < cutoff)

    def _created_at_ms(self, path: str) -> int | None:
        """When the Delta table at ``path`` was created, in epoch milliseconds: the modification time of its first
        commit file (written once, when the table was created). None when there is no such file: no table, or an
        old one whose first commits Delta's log clean-up removed."""
        first_commit, fs = self._hadoop_path(commit_file(path, 0))
        if not fs.exists(first_commit):
            return None
        return int(fs.getFileStatus(first_commit).getModificationTime())

    def _hadoop_path(self, location: str) -> tuple[Any, Any]:
        """``location`` as a Hadoop ``Path`` and the ``FileSystem`` that holds it (any URI the lake may use)."""
        jvm = self.spark._jvm
        assert jvm is not None
        path = jvm.org.apache.hadoop.fs.Path(location)
        return path, path.getFileSystem(self.spark._jsc.hadoopConfiguration())

    # ---------------------------------------------------------------------------------------------------------
    # Reading back (status, tests)

    def read(self, database: str | None, table: str, schema: str | None = None) -> DataFrame:
        return self.spark.read.format("delta").load(self.table_path(database, schema, table))

    def row_count(self, path: str) -> int:
        """Rows of the lake table at ``path`` (as ``BatchResult.applied`` names it)."""
        return self.spark.read.format("delta").load(path).count()

    def read_system(self, name: str) -> DataFrame | None:
        """A bookkeeping table's rows, without the marker columns of its appends; None when it does not exist."""
        path = self.system_path(name)
        if not self._exists(path):
            return None
        return self.spark.read.format("delta").load(path).drop(*MARKER_COLUMNS)

    def recorded_key_columns(self, database: str | None, schema: str | None, table: str) -> list[str] | None:
        """The key columns the table was created with (``cdclake.keyColumns``); None when the table does not exist
        or recorded none."""
        path = self.table_path(database, schema, table)
        if not self._exists(path):
            return None
        keys = [name for name in str(self._properties(path).get(KEY_COLUMNS_PROPERTY, "")).split(",") if name]
        return keys or None

    def read_system_snapshot(self, name: str) -> DataFrame | None:
        """A bookkeeping table as of its current version: what the frame reads does not change when the table is
        written to later (e.g. when Spark recomputes a lost cached partition after this batch's own write)."""
        path = self.system_path(name)
        if not self._exists(path):
            return None
        version = DeltaTable.forPath(self.spark, path).history(1).select("version").first()
        assert version is not None
        table = self.spark.read.format("delta").option("versionAsOf", version[0]).load(path)
        return table.drop(*MARKER_COLUMNS)
