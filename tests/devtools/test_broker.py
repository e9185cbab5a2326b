"""The local Kafka broker helper against a real broker (no mocks).

Each test owns a broker in its own temporary directory, on ports of its own (19192-19199) so that it
clashes neither with the developer's broker (19092) nor with the session broker of the other tests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from cdclake.devtools import broker

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

LIFECYCLE_PORT = 19192
STALE_PORT = 19194
KILL_PORT = 19196
TAKEN_PORT = 19198

Record = tuple[int, int, bytes | None, bytes | None]


@pytest.fixture
def broker_dir(tmp_path: Path) -> Iterator[Path]:
    """A broker directory whose broker, if a test leaves one running, is stopped afterwards."""
    directory = tmp_path / "kafka"
    yield directory
    broker.stop(directory)


def consume(bootstrap_servers: str, topic: str, partitions: int, expected: int) -> list[Record]:
    """Read ``expected`` records from the start of every partition as (partition, offset, key, value)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"test-{uuid.uuid4()}",
            "enable.auto.commit": False,
        }
    )
    records: list[Record] = []
    try:
        # assign(), not subscribe(): no group rebalance to wait for.
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + 30
        while len(records) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            partition, offset = message.partition(), message.offset()
            assert partition is not None
            assert offset is not None
            records.append((partition, offset, message.key(), message.value()))
    finally:
        consumer.close()
    return records


def wait_dead(directory: Path, pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while broker.status(directory).pid == pid:
        assert time.monotonic() < deadline, f"broker pid {pid} still alive"
        time.sleep(0.1)


def test_lifecycle_topics_and_records(broker_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    info = broker.start(broker_dir, LIFECYCLE_PORT)
    assert info.running
    assert info.pid is not None
    assert info.bootstrap_servers == f"127.0.0.1:{LIFECYCLE_PORT}"
    assert info.log_file == broker_dir / "broker.log"
    assert info.log_file.is_file()
    assert info.data_dir == broker_dir / "data"
    assert (info.data_dir / "meta.properties").is_file()
    # The broker logs to its file, not to the JVM's stdout.
    assert "Kafka Server started" in info.log_file.read_text()
    assert "Kafka Server started" not in (broker_dir / "broker.out").read_text()

    assert broker.status(broker_dir, LIFECYCLE_PORT) == info
    assert broker.start(broker_dir, LIFECYCLE_PORT) == info  # idempotent: same process

    capsys.readouterr()
    assert broker.main(["status", "--dir", str(broker_dir), "--port", str(LIFECYCLE_PORT)]) == 0
    log = broker_dir / "broker.log"
    assert capsys.readouterr().out == (
        f"kafka broker running at 127.0.0.1:{LIFECYCLE_PORT} (pid {info.pid}, log {log})\n"
    )

    bootstrap = info.bootstrap_servers
    broker.create_topics(bootstrap, {"orders": 2})
    broker.create_topics(bootstrap, {"orders": 2})  # existing is fine
    messages: list[tuple[bytes | None, bytes | None]] = [(b"k1", b"v1"), (b"k2", None), (None, b"v3")]
    assert broker.produce(bootstrap, "orders", messages, partition=1) == 3
    assert consume(bootstrap, "orders", partitions=2, expected=3) == [
        (1, 0, b"k1", b"v1"),
        (1, 1, b"k2", None),
        (1, 2, None, b"v3"),
    ]

    broker.delete_topics(bootstrap, ["orders"])
    broker.delete_topics(bootstrap, ["orders"])  # already gone is fine

    broker.stop(broker_dir)
    stopped = broker.status(broker_dir, LIFECYCLE_PORT)
    assert not stopped.running
    assert stopped.pid is None
    assert not (broker_dir / "broker.pid").exists()
    broker.stop(broker_dir)  # idempotent
    assert broker.main(["status", "--dir", str(broker_dir), "--port", str(LIFECYCLE_PORT)]) == 1


def test_stale_pid_file_and_concurrent_starts(broker_dir: Path) -> None:
    broker_dir.mkdir(parents=True)
    pid_file = broker_dir / "broker.pid"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead_pid = int(dead.stdout)
    for stale in (dead_pid, os.getpid()):  # a dead process, and a live one that is not a broker
        pid_file.write_text(f"{stale}\n")
        info = broker.status(broker_dir, STALE_PORT)
        assert not info.running
        assert info.pid is None

    # Two processes racing to start the same broker (e.g. two pytest workers): exactly one JVM, both see it.
    env = {**os.environ, "PYTHONPATH": str(Path(broker.__file__).resolve().parents[2])}
    command = [sys.executable, "-m", "cdclake.devtools.broker", "start", "--dir", str(broker_dir)]
    command += ["--port", str(STALE_PORT)]
    racers = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [racer.communicate(timeout=120)[0] for racer in racers]
    assert [racer.returncode for racer in racers] == [0, 0]
    info = broker.status(broker_dir, STALE_PORT)
    assert info.running
    assert info.pid not in (None, dead_pid, os.getpid())
    assert pid_file.read_text().strip() == str(info.pid)
    expected = f"kafka broker running at 127.0.0.1:{STALE_PORT} (pid {info.pid}, log {broker_dir / 'broker.log'})\n"
    assert outputs == [expected, expected]


def test_restart_after_sigkill_keeps_data(broker_dir: Path) -> None:
    info = broker.start(broker_dir, KILL_PORT)
    assert info.pid is not None
    broker.create_topics(info.bootstrap_servers, {"survivor": 1})
    broker.produce(info.bootstrap_servers, "survivor", [(b"k", b"before the crash")])

    os.kill(info.pid, signal.SIGKILL)
    wait_dead(broker_dir, info.pid)
    crashed = broker.status(broker_dir, KILL_PORT)
    assert not crashed.running
    assert crashed.pid is None
    assert (broker_dir / "broker.pid").read_text().strip() == str(info.pid)  # stale, left by the crash

    restarted = broker.start(broker_dir, KILL_PORT)
    assert restarted.running
    assert restarted.pid not in (None, info.pid)
    assert consume(restarted.bootstrap_servers, "survivor", partitions=1, expected=1) == [
        (0, 0, b"k", b"before the crash")
    ]

    # fresh=True replaces the broker and forgets every topic.
    fresh = broker.start(broker_dir, KILL_PORT, fresh=True)
    assert fresh.pid not in (None, restarted.pid)
    with AdminClient({"bootstrap.servers": fresh.bootstrap_servers}) as admin:
        assert "survivor" not in admin.list_topics(timeout=10).topics


def test_port_taken_by_something_else(broker_dir: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", TAKEN_PORT))
        squatter.listen()
        with pytest.raises(broker.BrokerError, match=f"port {TAKEN_PORT} .* already in use"):
            broker.start(broker_dir, TAKEN_PORT, timeout=10)
    assert not (broker_dir / "broker.pid").exists()


def test_missing_jars_name_make_jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(broker.JARS_ENV, str(tmp_path))
    with pytest.raises(broker.BrokerError, match="make jars"):
        broker.kafka_jars_dir()
