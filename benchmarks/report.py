"""Target lines, ``RESULTS.md`` and the PNG plot."""

from __future__ import annotations

import math
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from benchmarks import plot

TARGET_LINE = re.compile(r"^target (\S+): (.+) \(goal (.+)\) (PASS|FAIL)$")
"""Every target is printed as exactly one line of this shape."""


@dataclass
class Target:
    name: str
    value: str
    goal: str
    passed: bool

    def line(self) -> str:
        return f"target {self.name}: {self.value} (goal {self.goal}) {'PASS' if self.passed else 'FAIL'}"


def at_least(name: str, value: float, goal: float, unit: str = "", digits: int = 2) -> Target:
    ok = not math.isnan(value) and value >= goal
    return Target(name, f"{value:.{digits}f}{unit}", f">= {goal:g}{unit}", ok)


def at_most(name: str, value: float, goal: float, unit: str = "", digits: int = 2) -> Target:
    ok = not math.isnan(value) and value <= goal
    return Target(name, f"{value:.{digits}f}{unit}", f"<= {goal:g}{unit}", ok)


def failed(name: str, goal: str, reason: str) -> Target:
    """A target whose benchmark could not produce a figure."""
    return Target(name, f"error ({reason[:120]})", goal, False)


def write_results(
    path: Path,
    *,
    mode: str,
    command: str,
    targets: list[Target],
    sections: list[tuple[str, list[str]]],
    plot_name: str,
) -> None:
    """``RESULTS.md``: the target lines, then one section per benchmark with its figures."""
    lines = [
        "# Benchmark results",
        "",
        f"`{command}` ({mode}) on {platform.node() or 'this machine'}: {platform.machine()}, "
        f"{_cpus()} CPUs, Python {platform.python_version()}. Other processes shared the cores: compare the ratios "
        "(both sides measured in the same run), not the absolute rates. How each figure is measured: "
        "[README.md](README.md).",
        "",
        "```",
        *(target.line() for target in targets),
        "```",
        "",
        f"![results]({plot_name})",
        "",
    ]
    for title, body in sections:
        lines += [f"## {title}", "", *body, ""]
    path.write_text("\n".join(lines))


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def write_plot(path: Path, panels: list[plot.Panel]) -> None:
    plot.write(path, [panel for panel in panels if panel.bars])
