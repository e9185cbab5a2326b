"""Deterministic source-database simulator: change histories, their exact final state, and vendor renderings.

* :mod:`cdclake.workload.history`: format-independent :class:`SourceHistory` (changes and the truth).
* :mod:`cdclake.workload.renderers`: one renderer per CDC format (``renderers()``, ``render_stream(name, ...)``).
* :mod:`cdclake.workload.dataworks`: DataWorks whole-database JSON Kafka messages for a history.

Example:
    >>> from cdclake.workload import DataWorksOptions, HistoryConfig, SourceHistory, render
    >>> history = SourceHistory.generate(HistoryConfig(seed=7, events=100))
    >>> messages = render(history, DataWorksOptions(update_mode="mixed", failover_resends=2), seed=7)
    >>> truth = history.truth()  # {(database, table): [row, ...]}
"""

from __future__ import annotations

from cdclake.workload.dataworks import (
    DataWorksOptions,
    render,
    render_change,
    to_b64_lines,
    to_jsonl,
)
from cdclake.workload.history import Change, Column, ColumnKind, HistoryConfig, SourceHistory, TableSpec
from cdclake.workload.renderers import Message, RenderedStream, RenderOptions, get_renderer, render_stream, renderers

__all__ = [
    "Change",
    "Column",
    "ColumnKind",
    "DataWorksOptions",
    "HistoryConfig",
    "Message",
    "RenderOptions",
    "RenderedStream",
    "SourceHistory",
    "TableSpec",
    "get_renderer",
    "render",
    "render_change",
    "render_stream",
    "renderers",
    "to_b64_lines",
    "to_jsonl",
]
