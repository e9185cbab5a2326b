"""Session fixtures: one real local SparkSession with Delta, and one real local Kafka broker (KRaft)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("CDCLAKE_SHARED", REPO.parent / "shared"))
# Under pytest-xdist every worker is its own session with its own broker: ports 10 apart (client, controller).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
TEST_BROKER_PORT = int(os.environ.get("CDCLAKE_TEST_KAFKA_PORT", "19292")) + 10 * int(_WORKER.removeprefix("gw") or 0)

# Python renders Spark timestamps in the process time zone; golden files are written in UTC.
os.environ["TZ"] = "UTC"
time.tzset()


def pytest_configure(config: pytest.Config) -> None:
    # The spec's examples and Avro schemas are test inputs: without them a third of the suite would fail on its own,
    # some files already at collection, each with a bare FileNotFoundError.
    del config
    if not (SHARED / "formats" / "README.md").is_file():
        raise pytest.UsageError(
            f"the tests read the format specifications at {SHARED / 'formats'}, which is not there. Fix: keep the "
            "checkout beside `shared/` (as ../shared), or set CDCLAKE_SHARED to the folder that holds `formats/`."
        )


TEST_JVM_OPTIONS: Final = "-XX:MaxInlineLevel=6 -XX:InlineSmallCode=1000 -XX:-DoEscapeAnalysis"
"""JIT settings of the test sessions' driver JVMs: less C2 inlining, no escape analysis. A worker's JVM runs hundreds
of different query shapes a few times each, and half of its CPU went to the JIT compilers. Two cold JVMs side by side
on 2 cores, as the workers run (``python -m benchmarks.jit_options``): slowest 438 s with the JVM's defaults (twice),
406 s with these; compiler CPU per JVM 147 -> 112 s. The whole suite did not show it beyond noise (pytest 1,932 s
before, 1,928 s after). Figures and the settings tried: AGENTS.md. The embedded default (``cdclake.spark``) keeps the
JVM's own: a long-running stream lives on its peak code, which was not measured."""


TEST_COMPACTION_MODE: Final = "false"
"""Delta's auto compaction in the test sessions compacts by count only
(``cdclake.sinks.delta.AUTO_COMPACT_MODIFIED_PARTITIONS_ONLY``). In its default mode Delta also compacts every table on
its first file-adding commit in the process, about 0.5-1 s per table however small, and nearly every test writes new
tables (lake, history and bookkeeping tables of a fresh lake). ``tests/e2e/test_replay.py`` alone, one process,
alternated: 218 and 187 s in the default mode, 169 and 175 s count only; the whole suite less clearly (AGENTS.md).
What a table ends holding does not depend on the mode. The tests about compaction itself ask for the
default mode (the ``first_compaction`` fixture), and the tests that start `cdclake run` as a process get it too."""


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    from cdclake.sinks.delta import AUTO_COMPACT_MODIFIED_PARTITIONS_ONLY
    from cdclake.spark import get_session

    session = get_session(
        "cdclake-tests",
        master="local[2]",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
            AUTO_COMPACT_MODIFIED_PARTITIONS_ONLY: TEST_COMPACTION_MODE,
        },
    )
    yield session
    session.stop()


@pytest.fixture
def first_compaction(spark):  # type: ignore[no-untyped-def]
    """Delta's default auto compaction mode for the test, as cdclake's embedded session runs it: each table is
    compacted on its first file-adding commit in the process too (``TEST_COMPACTION_MODE``)."""
    from cdclake.sinks.delta import AUTO_COMPACT_MODIFIED_PARTITIONS_ONLY
    from cdclake.spark import session_settings

    with session_settings(spark, {AUTO_COMPACT_MODIFIED_PARTITIONS_ONLY: "true"}):
        yield


@pytest.fixture(scope="session")
def kafka() -> Iterator[str]:
    """Bootstrap servers of a real broker started for this test session (stopped at the end)."""
    from cdclake.devtools import broker

    directory = Path(tempfile.mkdtemp(prefix="cdclake-kafka-"))
    info = broker.start(directory, TEST_BROKER_PORT, fresh=True)
    try:
        yield info.bootstrap_servers
    finally:
        broker.stop(directory)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def lake(tmp_path: Path) -> str:
    return str(tmp_path / "lake")


# The longest test files first (test-seconds in a full run of the suite on 2 busy cores, 2026-12-05, each worker's
# first file with its JVM's start), so that pytest-xdist (`--dist loadfile`) hands them out first and does not end
# with one worker running a long file while the other idles. `make test` passes `--no-loadscope-reorder`: by default
# xdist orders files by their number of tests instead, which sent the single-test files (test_stream_kill, 110 s)
# last. Files not listed keep their order after these.
_LONG_FILES = (
    "tests/e2e/test_rendered_streams.py",  # 423 before its streams had key updates, 520 with them (2026-12-05)
    "tests/test_history.py",  # 434
    "tests/test_sequence_by.py",  # 222
    "tests/test_dlq.py",  # 220
    "tests/test_delta_sink.py",  # 188
    "tests/e2e/test_replay.py",  # 186
    "tests/test_transactions.py",  # 184
    "tests/test_key_changes.py",  # 355 with its rendered streams, 155 since they are test_rendered_streams' own
    "tests/test_iceberg_sink.py",  # 140
    "tests/e2e/test_stream_kill.py",  # 128 (the case is drawn)
    "tests/test_column_names.py",  # 29 in a full run, 114 alone with its JVM's start (2026-12-06)
    "tests/test_deletion_vectors.py",  # 126
    "tests/formats/test_plan_reuse.py",  # 119
    "tests/formats/test_lambda_invariants.py",  # 110
    "tests/test_ddl.py",  # 109
    "tests/e2e/test_spark_submit.py",  # 108 (spark-submit JVMs of their own)
    "tests/test_constraints.py",  # 102
    "tests/test_session.py",  # 101
    "tests/test_maintain.py",  # 100
    "tests/e2e/test_format_replay.py",  # 90
    "tests/e2e/test_routes.py",  # 87
    "tests/benchmarks/test_harness.py",  # 81
    "tests/formats/test_golden.py",  # 68
    "tests/formats/test_mutations.py",  # 64 (17 formats, one batch of mutated messages each)
    "tests/e2e/test_stream.py",  # 63
    "tests/devtools/test_broker.py",  # 53
    "tests/e2e/test_qlik_metadata.py",  # 50
    "tests/e2e/test_property_streams.py",  # 40
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(_LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
