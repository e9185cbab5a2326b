"""Qlik MD messages are kept by the pipeline (``<lake>/_cdclake/metadata``): DT messages are typed and keyed by an MD
read in an earlier batch, an earlier run, or the same batch on another topic."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdclake.devtools.verify import compare_lake, describe
from cdclake.pipeline import Pipeline, PipelineSettings
from cdclake.runner import replay
from cdclake.sinks.delta import DeltaSink
from cdclake.workload import HistoryConfig, Message, RenderOptions, SourceHistory, render_stream
from cdclake.workload.qlik import lake_truth
from cdclake.workload.renderers import to_lines

pytestmark = pytest.mark.spark

HISTORY = HistoryConfig(seed=4, tables=2, events=60, keys_per_table=10, keyless_tables=0, added_columns=1)
SHAPE = RenderOptions(transactions=True, partial_updates=True)


def _write(path: Path, messages: list[Message], binary: bool) -> str:
    path.write_text(to_lines(messages, binary=binary), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("format_name", ["qlik-json", "qlik-avro"])
def test_md_from_an_earlier_run_types_and_keys_the_data_of_a_later_run(
    spark: SparkSession, tmp_path: Path, format_name: str
) -> None:
    history = SourceHistory.generate(HISTORY)
    messages = render_stream(format_name, history, SHAPE, seed=4).messages
    binary = format_name == "qlik-avro"
    metadata = [m for m in messages if m.description.startswith("MD ")]
    data = [m for m in messages if not m.description.startswith("MD ")]
    assert len(metadata) == 3  # two tables, one of them altered
    lake = str(tmp_path / "lake")
    encoding = "b64" if binary else "lines"
    md_file = _write(tmp_path / "md.txt", metadata, binary)

    first = replay(spark, lake=lake, format_name=format_name, paths=[md_file], encoding=encoding)
    again = replay(spark, lake=lake, format_name=format_name, paths=[md_file], encoding=encoding)
    later = replay(
        spark,
        lake=lake,
        format_name=format_name,
        paths=[_write(tmp_path / "dt.txt", data, binary)],
        encoding=encoding,
        batch_lines=len(data) // 3 + 1,
    )

    assert [r.ops for r in first + again] == [{"DDL": 3}, {"DDL": 3}]  # MD messages are recorded, not dead letters
    assert sum(r.dead_letters for r in first + again + later) == 0
    assert len(later) == 3
    stored = DeltaSink(spark, lake).read_system("metadata")
    assert stored is not None
    rows = stored.collect()
    assert len(rows) == 3  # stored once per schemaId, however often the MD is read
    assert {(r["format"], r["table"], r["table_version"]) for r in rows} == {
        (format_name, "orders", 1),
        (format_name, "customer", 1),
        (format_name, "customer", 2),  # after ADD COLUMN extra_1
    }
    # Keys come from the stored MD (no configured keys): updates replace rows instead of adding full-row copies.
    comparison = compare_lake(lake, lake_truth(history))
    assert all(r.ok for r in comparison), describe(comparison)
    assert sum(r.actual_rows for r in comparison) > 0
    customer = dict(spark.read.format("delta").load(f"{lake}/crm/customer").dtypes)
    timestamp = "timestamp" if binary else "timestamp_ntz"  # Avro timestamp-micros is an instant; JSON DATETIME not
    assert {k: v for k, v in customer.items() if not k.startswith("_cdc_")} == {
        "id": "bigint",
        "name": "string",
        "avatar": "binary",
        "vip": "boolean",
        "score": "double",
        "updated_at": timestamp,
        "note": "string",
        "extra_1": "string",
    }


def test_md_on_another_topic_in_the_same_batch(spark: SparkSession, tmp_path: Path) -> None:
    history = SourceHistory.generate(HISTORY)
    messages = render_stream("qlik-json", history, SHAPE, seed=4).messages
    # The data topic comes first in the batch; the metadata topic holds the MD messages.
    rows = [
        (m.key, m.value, "qlik.data", 0, offset, None)
        for offset, m in enumerate(m for m in messages if not m.description.startswith("MD "))
    ] + [
        (m.key, m.value, "qlik.metadata", 0, offset, None)
        for offset, m in enumerate(m for m in messages if m.description.startswith("MD "))
    ]
    batch = spark.createDataFrame(
        rows, "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
    )
    lake = str(tmp_path / "lake")
    settings = PipelineSettings(
        lake=lake, app_id="qlik-topics", topic_formats={"qlik.data": "qlik-json", "qlik.metadata": "qlik-json"}
    )

    result = Pipeline(spark, settings).process_batch(batch, 0)

    assert result.dead_letters == 0
    assert result.ops["DDL"] == 3
    comparison = compare_lake(lake, lake_truth(history))
    assert all(r.ok for r in comparison), describe(comparison)
    stored = DeltaSink(spark, lake).read_system("metadata")
    assert stored is not None
    assert stored.count() == 3
