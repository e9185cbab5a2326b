"""CPU seconds of processes and threads, read from ``/proc`` (Linux only), for benchmarks that say where CPU went."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def jvm_pid(spark: Any) -> int:
    """The process id of the JVM behind a classic (Py4J) Spark session: with ``local[N]``, the driver and executors."""
    return int(spark._jvm.java.lang.ProcessHandle.current().pid())


def cpu_seconds(stat: Path) -> float:
    """User + system CPU seconds in a ``/proc`` ``stat`` file (of a process or one of its threads)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds of the whole process, threads that ended included."""
    return cpu_seconds(Path(f"/proc/{pid}/stat"))


def children_cpu(pid: int) -> float:
    """CPU seconds of the processes that ``pid`` started and has waited for (Hadoop's shell calls, say)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int, name_part: str) -> float:
    """CPU seconds of the process's live threads whose name holds ``name_part``."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if name_part in (task / "comm").read_text():
                total += cpu_seconds(task / "stat")
        except OSError:  # the thread ended meanwhile
            continue
    return total


def machine_cpu() -> tuple[float, float]:
    """CPU seconds the machine has spent busy and idle since it started, over all cores (``/proc/stat``)."""
    ticks = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    hertz = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal...: idle and iowait are not busy.
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / hertz, (ticks[3] + ticks[4]) / hertz


@dataclass(frozen=True)
class JvmCpu:
    """CPU seconds of one JVM and of the Python process driving it, at one moment (subtract two to get a span's)."""

    machine_busy: float
    machine_idle: float
    jvm: float
    jit: float
    gc: float
    started_processes: float
    python: float

    @classmethod
    def now(cls, jvm_pid: int) -> JvmCpu:
        busy, idle = machine_cpu()
        times = os.times()
        return cls(
            machine_busy=busy,
            machine_idle=idle,
            jvm=process_cpu(jvm_pid),
            # HotSpot's compiler threads ("C1 CompilerThre", "C2 CompilerThre") and collector threads
            # ("GC Thread#0", "VM Thread" for the parallel collector's safepoint work) live as long as the JVM does,
            # so their live threads hold all their CPU.
            jit=thread_cpu(jvm_pid, "CompilerThre"),
            gc=thread_cpu(jvm_pid, "GC Thread") + thread_cpu(jvm_pid, "VM Thread"),
            started_processes=children_cpu(jvm_pid),
            python=times.user + times.system,
        )

    def __sub__(self, other: JvmCpu) -> JvmCpu:
        return JvmCpu(*(getattr(self, name) - getattr(other, name) for name in self.__dataclass_fields__))
