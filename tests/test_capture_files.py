"""Capture files: messages in file order with their line of the file, and read as Kafka records (``--input-encoding
records``): key, value, timestamp and headers per line."""

from __future__ import annotations

import base64
import bz2
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from cdclake.detect import detect_format, sample_lines
from cdclake.exceptions import InputError
from cdclake.runner import replay
from cdclake.sources.files import LINES_PER_FILE_LIMIT, check_files, location, read_file
from tests.formats.golden import CASES, message_bytes, read_jsonl

MARCH_1_10_15_31 = 1_709_288_131_000_000
"""2024-03-01T10:15:31Z in microseconds since the epoch."""

RECORD_LINES = [
    # kcat -J: the message and its key as strings (the exact text), ts in epoch milliseconds.
    (
        '{"topic":"t","partition":3,"offset":5,"tstype":"create","ts":1709288131000,"broker":1,'
        '"key":"{\\"id\\":1}","payload":"{\\"a\\": 7.50, \\"b\\": 12345678901234567890.1234}"}',
        (b'{"id":1}', b'{"a": 7.50, "b": 12345678901234567890.1234}', MARCH_1_10_15_31),
    ),
    # The format specifications' examples: the message as a JSON object, a `case` that is not read.
    ('{"case":"x","key":{"id":2},"value":{"a":1,"s":"Zoë"}}', (b'{"id":2}', '{"a":1,"s":"Zoë"}'.encode(), None)),
    # A tombstone: a key and a null value.
    ('{"key":{"id":3},"payload":null,"ts":1709288131001}', (b'{"id":3}', None, MARCH_1_10_15_31 + 1_000)),
    # A binary message in base64 wins over the readable `value` beside it; an ISO-8601 timestamp.
    (
        '{"value_avro_b64":"AAEC","value":{"x":1},"timestamp":"2024-03-01T10:15:31.250Z"}',
        (None, b"\x00\x01\x02", MARCH_1_10_15_31 + 250_000),
    ),
    ('{"value_b64":"%%%","key_b64":"AQ=="}', (b"\x01", b"%%%", None)),  # not base64: kept, for the dead letter
    # A ts past what a timestamp holds (microseconds in a long): read as none, not an overflow that fails the batch.
    ('{"ts":9223372036854775807,"payload":"x"}', (None, b"x", None)),
    # Lines that are not records are the message whole, as --input-encoding lines takes them.
    ("not json", (None, b"not json", None)),
    ('{"database":"shop","table":"t"}', (None, b'{"database":"shop","table":"t"}', None)),
    ("[1,2]", (None, b"[1,2]", None)),
]


def _records(spark, path: Path | str) -> list[tuple[Any, Any, Any]]:
    """(key, value, timestamp in epoch microseconds) of each message of the capture file, in file order."""
    capture = read_file(spark, path, 0, "records")
    try:
        rows = capture.messages.select("offset", "key", "value", F.unix_micros("timestamp").alias("micros")).collect()
        return [
            (
                None if row["key"] is None else bytes(row["key"]),
                None if row["value"] is None else bytes(row["value"]),
                row["micros"],
            )
            for row in sorted(rows, key=lambda row: row["offset"])
        ]
    finally:
        capture.release()


@pytest.mark.spark
def test_a_message_keeps_its_line_of_the_file_and_blank_lines_make_no_batch(spark, tmp_path: Path) -> None:
    """Blank lines hold no message but count, so that a message's coordinates name its line (a dead letter's says
    where to look); batches are ranges of lines, and a range of blank lines only is not a batch."""
    path = tmp_path / "capture.jsonl"
    path.write_text("m1\n\n   \nm4\n\n\n\n\n\nm10\n", encoding="utf-8")
    capture = read_file(spark, path, 1, "lines")
    try:
        assert (capture.count, capture.end) == (3, 10)
        rows = sorted((row["offset"], bytes(row["value"]).decode()) for row in capture.messages.collect())
        assert [(location(str(path), offset), value) for offset, value in rows] == [
            ((str(path), 1), "m1"),
            ((str(path), 4), "m4"),
            ((str(path), 10), "m10"),
        ]
        assert [offset // LINES_PER_FILE_LIMIT for offset, _ in rows] == [1, 1, 1]  # the file's index in the replay
        assert capture.batches(2) == [(0, 2), (2, 4), (8, 10)]
        assert capture.batches(100) == [(0, 10)]
        batched = [
            bytes(r["value"]).decode()
            for start, stop in capture.batches(2)
            for r in capture.lines(start, stop).collect()
        ]
        assert sorted(batched) == ["m1", "m10", "m4"]
    finally:
        capture.release()
    dense = tmp_path / "dense.jsonl"
    dense.write_text("a\nb\nc\n", encoding="utf-8")
    capture = read_file(spark, dense, 0, "lines")
    try:
        assert (capture.count, capture.end, capture.batches(2)) == (3, 3, [(0, 2), (2, 3)])
    finally:
        capture.release()
    assert location("orders", 17) is None  # a Kafka topic: no file, no line


@pytest.mark.spark
def test_a_record_line_gives_the_message_its_key_and_its_timestamp(spark, tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text("".join(line + "\n" for line, _ in RECORD_LINES), encoding="utf-8")
    assert _records(spark, path) == [expected for _, expected in RECORD_LINES]


@pytest.mark.spark
def test_a_record_line_gives_the_message_its_headers(spark, tmp_path: Path) -> None:
    """Headers as ``kcat -J`` writes them (names and values in turn, values as text) or as an object of name ->
    value (an object value is its JSON text); anything else is no headers."""
    lines = [
        ('{"key":"k","payload":"v","headers":["a","1","b","{\\"id\\":1}"]}', [("a", b"1"), ("b", b'{"id":1}')]),
        (
            '{"value":"v","headers":{"__debezium.oldkey":{"id":1},"n":null}}',
            [("__debezium.oldkey", b'{"id":1}'), ("n", None)],
        ),
        ('{"value":"v","headers":["odd"]}', [("odd", None)]),
        ('{"value":"v","headers":[]}', []),
        ('{"value":"v"}', None),
        ('{"value":"v","headers":null}', None),
        ('{"value":"v","headers":"a=1"}', None),
        ("not json", None),
    ]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(line + "\n" for line, _ in lines), encoding="utf-8")
    capture = read_file(spark, path, 0, "records")
    try:
        rows = sorted(capture.messages.select("offset", "headers").collect(), key=lambda row: row["offset"])
    finally:
        capture.release()
    got = [
        None
        if row["headers"] is None
        else [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in row["headers"]]
        for row in rows
    ]
    assert got == [expected for _, expected in lines]


def _as_record(line: dict[str, Any]) -> dict[str, Any]:
    """A golden case line as a capture record: ``value_raw`` (verbatim text) is a string ``value``."""
    record = {name: value for name, value in line.items() if name != "value_raw"}
    if "value_raw" in line:
        record["value"] = line["value_raw"]
    return record


def _same_message(want: bytes | None, have: bytes | None, exact: bool) -> bool:
    if want is None or have is None or exact:
        return want == have
    return bool(json.loads(want) == json.loads(have))


@pytest.mark.spark
def test_every_golden_case_file_reads_as_the_messages_its_cases_decode(spark, tmp_path: Path) -> None:
    """The golden cases' inputs are records as the format specifications' examples write them; read as a capture
    file they give the messages the golden tests decode (JSON objects equal as JSON, text and binary byte for
    byte), keys and null values included."""
    cases = [line for path in sorted(CASES.glob("*/**/*input.jsonl")) for line in read_jsonl(path)]
    path = tmp_path / "golden.jsonl"
    path.write_text("".join(json.dumps(_as_record(c), ensure_ascii=False) + "\n" for c in cases), encoding="utf-8")
    got = _records(spark, path)
    assert len(got) == len(cases) > 300
    for case, (key, value, timestamp) in zip(cases, got, strict=True):
        want_key, want_value = message_bytes(case)
        if isinstance(case.get("value"), str):  # the replay scenarios' malformed lines: the text itself
            want_value = case["value"].encode("utf-8")
        exact_value = any(name in case for name in ("value_raw", "value_b64", "value_avro_b64"))
        exact_value |= isinstance(case.get("value"), str)
        assert _same_message(want_value, value, exact=exact_value), case["case"]
        assert _same_message(want_key, key, exact="key_b64" in case or isinstance(case.get("key"), str)), case
        assert timestamp is None
    assert sum(value is None for _, value, _ in got) == sum(message_bytes(case)[1] is None for case in cases) > 0


def test_format_auto_samples_the_messages_of_records(tmp_path: Path) -> None:
    capture = tmp_path / "debezium.jsonl"
    lines = read_jsonl(CASES / "debezium-json" / "replay" / "input.jsonl")
    capture.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    samples = sample_lines([str(capture)], "records", limit=4)
    assert samples
    assert not any(sample.startswith(b'{"case"') for sample in samples)
    assert detect_format(samples) == "debezium-json"
    binary = tmp_path / "qlik.jsonl"
    values = [message_bytes(line)[1] for line in read_jsonl(CASES / "qlik-avro" / "replay" / "input.jsonl")]
    binary.write_text("".join(json.dumps({"value_b64": base64.b64encode(v).decode()}) + "\n" for v in values if v))
    assert detect_format(sample_lines([str(binary)], "records", limit=3)) == "qlik-avro"


@pytest.mark.spark
def test_a_capture_named_by_uri_is_read_through_the_session_file_system(spark, tmp_path: Path) -> None:
    """Capture files on HDFS or S3 are named by URI (a file, a directory or a glob): Spark reads them, and they are
    checked before the first batch (here through the `file` scheme, the same calls as any other). A gzipped file
    reads as its text."""
    path = tmp_path / "records.jsonl"
    path.write_text("".join(line + "\n" for line, _ in RECORD_LINES), encoding="utf-8")
    uri = path.as_uri()
    assert check_files([uri], spark) == [uri]
    assert _records(spark, uri) == _records(spark, path)
    compressed = tmp_path / "records.jsonl.gz"
    compressed.write_bytes(gzip.compress(path.read_bytes()))
    assert _records(spark, compressed) == _records(spark, path)

    missing = (tmp_path / "missing.jsonl").as_uri()
    with pytest.raises(InputError, match="input file not found: file:"):
        check_files([uri, missing], spark)
    folder = tmp_path / "dump"
    folder.mkdir()
    for name in ("b.jsonl", "a.jsonl.gz", "_SUCCESS", ".a.jsonl.gz.crc"):
        (folder / name).write_bytes(compressed.read_bytes())
    in_order = [(folder / name).as_uri().replace("file:///", "file:/") for name in ("a.jsonl.gz", "b.jsonl")]
    assert check_files([folder.as_uri()], spark) == in_order  # a directory: its files, in name order
    assert check_files([f"{folder.as_uri()}/*.jsonl*"], spark) == in_order  # a glob, which no shell expands
    assert check_files([str(folder)]) == [str(folder / "a.jsonl.gz"), str(folder / "b.jsonl")]
    with pytest.raises(InputError, match=r"no capture files match file:.*/dump/\*\.txt"):
        check_files([f"{folder.as_uri()}/*.txt"], spark)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no capture files in directory file:"):
        check_files([(tmp_path / "empty").as_uri()], spark)
    with pytest.raises(InputError, match=r"cannot read input file nosuch://bucket/x.jsonl: .*FileSystem"):
        check_files(["nosuch://bucket/x.jsonl"], spark)
    assert check_files([missing]) == [missing]  # without a session (the CLI's first look), as written

    lake = tmp_path / "lake"
    with pytest.raises(InputError, match="input file not found"):
        replay(spark, lake=str(lake), format_name="debezium-json", paths=[uri, missing], encoding="records")
    assert not lake.exists()  # stopped before the first batch


@pytest.mark.parametrize("suffix", [".gz", ".bz2"])
def test_format_auto_reads_compressed_captures_as_spark_does(tmp_path: Path, suffix: str) -> None:
    lines = [json.dumps(line) for line in read_jsonl(CASES / "debezium-json" / "replay" / "input.jsonl")]
    capture = tmp_path / f"debezium.jsonl{suffix}"
    compress = gzip.compress if suffix == ".gz" else bz2.compress
    capture.write_bytes(compress("".join(line + "\n" for line in lines).encode("utf-8")))
    assert detect_format(sample_lines([str(capture)], "records", limit=4)) == "debezium-json"


def test_format_auto_names_a_uri_it_cannot_sample() -> None:
    with pytest.raises(InputError, match=r"name the format for s3a://bucket/dump\.jsonl"):
        sample_lines(["s3a://bucket/dump.jsonl"], "lines")
