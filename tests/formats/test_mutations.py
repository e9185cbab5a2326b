"""Mutation fuzz of every registered decoder: odd or broken messages never fail a batch and never disappear.

The golden cases' valid messages (``tests/cases/<format>``, whose expected events carry no error) are mutated
deterministically (``random.Random`` seeded per format): JSON messages node by node (a field dropped, set to null,
renamed, given another JSON kind, a huge number, an empty value, unicode oddities, a duplicate key) and as text (cut
at a byte, wrapped in an array, other documents); Avro messages as bytes (flipped, cut, extended, another magic byte
or schema id) and as records (fastavro: a value of the same Avro type that a source would hardly send, or a string,
bytes, array or map whose length says 2,000,000,000: ``cdclake.spark.AVRO_LIMITS``). Besides that sample, every
integer of every message is set to each end of Java's long and int, and every digit run of a text to 20 nines
(:func:`edge_values`: under ANSI mode an overflow fails a batch). All of a format's messages, the originals included,
are decoded in one batch, as the pipeline decodes (``decode_batch``).

Per message (by its offset): the decode does not raise, the message yields at least one event, each event keeps the
message's bytes and is either a dead letter (``error`` set) or a sane event (a canonical op, a table for row events,
declared types canonical text can carry, every image value valid canonical text of its column's declared type, so
that typing it later neither fails nor loses it).
"""

from __future__ import annotations

import base64
import copy
import io
import json
import random
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import fastavro
import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdclake import model
from cdclake.formats import CdcFormat, decode_batch, list_formats
from cdclake.model import Op
from cdclake.spark import local_frame
from tests.conftest import SHARED
from tests.formats.golden import CASES, golden_options, message_bytes, read_jsonl, scenarios

TOPIC: Final = "golden"
"""The golden cases' topic (Qlik reads the table from it when a message names none)."""
NODES_PER_MESSAGE: Final = 24
"""Nodes of a message mutated (one random mutation each): a sample when it has more."""
SEED: Final = 20240301

# ----------------------------------------------------------------------------------------------------------------
# The golden cases' valid messages.


def valid_lines(format_name: str) -> list[dict[str, Any]]:
    """The golden input lines whose expected events are all without error (a message's events start at
    ``sub_index`` 0, as ``test_golden`` counts them)."""
    lines: list[dict[str, Any]] = []
    for scenario in scenarios(format_name):
        inputs = read_jsonl(CASES / format_name / f"{scenario}.input.jsonl")
        expected = read_jsonl(CASES / format_name / f"{scenario}.expected.jsonl")
        groups: list[list[dict[str, Any]]] = []
        for event in expected:
            if event["sub_index"] == 0 or not groups:
                groups.append([])
            groups[-1].append(event)
        assert len(groups) == len(inputs), f"{format_name}/{scenario}: events do not group into its messages"
        lines += [line for line, events in zip(inputs, groups, strict=True) if all(e["error"] is None for e in events)]
    return lines


# ----------------------------------------------------------------------------------------------------------------
# JSON mutations. A tree of plain JSON values, with Raw (a token written verbatim: 1e400, "\ud800") and Dup (an
# object with a repeated key) where Python's json cannot say it.


@dataclass(frozen=True)
class Raw:
    text: str


@dataclass(frozen=True)
class Dup:
    pairs: tuple[tuple[Any, Any], ...]


def dumps(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Dup | dict):
        pairs = value.pairs if isinstance(value, Dup) else value.items()
        return "{" + ",".join(f"{dumps(k)}:{dumps(v)}" for k, v in pairs) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every node below the root, parents first."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield (*prefix, key)
        yield from paths(child, (*prefix, key))


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    """The node at ``path`` of a JSON document or a fastavro record."""
    for step in path:
        value = value[step]
    return value


_DROP: Final = object()

HUGE_NUMBERS: Final = (
    "1e400",
    "-1e400",
    "1e-400",
    "123456789012345678901234567890",
    "-123456789012345678901234567890.5",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "1.7976931348623157e309",
    "0.000000000000000000000000000000000000000001",
    "253402300800000",  # 10000-01-01 in ms
    "-62135596800001",  # before 0001-01-01 in ms
)
ODD_TEXTS: Final = (
    Raw(r'"\ud800"'),
    Raw(r'"a\udc00b"'),
    Raw(r'"\ud83d"'),
    Raw(r'"\u0000"'),
    "x\u0000y",
    "🚀",
    "Zoë\u202e\ufeff\uffff",
    " 12 ",
    "1e5",
    "-0",
    "NaN",
    "Infinity",
    "0x10",
    "１２",  # fullwidth digits
    "٣",  # an Arabic-Indic digit
    "9999-99-99 99:99:99",
    "2024-02-30T25:61:61.1234567+25:00",
    "[1, 2",
    '{"a": ',
    "null",
    "true",
    "a" * 3000,
)
ODD_KEYS: Final = ("", "\u0000", "🚀", "_cdc_x", "a b", "k" * 300, "ID", "Id", "\t")

EDGE_INTEGERS: Final = (-(2**63), 2**63 - 1, -(2**31), 2**31 - 1)
"""The ends of Java's long and int. Arithmetic on them overflows (``abs`` and negation of the smallest long, a unit
conversion, a scale padded with that many zeros), and under ANSI mode an overflow fails the whole batch, not the
message: every integer of every message gets each of them (not a sample, unlike the other mutations)."""
HUGE_DIGITS: Final = "99999999999999999999"
"""Put in place of every digit run of a text value that has one (``decimal(10,2)``, ``"2024-01-01"``, a version):
a number read from text that no long holds."""
_DIGIT_RUN: Final = re.compile(r"\d+")


def edge_values(old: Any) -> list[Any]:
    """:data:`EDGE_INTEGERS` for an integer, :data:`HUGE_DIGITS` in the digit runs of a text, else nothing."""
    if isinstance(old, bool):
        return []
    if isinstance(old, int):
        return [edge for edge in EDGE_INTEGERS if edge != old]
    if isinstance(old, str) and _DIGIT_RUN.search(old):
        return [_DIGIT_RUN.sub(HUGE_DIGITS, old)]
    return []


def _kinds(old: Any) -> list[Any]:
    """Values of another JSON kind than ``old`` (its text as a number or a string where that reads alike)."""
    out: list[Any] = ["text", 7, 1.5, True, {"x": 1}, [1, "a"], [], {}]
    if isinstance(old, str):
        out.append(Raw(old) if _is_number(old) else 0)
    elif isinstance(old, bool):
        out.append(str(old).lower())
    elif isinstance(old, int | float):
        out.append(str(old))
    elif isinstance(old, dict | list):
        out.append(json.dumps(old, ensure_ascii=False))  # the nested value as JSON text
    return [v for v in out if type(v) is not type(old)]


def _is_number(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return text.strip() != "" and text.lstrip("-")[:1].isdigit()


def _node_mutation(rng: random.Random, old: Any, parent: Any) -> tuple[str, Callable[[Any], Any]]:
    """A random mutation of one node: its name and a function of the parent's key -> new value (or _DROP)."""
    kind = rng.choice(("drop", "null", "kind", "huge", "empty", "odd", "rename", "dup"))
    if kind == "drop":
        return kind, lambda _: _DROP
    if kind == "null":
        return kind, lambda _: None
    if kind == "kind":
        value = rng.choice(_kinds(old))
        return kind, lambda _: value
    if kind == "huge":
        number = Raw(rng.choice(HUGE_NUMBERS))
        value = Raw(json.dumps(number.text)) if isinstance(old, str) and rng.random() < 0.5 else number
        return kind, lambda _: value
    if kind == "empty":
        value = rng.choice(("", {}, []))
        return kind, lambda _: value
    if kind == "odd":
        value = rng.choice(ODD_TEXTS)
        return kind, lambda _: value
    if kind == "rename" and isinstance(parent, dict):
        return kind, lambda _: ("rename", rng.choice(ODD_KEYS))
    if kind == "dup" and isinstance(parent, dict):
        value = rng.choice([None, "other", 0, {}, *_kinds(old)])
        return kind, lambda _: ("dup", value)
    return "null", lambda _: None


def _apply(document: Any, path: tuple[Any, ...], change: Callable[[Any], Any]) -> Any:
    root = copy.deepcopy(document)
    parent = root
    for step in path[:-1]:
        parent = parent[step]
    key = path[-1]
    new = change(key)
    if new is _DROP:
        del parent[key]
    elif isinstance(new, tuple) and new[0] == "rename":
        items = [(new[1] if k == key else k, v) for k, v in parent.items()]
        return _replace(root, path[:-1], Dup(tuple(items)))
    elif isinstance(new, tuple) and new[0] == "dup":
        items = [*parent.items()]
        position = [k for k, _ in items].index(key)
        items.insert(position + 1, (key, new[1]))
        return _replace(root, path[:-1], Dup(tuple(items)))
    else:
        parent[key] = new
    return root


def _replace(root: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = root
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return root


def json_mutations(rng: random.Random, document: Any) -> Iterator[tuple[str, bytes | None]]:
    """(what, value bytes) of the mutations of one JSON message."""
    nodes = list(paths(document))
    for path in rng.sample(nodes, min(len(nodes), NODES_PER_MESSAGE)):
        parent = _at(document, path[:-1])
        name, change = _node_mutation(rng, parent[path[-1]], parent)
        yield f"{name} at {'/'.join(map(str, path))}", dumps(_apply(document, path, change)).encode("utf-8", "replace")
    text = dumps(document).encode("utf-8")
    for cut in sorted(rng.sample(range(1, len(text)), min(3, len(text) - 1))):
        yield f"cut at byte {cut}", text[:cut]
    at = rng.randrange(len(text))
    yield f"byte 0xff at {at}", text[:at] + b"\xff" + text[at:]
    yield f"NUL byte at {at}", text[:at] + b"\x00" + text[at:]
    yield "wrapped in an array", b"[" + text + b"]"
    yield "two documents", text + text
    yield "trailing garbage", text + b" x"
    yield "BOM first", b"\xef\xbb\xbf" + text
    yield "UTF-16", dumps(document).encode("utf-16")
    for other in (b"", b" ", b"null", b"{}", b"[]", b'""', b"0", b"[{}]", b"true", b'{"":null}'):
        yield f"document {other!r}", other


def json_edge_mutations(document: Any) -> Iterator[tuple[str, bytes]]:
    """The message with one value at a time set to each of its :func:`edge_values`."""
    for path in paths(document):
        for edge in edge_values(_at(document, path)):
            changed = _apply(document, path, lambda _, edge=edge: edge)
            yield f"edge {str(edge)[:24]} at {'/'.join(map(str, path))}", dumps(changed).encode("utf-8")


# ----------------------------------------------------------------------------------------------------------------
# Avro mutations: bytes, and records decoded with fastavro, given a same-typed odd value and written again.


@dataclass(frozen=True)
class AvroLayer:
    """How a format's value holds its Avro record: the framing before it and the writer schema."""

    prefix: bytes
    schema: Any


def _schema_file(name: str) -> Any:
    return fastavro.parse_schema(json.loads((SHARED / "formats" / name).read_text()))


def _debezium_layer(value: bytes) -> AvroLayer | None:
    if len(value) < 5 or value[0] != 0:
        return None
    path = CASES / "debezium-avro" / "schemas" / f"{int.from_bytes(value[1:5], 'big')}.avsc"
    return AvroLayer(value[:5], fastavro.parse_schema(json.loads(path.read_text()))) if path.is_file() else None


def _dts_layer(value: bytes) -> AvroLayer | None:
    return AvroLayer(b"", _schema_file("dts-record.avsc"))


def _drs_layer(value: bytes) -> AvroLayer | None:
    prefix = value[:10] if value[:2] == b"\xc3\x01" else b""
    return AvroLayer(prefix, _schema_file("drs-record.avsc"))


def _qlik_layer(value: bytes) -> AvroLayer | None:
    from tests.formats.avro_cases import QLIK_ENVELOPE

    return AvroLayer(b"", QLIK_ENVELOPE)


AVRO_LAYERS: Final[dict[str, Callable[[bytes], AvroLayer | None]]] = {
    "debezium-avro": _debezium_layer,
    "dts-avro": _dts_layer,
    "drs-avro": _drs_layer,
    "qlik-avro": _qlik_layer,
}

ODD_STRINGS: Final = (
    "",
    "\u0000",
    "🚀",
    "x" * 3000,
    "1e400",
    "123456789012345678901234567890",
    "-",
    " 12 ",
    "NaN",
    "１２",
    "٣",
    "9999-99-99 99:99:99",
    "a.b.c.d",
    "{",
    "[]",
    "null",
    '{"PRIMARY":[1]}',
    "INSERT",
    "UNKNOWN",
)
ODD_INTS: Final = (0, -1, 1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 10**15)
ODD_FLOATS: Final = (float("nan"), float("inf"), float("-inf"), 1e308, -0.0, 5e-324)
ODD_BYTES: Final = (b"", b"\xff\xfe\xfd", b"\x00", "🚀".encode(), bytes(range(256)))


def _leaves(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths of every value of a fastavro record (unions of records read as (name, record) tuples)."""
    yield prefix
    if isinstance(value, tuple):
        yield from _leaves(value[1], (*prefix, 1))
    elif isinstance(value, dict):
        for key, child in value.items():
            yield from _leaves(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _leaves(child, (*prefix, index))


def _odd_values(rng: random.Random, old: Any) -> list[Any]:
    if isinstance(old, bool):
        return [not old, None]
    if isinstance(old, str):
        return [*rng.sample(ODD_STRINGS, 4), None]
    if isinstance(old, int):
        return [*rng.sample(ODD_INTS, 3), None]
    if isinstance(old, float):
        return [*rng.sample(ODD_FLOATS, 2), None]
    if isinstance(old, bytes):
        return [*rng.sample(ODD_BYTES, 2), None]
    if isinstance(old, list):
        return [[], old + old, old[:-1], old[::-1], None]
    if isinstance(old, tuple | dict):
        return [None, {}]
    if old is None:
        return ["", 0, b"", []]
    return [None]


def _set(record: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    root = copy.deepcopy(record)
    parent = root
    for step in path[:-1]:
        parent = parent[step]
    if isinstance(parent, tuple):  # a union branch (name, record): rebuild it
        return _set(root, path[:-2], (parent[0], value) if path[-1] == 1 else value)
    parent[path[-1]] = value
    return root


def _read_record(layer: AvroLayer, value: bytes) -> Any:
    """The value's record (fastavro, unions of records as (name, record) tuples); None when it does not read."""
    try:
        return fastavro.schemaless_reader(io.BytesIO(value[len(layer.prefix) :]), layer.schema, None, True)
    except Exception:
        return None


def _written(layer: AvroLayer, record: Any) -> bytes | None:
    """The record written with the layer's schema (no framing); None when the schema does not take it."""
    buffer = io.BytesIO()
    try:
        fastavro.schemaless_writer(buffer, layer.schema, record)
    except Exception:
        return None
    return buffer.getvalue()


def avro_record_mutations(rng: random.Random, layer: AvroLayer, value: bytes) -> Iterator[tuple[str, bytes]]:
    """Records of the writer schema with one value replaced by an odd one of a type the schema takes."""
    record = _read_record(layer, value)
    if record is None:
        return
    leaves = [p for p in _leaves(record) if p]
    for path in rng.sample(leaves, min(len(leaves), NODES_PER_MESSAGE)):
        for new in _odd_values(rng, _at(record, path)):
            written = _written(layer, _set(record, path, new))
            if written is not None:
                yield f"record {'/'.join(map(str, path))} = {str(new)[:40]!r}", layer.prefix + written
                break


def avro_edge_mutations(layer: AvroLayer, value: bytes) -> Iterator[tuple[str, bytes]]:
    """Records of the writer schema with one value at a time set to each of its :func:`edge_values` that the
    schema takes (an ``int`` field does not take a long's ends)."""
    record = _read_record(layer, value)
    if record is None:
        return
    for path in (p for p in _leaves(record) if p):
        for edge in edge_values(_at(record, path)):
            written = _written(layer, _set(record, path, edge))
            if written is not None:
                yield f"record edge {str(edge)[:24]} at {'/'.join(map(str, path))}", layer.prefix + written


def _varint(number: int) -> bytes:
    """Avro's zig-zag variable-length encoding of a (non-negative) length or count."""
    zigzag, out = number << 1, bytearray()
    while zigzag > 0x7F:
        out.append(zigzag & 0x7F | 0x80)
        zigzag >>= 7
    return bytes([*out, zigzag])


INFLATED_LENGTH: Final = 2_000_000_000
"""A length or count that Avro would allocate without its limits (``cdclake.spark.AVRO_LIMITS``): 2 GB for a
string, 8-16 GB of references for an array, in a 4 GB test driver."""


def avro_inflated_lengths(rng: random.Random, layer: AvroLayer, value: bytes) -> Iterator[tuple[str, bytes]]:
    """The record with the length of one of its strings, bytes, arrays or maps declared as 2,000,000,000.

    Where the length is: the record is written again with that value empty; both encodings agree up to it (an empty
    value's length is the byte 0, a non-empty one's varint never starts with it)."""
    record = _read_record(layer, value)
    if record is None:
        return
    sized = [(p, v) for p in _leaves(record) if p and isinstance(v := _at(record, p), str | bytes | list | dict) and v]
    for path, old in rng.sample(sized, min(len(sized), 4)):
        full, emptied = _written(layer, record), _written(layer, _set(record, path, type(old)()))
        if full is None or emptied is None:  # a record (also a dict) cannot be empty
            continue
        at = next(i for i, (a, b) in enumerate(zip(full, emptied, strict=False)) if a != b)
        length = _varint(len(old.encode() if isinstance(old, str) else old))
        if full[at : at + len(length)] != length or emptied[at] != 0:
            continue  # not where a length is (a record's fields)
        length_end = at + len(length)
        name = "/".join(map(str, path))
        yield (
            f"{name} length {INFLATED_LENGTH:,}",
            layer.prefix + full[:at] + _varint(INFLATED_LENGTH) + full[length_end:],
        )


def avro_byte_mutations(rng: random.Random, value: bytes, prefix: bytes) -> Iterator[tuple[str, bytes]]:
    # A flipped byte may declare a length or count of up to 2**31; Avro's limits (cdclake.spark.AVRO_LIMITS) keep
    # from_avro from allocating it.
    for _ in range(4):
        at = rng.randrange(len(value))
        yield f"byte {at} flipped", value[:at] + bytes([value[at] ^ rng.randrange(1, 256)]) + value[at + 1 :]
    for cut in sorted(rng.sample(range(len(value)), min(3, len(value)))):
        yield f"cut at byte {cut}", value[:cut]
    yield "garbage appended", value + b"\x02\xff\x00garbage"
    yield "first byte 0x01", b"\x01" + value[1:]
    yield "first byte 0xff", b"\xff" + value[1:]
    yield "doubled", value + value
    if prefix[:1] == b"\x00" and len(prefix) == 5:  # Confluent framing: another schema id
        for schema_id in (0, 8, 99, 2**31 - 1, 2**32 - 1):
            yield f"schema id {schema_id}", b"\x00" + schema_id.to_bytes(4, "big") + value[5:]
    if prefix[:2] == b"\xc3\x01":  # Avro single-object framing: another fingerprint, a bare header
        yield "fingerprint flipped", value[:2] + bytes([value[2] ^ 1]) + value[3:]
        yield "header only", prefix
    if value[:5] == b"atMSG":
        yield "magic atMSH", b"atMSH" + value[5:]
    for other in (b"", b"\x00", b"\x00\x00\x00\x00\x01", b"atMSG", b"\xc3\x01", b"{}", bytes(60)):
        yield f"bytes {other!r}", other


def _avro_nested(rng: random.Random, value: bytes) -> Iterator[tuple[str, bytes]]:
    """Qlik Avro: the record inside the envelope's ``message`` (an MD's, written with the envelope's
    ``messageSchema``; a DT's, with the golden cases' data schema), mutated and enveloped again."""
    from tests.formats.avro_cases import QLIK_DATA_SCHEMA, QLIK_ENVELOPE

    envelope = fastavro.schemaless_reader(io.BytesIO(value), QLIK_ENVELOPE, None, True)
    text = envelope["messageSchema"] if envelope["type"] == "MD" else json.dumps(QLIK_DATA_SCHEMA)
    if text is None:
        return
    inner = AvroLayer(b"", fastavro.parse_schema(json.loads(text)))
    nested = [*avro_record_mutations(rng, inner, envelope["message"]), *avro_edge_mutations(inner, envelope["message"])]
    for what, message in nested:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, QLIK_ENVELOPE, {**envelope, "message": message})
        yield f"message {what}", buffer.getvalue()


# ----------------------------------------------------------------------------------------------------------------
# The batch.


@dataclass(frozen=True)
class Message:
    what: str
    key: bytes | None
    value: bytes | None


def mutated_messages(fmt: CdcFormat) -> list[Message]:
    """The format's valid golden messages, each followed by its mutations (the same every run)."""
    rng = random.Random(SEED + zlib.crc32(fmt.name.encode()))
    messages: list[Message] = []
    for line in valid_lines(fmt.name):
        key, value = message_bytes(line)
        case = line["case"][:60]
        messages.append(Message(f"{case}: original", key, value))
        if value is None:
            continue
        mutations: list[tuple[str, bytes | None]] = []
        if fmt.name in AVRO_LAYERS:
            layer = AVRO_LAYERS[fmt.name](value)
            mutations += avro_byte_mutations(rng, value, b"" if layer is None else layer.prefix)
            if layer is not None:
                mutations += avro_record_mutations(rng, layer, value)
                mutations += avro_inflated_lengths(rng, layer, value)
            if fmt.name == "qlik-avro":
                mutations += _avro_nested(rng, value)
            if layer is not None:
                mutations += avro_edge_mutations(layer, value)
        else:
            try:
                document = json.loads(value)
            except ValueError:
                document = None
            if document is not None:
                mutations += json_mutations(rng, document)
                mutations += json_edge_mutations(document)
        messages += [Message(f"{case}: {what}", key, mutated) for what, mutated in mutations]
        messages.append(Message(f"{case}: key dropped", None, value))
        messages.append(Message(f"{case}: key garbage", b"\x00\xff{garbage", value))
    return messages


def _frame(spark: SparkSession, messages: list[Message]) -> DataFrame:
    rows = [(m.key, m.value, TOPIC, 0, offset, None) for offset, m in enumerate(messages)]
    return local_frame(
        spark, rows, "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
    )


def _not_valid_values(events: DataFrame, spark_types: set[str]) -> DataFrame:
    """Per non-error row event: its declared columns whose image value is not valid canonical text of the declared
    type (``model.text_is_valid``), and those whose text does not type (``model.typed_value``), per image."""
    columns = F.coalesce(F.col(model.COLUMNS), F.array().cast(f"array<{model.COLUMN_TYPE.simpleString()}>"))

    def invalid(values: Column) -> Column:
        return F.filter(columns, lambda c: ~model.text_is_valid(values[c["name"]], c["spark_type"]))["name"]

    def untyped(values: Column, spark_type: str) -> Column:
        return F.filter(
            columns,
            lambda c: (
                (c["spark_type"] == spark_type)
                & values[c["name"]].isNotNull()
                & model.typed_value(values[c["name"]], spark_type).isNull()
            ),
        )["name"]

    out = []
    for image in (model.AFTER, model.BEFORE):
        values = F.col(image)
        typed = [untyped(values, t) for t in sorted(spark_types) if model.is_supported_spark_type(t)]
        out.append(F.when(values.isNotNull(), invalid(values)).alias(f"invalid_{image}"))
        out.append(
            F.when(values.isNotNull(), F.flatten(F.array(*typed, F.array().cast("array<string>")))).alias(
                f"untyped_{image}"
            )
        )
    row_ops = F.col(model.OP).isin(*(o.value for o in model.ROW_OPS))
    return events.where(F.col(model.ERROR).isNull() & row_ops).select(model.OFFSET, model.SUB_INDEX, *out)


FORMATS = list_formats()


@pytest.mark.spark
@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_mutated_messages_become_events_or_dead_letters(spark, fmt: CdcFormat) -> None:
    messages = mutated_messages(fmt)
    assert len(messages) > 100, "too few mutations: the golden cases lost their valid messages?"
    problems = decode_problems(spark, fmt, messages)
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])


def decode_problems(spark: SparkSession, fmt: CdcFormat, messages: list[Message]) -> list[str]:
    """What is wrong with the events of ``messages`` decoded in one batch (an exception fails the test)."""
    # One batch and one action for the decode; the checks read its local checkpoint (AGENTS.md, "Tests").
    events = decode_batch(fmt, _frame(spark, messages), golden_options(fmt.name)).localCheckpoint(eager=True)
    rows = events.select(
        model.OFFSET,
        model.SUB_INDEX,
        model.FORMAT,
        model.OP,
        model.TABLE,
        model.ERROR,
        model.RAW_VALUE,
        model.COLUMNS,
        model.AFTER,
        model.BEFORE,
        model.KEY_COLUMNS,
    ).collect()

    problems: list[str] = []
    by_offset: dict[int, list[Any]] = {}
    for row in rows:
        by_offset.setdefault(row[model.OFFSET], []).append(row)
    spark_types: set[str] = set()
    for offset, message in enumerate(messages):
        where = f"offset {offset} ({message.what})"
        found = by_offset.get(offset, [])
        if not found:
            problems.append(f"{where}: no event, no dead letter")
        for event in found:
            problem = _event_problem(fmt, message, event)
            if problem:
                problems.append(f"{where}: {problem}")
            if event[model.ERROR] is None and event[model.COLUMNS]:
                spark_types.update(c["spark_type"] for c in event[model.COLUMNS])
    for row in _not_valid_values(events, spark_types).collect():
        for name in ("invalid_after", "untyped_after", "invalid_before", "untyped_before"):
            if row[name]:
                where = f"offset {row[model.OFFSET]} ({messages[row[model.OFFSET]].what})"
                problems.append(f"{where}: {name.replace('_', ' ')} values of {row[name]} (not a dead letter)")
    return problems


def _event_problem(fmt: CdcFormat, message: Message, event: Any) -> str | None:
    if event[model.FORMAT] != fmt.name:
        return f"format {event[model.FORMAT]!r}"
    if event[model.RAW_VALUE] != message.value:
        return "the event does not keep the message's bytes"
    error = event[model.ERROR]
    if error is not None:
        return None if error.strip() else "an empty error"
    op = event[model.OP]
    if op not in {o.value for o in Op}:
        return f"no error, and op {op!r}"
    if op in model.ROW_OPS or op == Op.TRUNCATE:
        table = event[model.TABLE]
        if not table:
            return f"no error, and {op} without a table"
    if op in model.ROW_OPS:
        columns = event[model.COLUMNS] or []
        unsupported = [c["spark_type"] for c in columns if not model.is_supported_spark_type(c["spark_type"] or "")]
        if unsupported:
            return f"no error, and declared types {unsupported} canonical text cannot carry"
        names = {c["name"] for c in columns}
        for image in (model.AFTER, model.BEFORE):
            extra = set(event[image] or {}) - names
            if extra:
                return f"no error, and {image} columns {sorted(extra)} not declared"
        if not set(event[model.KEY_COLUMNS] or []) <= names:
            return "no error, and key columns not declared"
    return None


def test_mutations_are_deterministic() -> None:
    fmt = next(f for f in FORMATS if f.name == "canal-json")
    assert mutated_messages(fmt) == mutated_messages(fmt)


def test_json_writer_says_what_python_cannot() -> None:
    document = Dup((("a", Raw("1e400")), ("a", Raw(r'"\ud800"')), ("b", [{"c": None}])))
    assert dumps(document) == '{"a":1e400,"a":"\\ud800","b":[{"c":null}]}'
    assert base64.b64encode(dumps({"é": "🚀"}).encode()) == base64.b64encode('{"é":"🚀"}'.encode())
