"""The embedded session's settings that are measured, not only set."""

from __future__ import annotations

import pytest

from cdclake.formats import decode_batch, get_format, list_formats
from tests.formats.golden import CASES, messages_frame, read_jsonl, scenarios


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
            decode_batch(get_format(fmt.name), frame, {}).write.format("noop").mode("overwrite").save()
        return _compilations(spark) - before

    first = decode_all()
    print(f"first pass: {first} compilations over {len(frames)} cases")
    assert decode_all() == 0
