"""Decoding with each decoder's plan reused (``cdclake.formats._plans``) against building it for every batch.

``python -m benchmarks.decode_plans [--formats a,b] [--events 20000] [--repeats 4]``

Per format, on the decode benchmark's workload (``benchmarks.decode``): the same messages decoded through
``decode_batch`` with the plan reused (A) and built anew (B, as before ``_plans``), alternating A/B and B/A, each
forced through the ``noop`` writer and timed from building the frame, best of ``repeats``. The workload is the decode
benchmark's (10,000 keys per table), so its cached files are reused. Checks first that both give the same events.
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from benchmarks.ab import _plans_per_batch
from benchmarks.decode import _noop
from benchmarks.workload import WorkloadSpec, materialize, message_frame
from cdclake.formats import decode_batch, get_format
from cdclake.workload import renderers


def _as_text(frame: DataFrame) -> DataFrame:
    return frame.select(F.to_json(F.struct(*frame.columns)).alias("event"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--formats", default="", help="comma-separated (default: every format with a renderer)")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()

    from cdclake.spark import get_session

    spark = get_session("cdclake-decode-plans", master="local[2]", conf={"spark.driver.memory": "3g"})
    names = [n for n in args.formats.split(",") if n] or sorted(renderers())
    for name in names:
        workload = materialize(WorkloadSpec(format=name, events=args.events, keys_per_table=10_000))
        messages = message_frame(spark, workload.path)
        fmt = get_format(name)
        options = workload.format_options
        reused = _as_text(decode_batch(fmt, messages, options))
        with _plans_per_batch(spark):
            rebuilt = _as_text(decode_batch(fmt, messages, options))
        differ = reused.exceptAll(rebuilt).count() + rebuilt.exceptAll(reused).count()
        times: dict[str, list[float]] = {"reused": [], "rebuilt": []}
        for repeat in range(args.repeats):
            for side in ("reused", "rebuilt") if repeat % 2 == 0 else ("rebuilt", "reused"):
                with _plans_per_batch(spark) if side == "rebuilt" else nullcontext():
                    started = time.perf_counter()
                    frame = decode_batch(fmt, messages, options)
                    times[side].append(time.perf_counter() - started + _noop(frame))
        a, b = min(times["reused"]), min(times["rebuilt"])
        print(
            f"{name}: {workload.messages:,} messages; plan reused {a:.2f} s, built per batch {b:.2f} s "
            f"(reused/built {a / b:.2f}); events that differ: {differ}",
            flush=True,
        )
        messages.unpersist()


if __name__ == "__main__":
    main()
