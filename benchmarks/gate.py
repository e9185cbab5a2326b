"""The tombstone gate's cost as the tombstones table grows: reading every tombstone, reading from the batch's lowest
order, and not reading when no tombstone reaches that order.

``python -m benchmarks.gate [--tombstones 10000,1000000,10000000 --tables 10 --changes 1000 --repeats 3]``

The tombstones table keeps every deleted key for the retention period (a week by default), so it grows with every
delete of the stream. For each size, a batch of ``changes`` folded changes over ``tables`` tables is gated three
ways, interleaved, in the same run:

* ``every tombstone``: the tables' whole tombstones, as the gate read them before ``TablePlan.first_order`` (the
  baseline);
* ``in order, read``: the pipeline's bounds in the read, for a batch newer than every tombstone (a stream read in
  source order), as the gate ran before it kept per-table bounds (``TombstoneBounds``): a new snapshot of the table and
  a read that Delta's file statistics leave empty;
* ``in order``: the same batch as the gate runs it now: the per-table bounds, followed from the table's commit files,
  show that no tombstone reaches the batch, so nothing is read;
* ``late``: a batch older than every tombstone (a replay of old messages into the lake), which still has to read
  them all.

Each figure is the best of ``repeats`` runs of the gate plus a local checkpoint of its result, as the pipeline runs it.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.workload import OUT
from cdclake import apply
from cdclake.sinks._tombstone_bounds import TombstoneBounds
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


class _EveryTableBounds(TombstoneBounds):
    """Bounds that let every table through: the gate then reads the tombstones from each table's lowest order, as it
    did before it kept bounds."""

    def tables_to_gate(self, lowest_orders: Mapping[str, str | None]) -> list[str]:
        return sorted(lowest_orders)


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
    sink, reading_sink = DeltaSink(spark, str(lake)), DeltaSink(spark, str(lake))
    reading_sink.tombstone_bounds = _EveryTableBounds(
        spark, reading_sink.system_path(reading_sink.TOMBSTONES), reading_sink._hadoop_path
    )
    table_ids = [f"db\x1f\x1ft{i}" for i in range(args.tables)]
    newest = _position(sizes[-1] + 1)
    in_order = _folded(spark, args.changes, args.tables, newest)
    batches: dict[str, tuple[DeltaSink, DataFrame, dict[str, str | None]]] = {
        "every tombstone": (reading_sink, in_order, dict.fromkeys(table_ids)),
        "in order, read": (reading_sink, in_order, dict.fromkeys(table_ids, newest)),
        "in order": (sink, in_order, dict.fromkeys(table_ids, newest)),
        "late": (sink, _folded(spark, args.changes, args.tables, _position(0)), dict.fromkeys(table_ids, _position(0))),
    }
    written = 0
    print(f"{args.changes:,} folded changes over {args.tables} tables; best of {args.repeats} (s)")
    print(f"| tombstones | {' | '.join(batches)} | every tombstone / in order | in order, read / in order |")
    print(f"|---:|{'---:|' * len(batches)}---:|---:|")
    for size in sizes:
        for chunk in range(APPENDS_PER_STEP):
            sink.append(sink.TOMBSTONES, _tombstones(spark, written, size - written, args.tables, chunk), None)
        written = size
        times: dict[str, list[float]] = {name: [] for name in batches}
        for _ in range(args.repeats):
            for name, (gating_sink, folded, lowest_orders) in batches.items():
                started = time.perf_counter()
                gating_sink.gate(folded, lowest_orders).localCheckpoint(eager=True)
                times[name].append(time.perf_counter() - started)
        best = {name: min(values) for name, values in times.items()}
        figures = " | ".join(f"{best[name]:.3f}" for name in batches)
        ratios = " | ".join(f"{best[name] / best['in order']:.1f}x" for name in ("every tombstone", "in order, read"))
        print(f"| {size:,} | {figures} | {ratios} |", flush=True)
    shutil.rmtree(lake, ignore_errors=True)


if __name__ == "__main__":
    main()
