"""The order of changes whose format carries no position (Canal, DTS Canal, Lindorm, ...) across Kafka partitions
(``kafka_order``, README "Ordering across Kafka partitions"): by partition, then offset, a change from a lower
partition is older than every change stored from a higher one; by record timestamp, a table or key that moves between
partitions (partitions added, a primary-key update hashed by its new key) and a truncate sent to another partition
land as the source wrote them. The lake records the timestamp order and keeps it."""

from __future__ import annotations

import json
import logging
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from typer.testing import CliRunner

from cdclake import model
from cdclake.check import check_messages
from cdclake.cli.main import app
from cdclake.devtools import broker
from cdclake.devtools.verify import read_table
from cdclake.exceptions import ConfigError
from cdclake.model import KafkaOrder
from cdclake.pipeline import KAFKA_ORDER_FILE, BatchResult, Pipeline, PipelineSettings
from cdclake.runner import run
from cdclake.spark import local_frame
from cdclake.workload.renderers import Message, to_capture
from tests.e2e.helpers import stream_config, topic_with

pytestmark = pytest.mark.spark

TOPIC = "canal.shop"
START = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _row_message(kind: str, rows: list[dict[str, str]], old: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A Canal flat message of table shop.t (key ``id``)."""
    return {
        "data": rows,
        "database": "shop",
        "es": 0,
        "id": 1,
        "isDdl": False,
        "mysqlType": {"id": "bigint(20)", "v": "varchar(16)"},
        "old": old,
        "pkNames": ["id"],
        "sql": "",
        "table": "t",
        "ts": 0,
        "type": kind,
    }


TRUNCATE: dict[str, Any] = {
    "data": None,
    "database": "shop",
    "es": 0,
    "id": 1,
    "isDdl": True,
    "old": None,
    "pkNames": None,
    "sql": "TRUNCATE TABLE t",
    "table": "t",
    "ts": 0,
    "type": "TRUNCATE",
}


def _batch(spark: SparkSession, records: list[tuple[int, int, int, dict[str, Any]]]) -> DataFrame:
    """Kafka records ``(partition, offset, seconds after START, Canal message)``, in the order a consumer reads them."""
    rows = [
        (None, json.dumps(message).encode(), TOPIC, partition, offset, START + timedelta(seconds=seconds))
        for partition, offset, seconds, message in records
    ]
    schema = "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
    return local_frame(spark, rows, schema)


def _pipeline(spark: SparkSession, lake: str, kafka_order: KafkaOrder | None) -> Pipeline:
    return Pipeline(
        spark,
        PipelineSettings(
            lake=lake, app_id=f"kafka-order-{uuid.uuid4()}", default_format="canal-json", kafka_order=kafka_order
        ),
    )


def _millis(seconds: int) -> int:
    return int((START + timedelta(seconds=seconds)).timestamp() * 1000)


def _rows(lake: str) -> dict[str, str]:
    return {str(row["id"]): row["v"] for row in read_table(f"{lake}/shop/t")}


# The source's history, as a producer partitioning by table sends it before and after partitions were added: the
# table's changes move from partition 3 to partition 1.
MOVED_TABLE = [
    [(3, 40, 0, _row_message("INSERT", [{"id": "1", "v": "a"}, {"id": "2", "v": "b"}]))],
    [
        (1, 7, 10, _row_message("UPDATE", [{"id": "1", "v": "c"}], old=[{"v": "a"}])),
        (1, 8, 11, _row_message("DELETE", [{"id": "2", "v": "b"}])),
        (1, 9, 12, _row_message("INSERT", [{"id": "3", "v": "d"}])),
    ],
]


def test_a_table_moved_to_a_lower_partition_lands_by_record_time(spark: SparkSession, tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    pipeline = _pipeline(spark, lake, "timestamp")
    for batch_id, records in enumerate(MOVED_TABLE):
        pipeline.process_batch(_batch(spark, records), batch_id)
    assert _rows(lake) == {"1": "c", "3": "d"}
    assert Path(lake, KAFKA_ORDER_FILE).read_text(encoding="utf-8").strip() == "timestamp"


def test_by_partition_a_moved_table_keeps_its_rows_and_a_warning_says_so(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The partition order's known failure, as README describes it: the update and the delete from partition 1 are
    older than the rows stored from partition 3, and are dropped; a new key still lands. The warning names the
    partitions and the setting."""
    lake = str(tmp_path / "lake")
    pipeline = _pipeline(spark, lake, None)
    with caplog.at_level(logging.WARNING, logger="cdclake.pipeline"):
        for batch_id, records in enumerate(MOVED_TABLE):
            pipeline.process_batch(_batch(spark, records), batch_id)
    assert _rows(lake) == {"1": "a", "2": "b", "3": "d"}
    warnings = [r.getMessage() for r in caplog.records if "kafka_order: timestamp" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"shop.t: its changes come from Kafka partitions {TOPIC}[1], {TOPIC}[3]" in warnings[0]
    assert not Path(lake, KAFKA_ORDER_FILE).exists()


@pytest.mark.parametrize("kafka_order", ["partition", "timestamp"])
def test_a_key_update_hashed_by_its_new_key_and_a_truncate_from_another_partition(
    spark: SparkSession, tmp_path: Path, kafka_order: KafkaOrder
) -> None:
    """One batch: key 1 inserted in partition 2, moved to key 5 by an update that its new key hashed to partition 0;
    key 7 inserted in partition 1 before a TRUNCATE that went to partition 0, key 8 after it. By record time the
    lake holds what the source holds; by partition the old key and the truncated row stay."""
    lake = str(tmp_path / "lake")
    records = [
        (2, 0, 0, _row_message("INSERT", [{"id": "1", "v": "a"}])),
        (1, 0, 1, _row_message("INSERT", [{"id": "7", "v": "g"}])),
        (0, 0, 2, _row_message("UPDATE", [{"id": "5", "v": "a"}], old=[{"id": "1"}])),
        (0, 1, 3, TRUNCATE),
        (0, 2, 4, _row_message("INSERT", [{"id": "6", "v": "f"}])),
        (1, 1, 5, _row_message("INSERT", [{"id": "8", "v": "h"}])),
    ]
    _pipeline(spark, lake, kafka_order).process_batch(_batch(spark, records), 0)
    expected = {"6": "f", "8": "h"} if kafka_order == "timestamp" else {"1": "a", "7": "g", "6": "f", "8": "h"}
    assert _rows(lake) == expected


def test_the_lake_keeps_the_timestamp_order_once_recorded(spark: SparkSession, tmp_path: Path) -> None:
    """A lake written by partition switches to record time (every such position is newer than the partition ones, so
    its rows take the new changes); from then on a pipeline without the setting orders by time too, and one set to
    ``partition`` is refused with the key and the fix."""
    lake = str(tmp_path / "lake")
    _pipeline(spark, lake, "partition").process_batch(_batch(spark, MOVED_TABLE[0]), 0)
    _pipeline(spark, lake, "timestamp").process_batch(_batch(spark, MOVED_TABLE[1]), 0)
    assert _rows(lake) == {"1": "c", "3": "d"}

    later = _pipeline(spark, lake, None)
    assert later.kafka_order == "timestamp"
    later.process_batch(
        _batch(spark, [(0, 0, 20, _row_message("UPDATE", [{"id": "3", "v": "e"}], old=[{"v": "d"}]))]), 0
    )
    assert _rows(lake) == {"1": "c", "3": "e"}

    with pytest.raises(ConfigError) as refused:
        _pipeline(spark, lake, "partition").process_batch(_batch(spark, MOVED_TABLE[0]), 0)
    assert refused.value.key == "kafka_order"
    assert "leave `kafka_order` out" in refused.value.fix
    assert _rows(lake) == {"1": "c", "3": "e"}


def test_kafka_positions_sort_by_partition_or_by_record_time(spark: SparkSession) -> None:
    """The two forms of the Kafka fallback position: by time, every position is newer than every position by
    partition; a record without a timestamp (Kafka's -1, or none in a capture) keeps the partition form."""
    rows = [
        (3, 9, START),
        (0, 5, START + timedelta(milliseconds=1)),
        (999, 1, None),
        (1, 2, datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)),
    ]
    frame = local_frame(spark, rows, "partition int, offset bigint, timestamp timestamp")
    position = model.kafka_position(F.col("partition"), F.col("offset"), timestamp=F.col("timestamp"))
    by_partition = model.kafka_position(F.col("partition"), F.col("offset"))
    got = [(r["t"], r["p"]) for r in frame.select(position.alias("t"), by_partition.alias("p")).collect()]
    millis = int(START.timestamp() * 1000)
    assert got[0][0] == f"~@{millis:013d}:000003:{9:020d}"
    assert got[1][0] == f"~@{millis + 1:013d}:000000:{5:020d}"
    assert got[2][0] == got[2][1] == f"~000999:{1:020d}"
    assert got[3][0] == got[3][1] == f"~000001:{2:020d}"
    assert got[0][0] < got[1][0]
    assert min(t for t, _ in got[:2]) > max(p for _, p in got)


@pytest.mark.kafka
def test_a_stream_from_a_real_broker_orders_by_the_record_timestamps(
    spark: SparkSession, kafka: str, tmp_path: Path
) -> None:
    """`cdclake run` with ``kafka_order: timestamp``: the Kafka source's record timestamps (the producer's clock) order
    the moved table's changes, read in one batch from both partitions, lower partition first."""
    topic = topic_with(kafka, [], partitions=4)
    for records in MOVED_TABLE:
        for partition, _offset, _seconds, message in records:
            broker.produce(kafka, topic, [(None, json.dumps(message).encode())], partition=partition)
            time.sleep(0.01)  # a later record time for each
    lake = str(tmp_path / "lake")
    config = stream_config(kafka, topic, lake, str(tmp_path / "checkpoint")).model_copy(
        update={"format": "canal-json", "kafka_order": "timestamp"}
    )
    batches: list[BatchResult] = []
    run(spark, config, on_batch=batches.append)
    assert sum(batch.messages for batch in batches) == 5  # events: the first message inserts two rows
    assert _rows(lake) == {"1": "c", "3": "d"}


def test_a_replay_of_a_dump_that_lists_the_partitions_in_turn_orders_by_the_flag(
    spark: SparkSession, tmp_path: Path
) -> None:
    """`cdclake replay --input-encoding records`: a dump of the moved table's topic (records with their timestamps, as
    `kcat -J` writes them) lists partition 1 before partition 3, so in file order the update and the delete come
    before the insert they follow. With
    ``--kafka-order timestamp`` the records' timestamps order them and the lake records that order; without the flag
    the file order stands (README "Replay captured messages")."""
    # The file order of such a dump: partition 1's records, then partition 3's; each with its record time.
    dumped = [
        Message(None, json.dumps(message).encode(), f"partition {partition}", timestamp=_millis(seconds))
        for records in reversed(MOVED_TABLE)
        for partition, _offset, seconds, message in records
    ]
    text, encoding, _ = to_capture(dumped)
    assert encoding == "records"
    dump = tmp_path / "shop.jsonl"
    dump.write_text(text, encoding="utf-8")
    replay = ["replay", "--format", "canal-json", "--input-encoding", encoding, str(dump)]
    by_time, by_file = str(tmp_path / "by_time"), str(tmp_path / "by_file")
    done = CliRunner().invoke(app, [*replay, "--lake", by_time, "--kafka-order", "timestamp"])
    assert done.exit_code == 0, done.output
    assert _rows(by_time) == {"1": "c", "3": "d"}
    assert Path(by_time, KAFKA_ORDER_FILE).read_text(encoding="utf-8").strip() == "timestamp"
    done = CliRunner().invoke(app, [*replay, "--lake", by_file])
    assert done.exit_code == 0, done.output
    assert _rows(by_file) == {"1": "a", "2": "b", "3": "d"}
    assert not Path(by_file, KAFKA_ORDER_FILE).exists()


@pytest.mark.parametrize("kafka_order", ["partition", "timestamp"])
def test_check_warns_of_a_table_read_from_several_partitions_by_partition(
    spark: SparkSession, tmp_path: Path, kafka_order: KafkaOrder
) -> None:
    settings = PipelineSettings(
        lake=str(tmp_path / "lake"), app_id="check", default_format="canal-json", kafka_order=kafka_order
    )
    messages = _batch(spark, [record for records in MOVED_TABLE for record in records])
    (finding,) = check_messages(spark, settings, messages, "test").tables
    assert finding.name == "shop.t"
    if kafka_order == "partition":
        assert finding.setting_warning is not None
        assert f"partitions {TOPIC}[1], {TOPIC}[3] and carry no position" in finding.setting_warning
        assert "Set `kafka_order: timestamp`" in finding.setting_warning
    else:
        assert finding.setting_warning is None
    assert not Path(tmp_path, "lake").exists()  # check writes nothing
