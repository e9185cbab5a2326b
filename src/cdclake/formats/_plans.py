"""A decoder's analysed plan, built once per format and options and reused by every batch.

A decoder is a few hundred to a few thousand Spark expressions. Building them costs a Py4J round trip each, and
every ``select`` of the decoder is analysed again: 0.2-1.6 s of driver time per batch and format, whatever the
batch's size. Measured with ``python -m benchmarks.decode_plans`` (20,000 messages, 2 cores): reusing the plan
takes 14-53% off decoding a batch, e.g. Debezium 4.25 -> 2.67 s, DRS Avro 1.76 -> 0.83 s. Yet the plan
depends only on the format, its options and the columns of the messages, never on the messages themselves (the
decoder contract: ``decode`` is per message, see ``CdcFormat``).

So the decoder runs once on an empty relation with the messages' columns (the *template*), and each batch gets
that analysed plan with the template replaced by the batch's own plan. The batch's columns enter under the
template's attribute ids (a projection of aliases), so every expression above them stays valid as analysed.

The reuse is keyed by everything analysis reads: the decoder, its options, the message columns, the session and
its SQL configuration (the session time zone and ANSI mode are baked into analysed expressions). A decoder of table
definitions sent in other messages (``MetadataSupport``) builds its plan from the definitions known so far: they
are part of the key (:func:`decode_with_definitions_reusing_plan`), so a stream whose tables are all defined
reuses one plan, and a new definition builds the next. A decoder whose plan also depends on the batch's data (Qlik
Avro runs one ``from_avro`` per data schema its messages name) collects that first, in one small job, and it joins
the key (:func:`decode_with_batch_inputs_reusing_plan`): batches naming the same schemas share a plan. If the
template cannot be replaced (a decoder that does not read its input), the batch is decoded as it would be without
reuse.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pyspark.sql import DataFrame, SparkSession

MAX_TEMPLATES: Final = 64
"""Templates kept per process (least recently used go first): one per format, options and configuration."""

_VOLATILE_SETTING: Final = "spark.databricks.delta.lastCommitVersionInSession"
"""A setting of the session configuration that changes while a pipeline runs and that no decoder's plan reads: left
out of the key. Delta records the version of each commit there, so every batch would build its template again."""

Inputs = TypeVar("Inputs", bound=Hashable)
"""What a decoder collected from a batch to build its plan (part of the plan's key)."""
DecodeFn = Callable[[DataFrame, Mapping[str, str]], DataFrame]
Path = tuple[int, ...]
"""Child indexes from a plan's root to one occurrence of the template relation."""


@dataclass(frozen=True)
class _Template:
    plan: Any  # the decoder's analysed logical plan over the template relation (JVM object)
    relation: Any  # the empty template relation (JVM LogicalRDD)
    paths: tuple[Path, ...]  # where the relation occurs in ``plan``
    outputs: tuple[Any, ...]  # per path, that occurrence's output attributes (JVM Seq)


_templates: OrderedDict[tuple[Any, ...], _Template | None] = OrderedDict()
_lock = threading.Lock()
analysis_lock: Final = threading.RLock()
"""Held while a template is analysed, and by ``base.analysed_with_java_charsets`` while it has session settings
changed for a decoder's analysis: no other decoder's template is built (and kept, under a key that does not show
them) with those settings in force."""


def decode_reusing_plan(decode: DecodeFn, messages: DataFrame, options: Mapping[str, str]) -> DataFrame:
    """``decode(messages, options)``, with the decoder's plan built once for these options and reused."""
    return _reusing((decode, tuple(sorted(options.items()))), lambda m: decode(m, options), messages)


def decode_with_definitions_reusing_plan(
    decode: Callable[[DataFrame, Mapping[str, str], Sequence[Any]], DataFrame],
    messages: DataFrame,
    options: Mapping[str, str],
    known: Sequence[Hashable],
) -> DataFrame:
    """``decode(messages, options, known)`` (a ``MetadataSupport`` decode and the table definitions it reads), with
    its plan built once for these options and definitions (in this order) and reused."""
    definitions = tuple(known)
    return _reusing(
        (decode, tuple(sorted(options.items())), definitions),
        lambda m: decode(m, options, definitions),
        messages,
    )


def decode_with_batch_inputs_reusing_plan(
    decode: Callable[[DataFrame, Mapping[str, str], Sequence[Any], Inputs], DataFrame],
    messages: DataFrame,
    options: Mapping[str, str],
    known: Sequence[Hashable],
    inputs: Inputs,
) -> DataFrame:
    """``decode(messages, options, known, inputs)``: a ``MetadataSupport`` decode whose plan also depends on
    ``inputs``, what was collected from ``messages`` beforehand; its plan is built once for these options,
    definitions and inputs and reused. The template never sees the batch's data: ``decode`` must read it only
    through ``inputs``."""
    definitions = tuple(known)
    return _reusing(
        (decode, tuple(sorted(options.items())), definitions, inputs),
        lambda m: decode(m, options, definitions, inputs),
        messages,
    )


def _reusing(identity: tuple[Any, ...], decode: Callable[[DataFrame], DataFrame], messages: DataFrame) -> DataFrame:
    """``decode(messages)`` through the template of ``identity`` (what the plan is built from besides the messages'
    columns and the session), made on first use."""
    spark = messages.sparkSession
    key = _key(spark, identity, messages)
    with _lock:
        known = key in _templates
        template = _templates.get(key)
        if known:
            _templates.move_to_end(key)
    if not known:
        with analysis_lock:
            template = _template(spark, decode, messages)
        with _lock:
            _templates[key] = template
            while len(_templates) > MAX_TEMPLATES:
                _templates.popitem(last=False)
    if template is None:
        return decode(messages)
    return _instantiate(spark, template, messages)


def clear() -> None:
    """Forgets every template (tests; a process never needs it: keys change with what a plan depends on)."""
    with _lock:
        _templates.clear()


def _key(spark: SparkSession, identity: tuple[Any, ...], messages: DataFrame) -> tuple[Any, ...]:
    jsession = spark._jsparkSession
    return (
        *identity,
        messages.schema.json(),
        jsession.sessionUUID(),
        # A Scala immutable map, as text: its order depends on its entries only.
        jsession.sessionState().conf().getAllConfs().removed(_VOLATILE_SETTING).toString(),
    )


def _template(spark: SparkSession, decode: Callable[[DataFrame], DataFrame], messages: DataFrame) -> _Template | None:
    empty = spark.createDataFrame([], messages.schema)
    relation = empty._jdf.queryExecution().analyzed()
    plan = decode(empty)._jdf.queryExecution().analyzed()
    occurrences = _occurrences(plan, relation, ())
    if not occurrences:
        return None
    return _Template(plan, relation, tuple(p for p, _ in occurrences), tuple(o for _, o in occurrences))


def _occurrences(node: Any, relation: Any, path: Path) -> list[tuple[Path, Any]]:
    """Where ``relation`` occurs in ``node``, with the output of each occurrence. A decoder that unions parts of
    its input has the relation several times: the analyser gives each repeat new attribute ids (deduplicated
    relations), so a repeat is recognised as the same leaf producing the same result, not as an equal node."""
    if node.equals(relation):
        return [(path, relation.output())]
    children = node.children()
    if children.size() == 0:
        return [(path, node.output())] if node.sameResult(relation) else []
    found: list[tuple[Path, Any]] = []
    for index in range(children.size()):
        found += _occurrences(children.apply(index), relation, (*path, index))
    return found


def _instantiate(spark: SparkSession, template: _Template, messages: DataFrame) -> DataFrame:
    jvm = spark._jvm
    assert jvm is not None
    batch = messages._jdf.queryExecution().analyzed()
    batch_columns = batch.output()
    expressions = jvm.org.apache.spark.sql.catalyst.expressions
    nothing = getattr(jvm.scala.collection.immutable, "Nil$").__getattr__("MODULE$")

    def source(occurrence: Any) -> Any:
        renamed = [
            # Alias(child, name)(exprId, qualifier, explicitMetadata, nonInheritableMetadataKeys): the batch's
            # column under the id of the occurrence's column, which the decoder's expressions refer to.
            expressions.Alias(
                batch_columns.apply(i),
                occurrence.apply(i).name(),
                occurrence.apply(i).exprId(),
                nothing,
                jvm.scala.Option.empty(),
                nothing,
            )
            for i in range(occurrence.size())
        ]
        return jvm.org.apache.spark.sql.catalyst.plans.logical.Project(_seq(jvm, renamed), batch)

    sources = [(path, source(output)) for path, output in zip(template.paths, template.outputs, strict=True)]
    plan = _replace(jvm, template.plan, sources)
    return DataFrame(jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, plan), spark)


def _replace(jvm: Any, node: Any, sources: list[tuple[Path, Any]]) -> Any:
    """``node`` with each source at the end of its path (copies of the nodes on the way, the rest shared)."""
    if len(sources) == 1 and sources[0][0] == ():
        return sources[0][1]
    children = node.children()
    replaced = []
    for index in range(children.size()):
        below = [(path[1:], source) for path, source in sources if path[0] == index]
        child = children.apply(index)
        replaced.append(_replace(jvm, child, below) if below else child)
    return node.withNewChildren(_seq(jvm, replaced))


def _seq(jvm: Any, items: list[Any]) -> Any:
    return jvm.org.apache.spark.api.python.PythonUtils.toSeq(items)
