"""Smoke test of the benchmark harness (``python -m benchmarks``): the decode benchmark on a tiny workload prints
its target line in the agreed shape, writes RESULTS.md and a valid PNG; the plot and memory helpers work alone."""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Row

from benchmarks import plot
from benchmarks.__main__ import main
from benchmarks.decode import baseline_frame
from benchmarks.memory import PeakSampler, driver_rss
from benchmarks.report import TARGET_LINE
from benchmarks.workload import Workload, WorkloadSpec, materialize, message_frame
from cdclake import model
from cdclake.formats import decode_batch, get_format


@pytest.mark.spark
def test_decode_benchmark_prints_target_lines(spark, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--quick", "--only", "decode", "--formats", "dataworks-json", "--decode-events", "150"]
    code = main([*argv, "--decode-repeats", "1", "--results", str(tmp_path)], spark=spark)

    assert code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("target ")]
    assert len(lines) == 1
    match = TARGET_LINE.match(lines[0])
    assert match is not None, lines[0]
    assert match.group(1) == "decode_ratio.dataworks-json"
    assert float(match.group(2)) > 0
    assert match.group(3) == ">= 0.9"
    results = (tmp_path / "RESULTS.md").read_text()
    assert lines[0] in results
    assert (tmp_path / "results.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_png_is_well_formed() -> None:
    data = plot.render([plot.Panel("T", [plot.Bar("a", [(1.0, "baseline"), (2.0, "merge")], "3.0")], ["merge"], 2.5)])
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, chunks = 8, {}
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind, body = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert crc == zlib.crc32(kind + body)
        chunks[kind] = body
        offset += 12 + length
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    assert len(zlib.decompress(chunks[b"IDAT"])) == height * (1 + 3 * width)


def test_target_line_shape() -> None:
    assert TARGET_LINE.match("target e2e_merge_vs_append: 0.62 (goal >= 0.5) PASS")
    assert TARGET_LINE.match("target driver_peak_rss: 2.10 GiB (goal <= 4 GiB) FAIL")
    assert not TARGET_LINE.match("target x: 1 goal >= 2 PASS")


def test_memory_sampler_sees_this_process() -> None:
    with PeakSampler(interval=0.01) as sampler:
        pass
    assert sampler.peak >= driver_rss() // 2 > 0


@pytest.mark.spark
def test_the_lake_size_benchmarks_print_a_row_of_figures_per_size(
    spark, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m benchmarks.gate`` and ``benchmarks.key_ranges`` on tiny sizes: one table row per size, every figure
    a positive number, and the scratch lake removed."""
    from benchmarks import gate, key_ranges

    gate.main(["--tombstones", "200,2000", "--changes", "50", "--repeats", "1", "--out", str(tmp_path)], spark=spark)
    key_ranges.main(
        ["--rows", "20000", "--files", "4", "--changes", "200", "--batches", "1", "--out", str(tmp_path)], spark=spark
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[0] for row in rows] == ["| 200", "| 2,000", "| 20,000"]
    for row in rows:
        cells = [cell.strip().removesuffix("x") for cell in row.strip("| ").split("|")[1:]]
        figures = [float(value) for cell in cells for value in cell.split(" / ")]
        assert len(figures) >= 4, row
        assert all(value > 0 for value in figures), row
    assert list(tmp_path.iterdir()) == []


@pytest.mark.spark
def test_the_deletion_vectors_benchmark_prints_a_row_of_figures_per_size(
    spark, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m benchmarks.deletion_vectors`` on tiny sizes: per size, the table's size, what copy-on-write
    rewrote, positive timings of both ways, and auto's decision (copy-on-write: such tables rewrite far too little)."""
    from benchmarks import deletion_vectors

    argv = ["--rows", "60000,120000", "--files", "2", "--changes", "100", "--batches", "1", "--out", str(tmp_path)]
    deletion_vectors.main(argv, spark=spark)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[0] for row in rows] == ["| 60,000", "| 120,000"]
    for row in rows:
        cells = [cell.strip() for cell in row.strip("| ").split("|")]
        assert float(cells[2].removesuffix(" MiB")) > 0, row  # each MERGE updated rows of the compacted file
        timings = [float(value) for cell in cells[3:6] for value in cell.split(" / ")]
        assert len(timings) == 5, row
        assert all(value > 0 for value in timings), row
        assert cells[6] == "copy-on-write", row
    assert list(tmp_path.iterdir()) == []


@pytest.mark.spark
def test_the_shards_benchmark_compares_both_ways_on_the_same_rows(
    spark, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import shards

    argv = ["--shards", "2", "--messages", "300", "--batch", "300", "--repeats", "1", "--history"]
    shards.main([*argv, "--out", str(tmp_path)], spark=spark)  # fails if the lakes or their history tables differ
    out = capsys.readouterr().out.splitlines()
    runs = [line for line in out if line.startswith("repeat 0 ")]
    assert len(runs) == 2
    assert len({line.rsplit(", ", 1)[1] for line in runs}) == 1  # the same rows both ways
    assert all(float(line.split("history step ")[1].split(" s")[0]) > 0 for line in runs)
    assert out[-1].startswith("one MERGE per batch / one per shard: ")
    assert ", history step " in out[-1]


@pytest.mark.spark
def test_the_soak_benchmark_samples_the_driver_and_checks_the_lake(
    spark, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import soak

    soak.main(["--batches", "3", "--batch", "10", "--every", "1", "--out", str(tmp_path / "soak")], spark=spark)
    out = capsys.readouterr().out.splitlines()
    rows = [line.split("|")[1:-1] for line in out if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) >= 3
    for cells in rows:
        heap, classes, compilations, stored, rss, mean = (float(c.strip().replace(",", "")) for c in cells[1:])
        assert min(heap, classes, rss, mean) > 0, cells
        assert min(compilations, stored) >= 0, cells
    assert [int(cells[0]) for cells in rows] == list(range(len(rows)))  # --every 1: a row after each batch
    assert out[-1].startswith("batches ")
    assert out[-1].endswith("the lake equals the source truth")
    assert not (tmp_path / "soak").exists()


def _baseline_and_decoded(
    spark: Any, tmp_path: Path, format_name: str
) -> tuple[Workload, str, dict[int, Row], dict[int, Row]]:
    """A small workload of ``format_name`` (120 events over 3 tables), its decode baseline's description, and the
    baseline's rows and the decoder's events, each by Kafka offset."""
    workload = materialize(WorkloadSpec(format=format_name, events=120, tables=3, keys_per_table=30), tmp_path)
    messages = message_frame(spark, workload.path)
    try:
        baseline, description = baseline_frame(spark, messages, format_name, workload.format_options)
        events = decode_batch(get_format(format_name), messages, workload.format_options).localCheckpoint()
        rows = {row["offset"]: row for row in baseline.collect()}
        decoded = {row[model.OFFSET]: row for row in events.collect()}
    finally:
        messages.unpersist()
    return workload, description, rows, decoded


@pytest.mark.spark
def test_the_qlik_avro_decode_baseline_reads_each_data_message_s_own_record(spark, tmp_path: Path) -> None:
    """A Qlik Avro DT message's row values are in its inner record (written with its MD message's dataSchema), so the
    hand-written parse the decoder is measured against reads that record too, not the envelope alone."""
    workload, description, rows, decoded = _baseline_and_decoded(spark, tmp_path, "qlik-avro")

    assert "per data schema id (3)" in description
    assert len(rows) == workload.messages == len(decoded)  # every message once, none lost by the per-id branches
    data = [offset for offset, event in decoded.items() if event[model.OP] != model.Op.DDL]
    assert len(data) == workload.messages - 3  # one MD message per table
    for offset in data:
        event, leaves = decoded[offset], rows[offset].asDict()
        assert event[model.ERROR] is None
        assert leaves["c0"] == event[model.VENDOR_OP]  # headers.operation leads the record's leaves
        # Every integer and string value of the row's image is among the record's leaves as text (other types have
        # other texts: the canonical text of a timestamp is its epoch microseconds).
        texts = {value for name, value in leaves.items() if name.startswith("c")}
        image = event[model.AFTER] or event[model.BEFORE]
        types = {column["name"]: column["spark_type"] for column in event[model.COLUMNS]}
        plain = {v for k, v in image.items() if v is not None and types[k] in ("bigint", "int", "string")}
        assert plain, offset
        assert plain <= texts, (offset, plain, texts)


@pytest.mark.spark
def test_the_drs_dds_decode_baseline_parses_the_shell_documents(spark, tmp_path: Path) -> None:
    """A DRS DDS message holds its document as Mongo-shell text inside the JSON (drs.md 5), so the hand-written parse
    the decoder is measured against rewrites and parses it too, not the envelope's string alone."""
    workload, description, rows, decoded = _baseline_and_decoded(spark, tmp_path, "drs-json-dds")

    assert "documents rewritten and parsed" in description
    assert len(rows) == workload.messages == len(decoded)
    inserts = [offset for offset, event in decoded.items() if event[model.OP] == model.Op.INSERT]
    assert inserts
    for offset in inserts:
        event, document = decoded[offset], rows[offset]["c5"]  # c5: the envelope's `value`, after `coll`
        assert event[model.ERROR] is None
        assert document is not None, offset
        assert document.keys() == event[model.AFTER].keys(), offset
        for name, text in event[model.AFTER].items():
            # Spark's JSON reader gives a number's text through a double (2.0 stays "2.0"; the decoder writes "2").
            assert document[name] == text or float(document[name]) == float(text), (offset, name)


def test_job_kinds_leave_out_numbers_so_every_table_and_version_groups_together() -> None:
    from benchmarks.spark_jobs import job_kind

    assert job_kind("Delta: Compute snapshot for version: 12") == job_kind("Delta: Compute snapshot for version: 3")
    assert job_kind("collect at /src/cdclake/apply.py:1065") == "collect at /src/cdclake/apply.py:N"


@pytest.mark.spark
def test_the_anatomy_benchmark_counts_each_steady_batch_s_jobs_per_table_and_its_cpu(spark, tmp_path: Path) -> None:
    """``python -m benchmarks.anatomy`` on 2 tables with SCD2 tables: per steady batch, every SCD2 MERGE's scan among
    its jobs (the small lake tables themselves are rewritten, DeltaSink.rewrites_whole, not MERGEd into), from the
    second steady batch on Delta's state of the version the previous batch's write made (at least one per table),
    each SCD2 MERGE's copy of its source, the history step, the job groups adding up to the total, and the machine's
    busy CPU holding the JVM's; the scratch lake removed."""
    from benchmarks import anatomy
    from benchmarks.spark_jobs import DELTA_STATE

    argv = ["--tables", "2", "--events-per-batch", "200", "--batches", "2", "--out", str(tmp_path), "--history", "scd2"]
    lines = anatomy.main(argv, spark)
    starts = [index for index, line in enumerate(lines) if re.match(r"batch [12]: [\d.]+ s over 2 tables; ", line)]
    assert len(starts) == 2, lines
    assert all(re.search(r"\bhistory [\d.]+", lines[start]) for start in starts), lines
    group = re.compile(r"^\s+(\d+) \(\s*([\d.]+) per table\)\s+([\d.]+) s \(\s*[\d.]+%\)  (.+)$")
    for number, start in enumerate(starts, 1):
        block = lines[start + 1 : starts[number] if number < len(starts) else len(lines)]
        total = re.match(r"  spark jobs: (\d+) \(([\d.]+) per table\), ([\d.]+) job-seconds$", block[0])
        assert total is not None, block
        groups = {m.group(4): (int(m.group(1)), float(m.group(2))) for m in map(group.match, block) if m}
        assert sum(count for count, _ in groups.values()) == int(total.group(1)) > 0
        assert groups["MERGE operation - scanning files for matches"][1] >= 1.0, groups
        # Delta copies an SCD2 MERGE's source (it reads the stored rows) before its two passes over it.
        assert groups["MERGE operation - materialize source"][1] >= 1.0, groups
        if number == 2:
            assert groups[DELTA_STATE][1] >= 1.0, groups
        cpu = re.search(
            r"machine busy ([\d.]+), idle [\d.]+; driver JVM ([\d.]+) \(JIT compilers [\d.]+, garbage collector "
            r"[\d.]+, the rest ([\d.]+)\)",
            next(line for line in block if line.startswith("  cpu seconds: ")),
        )
        assert cpu is not None, block
        machine, jvm, rest = map(float, cpu.groups())
        assert rest > 0  # the batch's own work: tasks, planning, commits
        assert machine + 0.5 >= jvm > 0  # the machine's busy time holds the JVM's (to a few clock ticks)
        assert re.fullmatch(r"  classes compiled from generated code: \d+", block[-1])
    assert list(tmp_path.iterdir()) == []
