"""A MERGE into a large table, with and without the key-range conditions on the target (``delta._key_ranges``).

``python -m benchmarks.key_ranges [--rows 20000000,100000000 --files 100 --changes 10000 --batches 3]``

A table keyed by an increasing id (an auto-increment or time-ordered key, the usual case) holds ``rows`` rows,
written as ``files`` ranges of ids and then bin-packed by the table's auto compaction, as a stream's files are.
Each batch upserts ``changes`` changes: half of them new ids above the current maximum, half updates of ids among
the newest 50,000. The batches alternate between the two ways, on the same table: with the key range (Delta skips
the files outside it) and without it (the MERGE reads every file), whatever ``DeltaSink.KEY_RANGES_MIN_BYTES``
would decide. Figures: the table's size, and seconds per MERGE, best and median over the batches.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.workload import OUT
from cdclake import apply, model
from cdclake.apply import TablePlan
from cdclake.sinks import delta
from cdclake.sinks.delta import DeltaSink
from cdclake.spark import get_session, session_settings

COLUMNS = [("id", "bigint"), ("name", "string"), ("amount", "string"), ("status", "string")]
RECENT = 50_000


def fill(spark: SparkSession, sink: DeltaSink, plan: TablePlan, rows: int, files: int) -> None:
    path = sink.table_path(plan.database, plan.schema, plan.table)
    # Without adaptive execution, which would coalesce the ranges; the table's auto compaction then bin-packs the
    # files as it does a stream's (up to 128 MB each, several million rows of this table).
    with session_settings(spark, {"spark.sql.adaptive.enabled": "false"}):
        _write(spark, path, rows, files)


def _write(spark: SparkSession, path: str, rows: int, files: int) -> None:
    (
        spark.range(rows)
        .select(
            F.col("id"),
            F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name"),
            (F.col("id") % 1000).cast("string").alias("amount"),
            F.lit("open").alias("status"),
            F.lpad(F.col("id").cast("string"), 26, "0").alias(delta.POSITION_COLUMN),
            F.current_timestamp().alias(delta.EVENT_TIME_COLUMN),
            F.lit(apply.UPSERT).alias(delta.OP_COLUMN),
        )
        .repartitionByRange(files, "id")
        .write.format("delta")
        .mode("append")
        .save(path)
    )


def upserts(spark: SparkSession, top: int, changes: int, batch: int) -> DataFrame:
    """Half new ids from ``top`` up, half updates of ids among the newest ``RECENT`` (distinct, one per key)."""
    new = spark.range(top, top + changes // 2)
    updated = spark.range(changes - changes // 2).select(
        (F.lit(top - RECENT) + (F.col("id") * 7919) % RECENT).alias("id")
    )
    image = F.create_map(
        F.lit("id"),
        F.col("id").cast("string"),
        F.lit("name"),
        F.concat(F.lit("name-"), F.col("id").cast("string")),
        F.lit("amount"),
        F.lit(str(batch)),
        F.lit("status"),
        F.lit("updated"),
    )
    return (
        new.unionByName(updated)
        .distinct()
        .select(
            F.lit(apply.UPSERT).alias(apply.KIND),
            image.alias(apply.IMAGE),
            F.lit(False).alias(apply.PARTIAL),
            F.lpad((F.col("id") + 10**12 * (batch + 1)).cast("string"), 26, "0").alias(apply.ORDER),
            F.current_timestamp().alias(model.EVENT_TIME),
        )
        .localCheckpoint(eager=True)
    )


def table_plan() -> TablePlan:
    """The benchmark table ``db.t``: :data:`COLUMNS`, keyed by ``id``."""
    return TablePlan("db\x1f\x1ft", "db", None, "t", list(COLUMNS), ["id"])


def arguments(argv: Sequence[str] | None, doc: str | None, rows: str, batches_help: str) -> argparse.Namespace:
    """The command line of a benchmark of MERGEs into this table (this one, ``benchmarks.deletion_vectors``)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=rows, help="table sizes")
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=3, help=batches_help)
    parser.add_argument("--out", type=Path, default=OUT, help="where the scratch lakes go")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> None:
    args = arguments(argv, __doc__, "20000000,100000000", "MERGEs per way and size")

    spark = spark or get_session("cdclake-bench-key-ranges", master="local[2]", conf={"spark.driver.memory": "3g"})
    print(f"{args.changes:,} upserts per MERGE (half new ids, half recent ones), {args.files} files; seconds")
    print("| rows | table MiB | without key range (best / median) | with key range (best / median) | without / with |")
    print("|---:|---:|---:|---:|---:|")
    for rows in (int(size) for size in args.rows.split(",")):
        lake = args.out / "key-ranges-lake"
        shutil.rmtree(lake, ignore_errors=True)
        sink = DeltaSink(spark, str(lake))
        sink.REWRITE_MAX_BYTES = -1  # MERGEs, whatever the table's size (the figures are a MERGE's)
        plan = table_plan()
        sink.ensure_table(plan)
        fill(spark, sink, plan, rows, args.files)
        top = rows
        times: dict[str, list[float]] = {"without": [], "with": []}
        for batch in range(2 * args.batches + 1):
            way = "with" if batch % 2 else "without"
            changes = upserts(spark, top, args.changes, batch)
            started = time.perf_counter()
            with mock.patch.object(DeltaSink, "key_ranges_pay", return_value=way == "with"):
                sink.merge(plan, COLUMNS, changes)
            elapsed = time.perf_counter() - started
            if batch:  # the first MERGE warms the session up
                times[way].append(elapsed)
            top += args.changes // 2
        figures = {way: (min(values), statistics.median(values)) for way, values in times.items()}
        path = sink.table_path(plan.database, plan.schema, plan.table)
        detail = DeltaTable.forPath(spark, path).detail().first()
        assert detail is not None
        table_mib = detail["sizeInBytes"] / 2**20
        print(
            f"| {rows:,} | {table_mib:,.1f} | {figures['without'][0]:.2f} / {figures['without'][1]:.2f} | "
            f"{figures['with'][0]:.2f} / {figures['with'][1]:.2f} | "
            f"{figures['without'][1] / figures['with'][1]:.1f}x |",
            flush=True,
        )
        shutil.rmtree(lake, ignore_errors=True)


if __name__ == "__main__":
    main()
