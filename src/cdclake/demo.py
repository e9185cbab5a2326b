"""``make demo``: a DataWorks change stream through a real local Kafka broker into Delta tables, checked.

1. starts the local KRaft broker (``cdclake.devtools.broker``);
2. simulates a source database (several tables, a key-less one, inserts, updates in split and merged mode,
   deletes, a truncate, an added column, transactions, heartbeats, failover re-sends, one malformed message) and
   produces its DataWorks messages;
3. runs the streaming pipeline (``cdclake run`` code path) until it has caught up;
4. prints the tables, the dead letters and the per-table freshness;
5. reads the tables back with an independent Delta reader and compares them with the source truth: PASS/FAIL;
6. stops the broker.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cdclake.config import KafkaConfig, PipelineConfig, TriggerConfig
from cdclake.devtools import broker
from cdclake.devtools.verify import compare_lake, describe
from cdclake.pipeline import BatchResult
from cdclake.workload import DataWorksOptions, HistoryConfig, SourceHistory, render

TOPIC = "dataworks.demo"
DEMO_DIR = Path(".cdclake/demo")
PORT = 19092
EVENTS = 2000
MAX_OFFSETS_PER_TRIGGER = 800

# Not on a terminal (CI logs, pipes) rich assumes 80 columns; the tables need more. No markup or emoji codes: the
# lines hold table names, values and dead-letter reasons, whose brackets rich would read as style tags.
console = Console(width=None if Console().is_terminal else 160, markup=False, emoji=False)


def _produce(bootstrap: str, topic: str, events: int) -> tuple[SourceHistory, int]:
    history = SourceHistory.generate(
        HistoryConfig(
            seed=7, tables=3, events=events, keys_per_table=60, keyless_tables=1, truncates=1, added_columns=1
        )
    )
    messages = render(
        history,
        DataWorksOptions(update_mode="mixed", heartbeat_every=100, failover_resends=2, malformed=1, transactions=True),
        seed=7,
    )
    broker.create_topics(bootstrap, {topic: 2})
    broker.produce(bootstrap, topic, [(m.key, m.value) for m in messages], headers=[m.headers for m in messages])
    return history, len(messages)


def _show_tables(spark, lake: str, history: SourceHistory) -> None:  # type: ignore[no-untyped-def]
    from cdclake.sinks.delta import DeltaSink

    sink = DeltaSink(spark, lake)
    for spec in history.tables:
        frame = sink.read(spec.database, spec.table).orderBy(*(spec.primary_key or ["_cdc_row_id"]))
        frame = frame.select(*(c for c in frame.columns if c not in ("_cdc_event_time", "_cdc_op")))
        rows = frame.limit(5).collect()
        table = Table(title=f"{spec.database}.{spec.table}: {frame.count()} rows (first 5)", show_lines=False)
        for name in frame.columns:
            table.add_column(name, overflow="fold", max_width=22)
        for row in rows:
            table.add_row(*(_short(v) for v in row))
        console.print(table)
    dead = sink.read_system("dead_letters")
    if dead is not None:
        console.print("dead letters", style="bold")
        for row in dead.select("topic", "partition", "offset", "reason").collect():
            console.print(f"  {row['topic']}[{row['partition']}]@{row['offset']}: {row['reason']}")
    progress = sink.read_system("progress")
    if progress is not None:
        from pyspark.sql import functions as F

        fresh = (
            progress.groupBy("scope", "database", "table", "topic", "partition")
            .agg(F.max("last_event_time").alias("last_event_time"), F.sum("events").alias("events"))
            .orderBy("scope", "database", "table", "topic", "partition")
            .collect()
        )
        console.print("freshness (source event time reached, heartbeats included)", style="bold")
        for row in fresh:
            where = (
                f"{row['database']}.{row['table']}"
                if row["scope"] == "table"
                else f"{row['topic']}[{row['partition']}]"
            )
            console.print(f"  {row['scope']:6} {where:28} {row['events']:6} events, up to {row['last_event_time']}")


def _short(value: object) -> str:
    text = value.hex() if isinstance(value, bytes | bytearray) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def run_demo(
    bootstrap: str,
    directory: Path,
    *,
    topic: str = TOPIC,
    events: int = EVENTS,
    max_offsets_per_trigger: int = MAX_OFFSETS_PER_TRIGGER,
) -> bool:
    """Steps 2-5 against the broker at ``bootstrap``: the lake and checkpoint go in ``directory`` (emptied first).
    True when every table equals the source truth. The tests run it on their own broker, smaller."""
    shutil.rmtree(directory / "lake", ignore_errors=True)
    shutil.rmtree(directory / "checkpoint", ignore_errors=True)
    lake = str((directory / "lake").resolve())
    with console.status("simulating the source database and producing DataWorks messages..."):
        history, produced = _produce(bootstrap, topic, events)
    console.print(f"produced {produced} DataWorks messages for {len(history.tables)} tables to {topic}")

    from cdclake.runner import run
    from cdclake.spark import get_session

    with console.status("starting Spark...") as status:
        spark = get_session("cdclake-demo")
        config = PipelineConfig(
            name="demo",
            lake=lake,
            checkpoint=str((directory / "checkpoint").resolve()),
            kafka=KafkaConfig(
                bootstrap_servers=bootstrap, topics=[topic], max_offsets_per_trigger=max_offsets_per_trigger
            ),
            format="dataworks-json",
            trigger=TriggerConfig(available_now=True),
        )
        applied = 0

        def progress(result: BatchResult) -> None:
            nonlocal applied
            applied += result.messages
            status.update(f"streaming: batch {result.batch_id}, {applied}/{produced} messages applied")
            console.print(
                f"batch {result.batch_id}: {result.messages} events -> "
                f"{sum(result.applied.values())} row changes in {len(result.applied)} tables, "
                f"{result.dead_letters} dead letters"
            )

        status.update("streaming from Kafka until caught up...")
        run(spark, config, until_caught_up=True, on_batch=progress)
    _show_tables(spark, lake, history)
    with console.status("comparing the lake with the source truth (independent Delta reader)..."):
        results = compare_lake(lake, history.truth())
    console.print(describe(results))
    return all(r.ok for r in results)


def main() -> int:
    """``make demo``: the whole demo on its own broker (:data:`PORT`), in :data:`DEMO_DIR`."""
    started = time.monotonic()
    with console.status("starting the local Kafka broker (KRaft)..."):
        info = broker.start(DEMO_DIR / "kafka", PORT, fresh=True)
    console.print(f"kafka broker at {info.bootstrap_servers} (log {info.log_file})")
    try:
        passed = run_demo(info.bootstrap_servers, DEMO_DIR)
        verdict = ("PASS", "bold green") if passed else ("FAIL", "bold red")
        console.print(Text.assemble(verdict, f" in {time.monotonic() - started:.0f} s"))
        return 0 if passed else 1
    finally:
        with console.status("stopping the broker..."):
            broker.stop(DEMO_DIR / "kafka")


if __name__ == "__main__":
    sys.exit(main())
