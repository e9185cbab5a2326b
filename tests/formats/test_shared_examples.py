"""Every example message in shared/formats/examples decodes without error with the format that claims it."""

from __future__ import annotations

import pytest

from cdclake.formats import decode_batch, list_formats
from tests.conftest import SHARED
from tests.formats.golden import messages_frame, read_jsonl

EXAMPLES = SHARED / "formats" / "examples"
CLAIMED = [(fmt, name) for fmt in list_formats() for name in fmt.examples]


def test_shared_examples_are_present() -> None:
    assert EXAMPLES.is_dir(), f"{EXAMPLES} is missing: set CDCLAKE_SHARED to the shared/ folder"


def test_every_format_claims_its_examples() -> None:
    claimed = {name for _, name in CLAIMED}
    assert all((EXAMPLES / name).is_file() for name in claimed), claimed


@pytest.mark.spark
@pytest.mark.parametrize(("fmt", "file_name"), CLAIMED, ids=[f"{f.name}/{n}" for f, n in CLAIMED])
def test_every_shared_example_decodes(spark, fmt, file_name: str) -> None:
    lines = read_jsonl(EXAMPLES / file_name)
    decoded = decode_batch(fmt, messages_frame(spark, lines), {}).orderBy("offset", "sub_index").collect()
    assert {event["offset"] for event in decoded} == set(range(len(lines)))  # every message yields events
    for event in decoded:
        line = lines[event["offset"]]
        expected_error = line.get("expect_error")  # examples that document a malformed or skipped message
        if expected_error:
            assert expected_error in (event["error"] or ""), line["case"]
        else:
            assert event["error"] is None, (line["case"], event["error"])
            assert event["op"] is not None, line["case"]
