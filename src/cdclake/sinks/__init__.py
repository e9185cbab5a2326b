"""Sinks: the only package that knows a table format. Delta Lake is the default (:mod:`cdclake.sinks.delta`);
Apache Iceberg lake tables are :mod:`cdclake.sinks.iceberg`."""

from __future__ import annotations

from typing import Final, Literal, get_args

from pyspark.sql import SparkSession

from cdclake.sinks.delta import DeletionVectors, DeltaSink
from cdclake.tables import TableRoutes

TableFormat = Literal["delta", "iceberg"]
"""The table format of a lake's tables (its bookkeeping tables under ``_cdclake`` are Delta either way)."""
TABLE_FORMATS: Final = get_args(TableFormat)


def lake_sink(
    spark: SparkSession,
    lake: str,
    table_format: TableFormat = "delta",
    *,
    deletion_vectors: DeletionVectors = "auto",
    iceberg_catalog: str | None = None,
    routes: TableRoutes | None = None,
) -> DeltaSink:
    """The sink of a lake whose tables are in ``table_format``.

    Args:
        deletion_vectors: Delta only (:class:`~cdclake.sinks.delta.DeltaSink`).
        iceberg_catalog: Iceberg only: a Spark catalog of the session for the lake tables, instead of a Hadoop
            catalog at ``lake`` (:class:`~cdclake.sinks.iceberg.IcebergSink`).
        routes: which lake table each source table lands in (:class:`~cdclake.tables.TableRoutes`; default
            ``<database>/<table>``).
    """
    if table_format == "iceberg":
        from cdclake.sinks.iceberg import IcebergSink

        return IcebergSink(spark, lake, iceberg_catalog, routes)
    if table_format != "delta":
        raise ValueError(f"table_format must be one of {', '.join(TABLE_FORMATS)}, not {table_format!r}")
    return DeltaSink(spark, lake, deletion_vectors, routes)
