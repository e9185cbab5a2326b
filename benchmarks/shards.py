"""Sharded tables routed into one lake table: one MERGE per batch against one MERGE per shard, same messages.

``python -m benchmarks.shards [--shards 16 --messages 40000 --batch 10000 --repeats 2 --history]``

``shop.orders_00`` .. ``orders_<N-1>`` (MySQL shards with disjoint keys, DataWorks JSON inserts and updates spread
over the shards at random) are replayed with ``routes: [{tables: [shop.orders_*], to: shop.orders}]`` twice per
repeat, alternately: as cdclake does it (the shards' changes of a batch share one MERGE,
``Pipeline._merge_units``), and as before that (one MERGE per shard, in turns). Both lakes must end with the same
rows. Figures: wall-clock seconds of the whole replay and of its ``merge`` step, best of the repeats, and the ratio.

With ``--history`` every shard has a changelog and an SCD2 table (they share the lake table's: one of each), and the
comparison covers them too: their writes as cdclake does them (one MERGE per history table and batch,
``cdclake.sinks.history._together``) against one per shard, in turns; the ``history`` step's seconds are printed.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

from pyspark.sql import SparkSession

from benchmarks.workload import OUT
from cdclake.pipeline import Pipeline
from cdclake.runner import replay
from cdclake.spark import get_session
from cdclake.tables import TableRoutes

ROUTES = TableRoutes.of([(["shop.orders_*"], "shop.orders")])


def _message(sequence: int, shard: int, key: int, value: str, update: bool) -> str:
    columns = [{"name": "id", "type": "LONG"}, {"name": "v", "type": "STRING"}]
    source = {"dbType": "MySQL", "dbName": "shop", "schemaName": None, "tableName": f"orders_{shard:02d}"}
    payload = {
        "before": None,
        "after": {"dataColumn": {"id": str(key), "v": value}},
        "sequenceId": str(sequence),
        "timestamp": {"eventTime": 1_709_288_131_000 + sequence},
        "op": "UPDATE_AFTER" if update else "INSERT",
        "ddl": None,
    }
    message = {"schema": {"dataColumn": columns, "primaryKey": ["id"], "source": source}, "payload": payload}
    return json.dumps({**message, "version": "1.0.0"})


def capture(path: Path, shards: int, messages: int, seed: int = 1) -> None:
    """``messages`` changes over ``shards`` shards; shard ``s`` owns the keys ``s * 10^7 + [0, 5000)``."""
    rng = random.Random(seed)
    seen: set[int] = set()
    lines = []
    for sequence in range(1, messages + 1):
        shard = rng.randrange(shards)
        key = shard * 10_000_000 + rng.randrange(5000)
        lines.append(_message(sequence, shard, key, f"v{sequence}", key in seen))
        seen.add(key)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _one_merge_per_shard(_: Pipeline, plans: Sequence) -> list[list]:  # type: ignore[type-arg]
    return [[plan] for plan in sorted(plans, key=lambda p: p.table_id)]


def _one_history_merge_per_shard(work: Sequence, path_of: object) -> list:  # type: ignore[type-arg]
    del path_of
    return list(work)


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--batch", type=int, default=10_000, help="messages per batch")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--history", action="store_true", help="with changelog and SCD2 tables")
    parser.add_argument("--out", type=Path, default=OUT / "shards")
    args = parser.parse_args(argv)
    spark = spark or get_session("cdclake-bench-shards", master="local[2]", conf={"spark.driver.memory": "3g"})
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    source = args.out / "capture.jsonl"
    capture(source, args.shards, args.messages)
    sides = {"one MERGE per batch": None, "one MERGE per shard": _one_merge_per_shard}
    best: dict[str, tuple[float, float, float]] = {}
    rows: dict[str, int] = {}
    history_rows: dict[str, tuple[int, ...]] = {}
    with_history = " with history tables" if args.history else ""
    print(f"{args.shards} shards, {args.messages:,} messages, batches of {args.batch:,}{with_history}")
    for repeat in range(args.repeats):
        for index, (name, units) in enumerate(sides.items()):
            lake = str(args.out / f"lake-{index}-{repeat}")
            with ExitStack() as patches:
                if units:
                    patches.enter_context(mock.patch.object(Pipeline, "_merge_units", units))
                    if args.history:
                        patches.enter_context(
                            mock.patch("cdclake.sinks.history._together", _one_history_merge_per_shard)
                        )
                started = time.perf_counter()
                results = replay(
                    spark,
                    lake=lake,
                    format_name="dataworks-json",
                    paths=[str(source)],
                    routes=ROUTES,
                    batch_lines=args.batch,
                    changelog=args.history,
                    scd2=args.history,
                )
                seconds = time.perf_counter() - started
            merge = sum(result.seconds.get("merge", 0.0) for result in results)
            history = sum(result.seconds.get("history", 0.0) for result in results)
            rows[name] = spark.read.format("delta").load(f"{lake}/shop/orders").count()
            if args.history:  # the same history both ways too (row counts, compared below)
                history_rows[name] = tuple(
                    spark.read.format("delta").load(f"{lake}/_cdclake/{kind}/shop/orders").count()
                    for kind in ("changelog", "scd2")
                )
            logged = f", history step {history:.1f} s" if args.history else ""
            print(f"repeat {repeat} {name}: {seconds:.1f} s, merge step {merge:.1f} s{logged}, {rows[name]:,} rows")
            total, merged, written = best.get(name, (seconds, merge, history))
            best[name] = (min(total, seconds), min(merged, merge), min(written, history))
    if len(set(rows.values())) != 1:
        raise SystemExit(f"the two lakes differ: {rows}")
    if len(set(history_rows.values())) > 1:
        raise SystemExit(f"the two lakes' history tables differ (changelog, SCD2 row counts): {history_rows}")
    (ours, ours_merge, ours_history), (before, before_merge, before_history) = best.values()
    if args.history:
        print("| | seconds | merge step s | history step s |\n|---|---:|---:|---:|")
        for name, (total, merged, written) in best.items():
            print(f"| {name} | {total:.1f} | {merged:.1f} | {written:.1f} |")
        ratios = f"merge step {ours_merge / before_merge:.2f}, history step {ours_history / before_history:.2f}"
    else:
        print("| | seconds | merge step s |\n|---|---:|---:|")
        for name, (total, merged, _) in best.items():
            print(f"| {name} | {total:.1f} | {merged:.1f} |")
        ratios = f"merge step {ours_merge / before_merge:.2f}"
    print(f"one MERGE per batch / one per shard: {ours / before:.2f} ({ratios})")


if __name__ == "__main__":
    main()
