"""`cdclake` submitted with `spark-submit`, as the README's "On a cluster" says: cdclake takes the session that
spark-submit built (no embedded settings) and streams the real broker's topic into Delta, exactly once; without
Delta's settings it stops at once and names them.

A cluster is not available here; `--master local[2]` runs the same submission path (SparkSubmit starts the driver
JVM and the Python application, and PySpark connects to that JVM instead of launching one). The jars come from the
Maven-copied folder with `--jars`: the README's `--packages` resolves the same `cdclake.spark.MAVEN_PACKAGES`
from Maven Central, which the tests do not download from.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import cdclake.cli.main
from cdclake.devtools.verify import read_table
from cdclake.spark import DELTA_CONF, connector_jars
from tests.e2e.helpers import assert_lake_equals_truth, stream_config, topic_with, workload

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _submit(*arguments: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``spark-submit <options> <cdclake's CLI> <arguments>`` on the local master, the driver's Python being this
    interpreter (cdclake is installed in it), as ``--py-files cdclake.whl`` provides on a cluster."""
    command = [
        str(Path(sys.executable).with_name("spark-submit")),
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        *options,
        cdclake.cli.main.__file__,
        *arguments,
    ]
    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    environment.pop("PYSPARK_GATEWAY_PORT", None)
    # The CLI wraps its messages at COLUMNS when set (a CI run had 80): the tests read them unwrapped.
    environment["COLUMNS"] = "1000"
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, env=environment)


def test_a_spark_submit_run_with_the_readme_settings_streams_the_topic_equal_to_the_truth(
    kafka, tmp_path: Path
) -> None:
    history, messages = workload(seed=24, events=120)
    topic = topic_with(kafka, messages)
    lake = str(tmp_path / "lake")
    config = stream_config(kafka, topic, lake, str(tmp_path / "ckpt"), per_trigger=400)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True)))
    delta = [item for key, value in DELTA_CONF.items() for item in ("--conf", f"{key}={value}")]
    jars = ",".join(str(jar) for jar in connector_jars())

    done = _submit("run", str(path), options=("--jars", jars, *delta))

    assert done.returncode == 0, done.stderr[-4000:]
    # spark-submit's Python runner passes the application's stderr on with its stdout.
    assert "batch 0: " in done.stdout + done.stderr
    assert_lake_equals_truth(lake, history)
    # The workload's malformed messages are dead letters of the topic (read back with delta-rs, not Spark).
    dead = read_table(f"{lake}/_cdclake/dead_letters")
    assert len(dead) == 3
    assert {row["topic"] for row in dead} == {topic}


def test_a_submission_without_the_delta_settings_stops_with_the_settings_to_add(tmp_path: Path) -> None:
    """Without Delta's extension the session cannot write the lake: the command exits 1 before reading anything,
    and says which packages and settings to submit with (cdclake.spark._ensure_delta)."""
    capture = tmp_path / "capture.jsonl"
    capture.write_text("{}\n", encoding="utf-8")

    done = _submit("replay", "--format", "dataworks-json", "--lake", str(tmp_path / "lake"), str(capture))

    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    output = done.stdout + done.stderr
    assert "error: the Spark session has no Delta Lake extension" in output
    for key, value in DELTA_CONF.items():
        assert f"--conf {key}={value}" in output
    assert "io.delta:delta-spark" in output
    assert not (tmp_path / "lake").exists()
