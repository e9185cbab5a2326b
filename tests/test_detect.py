"""`--format auto`: formats recognised from samples (JSON by their keys, binary by their leading bytes); the Canal
family and the formats whose messages start with 0x00 refused with their candidates."""

from __future__ import annotations

import base64
import json

import pytest

from cdclake.detect import detect_format, sample_lines
from cdclake.exceptions import InputError
from tests.conftest import SHARED
from tests.formats.golden import CASES, message_bytes, read_jsonl


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
        detect_format([b"\x01\x02binary", b"not json"])
    with pytest.raises(InputError, match="no registered format"):
        detect_format([b'{"hello": "world"}'])


def _binary_values(format_name: str, scenario: str) -> list[bytes]:
    """The binary values of a golden scenario (``value_avro_b64``), as the format's topic carries them."""
    lines = read_jsonl(CASES / format_name / scenario)
    return [value for value in (message_bytes(line)[1] for line in lines) if value is not None]


def test_binary_formats_are_recognised_by_their_leading_bytes() -> None:
    assert detect_format(_binary_values("qlik-avro", "replay/input.jsonl")) == "qlik-avro"  # atMSG
    # DRS Avro: messages with the single-object header (C3 01 + fingerprint) and without it, in one capture.
    drs = _binary_values("drs-avro", "replay/input.jsonl")
    assert {value[:2] for value in drs} == {b"\xc3\x01", b"\x061"}
    assert detect_format(drs) == "drs-avro"


@pytest.mark.parametrize("format_name", ["debezium-avro", "dts-avro"])
def test_a_first_byte_0x00_lists_both_formats_that_start_with_it(format_name: str) -> None:
    with pytest.raises(InputError) as info:
        detect_format(_binary_values(format_name, "replay/input.jsonl"))
    message = str(info.value)
    assert "debezium-avro" in message
    assert "dts-avro" in message


def test_samples_in_two_formats_are_refused() -> None:
    qlik = _binary_values("qlik-avro", "replay/input.jsonl")
    with pytest.raises(InputError, match=r"not all in one format .*JSON, qlik-avro"):
        detect_format(qlik + _values("dataworks-json.jsonl"))
    with pytest.raises(InputError, match=r"not all in one format .*drs-avro, qlik-avro"):
        detect_format(qlik + _binary_values("drs-avro", "replay/input.jsonl"))


def test_a_base64_capture_file_is_sampled_as_its_messages(tmp_path) -> None:
    """`cdclake replay --format auto --input-encoding b64` reads the first messages of the capture the same way."""
    capture = tmp_path / "qlik.b64"
    values = _binary_values("qlik-avro", "replay/input.jsonl")
    capture.write_bytes(b"".join(base64.b64encode(value) + b"\n" for value in values))
    samples = sample_lines([str(capture)], "b64", limit=3)
    assert samples == values[:3]
    assert detect_format(samples) == "qlik-avro"
