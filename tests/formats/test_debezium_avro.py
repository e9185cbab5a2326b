"""``debezium-avro``: schemas from a schema registry over HTTP, plans reused per schema ids, a Kafka stream into Delta.

The golden cases (``tests/cases/debezium-avro``) cover what the messages decode to, with ``schemas_dir``. Here the
schemas come from a registry: a local HTTP server answering ``GET /schemas/ids/{id}`` as the Confluent Schema
Registry's REST API documents it (no registry is served from Maven Central or PyPI here; the server is the API's
documented behaviour, with basic authentication and failures on demand).
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cdclake.config import KafkaConfig, PipelineConfig, TriggerConfig
from cdclake.devtools import broker
from cdclake.devtools.verify import read_table
from cdclake.exceptions import ConfigError, SourceUnavailableError
from cdclake.formats import _plans, _schema_registry, check_options, debezium_avro, decode_batch, get_format
from cdclake.runner import run
from tests.formats.golden import CASES, canonical_rows_by_topic, message_bytes, read_jsonl, topics_frame

SCHEMAS = CASES / "debezium-avro" / "schemas"
USER_INFO = "reader:s3cret"


class _Registry(BaseHTTPRequestHandler):
    """``GET /schemas/ids/{id}``: the schema files of the golden cases as the registry answers them."""

    failures_left = 0  # answer HTTP 503 this many times first
    requests: list[str] = []  # noqa: RUF012 (shared by the server's handler instances on purpose)

    def do_GET(self) -> None:
        type(self).requests.append(self.path)
        expected = "Basic " + base64.b64encode(USER_INFO.encode()).decode()
        if self.headers.get("Authorization") != expected:
            return self._answer(401, {"error_code": 401, "message": "Unauthorized"})
        if type(self).failures_left > 0:
            type(self).failures_left -= 1
            return self._answer(503, {"error_code": 50302, "message": "Leader not known"})
        schema_id = self.path.removeprefix("/schemas/ids/")
        for path in (SCHEMAS / f"{schema_id}.avsc", SCHEMAS / f"{schema_id}.json"):
            if path.is_file():
                text = path.read_text()
                body = json.loads(text) if path.suffix == ".json" else {"schema": json.dumps(json.loads(text))}
                return self._answer(200, body)
        return self._answer(404, {"error_code": 40403, "message": "Schema not found"})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@pytest.fixture
def registry() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Registry.requests.clear()
    _Registry.failures_left = 0
    _schema_registry.clear_cache()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        _schema_registry.clear_cache()


def _options(url: str) -> dict[str, str]:
    return {"schema_registry_url": url, "schema_registry_user_info": USER_INFO}


def _lines(*scenarios: str) -> dict[str, list[dict[str, Any]]]:
    return {s: read_jsonl(CASES / "debezium-avro" / f"{s}.input.jsonl") for s in scenarios}


def _golden(scenario: str) -> list[dict[str, Any]]:
    return read_jsonl(CASES / "debezium-avro" / f"{scenario}.expected.jsonl")


@pytest.mark.spark
def test_schemas_from_the_registry_decode_as_from_files_and_are_fetched_once(spark, registry: str) -> None:
    """The golden cases decoded with the registry give their expected events (the registry's 404 names it); each
    schema id is asked once, however many batches name it."""
    _Registry.failures_left = 2  # two 503s: retried, not a failure
    inputs = _lines("insert", "update", "delete")
    decoded = canonical_rows_by_topic(
        decode_batch(get_format("debezium-avro"), topics_frame(spark, inputs), _options(registry))
    )
    assert decoded == {s: _golden(s) for s in inputs}
    asked = sorted(_Registry.requests)
    assert asked.count("/schemas/ids/2") == 3  # two answered 503, then the schema

    decode_batch(get_format("debezium-avro"), topics_frame(spark, inputs), _options(registry)).collect()
    assert sorted(_Registry.requests) == asked  # found schemas are kept

    missing = canonical_rows_by_topic(
        decode_batch(get_format("debezium-avro"), topics_frame(spark, _lines("malformed")), _options(registry))
    )["malformed"]
    assert missing[1]["error"] == f"value schema id 404 not found in the registry at {registry}"
    assert missing[2]["error"] == "value schema id 8 is a PROTOBUF schema, not Avro"


def test_an_unreachable_or_refusing_registry_fails_the_batch_instead_of_dead_lettering(registry: str) -> None:
    source = _schema_registry.source_from_options({"schema_registry_url": registry})  # no credentials
    with pytest.raises(SourceUnavailableError, match="answered HTTP 401 for schema id 2: Unauthorized"):
        _schema_registry.resolve(source, [2])
    closed = _schema_registry.source_from_options({"schema_registry_url": "http://127.0.0.1:9"})
    with pytest.raises(SourceUnavailableError, match="cannot be reached for schema id 2"):
        _schema_registry.resolve(closed, [2])


def test_several_addresses_and_a_folder_are_asked_in_turn(registry: str, tmp_path: Path) -> None:
    """The folder first, then each registry address; a 404 passes to the next one."""
    (tmp_path / "77.avsc").write_text('{"type": "record", "name": "R", "fields": []}')
    source = _schema_registry.SchemaSource(tmp_path, (f"{registry}/elsewhere", registry), USER_INFO)
    local, remote = _schema_registry.resolve(source, [77, 2])
    assert local.avro == '{"type": "record", "name": "R", "fields": []}'
    assert remote.avro is not None
    assert json.loads(remote.avro)["name"] == "Envelope"
    assert _Registry.requests == ["/elsewhere/schemas/ids/2", "/schemas/ids/2"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "set schema_registry_url"),
        ({"schema_registry_url": "registry:8081"}, "is not an http(s) address"),
        ({"schemas_dir": "/no/such/folder"}, "is not a folder"),
        ({"schema_registry_url": "http://r:8081", "schema_registry_user_info": "token"}, "must be user:password"),
        ({"schemas": "[1]"}, "must be a JSON object of schema ids"),
        ({"schemas": "{"}, "schemas is not JSON"),
    ],
)
def test_options_are_checked_when_the_configuration_is_loaded(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_options({"debezium-avro": options})
    assert info.value.key == "format_options.debezium-avro"
    assert message in str(info.value)


@pytest.mark.spark
def test_batches_naming_the_same_schema_ids_share_one_plan(spark) -> None:
    """The plan is built from the batch's schema ids: the same ids reuse it (and decode as the decoder's own plan
    does), other ids build another."""
    _plans.clear()
    fmt = get_format("debezium-avro")
    options = {"schemas_dir": str(SCHEMAS)}
    updates = _lines("update")["update"]
    first, second = topics_frame(spark, {"update": updates}), topics_frame(spark, {"again": updates[::-1]})
    reused = [canonical_rows_by_topic(decode_batch(fmt, batch, options)) for batch in (first, second)]
    assert len(_plans._templates) == 1
    built = [
        canonical_rows_by_topic(
            debezium_avro._decode_with_schemas(batch, options, (), debezium_avro._batch_inputs(batch, options))
        )
        for batch in (first, second)
    ]
    assert reused == built
    assert reused[0] == {"update": _golden("update")}
    decode_batch(fmt, topics_frame(spark, _lines("heartbeat")), options).collect()  # ids 5 and 6
    assert len(_plans._templates) == 2


@pytest.mark.spark
@pytest.mark.kafka
def test_a_stream_with_the_registry_lands_in_delta_with_dead_letters_kept_as_bytes(
    spark, kafka, registry: str, tmp_path: Path
) -> None:
    """Framed keys and values through the broker, schemas from the registry: the table ends as the changes leave
    it, and the malformed messages are dead letters holding the bytes they came as."""
    messages = [message_bytes(line) for lines in _lines("insert", "update", "malformed").values() for line in lines]
    topic = "dbz-avro"
    broker.create_topics(kafka, {topic: 1})
    broker.produce(kafka, topic, messages)
    lake = str(tmp_path / "lake")
    config = PipelineConfig(
        name="dbz-avro",
        lake=lake,
        checkpoint=str(tmp_path / "ckpt"),
        kafka=KafkaConfig(bootstrap_servers=kafka, topics=[topic]),
        format="debezium-avro",
        format_options={"debezium-avro": _options(registry)},
        trigger=TriggerConfig(available_now=True),
    )
    run(spark, config)
    customers = sorted(read_table(f"{lake}/inventory/customers"), key=lambda r: r["id"])
    # 1001: its last update (binlog position 510) set the price, tags and photo to NULL.
    assert [(r["id"], r["first_name"], r["price"], r["tags"], r["small"]) for r in customers] == [
        (1001, "Sally", None, None, -7),
        (1002, "Zoë 🚀", None, None, None),
        (1003, "Rae", Decimal("12.34"), '["a","b"]', -7),  # its key is an Avro string: the table's key is used
    ]
    orders = read_table(f"{lake}/shop/orders")
    assert [(r["order_id"], r["status"], str(r["total"])) for r in orders] == [(9001, "PAID", "0.001")]
    dead = spark.read.format("delta").load(f"{lake}/_cdclake/dead_letters").orderBy("offset").collect()
    malformed = [value for _, value in map(message_bytes, _lines("malformed")["malformed"])]
    assert [bytes(row["value"]) for row in dead] == malformed
    assert "not Confluent-framed Avro" in dead[0]["reason"]
