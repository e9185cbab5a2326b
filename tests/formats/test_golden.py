"""Every format's golden cases decode to exactly their expected canonical events."""

from __future__ import annotations

import pytest

from cdclake.formats import decode_batch, get_format, list_formats
from tests.formats.golden import CASES, canonical_rows, messages_frame, read_jsonl, scenarios

CASE_IDS = [(fmt.name, scenario) for fmt in list_formats() for scenario in scenarios(fmt.name)]


@pytest.mark.spark
@pytest.mark.parametrize(("format_name", "scenario"), CASE_IDS, ids=[f"{f}/{s}" for f, s in CASE_IDS])
def test_golden(spark, format_name: str, scenario: str) -> None:
    lines = read_jsonl(CASES / format_name / f"{scenario}.input.jsonl")
    expected = read_jsonl(CASES / format_name / f"{scenario}.expected.jsonl")
    actual = canonical_rows(decode_batch(get_format(format_name), messages_frame(spark, lines), {}))
    assert len(actual) == len(expected)
    line_index = -1  # a message may decode into several events (Canal `data` arrays): sub_index 0 starts one
    for want, have in zip(expected, actual, strict=True):
        line_index += have["sub_index"] == 0
        assert have == want, lines[max(line_index, 0)]["case"]
