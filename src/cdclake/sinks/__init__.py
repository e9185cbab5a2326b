"""Sinks: the only package that knows a table format. Delta Lake is the default (:mod:`cdclake.sinks.delta`);
Apache Iceberg lake tables are :mod:`cdclake.sinks.iceberg`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, get_args

from pyspark.sql import SparkSession

from cdclake.exceptions import ConfigError
from cdclake.sinks.delta import DeletionVectors, DeltaSink
from cdclake.sinks.partitioning import PartitionBy, check_partition_by
from cdclake.tables import PerTable, TableRoutes

TableFormat = Literal["delta", "iceberg"]
"""The table format of a lake's tables (its bookkeeping tables under ``_cdclake`` are Delta either way)."""
TABLE_FORMATS: Final = get_args(TableFormat)

TableProperties = Mapping[str, Mapping[str, str]]
"""Table name or pattern (as in cdclake.tables.PerTable) -> table properties of the lake tables it names."""

_MANAGED_PROPERTIES: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    # (lower-cased key, or a prefix ending in ".", and why it cannot be set: what to use instead, if anything)
    "delta": (
        ("cdclake.", "cdclake's own properties record the source table, its key columns and the ordering of its rows"),
        (
            "delta.enabledeletionvectors",
            "cdclake switches deletion vectors per table: use the `deletion_vectors` setting (auto, always, never)",
        ),
        (
            "delta.dataskippingstatscolumns",
            "cdclake keeps file statistics on the key columns, which its MERGEs prune files by",
        ),
        ("delta.dataskippingnumindexedcols", "cdclake lists the columns with statistics itself"),
        ("delta.appendonly", "an append-only table refuses the MERGEs, deletes and truncates that cdclake applies"),
        (
            "delta.columnmapping.",
            "cdclake switches column mapping on by itself for the tables whose column names need it (spaces, "
            "`,;{}()=`), and renames, drops and retypes columns by rewriting the table, which every reader reads",
        ),
        (
            "delta.constraints.",
            "add CHECK constraints with `ALTER TABLE ... ADD CONSTRAINT`: cdclake dead-letters the rows that do not "
            "meet them",
        ),
    ),
    "iceberg": (
        ("cdclake.", "cdclake's own properties record the source table, its key columns and the ordering of its rows"),
        ("format-version", "cdclake's Iceberg MERGEs are built and tested for format version 2"),
        ("write.merge.mode", "cdclake's Iceberg tables are merge-on-read, which its MERGEs are built for"),
        ("write.update.mode", "cdclake's Iceberg tables are merge-on-read, which its MERGEs are built for"),
        ("write.delete.mode", "cdclake's Iceberg tables are merge-on-read, which its MERGEs are built for"),
        ("delta.", "a Delta table property does nothing on an Iceberg table"),
    ),
}


_SPARK_RESERVED: Final = ("comment", "external", "is_managed_location", "location", "owner", "provider")
"""Table properties that Spark's catalogs keep for themselves (``TableCatalog.PROP_*``): ignored or refused."""


def check_table_properties(table_properties: TableProperties, table_format: TableFormat) -> None:
    """Raises :class:`ConfigError` for a table property that cdclake sets itself, or that would stop it applying
    changes, or that does nothing in ``table_format`` (``table_properties`` setting). Whether Delta knows a
    ``delta.*`` property and its value is checked with a session, when a sink is made
    (:meth:`DeltaSink._known_properties`)."""
    for pattern, properties in table_properties.items():
        for key in properties:
            lowered = key.lower()
            if lowered in _SPARK_RESERVED:
                raise ConfigError(
                    f"table_properties.{pattern}.{key}",
                    "Spark keeps this table property for its catalog and ignores or refuses a value for it",
                    "use another name for your own property, e.g. `team`",
                )
            for managed, reason in _MANAGED_PROPERTIES.get(table_format, ()):
                if lowered == managed or (managed.endswith(".") and lowered.startswith(managed)):
                    raise ConfigError(
                        f"table_properties.{pattern}.{key}",
                        f"not a property cdclake lets you set on {table_format} lake tables: {reason}",
                        "remove it from `table_properties`",
                    )


def lake_sink(
    spark: SparkSession,
    lake: str,
    table_format: TableFormat = "delta",
    *,
    deletion_vectors: DeletionVectors = "auto",
    iceberg_catalog: str | None = None,
    routes: TableRoutes | None = None,
    table_properties: TableProperties | None = None,
    partition_by: PartitionBy | None = None,
) -> DeltaSink:
    """The sink of a lake whose tables are in ``table_format``.

    Args:
        deletion_vectors: Delta only (:class:`~cdclake.sinks.delta.DeltaSink`).
        iceberg_catalog: Iceberg only: a Spark catalog of the session for the lake tables, instead of a Hadoop
            catalog at ``lake`` (:class:`~cdclake.sinks.iceberg.IcebergSink`).
        routes: which lake table each source table lands in (:class:`~cdclake.tables.TableRoutes`; default
            ``<database>/<table>``).
        table_properties: table name or pattern -> properties of its lake table, set when cdclake creates the table
            and, once per table and process, on a table that has other values (:meth:`DeltaSink.ensure_table`);
            the most specific entry wins, as for ``keys``. Checked here (:func:`check_table_properties`; a Delta
            sink also asks Delta whether it knows each ``delta.*`` property and its value).
        partition_by: table name or pattern -> partition fields of the lake tables cdclake creates (column names;
            for Iceberg also transforms such as ``days(created_at)``; :mod:`cdclake.sinks.partitioning`); the most
            specific entry wins. Checked here (:func:`~cdclake.sinks.partitioning.check_partition_by`).
    """
    if table_format not in TABLE_FORMATS:
        raise ValueError(f"table_format must be one of {', '.join(TABLE_FORMATS)}, not {table_format!r}")
    check_table_properties(table_properties or {}, table_format)
    per_table = PerTable.of({pattern: dict(values) for pattern, values in (table_properties or {}).items()})
    partitioning = PerTable.of(check_partition_by(partition_by or {}, table_format))
    if table_format == "iceberg":
        from cdclake.sinks.iceberg import IcebergSink

        return IcebergSink(spark, lake, iceberg_catalog, routes, per_table, partitioning)
    return DeltaSink(spark, lake, deletion_vectors, routes, per_table, partitioning)
