"""``--format auto``: recognise a format from sample messages (shared/formats/README.md, "Recognition").

Runs on the driver over a handful of messages, never per message in the stream. Binary messages are told by their
first bytes (rule 2): ``atMSG`` is a Qlik Avro envelope, ``C3 01`` and DRS's schema fingerprint a DRS Avro
single-object message. A first byte ``0x00`` is Confluent's framing (Debezium through a schema registry) or DTS Avro
(its first byte): detection stops and lists both. Other binary messages (DRS Avro without the header) must be
named. JSON messages go by their keys (rule 3); the Canal family (open-source Canal, DTS Canal JSON, DRS JSON and
JSON-C) shares one layout that cannot be told apart reliably: detection stops and lists the candidates.
"""

from __future__ import annotations

import base64
import bz2
import gzip
import io
import json
from collections.abc import Iterable
from typing import Any

from cdclake.exceptions import InputError
from cdclake.formats import debezium_avro, drs_avro, list_formats, qlik
from cdclake.sources import files

CANAL_FAMILY = ("canal-json", "dts-canal-json", "drs-json-mysql", "drs-jsonc-mysql")
ZERO_FIRST_BYTE = ("debezium-avro", "dts-avro")
"""Formats whose messages start with the byte 0x00 (README "Recognition": they cannot be told apart by it)."""

# README "Recognition" rule 2: leading bytes -> the formats they may be.
_LEADING_BYTES: tuple[tuple[bytes, tuple[str, ...]], ...] = (
    (qlik.MAGIC.encode("ascii"), ("qlik-avro",)),
    (b"\xc3\x01" + drs_avro.FINGERPRINT, ("drs-avro",)),
    (debezium_avro.MAGIC, ZERO_FIRST_BYTE),
)


def _binary_candidates(sample: bytes) -> tuple[str, ...] | None:
    """The formats a message with these leading bytes may be, or None when they name none."""
    return next((formats for leading, formats in _LEADING_BYTES if sample.startswith(leading)), None)


def _is_canal_shaped(message: Any) -> bool:
    return isinstance(message, dict) and {"isDdl", "type", "es"} <= message.keys()


def detect_format(samples: Iterable[bytes | str]) -> str:
    """The single registered format that every sample is in: told by its leading bytes (binary) or by the format's
    ``sniff`` (JSON, every parseable sample); raises :class:`InputError` naming the candidates when there is none."""
    messages = [s.encode("utf-8") if isinstance(s, str) else s for s in samples]
    parsed = []
    for sample in messages:
        try:
            parsed.append(json.loads(sample.decode("utf-8", "replace")))
        except ValueError:
            continue
    binary = {formats for formats in map(_binary_candidates, messages) if formats}
    if binary:
        return _binary_format(binary, with_json=bool(parsed))
    if not parsed:
        raise InputError(
            "--format auto: no JSON message among the samples, nor the leading bytes of a binary format (DRS Avro "
            "without its single-object header has none); name the format with --format"
        )
    if all(_is_canal_shaped(m) for m in parsed):
        known = {f.name for f in list_formats()}
        candidates = [name for name in CANAL_FAMILY if name in known] or list(CANAL_FAMILY)
        raise InputError(
            "--format auto: these are Canal-family messages, which cannot be told apart reliably; "
            f"name one of: {', '.join(candidates)}"
        )
    matching = [f.name for f in list_formats() if f.sniff is not None and all(f.sniff(m) for m in parsed)]
    if len(matching) == 1:
        return matching[0]
    if not matching:
        raise InputError("--format auto: no registered format recognises these messages; see `cdclake formats`")
    raise InputError(f"--format auto: several formats match ({', '.join(matching)}); name one with --format")


def _binary_format(candidates: set[tuple[str, ...]], with_json: bool) -> str:
    """The format of samples of which some start with the leading bytes of ``candidates`` (``with_json``: others are
    JSON). Samples with no known leading bytes may be the same format (DRS Avro without the single-object header)."""
    if with_json or len(candidates) > 1:
        found = sorted({name for formats in candidates for name in formats} | ({"JSON"} if with_json else set()))
        raise InputError(
            f"--format auto: the samples are not all in one format (they look like {', '.join(found)}); "
            "name the format with --format"
        )
    (formats,) = candidates
    if len(formats) == 1:
        return formats[0]
    raise InputError(
        "--format auto: these messages start with the byte 0x00, which is Confluent's schema-registry framing "
        f"and DTS Avro's first byte alike; name one of: {', '.join(formats)}"
    )


def sample_lines(paths: Iterable[str], encoding: str, limit: int = 20) -> list[bytes]:
    """Up to ``limit`` non-empty messages from the start of the capture files (records without a value left out)."""
    samples: list[bytes] = []
    for path in paths:
        if files.is_uri(path):
            raise InputError(
                f"--format auto reads the first lines of files on this machine; name the format for {path}"
            )
        with _open_capture(path) as handle:
            for line in handle:
                if line.strip() and (message := _message_of_line(line, encoding)) is not None:
                    samples.append(message)
                if len(samples) >= limit:
                    return samples
    return samples


def _open_capture(path: str) -> io.BufferedIOBase:
    """A capture file for reading, decompressed as Spark's text reader decompresses it (by the name's suffix)."""
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".bz2"):
        return bz2.open(path, "rb")
    return open(path, "rb")


def _message_of_line(line: bytes, encoding: str) -> bytes | None:
    """The message a capture line holds, read as ``cdclake.sources.files`` reads it (here on the driver, for a
    handful of samples: exact number text does not matter to recognition)."""
    if encoding == "b64":
        return base64.b64decode(line.strip(), validate=False)
    if encoding != "records":
        return line
    try:
        record = json.loads(line)
    except ValueError:
        return line
    if not isinstance(record, dict) or not {*files.VALUE_FIELDS, *files.KEY_FIELDS} & record.keys():
        return line
    for name in files.VALUE_FIELDS:
        value = record.get(name)
        if value is None:
            continue
        if name.endswith("_b64") and isinstance(value, str):
            return base64.b64decode(value, validate=False)
        return value.encode("utf-8") if isinstance(value, str) else json.dumps(value).encode("utf-8")
    return None
