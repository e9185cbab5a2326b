"""Writes ``<scenario>.expected.jsonl`` from the current decoder: ``python -m tests.formats.regenerate_golden NAME``.

Only for a new scenario or a deliberate change: read the diff of every rewritten file before committing it.
"""

from __future__ import annotations

import json
import sys

from cdclake.formats import decode_batch, get_format
from cdclake.spark import get_session
from tests.formats.golden import CASES, canonical_rows, golden_options, messages_frame, read_jsonl, scenarios


def main(names: list[str]) -> None:
    spark = get_session("cdclake-golden", master="local[2]")
    for name in names:
        fmt = get_format(name)
        for scenario in scenarios(name):
            lines = read_jsonl(CASES / name / f"{scenario}.input.jsonl")
            rows = canonical_rows(decode_batch(fmt, messages_frame(spark, lines), golden_options(name)))
            target = CASES / name / f"{scenario}.expected.jsonl"
            target.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))
            print(f"wrote {target} ({len(rows)} events)")


if __name__ == "__main__":
    import os
    import time

    os.environ["TZ"] = "UTC"
    time.tzset()
    main(sys.argv[1:])
