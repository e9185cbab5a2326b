"""Captured messages in files, for replay and backfill: one message per line, JSON text or base64 binary.

Messages keep file order: ``offset`` is ``file_index * 2**40 + line_index`` (so it sorts by file, then line) and
``topic`` is the file path. Each file is read as one Spark partition, which is what makes the line index follow the
file (Spark splits and re-orders large files otherwise); decoding is parallel again right after.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdclake.exceptions import InputError
from cdclake.spark import release, session_settings

InputEncoding = Literal["lines", "b64"]
LINES_PER_FILE_LIMIT = 2**40


def _whole_file_partitions(spark: SparkSession) -> AbstractContextManager[None]:
    # Spark's split size is min(maxPartitionBytes, max(openCostInBytes, bytes per core)): both must be huge for a
    # file to stay one partition.
    keys = ("spark.sql.files.maxPartitionBytes", "spark.sql.files.openCostInBytes")
    return session_settings(spark, dict.fromkeys(keys, str(2**40)))


def check_files(paths: Sequence[str]) -> list[Path]:
    """Resolves and checks capture files; raises :class:`InputError` naming the first unusable one."""
    resolved: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise InputError(f"input file not found: {raw}")
        if not path.is_file():
            raise InputError(f"input is not a regular file: {raw}")
        try:
            with path.open("rb") as handle:
                handle.read(1)
        except OSError as exc:
            raise InputError(f"cannot read input file {raw}: {exc.strerror}") from exc
        resolved.append(path.resolve())
    if not resolved:
        raise InputError("no input files given")
    return resolved


@dataclass(frozen=True)
class CaptureFile:
    """The messages of one capture file, materialised in file order."""

    path: Path
    messages: DataFrame
    count: int
    stored: DataFrame
    """The file's lines, stored once (a local checkpoint) and read by every batch of :meth:`lines`."""

    def lines(self, start: int, stop: int) -> DataFrame:
        """Messages with line index in ``[start, stop)`` (indices count non-empty lines from 0)."""
        base = self.messages.select("*", (F.col("offset") % F.lit(LINES_PER_FILE_LIMIT)).alias("_line"))
        return base.where((F.col("_line") >= start) & (F.col("_line") < stop)).drop("_line")

    def release(self) -> None:
        """Frees the stored lines once no batch reads the file again (else they stay in memory until the JVM
        collects them, with the next files' lines stored beside them)."""
        release(self.stored)


def read_file(spark: SparkSession, path: Path, index: int, encoding: InputEncoding) -> CaptureFile:
    """Reads one capture file as a raw message frame in line order (see the module doc)."""
    with _whole_file_partitions(spark):
        lines = spark.read.text(str(path)).where(F.length(F.trim("value")) > 0)
        # One partition per file: monotonically_increasing_id() is then exactly the 0-based line index.
        lines = lines.select(
            (F.lit(index).cast("bigint") * F.lit(LINES_PER_FILE_LIMIT) + F.monotonically_increasing_id()).alias(
                "offset"
            ),
            F.col("value").alias("line"),
        ).localCheckpoint(eager=True)
    line = F.col("line")
    if encoding == "b64":
        # A line that is not valid base64 is kept as its text, so that the dead letter shows it.
        value = F.coalesce(F.try_to_binary(F.trim(line), F.lit("base64")), F.encode(line, "UTF-8"))
    else:
        value = F.encode(line, "UTF-8")
    messages = lines.select(
        F.lit(None).cast("binary").alias("key"),
        value.alias("value"),
        F.lit(str(path)).alias("topic"),
        F.lit(0).alias("partition"),
        F.col("offset"),
        F.lit(None).cast("timestamp").alias("timestamp"),
    )
    return CaptureFile(path, messages, lines.count(), lines)
