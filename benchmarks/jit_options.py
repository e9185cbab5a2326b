"""JVM options for short-lived drivers, measured the way the test suite runs: two JVMs side by side on the cores.

``python -m benchmarks.jit_options [--options "-XX:..."] [--jvms 2] [--streams 12]``

Each side starts ``--jvms`` fresh driver processes at once (as pytest-xdist starts its workers), and each replays the
same rendered streams (6 formats, twice over, with SCD2 tables for two of the formats; 3 tables, two batches per
stream) from a cold start. The sides run one after the other, the defaults first: compare their wall times and the
CPU of the JIT compiler threads. Read from ``/proc``, so Linux only. Figures behind ``tests.conftest.TEST_JVM_OPTIONS``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.cpu import jvm_pid, process_cpu, thread_cpu
from tests.conftest import TEST_JVM_OPTIONS

STREAMS = [
    ("canal-json", False),
    ("ogg-json", True),
    ("dts-avro", False),
    ("maxwell-json", False),
    ("dataworks-json", True),
    ("qlik-json", False),
] * 2
"""(format, with an SCD2 table) replayed in order by each JVM: different decoders and history, as tests mix them."""


def _one_jvm(options: str, streams: int) -> None:
    """Child process: one driver JVM replaying :data:`STREAMS`; prints one ``RESULT`` line."""
    from cdclake.spark import get_session
    from cdclake.workload import SourceHistory, render_stream
    from tests.e2e.helpers import RENDERED_HISTORY, RENDERED_SHAPE, replay_in_two_batches

    started = time.perf_counter()
    conf = {"spark.sql.shuffle.partitions": "2"}
    if options:
        conf["spark.driver.extraJavaOptions"] = options
    spark = get_session("jit-options", master="local[2]", conf=conf)
    pid = jvm_pid(spark)
    # The rendered streams of tests/e2e/test_rendered_streams.py, replayed as it replays them.
    history = SourceHistory.generate(RENDERED_HISTORY)
    for format_name, scd2 in STREAMS[:streams]:
        stream = render_stream(format_name, history, RENDERED_SHAPE, seed=5)
        directory = Path(tempfile.mkdtemp(prefix="cdclake-jit-"))
        try:
            replay_in_two_batches(spark, directory, stream, format_name, scd2=scd2)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    print(
        f"RESULT {time.perf_counter() - started:.1f} {process_cpu(pid):.1f} {thread_cpu(pid, 'Compiler'):.1f}",
        flush=True,
    )
    spark.stop()


def _side(options: str, jvms: int, streams: int) -> list[tuple[float, float, float]]:
    """Starts ``jvms`` children at once; (wall s, JVM CPU s, compiler CPU s) of each."""
    arguments = ["--child", f"--options={options}", f"--streams={streams}"]
    command = [sys.executable, "-m", "benchmarks.jit_options", *arguments]
    with tempfile.TemporaryDirectory(prefix="cdclake-jit-logs-") as logs:
        # Their logs go to files: a pipe that nobody reads while another child is awaited would stall its writer.
        log_paths = [Path(logs) / f"child{index}.log" for index in range(jvms)]
        children = []
        for log_path in log_paths:
            with log_path.open("w") as log_file:
                children.append(
                    subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_file, text=True),
                )
        figures = []
        for child, log_path in zip(children, log_paths, strict=True):
            out, _ = child.communicate()
            line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
            if child.returncode != 0 or line is None:
                raise SystemExit(f"a child JVM failed (exit {child.returncode}):\n{log_path.read_text()[-3000:]}")
            wall, cpu, compiler = map(float, line.split()[1:])
            figures.append((wall, cpu, compiler))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--options", default=TEST_JVM_OPTIONS, help="default: the test sessions' options")
    parser.add_argument("--jvms", type=int, default=2)
    parser.add_argument("--streams", type=int, default=len(STREAMS), help="replay only the first N streams")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _one_jvm(args.options, args.streams)
        return
    sides = {"defaults": "", "options": args.options}
    results = {name: _side(options, args.jvms, args.streams) for name, options in sides.items()}
    for name, figures in results.items():
        walls = ", ".join(f"{w:.1f}" for w, _, _ in figures)
        print(
            f"{name:8s} {sides[name] or '(JVM defaults)'}: wall s {walls}; per JVM: CPU "
            f"{sum(c for _, c, _ in figures) / len(figures):.0f} s, JIT compiler threads "
            f"{sum(j for _, _, j in figures) / len(figures):.0f} s"
        )
    ratio = max(w for w, _, _ in results["options"]) / max(w for w, _, _ in results["defaults"])
    print(f"options / defaults (slowest JVM of each side): {ratio:.2f}")


if __name__ == "__main__":
    main()
