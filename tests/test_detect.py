"""`--format auto`: JSON formats recognised from samples; the Canal family refused with its candidates."""

from __future__ import annotations

import json

import pytest

from cdclake.detect import detect_format
from cdclake.exceptions import InputError
from tests.conftest import SHARED


def _values(file_name: str) -> list[bytes]:
    lines = (SHARED / "formats" / "examples" / file_name).read_text(encoding="utf-8").splitlines()
    return [json.dumps(json.loads(line)["value"]).encode() for line in lines if json.loads(line)["value"] is not None]


def test_dataworks_is_recognised() -> None:
    assert detect_format(_values("dataworks-json.jsonl")) == "dataworks-json"


def test_canal_family_lists_the_candidates() -> None:
    with pytest.raises(InputError) as info:
        detect_format(_values("canal-flat.jsonl"))
    message = str(info.value)
    assert "canal-json" in message
    assert "drs-json-mysql" in message


def test_nothing_recognisable() -> None:
    with pytest.raises(InputError, match="no JSON message"):
        detect_format([b"\x00\x01binary", b"not json"])
    with pytest.raises(InputError, match="no registered format"):
        detect_format([b'{"hello": "world"}'])
