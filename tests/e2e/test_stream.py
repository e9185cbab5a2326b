"""`cdclake run`: a real Kafka broker -> Spark Structured Streaming -> Delta, exactly once."""

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

from cdclake.config import KafkaConfig, PipelineConfig, TriggerConfig
from cdclake.devtools import broker
from cdclake.devtools.verify import compare_lake, describe, read_table
from cdclake.runner import replay, run
from cdclake.workload import HistoryConfig, RenderOptions, SourceHistory, render_stream
from tests.e2e.helpers import assert_lake_equals_truth, workload, write_lines

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _topic(bootstrap: str, messages, partitions: int = 2) -> str:
    name = f"dw-{uuid.uuid4().hex[:8]}"
    broker.create_topics(bootstrap, {name: partitions})
    if messages:
        broker.produce(bootstrap, name, [(m.key, m.value) for m in messages])
    return name


def _config(bootstrap: str, topic: str, lake: str, checkpoint: str, per_trigger: int = 1000) -> PipelineConfig:
    return PipelineConfig(
        name="test",
        lake=lake,
        checkpoint=checkpoint,
        kafka=KafkaConfig(bootstrap_servers=bootstrap, topics=[topic], max_offsets_per_trigger=per_trigger),
        format="dataworks-json",
        trigger=TriggerConfig(available_now=True),
    )


def _tables(lake: str) -> dict[str, list[str]]:
    return {t: sorted(map(repr, read_table(f"{lake}/{t}"))) for t in ("crm/customer", "shop/orders", "crm/audit_log")}


def test_stream_equals_truth_and_replay_of_the_same_messages(spark, kafka, tmp_path: Path) -> None:
    history, messages = workload(seed=21)
    topic = _topic(kafka, messages)
    lake = str(tmp_path / "lake")
    batches = []
    run(spark, _config(kafka, topic, lake, str(tmp_path / "ckpt"), per_trigger=250), on_batch=batches.append)
    assert len(batches) >= 2
    assert_lake_equals_truth(lake, history)
    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").collect()
    assert len(dead) == 3
    assert {row["topic"] for row in dead} == {topic}
    assert all(row["reason"] and row["value"] is not None for row in dead)

    replayed = str(tmp_path / "replayed")
    path = write_lines(tmp_path / "captured.jsonl", messages)
    replay(spark, lake=replayed, format_name="dataworks-json", paths=[str(path)])
    assert _tables(replayed) == _tables(lake)


def test_restart_mid_stream_resumes_from_the_checkpoint(spark, kafka, tmp_path: Path) -> None:
    history, messages = workload(seed=22)
    topic = _topic(kafka, [])
    lake, checkpoint = str(tmp_path / "lake"), str(tmp_path / "ckpt")
    half = len(messages) // 2
    broker.produce(kafka, topic, [(m.key, m.value) for m in messages[:half]])
    run(spark, _config(kafka, topic, lake, checkpoint, per_trigger=200))
    broker.produce(kafka, topic, [(m.key, m.value) for m in messages[half:]])
    run(spark, _config(kafka, topic, lake, checkpoint, per_trigger=200))
    assert_lake_equals_truth(lake, history)
    # Nothing doubled: each message was decoded once across both runs.
    progress = spark.read.format("delta").load(f"{lake}/_cdclake/progress").where("scope = 'stream'")
    assert progress.groupBy().sum("events").first()[0] == len(messages) - 3  # the malformed are dead letters


def test_sigkill_mid_run_then_restart_gives_the_same_tables(spark, kafka, tmp_path: Path) -> None:
    history, messages = workload(seed=23, events=150)
    topic = _topic(kafka, messages)
    lake, checkpoint = str(tmp_path / "lake"), str(tmp_path / "ckpt")
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "killed",
                "lake": lake,
                "checkpoint": checkpoint,
                "kafka": {"bootstrap_servers": kafka, "topics": [topic], "max_offsets_per_trigger": 90},
                "format": "dataworks-json",
                "trigger": {"available_now": True},
            }
        )
    )
    cdclake = str(Path(sys.executable).with_name("cdclake"))
    child = subprocess.Popen(
        [cdclake, "run", str(config)],
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
        if line.startswith("batch 1:") or (not line and child.poll() is not None):
            break
    assert "batch 1:" in seen, seen[-3000:]
    time.sleep(1.5)  # lands somewhere inside the next batch's commits
    interrupted = child.poll() is None
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=60)

    recovered = []
    run(spark, _config(kafka, topic, lake, checkpoint, per_trigger=90), on_batch=recovered.append)
    assert_lake_equals_truth(lake, history)
    if interrupted:
        assert recovered, "the run was killed mid-stream, yet the restart applied nothing"


KILLED_FORMATS = ["dts-avro", "qlik-json"]
"""Binary Avro, and Qlik with its metadata messages (DataWorks JSON is killed above). Each costs about a minute;
every format's stream is also replayed in tests/e2e/test_rendered_streams.py."""


@pytest.mark.parametrize("format_name", KILLED_FORMATS)
def test_stream_killed_at_a_random_point_then_restarted_ends_as_the_truth(
    spark, kafka, tmp_path: Path, format_name: str
) -> None:
    """A rendered stream of the format (re-sends, malformed messages, transactions, partial images, a key-less
    table, a truncate, an added column) is streamed by `cdclake run`, SIGKILLed at a random moment of its batches
    (printed on failure), and finished by a restart from the same checkpoint: the lake must equal the truth."""
    chance = random.Random()
    seed = chance.randrange(1_000_000)
    kill_after = chance.uniform(0.0, 4.0)
    note = f"{format_name}: render seed {seed}, killed {kill_after:.2f} s after the first batch"
    history = SourceHistory.generate(
        HistoryConfig(
            seed=seed % 1000, tables=3, events=150, keys_per_table=15, keyless_tables=1, truncates=1, added_columns=1
        )
    )
    shape = RenderOptions(heartbeat_every=30, resends=1, malformed=1, transactions=True, partial_updates=True)
    stream = render_stream(format_name, history, shape, seed=seed)
    topic = f"killed-{uuid.uuid4().hex[:8]}"
    broker.create_topics(kafka, {topic: 1})
    broker.produce(kafka, topic, [(m.key, m.value) for m in stream.messages], partition=0)
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
    )
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True)))
    child = subprocess.Popen(
        [str(Path(sys.executable).with_name("cdclake")), "run", str(path)],
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
        if line.startswith("batch 0:") or (not line and child.poll() is not None):
            break
    assert "batch 0:" in seen, f"{note}\n{seen[-3000:]}"
    time.sleep(kill_after)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=60)

    run(spark, config)
    malformed = sum(1 for m in stream.messages if m.is_malformed)
    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters")
    assert dead.select("partition", "offset").distinct().count() == malformed, note
    comparison = compare_lake(lake, stream.expected_truth(history))
    assert all(r.ok for r in comparison), f"{note}\n{describe(comparison)}"


def test_run_rejects_a_bad_config_with_the_key_and_the_fix(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"lake": "/tmp/x", "kafka": {"topics": ["t"]}, "format": "dataworks-json"}))
    cdclake = str(Path(sys.executable).with_name("cdclake"))
    done = subprocess.run([cdclake, "run", str(config)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert "kafka.bootstrap_servers" in done.stderr
    assert "Fix:" in done.stderr
