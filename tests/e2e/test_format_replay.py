"""Each format end to end: its replay scenario goes through `replay` into Delta and is read back independently.

A scenario lives in ``tests/cases/<format>/replay/``:

* ``input.jsonl`` — messages in the golden-case convention (``value`` / ``value_raw`` / ``value_b64`` /
  ``value_avro_b64``); they are written to a capture file (JSON lines, or base64 lines if any message is binary);
  messages with a null value cannot be stored in a capture file and are left out.
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
from tests.formats.golden import CASES, message_bytes, read_jsonl

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
    lines = read_jsonl(folder / "input.jsonl")
    options = json.loads((folder / "options.json").read_text()) if (folder / "options.json").is_file() else {}
    format_options = options.get("format_options")
    if format_options and "schemas_dir" in format_options:  # relative to the scenario's folder
        format_options["schemas_dir"] = str(folder / format_options["schemas_dir"])
    values = [value for _, value in map(message_bytes, lines) if value is not None]
    binary = any("value_b64" in line or "value_avro_b64" in line for line in lines)
    capture = tmp_path / "capture.txt"
    if binary:
        capture.write_text("".join(base64.b64encode(v).decode() + "\n" for v in values))
    else:
        capture.write_text("".join(v.decode("utf-8") + "\n" for v in values), encoding="utf-8")
    lake = str(tmp_path / "lake")
    replay(
        spark,
        lake=lake,
        format_name=format_name,
        paths=[str(capture)],
        encoding="b64" if binary else "lines",
        keys=options.get("keys"),
        format_options=format_options,
    )
    expected = json.loads((folder / "expected.json").read_text(encoding="utf-8"))
    results = [
        compare_table(f"{lake}/{table}", table, [{k: typed(v) for k, v in row.items()} for row in rows])
        for table, rows in sorted(expected.items())
    ]
    assert all(r.ok for r in results), describe(results)
