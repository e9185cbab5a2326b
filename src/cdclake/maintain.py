"""``cdclake maintain``: removes what the lake's tables keep only for old versions, so a lake that a pipeline writes
every few seconds does not grow without end: every MERGE leaves the files it replaced (Delta) or a snapshot and its
delete files (Iceberg) behind, for time travel.

* Delta tables: ``VACUUM ... RETAIN <hours> HOURS`` (the files no version of the retention period references).
* Iceberg tables: ``expire_snapshots`` older than the retention (the current snapshot always stays, and with it
  the last batch's exactly-once marker), then ``remove_orphan_files`` as old and at least a day old (files of writes
  that never committed, such as a killed run's; Iceberg refuses younger ones).

Covered: the lake tables that the progress table names or a RENAME moved rows into (``schema_changes``), their
history tables, and cdclake's bookkeeping tables under ``_cdclake`` (always Delta). Exactly once does not depend on
old versions: row changes are gated by order, so a batch re-run after maintenance changes nothing. Delta keeps every
batch marker in its log, so such a re-run commits nothing either; an Iceberg table keeps the marker of its current
snapshot (its last write), so the other steps of that batch (a truncate before the MERGE) would commit again, to no
effect.

Run it while no pipeline writes the lake, or with a retention longer than any write takes: a retention shorter
than a running write can delete files that write is about to commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdclake.evolve import SCHEMA_CHANGES
from cdclake.exceptions import InputError
from cdclake.sinks import TableFormat, lake_sink
from cdclake.sinks.history import CHANGELOG_DIR, SCD2_DIR

DEFAULT_RETAIN_HOURS = 168
"""7 days, Delta's default (``delta.deletedFileRetentionDuration``)."""

TableKind = Literal["lake", "changelog", "scd2", "bookkeeping"]


@dataclass(frozen=True)
class MaintainedTable:
    """One table that :func:`maintain_lake` cleaned up."""

    kind: TableKind
    name: str
    """``db.table`` (source names; for a lake table that ``routes`` named, ``db.table`` of the lake table, whose
    path is its safe form) for lake and history tables; the table's name for bookkeeping tables."""
    path: str
    table_format: TableFormat
    removed_files: int


def maintain_lake(
    spark: SparkSession,
    lake: str,
    *,
    table_format: TableFormat = "delta",
    iceberg_catalog: str | None = None,
    retain_hours: int = DEFAULT_RETAIN_HOURS,
) -> list[MaintainedTable]:
    """Removes the files (Delta) and snapshots (Iceberg) older than ``retain_hours`` from every table of the lake
    (see the module doc); returns what was done per table.

    Raises:
        InputError: the progress table names tables, but none is a ``table_format`` table (a wrong format or
            catalog would otherwise only clean the bookkeeping tables).
    """
    if retain_hours < 0:
        raise ValueError("retain_hours must be 0 or more")
    sink = lake_sink(spark, lake, table_format, iceberg_catalog=iceberg_catalog)
    done: list[MaintainedTable] = []
    progress = sink.read_system("progress")
    # Where each source table's rows went: recorded since routes exist (lake_table), else the default path.
    lake_table = F.col("lake_table") if progress is not None and "lake_table" in progress.columns else F.lit(None)
    sources = (
        []
        if progress is None
        else progress.where("scope = 'table'")
        .select("database", "schema", "table", lake_table.cast("string").alias("lake_table"))
        .distinct()
        .collect()
    )
    tables: list[tuple[str, str]] = []  # (path, name)
    for database, schema, table, relative in sorted(sources, key=lambda row: tuple(part or "" for part in row)):
        path = sink.table_path(database, schema, table)
        name = ".".join(part for part in (database, schema, table) if part)
        if relative and f"{sink.lake}/{relative}" != path:  # routed (lake_table is the default path otherwise)
            path, name = f"{sink.lake}/{relative}", relative.replace("/", ".")
        tables.append((path, name))
    # A table that only a RENAME filled has no progress row; schema_changes names it (since moved_to exists).
    changes = sink.read_system(SCHEMA_CHANGES)
    if changes is not None and "moved_to" in changes.columns:
        moved = changes.select(F.explode("moved_to").alias("lake_table")).distinct().collect()
        tables += sorted((f"{sink.lake}/{row[0]}", row[0].replace("/", ".")) for row in moved)
    # Several source tables may share a lake table (routes, or one name in two schemas: README "What lands in the
    # lake"), and a table may have moved (a route changed, a rename): each lake table once.
    seen: set[str] = set()
    for path, name in tables:
        if path in seen:
            continue
        seen.add(path)
        if sink.table_schema(path) is not None:
            done.append(MaintainedTable("lake", name, path, table_format, sink.expire(path, retain_hours)))
        for kind in (CHANGELOG_DIR, SCD2_DIR):
            history_path = sink.history_path_of(kind, path)
            if sink.table_schema(history_path) is not None:
                removed = sink.expire(history_path, retain_hours)
                done.append(MaintainedTable(kind, name, history_path, table_format, removed))
    if sources and not any(item.kind == "lake" for item in done):
        raise InputError(
            f"the progress table of {lake} names {len(sources)} tables, but none is a {table_format} table there: "
            "check the table format (--table-format, table_format) and the Iceberg catalog"
        )
    for path in sink.system_tables():
        name = path.rsplit("/", 1)[-1]
        done.append(MaintainedTable("bookkeeping", name, path, "delta", sink.vacuum(path, retain_hours)))
    return done
