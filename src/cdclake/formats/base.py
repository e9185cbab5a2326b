"""What a format is, and the expression helpers formats share.

A format turns a DataFrame of raw messages (:data:`MESSAGE_COLUMNS`) into canonical change events
(:data:`cdclake.model.CANONICAL_SCHEMA`) with Spark SQL expressions only: the JVM does all per-row work, no Python
function runs per message. Formats end with :func:`finish`, which adds the checks every format needs (identifiers,
value types, keys) so that a bad message becomes a dead letter with a reason instead of failing the batch.

Expressions that depend only on constants (column names, the format's name) are built once per process
(``functools.cache``) and reused by every batch: building a Column costs one or more Py4J round trips per function
(measured: 0.1-1 s of driver time per decoder and batch, on two cores), and a Column is an immutable expression
tree that belongs to no DataFrame or session. Only builders that take no Column argument (hashable constants only)
are cached; one built from ``df["name"]`` would be tied to its DataFrame.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from cdclake import model
from cdclake.formats import _plans
from cdclake.model import Op

MESSAGE_KEY: Final = "key"
MESSAGE_VALUE: Final = "value"
MESSAGE_COLUMNS: Final = ("key", "value", "topic", "partition", "offset", "timestamp")
"""Columns of a raw message frame, as the source layer delivers them (binary key/value, Kafka coordinates)."""
MESSAGE_HEADERS: Final = "headers"
"""The record headers of a raw message frame (:data:`cdclake.model.HEADERS_TYPE`), after :data:`MESSAGE_COLUMNS`;
a frame without the column has none."""


@functools.cache
def header_text(name: str) -> Column:
    """The first header ``name`` of a raw message as text, or null when the message has no such header. For frames
    with a :data:`MESSAGE_HEADERS` column only (a decoder checks first)."""
    # array_position rather than a filter lambda: Spark interprets higher-order functions (no code generation); with
    # a lambda, Debezium JSON decoding took 17% longer with one header per message than without, now 6%.
    headers = F.col(MESSAGE_HEADERS)
    position = F.array_position(headers["key"], name)
    return F.when(position > 0, F.element_at(headers["value"], position.cast("int")).cast("string"))


FormatOptions = Mapping[str, str]
DecodeFn = Callable[[DataFrame, FormatOptions], DataFrame]

MAX_IDENTIFIER_LENGTH: Final = 255

METADATA_SCHEMA: Final = (
    "format STRING, schema_id STRING, database STRING, schema STRING, `table` STRING, table_version BIGINT, "
    "definition STRING, position STRING"
)
"""Columns of the frame a :class:`MetadataSupport` ``extract`` returns: one row per table-definition message."""


@dataclass(frozen=True)
class TableMetadata:
    """One version of a table's definition, sent by the source in its own message (Qlik Replicate MD messages).

    The pipeline keeps every definition it has seen (``<lake>/_cdclake/metadata``) and hands them to the format's
    :class:`MetadataSupport` ``decode``, because data messages of such formats only reference their definition.

    Attributes:
        format: registry name of the format that read the definition.
        schema_id: the id data messages use to reference this definition (unique per format).
        database: source database (or schema, for formats that name only one level) of the table.
        schema: source schema when the format names both levels, else None.
        table: source table name.
        table_version: increases with each structure change of the table (the latest one wins a lookup by name).
        definition: the definition as the format's JSON text (only the format reads it).
        position: where the definition message was read (for provenance), or None.
    """

    format: str
    schema_id: str
    database: str | None
    schema: str | None
    table: str
    table_version: int
    definition: str
    position: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TableMetadata:
        """From a row with the columns of :data:`METADATA_SCHEMA` (a collected Spark ``Row.asDict()``)."""
        return cls(
            format=str(row["format"]),
            schema_id=str(row["schema_id"]),
            database=row["database"],
            schema=row["schema"],
            table=str(row["table"]),
            table_version=int(row["table_version"] or 0),
            definition=str(row["definition"]),
            position=row["position"],
        )

    def as_row(self) -> tuple[Any, ...]:
        """The values in the column order of :data:`METADATA_SCHEMA`."""
        return (
            self.format,
            self.schema_id,
            self.database,
            self.schema,
            self.table,
            self.table_version,
            self.definition,
            self.position,
        )


ExtractMetadataFn = Callable[[DataFrame, FormatOptions], DataFrame]
"""Raw message frame + options -> the table definitions its messages carry (:data:`METADATA_SCHEMA` rows)."""
MetadataDecodeFn = Callable[[DataFrame, FormatOptions, Sequence[TableMetadata]], DataFrame]
"""Raw message frame + options + every known definition of the format -> canonical frame (pure Spark SQL)."""


@dataclass(frozen=True)
class MetadataSupport:
    """For formats whose data messages reference table definitions sent in separate messages (Qlik MD messages).

    Per batch the pipeline calls ``extract`` first (its rows are collected to the driver: keep it to the
    definition messages), stores the new definitions, then decodes the batch with ``decode`` and every definition
    known so far, the batch's own included. The format's plain ``decode`` must still work alone (with the
    definitions found in the same messages), so that a format is usable without a pipeline.

    Attributes:
        extract: finds the definition messages of a batch (see :data:`ExtractMetadataFn`).
        decode: decodes a batch with known definitions (see :data:`MetadataDecodeFn`).
        plan_from_definitions: whether ``decode`` builds its plan from the options, the definitions and the message
            columns alone, without a Spark job on the messages: then the plan is built once per set of definitions
            and reused (``formats._plans``, :func:`decode_batch_with_metadata`).
    """

    extract: ExtractMetadataFn
    decode: MetadataDecodeFn
    plan_from_definitions: bool = False


def collect_metadata(extracted: DataFrame) -> list[TableMetadata]:
    """The definitions of an ``extract`` frame on the driver: the first per (format, schema_id), complete ones."""
    rows = extracted.where(F.col("schema_id").isNotNull() & F.col("table").isNotNull()).collect()
    return unique_metadata(TableMetadata.from_row(row.asDict()) for row in rows)


def unique_metadata(definitions: Iterable[TableMetadata]) -> list[TableMetadata]:
    """The first definition per (format, schema_id), in input order (re-sent definition messages are copies)."""
    seen: dict[tuple[str, str], TableMetadata] = {}
    for definition in definitions:
        seen.setdefault((definition.format, definition.schema_id), definition)
    return list(seen.values())


@dataclass(frozen=True)
class CdcFormat:
    """A registered wire format.

    Attributes:
        name: registry name, kebab-case as the vendor spells the format (``dataworks-json``).
        description: one line for ``cdclake formats``.
        decode: raw message frame + options -> canonical frame (pure Spark SQL). Per message: its plan may depend
            on the options and the message columns only, never on the messages' data (it is built once and reused
            for every batch, see :func:`decode_batch`), unless the format has ``metadata``.
        encoding: ``json`` or ``binary`` (how ``replay`` reads capture files by default).
        operations: vendor operation -> canonical op, for documentation and ``cdclake formats``.
        options: option name -> what it does.
        option_aliases: other names the format reads for an option (alias -> option name).
        validate_options: raises ``ValueError`` saying which option value is wrong and why (it runs when a
            configuration is loaded, before any message is read); None when any value will do.
        sniff: decides from one parsed JSON message whether it is in this format (``--format auto``); None when
            the format cannot be told apart from others.
        examples: file names in ``shared/formats/examples`` whose messages are in this format (tests decode them).
        metadata: for formats whose data messages need table definitions sent in other messages (Qlik MD); None
            for self-describing formats.
        batch_step: decoded events of one batch -> events, for a rule that needs the whole batch (typing JSON nulls
            from other messages); :func:`decode_batch` runs it. None for formats whose events are final per message.
        reads_batch_to_plan: ``decode`` collects something from the batch's messages (one small Spark job: the
            schema ids of ``debezium-avro``) to build its plan, and reuses plans itself
            (``_plans.decode_with_batch_inputs_reusing_plan``), so :func:`decode_batch` calls it as it is.
        ddl_types: for a format whose messages carry DDL text and type their columns by SQL type names: a map of
            SQL types as the DDL's dialect spells them (``int(11) unsigned``, ``datetime(3)``) -> the Spark types its
            decoder gives columns of those types (null for a type it does not know), the same Spark expressions.
            A column that DDL creates then has the type the format's data brings: its first values do not retype
            it (a rewrite of the whole table) and a ``MODIFY`` that keeps the source type changes nothing. None: the
            DDL parser's own types (:func:`cdclake.ddl.spark_type_of`).
        ddl_dialect: the database type whose SQL the format's DDL text is in when a message names none (the Canal
            family's is MySQL's binlog: its ``TIMESTAMP`` is an instant, a ``DATETIME`` a wall clock, as
            ``ddl_types`` reads them); None: the parser tries its generic dialect first, then MySQL's.
    """

    name: str
    description: str
    decode: DecodeFn
    encoding: str = "json"
    operations: Mapping[str, Op] = field(default_factory=dict)
    options: Mapping[str, str] = field(default_factory=dict)
    option_aliases: Mapping[str, str] = field(default_factory=dict)
    validate_options: Callable[[FormatOptions], None] | None = None
    sniff: Callable[[Any], bool] | None = None
    examples: tuple[str, ...] = ()
    metadata: MetadataSupport | None = None
    batch_step: Callable[[DataFrame], DataFrame] | None = None
    reads_batch_to_plan: bool = False
    ddl_types: Callable[[Column], Column] | None = None
    ddl_dialect: str | None = None


def decode_batch(fmt: CdcFormat, messages: DataFrame, options: FormatOptions) -> DataFrame:
    """A batch of ``fmt`` messages -> its canonical events: ``fmt.decode``, then the format's batch step if any.

    The decoder's plan is built once per options and session configuration and reused (``formats._plans``). A
    format with ``metadata`` reads the batch's definition messages first, as its plain decode does; its plan is then
    reused per set of definitions if it is built from them alone (``MetadataSupport.plan_from_definitions``).
    """
    if fmt.metadata is None and not fmt.reads_batch_to_plan:
        decoded = _plans.decode_reusing_plan(fmt.decode, messages, options)
    elif fmt.metadata is None:
        decoded = fmt.decode(messages, options)
    elif fmt.metadata.plan_from_definitions:
        known = collect_metadata(fmt.metadata.extract(messages, options))
        decoded = decode_batch_with_metadata(fmt, messages, options, known)
    else:  # its plain decode reads the batch's messages to build its plan: built anew for each batch
        decoded = fmt.decode(messages, options)
    return decoded if fmt.batch_step is None else fmt.batch_step(decoded)


def decode_batch_with_metadata(
    fmt: CdcFormat, messages: DataFrame, options: FormatOptions, known: Sequence[TableMetadata]
) -> DataFrame:
    """A batch of messages of a format with ``metadata`` -> its canonical events, decoded with the table definitions
    ``known`` (``MetadataSupport.decode``); the plan is reused per set of definitions where the format allows it."""
    assert fmt.metadata is not None
    if fmt.metadata.plan_from_definitions:
        return _plans.decode_with_definitions_reusing_plan(fmt.metadata.decode, messages, options, known)
    return fmt.metadata.decode(messages, options, known)


JAVA_CHARSET_SETTINGS: Final = {"spark.sql.legacy.javaCharsets": "true", "spark.sql.legacy.codingErrorAction": "true"}
"""What :func:`analysed_with_java_charsets` sets while a decoder is analysed."""


def analysed_with_java_charsets(decode: DecodeFn) -> DecodeFn:
    """``decode``, whose ``decode()``/``encode()`` expressions may then name any charset the JVM has (GBK, Big5...)
    and give U+FFFD (``?`` when encoding) for input they cannot convert, where Spark would fail the whole batch.

    Spark reads both settings when it analyses each ``decode``/``encode`` call and keeps them in the expression, so
    they are set on the session only while ``decode`` builds its (eagerly analysed) frame, then restored. A decoder
    that uses this must check for replaced input itself (``_avro_images.character``). The lock (``_plans``'s, held
    while any decoder's template is analysed) keeps two threads' restores from leaving the settings on and other
    decoders' templates from being built with them. Other analysis on another thread meanwhile (none of cdclake's
    own calls ``decode``/``encode``) would see them too: wider charsets, and bad input replaced instead of failing.
    """

    @functools.wraps(decode)
    def decode_with_java_charsets(messages: DataFrame, options: FormatOptions) -> DataFrame:
        conf = messages.sparkSession.conf
        with _plans.analysis_lock:
            previous = {key: conf.get(key, None) for key in JAVA_CHARSET_SETTINGS}
            for key, setting in JAVA_CHARSET_SETTINGS.items():
                conf.set(key, setting)
            try:
                return decode(messages, options)
            finally:
                for key, before in previous.items():
                    if before is None:
                        conf.unset(key)
                    else:
                        conf.set(key, before)

    return decode_with_java_charsets


def op_from_code(code: Column, mapping: Mapping[str, Op]) -> Column:
    """Canonical op for a vendor op code; null when the code is not in ``mapping`` (the caller reports it)."""
    result: Column | None = None
    for vendor, canonical in mapping.items():
        result = (F.when if result is None else result.when)(code == F.lit(vendor), F.lit(canonical.value))
    return result if result is not None else F.lit(None).cast("string")


def exact_text_image(image: Column) -> Column:
    """A JSON object parsed as ``MAP<STRING, VARIANT>`` -> ``MAP<STRING, STRING>`` with every value's exact text.

    Parse row images whose values may be JSON numbers with fractions as ``MAP<STRING, VARIANT>`` and convert them
    with this: reading a JSON number straight into a STRING goes through a double in Spark's JSON reader
    (``12345678901234567890.1234`` -> ``1.2345678901234567E19``); a VARIANT keeps the decimal exactly. Strings come
    out unquoted, JSON null as SQL NULL, nested objects and arrays as JSON text.

    A cast of the whole map (generated code), not ``transform_values`` (a lambda, evaluated value by value without
    code generation): the same texts, and with the decode benchmark's workloads (20,000 events, 2 cores, best of 3,
    interleaved) Canal 2.29 -> 2.03 s, Maxwell 4.25 -> 3.88 s, Qlik JSON 4.73 -> 4.40 s, Shareplex 1.70 -> 1.62 s.
    An array of images: cast it to ``ARRAY<MAP<STRING, STRING>>`` (:data:`EXACT_TEXT_IMAGES`).
    """
    return image.cast(EXACT_TEXT_IMAGE)


EXACT_TEXT_IMAGE: Final = "map<string, string>"
"""The type :func:`exact_text_image` casts a ``MAP<STRING, VARIANT>`` image to."""
EXACT_TEXT_IMAGES: Final = f"array<{EXACT_TEXT_IMAGE}>"
"""An array of ``MAP<STRING, VARIANT>`` images cast to this is each image's :func:`exact_text_image`."""


def div(value: Column, divisor: int) -> Column:
    """Exact floor division of a bigint column by a positive constant. Not ``floor(value / divisor)``: ``/`` divides
    doubles, which hold a long exactly only up to 2**53, so a millisecond count near the end of the timestamp range
    (about 9.1e15, year 290,000) could floor to the next second."""
    return F.floor(value.cast("decimal(38,0)") / F.lit(divisor)).cast("bigint")


_EPOCH_LIMITS: Final = {"s": 9_223_372_036_854, "ms": 9_223_372_036_854_775}
"""The largest whole number of seconds and milliseconds since the epoch whose microseconds fit a long."""


def epoch_timestamp(value: Column, unit: str) -> Column:
    """``timestamp_seconds`` (``unit`` ``s``) or ``timestamp_millis`` (``ms``) of a whole number since the epoch, NULL
    (as when the message has none) beyond what a Spark timestamp holds (microseconds in a long, about 292,000 years
    either side of 1970): there both functions fail the whole batch (``long overflow``). Only a corrupt field is that
    far out; the time of an event is not part of its row."""
    limit = _EPOCH_LIMITS[unit]
    convert = F.timestamp_seconds if unit == "s" else F.timestamp_millis
    return F.when(value.between(-limit, limit), convert(value))


DUPLICATE_KEY: Final = "_duplicate_key"
"""The column :func:`with_unique_keys` adds: where a JSON object read as a MAP repeats a key, else null."""


def values_in_key_order(mapping: Column, keys: Column) -> Column:
    """``mapping``'s values for ``keys`` (an array), in their order: NULL for a key it lacks.

    When ``mapping`` lists exactly ``keys``, in that order (a vendor writes a row's values and its column types from
    one column list), they are its values as they stand; otherwise each key is looked up. Spark finds a map key by
    scanning the keys, so a lookup per key costs the square of the row's width."""
    return F.when(keys == F.map_keys(mapping), F.map_values(mapping)).otherwise(F.transform(keys, lambda k: mapping[k]))


def with_unique_keys(df: DataFrame, parsed: Column, name: str) -> DataFrame:
    """``df`` plus the parsed JSON message ``parsed`` as column ``name``, null where one of its JSON objects read as a
    MAP (at any depth of structs and arrays) repeats a key, and :data:`DUPLICATE_KEY`, which says where (null when no
    object does). Report it as the message's error before anything else (a dead letter).

    RFC 8259 (4) leaves what a repeated name means to the reader. ``from_json`` keeps both entries in the MAP, and the
    first expression that builds a map from it (``map_concat``, ``map_from_arrays``) failed the whole batch with
    ``DUPLICATED_MAP_KEY``; a lookup by name finds one entry only where a format counts one per name (Canal's type
    maps: an index out of bounds, the batch failed too). Nothing below reads such a message's maps.
    """
    staged = df.select("*", parsed.alias("_json_read"))
    read = F.col("_json_read")
    problem = first_error(*_repeated_keys(read, staged.schema["_json_read"].dataType, ""))
    staged = staged.select("*", problem.alias(DUPLICATE_KEY))
    return staged.select(
        *(F.col(c) for c in df.columns), F.when(F.col(DUPLICATE_KEY).isNull(), read).alias(name), DUPLICATE_KEY
    )


def _repeated_keys(value: Column, data_type: DataType, path: str) -> list[tuple[Column, str]]:
    """(condition, message) for every MAP in ``value`` of type ``data_type``: whether it repeats a key."""

    def repeats(m: Column) -> Column:
        return F.size(F.array_distinct(F.map_keys(m))) < F.size(m)

    if isinstance(data_type, MapType):
        return [(repeats(value), f"a JSON object repeats a key ({path or 'the message'})")]
    if isinstance(data_type, StructType):
        return [
            check
            for fld in data_type.fields
            if not fld.name.startswith("_")
            for check in _repeated_keys(value[fld.name], fld.dataType, f"{path}.{fld.name}" if path else fld.name)
        ]
    if isinstance(data_type, ArrayType) and _has_map(data_type.elementType):

        def any_repeats(x: Column) -> Column:
            conditions = [c for c, _ in _repeated_keys(x, data_type.elementType, path)]
            return functools.reduce(lambda a, b: a | F.coalesce(b, F.lit(False)), conditions, F.lit(False))

        return [(F.exists(value, any_repeats), f"a JSON object repeats a key ({path}[])")]
    return []


def _has_map(data_type: DataType) -> bool:
    if isinstance(data_type, MapType):
        return True
    if isinstance(data_type, ArrayType):
        return _has_map(data_type.elementType)
    return isinstance(data_type, StructType) and any(_has_map(f.dataType) for f in data_type.fields)


def with_missing_as_null(row: Column, names: Column) -> Column:
    """``row`` plus every one of ``names`` it lacks, as NULL (null when ``row`` is). Without a lambda: ``row`` is
    read several times, so it should be a column reference or a cheap expression, never an image being built."""
    missing = F.array_except(names, F.map_keys(row))
    added = F.map_concat(row, F.map_from_arrays(missing, F.array_repeat(F.lit(None).cast("string"), F.size(missing))))
    # The usual row has exactly the declared columns, in their order: one array comparison instead of a hash set.
    return F.when(F.map_keys(row) == names, row).otherwise(added)


def first_error(*checks: tuple[Column, str | Column]) -> Column:
    """The message of the first check whose condition is true, else null. Null conditions count as false."""
    result: Column | None = None
    for condition, message in checks:
        text = F.lit(message) if isinstance(message, str) else message
        guard = F.coalesce(condition, F.lit(False))
        result = F.when(guard, text) if result is None else result.when(guard, text)
    return result if result is not None else F.lit(None).cast("string")


def _bad_identifier(name: Column) -> Column:
    return (
        name.isNull()
        | (F.length(name) == 0)
        | (F.length(name) > MAX_IDENTIFIER_LENGTH)
        | name.rlike(r"[\x00-\x1f\x7f]")
    )


def _bad_column_name(name: Column) -> Column:
    reserved = F.lower(name).startswith(model.METADATA_PREFIX) & (name != F.lit(model.ROW_ID_COLUMN))
    # Spaces and `,;{}()=` are fine: a Delta table whose columns have them is created with column mapping
    # (cdclake.sinks.delta.needs_column_mapping). Control characters are not, as in table names.
    return (
        name.isNull()
        | (F.length(name) == 0)
        | (F.length(name) > MAX_IDENTIFIER_LENGTH)
        | reserved
        | name.rlike(r"[\x00-\x1f\x7f]")
    )


_NAME_SEPARATOR: Final = "\n"
"""Joins a row's column names into one string for the lambda-free checks; a bad character in a name itself."""

_MAYBE_BAD_NAMES: Final = (
    r"(?:^|\n)(?:\n|$)"  # an empty name
    r"|[\x00-\x09\x0b-\x1f\x7f]"  # a bad character other than the separator
    rf"|[^\n]{{{MAX_IDENTIFIER_LENGTH + 1},}}"  # too long (UTF-16 units >= characters: never misses one)
    rf"|(?:^|\n)(?!{model.ROW_ID_COLUMN}(?:\n|$))(?i:{model.METADATA_PREFIX})"  # the reserved prefix
)


def _names_may_be_bad(names: Column) -> Column:
    """False only if every name in ``names`` (not null) passes :func:`_bad_column_name`; true when one may fail.

    One regular expression over the joined names instead of a lambda per name: Spark evaluates lambdas without code
    generation, element by element, and this runs for every row event. A name holding the separator is caught by
    counting separators; a name that only looks bad here is judged exactly by the caller.
    """
    joined = F.array_join(names, _NAME_SEPARATOR)
    separators = F.length(joined) - F.length(F.replace(joined, F.lit(_NAME_SEPARATOR), F.lit("")))
    return (F.size(names) > 0) & (
        (F.size(F.array_compact(names)) < F.size(names))
        | (separators != F.size(names) - 1)
        | joined.rlike(_MAYBE_BAD_NAMES)
    )


# Columns that _stage_checks adds and _checks reads.
_IS_ROW_OP: Final = "_chk_is_row_op"
_NAMES: Final = "_chk_names"
_DECLARED: Final = "_chk_declared"
_BAD_NAMES: Final = "_chk_bad_names"
_ALIGNED: Final = {model.AFTER: "_chk_aligned_after", model.BEFORE: "_chk_aligned_before"}
_UNDECLARED_AFTER: Final = "_chk_undeclared_after"
_UNDECLARED_BEFORE: Final = "_chk_undeclared_before"
_INVALID_AFTER: Final = "_chk_invalid_after"
_INVALID_BEFORE: Final = "_chk_invalid_before"


def _declared_columns(columns: Column) -> Column:
    return F.coalesce(columns, F.array().cast(f"array<{model.COLUMN_TYPE.simpleString()}>"))


def _invalid_values(image: Column, columns: Column) -> Column:
    """The declared columns whose value in ``image`` is not valid canonical text for their type, in column order."""
    return F.filter(_declared_columns(columns), lambda c: ~model.text_is_valid(image[c["name"]], c["spark_type"]))


def _stage_checks(df: DataFrame) -> DataFrame:
    """``df`` with the per-row inputs of :func:`_checks` computed once, as columns.

    Staged, because Spark evaluates an expression again wherever it occurs: inside a lambda (once per element) and
    in each condition of the ``first_error`` CASE. Only row events are checked, so the rest get nulls.
    """
    first, second = _check_stages()
    return df.select("*", *first).select("*", *second)


@functools.cache
def _check_stages() -> tuple[tuple[Column, ...], tuple[Column, ...]]:
    """The two staged column lists of :func:`_stage_checks` (built once per process, see the module doc)."""
    op, columns = F.col(model.OP), F.col(model.COLUMNS)
    is_row_op = op.isin(*(o.value for o in model.ROW_OPS))
    names = F.when(is_row_op, columns["name"])
    declared_names = F.coalesce(names, F.array().cast("array<string>"))
    first = (
        F.coalesce(is_row_op, F.lit(False)).alias(_IS_ROW_OP),
        names.alias(_NAMES),
        declared_names.alias(_DECLARED),
        # Whether an image's keys are the declared names in their order (the usual row): both image checks then
        # need no lookup by name.
        *((F.map_keys(F.col(image)) == declared_names).alias(flag) for image, flag in _ALIGNED.items()),
    )
    row, declared = F.col(_IS_ROW_OP), F.col(_DECLARED)

    def aligned(image: str) -> Column:
        return F.col(_ALIGNED[image])

    def undeclared(image_name: str) -> Column:
        # array_except keeps the image's order (the first one is reported) and is generated code, not a lambda; an
        # aligned image has none, found without a hash set.
        image = F.col(image_name)
        return F.when(
            row,
            F.when(aligned(image_name), F.array().cast("array<string>")).otherwise(
                F.array_except(F.map_keys(image), declared)
            ),
        )

    def invalid(image_name: str) -> Column:
        image = F.col(image_name)
        # Only whether there is one (stops at the first): which one, for the message, is worked out again for the
        # rows that have one. text_is_valid is never null, so this is size(_invalid_values(..)) > 0.
        by_name = F.exists(
            _declared_columns(columns), lambda c: ~model.text_is_valid(image[c["name"]], c["spark_type"])
        )
        # An aligned image pairs its values with the declared types by position: no map lookup per value.
        by_position = F.array_contains(
            F.zip_with(
                F.map_values(image), _declared_columns(columns)["spark_type"], lambda v, t: ~model.text_is_valid(v, t)
            ),
            True,
        )
        return F.when(row & image.isNotNull(), F.when(aligned(image_name), by_position).otherwise(by_name))

    second = (
        F.when(_names_may_be_bad(declared), F.filter(F.col(_NAMES), _bad_column_name))
        .otherwise(F.when(row, F.array().cast("array<string>")))
        .alias(_BAD_NAMES),
        undeclared(model.AFTER).alias(_UNDECLARED_AFTER),
        undeclared(model.BEFORE).alias(_UNDECLARED_BEFORE),
        invalid(model.AFTER).alias(_INVALID_AFTER),
        invalid(model.BEFORE).alias(_INVALID_BEFORE),
    )
    return first, second


@functools.cache
def _checks() -> Column:
    """Errors every format must detect, in the order they are reported (over the columns of :func:`_stage_checks`)."""
    op, table, columns = F.col(model.OP), F.col(model.TABLE), F.col(model.COLUMNS)
    is_row_op = F.col(_IS_ROW_OP)
    column_names, declared, bad_names = F.col(_NAMES), F.col(_DECLARED), F.col(_BAD_NAMES)

    def first_invalid(image: Column, which: str) -> Column:
        bad = _invalid_values(image, columns)[0]
        return F.format_string(
            f"{which} value %s of column %s is not a valid %s (declared %s)",
            F.substring(image[bad["name"]], 1, 80),
            bad["name"],
            bad["spark_type"],
            bad["vendor_type"],
        )

    return first_error(
        (
            is_row_op
            & (_bad_identifier(table) | (F.col(model.DATABASE).isNotNull() & _bad_identifier(F.col(model.DATABASE)))),
            F.format_string("invalid table identifier %s.%s", F.col(model.DATABASE), table),
        ),
        (
            is_row_op & (F.size(bad_names) > 0),
            F.format_string(
                "invalid column name %s (empty, too long, control characters, or the reserved prefix %s)",
                # As a JSON string: a control character shows as its escape (\t, \u0001), not as itself.
                F.regexp_extract(F.to_json(F.array(bad_names[0])), r"^\[(.*)\]$", 1),
                F.lit(model.METADATA_PREFIX),
            ),
        ),
        (
            # The names passed the check above, so none holds the separator: lower-case them all at once.
            is_row_op
            & (
                F.size(F.array_distinct(F.split(F.lower(F.array_join(column_names, _NAME_SEPARATOR)), _NAME_SEPARATOR)))
                < F.size(column_names)
            ),
            F.lit("duplicate column names (names are compared case-insensitively)"),
        ),
        (
            is_row_op & (F.size(F.col(_UNDECLARED_AFTER)) > 0),
            F.format_string("after image has column %s that the message does not declare", F.col(_UNDECLARED_AFTER)[0]),
        ),
        (
            is_row_op & (F.size(F.col(_UNDECLARED_BEFORE)) > 0),
            F.format_string(
                "before image has column %s that the message does not declare", F.col(_UNDECLARED_BEFORE)[0]
            ),
        ),
        (is_row_op & F.col(_INVALID_AFTER), first_invalid(F.col(model.AFTER), "after")),
        (is_row_op & F.col(_INVALID_BEFORE), first_invalid(F.col(model.BEFORE), "before")),
        (
            is_row_op & (F.size(F.array_except(F.coalesce(F.col(model.KEY_COLUMNS), F.array()), declared)) > 0),
            F.lit("a key column is not among the declared columns"),
        ),
        ((op == Op.INSERT) & F.col(model.AFTER).isNull(), F.lit("INSERT without an after image")),
        ((op == Op.UPSERT) & F.col(model.AFTER).isNull(), F.lit("UPSERT without an after image")),
        ((op == Op.DELETE) & F.col(model.BEFORE).isNull(), F.lit("DELETE without a before image")),
        (
            (op == Op.UPDATE) & F.col(model.AFTER).isNull() & F.col(model.BEFORE).isNull(),
            F.lit("UPDATE without before or after image"),
        ),
        ((op == Op.TRUNCATE) & _bad_identifier(table), F.lit("TRUNCATE without a table")),
    )


def finish(df: DataFrame, format_name: str, format_error: Column) -> DataFrame:
    """Projects a format's intermediate frame onto the canonical schema and adds the shared checks.

    Args:
        df: must have the message columns plus every canonical column the format knows; missing canonical
            columns become nulls.
        format_name: registry name, stored in ``format``.
        format_error: the format's own error (malformed envelope, unknown op...), null when fine; it wins over
            the shared checks.
    """
    # Keyed by the canonical columns present only: helper columns vary with the format's intermediate steps.
    present = frozenset((*model.CANONICAL_COLUMNS, MESSAGE_HEADERS)).intersection(df.columns)
    projection, final = _canonical_projection(format_name, present)
    projected = _stage_checks(df.select(*projection, format_error.alias("_format_error")))
    return projected.select(*final).select(*model.CANONICAL_COLUMNS)


def not_decoded(messages: DataFrame, reason: str) -> DataFrame:
    """Messages no format is set for, as canonical events that are dead letters for ``reason``; they record no
    format (``dlq replay --format NAME`` reads them)."""
    return finish(messages, "", F.lit(reason)).withColumn(model.FORMAT, F.lit(None).cast("string"))


_RENAMED_FROM_MESSAGE: Final = {
    model.TOPIC: "topic",
    model.PARTITION: "partition",
    model.OFFSET: "offset",
    model.KAFKA_TIMESTAMP: "timestamp",
    model.RAW_KEY: MESSAGE_KEY,
    model.RAW_VALUE: MESSAGE_VALUE,
    model.RAW_HEADERS: MESSAGE_HEADERS,
}


@functools.cache
def _canonical_projection(format_name: str, present: frozenset[str]) -> tuple[tuple[Column, ...], tuple[Column, ...]]:
    """:func:`finish`'s two projections for a frame with the columns ``present`` (built once, see the module doc):
    onto the canonical schema (the error aside), then from the staged checks to the canonical columns."""
    selected: list[Column] = []
    for fld in model.CANONICAL_SCHEMA.fields:
        if fld.name == model.FORMAT:
            column = F.lit(format_name)
        elif fld.name == model.RAW_HEADERS:
            column = F.col(MESSAGE_HEADERS) if MESSAGE_HEADERS in present else F.lit(None)
        elif fld.name in _RENAMED_FROM_MESSAGE:
            column = F.col(_RENAMED_FROM_MESSAGE[fld.name])
        elif fld.name == model.ERROR:
            continue
        elif fld.name in present:
            column = F.col(fld.name)
        elif fld.name == model.SUB_INDEX:
            column = F.lit(0)
        elif fld.name == model.AFTER_IS_PARTIAL:
            column = F.lit(False)
        else:
            column = F.lit(None)
        selected.append(column.cast(fld.dataType).alias(fld.name))
    error = F.coalesce(F.col("_format_error"), _checks())
    final = (*(F.col(c) for c in model.CANONICAL_COLUMNS if c != model.ERROR), error.alias(model.ERROR))
    return tuple(selected), final
