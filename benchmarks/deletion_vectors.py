"""MERGEs into tables of growing size, copy-on-write against deletion vectors, and what ``auto`` decides.

``python -m benchmarks.deletion_vectors [--rows 500000,2000000,20000000 --changes 10000 --batches 3]``

For each size, two copies of one table (keyed by an increasing id, built as ``benchmarks.key_ranges`` builds its
table and bin-packed by auto compaction): one created with ``deletion_vectors: never`` (copy-on-write: a MERGE
rewrites every file a change touches), one with ``always``. Each batch upserts ``changes`` changes into both, in
turn (half new ids, half updates of recent ids). Figures: seconds per MERGE (best and median over the batches), the
median bytes a copy-on-write MERGE rewrote (Delta's ``numTargetBytesRemoved``), and whether ``auto`` switches that
table: its rule applied to the copy-on-write table's own MERGE history.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks.key_ranges import COLUMNS, _changes, _fill
from benchmarks.workload import OUT
from cdclake.apply import TablePlan
from cdclake.sinks.delta import DeletionVectors, DeltaSink
from cdclake.spark import get_session

MODES: tuple[DeletionVectors, ...] = ("never", "always")
MIB = 1024 * 1024


def _rewritten_per_merge(spark: SparkSession, path: str, merges: int) -> float:
    """Median bytes removed (rewritten) by the table's last ``merges`` MERGEs."""
    metrics = (
        DeltaTable.forPath(spark, path)
        .history()
        .where(F.col("operation") == "MERGE")
        .orderBy(F.col("version").desc())
        .limit(merges)
        .select("operationMetrics")
        .collect()
    )
    return statistics.median(int(row[0].get("numTargetBytesRemoved") or 0) for row in metrics)


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="500000,2000000,20000000", help="table sizes")
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=3, help="timed MERGEs per table (after one warm-up)")
    parser.add_argument("--out", type=Path, default=OUT, help="where the scratch lakes go")
    args = parser.parse_args(argv)

    spark = spark or get_session("cdclake-bench-dv", master="local[2]", conf={"spark.driver.memory": "3g"})
    print(f"{args.changes:,} upserts per MERGE (half new ids, half recent ones); seconds per MERGE (best / median)")
    print("| rows | table MiB | copy-on-write rewrote per MERGE | copy-on-write | deletion vectors | dv / cow | auto |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    plan = TablePlan("db\x1f\x1ft", "db", None, "t", list(COLUMNS), ["id"])
    for rows in (int(size) for size in args.rows.split(",")):
        sinks = {mode: DeltaSink(spark, str(args.out / f"dv-lake-{mode}"), mode) for mode in MODES}
        for sink in sinks.values():
            shutil.rmtree(sink.lake, ignore_errors=True)
            sink.ensure_table(plan)
            _fill(spark, sink, plan, rows, args.files)
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        top = rows
        for batch in range(args.batches + 1):
            changes = _changes(spark, top, args.changes, batch)
            for mode, sink in sinks.items():
                started = time.perf_counter()
                sink.merge(plan, COLUMNS, changes)
                if batch:  # the first MERGE warms the session up
                    times[mode].append(time.perf_counter() - started)
            top += args.changes // 2
        copy_path = sinks["never"].table_path("db", None, "t")
        size = DeltaTable.forPath(spark, copy_path).detail().select("sizeInBytes").first()
        rewritten = _rewritten_per_merge(spark, copy_path, args.batches + 1)
        # The auto rule on the copy-on-write table's history, as the pipeline applies it after a MERGE.
        switch = DeltaSink(spark, sinks["never"].lake, "auto").review_rewrites(copy_path)
        decision = "deletion vectors" if switch else "copy-on-write"
        cow, dv = (statistics.median(times[mode]) for mode in MODES)
        print(
            f"| {rows:,} | {(size[0] if size else 0) / MIB:,.0f} | {rewritten / MIB:,.1f} MiB | "
            f"{min(times['never']):.2f} / {cow:.2f} | {min(times['always']):.2f} / {dv:.2f} | {dv / cow:.2f} | "
            f"{decision} |",
            flush=True,
        )
        for sink in sinks.values():
            shutil.rmtree(sink.lake, ignore_errors=True)


if __name__ == "__main__":
    main()
