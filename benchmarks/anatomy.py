"""Where a steady batch's time goes as it touches more tables: its Spark jobs by kind, per table, and its CPU.

``python -m benchmarks.anatomy [--tables 100 --events-per-batch 20000 --batches 3] [--history scd2 ...]``

The scaling target's workload and pipeline (:mod:`benchmarks.scaling`: DataWorks, the same events over T tables) are
applied with ``Pipeline.process_batch``: a first batch creates the tables, then ``--batches`` steady batches are
measured. ``--history changelog`` and ``--history scd2`` (either or both) give every table those history tables too,
whose MERGEs then count among the jobs. For each steady batch it prints:

* its seconds and its steps' seconds (``BatchResult.seconds``);
* the Spark jobs it ran, grouped by their description (as Delta names its jobs, such as "Delta: Compute snapshot
  for version", with the numbers left out), else by their call site: how many, how many per table, and the seconds
  they lasted, summed (a batch's MERGEs overlap, so the sum may exceed the batch);
* CPU seconds (from ``/proc``, so Linux only): the machine's, busy and idle; the driver JVM's, split into its JIT
  compiler threads, its garbage collector's and the rest (Spark's tasks, planning, scheduling, Delta's commits:
  with ``local[N]`` the executors are the driver's threads); the processes it started (Hadoop's shell calls); and
  this Python process's;
* the classes Spark compiled from generated code (Janino).

No target: the figures explain the ``table_scaling_100_vs_1`` target's (README.md, "c."). Jobs are read from
Spark's status store, which keeps ``spark.ui.retainedJobs`` of them (1,000 by default): this command's own session
keeps more (:data:`benchmarks.spark_jobs.RETAINED_JOBS`).
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from benchmarks.cpu import JvmCpu, jvm_pid
from benchmarks.scaling import cut, scaling_pipeline, workload_spec
from benchmarks.spark_jobs import RETAINED_JOBS, Job, compiled_classes, jobs_since
from benchmarks.workload import OUT, materialize, message_frame


def report(
    index: int, seconds: float, steps: dict[str, float], tables: int, jobs: list[Job], cpu: JvmCpu, compiled: int
) -> list[str]:
    """The lines printed for one steady batch (see the module doc)."""
    by_kind: dict[str, list[float]] = defaultdict(list)
    for job in jobs:
        by_kind[job.kind].append(job.seconds)
    job_seconds = sum(job.seconds for job in jobs)
    lines = [
        f"batch {index}: {seconds:.1f} s over {tables} tables; "
        + ", ".join(f"{step} {value:.2f}" for step, value in steps.items()),
        f"  spark jobs: {len(jobs)} ({len(jobs) / tables:.2f} per table), {job_seconds:.1f} job-seconds",
    ]
    for kind, durations in sorted(by_kind.items(), key=lambda item: -sum(item[1])):
        share = 100 * sum(durations) / job_seconds if job_seconds else 0.0
        lines.append(
            f"    {len(durations):5d} ({len(durations) / tables:5.2f} per table) {sum(durations):7.1f} s "
            f"({share:4.1f}%)  {kind}"
        )
    rest = cpu.jvm - cpu.jit - cpu.gc
    lines.append(
        f"  cpu seconds: machine busy {cpu.machine_busy:.1f}, idle {cpu.machine_idle:.1f}; driver JVM {cpu.jvm:.1f} "
        f"(JIT compilers {cpu.jit:.1f}, garbage collector {cpu.gc:.1f}, the rest {rest:.1f}); "
        f"processes it started {cpu.started_processes:.1f}; Python {cpu.python:.1f}"
    )
    lines.append(f"  classes compiled from generated code: {compiled}")
    return lines


def run(
    spark: SparkSession,
    tables: int,
    events_per_batch: int,
    batches: int,
    out: Path,
    history: Sequence[str] = (),
) -> list[str]:
    """Applies the workload (with the ``history`` tables) and returns the printed lines (printed as they come too)."""
    workload = materialize(workload_spec(tables, events_per_batch, 1 + batches))
    lake = out / f"anatomy-{tables}"
    shutil.rmtree(lake, ignore_errors=True)
    messages = message_frame(spark, workload.path)
    driver = jvm_pid(spark)
    printed: list[str] = []
    try:
        pipeline = scaling_pipeline(spark, workload, lake, f"bench-anatomy-{tables}", history)
        for index, batch in enumerate(cut(messages, workload.messages, 1 + batches)):
            since_ms = int(time.time() * 1000)
            cpu_before, compiled_before = JvmCpu.now(driver), compiled_classes(spark)
            started = time.perf_counter()
            result = pipeline.process_batch(batch, index)
            seconds = time.perf_counter() - started
            cpu, compiled = JvmCpu.now(driver) - cpu_before, compiled_classes(spark) - compiled_before
            if index == 0:
                line = f"batch 0 (creates the tables, not measured): {seconds:.1f} s"
                print(line, flush=True)
                printed.append(line)
                continue
            lines = report(index, seconds, result.seconds, tables, jobs_since(spark, since_ms), cpu, compiled)
            print("\n".join(lines), flush=True)
            printed += lines
    finally:
        messages.unpersist()
        shutil.rmtree(lake, ignore_errors=True)
    return printed


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=100)
    parser.add_argument("--events-per-batch", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=3, help="steady batches measured after the first")
    parser.add_argument("--out", type=Path, default=OUT, help="where the scratch lake goes")
    parser.add_argument(
        "--history",
        action="append",
        choices=("changelog", "scd2"),
        default=[],
        help="history tables every table also gets (repeat for both)",
    )
    args = parser.parse_args(argv)
    if spark is None:
        from cdclake.spark import get_session

        spark = get_session("cdclake-bench-anatomy", master="local[2]", conf=RETAINED_JOBS)
    with_history = f", with {' and '.join(sorted(set(args.history)))} tables" if args.history else ""
    print(f"{args.tables} tables, steady batches of {args.events_per_batch:,} events{with_history}", flush=True)
    return run(spark, args.tables, args.events_per_batch, args.batches, args.out, args.history)


if __name__ == "__main__":
    main()
