"""A decoder's plan is built once and reused by later batches (``cdclake.formats._plans``), with the same events."""

from __future__ import annotations

from functools import reduce

import pytest
from pyspark.sql import DataFrame

from cdclake.formats import _plans, decode_batch, decode_batch_with_metadata, get_format, list_formats, qlik_avro
from cdclake.formats.base import collect_metadata
from tests.formats.golden import CASES, canonical_rows_by_topic, read_jsonl, scenarios, topics_frame

pytestmark = pytest.mark.spark

REUSED = [
    fmt.name
    for fmt in list_formats()
    if not fmt.reads_batch_to_plan and (fmt.metadata is None or fmt.metadata.plan_from_definitions)
]


def _plain(format_name: str, messages: DataFrame) -> DataFrame:
    fmt = get_format(format_name)
    decoded = fmt.decode(messages, {})
    return decoded if fmt.batch_step is None else fmt.batch_step(decoded)


def _halves(spark, format_name: str) -> tuple[DataFrame, DataFrame]:  # type: ignore[no-untyped-def]
    inputs = {s: read_jsonl(CASES / format_name / f"{s}.input.jsonl") for s in scenarios(format_name)}
    names = sorted(inputs)
    first, second = names[::2], names[1::2]
    return (
        topics_frame(spark, {s: inputs[s] for s in first}),
        topics_frame(spark, {s: inputs[s] for s in second}),
    )


def test_every_format_but_the_avro_ones_with_schema_ids_reuses_its_plan_per_options_and_definitions() -> None:
    # Qlik Avro's plan also depends on the data schemas its messages name (see the next test), Debezium Avro's on
    # the schema ids (tests/formats/test_debezium_avro.py).
    assert set(REUSED) == {fmt.name for fmt in list_formats()} - {"qlik-avro", "debezium-avro"}


def test_qlik_avro_reuses_its_plan_per_data_schemas_of_the_batch(spark) -> None:
    """Qlik Avro plans one ``from_avro`` per data schema its DT messages name, collected from the batch first:
    batches naming the same schemas share a template and decode as the plan built for each of them does; a batch
    naming other schemas (or with MD messages of other schema texts) builds another."""
    _plans.clear()
    fmt = get_format("qlik-avro")
    assert fmt.metadata is not None
    metadata = topics_frame(spark, {"metadata": read_jsonl(CASES / "qlik-avro" / "metadata.input.jsonl")})
    known = collect_metadata(fmt.metadata.extract(metadata, {}))
    assert known, "the metadata case defines its tables"
    # DT messages of one schemaId, defined in `known`: two batches of other rows show the reuse (each decode of this
    # format costs seconds of analysis; four batches took 52 s of the suite).
    one_schema = ["insert", "delete"]
    batches = [topics_frame(spark, {s: read_jsonl(CASES / "qlik-avro" / f"{s}.input.jsonl")}) for s in one_schema]
    assert len({qlik_avro._batch_inputs(batch) for batch in batches}) == 1
    for batch in batches:
        reused = canonical_rows_by_topic(decode_batch_with_metadata(fmt, batch, {}, known))
        built = qlik_avro._decode_with_inputs(batch, {}, known, qlik_avro._batch_inputs(batch))
        assert reused == canonical_rows_by_topic(built)
        assert reused
        assert not any(row["error"] for rows in reused.values() for row in rows)
    assert len(_plans._templates) == 1
    reused = decode_batch_with_metadata(fmt, metadata, {}, known)
    built = qlik_avro._decode_with_inputs(metadata, {}, known, qlik_avro._batch_inputs(metadata))
    assert canonical_rows_by_topic(reused) == canonical_rows_by_topic(built)
    assert len(_plans._templates) == 2


def test_a_plan_built_from_definitions_is_reused_while_they_stay_the_same(spark) -> None:
    """Qlik JSON, as the pipeline decodes it: with every definition known so far. Two batches under the same
    definitions share one template and decode as the decoder's own plan does; a new definition builds another."""
    _plans.clear()
    fmt = get_format("qlik-json")
    assert fmt.metadata is not None
    first, second = _halves(spark, "qlik-json")
    known = collect_metadata(fmt.metadata.extract(first.unionByName(second), {}))
    assert len(known) >= 2, "the cases must define several tables"
    reused = [decode_batch_with_metadata(fmt, batch, {}, known) for batch in (first, second)]
    assert len(_plans._templates) == 1
    expected = [canonical_rows_by_topic(fmt.metadata.decode(batch, {}, known)) for batch in (first, second)]
    assert [canonical_rows_by_topic(events) for events in reused] == expected
    fewer = decode_batch_with_metadata(fmt, first, {}, known[:1])
    assert len(_plans._templates) == 2
    assert canonical_rows_by_topic(fewer) == canonical_rows_by_topic(fmt.metadata.decode(first, {}, known[:1]))


@pytest.mark.parametrize("format_name", ["dataworks-json", "debezium-json", "dts-avro", "canal-json"])
def test_a_reused_plan_decodes_each_batch_as_a_plan_of_its_own(spark, format_name: str) -> None:
    """Two batches through one template (the second reuses the first's), and both in one query: the same events as
    the decoder's own plan for each batch. A JSON format, one with a batch step, an Avro one and one with several
    events per message; every format's golden cases are decoded through a reused plan too (test_golden)."""
    _plans.clear()
    first, second = _halves(spark, format_name)
    reused = [decode_batch(get_format(format_name), batch, {}) for batch in (first, second)]
    assert len(_plans._templates) == 1
    expected = [canonical_rows_by_topic(_plain(format_name, batch)) for batch in (first, second)]
    assert [canonical_rows_by_topic(events) for events in reused] == expected
    # Both batches' events in one plan: the template's attribute ids occur twice.
    together = reduce(DataFrame.unionByName, reused)
    assert canonical_rows_by_topic(together) == expected[0] | expected[1]


def test_a_plan_is_built_again_when_what_analysis_reads_changes(spark) -> None:
    """Other options, another session time zone: another template; the same ones again: the same template."""
    _plans.clear()
    batch = _halves(spark, "debezium-json")[0]
    fmt = get_format("debezium-json")
    decode_batch(fmt, batch, {})
    decode_batch(fmt, batch, {"unavailable_value_placeholder": "__gone__"})
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Shanghai")
    try:
        shanghai = decode_batch(fmt, batch, {})
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert len(_plans._templates) == 3
    again = decode_batch(fmt, batch, {})
    assert len(_plans._templates) == 3
    assert (
        canonical_rows_by_topic(shanghai)
        == canonical_rows_by_topic(again)
        == canonical_rows_by_topic(_plain("debezium-json", batch))
    )


def test_a_plan_is_reused_after_a_lake_commit(spark, tmp_path) -> None:
    """Delta records each commit's version in the session configuration: not a reason to build the plan again."""
    _plans.clear()
    batch = _halves(spark, "dataworks-json")[0]
    decode_batch(get_format("dataworks-json"), batch, {})
    for version in range(2):
        spark.range(1).write.format("delta").mode("append").save(str(tmp_path / "table"))
        assert spark.conf.get("spark.databricks.delta.lastCommitVersionInSession") == str(version)
        decode_batch(get_format("dataworks-json"), batch, {})
    assert len(_plans._templates) == 1
