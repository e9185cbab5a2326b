"""A/B comparison of pipeline settings on the same batches, interleaved so that machine noise hits both sides alike.

``python -m benchmarks.ab --variant NAME [--tables 10 --events-per-batch 25000 --batches 4]``

One workload is cut into ``batches`` batches by offset; two pipelines (A = as is, B = with the variant) each apply
every batch to their own lake, alternating A, B, A, B... The first batch (table creation) is reported apart. Used to
produce the before/after figures of the performance commits; variants are named settings of the session or sink.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from typing import Any
from unittest import mock

from pyspark.sql import functions as F

from benchmarks.workload import OUT, WorkloadSpec, materialize, message_frame
from cdclake import pipeline
from cdclake.formats import _plans
from cdclake.pipeline import Pipeline, PipelineSettings
from cdclake.sinks import delta, history
from cdclake.sinks.delta import DeltaSink
from cdclake.spark import session_settings


@contextmanager
def _nothing(_: Any) -> Iterator[None]:
    yield


def _merge_small_tables(_: Any) -> AbstractContextManager[Any]:
    """Every table's changes by a MERGE, however small the table (before DeltaSink.REWRITE_MAX_BYTES)."""
    return mock.patch.object(DeltaSink, "REWRITE_MAX_BYTES", -1)


def _merge_settings_off(_: Any) -> AbstractContextManager[Any]:
    """MERGEs with the session's shuffle partitions and Delta's source materialisation (before DeltaSink.merging)."""
    return mock.patch.object(DeltaSink, "merging", return_value=nullcontext())


def _write_inline(self: Any, step: str, write: Callable[..., None], *args: object) -> None:
    with self.result.timed(step):
        write(*args)


def _inline_bookkeeping(_: Any) -> AbstractContextManager[Any]:
    """Bookkeeping appends written inline, in the batch's thread (as before the background writer)."""
    return mock.patch.object(pipeline._Bookkeeping, "submit", _write_inline)


def _generated_apply(_: Any) -> AbstractContextManager[Any]:
    """Small batches applied with the session's projection setting (before pipeline.SMALL_BATCH_SETTINGS)."""
    return mock.patch.object(pipeline, "SMALL_BATCH_SETTINGS", {})


def _no_key_ranges(_: Any) -> AbstractContextManager[Any]:
    """MERGEs without the key-range conditions on the target (before delta._key_ranges): every file is read."""
    return mock.patch.object(delta, "_key_ranges", return_value=[])


def _key_ranges_always(_: Any) -> AbstractContextManager[Any]:
    """Key-range conditions on every MERGE, whatever the table's size (before DeltaSink.KEY_RANGES_MIN_BYTES)."""
    return mock.patch.object(DeltaSink, "key_ranges_pay", return_value=True)


@contextmanager
def _plans_per_batch(_: Any) -> Iterator[None]:
    """Decoders' plans built anew for every batch (before cdclake.formats._plans)."""
    with (
        mock.patch.object(_plans, "decode_reusing_plan", lambda decode, messages, options: decode(messages, options)),
        mock.patch.object(
            _plans,
            "decode_with_definitions_reusing_plan",
            lambda decode, messages, options, known: decode(messages, options, known),
        ),
        mock.patch.object(
            _plans,
            "decode_with_batch_inputs_reusing_plan",
            lambda decode, messages, options, known, inputs: decode(messages, options, known, inputs),
        ),
    ):
        yield


def _looked_up_merge_columns(image: Any, _in_order: Any, names: Any) -> list[tuple[Any, Any]]:
    keys = F.map_keys(image)
    return [(image[name], F.array_contains(keys, F.lit(name))) for name in names]


def _merge_source_lookups(_: Any) -> AbstractContextManager[Any]:
    """Every table column of a MERGE source looked up in the image by name (before delta._image_columns read an
    image in the table's column order by position)."""
    return mock.patch.object(delta, "_image_columns", _looked_up_merge_columns)


def _scd2_running_windows(_: Any) -> AbstractContextManager[Any]:
    """Every SCD2 chain with two running windows per column, as a batch with partial images needs (before
    history.HistorySink._scd2 took one offset window for batches without them)."""
    scd2 = history.HistorySink._scd2
    return mock.patch.object(
        history.HistorySink, "_scd2", lambda self, item, changes: scd2(self, replace(item, partial=True), changes)
    )


def _history_constraint_propagation(_: Any) -> AbstractContextManager[Any]:
    """History tables written with the session's constraint propagation (before history wrote them under
    delta.NO_CONSTRAINT_PROPAGATION); lake MERGEs keep their setting."""
    return mock.patch.object(history, "NO_CONSTRAINT_PROPAGATION", {})


@contextmanager
def _history_as_before(spark: Any) -> Iterator[None]:
    """History tables written with the session's constraint propagation (:func:`_history_constraint_propagation`)
    and every SCD2 chain with running windows (:func:`_scd2_running_windows`)."""
    with _history_constraint_propagation(spark), _scd2_running_windows(spark):
        yield


def _no_constraint_reads(_: Any) -> AbstractContextManager[Any]:
    """No read of the lake tables' CHECK constraints per batch (before cdclake.constraints)."""
    return mock.patch.object(DeltaSink, "check_constraints", return_value={})


def _log_store(class_name: str) -> Callable[[Any], AbstractContextManager[Any]]:
    """Delta's log store ``class_name`` for the side's file: paths (cdclake.spark.EMBEDDED_CONF sets LocalLogStore).

    Delta picks a table's log store when it first opens the table, from the live SparkConf, so the side's tables keep
    the store they were opened with: the side sets it while its batches run (the first one opens its tables)."""

    @contextmanager
    def use(spark: Any) -> Iterator[None]:
        conf = spark.sparkContext._jsc.sc().conf()
        key = "spark.delta.logStore.file.impl"
        before = conf.getOption(key)
        conf.set(key, class_name)
        try:
            yield
        finally:
            if before.isDefined():
                conf.set(key, before.get())
            else:
                conf.remove(key)

    return use


VARIANTS: dict[str, Callable[[Any], AbstractContextManager[Any]]] = {
    # Delta's default log store for file: paths (before cdclake.spark.EMBEDDED_CONF chose LocalLogStore).
    "hdfs-log-store": _log_store("io.delta.storage.HDFSLogStore"),
    "plans-per-batch": _plans_per_batch,
    "no-constraint-reads": _no_constraint_reads,
    "no-key-ranges": _no_key_ranges,
    "merge-source-lookups": _merge_source_lookups,
    "scd2-running-windows": _scd2_running_windows,
    "history-as-before": _history_as_before,
    "history-constraint-propagation": _history_constraint_propagation,
    "no-constraint-propagation": lambda spark: session_settings(spark, delta.NO_CONSTRAINT_PROPAGATION),
    "key-ranges-always": _key_ranges_always,
    "inline-bookkeeping": _inline_bookkeeping,
    "merge-settings-off": _merge_settings_off,
    "merge-small-tables": _merge_small_tables,
    "same": _nothing,
    "no-materialize-source": lambda spark: session_settings(
        spark, {"spark.databricks.delta.merge.materializeSource": "none"}
    ),
    "materialize-source": lambda spark: session_settings(
        spark, {"spark.databricks.delta.merge.materializeSource": "auto"}
    ),
    "deletion-vectors-always": _nothing,
    "deletion-vectors-never": _nothing,
    "shuffle-2": lambda spark: session_settings(spark, {"spark.sql.shuffle.partitions": "2"}),
    "shuffle-8": lambda spark: session_settings(spark, {"spark.sql.shuffle.partitions": "8"}),
    "no-stats-collection": lambda spark: session_settings(spark, {"spark.databricks.delta.stats.collect": "false"}),
    "snapshot-partitions-1": lambda spark: session_settings(spark, {"spark.databricks.delta.snapshotPartitions": "1"}),
    "generated-apply": _generated_apply,
    "interpreted-projections": lambda spark: session_settings(spark, {"spark.sql.codegen.factoryMode": "NO_CODEGEN"}),
    "no-wholestage-codegen": lambda spark: session_settings(spark, {"spark.sql.codegen.wholeStage": "false"}),
    # Spark's own limit for whole-stage generated methods, before cdclake.spark.JIT_HUGE_METHOD_LIMIT (8,000).
    "huge-methods-65535": lambda spark: session_settings(spark, {"spark.sql.codegen.hugeMethodLimit": "65535"}),
    # Delta's auto compaction by the count of small files only, without its default mode's compaction of every table
    # on the first commit that adds files to it in the process (tried and reverted: AGENTS.md).
    "count-only-compaction": lambda spark: session_settings(
        spark, {"spark.databricks.delta.autoCompact.modifiedPartitionsOnly.enabled": "false"}
    ),
    # Writes without Delta's optimized write, which every table cdclake creates has (before delta.TABLE_PROPERTIES
    # had it; the session setting overrides the table property).
    "no-optimize-write": lambda spark: session_settings(
        spark, {"spark.databricks.delta.optimizeWrite.enabled": "false"}
    ),
    "no-checksum": lambda spark: session_settings(spark, {"spark.databricks.delta.writeChecksumFile.enabled": "false"}),
    "snapshot-1-no-checksum": lambda spark: session_settings(
        spark,
        {"spark.databricks.delta.snapshotPartitions": "1", "spark.databricks.delta.writeChecksumFile.enabled": "false"},
    ),
    "partitioned": _nothing,
    "threads-1": _nothing,
    "threads-2": _nothing,
    "threads-8": _nothing,
    "threads-16": _nothing,
}
"""Variants named ``threads-N`` run the side's pipeline with ``merge_threads=N``, ``deletion-vectors-M`` with
``deletion_vectors=M``, ``partitioned`` with :data:`PARTITION_BY`."""

PARTITION_BY: dict[str, list[str]] = {
    "*.customer*": ["vip"],
    "*.orders*": ["paid"],
    "*.inventory*": ["active"],
    "*.address*": ["is_primary"],
}
"""``partitioned``: the workload's tables partitioned by a boolean column (``shop.events`` has none and stays
unpartitioned). Its updates draw every value anew, so about half of them move their row to the other partition."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    parser.add_argument("--baseline", default="same", choices=sorted(VARIANTS))
    parser.add_argument("--format", default=WorkloadSpec.format, help="the workload's format (default %(default)s)")
    parser.add_argument("--tables", type=int, default=10)
    parser.add_argument("--extra-columns", type=int, default=0, help="padding columns added to every table")
    parser.add_argument("--keys-per-table", type=int, default=0)
    parser.add_argument("--events-per-batch", type=int, default=25_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--merge-threads", type=int, default=0)
    parser.add_argument("--first-batch-events", type=int, default=0, help="a bigger first batch (large tables)")
    parser.add_argument(
        "--history", choices=("changelog", "scd2"), help="both sides also write this history table of every table"
    )
    args = parser.parse_args()

    from cdclake.spark import get_session

    spark = get_session("cdclake-ab", master="local[2]")
    first = args.first_batch_events or args.events_per_batch
    spec = WorkloadSpec(
        format=args.format,
        extra_columns=args.extra_columns,
        events=first + args.events_per_batch * (args.batches - 1),
        tables=args.tables,
        keys_per_table=args.keys_per_table or max(16, args.events_per_batch * args.batches // (2 * args.tables)),
    )
    workload = materialize(spec)
    messages = message_frame(spark, workload.path)
    per_event = workload.messages / spec.events
    size = int(args.events_per_batch * per_event) + 1
    first_size = int(first * per_event) + 1
    root = OUT / "ab"
    shutil.rmtree(root, ignore_errors=True)
    sides = {"A": VARIANTS[args.baseline], "B": VARIANTS[args.variant]}
    pipelines = {}
    for side in sides:
        settings = PipelineSettings(
            lake=str(root / side), app_id=f"ab-{side}", default_format=spec.format, keys=workload.keys, name="ab"
        )
        name = args.baseline if side == "A" else args.variant
        threads = int(name.removeprefix("threads-")) if name.startswith("threads-") else args.merge_threads
        if threads:
            settings = PipelineSettings(**{**settings.__dict__, "merge_threads": threads})
        if args.history:
            settings = PipelineSettings(**{**settings.__dict__, args.history: True})
        if name == "partitioned":
            settings = PipelineSettings(**{**settings.__dict__, "partition_by": PARTITION_BY})
        if name.startswith("deletion-vectors-"):
            settings = PipelineSettings(**{**settings.__dict__, "deletion_vectors": name.rsplit("-", 1)[1]})
        pipelines[side] = Pipeline(spark, settings)
    totals: dict[str, float] = dict.fromkeys(sides, 0.0)
    steps: dict[str, dict[str, float]] = {side: {} for side in sides}
    print(f"A={args.baseline} B={args.variant}: {args.batches} batches of ~{size:,} messages, {args.tables} tables")
    for index in range(args.batches):
        start = 0 if index == 0 else first_size + (index - 1) * size
        end = first_size if index == 0 else start + size
        batch = messages.where((F.col("offset") >= start) & (F.col("offset") < end))
        for side, variant in sides.items():
            with variant(spark):
                started = time.perf_counter()
                result = pipelines[side].process_batch(batch, index)
                seconds = time.perf_counter() - started
            detail = " ".join(f"{k}={v:.2f}" for k, v in result.seconds.items())
            print(f"batch {index} {side}: {seconds:.2f} s ({result.messages:,} events) {detail}", flush=True)
            if index > 0:
                totals[side] += seconds
                for key, value in result.seconds.items():
                    steps[side][key] = steps[side].get(key, 0.0) + value
    for side in sides:
        detail = " ".join(f"{k}={v:.1f}" for k, v in steps[side].items())
        print(f"total {side} (batches 1..): {totals[side]:.1f} s; {detail}")
    print(f"B/A = {totals['B'] / totals['A']:.2f}")
    for side in sides:
        tables = [p for p in (root / side).glob("*/*") if p.is_dir() and p.parent.name != "_cdclake"]
        # Data files in partition folders too; not Delta's log checkpoints.
        files = sum(1 for table in tables for f in table.rglob("*.parquet") if "_delta_log" not in f.parts)
        print(f"{side}: {files} parquet files in user tables")


if __name__ == "__main__":
    main()
