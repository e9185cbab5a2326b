"""Shared pieces of the end-to-end tests: workloads with known truth, and lake comparisons."""

from __future__ import annotations

import random
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from cdclake.config import KafkaConfig, PipelineConfig, TriggerConfig
from cdclake.devtools import broker
from cdclake.devtools.verify import TableComparison, compare_lake, describe, read_table, user_rows
from cdclake.formats import get_format
from cdclake.pipeline import BatchResult
from cdclake.runner import replay
from cdclake.sinks import TableFormat
from cdclake.workload import DataWorksOptions, HistoryConfig, Message, RenderOptions, SourceHistory, render, to_jsonl
from cdclake.workload.renderers import RenderedStream, to_capture


def workload(seed: int = 11, events: int = 300, **options: object) -> tuple[SourceHistory, list[Message]]:
    """A DataWorks stream with every trap of issue 2: both update modes, failover re-sends, heartbeats,
    transactions, a key-less table, a truncate, an added column and malformed messages."""
    history = SourceHistory.generate(
        HistoryConfig(
            seed=seed, tables=3, events=events, keys_per_table=25, keyless_tables=1, truncates=1, added_columns=1
        )
    )
    settings = {
        "update_mode": "mixed",
        "heartbeat_every": 40,
        "failover_resends": 2,
        "malformed": 3,
        "transactions": True,
        **options,
    }
    return history, render(history, DataWorksOptions(**settings), seed=seed)  # type: ignore[arg-type]


def write_lines(path: Path, messages: list[Message]) -> Path:
    path.write_text(to_jsonl(messages), encoding="utf-8")
    return path


def replay_lines(
    spark: SparkSession, directory: Path, name: str, lines: list[str], format_name: str, **settings: Any
) -> int:
    """Replays the message ``lines`` of ``format_name`` from the capture file ``<name>.jsonl`` in ``directory`` into
    the lake ``directory/lake`` with ``settings`` (``replay``'s keywords); the number of dead letters."""
    capture = directory / f"{name}.jsonl"
    capture.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    results = replay(spark, lake=str(directory / "lake"), format_name=format_name, paths=[str(capture)], **settings)
    return sum(r.dead_letters for r in results)


def lake_reader(spark: SparkSession, table_format: TableFormat) -> Callable[[str], list[dict[str, Any]]]:
    """Reads a lake table by its path, for :func:`~cdclake.devtools.verify.compare_lake`: a Delta table with
    delta-rs; an Iceberg table with Iceberg's Hadoop-table reader (by path, not through cdclake's catalog)."""
    if table_format == "delta":
        return read_table

    def read_iceberg(path: str) -> list[dict[str, Any]]:
        return user_rows(row.asDict() for row in spark.read.format("iceberg").load(path).collect())

    return read_iceberg


def history_table(
    spark: SparkSession, lake: str, kind: str, database: str, table: str, table_format: TableFormat = "delta"
) -> DataFrame | None:
    """The ``kind`` ("changelog", "scd2") history table of a lake table (names as in the lake), read by its path, or
    None when it has none. Where it is stored is part of the contract (README: History tables)."""
    if table_format == "delta":
        path = f"{lake}/_cdclake/{kind}/{database}/{table}"
        return spark.read.format("delta").load(path) if Path(path, "_delta_log").is_dir() else None
    path = f"{lake}/{database}/_{kind}_{table}"
    return spark.read.format("iceberg").load(path) if Path(path, "metadata").is_dir() else None


def scd2_reader(spark: SparkSession, lake: str, table_format: TableFormat) -> Callable[[str], list[dict[str, Any]]]:
    """Reads the live rows of a lake table's SCD2 table (current, not deleted) given the lake table's path, for
    :func:`~cdclake.devtools.verify.compare_lake`: they must equal the lake table's rows."""

    def read_live_versions(path: str) -> list[dict[str, Any]]:
        database, table = path.removeprefix(lake.rstrip("/") + "/").split("/")
        frame = history_table(spark, lake, "scd2", database, table, table_format)
        if frame is None:
            raise FileNotFoundError(f"no SCD2 table of {database}.{table}")
        live = frame.where("_cdc_is_current AND NOT _cdc_is_deleted")
        return user_rows(row.asDict() for row in live.collect())

    return read_live_versions


RENDERED_HISTORY = HistoryConfig(
    seed=7,
    tables=3,
    events=120,
    keys_per_table=15,
    keyless_tables=1,
    truncates=1,
    added_columns=1,
    null_ratio=0.2,
    oracle_tables=1,
    key_update_ratio=0.4,
)
"""The source history of every format's rendered stream in tests/e2e/test_rendered_streams.py (and of
``benchmarks.jit_options``, which replays the same streams): with primary-key updates and an Oracle-style table
since 2026-12-05 (before, seed 5 without them; the key-update streams were a test of their own, on this seed, for 7
formats)."""
RENDERED_SHAPE = RenderOptions(heartbeat_every=30, resends=1, malformed=2, transactions=True, partial_updates=True)
"""The traps those rendered streams carry."""


def replay_in_two_batches(
    spark: SparkSession, directory: Path, stream: RenderedStream, format_name: str, **settings: Any
) -> tuple[str, list[BatchResult]]:
    """Writes a rendered stream to a capture file in ``directory`` (base64 lines for a binary format, records when
    its messages have headers: ``cdclake.workload.renderers.to_capture``) and replays
    it into ``directory/lake`` in two batches with the stream's keys and format options (and ``settings``, extra
    arguments of ``cdclake.runner.replay``); returns the lake and the batch results."""
    binary = get_format(format_name).encoding == "binary"
    capture = directory / "capture.txt"
    text, encoding, captured = to_capture(stream.messages, binary=binary)
    capture.write_text(text, encoding="utf-8")
    lake = str(directory / "lake")
    results = replay(
        spark,
        lake=lake,
        format_name=format_name,
        paths=[str(capture)],
        encoding=encoding,
        keys=stream.keys,
        format_options=stream.format_options,
        batch_lines=captured // 2 + 1,
        **settings,
    )
    return lake, results


def assert_lake_equals_truth(lake: str, history: SourceHistory) -> None:
    """The Delta lake holds exactly ``history``'s truth, and some rows."""
    comparison = assert_tables_equal_truth(lake, history.truth())
    assert sum(r.actual_rows for r in comparison) > 0


def assert_tables_equal_truth(
    lake: str,
    truth: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]],
    *,
    spark: SparkSession | None = None,
    table_format: TableFormat = "delta",
    scd2: bool = False,
    label: str = "",
) -> list[TableComparison]:
    """The lake's tables (read by their ``table_format``'s reader) hold exactly ``truth``; with ``scd2``, so do their
    SCD2 tables' live rows. ``spark`` reads Iceberg and SCD2 tables (Delta lake tables are read by delta-rs).
    ``label`` starts every failure message (what was drawn or done). Returns the lake tables' comparison."""
    if spark is None and (table_format != "delta" or scd2):
        raise ValueError("reading Iceberg or SCD2 tables takes a Spark session")
    read = read_table if spark is None else lake_reader(spark, table_format)
    comparison = compare_lake(lake, truth, read)
    assert all(r.ok for r in comparison), f"{label}\n{describe(comparison)}"
    if scd2:
        assert spark is not None
        live_versions = compare_lake(lake, truth, scd2_reader(spark, lake, table_format))
        assert all(r.ok for r in live_versions), f"{label}: SCD2 live rows\n{describe(live_versions)}"
    return comparison


def as_consumed(
    messages: Sequence[Message],
    partitions: int,
    seed: int,
    *,
    lagging: bool = False,
    partition_key: Callable[[Message], bytes | None] = lambda message: message.key,
) -> list[Message]:
    """An order in which one consumer of a ``partitions``-partition topic may read ``messages``: each message in the
    partition of its ``partition_key``'s hash (the Kafka key by default; a message without one in partition 0, kept in
    order as one producer writing it there would), each partition read in order, the partitions at skewed random
    rates (``seed``), or, ``lagging``, one partition after another in a random order (the most lag a consumer sees).
    A key's changes stay in order, but a primary-key update whose halves carry the old and the new key (Debezium's
    ``d`` and ``c``) may arrive on either side of the other changes: cdclake orders changes by their source
    positions, not by their arrival."""
    queues: list[list[Message]] = [[] for _ in range(partitions)]
    for message in messages:
        key = partition_key(message)
        queues[0 if key is None else zlib.crc32(key) % partitions].append(message)
    chance = random.Random(seed)
    if lagging:
        chance.shuffle(queues)
        return [message for queue in queues for message in queue]
    rates = [chance.random() + 0.05 for _ in queues]
    heads = [0] * partitions
    arrived: list[Message] = []
    while len(arrived) < len(messages):
        readable = [p for p in range(partitions) if heads[p] < len(queues[p])]
        chosen = chance.choices(readable, weights=[rates[p] for p in readable])[0]
        arrived.append(queues[chosen][heads[chosen]])
        heads[chosen] += 1
    return arrived


def topic_with(bootstrap: str, messages: list[Message], partitions: int = 2) -> str:
    """A new topic of the local broker holding ``messages``."""
    name = f"dw-{uuid.uuid4().hex[:8]}"
    broker.create_topics(bootstrap, {name: partitions})
    if messages:
        broker.produce(bootstrap, name, [(m.key, m.value) for m in messages], headers=[m.headers for m in messages])
    return name


def stream_config(bootstrap: str, topic: str, lake: str, checkpoint: str, per_trigger: int = 1000) -> PipelineConfig:
    """A DataWorks `cdclake run` of ``topic`` until the messages present at start are applied (availableNow)."""
    return PipelineConfig(
        name="test",
        lake=lake,
        checkpoint=checkpoint,
        kafka=KafkaConfig(bootstrap_servers=bootstrap, topics=[topic], max_offsets_per_trigger=per_trigger),
        format="dataworks-json",
        trigger=TriggerConfig(available_now=True),
    )
