"""Every format's golden cases decode to exactly their expected canonical events."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdclake import model
from cdclake.formats import CdcFormat, _plans, decode_batch, get_format, list_formats
from tests.formats.golden import (
    CASES,
    canonical_rows,
    canonical_rows_by_topic,
    golden_options,
    read_jsonl,
    scenarios,
    topics_frame,
)

CASE_IDS = [(fmt.name, scenario) for fmt in list_formats() for scenario in scenarios(fmt.name)]

TOPIC_IS_A_NAME = frozenset({"qlik-json", "qlik-avro"})
"""Formats whose decoding reads the topic (Qlik: the table when the message names none): their cases keep the
topic ``golden`` and are decoded one by one."""

_decoded: dict[str, dict[str, list[dict[str, Any]]]] = {}


def _decoded_cases(spark: SparkSession, format_name: str) -> dict[str, list[dict[str, Any]]]:
    """The canonical events of each of the format's cases, by scenario.

    The cases of a format are decoded together, each scenario's messages as a topic of its own (their offsets and
    Kafka fallback positions as when decoded alone): a decoder's per-message expressions are built and planned once
    per format instead of once per case, which was most of each case's time. A format's batch step (which reads
    the whole batch) still runs once per case, on that case's events.
    """
    if format_name not in _decoded:
        fmt = get_format(format_name)
        options = golden_options(format_name)
        inputs = {s: read_jsonl(CASES / format_name / f"{s}.input.jsonl") for s in scenarios(format_name)}
        if format_name in TOPIC_IS_A_NAME:
            _decoded[format_name] = {
                s: canonical_rows(decode_batch(fmt, topics_frame(spark, {"golden": lines}, numbered=True), options))
                for s, lines in inputs.items()
            }
        elif fmt.batch_step is None:
            _decoded[format_name] = canonical_rows_by_topic(
                _reused(fmt, topics_frame(spark, inputs, numbered=True), options)
            )
        else:
            events = _reused(fmt, topics_frame(spark, inputs, numbered=True), options).localCheckpoint(eager=True)
            _decoded[format_name] = {
                s: canonical_rows(fmt.batch_step(events.where(F.col(model.TOPIC) == s))) for s in inputs
            }
    return _decoded[format_name]


def _reused(fmt: CdcFormat, messages: DataFrame, options: dict[str, str]) -> DataFrame:
    """The format's decode of ``messages`` as ``decode_batch`` runs it: the decoder's plan built on a template
    relation and put over ``messages`` (``formats._plans``), so that the golden cases check the plan the pipeline
    runs. A format that reads the batch to plan reuses plans itself."""
    if fmt.reads_batch_to_plan:
        return decode_batch(fmt, messages, options)
    return _plans.decode_reusing_plan(fmt.decode, messages, options)


@pytest.mark.spark
@pytest.mark.parametrize(("format_name", "scenario"), CASE_IDS, ids=[f"{f}/{s}" for f, s in CASE_IDS])
def test_golden(spark, format_name: str, scenario: str) -> None:
    lines = read_jsonl(CASES / format_name / f"{scenario}.input.jsonl")
    expected = read_jsonl(CASES / format_name / f"{scenario}.expected.jsonl")
    actual = _decoded_cases(spark, format_name).get(scenario, [])
    assert len(actual) == len(expected)
    line_index = -1  # a message may decode into several events (Canal `data` arrays): sub_index 0 starts one
    for want, have in zip(expected, actual, strict=True):
        line_index += have["sub_index"] == 0
        # Every event keeps its message's headers (for held messages and dead letters, decoded again later).
        assert have.pop("line_header", None) == str(max(line_index, 0)), lines[max(line_index, 0)]["case"]
        assert have == want, lines[max(line_index, 0)]["case"]
