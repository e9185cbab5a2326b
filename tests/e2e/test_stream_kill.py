"""`cdclake run` SIGKILLed mid-stream and restarted from its checkpoint: the lake ends equal to the source truth.

Apart from tests/e2e/test_stream.py so that pytest-xdist (``--dist loadfile``) can run the two files on different
workers: each kill test starts a `cdclake run` process of its own and costs about two minutes.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from cdclake.config import HistoryTablesConfig, KafkaConfig, PipelineConfig, TriggerConfig
from cdclake.devtools import broker
from cdclake.runner import run
from cdclake.sinks.delta import safe_name
from cdclake.workload import HistoryConfig, RenderOptions, SourceHistory, render_stream
from tests.e2e.helpers import assert_tables_equal_truth, history_table

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _run_until(config: Path, progress_line: str, note: str) -> subprocess.Popen[str]:
    """Starts `cdclake run config` in its own process group and returns once it has printed ``progress_line``
    (the start of a batch's progress line on stderr), so the caller can kill it mid-stream."""
    child = subprocess.Popen(
        [str(Path(sys.executable).with_name("cdclake")), "run", str(config)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert child.stderr is not None
    deadline = time.monotonic() + 300
    seen = ""
    while time.monotonic() < deadline:
        line = child.stderr.readline()
        seen += line
        if line.startswith(progress_line) or (not line and child.poll() is not None):
            break
    assert progress_line in seen, f"{note}\n{seen[-3000:]}"
    return child


KILLED = [("qlik-json", "delta"), ("dts-canal-json", "iceberg")]
"""Qlik with its metadata messages into Delta, and DTS Canal JSON into Iceberg lake tables, both with history tables
(one per table format). A run kills one of them, drawn like the moment of the kill (about two minutes each; the
suite's time allows one), so that successive CI runs cover both; ``CDCLAKE_KILL_CASE=qlik-json/delta`` picks one.
Every format's stream (binary Avro ones included: the crash recovery does not depend on the encoding) is also
replayed in tests/e2e/test_rendered_streams.py, with an SCD2 table, and a DataWorks stream over two partitions is
stopped and resumed from its checkpoint in tests/e2e/test_stream.py."""


def test_stream_killed_at_a_random_point_then_restarted_ends_as_the_truth(spark, kafka, tmp_path: Path) -> None:
    """A rendered stream of the format (re-sends, malformed messages, transactions, partial images, a key-less
    table, a truncate, an added column) is streamed by `cdclake run` with changelog and SCD2 tables, SIGKILLed at
    a random moment of its batches (the case and moment are printed on failure), and finished by a restart from the
    same checkpoint: the lake must equal the truth, so must the SCD2 tables' live rows, and no changelog may hold an
    event twice, nor the dead letters and progress tables a row."""
    chance = random.Random()
    chosen = os.environ.get("CDCLAKE_KILL_CASE")
    format_name, table_format = tuple(chosen.split("/", 1)) if chosen else chance.choice(KILLED)
    seed = chance.randrange(1_000_000)
    kill_after = chance.uniform(0.0, 4.0)
    note = (
        f"{format_name} into {table_format} (CDCLAKE_KILL_CASE={format_name}/{table_format}): render seed {seed}, "
        f"killed {kill_after:.2f} s after the first batch"
    )
    history = SourceHistory.generate(
        HistoryConfig(
            seed=seed % 1000, tables=3, events=70, keys_per_table=15, keyless_tables=1, truncates=1, added_columns=1
        )
    )
    shape = RenderOptions(heartbeat_every=30, resends=1, malformed=1, transactions=True, partial_updates=True)
    stream = render_stream(format_name, history, shape, seed=seed)
    topic = f"killed-{uuid.uuid4().hex[:8]}"
    broker.create_topics(kafka, {topic: 1})
    records = [(m.key, m.value) for m in stream.messages]
    broker.produce(kafka, topic, records, partition=0, headers=[m.headers for m in stream.messages])
    lake, checkpoint = str(tmp_path / "lake"), str(tmp_path / "ckpt")
    config = PipelineConfig(
        name="killed",
        lake=lake,
        checkpoint=checkpoint,
        kafka=KafkaConfig(bootstrap_servers=kafka, topics=[topic], max_offsets_per_trigger=60),
        format=format_name,
        format_options={format_name: dict(stream.format_options)} if stream.format_options else {},
        keys={table: list(columns) for table, columns in stream.keys.items()},
        trigger=TriggerConfig(available_now=True),
        table_format=table_format,  # type: ignore[arg-type]
        history=HistoryTablesConfig(changelog=True, scd2=True),
    )
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True)))
    child = _run_until(path, "batch 0:", note)
    time.sleep(kill_after)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=60)

    run(spark, config)
    malformed = sum(1 for m in stream.messages if m.is_malformed)
    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters")
    assert dead.select("partition", "offset").distinct().count() == malformed, note
    assert dead.count() == malformed, f"{note}: a dead letter recorded twice"
    # The batch that was killed ran again: its bookkeeping appends, each once (DeltaSink.append's markers).
    progress = spark.read.format("delta").load(f"{lake}/_cdclake/progress")
    recorded = progress.select("batch_id", "scope", "database", "schema", "table", "topic", "partition")
    assert recorded.count() == recorded.distinct().count(), f"{note}: a batch's progress recorded twice"
    truth = stream.expected_truth(history)
    assert_tables_equal_truth(lake, truth, spark=spark, table_format=table_format, scd2=True, label=note)
    for database, table in truth:
        changelog = history_table(spark, lake, "changelog", safe_name(database), safe_name(table), table_format)
        assert changelog is not None, f"{note}: no changelog of {database}.{table}"
        events = changelog.select("_cdc_position", "_cdc_sub_index", "_cdc_key")
        assert events.count() == events.distinct().count() > 0, f"{note}: {database}.{table} logged an event twice"
