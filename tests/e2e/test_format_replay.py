"""Each format end to end: its replay scenario goes through `replay` into Delta and is read back independently.

A scenario lives in ``tests/cases/<format>/replay/``:

* ``input.jsonl`` — messages in the golden-case convention (``key`` / ``key_b64``, ``value`` / ``value_raw`` /
  ``value_b64`` / ``value_avro_b64``), which is a capture file of Kafka records as such: it is replayed as it is
  (``--input-encoding records``), keys and null values (tombstones) included. A string ``value`` is the message's
  text (the golden cases write such text as ``value_raw``).
* ``expected.json`` — ``{"<database>/<table>": [row, ...]}``, lake-relative table path -> final rows (user columns
  only). Values are JSON, with ``{"$b64": ..}`` for binary, ``{"$ts": "...Z"}`` for timestamps (UTC instants),
  ``{"$ntz": ".."}`` for timestamps without zone, ``{"$date": ".."}`` for dates and ``{"$dec": ".."}`` for
  decimals.
* ``options.json`` (optional) — ``{"keys": {"db.table": [..]}, "format_options": {..}}`` (a ``schemas_dir``
  relative to the scenario's folder).
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdclake.devtools.verify import compare_table, describe
from cdclake.formats import list_formats
from cdclake.runner import replay
from tests.formats.golden import CASES

pytestmark = pytest.mark.spark

SCENARIOS = [fmt.name for fmt in list_formats() if (CASES / fmt.name / "replay" / "input.jsonl").is_file()]


def typed(value: Any) -> Any:
    """Typed-JSON value -> the Python value an Arrow reader returns."""
    if isinstance(value, dict) and len(value) == 1:
        ((tag, text),) = value.items()
        if tag == "$b64":
            return base64.b64decode(text)
        if tag == "$ts":
            return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
        if tag == "$ntz":
            return datetime.fromisoformat(text)
        if tag == "$date":
            return date.fromisoformat(text)
        if tag == "$dec":
            return Decimal(text)
    return value


def test_every_format_has_a_replay_scenario() -> None:
    missing = [fmt.name for fmt in list_formats() if fmt.name not in SCENARIOS]
    assert not missing, f"formats without tests/cases/<format>/replay: {missing}"


@pytest.mark.parametrize("format_name", SCENARIOS)
def test_format_replays_into_delta(spark, tmp_path: Path, format_name: str) -> None:
    folder = CASES / format_name / "replay"
    options = json.loads((folder / "options.json").read_text()) if (folder / "options.json").is_file() else {}
    format_options = options.get("format_options")
    if format_options and "schemas_dir" in format_options:  # relative to the scenario's folder
        format_options["schemas_dir"] = str(folder / format_options["schemas_dir"])
    lake = str(tmp_path / "lake")
    replay(
        spark,
        lake=lake,
        format_name=format_name,
        paths=[str(folder / "input.jsonl")],
        encoding="records",
        keys=options.get("keys"),
        format_options=format_options,
    )
    expected = json.loads((folder / "expected.json").read_text(encoding="utf-8"))
    results = [
        compare_table(f"{lake}/{table}", table, [{k: typed(v) for k, v in row.items()} for row in rows])
        for table, rows in sorted(expected.items())
    ]
    assert all(r.ok for r in results), describe(results)


def _kcat_record(line: dict[str, Any], offset: int) -> dict[str, Any]:
    """A Debezium scenario line as ``kcat -J`` writes a record: the message and its key as strings, the key being
    the row's id (debezium.md 4: the key columns are the Kafka key's fields)."""
    value = line.get("value")
    body = value.get("payload", value) if isinstance(value, dict) else None
    row = (body.get("after") or body.get("before")) if isinstance(body, dict) else None
    key = json.dumps({"id": row["id"]}) if row else None
    payload = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return {
        "topic": "dbserver1",
        "partition": 0,
        "offset": offset,
        "tstype": "create",
        "ts": 1709288131000 + offset,
        "broker": 1,
        "key": key,
        "payload": payload,
    }


def test_a_kcat_capture_keys_its_tables_by_the_kafka_keys(spark, tmp_path: Path) -> None:
    """`--input-encoding records` keeps what plain lines lose: the Kafka key, which names a Debezium table's key
    columns (no `keys` setting), and the tombstone after a delete (an event, not a dead letter)."""
    folder = CASES / "debezium-json" / "replay"
    records = [
        _kcat_record(line, offset) for offset, line in enumerate(map(json.loads, (folder / "input.jsonl").open()))
    ]
    deleted = next(i for i, r in enumerate(records) if r["payload"] and '"op": "d"' in r["payload"])
    records.insert(deleted + 1, {**records[deleted], "payload": None})
    capture = tmp_path / "kcat.jsonl"
    capture.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    lake = str(tmp_path / "lake")
    results = replay(spark, lake=lake, format_name="debezium-json", paths=[str(capture)], encoding="records")
    assert sum(r.dead_letters for r in results) == 1  # the malformed line only
    expected = json.loads((folder / "expected.json").read_text(encoding="utf-8"))
    compared = [
        compare_table(f"{lake}/{table}", table, [{k: typed(v) for k, v in row.items()} for row in rows])
        for table, rows in sorted(expected.items())
    ]
    assert all(r.ok for r in compared), describe(compared)
