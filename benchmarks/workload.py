"""Benchmark workloads: a seeded source history rendered by a registered renderer, stored once on disk.

Generation is the workload simulator plus the format's renderer (`cdclake.workload`), pure Python: measured here at
about 25-30k events/s for DataWorks JSON (the simulator ~30%, rendering ~70% of it) and 2.3 GB of peak memory for 1M
events. So it runs in a child process (its memory never counts toward the driver's peak, see `memory.py`), and its
output is cached under ``benchmarks/out/workloads/`` keyed by the workload parameters and the source code of
``cdclake.workload`` (a renderer change regenerates). A rerun of the benchmarks with the same parameters reads the
file (about 1 s per million messages).

Why not a pool of rendered messages with keys and positions patched in: that needs one byte-level patcher per wire
format (JSON, Avro, each vendor's position field), which would have to be kept in sync with every renderer; the
simulator/renderer pair is the single source of truth, and the cache makes its cost a one-off.

Record file: one message per line, ``<key>\\t<value>``, each standard base64, or ``-`` for a missing key/value.
A ``.json`` sidecar holds what the consumer must be told (keys, format options) and the generation figures.
"""

from __future__ import annotations

import base64
import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

OUT = Path(__file__).resolve().parent / "out"
"""Scratch directory of the benchmarks (gitignored)."""

DEFAULT_START_TIME_MS = 1_709_288_131_000


@dataclass(frozen=True)
class WorkloadSpec:
    """The parameters of one benchmark workload.

    Attributes:
        format: renderer name (a key of ``cdclake.workload.renderers()``).
        events: row changes (INSERT/UPDATE/DELETE) of the source history; a split update becomes two messages.
        tables: source tables the changes are spread over (uniformly at random).
        keys_per_table: key cardinality: size of each table's primary-key pool.
        update_ratio: share of changes that update an existing row.
        delete_ratio: share of changes that delete an existing row.
        extra_columns: padding columns added to every table (row width); 0: the template columns (5-8).
        partial_updates: render updates as changed-only images where the format has them.
        seed: seed of the history and of the rendering.
        start_time_ms: event time of the first change.
        clock_step_ms: event-time step per change (a steady source rate); None: the simulator's irregular clock.
    """

    format: str = "dataworks-json"
    events: int = 100_000
    tables: int = 10
    keys_per_table: int = 100_000
    update_ratio: float = 0.5
    delete_ratio: float = 0.1
    extra_columns: int = 0
    partial_updates: bool = False
    seed: int = 1
    start_time_ms: int = DEFAULT_START_TIME_MS
    clock_step_ms: float | None = None

    def history_config(self) -> Any:
        from cdclake.workload import HistoryConfig

        return HistoryConfig(
            seed=self.seed,
            tables=self.tables,
            events=self.events,
            keys_per_table=self.keys_per_table,
            update_ratio=self.update_ratio,
            delete_ratio=self.delete_ratio,
            keyless_tables=0,
            extra_columns=self.extra_columns,
            start_time_ms=self.start_time_ms,
            clock_step_ms=self.clock_step_ms,
        )

    def digest(self) -> str:
        """Identity of the generated file: the parameters plus the code that generates it."""
        import cdclake.workload as package

        hasher = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode())
        for source in sorted(Path(package.__path__[0]).glob("*.py")):
            hasher.update(source.read_bytes())
        return hasher.hexdigest()[:16]


@dataclass
class Workload:
    """A generated workload on disk."""

    spec: WorkloadSpec
    path: Path
    messages: int
    generation_seconds: float
    cached: bool
    keys: dict[str, list[str]] = field(default_factory=dict)
    format_options: dict[str, str] = field(default_factory=dict)

    @property
    def events_per_second_generated(self) -> float:
        return self.spec.events / self.generation_seconds if self.generation_seconds else 0.0


def _field(data: bytes | None) -> str:
    return "-" if data is None else base64.b64encode(data).decode("ascii")


def _unfield(text: str) -> bytes | None:
    return None if text == "-" else base64.b64decode(text)


def _generate(spec: WorkloadSpec, path: str) -> dict[str, Any]:
    """Runs in the child process: simulate, render, write the record file; returns the sidecar content."""
    from cdclake.workload import RenderOptions, SourceHistory, render_stream

    started = time.perf_counter()
    history = SourceHistory.generate(spec.history_config())
    simulated = time.perf_counter()
    stream = render_stream(
        spec.format, history, RenderOptions(heartbeat_every=0, partial_updates=spec.partial_updates), spec.seed
    )
    rendered = time.perf_counter()
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="ascii") as out:
        for message in stream.messages:
            out.write(f"{_field(message.key)}\t{_field(message.value)}\n")
    os.replace(temporary, path)
    return {
        "messages": len(stream.messages),
        "simulate_seconds": simulated - started,
        "render_seconds": rendered - simulated,
        "generation_seconds": time.perf_counter() - started,
        "keys": stream.keys,
        "format_options": stream.format_options,
    }


def materialize(spec: WorkloadSpec, directory: Path | None = None) -> Workload:
    """The record file of ``spec``: from the cache, or generated in a child process."""
    folder = (directory or OUT) / "workloads"
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{spec.format}-{spec.events}-{spec.digest()}"
    path, sidecar = folder / f"{stem}.records", folder / f"{stem}.json"
    if path.exists() and sidecar.exists():
        meta = json.loads(sidecar.read_text())
        cached = True
    else:
        # spawn, not fork: the parent may already run a JVM gateway and threads.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            meta = pool.submit(_generate, spec, str(path)).result()
        sidecar.write_text(json.dumps(meta, indent=1))
        cached = False
    return Workload(
        spec=spec,
        path=path,
        messages=int(meta["messages"]),
        generation_seconds=float(meta["generation_seconds"]),
        cached=cached,
        keys=dict(meta.get("keys") or {}),
        format_options=dict(meta.get("format_options") or {}),
    )


def records(path: Path) -> Iterator[tuple[bytes | None, bytes | None]]:
    """The ``(key, value)`` messages of a record file, in order."""
    with path.open(encoding="ascii") as lines:
        for line in lines:
            key, _, value = line.rstrip("\n").partition("\t")
            yield _unfield(key), _unfield(value)


def message_frame(spark: SparkSession, path: Path, topic: str = "bench", partitions: int = 2) -> DataFrame:
    """The messages of a record file as a raw message frame (``MESSAGE_COLUMNS``), offsets = line numbers, cached
    in memory and materialised, so a benchmark that reads it measures decoding, not file reading."""
    keys = ("spark.sql.files.maxPartitionBytes", "spark.sql.files.openCostInBytes")
    previous = {key: spark.conf.get(key, None) for key in keys}
    for key in keys:  # one partition for the file: monotonically_increasing_id() is then the line number
        spark.conf.set(key, str(2**40))
    try:
        lines = spark.read.text(str(path)).select(
            F.monotonically_increasing_id().alias("offset"), F.split(F.col("value"), "\t").alias("f")
        )
        frame = lines.select(
            F.when(F.col("f")[0] != "-", F.unbase64(F.col("f")[0])).alias("key"),
            F.when(F.col("f")[1] != "-", F.unbase64(F.col("f")[1])).alias("value"),
            F.lit(topic).alias("topic"),
            F.lit(0).alias("partition"),
            F.col("offset"),
            F.lit(None).cast("timestamp").alias("timestamp"),
        )
        # Range partitions keep the offsets in order across the partitions (batches are sliced by offset).
        frame = frame.repartitionByRange(partitions, "offset").persist()
        frame.count()
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    return frame
