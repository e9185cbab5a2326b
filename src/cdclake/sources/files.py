"""Captured messages in files, for replay and backfill: one message per line, as JSON text (``lines``), base64 of its
bytes (``b64``), or a Kafka record with key, timestamp and headers (``records``, see :func:`record_columns`).

Messages keep file order: ``offset`` is ``file_index * 2**40 + line_index`` (so it sorts by file, then line) and
``topic`` is the file path. The line index counts every line of the file from 0, blank ones too (they hold no
message and are skipped), so a message's coordinates name its line (:func:`location`). Each file is read as one
Spark partition, which is what makes the line index follow the file (Spark splits and re-orders large files
otherwise); decoding is parallel again right after.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdclake import model
from cdclake.exceptions import InputError
from cdclake.formats.base import MESSAGE_HEADERS
from cdclake.spark import release, session_settings

InputEncoding = Literal["lines", "b64", "records"]
INPUT_ENCODINGS: tuple[InputEncoding, ...] = ("lines", "b64", "records")

VALUE_FIELDS = ("value_b64", "value_avro_b64", "value", "payload")
"""A record's value, first found first: base64 bytes (``value_avro_b64`` as the format specifications' example files
write Avro messages), else the text of ``value`` (``payload`` as ``kcat -J`` writes it)."""
KEY_FIELDS = ("key_b64", "key")
TIMESTAMP_FIELDS = ("timestamp", "ts")
"""Epoch milliseconds (``ts`` as ``kcat -J`` writes it) or ISO-8601 text."""
HEADERS_FIELD = "headers"
"""A record's headers: names and values in turn (``["name", "value", ...]``, as ``kcat -J`` writes them), or an
object of name -> value."""
_RECORD_SCHEMA = ", ".join(
    f"`{name}` STRING" for name in (*VALUE_FIELDS, *KEY_FIELDS, *TIMESTAMP_FIELDS, HEADERS_FIELD)
)
LINES_PER_FILE_LIMIT = 2**40
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")


def _whole_file_partitions(spark: SparkSession) -> AbstractContextManager[None]:
    # Spark's split size is min(maxPartitionBytes, max(openCostInBytes, bytes per core)): both must be huge for a
    # file to stay one partition.
    keys = ("spark.sql.files.maxPartitionBytes", "spark.sql.files.openCostInBytes")
    return session_settings(spark, dict.fromkeys(keys, str(2**40)))


def is_uri(path: str) -> bool:
    """Whether a capture path is a URI that Spark's file systems read (``hdfs://``, ``s3a://``, ``file://``...),
    rather than a path on this machine."""
    return _URI.match(path) is not None


def check_files(paths: Sequence[str], spark: SparkSession | None = None) -> list[str]:
    """Checks capture files and gives them as Spark reads them, in the order given; raises :class:`InputError`
    naming the first unusable one.

    A local path is made absolute; a local directory stands for its files, in name order. A URI is read through the
    session's Hadoop file system when ``spark`` is given (without a session, such as the CLI's first look, it passes
    as written): a directory stands for its files and a glob (``s3a://bucket/dump/2024-03-*.jsonl.gz``) for the
    files it matches, each in name order, since no shell expands them. Either way every file is checked before the
    first batch, so that a replay does not stop at a missing third file after applying two. Names starting with
    ``.`` or ``_`` in a directory (``_SUCCESS``, checksums) are not capture files and are left out.
    """
    resolved: list[str] = []
    for raw in paths:
        if is_uri(raw):
            resolved.extend(_uri_files(spark, raw) if spark is not None else [raw])
            continue
        path = Path(raw)
        if not path.exists():
            raise InputError(f"input file not found: {raw}")
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and not _is_hidden(p.name))
            if not found:
                raise InputError(f"no capture files in directory {raw}")
            resolved.extend(_checked_local(p, str(p)) for p in found)
            continue
        resolved.append(_checked_local(path, raw))
    if not resolved:
        raise InputError("no input files given")
    return resolved


def _is_hidden(name: str) -> bool:
    """A directory entry that is not a capture file (``_SUCCESS``, ``.crc`` checksums), as Spark's listing has it."""
    return name.startswith((".", "_"))


def _checked_local(path: Path, raw: str) -> str:
    if not path.is_file():
        raise InputError(f"input is not a regular file: {raw}")
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise InputError(f"cannot read input file {raw}: {exc.strerror}") from exc
    return str(path.resolve())


def _capture_files(statuses: Iterable[Any]) -> list[str]:
    """The files among Hadoop ``FileStatus``es, in name order, without hidden ones (:func:`_is_hidden`)."""
    paths = [status.getPath() for status in statuses if status.isFile()]
    return sorted(str(path.toString()) for path in paths if not _is_hidden(str(path.getName())))


def _uri_files(spark: SparkSession, uri: str) -> list[str]:
    """The files a URI names (itself, a directory's files or a glob's matches, in name order)."""
    from py4j.protocol import Py4JJavaError

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    try:
        path = jvm.org.apache.hadoop.fs.Path(uri)
        fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        if any(char in uri for char in "*?[{"):
            found = _capture_files(fs.globStatus(path) or [])
            if not found:
                raise InputError(f"no capture files match {uri}")
            return found
        status = fs.getFileStatus(path)
        if status.isFile():
            return [uri]
        found = _capture_files(fs.listStatus(path))
    except Py4JJavaError as exc:
        error = exc.java_exception
        if error.getClass().getName() == "java.io.FileNotFoundException":
            raise InputError(f"input file not found: {uri}") from None
        raise InputError(
            f"cannot read input file {uri}: {error.getClass().getSimpleName()}: {error.getMessage()}"
        ) from None
    if not found:
        raise InputError(f"no capture files in directory {uri}")
    return found


@dataclass(frozen=True)
class CaptureFile:
    """The messages of one capture file, materialised in file order."""

    path: str
    messages: DataFrame
    count: int
    """How many messages (non-blank lines) the file holds."""
    end: int
    """One past the line index of its last message (``count`` when no line is blank)."""
    stored: DataFrame
    """The file's lines, stored once (a local checkpoint) and read by every batch of :meth:`lines`."""

    def lines(self, start: int, stop: int) -> DataFrame:
        """Messages with line index in ``[start, stop)`` (indices count every line from 0, blank ones too)."""
        base = self.messages.select("*", (F.col("offset") % F.lit(LINES_PER_FILE_LIMIT)).alias("_line"))
        return base.where((F.col("_line") >= start) & (F.col("_line") < stop)).drop("_line")

    def batches(self, size: int) -> list[tuple[int, int]]:
        """Line ranges ``[start, stop)`` of ``size`` lines that hold at least one message, in file order: a run of
        blank lines as long as a batch makes no empty batch."""
        starts: Sequence[int] = range(0, self.end, size)
        if self.count < self.end:  # blank lines: find the ranges that hold messages (one small job)
            window = F.floor((F.col("offset") % F.lit(LINES_PER_FILE_LIMIT)) / F.lit(size)).cast("bigint")
            held = {row[0] for row in self.stored.select(window).distinct().collect()}
            starts = [start for start in starts if start // size in held]
        return [(start, min(start + size, self.end)) for start in starts]

    def release(self) -> None:
        """Frees the stored lines once no batch reads the file again (else they stay in memory until the JVM
        collects them, with the next files' lines stored beside them)."""
        release(self.stored)


def read_file(spark: SparkSession, path: str | Path, index: int, encoding: InputEncoding) -> CaptureFile:
    """Reads one capture file as a raw message frame in line order (see the module doc)."""
    with _whole_file_partitions(spark):
        # One partition per file: monotonically_increasing_id() is then exactly the 0-based line index. It is taken
        # before blank lines are left out, so that it stays the line's place in the file (see location()).
        lines = (
            spark.read.text(str(path))
            .select(
                (F.lit(index).cast("bigint") * F.lit(LINES_PER_FILE_LIMIT) + F.monotonically_increasing_id()).alias(
                    "offset"
                ),
                F.col("value").alias("line"),
            )
            .where(F.length(F.trim("line")) > 0)
            .localCheckpoint(eager=True)
        )
    line = F.col("line")
    key, timestamp = F.lit(None).cast("binary"), F.lit(None).cast("timestamp")
    # Only records have headers: other capture files get no such column rather than a null one, so their batches
    # decode as they did before headers were read.
    headers: list[Column] = []
    if encoding == "b64":
        # A line that is not valid base64 is kept as its text, so that the dead letter shows it.
        value = F.coalesce(F.try_to_binary(F.trim(line), F.lit("base64")), F.encode(line, "UTF-8"))
    elif encoding == "records":
        key, value, timestamp, record_headers = record_columns(line)
        headers = [record_headers.alias(MESSAGE_HEADERS)]
    else:
        value = F.encode(line, "UTF-8")
    messages = lines.select(
        key.alias("key"),
        value.alias("value"),
        F.lit(str(path)).alias("topic"),
        F.lit(0).alias("partition"),
        F.col("offset"),
        timestamp.alias("timestamp"),
        *headers,
    )
    extent = lines.agg(F.count(F.lit(1)), F.max(F.col("offset") % F.lit(LINES_PER_FILE_LIMIT))).first()
    assert extent is not None
    count, last = extent
    return CaptureFile(str(path), messages, count, 0 if last is None else last + 1, lines)


def location(topic: str, offset: int) -> tuple[str, int] | None:
    """The file and line (counted from 1, as editors and ``sed -n 17p`` count) of a message that a file replay
    read, from its coordinates; None for a Kafka message. Kafka topic names cannot hold a ``/`` (letters, digits,
    ``.``, ``_`` and ``-`` only), and a capture file's topic is its absolute path or URI."""
    if "/" not in topic:
        return None
    return topic, offset % LINES_PER_FILE_LIMIT + 1


def record_columns(line: Column) -> tuple[Column, Column, Column, Column]:
    """Key, value, timestamp and headers of a capture line that holds a Kafka record as a JSON object: ``kcat -J``
    output (``key``, ``payload``, ``ts``, ``headers``), a dump with ``key``/``value``/``timestamp``, the format
    specifications' example files (``key``, ``value``, ``value_avro_b64``). Header values are the text given (an
    object or array as its JSON text).

    A JSON string is the message's text exactly. An object or array is the message as Spark's JSON writer renders it:
    numbers with a fraction pass through a double (``7.50`` becomes ``7.5``), so a capture that needs exact numbers
    writes its messages as strings (as ``kcat -J`` does unless told to decode them). Base64 fields hold binary
    messages (Avro). A null or absent value is a Kafka tombstone. The record's topic, partition and offset are not
    read: the file order is the order. A line that is not a record (not a JSON object, or one with no value or key
    field) is taken whole as the message, as ``lines`` takes it, so that it decodes or becomes a dead letter that
    shows it."""
    record = F.from_json(line, _RECORD_SCHEMA, {"mode": "PERMISSIVE"})
    message_fields = (*VALUE_FIELDS, *KEY_FIELDS)
    # A field present with null (a tombstone's value) is told by the object's keys; json_object_keys reads strict
    # JSON only, so a line that from_json reads more leniently (NaN in a readable rendering) counts by its values.
    # (One MAP parse would give keys and values together, but fails the whole batch on a duplicate key.)
    named = F.arrays_overlap(F.json_object_keys(line), F.array(*map(F.lit, message_fields)))
    valued = F.coalesce(*(record[name] for name in message_fields)).isNotNull()
    is_record = F.coalesce(named, F.lit(False)) | valued

    def bytes_of(name: str) -> Column:
        text = F.encode(record[name], "UTF-8")
        if not name.endswith("_b64"):
            return text
        # Text that is not valid base64 is kept as it is, so that the dead letter shows it.
        return F.coalesce(F.try_to_binary(F.trim(record[name]), F.lit("base64")), text)

    def message(names: tuple[str, ...]) -> Column:
        return F.coalesce(*map(bytes_of, names))

    text_time = F.coalesce(*(record[name] for name in TIMESTAMP_FIELDS))
    # Milliseconds to microseconds with try_multiply: timestamp_millis of a number past the microsecond range fails
    # the batch (ANSI overflow), where such a line should read as one without a timestamp.
    micros = F.try_multiply(text_time.try_cast("bigint"), F.lit(1000))
    timestamp = F.when(text_time.rlike(r"^-?[0-9]+$"), F.timestamp_micros(micros)).otherwise(
        F.try_to_timestamp(text_time)
    )
    null_binary, null_time = F.lit(None).cast("binary"), F.lit(None).cast("timestamp")
    return (
        F.when(is_record, message(KEY_FIELDS)).otherwise(null_binary),
        F.when(is_record, message(VALUE_FIELDS)).otherwise(F.encode(line, "UTF-8")),
        F.when(is_record, timestamp).otherwise(null_time),
        F.when(is_record, _headers(record[HEADERS_FIELD])),
    )


def _headers(text: Column) -> Column:
    """A record's ``headers`` field (:data:`HEADERS_FIELD`) as Kafka headers; null when absent or neither form."""

    def header(name: Column, value: Column) -> Column:
        return F.struct(name.alias("key"), F.encode(value, "UTF-8").alias("value"))

    in_turns = F.from_json(text, "ARRAY<STRING>")
    names = F.filter(in_turns, lambda _item, index: index % 2 == 0)
    values = F.filter(in_turns, lambda _item, index: index % 2 == 1)
    by_name = F.map_entries(F.from_json(text, "MAP<STRING, STRING>"))
    trimmed = F.ltrim(text)
    return (
        F.when(trimmed.startswith("["), F.zip_with(names, values, header))
        .when(trimmed.startswith("{"), F.transform(by_name, lambda entry: header(entry["key"], entry["value"])))
        .cast(model.HEADERS_TYPE)
    )
