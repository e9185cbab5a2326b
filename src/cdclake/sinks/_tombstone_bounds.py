"""How far up each table's tombstones reach, so that the tombstone gate (``DeltaSink.gate``) can leave out the tables
that no tombstone can touch, and skip reading the tombstones table at all when that is every table of the batch.

A tombstone can reject a change of its table only if it is ordered at or above the table's lowest order in the
batch. In a stream read in source order that is never the case after the first batch: the batch's changes are newer
than every delete before them. Reading the tombstones table to find that out cost about 1.1 s per batch on 2 cores
(a new snapshot of the table, which the previous batch appended to, then an aggregate and two joins in the fold);
this keeps a bound per table instead, from one full read and then from the table's new commit files.

The bounds come from the Delta transaction log's commit files (``_delta_log/<version>.json``, PROTOCOL.md "Delta Log
Entries"): each ``add`` action carries the file's statistics, whose ``maxValues.position`` is at least every
position in the file and whose ``minValues``/``maxValues`` of ``table_id`` bracket its tables (Delta truncates long
strings so that the bounds still hold: a prefix for the minimum, and for the maximum a prefix followed by a character
above the one it cut, in UTF-8 byte order, which is Python's code point order). Every writer's commits are read, so
a tombstone written by another writer (``cdclake dlq replay`` beside ``run``) is seen by the next batch, as before.
``add`` actions without data change (compaction) hold rows that are already counted; ``remove`` actions only take
tombstones away, so the bounds stay upper bounds. Whatever cannot be bounded (a file without statistics, a table
whose commits are not all in ``_delta_log``) makes the bounds read in full again, or gives up bounding: the gate then
reads the tombstones as it did before.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

log = logging.getLogger(__name__)

TABLE_COLUMN: Final = "table_id"
POSITION_COLUMN: Final = "position"

_UNBOUNDABLE_FEATURES: Final = frozenset({"catalogManaged", "catalogOwned-preview", "coordinatedCommits-preview"})
"""Table features under which a commit may exist before its file in ``_delta_log`` (a commit coordinator or catalog
holds it first): the next commit file's absence would not prove that there is no newer commit."""


@dataclass(frozen=True)
class _FileBound:
    """The tables and the highest position of the tombstones of one data file added after the full read."""

    first_table: str
    last_table: str
    highest: str


class TombstoneBounds:
    """Per-table upper bounds of the positions in the tombstones table at ``path``, kept up to its newest version.

    Not thread-safe: one caller at a time (the batch's thread, in ``DeltaSink.gate``).
    """

    MAX_FILE_BOUNDS: Final = 256
    """File bounds kept after a full read before the next one. A file's bound covers every table between its first
    and last table id, so they are folded into exact per-table bounds from time to time: one aggregate over the
    tombstones table, rather than a list that grows with every batch."""

    def __init__(self, spark: SparkSession, path: str, hadoop_path: Callable[[str], tuple[Any, Any]]) -> None:
        """``hadoop_path``: a location -> its Hadoop ``Path`` and the ``FileSystem`` that holds it (the sink's)."""
        self.spark = spark
        self.path = path
        self._hadoop_path = hadoop_path
        self._version: int | None = None
        """The newest table version the bounds cover; -1 when there was no table; None before the first read."""
        self._exact: dict[str, str] = {}
        """Table id -> its highest tombstone position, as of the last full read."""
        self._files: list[_FileBound] = []
        self._unbounded = False
        """True when the table's commits cannot be followed from its commit files (see _UNBOUNDABLE_FEATURES)."""
        self.full_reads = 0
        """Full reads of the tombstones table so far (for tests and tuning)."""

    def tables_to_gate(self, lowest_orders: Mapping[str, str | None]) -> list[str]:
        """The tables of ``lowest_orders`` (table id -> the lowest order of its changes in the batch, None when not
        known) that a tombstone may reject a change of: those with a tombstone ordered at or above that order."""
        if not self._refresh():
            return sorted(lowest_orders)
        return sorted(table for table, lowest in lowest_orders.items() if self._reaches(table, lowest))

    def _reaches(self, table: str, lowest: str | None) -> bool:
        highest = [self._exact.get(table), *(f.highest for f in self._files if f.first_table <= table <= f.last_table)]
        known = [position for position in highest if position is not None]
        return bool(known) and (lowest is None or max(known) >= lowest)

    # ---------------------------------------------------------------------------------------------------------

    def _refresh(self) -> bool:
        """Brings the bounds up to the table's newest version; False when they cannot be known."""
        if self._unbounded:
            return False
        if self._version is None or (self._version >= 0 and not self._fs.exists(self._commit_file(self._version))):
            # First use, or the commit file the bounds stopped at is gone: the table was replaced.
            self._read_in_full()
        while not self._unbounded:
            assert self._version is not None
            commit = self._commit_file(self._version + 1)
            if not self._fs.exists(commit):
                break
            if self._take(self._read_text(commit).splitlines()):
                self._version += 1
            else:
                self._read_in_full()
        if len(self._files) > self.MAX_FILE_BOUNDS and not self._unbounded:
            self._read_in_full()
        return not self._unbounded

    def _take(self, lines: Iterable[str]) -> bool:
        """Adds the bounds of one commit's actions; False when a file added with new rows cannot be bounded."""
        bounds: list[_FileBound] = []
        for line in lines:
            if not line.strip():
                continue
            action: dict[str, Any] = json.loads(line)
            if "protocol" in action and set(action["protocol"].get("writerFeatures") or ()) & _UNBOUNDABLE_FEATURES:
                self._give_up()
                return True
            added = action.get("add")
            if added is None or not added.get("dataChange", True):
                continue
            try:
                bound = _file_bound(added.get("stats"))
            except _UnboundedFileError:
                return False
            if bound is not None:
                bounds.append(bound)
        for bound in bounds:
            if bound.first_table == bound.last_table:
                # Every table id of the file lies between the two, so it is that one table's.
                known = self._exact.get(bound.first_table)
                self._exact[bound.first_table] = bound.highest if known is None else max(known, bound.highest)
            else:
                self._files.append(bound)
        return True

    def _read_in_full(self) -> None:
        """Exact bounds from every tombstone, as of the table's newest version (one aggregate)."""
        self.full_reads += 1
        self._files = []
        if not DeltaTable.isDeltaTable(self.spark, self.path):
            self._version, self._exact = -1, {}
            return
        delta_table = DeltaTable.forPath(self.spark, self.path)
        features = delta_table.detail().select("tableFeatures").first()
        if features is not None and set(features[0] or ()) & _UNBOUNDABLE_FEATURES:
            self._give_up()
            return
        version = delta_table.history(1).select("version").first()
        assert version is not None
        table = self.spark.read.format("delta").option("versionAsOf", version[0]).load(self.path)
        highest = table.groupBy(TABLE_COLUMN).agg(F.max(POSITION_COLUMN)).collect()
        self._version = int(version[0])
        self._exact = {row[0]: row[1] for row in highest if row[0] is not None and row[1] is not None}

    def _give_up(self) -> None:
        log.info("%s: its commits may be held outside _delta_log; every batch reads its tombstones", self.path)
        self._unbounded = True

    # ---------------------------------------------------------------------------------------------------------
    # The log's files, through Hadoop's file system (any URI the lake may use)

    @functools.cached_property
    def _fs(self) -> Any:
        return self._hadoop_path(self.path)[1]

    def _commit_file(self, version: int) -> Any:
        return self._hadoop_path(commit_file(self.path, version))[0]

    def _read_text(self, path: Any) -> str:
        jvm = self.spark._jvm
        assert jvm is not None
        stream = self._fs.open(path)
        try:
            return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()


def commit_file(table_path: str, version: int) -> str:
    """The commit file of ``version`` of the Delta table at ``table_path`` (PROTOCOL.md "Delta Log Entries")."""
    return f"{table_path}/_delta_log/{version:020d}.json"


class _UnboundedFileError(Exception):
    """A data file added with new rows whose statistics do not bound its tombstones."""


def _file_bound(stats_text: str | None) -> _FileBound | None:
    """The bound of a data file from its ``add`` action's statistics; None when it holds no tombstone with both a
    table and a position (every value null there). Raises :class:`_UnboundedFileError` when they do not say."""
    if not stats_text:
        raise _UnboundedFileError
    stats = json.loads(stats_text)
    records = stats.get("numRecords")
    nulls = stats.get("nullCount") or {}
    if records is not None and (nulls.get(TABLE_COLUMN) == records or nulls.get(POSITION_COLUMN) == records):
        return None
    lowest, highest = stats.get("minValues") or {}, stats.get("maxValues") or {}
    first, last, position = lowest.get(TABLE_COLUMN), highest.get(TABLE_COLUMN), highest.get(POSITION_COLUMN)
    if not (isinstance(first, str) and isinstance(last, str) and isinstance(position, str)):
        raise _UnboundedFileError
    return _FileBound(first, last, position)
