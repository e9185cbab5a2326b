"""The tombstone gate's cost as the tombstones table grows, before and after it read from the batch's lowest order.

``python -m benchmarks.gate [--tombstones 10000,1000000,10000000 --tables 10 --changes 1000 --repeats 3]``

The tombstones table keeps every deleted key for the retention period (a week by default), so it grows with every
delete of the stream. For each size, a batch of ``changes`` folded changes over ``tables`` tables is gated three
ways, interleaved, in the same run:

* ``every tombstone``: the tables' whole tombstones, as the gate read them before ``TablePlan.first_order`` (the
  baseline);
* ``in order``: the pipeline's bounds, for a batch newer than every tombstone (a stream read in source order);
* ``late``: the same bounds for a batch older than every tombstone (a replay of old messages into the lake), which
  still has to read them all.

Each figure is the best of ``repeats`` runs of the gate plus a local checkpoint of its result, as the pipeline runs it.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.workload import OUT
from cdclake import apply
from cdclake.sinks.delta import DeltaSink
from cdclake.spark import get_session

POSITION_WIDTH = 26
APPENDS_PER_STEP = 10
"""Each growth step is written as this many appends, so the table has files to skip, as a stream's appends make."""


def _position(number: int) -> str:
    return f"{number:0{POSITION_WIDTH}d}"


def _tombstones(spark: SparkSession, first: int, count: int, tables: int, chunk: int) -> DataFrame:
    """The tombstones numbered ``first`` .. ``first + count - 1`` (each ordered by its number) that fall in append
    ``chunk``: those whose number modulo ``APPENDS_PER_STEP`` is ``chunk``."""
    return (
        spark.range(first, first + count)
        .where(F.col("id") % APPENDS_PER_STEP == chunk)
        .select(
            F.concat(F.lit("db\x1f\x1ft"), (F.col("id") % tables).cast("string")).alias(apply.TABLE_ID),
            F.to_json(F.array(F.col("id").cast("string"))).alias(apply.ROW_KEY),
            F.lpad(F.col("id").cast("string"), POSITION_WIDTH, "0").alias("position"),
            F.current_timestamp().alias("event_time"),
            F.current_timestamp().alias("recorded_at"),
        )
        .coalesce(1)
    )


def _folded(spark: SparkSession, changes: int, tables: int, order: str) -> DataFrame:
    return (
        spark.range(changes)
        .select(
            F.concat(F.lit("db\x1f\x1ft"), (F.col("id") % tables).cast("string")).alias(apply.TABLE_ID),
            F.to_json(F.array((F.col("id") * 7919).cast("string"))).alias(apply.ROW_KEY),
            F.lit(apply.UPSERT).alias(apply.KIND),
            F.lit(order).alias(apply.ORDER),
        )
        .localCheckpoint(eager=True)
    )


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tombstones", default="10000,1000000,10000000", help="table sizes, ascending")
    parser.add_argument("--tables", type=int, default=10)
    parser.add_argument("--changes", type=int, default=1000, help="folded changes in the gated batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT, help="where the scratch lake goes")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.tombstones.split(",")]

    spark = spark or get_session("cdclake-bench-gate", master="local[2]", conf={"spark.driver.memory": "3g"})
    lake = args.out / "gate-lake"
    shutil.rmtree(lake, ignore_errors=True)
    sink = DeltaSink(spark, str(lake))
    table_ids = [f"db\x1f\x1ft{i}" for i in range(args.tables)]
    newest = _position(sizes[-1] + 1)
    batches: dict[str, tuple[DataFrame, dict[str, str | None]]] = {
        "every tombstone": (_folded(spark, args.changes, args.tables, newest), dict.fromkeys(table_ids)),
        "in order": (_folded(spark, args.changes, args.tables, newest), dict.fromkeys(table_ids, newest)),
        "late": (_folded(spark, args.changes, args.tables, _position(0)), dict.fromkeys(table_ids, _position(0))),
    }
    written = 0
    print(f"{args.changes:,} folded changes over {args.tables} tables; best of {args.repeats} (s)")
    print(f"| tombstones | {' | '.join(batches)} | every tombstone / in order |")
    print(f"|---:|{'---:|' * len(batches)}---:|")
    for size in sizes:
        for chunk in range(APPENDS_PER_STEP):
            sink.append(sink.TOMBSTONES, _tombstones(spark, written, size - written, args.tables, chunk), None)
        written = size
        times: dict[str, list[float]] = {name: [] for name in batches}
        for _ in range(args.repeats):
            for name, (folded, lowest_orders) in batches.items():
                started = time.perf_counter()
                sink.gate(folded, lowest_orders).localCheckpoint(eager=True)
                times[name].append(time.perf_counter() - started)
        best = {name: min(values) for name, values in times.items()}
        figures = " | ".join(f"{best[name]:.2f}" for name in batches)
        print(f"| {size:,} | {figures} | {best['every tombstone'] / best['in order']:.1f}x |", flush=True)
    shutil.rmtree(lake, ignore_errors=True)


if __name__ == "__main__":
    main()
