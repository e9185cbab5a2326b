"""A real, local Apache Kafka broker for tests and the demo, run from its Maven Central jars.

The broker is a single KRaft node acting as both broker and controller, bound to 127.0.0.1 only, and
started with the machine's ``java`` (17+) straight from ``jars/kafka/lib`` (``make jars``): no Docker, no
downloads. Everything it owns lives in one directory (default ``.cdclake/kafka``)::

    server.properties   generated on every start
    log4j2.xml          broker logging goes to broker.log, never to the terminal
    broker.log          the broker's own log (rolled at 10 MiB)
    broker.out          JVM stdout/stderr: crashes before logging is up land here
    broker.pid          pid of the running broker
    broker.lock         serialises start/stop between processes (e.g. pytest workers)
    data/               KRaft metadata and topic data; data/meta.properties keeps the cluster id

Usage::

    python -m cdclake.devtools.broker start [--dir D] [--port P] [--fresh]
    python -m cdclake.devtools.broker status
    python -m cdclake.devtools.broker stop
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

if TYPE_CHECKING:
    # Only for annotations: confluent_kafka.admin uses it without re-exporting it.
    from confluent_kafka.admin._metadata import ClusterMetadata

DEFAULT_DIR = Path(".cdclake/kafka")
"""Where the broker keeps its config, logs and data; relative to the current directory."""

DEFAULT_PORT = 19092
"""Client (PLAINTEXT) port; the KRaft controller listens on ``port + 1``."""

HOST = "127.0.0.1"
"""The only interface the broker binds to: it is a developer tool, never reachable from the network."""

JARS_ENV = "CDCLAKE_KAFKA_JARS"
"""Environment variable that overrides where the Kafka jars are looked up."""

_PID_FILE = "broker.pid"
_LOG_FILE = "broker.log"
_OUT_FILE = "broker.out"
_CONFIG_FILE = "server.properties"
_LOG4J_FILE = "log4j2.xml"
_LOCK_FILE = "broker.lock"
_DATA_DIR = "data"

_HEAP = "512m"
_POLL_INTERVAL = 0.1
_LOG_TAIL_LINES = 40


class BrokerError(RuntimeError):
    """The local broker could not be started, stopped or reached."""


@dataclass(frozen=True)
class BrokerInfo:
    """What is known about the local broker of one directory.

    Attributes:
        bootstrap_servers: ``host:port`` for Kafka clients.
        pid: Pid of the broker process if it is alive (it may still be booting), else ``None``.
        running: True only if the process is alive *and* answers metadata requests on the port.
        log_file: The broker's log file.
        data_dir: The broker's data directory (KRaft metadata and topic logs).
    """

    bootstrap_servers: str
    pid: int | None
    running: bool
    log_file: Path
    data_dir: Path


# --------------------------------------------------------------------------------------------------------
# Locating jars and java
# --------------------------------------------------------------------------------------------------------


def kafka_jars_dir() -> Path:
    """Return the directory holding the Kafka broker jars.

    ``$CDCLAKE_KAFKA_JARS`` wins if set; otherwise ``<repo root>/jars/kafka/lib``, which ``make jars``
    fills from Maven Central.

    Returns:
        The jar directory; it contains at least the ``kafka_2.13-*.jar`` broker jar.

    Raises:
        BrokerError: If the directory is missing or holds no broker jar.
    """
    override = os.environ.get(JARS_ENV)
    if override:
        lib = Path(override)
        origin = f"from ${JARS_ENV}"
    else:
        lib = Path(__file__).resolve().parents[3] / "jars" / "kafka" / "lib"
        origin = "the default location"
    # Look for the broker jar itself, not just any jar: an interrupted copy often leaves only some of them.
    if not lib.is_dir() or not any(lib.glob("kafka_*.jar")):
        raise BrokerError(
            f"no Kafka broker jars (kafka_2.13-*.jar) in {lib} ({origin}); run `make jars` to copy them "
            f"from Maven Central, or point {JARS_ENV} at a directory that holds them"
        )
    return lib


def _java() -> str:
    """Return the java executable: ``$JAVA_HOME/bin/java`` if set, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise BrokerError("no `java` on PATH (or in $JAVA_HOME); the Kafka 4 broker needs Java 17 or newer")
    return found


# --------------------------------------------------------------------------------------------------------
# Files of a broker directory
# --------------------------------------------------------------------------------------------------------


def _bootstrap(port: int) -> str:
    return f"{HOST}:{port}"


def _info(directory: Path, port: int, pid: int | None, running: bool) -> BrokerInfo:
    return BrokerInfo(
        bootstrap_servers=_bootstrap(port),
        pid=pid,
        running=running,
        log_file=directory / _LOG_FILE,
        data_dir=directory / _DATA_DIR,
    )


def _config_path(directory: Path) -> Path:
    # Absolute and canonical: it is what identifies our broker in /proc/<pid>/cmdline.
    return directory.resolve() / _CONFIG_FILE


def _read_pid(directory: Path) -> int | None:
    try:
        return int((directory / _PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _write_pid(directory: Path, pid: int) -> None:
    # Write-then-rename so a concurrent status() never reads a half-written pid.
    tmp = directory / f"{_PID_FILE}.tmp"
    tmp.write_text(f"{pid}\n")
    tmp.replace(directory / _PID_FILE)


def _configured_port(directory: Path) -> int | None:
    """Return the client port from the directory's server.properties, i.e. the port of the last start."""
    try:
        text = _config_path(directory).read_text()
    except OSError:
        return None
    match = re.search(r"^listeners=PLAINTEXT://[^:]+:(\d+)", text, flags=re.MULTILINE)
    return int(match.group(1)) if match else None


def _cluster_id(directory: Path) -> str | None:
    """Return the cluster id that ``StorageTool format`` recorded in data/meta.properties."""
    try:
        text = (directory / _DATA_DIR / "meta.properties").read_text()
    except OSError:
        return None
    match = re.search(r"^cluster\.id=(\S+)", text, flags=re.MULTILINE)
    return match.group(1) if match else None


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tail(path: Path, since: int = 0, lines: int = _LOG_TAIL_LINES) -> str:
    """Return the last ``lines`` lines of ``path`` written after byte offset ``since``."""
    try:
        with path.open("rb") as fh:
            fh.seek(since if since <= path.stat().st_size else 0)
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def _diagnostics(directory: Path, log_offset: int = 0, out_offset: int = 0) -> str:
    parts = []
    out = _tail(directory / _OUT_FILE, out_offset)
    if out.strip():
        parts.append(f"--- {directory / _OUT_FILE} ---\n{out}")
    log = _tail(directory / _LOG_FILE, log_offset)
    if log.strip():
        parts.append(f"--- last lines of {directory / _LOG_FILE} ---\n{log}")
    return "\n".join(parts) if parts else "(the broker wrote nothing to its log)"


@contextlib.contextmanager
def _locked(directory: Path, timeout: float) -> Iterator[None]:
    """Hold an exclusive lock on the directory so concurrent start/stop calls run one after the other.

    Two pytest processes starting "the" broker at once would otherwise both see no broker, both format and
    both launch java; with the lock the second one waits and then finds the first one's broker running.
    """
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / _LOCK_FILE).open("a") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BrokerError(
                        f"timed out after {timeout:g}s waiting for another process to finish starting or "
                        f"stopping the broker in {directory} (lock {directory / _LOCK_FILE})"
                    ) from None
                time.sleep(_POLL_INTERVAL)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------------------
# Processes and ports
# --------------------------------------------------------------------------------------------------------


def _thread_states(proc: Path) -> list[str]:
    """Return the scheduler state letter of every thread of the process at ``proc`` (``/proc/<pid>``)."""
    states = []
    with contextlib.suppress(OSError):
        for task in proc.joinpath("task").iterdir():
            with contextlib.suppress(OSError):
                # The state follows the parenthesised thread name, which may contain spaces or parentheses.
                fields = task.joinpath("stat").read_text().rsplit(")", 1)[-1].split()
                if fields:
                    states.append(fields[0])
    return states


def _is_our_broker(pid: int, config: Path) -> bool:
    """Tell whether ``pid`` is a live broker started with ``config``.

    A pid file outlives a SIGKILLed broker, and after a reboot (or enough process churn) its pid can belong
    to anything, so on Linux the command line is checked too. A process counts as alive while any of its
    threads is: a killed JVM's main thread turns zombie (and its cmdline empty) first, while other threads
    still hold the listening sockets for a moment. A process whose threads are all zombies is dead: the
    broker is not our child, and where pid 1 does not reap (some containers) it stays a zombie forever.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        # Alive but owned by another user: certainly not a broker we started.
        return False
    if not Path("/proc/self").exists():
        return True  # no procfs (e.g. macOS): a live pid is the best evidence available
    proc = Path("/proc") / str(pid)
    if not any(state not in {"Z", "X"} for state in _thread_states(proc)):
        return False
    try:
        cmdline = proc.joinpath("cmdline").read_bytes()
    except OSError:
        return False
    if not cmdline:
        # Either a dying process (zombie main thread, other threads still exiting), which can only be the
        # broker the pid file names, or a kernel thread, which cannot be.
        leader = proc.joinpath("stat").read_text().rsplit(")", 1)[-1].split()[:1]
        return leader == ["Z"]
    args = [arg.decode(errors="replace") for arg in cmdline.split(b"\0")]
    return "kafka.Kafka" in args and str(config) in args


def _live_pid(directory: Path) -> int | None:
    pid = _read_pid(directory)
    if pid is not None and _is_our_broker(pid, _config_path(directory)):
        return pid
    return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR as the JVM does: a port left in TIME_WAIT by a broker we just stopped is free to it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _check_ports_free(directory: Path, port: int, grace: float = 2.0) -> None:
    """Raise unless the client and controller ports can be bound, allowing ``grace`` seconds to free up.

    The grace covers sockets a broker that has just died has not quite released yet.
    """
    deadline = time.monotonic() + grace
    while True:
        taken = [p for p in (port, port + 1) if not _port_free(p)]
        if not taken:
            return
        if time.monotonic() > deadline:
            raise BrokerError(
                f"port {taken[0]} on {HOST} is already in use by another process, not by the Kafka broker "
                f"of {directory}; stop that process or choose another port (the broker needs {port} and "
                f"{port + 1})"
            )
        time.sleep(_POLL_INTERVAL)


def _port_open(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def _metadata(bootstrap_servers: str, timeout: float) -> ClusterMetadata | None:
    """Fetch cluster metadata, or ``None`` if the broker does not answer (yet)."""
    # log_level 0: while a broker boots, librdkafka would print a "connection refused" line to stderr for
    # every reconnect; the caller decides what a failure means.
    try:
        with AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0}) as admin:
            metadata = admin.list_topics(timeout=timeout)
    except KafkaException:
        return None
    # A broker that answers but has not registered with the controller yet lists no brokers and cannot
    # create topics; not ready.
    return metadata if metadata.brokers else None


def _answers(directory: Path, port: int, timeout: float = 2.0) -> bool:
    """Tell whether our broker (same cluster id) answers metadata requests on ``port``."""
    if not _port_open(port):
        return False
    metadata = _metadata(_bootstrap(port), timeout)
    if metadata is None:
        return False
    expected = _cluster_id(directory)
    return expected is None or metadata.cluster_id == expected


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_gone(pid: int, config: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _is_our_broker(pid, config):
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_INTERVAL)
    return True


# --------------------------------------------------------------------------------------------------------
# Configuration and storage
# --------------------------------------------------------------------------------------------------------


def _server_properties(directory: Path, port: int) -> str:
    cport = port + 1
    data = directory.resolve() / _DATA_DIR
    settings = {
        # One JVM is both the KRaft controller and the broker.
        "process.roles": "broker,controller",
        "node.id": "1",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{cport}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{cport}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        # Dynamic quorum (KIP-853) formatted with --standalone: controller.quorum.voters must stay unset.
        "controller.quorum.bootstrap.servers": f"{HOST}:{cport}",
        "log.dirs": str(data),
        # Single node: every internal topic must live with replication factor 1 and min ISR 1.
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        # Internal topics default to 50 partitions each; one is plenty locally and their creation (on the
        # first consumer group commit or transaction) is then near-instant.
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.num.partitions": "1",
        # Consumer groups form immediately instead of waiting 3 s for more members.
        "group.initial.rebalance.delay.ms": "0",
        # After a SIGKILL the controller keeps the dead incarnation registered until its session expires
        # (default 9 s) and only then lets the restarted broker register: restarts would take 12 s instead
        # of 2-3 s. 4 s still leaves room for GC pauses of a machine busy with Spark.
        "broker.session.timeout.ms": "4000",
        "broker.heartbeat.interval.ms": "500",
        # The active controller appends a no-op record to the metadata log every 500 ms when idle (KIP-835), for
        # observers to tell a live quorum from a stalled one; a single node has none. An idle broker used 1.9-2.1
        # CPU-s a minute with them, 1.5 without, 1.0-1.1 with the serial collector below too: the test suite keeps
        # one broker per worker for half an hour on two busy cores.
        "metadata.max.idle.interval.ms": "0",
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        # Small footprint: the log cleaner (needed for compacted __consumer_offsets) allocates its 128 MiB
        # dedupe buffer up front from a 512 MiB heap; 16 MiB segments keep tiny test topics tiny.
        "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
        "log.segment.bytes": str(16 * 1024 * 1024),
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "2",
    }
    header = "# Generated by cdclake.devtools.broker on every start; edits are overwritten.\n"
    return header + "".join(f"{key}={value}\n" for key, value in settings.items())


def _log4j2_xml(directory: Path) -> str:
    log = directory.resolve() / _LOG_FILE
    # XML, not the YAML Kafka ships: it needs no extra parser on the classpath. The file appender keeps the
    # terminal (and broker.out) quiet so that broker.out only shows JVM-level failures.
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by cdclake.devtools.broker on every start; edits are overwritten. -->
<Configuration status="warn">
  <Appenders>
    <RollingFile name="file" fileName="{log}" filePattern="{log}.%i">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <Policies><SizeBasedTriggeringPolicy size="10 MB"/></Policies>
      <DefaultRolloverStrategy max="3"/>
    </RollingFile>
  </Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="file"/></Root>
    <!-- Per-request and state-change chatter would drown the interesting lines. -->
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="org.apache.kafka.clients" level="WARN"/>
  </Loggers>
</Configuration>
"""


def _random_cluster_id() -> str:
    """Return a new Kafka cluster id, as ``kafka-storage random-uuid`` would.

    Same algorithm as ``org.apache.kafka.common.Uuid.randomUuid()`` (URL-safe base64 of a random v4 UUID,
    never starting with '-', which would read like a command-line flag), without paying for a JVM start.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _jvm_command(java: str, jars: Path, directory: Path, main_class: str, heap: str) -> list[str]:
    return [
        java,
        f"-Xmx{heap}",
        f"-Xms{heap}",
        # The serial collector: a small heap on a machine whose cores Spark keeps busy, where G1's concurrent
        # threads cost more CPU than its shorter pauses are worth.
        "-XX:+UseSerialGC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={directory.resolve() / _LOG4J_FILE}",
        "-cp",
        f"{jars}/*",  # expanded by java itself, not by a shell
        main_class,
    ]


def _format_storage(java: str, jars: Path, directory: Path) -> None:
    """Format the KRaft storage once; later starts reuse it (and with it the cluster id and all topics)."""
    data = directory / _DATA_DIR
    if (data / "meta.properties").is_file():
        return
    # Without meta.properties nothing in data/ is usable (an interrupted format, a half-wiped directory),
    # and leftovers such as bootstrap.checkpoint would make `format` refuse to run.
    shutil.rmtree(data, ignore_errors=True)
    command = [
        *_jvm_command(java, jars, directory, "kafka.tools.StorageTool", "256m"),
        "format",
        "--standalone",
        "--cluster-id",
        _random_cluster_id(),
        "--config",
        str(_config_path(directory)),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise BrokerError(
            f"formatting Kafka storage in {data} failed (exit {result.returncode}):\n{result.stdout}{result.stderr}"
        )


def _launch(java: str, jars: Path, directory: Path) -> int:
    """Start the broker JVM detached from this process and return its pid.

    A throw-away ``sh`` starts java in the background and exits, so java is re-parented to init rather than
    being our child: a long-lived caller (pytest) then never accumulates a zombie broker or warnings about a
    "still running" subprocess. ``start_new_session`` puts it in its own session, so a Ctrl-C in the
    terminal that started it does not kill it.
    """
    command = [*_jvm_command(java, jars, directory, "kafka.Kafka", _HEAP), str(_config_path(directory))]
    script = 'out=$1; shift; "$@" </dev/null >>"$out" 2>&1 & echo $!'
    result = subprocess.run(
        ["/bin/sh", "-c", script, "sh", str(directory / _OUT_FILE), *command],
        capture_output=True,
        text=True,
        check=False,
        start_new_session=True,
        timeout=30,
    )
    if result.returncode != 0 or not result.stdout.strip().isdigit():
        raise BrokerError(f"could not launch the Kafka broker: {result.stdout}{result.stderr}")
    return int(result.stdout.strip())


def _wait_ready(directory: Path, pid: int, port: int, timeout: float, log_offset: int, out_offset: int) -> None:
    """Wait until the broker answers metadata requests; raise with its log tail if it dies or times out."""
    config = _config_path(directory)
    deadline = time.monotonic() + timeout
    while True:
        if not _is_our_broker(pid, config):
            raise BrokerError(
                f"the Kafka broker (pid {pid}) exited during startup\n{_diagnostics(directory, log_offset, out_offset)}"
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrokerError(
                f"the Kafka broker (pid {pid}) did not answer on {_bootstrap(port)} within {timeout:g}s\n"
                f"{_diagnostics(directory, log_offset, out_offset)}"
            )
        # Probe the socket first: cheap, and metadata requests against a closed port only burn the timeout.
        if _port_open(port, timeout=min(0.5, remaining)) and _answers(directory, port, min(2.0, remaining)):
            return
        time.sleep(_POLL_INTERVAL)


# --------------------------------------------------------------------------------------------------------
# Public API: lifecycle
# --------------------------------------------------------------------------------------------------------


def start(
    directory: Path = DEFAULT_DIR, port: int = DEFAULT_PORT, *, fresh: bool = False, timeout: float = 60.0
) -> BrokerInfo:
    """Start the local broker of ``directory`` unless it is already running; wait until it answers.

    Idempotent and safe to call from several processes: calls are serialised by a lock file, and a broker
    recorded in ``broker.pid`` that is alive is reused (waiting for it if it is still booting). A stale pid
    file (broker killed, machine rebooted) is discarded. Storage is formatted only on the first start, so
    topics and offsets survive restarts unless ``fresh`` is set.

    Args:
        directory: Directory for config, logs, pid file and data; created if missing.
        port: Client port on 127.0.0.1; the controller uses ``port + 1``.
        fresh: Stop any running broker of this directory and delete its data (and cluster id) first.
        timeout: Seconds to wait for the broker to answer.

    Returns:
        The running broker.

    Raises:
        BrokerError: If the jars or java are missing, a port is taken by something else, a broker of this
            directory already runs on another port, or the broker dies or does not answer in time (the
            message then ends with the tail of its logs).
    """
    directory = Path(directory)
    # Generous lock timeout: another process may legitimately spend its whole own timeout booting.
    with _locked(directory, timeout + 60.0):
        if fresh:
            _stop_locked(directory, timeout=30.0)
            shutil.rmtree(directory / _DATA_DIR, ignore_errors=True)

        pid = _live_pid(directory)
        if pid is not None:
            running_port = _configured_port(directory) or port
            if running_port != port:
                raise BrokerError(
                    f"the Kafka broker of {directory} already runs on {_bootstrap(running_port)} "
                    f"(pid {pid}); stop it first or use port {running_port}"
                )
            # Alive but possibly still booting (an earlier start() may have been interrupted).
            _wait_ready(directory, pid, port, timeout, _file_size(directory / _LOG_FILE), 0)
            return _info(directory, port, pid, running=True)

        (directory / _PID_FILE).unlink(missing_ok=True)  # stale: its process is gone or is not our broker
        _check_ports_free(directory, port)

        jars = kafka_jars_dir()
        java = _java()
        _config_path(directory).write_text(_server_properties(directory, port))
        (directory / _LOG4J_FILE).write_text(_log4j2_xml(directory))
        _format_storage(java, jars, directory)

        log_offset = _file_size(directory / _LOG_FILE)
        out_offset = _file_size(directory / _OUT_FILE)
        pid = _launch(java, jars, directory)
        _write_pid(directory, pid)
        try:
            _wait_ready(directory, pid, port, timeout, log_offset, out_offset)
        except BrokerError:
            # Do not leave a half-started broker holding the ports; the next start() begins from scratch.
            _stop_locked(directory, timeout=10.0)
            raise
        return _info(directory, port, pid, running=True)


def _stop_locked(directory: Path, timeout: float) -> int | None:
    """Stop the broker of ``directory`` (lock already held); return the pid that was stopped, if any."""
    pid = _live_pid(directory)
    if pid is not None:
        config = _config_path(directory)
        # SIGTERM lets Kafka close its logs cleanly, so the next start skips log recovery.
        _signal(pid, signal.SIGTERM)
        if not _wait_gone(pid, config, timeout):
            _signal(pid, signal.SIGKILL)
            if not _wait_gone(pid, config, 10.0):
                raise BrokerError(f"the Kafka broker (pid {pid}) survived SIGKILL")
    (directory / _PID_FILE).unlink(missing_ok=True)
    return pid


def stop(directory: Path = DEFAULT_DIR, timeout: float = 30.0) -> None:
    """Stop the broker of ``directory``: SIGTERM, then SIGKILL after ``timeout`` seconds.

    Idempotent: does nothing (but remove a stale pid file) if no broker of this directory runs. Data is kept.

    Args:
        directory: The broker's directory.
        timeout: Seconds to wait for a clean shutdown before killing it.

    Raises:
        BrokerError: If the broker cannot be killed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return
    with _locked(directory, timeout + 60.0):
        _stop_locked(directory, timeout)


def status(directory: Path = DEFAULT_DIR, port: int = DEFAULT_PORT) -> BrokerInfo:
    """Report on the broker of ``directory`` without changing anything.

    Args:
        directory: The broker's directory.
        port: Port to report if no broker runs; a live broker reports the port it was started with.

    Returns:
        ``pid`` is set if the broker process is alive; ``running`` only if it also answers.
    """
    directory = Path(directory)
    pid = _live_pid(directory)
    if pid is None:
        return _info(directory, port, None, running=False)
    port = _configured_port(directory) or port
    return _info(directory, port, pid, running=_answers(directory, port))


# --------------------------------------------------------------------------------------------------------
# Public API: topics and records
# --------------------------------------------------------------------------------------------------------


def _wait_for_metadata(
    admin: AdminClient,
    bootstrap_servers: str,
    timeout: float,
    done: Callable[[ClusterMetadata], bool],
    what: str,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrokerError(f"timed out after {timeout:g}s waiting for {what} on {bootstrap_servers}")
        # list_topics() without a topic name: naming one would let auto.create.topics.enable resurrect a
        # topic that is being deleted.
        with contextlib.suppress(KafkaException):
            if done(admin.list_topics(timeout=min(5.0, remaining))):
                return
        time.sleep(_POLL_INTERVAL)


def create_topics(bootstrap_servers: str, topics: dict[str, int], timeout: float = 30.0) -> None:
    """Create topics (replication factor 1) and wait until every partition has a leader.

    Idempotent: a topic that already exists is left as it is, whatever its partition count.

    Args:
        bootstrap_servers: ``host:port`` of the broker.
        topics: Topic name -> number of partitions.
        timeout: Seconds for the whole operation.

    Raises:
        BrokerError: If a topic cannot be created or does not become usable in time.
    """
    if not topics:
        return
    with AdminClient({"bootstrap.servers": bootstrap_servers}) as admin:
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1) for name, partitions in topics.items()],
            request_timeout=timeout,
            operation_timeout=timeout,
        )
        for name, future in futures.items():
            try:
                future.result(timeout=timeout)
            except KafkaException as exc:
                error = exc.args[0]
                if not (isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                    raise BrokerError(f"could not create topic {name!r}: {error}") from exc
            except TimeoutError as exc:
                raise BrokerError(f"timed out after {timeout:g}s trying to create topic {name!r}") from exc

        def usable(metadata: ClusterMetadata) -> bool:
            # Producing right after creation fails while a partition has no leader yet.
            for name in topics:
                topic = metadata.topics.get(name)
                if topic is None or topic.error is not None or not topic.partitions:
                    return False
                if any(partition.leader < 0 for partition in topic.partitions.values()):
                    return False
            return True

        _wait_for_metadata(admin, bootstrap_servers, timeout, usable, f"topics {sorted(topics)}")


def delete_topics(bootstrap_servers: str, topics: list[str], timeout: float = 30.0) -> None:
    """Delete topics and wait until metadata no longer lists them; missing topics are fine.

    With ``auto.create.topics.enable`` on (the Kafka default, kept here), a producer or consumer that still
    uses a deleted topic will create it again.

    Args:
        bootstrap_servers: ``host:port`` of the broker.
        topics: Topic names.
        timeout: Seconds for the whole operation.

    Raises:
        BrokerError: If a topic cannot be deleted or is still listed after ``timeout``.
    """
    if not topics:
        return
    with AdminClient({"bootstrap.servers": bootstrap_servers}) as admin:
        futures = admin.delete_topics(list(topics), request_timeout=timeout, operation_timeout=timeout)
        for name, future in futures.items():
            try:
                future.result(timeout=timeout)
            except KafkaException as exc:
                error = exc.args[0]
                if not (isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                    raise BrokerError(f"could not delete topic {name!r}: {error}") from exc
            except TimeoutError as exc:
                raise BrokerError(f"timed out after {timeout:g}s trying to delete topic {name!r}") from exc

        def gone(metadata: ClusterMetadata) -> bool:
            return not any(name in metadata.topics for name in topics)

        _wait_for_metadata(admin, bootstrap_servers, timeout, gone, f"deletion of topics {sorted(topics)}")


def produce(
    bootstrap_servers: str,
    topic: str,
    messages: Iterable[tuple[bytes | None, bytes | None]],
    *,
    partition: int | None = None,
    headers: Sequence[Sequence[tuple[str, bytes]] | None] | None = None,
    timeout: float = 30.0,
) -> int:
    """Produce ``(key, value)`` records in order and wait until all are acknowledged.

    The producer is idempotent with ``acks=all``, so retries neither duplicate nor reorder records within a
    partition. Without ``partition``, keys are spread with murmur2 like the Java client (and so Debezium and
    Kafka Connect), so a key lands on the same partition as it would in production.

    Args:
        bootstrap_servers: ``host:port`` of the broker.
        topic: Target topic.
        messages: ``(key, value)`` pairs; either may be ``None`` (a ``None`` value is a tombstone).
        partition: Send everything to this partition instead of partitioning by key.
        headers: Each record's headers, in the order of ``messages`` (None: none).
        timeout: Seconds to wait for the final flush.

    Returns:
        The number of records produced.

    Raises:
        BrokerError: If any record fails to be delivered.
    """
    producer = Producer(
        {
            "bootstrap.servers": bootstrap_servers,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "lz4",
            "partitioner": "murmur2_random",
        }
    )
    errors: list[str] = []

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            errors.append(f"{message.topic()}[{message.partition()}]: {error}")

    # -1 is librdkafka's "unassigned": let the partitioner choose.
    target = -1 if partition is None else partition
    count = 0
    try:
        for index, (key, value) in enumerate(messages):
            given = None if headers is None else headers[index]
            record_headers: list[tuple[str, str | bytes | None]] | None = (
                None if given is None else [(name, value) for name, value in given]
            )
            while True:
                try:
                    producer.produce(
                        topic, value=value, key=key, partition=target, headers=record_headers, on_delivery=on_delivery
                    )
                    break
                except BufferError:
                    # Local queue full: serve delivery reports to make room, then retry the same record.
                    producer.poll(_POLL_INTERVAL)
            count += 1
            producer.poll(0)
        remaining = producer.flush(timeout)
        if remaining:
            errors.append(f"{remaining} record(s) still unacknowledged after {timeout:g}s")
    finally:
        # Drop whatever is still queued (only after a failure) so that close(), which flushes, cannot hang.
        producer.purge()
        producer.close()
    if errors:
        raise BrokerError(f"producing to {topic!r} on {bootstrap_servers} failed: " + "; ".join(errors[:5]))
    return count


# --------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------


def _describe(info: BrokerInfo) -> str:
    if info.running:
        return f"kafka broker running at {info.bootstrap_servers} (pid {info.pid}, log {info.log_file})"
    if info.pid is not None:
        return (
            f"kafka broker starting but not answering yet at {info.bootstrap_servers} "
            f"(pid {info.pid}, log {info.log_file})"
        )
    return f"kafka broker not running (dir {info.log_file.parent})"


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m cdclake.devtools.broker start|stop|status``.

    Args:
        argv: Arguments without the program name; defaults to ``sys.argv[1:]``.

    Returns:
        The exit code: 0 on success (``status``: only if the broker is running), 1 otherwise.
    """
    parser = argparse.ArgumentParser(
        prog="python -m cdclake.devtools.broker",
        description="Local Apache Kafka broker (KRaft) for development.",
    )
    parser.add_argument("command", choices=["start", "stop", "status"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"broker directory (default {DEFAULT_DIR})")
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"client port; controller uses port+1 (default {DEFAULT_PORT})",
    )
    parser.add_argument("--fresh", action="store_true", help="start: wipe the data of this directory first")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (default 60)")
    args = parser.parse_args(argv)

    try:
        if args.command == "start":
            print(_describe(start(args.dir, args.port, fresh=args.fresh, timeout=args.timeout)))
            return 0
        if args.command == "stop":
            pid = _live_pid(args.dir)
            stop(args.dir, timeout=args.timeout)
            if pid is None:
                print(f"kafka broker not running (dir {args.dir})")
            else:
                print(f"kafka broker stopped (pid {pid}, dir {args.dir})")
            return 0
        info = status(args.dir, args.port)
        print(_describe(info))
        return 0 if info.running else 1
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
