"""Golden decode cases: ``tests/cases/<format>/<scenario>.input.jsonl`` -> ``<scenario>.expected.jsonl``.

Input lines follow ``shared/formats/examples``: ``{"case", "key", "value"}`` where ``value`` is the message as JSON
(serialised compactly), or ``value_raw`` (text sent verbatim, for malformed input) or ``value_b64`` /
``value_avro_b64`` (binary; for Avro examples ``value`` is only a readable rendering and the binary wins), and
``key_b64`` for a binary key. A format whose cases need options has them in ``tests/cases/<format>/options.json``.
Expected lines are canonical events, one per decoded event in message order, with the fields of EXPECTED_FIELDS.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from cdclake import model
from cdclake.spark import local_frame

CASES = Path(__file__).resolve().parents[1] / "cases"

EXPECTED_FIELDS = (
    "op",
    "vendor_op",
    "db_type",
    "database",
    "schema",
    "table",
    "key_columns",
    "before",
    "after",
    "after_is_partial",
    "columns",
    "position",
    "event_time",
    "txn_id",
    "ddl",
    "sub_index",
    "error",
)


def scenarios(format_name: str) -> list[str]:
    return sorted(p.name.removesuffix(".input.jsonl") for p in (CASES / format_name).glob("*.input.jsonl"))


def golden_options(format_name: str) -> dict[str, str]:
    """The format options its golden cases are decoded with: ``tests/cases/<format>/options.json`` if there is one
    (``schemas_dir`` relative to that folder), else none."""
    path = CASES / format_name / "options.json"
    if not path.is_file():
        return {}
    options: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
    if "schemas_dir" in options:
        options["schemas_dir"] = str(path.parent / options["schemas_dir"])
    return options


def message_bytes(line: dict[str, Any]) -> tuple[bytes | None, bytes | None]:
    key = line.get("key")
    key_bytes = None if key is None else (key.encode() if isinstance(key, str) else json.dumps(key).encode())
    if "key_b64" in line:  # a binary key (for Avro examples ``key`` is only a readable rendering)
        key_bytes = base64.b64decode(line["key_b64"])
    if "value_raw" in line:
        return key_bytes, line["value_raw"].encode("utf-8")
    for binary in ("value_b64", "value_avro_b64"):
        if binary in line:
            return key_bytes, base64.b64decode(line[binary])
    value = line.get("value")
    return key_bytes, None if value is None else json.dumps(value, ensure_ascii=False).encode("utf-8")


def messages_frame(spark: SparkSession, lines: list[dict[str, Any]], topic: str = "golden") -> DataFrame:
    return topics_frame(spark, {topic: lines})


def topics_frame(spark: SparkSession, topics: dict[str, list[dict[str, Any]]], *, numbered: bool = False) -> DataFrame:
    """Messages of several topics in one frame, each topic's at offsets 0, 1, ... of partition 0. A line's
    ``headers`` (name -> text) become Kafka headers, and with ``numbered`` every message has the header
    :data:`LINE_HEADER` (its offset); the frame has a ``headers`` column only when a message has some."""

    def headers(line: dict[str, Any], offset: int) -> list[tuple[str, bytes]] | None:
        given = dict(line.get("headers") or {}) | ({LINE_HEADER: str(offset)} if numbered else {})
        return [(name, text.encode()) for name, text in given.items()] or None

    rows = [
        (*message_bytes(line), topic, 0, offset, None, headers(line, offset))
        for topic, lines in topics.items()
        for offset, line in enumerate(lines)
    ]
    schema = "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
    if not any(row[-1] is not None for row in rows):
        return local_frame(spark, [row[:-1] for row in rows], schema)
    return local_frame(spark, rows, f"{schema}, headers array<struct<key: string, value: binary>>")


LINE_HEADER = "golden-line"
"""The header :func:`topics_frame` numbers messages with; :func:`canonical_rows` gives it as ``line_header``."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def canonical_rows(decoded: DataFrame) -> list[dict[str, Any]]:
    """Decoded events as JSON-ready dicts, in message order."""
    return _canonical(decoded.collect())


def canonical_rows_by_topic(decoded: DataFrame) -> dict[str, list[dict[str, Any]]]:
    """Decoded events of several topics (:func:`topics_frame`) as JSON-ready dicts, in message order per topic."""
    by_topic: dict[str, list[Any]] = {}
    for row in decoded.collect():
        by_topic.setdefault(row["topic"], []).append(row)
    return {topic: _canonical(rows) for topic, rows in by_topic.items()}


def _canonical(rows: list[Any]) -> list[dict[str, Any]]:
    out = []
    # Sorted here rather than by Spark: one job instead of a sampling and a sorting one (nulls first, as orderBy).
    for row in sorted(rows, key=lambda r: (r["offset"], -1 if r["sub_index"] is None else r["sub_index"])):
        item = row.asDict(recursive=True)
        record: dict[str, Any] = {}
        for name in EXPECTED_FIELDS:
            value = item[name]
            if name == "columns" and value is not None:
                value = [[c["name"], c["vendor_type"], c["spark_type"]] for c in value]
            elif name == "event_time" and value is not None:
                value = value.isoformat()
            record[name] = value
        numbered = [bytes(h["value"]).decode() for h in item.get(model.RAW_HEADERS) or [] if h["key"] == LINE_HEADER]
        if numbered:
            record["line_header"] = numbered[0]
        out.append(record)
    return out
