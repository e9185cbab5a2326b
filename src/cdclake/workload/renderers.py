"""Registry of workload renderers: one per CDC format, turning a :class:`SourceHistory` into that format's messages.

A renderer is what a replication service would have written to Kafka for the history: the benchmarks, the demo and
the end-to-end tests use it with :meth:`SourceHistory.truth` as the independent reference. Each renderer module
(``cdclake.workload.<format>``) registers itself with :func:`register_renderer` under the format's registry name.

Contract of a renderer ``render(history, options, seed) -> RenderedStream``:

* messages in topic order (one partition); equal inputs give byte-identical messages;
* honour the :class:`RenderOptions` the format can express (a format without heartbeats ignores
  ``heartbeat_every``; one without changed-only images ignores ``partial_updates``);
* everything a consumer must be told because the format does not carry it (key columns, format options) goes into
  :class:`RenderedStream`, and so does any difference between what the lake can hold and the source truth
  (``expected``), each documented at the renderer as a limit of the format.
"""

from __future__ import annotations

import base64
import importlib
import json
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from cdclake.workload.history import SourceHistory

if TYPE_CHECKING:
    from cdclake.sources.files import InputEncoding

Truth = dict[tuple[str, str], list[dict[str, Any]]]
"""``(database, table)`` -> rows, as :meth:`SourceHistory.truth` returns it."""


@dataclass(frozen=True)
class Message:
    """One Kafka record.

    Attributes:
        key: Kafka key bytes, or ``None``.
        value: Kafka value bytes, or ``None`` (a Kafka tombstone).
        description: What it is, e.g. ``"INSERT crm.customer"``, ``"heartbeat"``, ``"resend: INSERT crm.customer"``,
            ``"malformed: truncated json"``.
    """

    key: bytes | None
    value: bytes | None
    description: str
    headers: tuple[tuple[str, bytes], ...] = ()
    """Kafka record headers (name, value), in order; text values (a capture file of records writes them so)."""
    timestamp: int | None = None
    """The Kafka record's timestamp, epoch milliseconds; None: left to the producer (or absent from a capture)."""

    @property
    def is_resend(self) -> bool:
        """True for a failover re-send (an exact copy of an earlier message)."""
        return self.description.startswith("resend: ")

    @property
    def is_malformed(self) -> bool:
        """True for a deliberately undecodable message."""
        return self.description.startswith("malformed: ")


@dataclass(frozen=True)
class RenderOptions:
    """Stream shape common to all renderers.

    Attributes:
        heartbeat_every: A heartbeat after about every this many messages (formats with heartbeats); 0: none.
        resends: Windows of 5-30 consecutive earlier messages written again byte for byte (redelivery after a
            failover); the consumer must end with the same tables.
        malformed: Undecodable messages to insert (each must become a dead letter).
        transactions: Mark transaction boundaries where the format can (1-5 changes per transaction).
        partial_updates: Render updates as changed-only images where the format has them (SharePlex, Canal
            ``old``, Qlik column masks, DDS ``$set``, OGG compressed updates, ...).
    """

    heartbeat_every: int = 50
    resends: int = 0
    malformed: int = 0
    transactions: bool = False
    partial_updates: bool = False


@dataclass
class RenderedStream:
    """A rendered history and what a consumer needs to be told about it.

    Attributes:
        messages: Kafka records in topic order.
        keys: ``db.table`` -> key columns for tables whose messages carry no keys (give to the pipeline as
            configured keys).
        format_options: Options of the format to decode these messages with.
        expected: Maps the source truth to what the lake tables must hold when the format cannot carry a value
            exactly (e.g. a timestamp that only exists as text); ``None`` when the tables must equal the truth.
    """

    messages: list[Message]
    keys: dict[str, list[str]] = field(default_factory=dict)
    format_options: dict[str, str] = field(default_factory=dict)
    expected: Callable[[Truth], Truth] | None = None

    def expected_truth(self, history: SourceHistory) -> Truth:
        truth = history.truth()
        return truth if self.expected is None else self.expected(truth)


class Renderer(Protocol):
    def __call__(self, history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream: ...


_RENDERERS: dict[str, Renderer] = {}


def register_renderer(format_name: str) -> Callable[[Renderer], Renderer]:
    """Decorator: registers ``render`` as the renderer of ``format_name`` (a name of :mod:`cdclake.formats`)."""

    def decorate(render: Renderer) -> Renderer:
        if format_name in _RENDERERS:
            raise ValueError(f"renderer for {format_name} registered twice")
        _RENDERERS[format_name] = render
        return render

    return decorate


def _load_all() -> None:
    import cdclake.workload as package

    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_") and module.name not in ("history", "renderers"):
            importlib.import_module(f"cdclake.workload.{module.name}")


def renderers() -> Mapping[str, Renderer]:
    """Format name -> renderer, for every format that has one."""
    _load_all()
    return dict(sorted(_RENDERERS.items()))


def get_renderer(format_name: str) -> Renderer:
    """The renderer of ``format_name``; ``KeyError`` listing the known ones if there is none."""
    known = renderers()
    if format_name not in known:
        raise KeyError(f"no workload renderer for {format_name!r}; known: {', '.join(known)}")
    return known[format_name]


def render_stream(
    format_name: str, history: SourceHistory, options: RenderOptions | None = None, seed: int = 0
) -> RenderedStream:
    """Renders ``history`` in ``format_name``."""
    return get_renderer(format_name)(history, options or RenderOptions(), seed)


def to_capture(messages: Sequence[Message], *, binary: bool = False) -> tuple[str, InputEncoding, int]:
    """Capture-file text for ``cdclake replay``, its ``--input-encoding`` and its number of lines: :func:`to_lines`
    when no message has headers or a timestamp, else one Kafka record per line (``records``: key and value in
    base64, exact bytes, headers and ``ts`` as ``kcat -J`` writes them), tombstones included."""
    if not any(m.headers or m.timestamp is not None for m in messages):
        text = to_lines(messages, binary=binary)
        return text, "b64" if binary else "lines", text.count("\n")

    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode("ascii")

    lines = [
        json.dumps(
            {
                "key_b64": b64(m.key),
                "value_b64": b64(m.value),
                "headers": [part for name, value in m.headers for part in (name, value.decode("utf-8"))] or None,
                "ts": m.timestamp,
            }
        )
        for m in messages
    ]
    return "".join(line + "\n" for line in lines), "records", len(lines)


def to_lines(messages: Sequence[Message], *, binary: bool = False) -> str:
    """Capture-file text for ``cdclake replay``: UTF-8 JSON lines, or base64 lines when ``binary``. Messages with
    no value (Kafka tombstones) cannot be stored in a capture file and are left out."""
    values = [m.value for m in messages if m.value is not None]
    if binary:
        return "".join(base64.b64encode(v).decode("ascii") + "\n" for v in values)
    return "".join(v.decode("utf-8") + "\n" for v in values)
