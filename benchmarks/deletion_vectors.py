"""MERGEs into tables of growing size, copy-on-write against deletion vectors, and what ``auto`` decides.

``python -m benchmarks.deletion_vectors [--rows 500000,2000000,20000000 --changes 10000 --batches 3]``

For each size, two copies of one table (keyed by an increasing id, built as ``benchmarks.key_ranges`` builds its
table and bin-packed by auto compaction): one created with ``deletion_vectors: never`` (copy-on-write: a MERGE
rewrites every file a change touches), one with ``always``. Each batch upserts ``changes`` changes into both, in
turn (half new ids, half updates of recent ids). Figures: seconds per MERGE (best and median over the batches), the
median bytes a copy-on-write MERGE rewrote (Delta's ``numTargetBytesRemoved``, over the MERGEs ``auto`` looks at),
and whether ``auto`` switches that table: its rule applied to the copy-on-write table's own MERGE history.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Sequence

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from benchmarks.key_ranges import COLUMNS, arguments, fill, table_plan, upserts
from cdclake.sinks.delta import DeletionVectors, DeltaSink
from cdclake.spark import get_session

MODES: tuple[DeletionVectors, ...] = ("never", "always")
MIB = 1024 * 1024


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> None:
    args = arguments(argv, __doc__, "500000,2000000,20000000", "timed MERGEs per table (after one warm-up)")
    spark = spark or get_session("cdclake-bench-dv", master="local[2]", conf={"spark.driver.memory": "3g"})
    print(f"{args.changes:,} upserts per MERGE (half new ids, half recent ones); seconds per MERGE (best / median)")
    print("| rows | table MiB | copy-on-write rewrote per MERGE | copy-on-write | deletion vectors | dv / cow | auto |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    plan = table_plan()
    for rows in (int(size) for size in args.rows.split(",")):
        sinks = {mode: DeltaSink(spark, str(args.out / f"dv-lake-{mode}"), mode) for mode in MODES}
        for sink in sinks.values():
            sink.REWRITE_MAX_BYTES = -1  # MERGEs, whatever the table's size (the figures are a MERGE's)
            shutil.rmtree(sink.lake, ignore_errors=True)
            sink.ensure_table(plan)
            fill(spark, sink, plan, rows, args.files)
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        top = rows
        for batch in range(args.batches + 1):
            changes = upserts(spark, top, args.changes, batch)
            for mode, sink in sinks.items():
                started = time.perf_counter()
                sink.merge(plan, COLUMNS, changes)
                if batch:  # the first MERGE warms the session up
                    times[mode].append(time.perf_counter() - started)
            top += args.changes // 2
        copy_path = sinks["never"].table_path("db", None, "t")
        size = DeltaTable.forPath(spark, copy_path).detail().select("sizeInBytes").first()
        # The auto rule on the copy-on-write table's history, as the pipeline applies it after a MERGE.
        auto = DeltaSink(spark, sinks["never"].lake, "auto")
        rewritten = statistics.median(int(m.get("numTargetBytesRemoved") or 0) for m in auto.recent_merges(copy_path))
        switch = auto.review_rewrites(copy_path)
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
