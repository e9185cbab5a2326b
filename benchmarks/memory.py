"""Driver peak memory: resident set size of this Python process plus the Spark driver JVM it launched, sampled from
``/proc`` by a background thread.

Counted: the benchmark's own Python process (the driver's Python side) and its child JVM that runs the Spark driver
(``pyspark-shell`` on the command line). Not counted: the Kafka broker (also our child, but a separate service),
Python workers and workload generators. With ``local[N]`` the executors live inside the driver JVM, so their
memory is counted too: an upper bound for a cluster driver.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:
        return 0
    return int(fields[1]) * _PAGE


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _is_spark_driver(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"java" in command and b"pyspark-shell" in command


def driver_pids() -> list[int]:
    """This process and the Spark driver JVM(s) among its children."""
    me = os.getpid()
    return [me, *(child for child in _children(me) if _is_spark_driver(child))]


def python_rss() -> int:
    """Bytes resident in this Python process right now (0 without ``/proc``)."""
    return _rss(os.getpid())


def driver_rss() -> int:
    """Bytes resident in the driver right now."""
    return sum(_rss(pid) for pid in driver_pids())


class PeakSampler:
    """Samples :func:`driver_rss` every ``interval`` seconds while active; ``peak`` holds the largest sample."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, driver_rss())
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, driver_rss())
