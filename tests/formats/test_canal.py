"""Canal-family quirks that golden cases (decoded with default options) cannot show."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql.types import ArrayType, DataType, MapType, StructType, _parse_datatype_json_string

from cdclake.formats import get_format
from tests.conftest import SHARED
from tests.formats.golden import messages_frame, read_jsonl

EXAMPLES = SHARED / "formats" / "examples"


def _decode(spark: Any, name: str, values: list[dict[str, Any]], options: dict[str, str]) -> list[dict[str, Any]]:
    lines = [{"case": str(i), "key": None, "value": v} for i, v in enumerate(values)]
    rows = get_format(name).decode(messages_frame(spark, lines), options).orderBy("offset", "sub_index").collect()
    return [r.asDict(recursive=True) for r in rows]


@pytest.mark.spark
def test_dts_legacy_swap_reads_update_old_as_after(spark) -> None:
    """dts.md section 2: pre-2022-03-20 instances send UPDATE data = before, old = after."""
    examples = {line["case"]: line["value"] for line in read_jsonl(EXAMPLES / "dts-canal-json.jsonl")}
    legacy_update = next(v for c, v in examples.items() if c.startswith("UPDATE, legacy"))
    legacy_delete = next(v for c, v in examples.items() if c.startswith("DELETE, legacy"))
    for option in ("legacy_old_data_swap", "legacy_swap"):
        update, delete = _decode(spark, "dts-canal-json", [legacy_update, legacy_delete], {option: "true"})
        assert update["error"] is None
        assert delete["error"] is None
        assert update["before"]["price"] == "18.50"
        assert update["after"]["price"] == "16.00"
        assert update["after"]["memo"] == "促销"
        assert delete["op"] == "DELETE"
        assert delete["before"]["id"] == "3001"
    (current,) = _decode(spark, "dts-canal-json", [legacy_update], {})
    assert current["before"]["price"] == "16.00"
    assert current["after"]["price"] == "18.50"


@pytest.mark.spark
def test_source_timezone_applies_to_wall_clock_timestamps(spark) -> None:
    message = {
        "data": [{"id": "1", "seen": "2024-03-01 18:15:31.5"}],
        "database": "shop",
        "es": 1709288131000,
        "id": 1,
        "isDdl": False,
        "mysqlType": {"id": "bigint(20)", "seen": "timestamp(1)"},
        "old": None,
        "pkNames": ["id"],
        "sql": "",
        "sqlType": {"id": -5, "seen": 93},
        "table": "t",
        "ts": 1709288131000,
        "type": "INSERT",
    }
    (utc,) = _decode(spark, "canal-json", [message], {})
    (shanghai,) = _decode(spark, "canal-json", [message], {"source_timezone": "Asia/Shanghai"})
    (offset,) = _decode(spark, "canal-json", [message], {"source_timezone": "+08:00"})
    assert utc["after"]["seen"] == "1709316931500000"
    assert shanghai["after"]["seen"] == offset["after"]["seen"] == "1709288131500000"


def test_bad_options_are_rejected_before_any_message() -> None:
    with pytest.raises(ValueError, match="source_timezone"):
        get_format("canal-json").decode(None, {"source_timezone": "Mars/Olympus"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="legacy_old_data_swap"):
        get_format("dts-canal-json").decode(None, {"legacy_old_data_swap": "yes"})  # type: ignore[arg-type]


def test_sniff() -> None:
    """README "Recognition": the Canal family cannot be sniffed; SharePlex is meta.op + data."""
    for name in ("canal-json", "dts-canal-json", "drs-json-mysql", "drs-jsonc-mysql", "drs-json-relational"):
        assert get_format(name).sniff is None
    sniff = get_format("dts-shareplex-json").sniff
    assert sniff is not None
    for line in read_jsonl(EXAMPLES / "dts-shareplex-json.jsonl"):
        assert sniff(line["value"])
    for line in read_jsonl(EXAMPLES / "canal-flat.jsonl"):
        assert not sniff(line["value"])
    assert not sniff(json.loads('{"meta": {"op": 1}, "data": {}}'))


CANAL_FAMILY = ("canal-json", "dts-canal-json", "drs-json-mysql", "drs-jsonc-mysql", "drs-json-relational")


def _holds_row_images(data_type: DataType) -> bool:
    """Whether a value of ``data_type`` holds an array of row images (maps), as a message's row arrays do."""
    if isinstance(data_type, ArrayType):
        element = data_type.elementType
        return _holds_map(element) or _holds_row_images(element)
    if isinstance(data_type, StructType):
        return any(_holds_row_images(f.dataType) for f in data_type.fields)
    return False


def _holds_map(data_type: DataType) -> bool:
    if isinstance(data_type, MapType):
        return True
    if isinstance(data_type, StructType):
        return any(_holds_map(f.dataType) for f in data_type.fields)
    return isinstance(data_type, ArrayType) and _holds_map(data_type.elementType)


def _carried_through_explodes(plan: Any) -> list[tuple[str, DataType]]:
    """(name, type) of every column that a ``Generate`` (explode) node of ``plan`` copies into each of its rows."""
    carried: list[tuple[str, DataType]] = []
    if plan.getClass().getSimpleName() == "Generate":
        required = plan.requiredChildOutput()
        for i in range(required.size()):
            attribute = required.apply(i)
            carried.append((attribute.name(), _parse_datatype_json_string(attribute.dataType().json())))
    children = plan.children()
    for i in range(children.size()):
        carried += _carried_through_explodes(children.apply(i))
    return carried


@pytest.mark.spark
@pytest.mark.parametrize("format_name", CANAL_FAMILY)
def test_a_message_s_rows_are_exploded_without_the_message_s_row_arrays(spark, format_name: str) -> None:
    """Spark copies every column an explode carries into each row it makes. A message of n rows that carried its
    parsed self or its `data`/`old` arrays through the explode cost O(n^2): 50,000 rows in messages of 1,000 rows
    decoded in 17 s against 2 s in messages of 100. Only the message's scalars, its type maps (one entry per
    column) and its raw bytes may go through; each row gets its own `data`/`old` entries from the explode itself."""
    examples = read_jsonl(EXAMPLES / get_format(format_name).examples[0])
    frame = get_format(format_name).decode(messages_frame(spark, examples), {})
    carried = _carried_through_explodes(frame._jdf.queryExecution().optimizedPlan())
    assert carried, "the decoder explodes no rows: this test no longer looks at the right plan"
    assert [name for name, data_type in carried if _holds_row_images(data_type)] == []
    # The plan still decodes: every example message gives its events (the golden cases check their values).
    assert frame.count() >= len(examples)
