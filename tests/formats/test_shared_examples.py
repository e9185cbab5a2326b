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


# Example files that mix two layouts of one format, which a topic never does: (word in the case of the lines of the
# other layout, the options that layout is read with). DTS Canal JSON's instances created before 2022-03-20 swap
# an UPDATE's images (dts.md 2); read without the option, their DELETE is a dead letter naming it.
OTHER_LAYOUTS = {"dts-canal-json.jsonl": ("legacy", {"legacy_old_data_swap": "true"})}


@pytest.mark.spark
@pytest.mark.parametrize(("fmt", "file_name"), CLAIMED, ids=[f"{f.name}/{n}" for f, n in CLAIMED])
def test_every_shared_example_decodes(spark, fmt, file_name: str) -> None:
    lines = read_jsonl(EXAMPLES / file_name)
    marker, layout_options = OTHER_LAYOUTS.get(file_name, (None, {}))
    decoded = decode_batch(fmt, messages_frame(spark, lines), {}).orderBy("offset", "sub_index").collect()
    if marker is not None:
        in_layout = {i for i, line in enumerate(lines) if marker in line["case"]}
        assert in_layout, f"no example of {file_name} names '{marker}'"
        read_with_options = decode_batch(fmt, messages_frame(spark, lines), layout_options)
        other = read_with_options.orderBy("offset", "sub_index").collect()
        decoded = [e for e in decoded if e["offset"] not in in_layout] + [e for e in other if e["offset"] in in_layout]
    assert {event["offset"] for event in decoded} == set(range(len(lines)))  # every message yields events
    for event in decoded:
        line = lines[event["offset"]]
        expected_error = line.get("expect_error")  # examples that document a malformed or skipped message
        if expected_error:
            assert expected_error in (event["error"] or ""), line["case"]
        else:
            assert event["error"] is None, (line["case"], event["error"])
            assert event["op"] is not None, line["case"]
