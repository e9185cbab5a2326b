"""Every format's workload renderer, end to end: a seeded source history with its traps (re-sends, malformed
messages, transactions, partial updates, primary-key updates, a key-less table, an Oracle-style table, a truncate, an
added column) is rendered in the format, replayed through ``replay`` in two batches, and the lake read back by
delta-rs must equal the source truth cell by cell (after the renderer's documented format limits,
``RenderedStream.expected``). For the formats of :data:`WITH_SCD2` so must the live rows of an SCD2 history table,
which is built from every change instead of the folded ones (all 17 formats pass this, key updates included, in
Delta and Iceberg lakes: 34 streams in 681 s on 2 cores, 2026-12-05; the suite keeps a sample for its time).

Primary-key updates come in every shape the formats send them: OGG's key and changed columns, Qlik's column masks,
DTS's unlogged LOBs (partial images), Debezium's delete and create with their key headers (and unavailable BLOBs on
the delete), MongoDB's delete and insert, DataWorks' split update (the old key's half, then the new key's); chains of
moves in one batch, re-sent copies, old keys taken again. On the code before key changes were made whole, the OGG,
Qlik and DTS streams left NULLs in the moved rows' missing columns, and DataWorks' SCD2 table kept the old keys live.

This is the unseen-stream check of each format: the renderers are written from the specs, independently of the
decoders' golden cases.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cdclake.formats import list_formats
from cdclake.workload import SourceHistory, render_stream, renderers
from tests.e2e.helpers import RENDERED_HISTORY, RENDERED_SHAPE, assert_tables_equal_truth, replay_in_two_batches

pytestmark = pytest.mark.spark


WITH_SCD2 = {"dataworks-json", "dts-avro", "lindorm-debezium", "ogg-json", "qlik-json"}
"""Truncates sent as DDL text (DTS Avro, as DRS Avro does), partial images (OGG, and Qlik JSON's column masks;
SharePlex's are the same canonical partial images once decoded), key changes from partial images, whose versions take
the old key's columns too, DataWorks' split updates, whose halves hold different keys, and missing NULL cells
(Lindorm): the streams where an SCD2 table differs most from a folded MERGE. Each SCD2 table costs a rendered stream
about 10-15 s on 2 cores."""

NOT_YET_RENDERED: set[str] = set()
"""Formats whose workload renderer is still open work (tracked in the formats issue). Adding a renderer must remove
its format from here, and a new format must come with a renderer."""


def test_every_format_has_a_renderer() -> None:
    missing = {fmt.name for fmt in list_formats()} - set(renderers())
    assert missing == NOT_YET_RENDERED, f"formats without a workload renderer (cdclake.workload.<format>): {missing}"


@pytest.mark.parametrize("format_name", sorted(renderers()))
def test_rendered_stream_replays_to_the_source_truth(spark, tmp_path: Path, format_name: str) -> None:
    history = SourceHistory.generate(RENDERED_HISTORY)
    stream = render_stream(format_name, history, RENDERED_SHAPE, seed=5)
    lake, results = replay_in_two_batches(spark, tmp_path, stream, format_name, scd2=format_name in WITH_SCD2)
    captured = sum(1 for m in stream.messages if m.value is not None)

    assert len(results) == 2
    assert sum(r.messages for r in results) >= captured - RENDERED_SHAPE.malformed
    malformed = sum(1 for m in stream.messages if m.is_malformed)
    assert sum(r.dead_letters for r in results) == malformed
    truth = stream.expected_truth(history)
    comparison = assert_tables_equal_truth(lake, truth, spark=spark, scd2=format_name in WITH_SCD2, label=format_name)
    assert sum(r.actual_rows for r in comparison) > 0
