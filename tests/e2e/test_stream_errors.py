"""What a stream that cannot go on says: its own error, or the Kafka client's reason, not the query's wrapping."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from cdclake.check import check_pipeline
from cdclake.config import DdlConfig, KafkaConfig, PipelineConfig, TriggerConfig
from cdclake.devtools import broker
from cdclake.evolve import SchemaChangeError
from cdclake.exceptions import SourceUnavailableError
from cdclake.runner import run
from tests.test_ddl import ddl_message, row_message

pytestmark = pytest.mark.spark

# Fail in seconds instead of Spark's three attempts of a minute each.
QUICK_FAILURE = {
    "request.timeout.ms": "2000",
    "default.api.timeout.ms": "3000",
    "fetchOffset.numRetries": "1",
    "fetchOffset.retryIntervalMs": "10",
}


def config(tmp_path: Path, bootstrap: str, topic: str, **settings: object) -> PipelineConfig:
    return PipelineConfig(
        name="errors",
        lake=str(tmp_path / "lake"),
        kafka=KafkaConfig(bootstrap_servers=bootstrap, topics=[topic], options=QUICK_FAILURE),
        format="canal-json",
        trigger=TriggerConfig(available_now=True),
        **settings,  # type: ignore[arg-type]
    )


def test_unreachable_brokers_are_named_with_the_clients_reason(spark, tmp_path: Path) -> None:
    # Port 9 (discard) on the loopback: nothing listens.
    unreachable = config(tmp_path, "127.0.0.1:9", "orders")
    with pytest.raises(SourceUnavailableError, match=r"cannot read Kafka at 127\.0\.0\.1:9: TimeoutException: "):
        run(spark, unreachable)
    with pytest.raises(SourceUnavailableError, match=r"cannot read Kafka at 127\.0\.0\.1:9: TimeoutException: "):
        check_pipeline(spark, unreachable)


@pytest.mark.kafka
def test_a_batch_that_stops_the_stream_raises_its_own_error(spark, kafka, tmp_path: Path) -> None:
    """The `fail` DDL policy stops the stream with the message that names the table, the statement and the fix."""
    topic = f"errors-{uuid.uuid4().hex[:8]}"
    broker.create_topics(kafka, {topic: 1})
    messages = [
        row_message("INSERT", "customer", [{"id": "1", "name": "a"}], {"id": "bigint(20)", "name": "varchar(8)"}),
        ddl_message("customer", "ALTER TABLE customer ADD COLUMN tier varchar(8)"),
    ]
    broker.produce(kafka, topic, [(None, m.encode()) for m in messages], partition=0)
    stopping = config(tmp_path, kafka, topic, ddl=DdlConfig(policy="fail"))
    with pytest.raises(SchemaChangeError, match=r"crm\.customer .*policy 'fail'.*Fix:"):
        run(spark, stopping)
