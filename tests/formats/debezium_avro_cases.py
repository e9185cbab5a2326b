"""Writes the golden inputs of ``debezium-avro`` and their schemas: ``python -m tests.formats.debezium_avro_cases``.

The schemas are those Confluent's ``AvroConverter`` registers for a Debezium MySQL connector (Connect names and
parameters in ``connect.*`` attributes, the envelope's ``after`` referring to the ``Value`` record by name), plus
a PostgreSQL table written by a producer that uses plain Avro logical types. They go to
``tests/cases/debezium-avro/schemas/<id>.avsc`` (the golden cases' ``schemas_dir``, see ``options.json``). Each
input line carries the framed binary key and value (``key_b64``, ``value_b64``; ``value`` is a readable rendering).
Regenerate the expected files afterwards (``python -m tests.formats.regenerate_golden debezium-avro``) and review
them.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import sys
from decimal import Decimal
from typing import Any, Final

import fastavro

from tests.formats.golden import CASES

FOLDER: Final = CASES / "debezium-avro"
NAMESPACE: Final = "dbserver1.inventory.customers"

DECIMAL: Final = {
    "type": "bytes",
    "scale": 2,
    "precision": 10,
    "connect.version": 1,
    "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
    "connect.name": "org.apache.kafka.connect.data.Decimal",
    "logicalType": "decimal",
}


def _optional(name: str, avro_type: Any) -> dict[str, Any]:
    return {"name": name, "type": ["null", avro_type], "default": None}


VALUE: Final = {
    "type": "record",
    "name": "Value",
    "namespace": NAMESPACE,
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "first_name", "type": "string"},
        _optional("price", DECIMAL),
        _optional("created", {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"}),
        _optional("birth", {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}),
        _optional("small", {"type": "int", "connect.type": "int16"}),
        _optional("photo", "bytes"),
        _optional("tags", {"type": "array", "items": "string"}),
    ],
    "connect.name": f"{NAMESPACE}.Value",
}
MYSQL_SOURCE: Final = {
    "type": "record",
    "name": "Source",
    "namespace": "io.debezium.connector.mysql",
    "fields": [
        {"name": "version", "type": "string"},
        {"name": "connector", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "ts_ms", "type": "long"},
        {
            "name": "snapshot",
            "type": [
                {
                    "type": "string",
                    "connect.version": 1,
                    "connect.parameters": {"allowed": "true,last,false,incremental"},
                    "connect.default": "false",
                    "connect.name": "io.debezium.data.Enum",
                },
                "null",
            ],
            "default": "false",
        },
        {"name": "db", "type": "string"},
        _optional("sequence", "string"),
        _optional("table", "string"),
        {"name": "server_id", "type": "long"},
        _optional("gtid", "string"),
        {"name": "file", "type": "string"},
        {"name": "pos", "type": "long"},
        {"name": "row", "type": "int"},
        _optional("thread", "long"),
        _optional("query", "string"),
    ],
    "connect.name": "io.debezium.connector.mysql.Source",
}
BLOCK: Final = {
    "type": "record",
    "name": "block",
    "namespace": "event",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "total_order", "type": "long"},
        {"name": "data_collection_order", "type": "long"},
    ],
    "connect.version": 1,
    "connect.name": "event.block",
}
ENVELOPE: Final = {
    "type": "record",
    "name": "Envelope",
    "namespace": NAMESPACE,
    "fields": [
        _optional("before", VALUE),
        _optional("after", "Value"),  # by name, as AvroConverter writes it
        {"name": "source", "type": MYSQL_SOURCE},
        {"name": "op", "type": "string"},
        _optional("ts_ms", "long"),
        _optional("transaction", BLOCK),
    ],
    "connect.version": 1,
    "connect.name": f"{NAMESPACE}.Envelope",
}
KEY: Final = {
    "type": "record",
    "name": "Key",
    "namespace": NAMESPACE,
    "fields": [{"name": "id", "type": "int"}],
    "connect.name": f"{NAMESPACE}.Key",
}
# A PostgreSQL table written with plain Avro logical types (no connect.name): decimal, timestamp-millis, date.
PG_VALUE: Final = {
    "type": "record",
    "name": "Value",
    "namespace": "pg.public.orders",
    "fields": [
        {"name": "order_id", "type": "long"},
        _optional("total", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}),
        _optional("placed", {"type": "long", "logicalType": "timestamp-millis"}),
        _optional("due", {"type": "int", "logicalType": "date"}),
        _optional("status", {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}),
    ],
}
PG_SOURCE: Final = {
    "type": "record",
    "name": "Source",
    "namespace": "io.debezium.connector.postgresql",
    "fields": [
        {"name": "version", "type": "string"},
        {"name": "connector", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "ts_ms", "type": "long"},
        {"name": "db", "type": "string"},
        {"name": "schema", "type": "string"},
        {"name": "table", "type": "string"},
        _optional("txId", "long"),
        _optional("lsn", "long"),
    ],
}
PG_ENVELOPE: Final = {
    "type": "record",
    "name": "Envelope",
    "namespace": "pg.public.orders",
    "fields": [
        _optional("before", PG_VALUE),
        _optional("after", "pg.public.orders.Value"),
        {"name": "source", "type": PG_SOURCE},
        {"name": "op", "type": "string"},
        _optional("ts_ms", "long"),
    ],
}
PG_KEY: Final = {
    "type": "record",
    "name": "Key",
    "namespace": "pg.public.orders",
    "fields": [{"name": "order_id", "type": "long"}],
}
TRANSACTION: Final = {
    "type": "record",
    "name": "TransactionMetadataValue",
    "namespace": "io.debezium.connector.common",
    "fields": [
        {"name": "status", "type": "string"},
        {"name": "id", "type": "string"},
        _optional("event_count", "long"),
        _optional(
            "data_collections",
            {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "ConnectDefault",
                    "namespace": "io.confluent.connect.avro",
                    "fields": [{"name": "data_collection", "type": "string"}, {"name": "event_count", "type": "long"}],
                },
            },
        ),
        {"name": "ts_ms", "type": "long"},
    ],
}
HEARTBEAT: Final = {
    "type": "record",
    "name": "Heartbeat",
    "namespace": "io.debezium.connector.common",
    "fields": [{"name": "ts_ms", "type": "long"}],
}
SCHEMA_CHANGE: Final = {
    "type": "record",
    "name": "SchemaChangeValue",
    "namespace": "io.debezium.connector.mysql",
    "fields": [
        {"name": "source", "type": MYSQL_SOURCE},
        {"name": "ts_ms", "type": "long"},
        _optional("databaseName", "string"),
        _optional("schemaName", "string"),
        _optional("ddl", "string"),
    ],
}

SCHEMAS: Final = {
    1: KEY,
    2: ENVELOPE,
    3: PG_KEY,
    4: PG_ENVELOPE,
    5: TRANSACTION,
    6: HEARTBEAT,
    7: SCHEMA_CHANGE,
    9: "string",
}
"""Schema id -> Avro schema, as files ``schemas/<id>.avsc``."""
PROTOBUF_ID: Final = 8
"""Written as a registry answer (``8.json``) for a Protobuf schema: its messages are dead letters."""
MISSING_ID: Final = 404


def _framed(schema_id: int, record: Any) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(SCHEMAS[schema_id]), record)
    return b"\x00" + struct.pack(">i", schema_id) + buffer.getvalue()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _render(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$b64": _b64(value)}
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {k: _render(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v) for v in value]
    return value


def _line(case: str, key: tuple[int, Any] | None, value: tuple[int, Any] | None) -> dict[str, Any]:
    line: dict[str, Any] = {"case": case, "key": None if key is None else _render(key[1])}
    if key is not None:
        line["key_b64"] = _b64(_framed(*key))
    line["value"] = None if value is None else _render(value[1])
    if value is not None:
        line["value_b64"] = _b64(_framed(*value))
    return line


def _bytes_line(case: str, value: bytes, key: tuple[int, Any] | None = None) -> dict[str, Any]:
    line = _line(case, key, None)
    line["value_b64"] = _b64(value)
    return line


def _source(pos: int, snapshot: str = "false", **extra: Any) -> dict[str, Any]:
    return {
        "version": "2.7.3.Final",
        "connector": "mysql",
        "name": "dbserver1",
        "ts_ms": 1709288400000 + pos,
        "snapshot": snapshot,
        "db": "inventory",
        "table": "customers",
        "server_id": 223344,
        "file": "mysql-bin.000003",
        "pos": pos,
        "row": 0,
        **extra,
    }


def _customer(customer_id: int, first_name: str, **changes: Any) -> dict[str, Any]:
    row = {
        "id": customer_id,
        "first_name": first_name,
        "price": Decimal("12.34"),
        "created": 1709288400123456,
        "birth": 19000,
        "small": -7,
        "photo": b"\x89PNG",
        "tags": ["a", "b"],
    }
    return {**row, **changes}


def _change(op: str, pos: int, before: Any, after: Any, **extra: Any) -> tuple[int, dict[str, Any]]:
    return (2, {"before": before, "after": after, "source": _source(pos), "op": op, "ts_ms": 1709288401000, **extra})


def _pg(op: str, lsn: int, before: Any, after: Any) -> tuple[int, dict[str, Any]]:
    source = {
        "version": "2.7.3.Final",
        "connector": "postgresql",
        "name": "pg",
        "ts_ms": 1709288500000,
        "db": "shop",
        "schema": "public",
        "table": "orders",
        "txId": 771,
        "lsn": lsn,
    }
    return (4, {"before": before, "after": after, "source": source, "op": op, "ts_ms": 1709288501000})


def _order(order_id: int, **changes: Any) -> dict[str, Any]:
    return {
        "order_id": order_id,
        "total": Decimal("1234.500"),
        "placed": 1709288500250,
        "due": 19800,
        "status": "NEW",
        **changes,
    }


def cases() -> dict[str, list[dict[str, Any]]]:
    key = (1, {"id": 1001})
    sally = _customer(1001, "Sally")
    return {
        "insert": [
            _line("INSERT, every Connect type AvroConverter writes", key, _change("c", 154, None, sally)),
            _line(
                "INSERT with NULLs in the optional columns",
                (1, {"id": 1002}),
                _change(
                    "c",
                    300,
                    None,
                    _customer(1002, "Zoë 🚀", price=None, created=None, birth=None, small=None, photo=None, tags=None),
                ),
            ),
            _line(
                "INSERT whose key is an Avro string, not a record: no key columns (configure keys), no dead letter",
                (9, "1003"),
                _change("c", 310, None, _customer(1003, "Rae")),
            ),
            _line(
                "INSERT, plain Avro logical types (no connect.name): decimal, timestamp-millis, date, enum",
                (3, {"order_id": 9001}),
                _pg("c", 33816576, None, _order(9001)),
            ),
        ],
        "update": [
            _line(
                "UPDATE with before and after images, in a transaction",
                key,
                _change(
                    "u",
                    400,
                    sally,
                    _customer(1001, "Sally Ann", price=Decimal("99.99")),
                    transaction={"id": "file=mysql-bin.000003,pos=390", "total_order": 1, "data_collection_order": 1},
                ),
            ),
            _line(
                "UPDATE with the unavailable-value placeholder: that column is left out (partial after image)",
                key,
                _change("u", 500, None, _customer(1001, "__debezium_unavailable_value")),
            ),
            _line(
                "UPDATE setting columns to NULL: the after image holds them as NULL, not left out",
                key,
                _change("u", 510, sally, _customer(1001, "Sally", price=None, tags=None, photo=None)),
            ),
            _line(
                "UPDATE of a PostgreSQL row",
                (3, {"order_id": 9001}),
                _pg("u", 33816600, _order(9001), _order(9001, status="PAID", total=Decimal("0.001"))),
            ),
        ],
        "delete": [
            _line("DELETE with the before image", key, _change("d", 600, sally, None)),
            _line("tombstone after the DELETE (null value)", key, None),
        ],
        "snapshot": [
            _line(
                "snapshot read (op r)",
                key,
                (
                    2,
                    {"before": None, "after": sally, "source": _source(154, "true"), "op": "r", "ts_ms": 1709288401000},
                ),
            ),
        ],
        "ddl": [
            _line(
                "schema change topic record",
                None,
                (
                    7,
                    {
                        "source": _source(700),
                        "ts_ms": 1709288402000,
                        "databaseName": "inventory",
                        "schemaName": None,
                        "ddl": "ALTER TABLE customers ADD COLUMN email VARCHAR(255)",
                    },
                ),
            ),
            _line("TRUNCATE (op t)", None, _change("t", 800, None, None)),
        ],
        "heartbeat": [
            _line("heartbeat record", None, (6, {"ts_ms": 1709288403000})),
            _line(
                "transaction BEGIN",
                None,
                (
                    5,
                    {
                        "status": "BEGIN",
                        "id": "tx-1",
                        "event_count": None,
                        "data_collections": None,
                        "ts_ms": 1709288404000,
                    },
                ),
            ),
            _line(
                "transaction END with counts",
                None,
                (
                    5,
                    {
                        "status": "END",
                        "id": "tx-1",
                        "event_count": 2,
                        "data_collections": [{"data_collection": "inventory.customers", "event_count": 2}],
                        "ts_ms": 1709288404001,
                    },
                ),
            ),
        ],
        "malformed": [
            _bytes_line("not framed: JSON text", b'{"op": "c"}'),
            _bytes_line("framed, schema id unknown to the registry", b"\x00" + struct.pack(">i", MISSING_ID) + b"\x02"),
            _bytes_line("framed, a Protobuf schema id", b"\x00" + struct.pack(">i", PROTOBUF_ID) + b"\x02"),
            _bytes_line("framed, too short for the schema id", b"\x00\x00\x01"),
            _bytes_line("framed, the Avro record cut short", _framed(*_change("c", 850, None, sally))[:12]),
            _bytes_line(
                "the key names a schema id the registry lacks",
                _framed(*_change("c", 900, None, sally)),
            )
            | {"key_b64": _b64(b"\x00" + struct.pack(">i", MISSING_ID) + b"\x02"), "key": None},
        ],
    }


def replay() -> list[dict[str, Any]]:
    """Replay scenario: inserts, an update, a partial update (placeholder), a delete and a snapshot row; capture files
    hold values only, so the keys come from options.json."""
    return [
        _line("insert 1001", None, _change("c", 100, None, _customer(1001, "Sally"))),
        _line("insert 1002", None, _change("c", 110, None, _customer(1002, "Ann", price=None))),
        _line("update 1001", None, _change("u", 120, _customer(1001, "Sally"), _customer(1001, "Sal", small=3))),
        _line(
            "placeholder keeps the stored first_name",
            None,
            _change("u", 130, None, _customer(1001, "__debezium_unavailable_value", price=Decimal("5.00"))),
        ),
        _line("delete 1002", None, _change("d", 140, _customer(1002, "Ann", price=None), None)),
        _line(
            "snapshot row 1003",
            None,
            (2, {"before": None, "after": _customer(1003, "Rae"), "source": _source(90, "last"), "op": "r"}),
        ),
        _line("PostgreSQL order", None, _pg("c", 33816576, None, _order(9001))),
    ]


def _write(name: str, lines: list[dict[str, Any]]) -> None:
    path = FOLDER / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    print(f"wrote {path} ({len(lines)} messages)")


def main() -> None:
    schemas = FOLDER / "schemas"
    schemas.mkdir(parents=True, exist_ok=True)
    for schema_id, schema in SCHEMAS.items():
        (schemas / f"{schema_id}.avsc").write_text(json.dumps(schema, indent=1) + "\n", encoding="utf-8")
    protobuf = {"schemaType": "PROTOBUF", "schema": 'syntax = "proto3"; message Value { int32 id = 1; }'}
    (schemas / f"{PROTOBUF_ID}.json").write_text(json.dumps(protobuf) + "\n", encoding="utf-8")
    for scenario, lines in cases().items():
        _write(f"{scenario}.input.jsonl", lines)
    _write("replay/input.jsonl", replay())


if __name__ == "__main__":
    main()
    sys.exit(0)
