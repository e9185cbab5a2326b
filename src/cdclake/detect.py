"""``--format auto``: recognise a JSON format from sample messages (shared/formats/README.md, "Recognition").

Runs on the driver over a handful of messages, never per message in the stream. Binary formats cannot be sniffed
safely and must be named. The Canal family (open-source Canal, DTS Canal JSON, DRS JSON and JSON-C) shares one
layout that cannot be told apart reliably: detection stops and lists the candidates.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from cdclake.exceptions import InputError
from cdclake.formats import list_formats

CANAL_FAMILY = ("canal-json", "dts-canal-json", "drs-json-mysql", "drs-jsonc-mysql")


def _is_canal_shaped(message: Any) -> bool:
    return isinstance(message, dict) and {"isDdl", "type", "es"} <= message.keys()


def detect_format(samples: Iterable[bytes | str]) -> str:
    """The single registered format whose ``sniff`` accepts every parseable sample; raises :class:`InputError`."""
    parsed = []
    for sample in samples:
        text = sample.decode("utf-8", "replace") if isinstance(sample, bytes) else sample
        try:
            parsed.append(json.loads(text))
        except ValueError:
            continue
    if not parsed:
        raise InputError("--format auto: no JSON message among the samples; name the format with --format")
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


def sample_lines(paths: Iterable[str], encoding: str, limit: int = 20) -> list[bytes]:
    """Up to ``limit`` non-empty messages from the start of the capture files."""
    import base64

    samples: list[bytes] = []
    for path in paths:
        with open(path, "rb") as handle:
            for line in handle:
                if line.strip():
                    samples.append(base64.b64decode(line.strip(), validate=False) if encoding == "b64" else line)
                if len(samples) >= limit:
                    return samples
    return samples
