"""Avro pieces the vendor Avro renderers share (``drs-avro``, ``dts-avro``): schema records, a schemaless writer
that parses its schema once, and the ``Integer value 'abc'`` malformed image.

Each renderer still spells out its own vendor schema from its spec; only the mechanics are here. Not a renderer
itself (the leading underscore keeps :func:`cdclake.workload.renderers.renderers` from importing it as one).
"""

from __future__ import annotations

import copy
import io
import random
from typing import Any


def record_schema(name: str, *fields: tuple[str, Any]) -> dict[str, Any]:
    """An Avro record schema ``name`` with ``(field name, type)`` fields."""
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}


class SchemalessWriter:
    """Avro binary of single records of one schema, without container or framing (the schema is parsed on first
    use: fastavro is needed by the workload generator only, decoding never imports it)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self._schema = schema
        self._parsed: Any = None

    def write(self, record: dict[str, Any], header: bytes = b"") -> bytes:
        """``header`` followed by the Avro binary of ``record``."""
        import fastavro

        if self._parsed is None:
            self._parsed = fastavro.parse_schema(copy.deepcopy(self._schema))
        buffer = io.BytesIO()
        buffer.write(header)
        fastavro.schemaless_writer(buffer, self._parsed, record)
        return buffer.getvalue()


def spoil_integer(image: list[Any], rng: random.Random, namespace: str) -> bool:
    """Replaces a random ``Integer`` value of a row image (``(name, value)`` union branches) by one whose text is
    ``abc``; False if the image has no ``Integer`` value."""
    integers = [i for i, v in enumerate(image) if isinstance(v, tuple) and v[0].endswith(".Integer")]
    if not integers:
        return False
    image[rng.choice(integers)] = (f"{namespace}.Integer", {"precision": 8, "value": "abc"})
    return True
