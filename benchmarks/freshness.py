"""Target d: freshness, from a change's source event time to the commit of the batch that applied it, at a steady
share (50%) of the maximum rate measured end to end.

* The workload's clock is set so that the source produces at the chosen rate (``clock_step_ms``) starting at a time
  ``t0`` slightly in the future, so every message's event time is the time at which it is due.
* A producer thread sends each message when its event time comes (confluent-kafka, keyed, murmur2 partitioning) and
  records the partition and offset Kafka gave it, and how late it was sent (producer lag, reported).
* ``cdclake.runner.run`` streams the topic meanwhile with a processing-time trigger of 0 s (a new micro-batch as soon
  as the previous one is done), until every message is in; then the query is stopped.
* Commit time of a message = ``recorded_at`` of the ``_cdclake/progress`` stream row of the first batch whose last
  offset on the message's partition reaches it (written right after that batch's table commits).
* Latency = commit time - event time (decoded by the format itself). The first 10% of the messages (the query's start)
  are left out; p50 and p95 over the rest.
"""

from __future__ import annotations

import bisect
import dataclasses
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks.workload import Workload, WorkloadSpec, materialize, message_frame, records
from cdclake import model
from cdclake.config import KafkaConfig, PipelineConfig, TriggerConfig
from cdclake.devtools import broker
from cdclake.formats import decode_batch, get_format
from cdclake.runner import run
from cdclake.sinks.delta import DeltaSink

TOPIC_PARTITIONS = 2
WARM_UP_SHARE = 0.1
START_MARGIN_SECONDS = 25.0
"""Time between the end of generation and t0: decoding the event times, creating the topic, starting the query."""


@dataclass
class FreshnessResult:
    rate: float
    seconds: float
    messages: int
    p50: float
    p95: float
    max: float
    producer_lag_p95: float
    batches: int


def _percentile(sorted_values: list[float], share: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(share * len(sorted_values)))]


def measure(
    spark: SparkSession,
    bootstrap: str,
    base: WorkloadSpec,
    rate: float,
    duration: float,
    messages_per_event: float,
    generation_rate: float,
    work: Path,
    log: Callable[[str], None] = print,
) -> FreshnessResult:
    """Streams ``duration`` seconds of the ``base`` workload shape at ``rate`` messages/s; measures freshness."""
    events = max(100, int(rate * duration / messages_per_event))
    estimate = events / max(generation_rate, 1000.0) * 1.5
    t0_ms = int((time.time() + estimate + START_MARGIN_SECONDS) * 1000)
    spec = dataclasses.replace(
        base, events=events, start_time_ms=t0_ms, clock_step_ms=1000.0 * messages_per_event / rate, seed=base.seed + 7
    )
    workload = materialize(spec)
    try:
        return _stream(spark, bootstrap, workload, rate, work, log)
    finally:
        workload.path.unlink(missing_ok=True)
        workload.path.with_suffix(".json").unlink(missing_ok=True)


def _event_times(spark: SparkSession, workload: Workload) -> list[int]:
    """Event time (epoch ms) of every message in file order, as the format decodes it."""
    messages = message_frame(spark, workload.path)
    try:
        decoded = decode_batch(get_format(workload.spec.format), messages, workload.format_options)
        rows = decoded.select(
            model.OFFSET, F.floor(F.unix_micros(F.col(model.EVENT_TIME)) / 1000).cast("bigint").alias("ms")
        ).collect()
    finally:
        messages.unpersist()
    by_offset = sorted((row[model.OFFSET], row["ms"]) for row in rows)
    times, previous = [], workload.spec.start_time_ms
    for _, ms in by_offset:
        previous = ms if ms is not None else previous
        times.append(previous)
    return times


def _stream(
    spark: SparkSession, bootstrap: str, workload: Workload, rate: float, work: Path, log: Callable[[str], None]
) -> FreshnessResult:
    event_ms = _event_times(spark, workload)
    topic = f"bench-fresh-{workload.spec.digest()}"
    broker.create_topics(bootstrap, {topic: TOPIC_PARTITIONS})
    root = work / "freshness"
    shutil.rmtree(root, ignore_errors=True)
    config = PipelineConfig(
        name="bench-freshness",
        lake=str(root / "lake"),
        checkpoint=str(root / "checkpoint"),
        kafka=KafkaConfig(bootstrap_servers=bootstrap, topics=[topic]),
        format=workload.spec.format,
        format_options={workload.spec.format: workload.format_options} if workload.format_options else {},
        keys=workload.keys,
        trigger=TriggerConfig(processing_time="0 seconds"),
    )
    placed: list[tuple[int, int]] = [(-1, -1)] * len(event_ms)  # line -> (partition, offset)
    lag: list[float] = []
    applied = [0]
    producer_done = threading.Event()
    failures: list[BaseException] = []

    def produce() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "partitioner": "murmur2_random"})
        try:
            for index, (key, value) in enumerate(records(workload.path)):
                due = event_ms[index] / 1000.0
                now = time.time()
                if due > now:
                    time.sleep(due - now)
                else:
                    lag.append(now - due)

                def delivered(error: KafkaError | None, message: Message, line: int = index) -> None:
                    partition, offset = message.partition(), message.offset()
                    # A delivered message always has both; the client's types allow None for unsent ones.
                    if error is None and partition is not None and offset is not None:
                        placed[line] = (partition, offset)

                while True:
                    try:
                        producer.produce(topic, value=value, key=key, on_delivery=delivered)
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
            producer.flush(60)
        except BaseException as error:  # reported by the main thread
            failures.append(error)
        finally:
            producer_done.set()

    def stop_when_caught_up() -> None:
        while not (producer_done.is_set() and applied[0] >= len(event_ms)) and not failures:
            time.sleep(0.5)
        for query in spark.streams.active:
            if query.name == config.name:
                query.stop()

    def count(batch: object) -> None:
        applied[0] += getattr(batch, "messages", 0)

    producer_thread = threading.Thread(target=produce, name="freshness-producer", daemon=True)
    stopper = threading.Thread(target=stop_when_caught_up, name="freshness-stopper", daemon=True)
    wait = event_ms[0] / 1000.0 - time.time()
    log(f"freshness: {len(event_ms):,} messages at {rate:,.0f} msg/s, first due in {wait:.0f} s")
    started = time.time()
    producer_thread.start()
    stopper.start()
    run(spark, config, on_batch=count)
    producer_thread.join()
    stopper.join()
    if failures:
        raise RuntimeError("freshness producer failed") from failures[0]
    seconds = time.time() - started

    progress = DeltaSink(spark, config.lake).read_system("progress")
    assert progress is not None
    stream_rows = (
        progress.where(F.col("scope") == "stream")
        .select("batch_id", "partition", "last_offset", (F.unix_micros("recorded_at") / 1e6).alias("at"))
        .orderBy("batch_id")
        .collect()
    )
    commits: dict[int, tuple[list[int], list[float]]] = {}
    for row in stream_rows:
        offsets, times = commits.setdefault(row["partition"], ([], []))
        offsets.append(row["last_offset"])
        times.append(row["at"])
    latencies = []
    for line, (partition, offset) in enumerate(placed):
        if line < WARM_UP_SHARE * len(placed) or partition < 0:
            continue
        offsets, times = commits.get(partition, ([], []))
        index = bisect.bisect_left(offsets, offset)
        if index < len(offsets):
            latencies.append(times[index] - event_ms[line] / 1000.0)
    latencies.sort()
    lag.sort()
    batches = len({row["batch_id"] for row in stream_rows})
    result = FreshnessResult(
        rate=rate,
        seconds=seconds,
        messages=len(latencies),
        p50=_percentile(latencies, 0.5),
        p95=_percentile(latencies, 0.95),
        max=latencies[-1] if latencies else float("nan"),
        producer_lag_p95=_percentile(lag, 0.95) if lag else 0.0,
        batches=batches,
    )
    log(
        f"freshness: p50 {result.p50:.1f} s, p95 {result.p95:.1f} s, max {result.max:.1f} s over {result.messages:,} "
        f"messages in {batches} batches (producer lag p95 {result.producer_lag_p95:.2f} s)"
    )
    return result
