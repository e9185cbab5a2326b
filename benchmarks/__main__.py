"""``python -m benchmarks [--quick]``: every benchmark, its target lines, ``RESULTS.md`` and ``results.png``.

Exits 0 whether targets pass or fail (a failed target is a finding, not an error); a benchmark that crashes prints
its target lines as ``error`` FAILs and the others still run. See README.md for what each target measures.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import decode, e2e, freshness, plot, report, scaling
from benchmarks.memory import PeakSampler
from benchmarks.spark_jobs import RETAINED_JOBS
from benchmarks.workload import OUT, WorkloadSpec, materialize

HERE = Path(__file__).resolve().parent
GIB = 1024**3

DECODE_GOAL = 0.9
E2E_GOAL = 0.5
SCALING_GOAL = 10.0
FRESHNESS_P50_GOAL = 30.0
FRESHNESS_P95_GOAL = 60.0
MEMORY_GOAL_GIB = 4.0
DRIVER_HEAP = "3g"
"""The embedded session's heap. "Fits in a 4 GiB driver" is checked on the whole local process (Python, the driver
JVM and, with local[2], the executors inside it): a 4g heap alone already takes the JVM past 4 GiB of resident
memory (4.58 GiB measured), because the JVM grows the heap to its limit before it collects and adds metaspace,
code cache and direct buffers on top. With 3g the same run must stay under 4 GiB in total."""
FRESHNESS_SHARE = 0.5


@dataclass(frozen=True)
class Mode:
    """Sizes of one benchmark run."""

    name: str
    decode_events: int
    decode_repeats: int
    e2e_events: int
    e2e_keys_per_table: int
    e2e_tables: int
    max_offsets_per_trigger: int
    scaling_tables: tuple[int, ...]
    scaling_events_per_batch: int
    freshness_seconds: float


FULL = Mode("bench", 200_000, 3, 1_000_000, 100_000, 10, 250_000, (1, 10, 100, 1000), 50_000, 120.0)
QUICK = Mode("bench-quick", 20_000, 3, 200_000, 20_000, 10, 100_000, (1, 10, 100), 20_000, 45.0)

BENCHMARKS = ("decode", "e2e", "scaling", "freshness")


@dataclass
class Run:
    """What the benchmarks found, for the targets, RESULTS.md and the plot."""

    mode: Mode
    targets: list[report.Target] = field(default_factory=list)
    sections: list[tuple[str, list[str]]] = field(default_factory=list)
    panels: list[plot.Panel] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)

    def log(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        self.log_lines.append(line)
        print(line, flush=True)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (make bench-quick), ~10 minutes")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help=f"comma-separated subset of {BENCHMARKS}")
    parser.add_argument("--formats", default="", help="comma-separated formats for the decode benchmark (default all)")
    parser.add_argument("--decode-events", type=int, help="events per format in the decode benchmark")
    parser.add_argument("--decode-repeats", type=int, help="timed runs per side in the decode benchmark (best of)")
    parser.add_argument("--e2e-events", type=int, help="events in the end-to-end benchmark")
    parser.add_argument("--max-offsets", type=int, help="maxOffsetsPerTrigger of the end-to-end runs")
    parser.add_argument("--tables", help="comma-separated table counts of the scaling benchmark")
    parser.add_argument("--scaling-events", type=int, help="events per batch in the scaling benchmark")
    parser.add_argument("--freshness-seconds", type=float, help="how long the paced producer runs")
    parser.add_argument("--results", type=Path, default=HERE, help="where RESULTS.md and results.png go")
    parser.add_argument("--kafka-port", type=int, default=int(os.environ.get("CDCLAKE_BENCH_KAFKA_PORT", "19450")))
    return parser.parse_args(argv)


def mode_from(args: argparse.Namespace) -> Mode:
    base = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}
    if args.decode_events:
        overrides["decode_events"] = args.decode_events
    if args.decode_repeats:
        overrides["decode_repeats"] = args.decode_repeats
    if args.e2e_events:
        overrides["e2e_events"] = args.e2e_events
        overrides["e2e_keys_per_table"] = max(100, args.e2e_events // 10)
    if args.max_offsets:
        overrides["max_offsets_per_trigger"] = args.max_offsets
    if args.tables:
        overrides["scaling_tables"] = tuple(int(t) for t in args.tables.split(","))
    if args.scaling_events:
        overrides["scaling_events_per_batch"] = args.scaling_events
    if args.freshness_seconds:
        overrides["freshness_seconds"] = args.freshness_seconds
    return Mode(**{**base.__dict__, **overrides})


def guarded(run: Run, names: Sequence[tuple[str, str]], body: Callable[[], None]) -> None:
    """Runs one benchmark; if it crashes, its targets are reported as failed with the reason."""
    try:
        body()
    except Exception as error:  # a crashed benchmark must not hide the others' figures
        run.log(f"benchmark failed: {error!r}")
        traceback.print_exc()
        for name, goal in names:
            run.targets.append(report.failed(name, goal, f"{type(error).__name__}: {error}"))


# ------------------------------------------------------------------------------------------------------------------


def run_decode(run: Run, spark: Any, formats: Sequence[str]) -> None:
    rows = [
        "| format | messages | cdclake msg/s | baseline msg/s | ratio | baseline |",
        "|---|---:|---:|---:|---:|---|",
    ]
    bars: list[plot.Bar] = []
    for name in formats:
        target = f"decode_ratio.{name}"

        def one(name: str = name, target: str = target) -> None:
            workload = materialize(WorkloadSpec(format=name, events=run.mode.decode_events, keys_per_table=10_000))
            run.log(_generated(workload))
            result = decode.measure(spark, workload, repeats=run.mode.decode_repeats, log=run.log)
            run.targets.append(report.at_least(target, result.ratio, DECODE_GOAL))
            rows.append(
                f"| {name} | {result.messages:,} | {result.decoder_rate:,.0f} | {result.baseline_rate:,.0f} | "
                f"{result.ratio:.2f} | {result.baseline_description} |"
            )
            bars.append(
                plot.Bar(
                    f"{name} base", [(result.baseline_rate / 1000, "baseline")], f"{result.baseline_rate / 1000:.0f}K"
                )
            )
            bars.append(
                plot.Bar(
                    f"{name}",
                    [(result.decoder_rate / 1000, "cdclake")],
                    f"{result.decoder_rate / 1000:.0f}K {result.ratio:.2f}",
                )
            )

        guarded(run, [(target, f">= {DECODE_GOAL:g}")], one)
    run.sections.append(("a. Decode throughput", rows))
    run.panels.append(plot.Panel("A. DECODE, THOUSAND MSG/S (RATIO)", bars, ["baseline", "cdclake"]))


def _generated(workload: Any) -> str:
    how = "cached" if workload.cached else "generated"
    return (
        f"workload {workload.spec.format}: {workload.spec.events:,} events -> {workload.messages:,} messages "
        f"({how}; generation {workload.generation_seconds:.1f} s = "
        f"{workload.events_per_second_generated:,.0f} events/s)"
    )


@dataclass
class StreamFigures:
    rate: float = math.nan
    messages_per_event: float = 1.0
    generation_rate: float = 20_000.0
    spec: WorkloadSpec | None = None


def run_e2e(run: Run, spark: Any, bootstrap: str, work: Path, figures: StreamFigures) -> None:
    mode = run.mode
    spec = WorkloadSpec(events=mode.e2e_events, tables=mode.e2e_tables, keys_per_table=mode.e2e_keys_per_table)
    workload = materialize(spec)
    run.log(_generated(workload))
    figures.spec = spec
    figures.messages_per_event = workload.messages / spec.events
    figures.generation_rate = workload.events_per_second_generated
    with PeakSampler() as sampler:
        result = e2e.measure(spark, bootstrap, workload, work / "e2e", mode.max_offsets_per_trigger, log=run.log)
    iceberg = e2e.iceberg_run(spark, bootstrap, workload, work / "e2e", result, log=run.log)
    figures.rate = result.cdclake.rate
    run.targets.append(report.at_least("e2e_merge_vs_append", result.ratio, E2E_GOAL))
    peak = sampler.peak / GIB
    run.targets.append(report.at_most("driver_peak_rss", peak, MEMORY_GOAL_GIB, " GiB"))
    steps = sorted(result.cdclake.steps.items(), key=lambda item: -item[1])
    run.sections.append(
        (
            "b. End to end, Kafka -> Delta",
            [
                f"{spec.events:,} source changes over {spec.tables} tables ({spec.keys_per_table:,} keys each, "
                f"{spec.update_ratio:.0%} updates, {spec.delete_ratio:.0%} deletes) = {workload.messages:,} "
                f"DataWorks messages; maxOffsetsPerTrigger {mode.max_offsets_per_trigger:,}.",
                "",
                "| run | messages | seconds | msg/s | batches |",
                "|---|---:|---:|---:|---:|",
                f"| plain append | {result.append.messages:,} | {result.append.seconds:.1f} | "
                f"{result.append.rate:,.0f} | {result.append.batches} |",
                f"| cdclake MERGE | {result.cdclake.messages:,} | {result.cdclake.seconds:.1f} | "
                f"{result.cdclake.rate:,.0f} | {result.cdclake.batches} |",
                f"| cdclake MERGE into Iceberg tables (information, no target) | {iceberg.messages:,} | "
                f"{iceberg.seconds:.1f} | {iceberg.rate:,.0f} | {iceberg.batches} |",
                "",
                f"cdclake / append = **{result.ratio:.2f}**; {result.cdclake.applied:,} folded row changes applied. "
                f"The same run into Iceberg lake tables (`table_format: iceberg`, merge-on-read) took "
                f"{iceberg.seconds:.1f} s ({iceberg.rate / result.append.rate:.2f} of the append); its MERGE step "
                f"{iceberg.steps.get('merge', 0.0):.1f} s against Delta's "
                f"{result.cdclake.steps.get('merge', 0.0):.1f} s.",
                "",
                "cdclake time per step, summed over batches (s): "
                + ", ".join(f"{step} {seconds:.1f}" for step, seconds in steps)
                + f"; outside the steps (Kafka read, streaming engine): "
                f"{max(0.0, result.cdclake.seconds - sum(result.cdclake.steps.values())):.1f}.",
                "",
                f"e. Driver peak RSS (Python + driver JVM, spark.driver.memory={DRIVER_HEAP}) during both runs: "
                f"**{peak:.2f} GiB** ({sampler.samples} samples).",
            ],
        )
    )
    run.panels.append(
        plot.Panel(
            "B. KAFKA TO DELTA, THOUSAND MSG/S",
            [
                plot.Bar(
                    "plain append", [(result.append.rate / 1000, "baseline")], f"{result.append.rate / 1000:.1f}K"
                ),
                plot.Bar(
                    "cdclake merge", [(result.cdclake.rate / 1000, "cdclake")], f"{result.cdclake.rate / 1000:.1f}K"
                ),
                plot.Bar("into iceberg", [(iceberg.rate / 1000, "cdclake")], f"{iceberg.rate / 1000:.1f}K"),
            ],
        )
    )
    run.panels.append(
        plot.Panel(
            "E. DRIVER PEAK RSS, GIB (LINE: 4 GIB)",
            [plot.Bar("python + jvm", [(peak, "cdclake")], f"{peak:.2f}")],
            limit=MEMORY_GOAL_GIB,
        )
    )


STEP_COLORS = {"decode": "decode", "plan": "plan", "fold": "fold", "merge": "merge", "tombstones": "tombstones"}


def run_scaling(run: Run, spark: Any, work: Path) -> None:
    mode = run.mode
    points = scaling.measure(spark, mode.scaling_tables, mode.scaling_events_per_batch, work / "scaling", log=run.log)
    by_tables = {point.tables: point for point in points}
    if 1 in by_tables and 100 in by_tables:
        ratio = by_tables[100].seconds / by_tables[1].seconds
        run.targets.append(report.at_most("table_scaling_100_vs_1", ratio, SCALING_GOAL, "x", digits=1))
    step_names = sorted({step for point in points for step in point.steps})
    rows = [
        f"| tables | events in batch | batch s (median of {scaling.TIMED_BATCHES}) | timed batches s | first batch s | "
        + " | ".join(step_names)
        + " | Spark jobs per table | of them Delta state rebuilds |",
        "|---:|---:|---:|---:|---:|" + "---:|" * len(step_names) + "---:|---:|",
    ]
    bars = []
    for point in points:
        rows.append(
            f"| {point.tables:,} | {point.messages:,} | {point.seconds:.1f} | "
            f"{', '.join(f'{seconds:.1f}' for seconds in point.batch_seconds)} | {point.first_batch_seconds:.1f} | "
            + " | ".join(f"{point.steps.get(step, 0.0):.2f}" for step in step_names)
            + f" | {point.jobs_per_table:.2f} | {point.state_rebuilds_per_table:.2f} |"
        )
        segments = [(point.steps.get(step, 0.0), STEP_COLORS.get(step, "other")) for step in step_names]
        other = point.seconds - sum(point.steps.values())
        bars.append(
            plot.Bar(f"{point.tables} tables", [*segments, (max(0.0, other), "other")], f"{point.seconds:.1f} S")
        )
    title = "c. Table-count scaling (steady batches of the same events; steps of the median batch)"
    run.sections.append((title, rows))
    run.panels.append(
        plot.Panel("C. SECONDS PER BATCH BY TABLES TOUCHED", bars, [*dict.fromkeys(STEP_COLORS.values()), "other"])
    )


def run_freshness(run: Run, spark: Any, bootstrap: str, work: Path, figures: StreamFigures) -> None:
    if math.isnan(figures.rate) or figures.spec is None:
        raise RuntimeError("needs the end-to-end benchmark's maximum rate (run e2e too)")
    rate = FRESHNESS_SHARE * figures.rate
    result = freshness.measure(
        spark,
        bootstrap,
        figures.spec,
        rate,
        run.mode.freshness_seconds,
        figures.messages_per_event,
        figures.generation_rate,
        work,
        log=run.log,
    )
    run.targets.append(report.at_most("freshness_p50", result.p50, FRESHNESS_P50_GOAL, " s", digits=1))
    run.targets.append(report.at_most("freshness_p95", result.p95, FRESHNESS_P95_GOAL, " s", digits=1))
    run.sections.append(
        (
            "d. Freshness",
            [
                f"Paced producer at {rate:,.0f} msg/s ({FRESHNESS_SHARE:.0%} of the measured maximum) for "
                f"{result.seconds:.0f} s; trigger: processing time 0 s; {result.batches} batches.",
                "",
                f"Event time -> commit: p50 **{result.p50:.1f} s**, p95 **{result.p95:.1f} s**, max {result.max:.1f} s "
                f"over {result.messages:,} messages (first 10% left out); producer lag p95 "
                f"{result.producer_lag_p95:.2f} s.",
            ],
        )
    )
    run.panels.append(
        plot.Panel(
            f"D. FRESHNESS AT {rate:,.0f} MSG/S, SECONDS",
            [
                plot.Bar("p50", [(result.p50, "p50")], f"{result.p50:.1f}"),
                plot.Bar("p95", [(result.p95, "p95")], f"{result.p95:.1f}"),
            ],
        )
    )


# ------------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, spark: Any = None) -> int:
    args = parse(argv)
    mode = mode_from(args)
    selected = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(selected) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {BENCHMARKS}", file=sys.stderr)
        return 2
    run = Run(mode)
    started = time.perf_counter()
    work = OUT / "run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    from cdclake.workload import renderers

    formats = [name for name in args.formats.split(",") if name] or list(renderers())
    if spark is None:
        from cdclake.spark import get_session

        conf = {"spark.driver.memory": DRIVER_HEAP, **RETAINED_JOBS}
        spark = get_session("cdclake-bench", master="local[2]", conf=conf)
    run.log(f"{mode.name}: {', '.join(selected)}; formats with a renderer: {', '.join(formats)}")

    if "decode" in selected:
        run_decode(run, spark, formats)
    figures = StreamFigures()
    if "e2e" in selected or "freshness" in selected:
        from cdclake.devtools import broker

        kafka_dir = OUT / "kafka"
        try:
            info = broker.start(kafka_dir, args.kafka_port, fresh=True)
            run.log(f"kafka broker at {info.bootstrap_servers}")
            if "e2e" in selected:
                guarded(
                    run,
                    [
                        ("e2e_merge_vs_append", f">= {E2E_GOAL:g}"),
                        ("driver_peak_rss", f"<= {MEMORY_GOAL_GIB:g} GiB"),
                    ],
                    lambda: run_e2e(run, spark, info.bootstrap_servers, work, figures),
                )
            if "freshness" in selected:
                guarded(
                    run,
                    [
                        ("freshness_p50", f"<= {FRESHNESS_P50_GOAL:g} s"),
                        ("freshness_p95", f"<= {FRESHNESS_P95_GOAL:g} s"),
                    ],
                    lambda: run_freshness(run, spark, info.bootstrap_servers, work, figures),
                )
        finally:
            broker.stop(kafka_dir)
    if "scaling" in selected:
        guarded(
            run,
            [("table_scaling_100_vs_1", f"<= {SCALING_GOAL:g}x")],
            lambda: run_scaling(run, spark, work),
        )

    elapsed = time.perf_counter() - started
    run.log(f"{mode.name} finished in {elapsed / 60:.1f} min")
    args.results.mkdir(parents=True, exist_ok=True)
    plot_name = "results.png"
    report.write_plot(args.results / plot_name, run.panels)
    command = "make bench-quick" if args.quick else "make bench"
    run.sections.append(("Run log", ["```", *run.log_lines, "```"]))
    report.write_results(
        args.results / "RESULTS.md",
        mode=f"{mode.name}, {elapsed / 60:.1f} min",
        command=command,
        targets=run.targets,
        sections=run.sections,
        plot_name=plot_name,
    )
    print()
    for target in run.targets:
        print(target.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
