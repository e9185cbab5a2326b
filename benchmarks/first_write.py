"""A new lake table's first write: created empty and then MERGEd into, or created with its rows in one commit
(``DeltaSink.ensure_table(defer_creation=True)``, what the pipeline does for a table it finds missing).

``python -m benchmarks.first_write [--tables 12 --changes 200]``

Each round creates two tables of the same ``changes`` upserts, one each way, in turns (the ways alternate which goes
first), then MERGEs a second batch of as many changes (half new keys, half updates) into each: the next batch's
MERGE shows whether a table created with its rows costs more later (Delta compacts each table on the first commit
that adds files to it in a process, and that compaction also computes the table's state). The first round warms
the session up and is not counted. Figures: median seconds per table of the first write, the second MERGE, and both.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.key_ranges import COLUMNS, upserts
from benchmarks.workload import OUT
from cdclake.apply import TablePlan
from cdclake.sinks.delta import DeltaSink, Txn
from cdclake.spark import get_session

WAYS = ("created, then MERGE", "created with its rows")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=12, help="tables per way (rounds)")
    parser.add_argument("--changes", type=int, default=200, help="upserts per batch")
    parser.add_argument("--out", type=Path, default=OUT, help="where the scratch lake goes")
    args = parser.parse_args(argv)

    spark = get_session("cdclake-bench-first-write", master="local[2]", conf={"spark.driver.memory": "3g"})
    lake = args.out / "first-write-lake"
    shutil.rmtree(lake, ignore_errors=True)
    sink = DeltaSink(spark, str(lake))
    first: dict[str, list[float]] = {way: [] for way in WAYS}
    second: dict[str, list[float]] = {way: [] for way in WAYS}
    for round_ in range(args.tables + 1):
        ways = WAYS if round_ % 2 else WAYS[::-1]
        for way in ways:
            plan = TablePlan(
                f"db\x1f\x1ft{round_}_{WAYS.index(way)}",
                "db",
                None,
                f"t{round_}_{WAYS.index(way)}",
                list(COLUMNS),
                ["id"],
            )
            batches = [upserts(spark, args.changes * (1 + batch), args.changes, batch) for batch in range(2)]
            started = time.perf_counter()
            with sink.idempotent(Txn("bench", 0)):
                columns = sink.ensure_table(plan, defer_creation=way == WAYS[1])
                sink.merge(plan, columns, batches[0])
            written = time.perf_counter()
            with sink.idempotent(Txn("bench", 1)):
                sink.merge(plan, sink.ensure_table(plan), batches[1])
            done = time.perf_counter()
            if round_:
                first[way].append(written - started)
                second[way].append(done - written)
    print(f"{args.tables} tables per way, {args.changes} upserts per batch; median seconds per table (2 cores, warm)")
    print("| way | first write | second MERGE | both |")
    print("|---|---:|---:|---:|")
    for way in WAYS:
        both = [a + b for a, b in zip(first[way], second[way], strict=True)]
        print(
            f"| {way} | {statistics.median(first[way]):.2f} | {statistics.median(second[way]):.2f} | "
            f"{statistics.median(both):.2f} |"
        )
    ratio = statistics.median(first[WAYS[1]]) / statistics.median(first[WAYS[0]])
    print(f"first write, with its rows / created then MERGE: {ratio:.2f}")
    shutil.rmtree(lake, ignore_errors=True)


if __name__ == "__main__":
    main()
