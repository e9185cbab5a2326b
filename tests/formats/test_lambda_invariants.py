"""No decoder leaves row-level work inside a lambda.

Spark evaluates an expression used inside a lambda (``transform``, ``filter``, ``map_filter``, ...) again for every
element: it does not hoist loop-invariant expressions, and common-subexpression elimination does not look into lambda
bodies. A row image or a name list built outside the loop but referenced inside it therefore costs O(columns^2) per
row, and no golden case notices (the result is the same, only slower). Canal's before image, DTS Avro's untyped
column list, Qlik's captured-column list and OGG's missing-column list were such cases (decode 14-26% slower).

This walks each decoder's optimised plan (so the optimizer's own inlining of staged columns counts) over all of the
format's golden inputs, and finds the largest subexpressions of lambda bodies that use none of the enclosing lambdas'
variables. Those that do real work fail the test: a higher-order function, a parse, a regular expression, a map or
array being built, or any expression of more than ``MAX_INVARIANT_NODES`` nodes. Small invariants (a flag, a
``map_keys`` of a column) are allowed: they cost about as much as the column reference they would become.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from cdclake.formats import decode_batch, get_format, list_formats
from tests.formats.golden import CASES, golden_options, messages_frame, read_jsonl, scenarios

pytestmark = pytest.mark.spark

MAX_INVARIANT_NODES = 14
WORK = frozenset(
    {
        "JsonToStructs",
        "AvroDataToCatalyst",
        "ParseJson",
        "RegExpReplace",
        "RegExpExtract",
        "RegExpExtractAll",
        "RLike",
        "StringSplit",
        "CreateMap",
        "CreateArray",
        "CreateNamedStruct",
        "MapConcat",
        "MapFromArrays",
        "MapFromEntries",
        "MapEntries",
        "ArrayExcept",
        "ArrayUnion",
        "ArraysZip",
    }
)
"""Expression classes that build or parse something per evaluation (a constant one is folded, so never reported)."""


@dataclass
class _Walk:
    higher_order: Any  # the JVM class HigherOrderFunction
    found: list[str] = field(default_factory=list)
    walked: dict[tuple[int, frozenset[int]], list[tuple[Any, tuple[frozenset[int], int, bool]]]] = field(
        default_factory=dict
    )
    """(hash code, bound variables) -> the expressions walked with them and their results. An optimised plan repeats
    subexpressions (the optimizer inlines staged columns), so a walk met the same ones 3.5 to 7 times (Debezium JSON
    13,744 visits of 3,872 distinct nodes, DTS Avro 18,006 of 2,485), each node several Py4J calls. An expression met
    again under the same variables has the same result and findings (already recorded): Spark's ``equals`` tells it
    from another with the same hash code."""

    def node(self, expression: Any, bound: frozenset[int]) -> tuple[frozenset[int], int, bool]:
        """(lambda variables used, node count, does work) of ``expression``; records loop-invariant work."""
        same_hash = self.walked.setdefault((expression.hashCode(), bound), [])
        for walked, result in same_hash:
            if walked.equals(expression):
                return result
        result = self._walk(expression, bound)
        same_hash.append((expression, result))
        return result

    def _walk(self, expression: Any, bound: frozenset[int]) -> tuple[frozenset[int], int, bool]:
        name = expression.getClass().getSimpleName()
        if name == "NamedLambdaVariable":
            return frozenset({expression.exprId().id()}), 1, False
        own: frozenset[int] = frozenset()
        if name == "LambdaFunction":
            arguments = expression.arguments()
            own = frozenset(arguments.apply(i).exprId().id() for i in range(arguments.size()))
        children = expression.children()
        results = [self.node(children.apply(i), bound | own) for i in range(children.size())]
        used = frozenset().union(*(r[0] for r in results))
        if (bound | own) & used:
            # This node varies per element; its children that do not are maximal loop invariants (a lambda is not a
            # value: it is the loop body of its higher-order function).
            for i, (child_used, nodes, work) in enumerate(results):
                child = children.apply(i)
                invariant = not (bound | own) & child_used and child.getClass().getSimpleName() != "LambdaFunction"
                if invariant and (work or nodes > MAX_INVARIANT_NODES):
                    self.found.append(f"{nodes} nodes: {child.toString()[:240]}")
        work = (
            any(r[2] for r in results)
            or self.higher_order.isInstance(expression)
            or (name in WORK and not expression.foldable())
        )
        return used - own, 1 + sum(r[1] for r in results), work

    def plan(self, plan: Any) -> None:
        expressions = plan.expressions()
        for i in range(expressions.size()):
            self.node(expressions.apply(i), frozenset())
        children = plan.children()
        for i in range(children.size()):
            self.plan(children.apply(i))


def loop_invariant_work(spark: SparkSession, *frames: DataFrame) -> list[str]:
    """The loop-invariant work in the optimised plans of ``frames``, each found once (one walk: the frames of one
    decoder share most of their expressions)."""
    walk = _Walk(spark._jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.expressions.HigherOrderFunction"))
    for frame in frames:
        walk.plan(frame._jdf.queryExecution().optimizedPlan())
    return walk.found


def test_the_walk_finds_a_row_expression_inside_a_lambda(spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    frame = spark.createDataFrame([({"a": "1", "b": "2"}, ["a", "c"])], "m map<string,string>, names array<string>")
    staged = F.map_filter(F.col("m"), lambda k, _v: k != "b")
    slow = frame.select(F.filter(F.col("names"), lambda n: F.map_contains_key(staged, n)).alias("x"))
    fast = frame.select(F.array_intersect(F.col("names"), F.map_keys(staged)).alias("x"))
    assert [row.x for row in slow.collect()] == [row.x for row in fast.collect()] == [["a"]]
    found = loop_invariant_work(spark, slow)
    assert len(found) == 1, found
    assert "map_filter" in found[0]
    assert loop_invariant_work(spark, fast) == []


@pytest.mark.parametrize("format_name", [fmt.name for fmt in list_formats()])
def test_no_row_work_inside_lambdas(spark: SparkSession, format_name: str) -> None:
    lines = [
        line
        for scenario in scenarios(format_name)
        for line in read_jsonl(CASES / format_name / f"{scenario}.input.jsonl")
    ]
    assert lines, f"{format_name} has no golden inputs"
    fmt = get_format(format_name)
    messages = messages_frame(spark, lines)
    # Without a batch step, decode_batch is decode: one walk (the walk is most of this test's time).
    options = golden_options(format_name)
    frames = [fmt.decode(messages, options)] + (
        [] if fmt.batch_step is None else [decode_batch(fmt, messages, options)]
    )
    assert loop_invariant_work(spark, *frames) == []
