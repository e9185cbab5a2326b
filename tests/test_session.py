"""The embedded session's settings that are measured, not only set."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from cdclake.formats import decode_batch, get_format, list_formats
from tests.formats.golden import CASES, golden_options, messages_frame, read_jsonl, scenarios


def _compilations(spark) -> int:  # type: ignore[no-untyped-def]
    """Classes of generated code Spark has compiled in this JVM so far (cache misses of its code cache)."""
    metrics = getattr(getattr(spark.sparkContext._jvm, "org.apache.spark.metrics.source.CodegenMetrics$"), "MODULE$")
    return int(metrics.METRIC_COMPILATION_TIME().getCount())


@pytest.mark.spark
def test_the_session_keeps_the_compiled_code_of_every_decoder(spark) -> None:
    """One pass of every format's decoder over one of its golden cases uses more classes of generated code than Spark's
    default code cache holds (100): in that cache, each pass evicts the classes the next one needs first. The
    embedded session keeps 1,000 (spark.sql.codegen.cache.maxEntries), so a second pass compiles nothing."""
    assert spark.conf.get("spark.sql.codegen.cache.maxEntries") == "1000"
    frames = [
        (fmt, messages_frame(spark, read_jsonl(CASES / fmt.name / f"{scenarios(fmt.name)[0]}.input.jsonl")))
        for fmt in list_formats()
    ]

    def decode_all() -> int:
        before = _compilations(spark)
        for fmt, frame in frames:
            options = golden_options(fmt.name)
            decode_batch(get_format(fmt.name), frame, options).write.format("noop").mode("overwrite").save()
        return _compilations(spark) - before

    first = decode_all()
    print(f"first pass: {first} compilations over {len(frames)} cases")
    assert decode_all() == 0


def _stored_rdds(spark) -> dict[int, str]:  # type: ignore[no-untyped-def]
    """Id -> name of the RDDs with blocks in the block manager, Delta's caches of table snapshots aside."""
    infos = spark.sparkContext._jsc.sc().getRDDStorageInfo()
    return {int(i.id()): str(i.name()) for i in infos if not str(i.name()).startswith("Delta Table State")}


def _apply_leaving_nothing_stored(spark, pipeline, batches: list[list[tuple[bytes | None, bytes]]]) -> None:  # type: ignore[no-untyped-def]
    """Processes each batch of (Kafka key, value) messages, in order, and asserts that it has no dead letters and
    leaves no RDD stored that was not stored before it."""
    from cdclake.spark import local_frame

    offset = 0
    for batch_id, messages in enumerate(batches):
        rows = []
        for key, value in messages:
            rows.append((key, value, "t", 0, offset, datetime(2024, 3, 1, tzinfo=UTC)))
            offset += 1
        frame = local_frame(
            spark, rows, "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
        )
        before = _stored_rdds(spark)
        result = pipeline.process_batch(frame, batch_id)
        assert result.dead_letters == 0
        left = {i: name for i, name in _stored_rdds(spark).items() if i not in before}
        assert left == {}


@pytest.mark.spark
def test_a_batch_leaves_no_stored_rows_behind(spark, tmp_path: Path) -> None:
    """A batch's local checkpoints (its decoded events, its folded changes, read by the background tombstone write
    too) are freed when it ends (spark.release), not whenever the JVM collects them: after each batch the block
    manager holds no RDD it did not hold before (Delta's snapshot caches aside), and the rows landed."""
    from cdclake.devtools.verify import read_table
    from cdclake.pipeline import Pipeline, PipelineSettings
    from tests.test_ddl import row_message

    types = {"id": "bigint(20)", "v": "varchar(8)"}
    batches = [
        [row_message("INSERT", "t", [{"id": str(i), "v": f"v{i}"} for i in range(20)], types)],
        [
            row_message("UPDATE", "t", [{"id": "3", "v": "new"}], types, old=[{"v": "v3"}]),
            row_message("DELETE", "t", [{"id": "5", "v": "v5"}], types),
        ],
    ]
    lake = tmp_path / "lake"
    pipeline = Pipeline(spark, PipelineSettings(lake=str(lake), app_id="release", default_format="canal-json"))
    _apply_leaving_nothing_stored(spark, pipeline, [[(None, text.encode("utf-8")) for text in b] for b in batches])
    landed = {int(row["id"]): row["v"] for row in read_table(str(lake / "crm" / "t"))}
    assert landed == {**{i: f"v{i}" for i in range(20) if i != 5}, 3: "new"}


@pytest.mark.spark
@pytest.mark.parametrize("with_null", [False, True], ids=["kept", "rewritten"])
def test_a_batch_steps_checkpoints_are_freed_too(spark, tmp_path: Path, with_null: bool) -> None:
    """A format whose batch step stores the decoded events (Debezium's type_nulls_in_batch) has them stored once,
    and freed when the batch ends: the pipeline uses that checkpoint as the batch's events ("kept") or, when the step
    rewrote them (a JSON null typed from another message), frees it once it has stored the rewritten events."""
    import json

    from cdclake.devtools.verify import read_table
    from cdclake.pipeline import Pipeline, PipelineSettings

    def change(op: str, before: dict[str, object] | None, after: dict[str, object] | None, pos: int) -> bytes:
        source = {"connector": "mysql", "db": "shop", "table": "t", "file": "b.000001", "pos": pos, "ts_ms": 1}
        value = {"before": before, "after": after, "source": source, "op": op, "ts_ms": 1}
        return json.dumps(value).encode("utf-8")

    inserts = [change("c", None, {"id": i, "v": f"v{i}"}, i) for i in range(20)]
    if with_null:
        inserts.append(change("c", None, {"id": 99, "v": None}, 99))
    batches = [
        inserts,
        [change("u", {"id": 3, "v": "v3"}, {"id": 3, "v": "new"}, 100), change("d", {"id": 5, "v": "v5"}, None, 101)],
    ]
    lake = tmp_path / "lake"
    pipeline = Pipeline(spark, PipelineSettings(lake=str(lake), app_id="release-dbz", default_format="debezium-json"))
    _apply_leaving_nothing_stored(spark, pipeline, [[(b'{"id": 0}', value) for value in b] for b in batches])
    landed = {int(row["id"]): row["v"] for row in read_table(str(lake / "shop" / "t"))}
    expected = {**{i: f"v{i}" for i in range(20) if i != 5}, 3: "new"}
    assert landed == ({**expected, 99: None} if with_null else expected)


@pytest.mark.spark
def test_a_replay_frees_each_files_stored_lines(spark, tmp_path: Path) -> None:
    """A replay stores each capture file's lines once (read by all of its batches) and frees them after the file's
    last batch: nothing stored is left behind by a replay of two files in several batches, and the rows landed."""
    from cdclake.devtools.verify import read_table
    from cdclake.runner import replay
    from tests.test_ddl import row_message

    types = {"id": "bigint(20)", "v": "varchar(8)"}
    first = [row_message("INSERT", "t", [{"id": str(i), "v": f"v{i}"}], types) for i in range(5)]
    second = [
        row_message("UPDATE", "t", [{"id": "3", "v": "new"}], types, old=[{"v": "v3"}]),
        row_message("DELETE", "t", [{"id": "4", "v": "v4"}], types),
    ]
    paths = []
    for index, lines in enumerate((first, second)):
        path = tmp_path / f"capture-{index}.jsonl"
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        paths.append(str(path))
    lake = tmp_path / "lake"
    before = _stored_rdds(spark)
    results = replay(spark, lake=str(lake), format_name="canal-json", paths=paths, batch_lines=2)
    assert [r.messages for r in results] == [2, 2, 1, 2]
    left = {i: name for i, name in _stored_rdds(spark).items() if i not in before}
    assert left == {}
    landed = {int(row["id"]): row["v"] for row in read_table(str(lake / "crm" / "t"))}
    assert landed == {0: "v0", 1: "v1", 2: "v2", 3: "new"}


@pytest.mark.spark
def test_a_stored_frame_is_recognised_and_not_stored_twice(spark) -> None:
    """is_local_checkpoint tells a stored frame (what the pipeline then uses as its events instead of copying it)
    from a computed one; release_stored_inputs frees what a frame reads, except what ``keep`` reads."""
    from pyspark.sql import functions as F

    from cdclake.spark import is_local_checkpoint, release_stored_inputs

    computed = spark.range(10).select((F.col("id") * 2).alias("x"))
    stored = computed.localCheckpoint(eager=True)
    assert is_local_checkpoint(stored)
    assert not is_local_checkpoint(computed)
    assert not is_local_checkpoint(stored.where(F.col("x") > 4))
    other = spark.range(3).localCheckpoint(eager=True)
    before = _stored_rdds(spark)
    release_stored_inputs(stored.crossJoin(other), keep=other)
    assert set(before) - set(_stored_rdds(spark)) == {stored._jdf.queryExecution().analyzed().rdd().id()}
    assert other.count() == 3


@pytest.mark.spark
def test_the_session_holds_the_jvm_classes_pyspark_looks_up_by_name(spark) -> None:
    """PySpark names a few JVM classes on every Column function and ``select``; the session's JVM view holds their
    handles (cdclake.spark.pin_jvm_classes), each the class the JVM itself resolves for that name, so those lookups
    (and those of their static methods) no longer go to the JVM."""
    from py4j.java_gateway import JVMView

    from cdclake.spark import PINNED_JVM_CLASSES

    view = spark.sparkContext._jvm
    for name, qualified in PINNED_JVM_CLASSES.items():
        assert vars(view)[name]._fqn == qualified
        assert JVMView.__getattr__(view, name)._fqn == qualified  # what Py4J resolves in the JVM
    # A pinned handle works as PySpark uses it, and keeps the static methods it was asked for.
    assert view.PythonUtils.toSeq(["a", "b"]).mkString(",") == "a,b"
    assert view.functions.col is view.functions.col

    names: list[str] = []
    original = JVMView.__getattr__

    def counting(self: JVMView, name: str) -> object:
        names.append(name)
        return original(self, name)

    JVMView.__getattr__ = counting  # type: ignore[method-assign]
    try:
        spark.range(3).select((F.col("id") + 1).alias("x"), F.lit("y")).collect()
    finally:
        JVMView.__getattr__ = original  # type: ignore[method-assign]
    assert not set(names) & set(PINNED_JVM_CLASSES), names


def _processes_started(spark, work) -> list[tuple[str, list[str]]]:  # type: ignore[no-untyped-def]
    """(command, class names of its stack) of each process the driver JVM starts while ``work()`` runs, from a JFR
    recording of ``jdk.ProcessStart`` events."""
    jvm = spark.sparkContext._jvm
    recording = jvm.jdk.jfr.Recording()
    recording.enable("jdk.ProcessStart").withStackTrace()
    recording.start()
    try:
        work()
    finally:
        recording.stop()
    no_attributes = spark.sparkContext._gateway.new_array(jvm.java.nio.file.attribute.FileAttribute, 0)
    dump = jvm.java.nio.file.Files.createTempFile("cdclake-processes", ".jfr", no_attributes)
    try:
        recording.dump(dump)
        started = []
        for event in jvm.jdk.jfr.consumer.RecordingFile.readAllEvents(dump):
            frames = event.getStackTrace().getFrames() if event.getStackTrace() is not None else []
            classes = [str(frame.getMethod().getType().getName()) for frame in frames]
            started.append((str(event.getString("command")), classes))
        return started
    finally:
        recording.close()
        jvm.java.nio.file.Files.deleteIfExists(dump)


@pytest.mark.spark
def test_a_delta_commit_on_the_local_disk_starts_no_readlink_process(spark, tmp_path: Path) -> None:
    """Delta's default log store for file: paths (HDFSLogStore) renames a commit file through Hadoop's FileContext,
    which runs `readlink` in a new process for both paths of each rename and their checksum files (no native Hadoop
    library): 4 processes per commit. The embedded session uses its LocalLogStore, which renames through the
    FileSystem API. (Delta's version checksum, written after each commit through Spark's CheckpointFileManager, still
    starts some: they are not the log store's.)"""
    from delta.tables import DeltaTable

    path = str(tmp_path / "t")
    spark.range(3).write.format("delta").save(path)

    def commits() -> None:
        spark.range(2).write.format("delta").mode("append").save(path)
        DeltaTable.forPath(spark, path).delete("id = 0")

    started = _processes_started(spark, commits)
    from_log_store = [
        command for command, classes in started if any(name.startswith("io.delta.storage.") for name in classes)
    ]
    assert from_log_store, "the recording saw none of the log store's processes (its chmod of the new file)"
    assert not [command for command in from_log_store if command.startswith("readlink")], from_log_store
    assert sorted(row.id for row in spark.read.format("delta").load(path).collect()) == [1, 1, 2]


@pytest.mark.spark
def test_a_session_without_delta_snapshot_partitions_gets_a_few_and_a_set_value_is_kept(spark, tmp_path: Path) -> None:
    """A session that spark-submit built has Delta's 50 snapshot partitions: a pipeline sets one per core, at most
    ``MAX_SNAPSHOT_PARTITIONS`` (cdclake.pipeline.snapshot_partitions has the figures). A value the session was
    given is the user's and stays."""
    from cdclake.pipeline import MAX_SNAPSHOT_PARTITIONS, SNAPSHOT_PARTITIONS, Pipeline, PipelineSettings

    embedded = spark.conf.get(SNAPSHOT_PARTITIONS)
    settings = PipelineSettings(lake=str(tmp_path / "lake"), app_id="partitions", default_format="canal-json")
    try:
        spark.conf.unset(SNAPSHOT_PARTITIONS)
        Pipeline(spark, settings)
        expected = min(MAX_SNAPSHOT_PARTITIONS, spark.sparkContext.defaultParallelism)
        assert spark.conf.get(SNAPSHOT_PARTITIONS) == str(expected)
        assert 1 <= expected < 50

        spark.conf.set(SNAPSHOT_PARTITIONS, "7")
        Pipeline(spark, settings)
        assert spark.conf.get(SNAPSHOT_PARTITIONS) == "7"
    finally:
        spark.conf.set(SNAPSHOT_PARTITIONS, embedded)


@pytest.mark.spark
def test_a_session_without_a_huge_method_limit_gets_hotspot_s_and_a_set_value_is_kept(spark, tmp_path: Path) -> None:
    """Whole-stage generated methods beyond 8,000 bytes are never JIT-compiled by HotSpot; a pipeline makes Spark run
    such a stage's operators apart on a session that has Spark's default (cdclake.spark.JIT_HUGE_METHOD_LIMIT has the
    figures). The embedded session has it from the start; a value the session was given is the user's and stays."""
    from cdclake.pipeline import Pipeline, PipelineSettings
    from cdclake.spark import HUGE_METHOD_LIMIT

    embedded = spark.conf.get(HUGE_METHOD_LIMIT)
    assert embedded == "8000"
    settings = PipelineSettings(lake=str(tmp_path / "lake"), app_id="huge-methods", default_format="maxwell-json")
    try:
        spark.conf.unset(HUGE_METHOD_LIMIT)
        assert spark.conf.get(HUGE_METHOD_LIMIT) == "65535"  # Spark's default
        Pipeline(spark, settings)
        assert spark.conf.get(HUGE_METHOD_LIMIT) == "8000"

        spark.conf.set(HUGE_METHOD_LIMIT, "65535")
        Pipeline(spark, settings)
        assert spark.conf.get(HUGE_METHOD_LIMIT) == "65535"
    finally:
        spark.conf.set(HUGE_METHOD_LIMIT, embedded)


@pytest.mark.spark
def test_a_pipeline_turns_lateral_aliases_off_so_a_lambda_reads_the_input_column(spark, tmp_path: Path) -> None:
    """Spark 4.1 with lateral column aliases (its default) resolved ``image`` inside the second expression's lambda
    to the first expression's alias, not to the input column: the chained key changes' deltas lost a column that
    way (apply._made_whole). A pipeline turns them off on the session it is given, as spark-submit builds it."""
    from pyspark.sql import functions as F

    from cdclake.pipeline import Pipeline, PipelineSettings
    from cdclake.spark import LATERAL_ALIASES, local_frame

    def overlaid(image, on_top):  # type: ignore[no-untyped-def]
        return F.map_concat(F.map_filter(image, lambda k, _v: ~F.map_contains_key(on_top, k)), on_top)

    frame = local_frame(spark, [("1",)], "a string").select(
        F.create_map(F.lit("a"), F.col("a")).alias("image"),
        F.create_map(F.lit("a"), F.lit("0"), F.lit("b"), F.lit("0")).alias("base"),
    )

    def delta() -> dict[str, str]:
        [row] = frame.select(
            overlaid(F.col("base"), F.col("image")).alias("image"),
            overlaid(F.col("base"), F.col("image")).alias("delta"),
        ).collect()
        return dict(row["delta"])

    embedded = spark.conf.get(LATERAL_ALIASES)
    try:
        spark.conf.set(LATERAL_ALIASES, "true")
        assert delta() == {"a": "1"}  # the quirk: "b" filtered out by the new image
        Pipeline(spark, PipelineSettings(lake=str(tmp_path / "lake"), app_id="aliases", default_format="canal-json"))
        assert spark.conf.get(LATERAL_ALIASES) == "false"
        assert delta() == {"a": "1", "b": "0"}
    finally:
        spark.conf.set(LATERAL_ALIASES, embedded)


@pytest.mark.spark
def test_the_embedded_session_keeps_the_warnings_every_batch_would_print_out_of_the_log(spark) -> None:
    """A replay of 12 lines printed 15 WARN lines of released local checkpoints and truncated plan strings."""
    from cdclake.spark import EXPECTED_WARNINGS

    jvm = spark.sparkContext._jvm
    for logger, level in EXPECTED_WARNINGS.items():
        assert str(jvm.org.apache.logging.log4j.LogManager.getLogger(logger).getLevel()) == level
    assert str(jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel()) == "WARN"


def test_snapshot_partitions_follow_the_cores_up_to_the_cap() -> None:
    from cdclake.pipeline import MAX_SNAPSHOT_PARTITIONS, snapshot_partitions

    assert [snapshot_partitions(cores) for cores in (0, 1, 2, 4)] == [1, 1, 2, 4]
    assert snapshot_partitions(400) == MAX_SNAPSHOT_PARTITIONS


@pytest.mark.spark
def test_the_embedded_session_reads_avro_within_limits_and_a_pipeline_says_when_a_session_has_none(
    spark, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Avro allocates what a corrupt length declares (``cdclake.spark.AVRO_LIMITS``; the mutation test's inflated
    lengths are the dead letters). A session cdclake did not build may lack the limits: a pipeline reading an Avro
    format says how to start Spark with them, and one reading JSON only says nothing."""
    from cdclake.pipeline import Pipeline, PipelineSettings
    from cdclake.spark import AVRO_LIMITS, avro_limit_options, missing_avro_limits

    assert missing_avro_limits(spark) == []
    system = spark.sparkContext._jvm.java.lang.System
    assert {name: system.getProperty(name) for name in AVRO_LIMITS} == {k: str(v) for k, v in AVRO_LIMITS.items()}

    name = "org.apache.avro.limits.string.maxLength"
    try:
        # Avro reads its limits once, when its SystemLimitException class loads: cleared only for this check.
        system.clearProperty(name)
        with caplog.at_level("WARNING", logger="cdclake.pipeline"):
            Pipeline(spark, PipelineSettings(lake=str(tmp_path / "json"), app_id="json", default_format="canal-json"))
            assert not [r for r in caplog.records if "Avro limits" in r.getMessage()]
            settings = PipelineSettings(
                lake=str(tmp_path / "avro"), app_id="avro", default_format="canal-json", topic_formats={"t": "dts-avro"}
            )
            Pipeline(spark, settings)
    finally:
        system.setProperty(name, str(AVRO_LIMITS[name]))
    [warning] = [r.getMessage() for r in caplog.records if "Avro limits" in r.getMessage()]
    assert warning.startswith(f"dts-avro: the driver's JVM has no Avro limits ({name})")
    assert warning.endswith(avro_limit_options())
