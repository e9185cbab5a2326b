"""Stream shaping shared by the renderers: the message stream with the places between transactions where extra
messages may go (:class:`StreamBuilder`, used by every renderer), failover re-send windows (:func:`add_resend`, idem),
commit groups, and the insertion of undecodable messages (:func:`shape`: DTS, DRS, SharePlex, DDS; the open formats
and the Canal family insert theirs after a template, see ``_open_common`` and ``_canal_family``).

What a renderer writes for one change is format-specific; how a real stream interleaves those messages with
re-sends and garbage is not, so it lives here once.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from cdclake.workload.history import Change
from cdclake.workload.renderers import Message, RenderOptions

SCHEMA_CHANGES = frozenset({"TRUNCATE", "ADD_COLUMN"})
"""Change kinds that commit on their own (DDL implicitly commits in MySQL and Oracle)."""

MAX_TRANSACTION = 5


@dataclass
class StreamBuilder:
    """Messages in topic order plus the indexes between transactions, where extra messages may be inserted."""

    messages: list[Message] = field(default_factory=list)
    boundaries: list[int] = field(default_factory=lambda: [0])

    def append(self, message: Message) -> None:
        self.messages.append(message)

    def mark_boundary(self) -> None:
        """The stream is between transactions here."""
        if self.boundaries[-1] != len(self.messages):
            self.boundaries.append(len(self.messages))

    def insert(self, at: int, new: list[Message]) -> None:
        """Inserts ``new`` before index ``at`` (a boundary); both ends of the insert become boundaries."""
        self.messages[at:at] = new
        shifted = [b if b < at else b + len(new) for b in self.boundaries]
        self.boundaries = sorted({*shifted, at, at + len(new)})


def commit_groups(changes: list[Change], rng: random.Random, transactions: bool) -> list[list[Change]]:
    """Splits changes into commits: 1-5 row changes per transaction when ``transactions``, else one change per
    commit; a TRUNCATE or ADD COLUMN always commits alone."""
    if not transactions:
        return [[c] for c in changes]
    groups: list[list[Change]] = []
    current: list[Change] = []
    target = rng.randint(1, MAX_TRANSACTION)
    for change in changes:
        if change.op in SCHEMA_CHANGES:
            if current:
                groups.append(current)
                current = []
            groups.append([change])
            continue
        current.append(change)
        if len(current) >= target:
            groups.append(current)
            current = []
            target = rng.randint(1, MAX_TRANSACTION)
    if current:
        groups.append(current)
    return groups


def add_resend(stream: StreamBuilder, rng: random.Random) -> None:
    """Writes the 5-30 messages before a random boundary again right after it, byte for byte (a failover: the
    writer resumes from its last checkpoint)."""
    ends = [b for b in stream.boundaries if b >= 1]
    if not ends:
        return
    end = rng.choice(ends)
    starts = [b for b in stream.boundaries if 5 <= end - b <= 30] or [max(b for b in stream.boundaries if b < end)]
    start = rng.choice(starts)
    copies = [
        dataclasses.replace(m, description=m.description if m.is_resend else f"resend: {m.description}")
        for m in stream.messages[start:end]
        if not m.is_malformed  # a re-send repeats what the writer wrote, never a corrupted delivery
    ]
    if copies:
        stream.insert(end, copies)


def cut_short(rng: random.Random, value: bytes) -> bytes:
    """``value`` cut at a random point (a producer killed mid-write): never valid JSON, still valid UTF-8."""
    text = value.decode("utf-8")
    return text[: rng.randint(1, len(text) - 1)].encode("utf-8")


def cut_short_message(stream: StreamBuilder, rng: random.Random) -> tuple[Message, bytes] | None:
    """A random well-formed message of the stream and its value :func:`cut_short`; None when there is none."""
    candidates = [m for m in stream.messages if m.value is not None and not m.is_malformed]
    if not candidates:
        return None
    template = rng.choice(candidates)
    assert template.value is not None
    return template, cut_short(rng, template.value)


MalformedFactory = Callable[[int, random.Random], Message]
"""Builds the ``index``-th undecodable message (its description starts with ``malformed: ``)."""


def shape(stream: StreamBuilder, options: RenderOptions, rng: random.Random, malformed: MalformedFactory) -> None:
    """Adds the re-send windows and the undecodable messages that ``options`` asks for."""
    if options.resends < 0 or options.malformed < 0 or options.heartbeat_every < 0:
        raise ValueError("RenderOptions counts must be >= 0")
    for _ in range(options.resends):
        add_resend(stream, rng)
    for index in range(options.malformed):
        message = malformed(index, rng)
        if not message.is_malformed:
            raise ValueError(f"malformed message factory returned {message.description!r}")
        stream.insert(rng.choice(stream.boundaries), [message])


def row_messages(stream: StreamBuilder) -> list[Message]:
    """Messages that carry a row change (INSERT/UPDATE/DELETE), for malformed variants of real messages."""
    return [
        m
        for m in stream.messages
        if m.value is not None
        and not m.is_malformed
        and not m.is_resend
        and m.description.split(" ")[0] in ("INSERT", "UPDATE", "DELETE")
    ]
