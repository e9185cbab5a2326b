"""No format lands without golden cases for what it does, and every registry name resolves."""

from __future__ import annotations

import pytest

from cdclake.exceptions import UnknownFormatError
from cdclake.formats import get_format, list_formats
from cdclake.model import Op
from tests.formats.golden import scenarios

REQUIRED = {"insert", "delete", "malformed"}


@pytest.mark.parametrize("fmt", list_formats(), ids=lambda f: f.name)
def test_format_has_golden_cases_for_every_kind_of_operation(fmt) -> None:
    have = set(scenarios(fmt.name))
    required = set(REQUIRED)
    ops = set(fmt.operations.values())
    if Op.UPDATE in ops:
        required.add("update*")
    if Op.DDL in ops or Op.TRUNCATE in ops:
        required.add("ddl")
    if Op.HEARTBEAT in ops or Op.TXN_BEGIN in ops:
        required.add("heartbeat")
    if Op.UPSERT in ops:
        required.add("snapshot")
    missing = {r for r in required if not any(s == r or (r.endswith("*") and s.startswith(r[:-1])) for s in have)}
    assert not missing, f"{fmt.name} lacks golden scenarios {sorted(missing)}"


def test_unknown_format_lists_known_names() -> None:
    with pytest.raises(UnknownFormatError) as info:
        get_format("no-such-format")
    assert "dataworks-json" in str(info.value)
    assert info.value.known == sorted(f.name for f in list_formats())
