"""`cdclake run`: a real Kafka broker -> Spark Structured Streaming -> Delta, exactly once."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from cdclake.config import TriggerConfig
from cdclake.devtools import broker
from cdclake.devtools.verify import read_table
from cdclake.pipeline import BatchResult
from cdclake.runner import replay, run
from tests.e2e.helpers import assert_lake_equals_truth, stream_config, topic_with, workload, write_lines

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _tables(lake: str) -> dict[str, list[str]]:
    return {t: sorted(map(repr, read_table(f"{lake}/{t}"))) for t in ("crm/customer", "shop/orders", "crm/audit_log")}


def test_stream_equals_truth_and_replay_of_the_same_messages(spark, kafka, tmp_path: Path) -> None:
    history, messages = workload(seed=21)
    topic = topic_with(kafka, messages)
    lake = str(tmp_path / "lake")
    batches = []
    run(spark, stream_config(kafka, topic, lake, str(tmp_path / "ckpt"), per_trigger=250), on_batch=batches.append)
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


def test_restart_mid_stream_resumes_from_the_checkpoint(
    spark, kafka, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first run streams (no end of its own) and is stopped by Ctrl-C after its first batch: it returns once the
    batch is done, without an error; the second run goes on from the checkpoint."""
    history, messages = workload(seed=22)
    topic = topic_with(kafka, [])
    lake, checkpoint = str(tmp_path / "lake"), str(tmp_path / "ckpt")
    half = len(messages) // 2
    broker.produce(kafka, topic, [(m.key, m.value) for m in messages[:half]])
    streaming = stream_config(kafka, topic, lake, checkpoint, per_trigger=200)
    streaming = streaming.model_copy(update={"trigger": TriggerConfig(processing_time="1 second")})
    assert threading.current_thread() is threading.main_thread()  # where Python delivers signals
    batches: list[BatchResult] = []

    def interrupt_after_the_first(result: BatchResult) -> None:
        batches.append(result)
        if len(batches) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    with caplog.at_level(logging.WARNING, logger="cdclake.runner"):
        run(spark, streaming, on_batch=interrupt_after_the_first)  # returns: no error, no KeyboardInterrupt
    assert batches
    assert "SIGINT received, stopping after the batch in progress" in caplog.text
    assert "stopped; the next run goes on from its checkpoint" in caplog.text
    broker.produce(kafka, topic, [(m.key, m.value) for m in messages[half:]])
    run(spark, stream_config(kafka, topic, lake, checkpoint, per_trigger=200))
    assert_lake_equals_truth(lake, history)
    # Nothing doubled: each message was decoded once across both runs.
    progress = spark.read.format("delta").load(f"{lake}/_cdclake/progress").where("scope = 'stream'")
    assert progress.groupBy().sum("events").first()[0] == len(messages) - 3  # the malformed are dead letters


def test_run_rejects_a_bad_config_with_the_key_and_the_fix(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"lake": "/tmp/x", "kafka": {"topics": ["t"]}, "format": "dataworks-json"}))
    cdclake = str(Path(sys.executable).with_name("cdclake"))
    done = subprocess.run([cdclake, "run", str(config)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert "kafka.bootstrap_servers" in done.stderr
    assert "Fix:" in done.stderr
