"""Renders a :class:`~cdclake.workload.history.SourceHistory` as Debezium Avro messages (``debezium-avro``).

The stream of the ``debezium-json`` renderer (same connectors, positions, transactions, heartbeats, schema changes,
placeholders, resends and malformed messages), with each key and value written as Confluent's ``AvroConverter``
writes them (``shared/formats/debezium.md`` 1): the magic byte ``0``, the schema id (4 bytes, big-endian) and the
Avro binary of the payload. The Avro schema is the Connect schema translated as Confluent's ``AvroData`` does:

* ``struct`` -> ``record`` named by the Connect name (``ConnectDefault``, ``ConnectDefault2``... in
  ``io.confluent.connect.avro`` when it has none); a record met again in the same schema is referred to by name;
* ``int8``/``int16`` -> ``int`` with ``connect.type``; ``int32`` -> ``int``; ``int64`` -> ``long``; ``float32`` ->
  ``float``; ``float64`` -> ``double``; ``array`` and ``map`` as themselves; an optional field -> ``["null", T]``
  with default ``null``;
* a Connect name, version and parameters -> ``connect.name``, ``connect.version``, ``connect.parameters``; Connect's
  own logical types also get the Avro logical type (``Decimal`` -> ``decimal`` with its precision and scale,
  ``Date`` -> ``date``, ``Time`` -> ``time-millis``, ``Timestamp`` -> ``timestamp-millis``).

Schema ids are given in the order the schemas first occur (keys and values share the id space, as in a registry).
The schemas are returned in :attr:`RenderedStream.format_options` (option ``schemas``), the way a replay without
the registry is configured. Malformed messages stay the bytes the JSON renderer made: they are not framed, so they
are dead letters as before. Limits: those of ``debezium-json`` (see its module).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import struct
from typing import Any, Final

import fastavro

from cdclake.workload import debezium
from cdclake.workload.history import SourceHistory
from cdclake.workload.renderers import RenderedStream, RenderOptions, register_renderer

_PRIMITIVES: Final = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "long",
    "float32": "float",
    "float64": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
}
_LOGICAL: Final = {
    "org.apache.kafka.connect.data.Date": "date",
    "org.apache.kafka.connect.data.Time": "time-millis",
    "org.apache.kafka.connect.data.Timestamp": "timestamp-millis",
}
DECIMAL: Final = "org.apache.kafka.connect.data.Decimal"
DEFAULT_NAMESPACE: Final = "io.confluent.connect.avro"


class _AvroSchema:
    """One Connect schema translated to Avro (see the module doc)."""

    def __init__(self) -> None:
        self.defined: set[str] = set()
        self.unnamed = 0

    def translate(self, connect: dict[str, Any]) -> Any:
        kind = connect["type"]
        name = connect.get("name")
        avro: Any
        if kind == "struct":
            full = name or self._default_name()
            if full in self.defined:
                avro = full
            else:
                self.defined.add(full)
                namespace, _, short = full.rpartition(".")
                avro = {"type": "record", "name": short, **({"namespace": namespace} if namespace else {})}
                avro["fields"] = [self._field(f) for f in connect.get("fields") or []]
        elif kind == "array":
            avro = {"type": "array", "items": self._optional(connect["items"])}
        elif kind == "map":
            avro = {"type": "map", "values": self._optional(connect["values"])}
        else:
            avro = {"type": _PRIMITIVES[kind]}
            if kind in ("int8", "int16"):
                avro["connect.type"] = kind
            parameters = connect.get("parameters") or {}
            if name == DECIMAL:
                precision = int(parameters.get("connect.decimal.precision", 64))
                avro.update(logicalType="decimal", precision=precision, scale=int(parameters.get("scale", 0)))
            elif name in _LOGICAL:
                avro["logicalType"] = _LOGICAL[name]
        if isinstance(avro, dict):
            if name:
                avro["connect.name"] = name
            if connect.get("version") is not None:
                avro["connect.version"] = connect["version"]
            if connect.get("parameters"):
                avro["connect.parameters"] = dict(connect["parameters"])
        return avro

    def _optional(self, connect: dict[str, Any]) -> Any:
        avro = self.translate(connect)
        return ["null", avro] if connect.get("optional") else avro

    def _field(self, connect: dict[str, Any]) -> dict[str, Any]:
        field: dict[str, Any] = {"name": connect["field"], "type": self._optional(connect)}
        if connect.get("optional"):
            field["default"] = None
        return field

    def _default_name(self) -> str:
        self.unnamed += 1
        suffix = "" if self.unnamed == 1 else str(self.unnamed)
        return f"{DEFAULT_NAMESPACE}.ConnectDefault{suffix}"


def _datum(connect: dict[str, Any], value: Any) -> Any:
    """A Connect JSON value as the Avro datum of its translated schema, written without the logical types (the
    same bytes): a decimal's unscaled bytes, a date's epoch days, a timestamp's epoch milliseconds."""
    if value is None:
        return None
    kind = connect["type"]
    if kind == "struct":
        return {f["field"]: _datum(f, value.get(f["field"])) for f in connect.get("fields") or []}
    if kind == "array":
        return [_datum(connect["items"], v) for v in value]
    if kind == "map":
        return {k: _datum(connect["values"], v) for k, v in value.items()}
    if kind == "bytes":
        return base64.b64decode(value)
    if kind in ("float32", "float64"):
        return float(value)
    return value


def _without_logical_types(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_without_logical_types(s) for s in schema]
    if isinstance(schema, dict):
        return {k: _without_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    return schema


class _Registry:
    """Schema ids in the order schemas first occur, and each one's parsed writer schema."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.writers: dict[int, Any] = {}

    def framed(self, data: bytes | None) -> bytes | None:
        """A JSON-converter message (``{"schema", "payload"}``) as Confluent-framed Avro."""
        if data is None:
            return None
        message = json.loads(data)
        schema = _AvroSchema().translate(message["schema"])
        text = json.dumps(schema, sort_keys=True)
        if text not in self.ids:
            self.ids[text] = len(self.ids) + 1
            self.writers[self.ids[text]] = fastavro.parse_schema(_without_logical_types(schema))
        schema_id = self.ids[text]
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, self.writers[schema_id], _datum(message["schema"], message["payload"]))
        return b"\x00" + struct.pack(">i", schema_id) + buffer.getvalue()

    def schemas_option(self) -> str:
        return json.dumps({str(i): json.loads(text) for text, i in self.ids.items()}, sort_keys=True)


@register_renderer("debezium-avro")
def render_stream(history: SourceHistory, options: RenderOptions, seed: int) -> RenderedStream:
    """Debezium Avro for ``history``: the ``debezium-json`` stream re-encoded (see the module doc)."""
    json_stream = debezium.render_stream(history, options, seed)
    registry = _Registry()
    messages = [
        message
        if message.is_malformed
        # Headers stay as they are: the worker's header converter is its own (Kafka Connect's default writes text).
        else dataclasses.replace(message, key=registry.framed(message.key), value=registry.framed(message.value))
        for message in json_stream.messages
    ]
    return RenderedStream(
        messages,
        keys=json_stream.keys,
        format_options={"schemas": registry.schemas_option()},
        expected=json_stream.expected,
    )
