"""A long run of small micro-batches through one pipeline: does the driver hold steady, and the lake stay right?

``python -m benchmarks.soak [--batches 500 --batch 30 --every 25]``

A pipeline runs for days as a stream of small micro-batches. What would grow with the number of batches rather than
with their size: the driver's heap (plans, stored rows of a batch, see ``cdclake.spark.release``), the classes of
generated code (Spark keeps ``spark.sql.codegen.cache.maxEntries`` of them, and a literal that changes every batch
would compile new ones each time), the Python process, and the bookkeeping tables that every batch appends to
(progress, dead letters, tombstones), whose cost would show as slower batches.

A DataWorks workload (3 tables with every trap of the end-to-end tests: split and merged updates, transactions,
heartbeats, a key-less table, a truncate, an added column, malformed messages) is replayed in ``batches`` batches
of ``batch`` messages through one pipeline. Every ``every`` batches it prints the driver JVM's heap after a full
GC, its loaded classes, the code compilations so far, the stored (persisted) RDDs, the Python process's resident
memory, and the mean batch time of the interval. The last line compares the last interval with the second one
(the first is the JVM's warm-up); the lake must then equal the workload's source truth.

A replay compiles two pieces of code every batch: the filter of the batch's lines (``CaptureFile.lines``) has the
line numbers as ``bigint`` literals, which Spark writes into the generated code. Once Spark's code cache is full,
each compilation evicts an older class, so the loaded classes level off (a stream from Kafka has no such filter).
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from benchmarks.memory import python_rss
from benchmarks.spark_jobs import compiled_classes
from benchmarks.workload import OUT
from cdclake.devtools.verify import compare_lake, describe
from cdclake.pipeline import BatchResult
from cdclake.runner import replay
from cdclake.spark import get_session
from cdclake.workload import DataWorksOptions, HistoryConfig, SourceHistory, render, to_jsonl


@dataclass(frozen=True)
class Sample:
    """The driver's state after a batch."""

    batch: int
    heap_mib: float
    classes: int
    compilations: int
    stored_rdds: int
    python_rss_mib: float
    mean_batch_s: float


def sample(spark: SparkSession, batch: int, mean_batch_s: float) -> Sample:
    """The driver's state now, after a full garbage collection (what the heap still holds, and the classes still
    loaded: generated classes that left Spark's cache are unloaded by it)."""
    jvm = spark._jvm
    assert jvm is not None, "the soak benchmark needs a classic (Py4J) session"
    jvm.java.lang.System.gc()
    runtime = jvm.java.lang.Runtime.getRuntime()
    management = jvm.java.lang.management.ManagementFactory
    return Sample(
        batch=batch,
        heap_mib=(runtime.totalMemory() - runtime.freeMemory()) / 2**20,
        classes=management.getClassLoadingMXBean().getLoadedClassCount(),
        compilations=compiled_classes(spark),
        stored_rdds=len(spark.sparkContext._jsc.getPersistentRDDs()),
        python_rss_mib=python_rss() / 2**20,
        mean_batch_s=mean_batch_s,
    )


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=500, help="about this many micro-batches")
    parser.add_argument("--batch", type=int, default=30, help="messages per batch")
    parser.add_argument("--every", type=int, default=25, help="batches per printed interval")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT / "soak")
    args = parser.parse_args(argv)
    if args.batches < 3 * args.every:
        parser.error("--batches must be at least 3 x --every: the first interval is warm-up, two are compared")
    # A source change is one message, or two (a split update), plus transaction markers and heartbeats: about 2
    # messages per change (7,500 changes: 15,471 messages), so the batch count comes out near --batches.
    history = SourceHistory.generate(
        HistoryConfig(
            seed=args.seed,
            tables=3,
            events=args.batches * args.batch // 2,
            keys_per_table=25,
            keyless_tables=1,
            truncates=1,
            added_columns=1,
        )
    )
    options = DataWorksOptions(update_mode="mixed", heartbeat_every=200, malformed=2, transactions=True)
    messages = render(history, options, seed=args.seed)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    capture = args.out / "capture.jsonl"
    capture.write_text(to_jsonl(messages), encoding="utf-8")

    spark = spark or get_session("cdclake-bench-soak", master="local[2]", conf={"spark.driver.memory": "3g"})
    samples: list[Sample] = []
    interval: list[float] = []
    started = time.perf_counter()
    print(f"{len(messages):,} DataWorks messages over 3 tables, batches of {args.batch}")
    print("| batch | heap after GC MiB | classes | compilations | stored RDDs | Python RSS MiB | mean batch s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")

    def on_batch(result: BatchResult) -> None:
        nonlocal started
        interval.append(time.perf_counter() - started)
        if len(interval) == args.every:
            s = sample(spark, result.batch_id, sum(interval) / len(interval))
            interval.clear()
            samples.append(s)
            print(
                f"| {s.batch} | {s.heap_mib:.0f} | {s.classes:,} | {s.compilations:,} | {s.stored_rdds} "
                f"| {s.python_rss_mib:.0f} | {s.mean_batch_s:.2f} |",
                flush=True,
            )
        started = time.perf_counter()  # after the sample: its full GC is not the next batch's time

    lake = str(args.out / "lake")
    replay(
        spark, lake=lake, format_name="dataworks-json", paths=[str(capture)], batch_lines=args.batch, on_batch=on_batch
    )
    comparison = compare_lake(lake, history.truth())
    if not all(r.ok for r in comparison):
        raise SystemExit(f"the lake differs from the source truth:\n{describe(comparison)}")
    if len(samples) < 3:
        raise SystemExit(f"{len(samples)} intervals: raise --batches or lower --every to compare two after warm-up")
    second, last = samples[1], samples[-1]
    batches = last.batch - second.batch
    print(
        f"batches {second.batch}->{last.batch}: heap after GC {second.heap_mib:.0f}->{last.heap_mib:.0f} MiB, "
        f"classes {second.classes:,}->{last.classes:,}, "
        f"compilations +{(last.compilations - second.compilations) / batches:.1f} per batch, "
        f"Python RSS {second.python_rss_mib:.0f}->{last.python_rss_mib:.0f} MiB, "
        f"mean batch {second.mean_batch_s:.2f}->{last.mean_batch_s:.2f} s; the lake equals the source truth"
    )
    shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()
