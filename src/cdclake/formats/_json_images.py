"""Row images of JSON formats whose values carry Kafka Connect types, or no types at all (shared helpers).

Used by the Debezium family (``debezium.py``: Connect schema or inference), Maxwell and OGG (inference only). Column
descriptions are Connect-style fields ``struct<field, type, name, parameters>``; values are VARIANTs (exact
numbers) converted to canonical text (``cdclake.model``). Everything is staged (:func:`image_stages`) so that Spark
evaluates each large expression once per row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdclake import model
from cdclake.formats.base import div, exact_text_image
from cdclake.spark import is_local_checkpoint

_FIELD: Final = "struct<field: string, type: string, name: string, parameters: map<string, string>>"

# debezium.md 5: logical type names.
DECIMAL: Final = "org.apache.kafka.connect.data.Decimal"
VARIABLE_DECIMAL: Final = "io.debezium.data.VariableScaleDecimal"
DATES: Final = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
MILLI_TIMESTAMPS: Final = ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp")
MICRO_TIMESTAMP: Final = "io.debezium.time.MicroTimestamp"
NANO_TIMESTAMP: Final = "io.debezium.time.NanoTimestamp"
ZONED_TIMESTAMP: Final = "io.debezium.time.ZonedTimestamp"
MILLI_TIMES: Final = ("io.debezium.time.Time", "org.apache.kafka.connect.data.Time")
MICRO_TIME: Final = "io.debezium.time.MicroTime"
NANO_TIME: Final = "io.debezium.time.NanoTime"

CONNECT_TYPES: Final = {
    "int8": "tinyint",
    "int16": "smallint",
    "int32": "int",
    "int64": "bigint",
    "float32": "float",
    "float64": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "binary",
    "struct": "string",
    "array": "string",
    "map": "string",
}
"""Connect schema type -> Spark type when no logical name says otherwise (complex values become JSON text)."""

_BASE: Final = 1_000_000_000

NULL_VALUE: Final = "null"
"""Vendor type of an inferred column whose value is JSON null (:func:`inferred_kinds`)."""


# ----------------------------------------------------------------------------------------------------------------
# Shared value helpers


def let(value: Column, body: Callable[[Column], Column]) -> Column:
    """``body(value)`` with ``value`` computed once (a lambda variable), however often ``body`` refers to it."""
    return F.transform(F.array(value), body)[0]


def _mul_add(limbs: Column, factor: int, carry: Column) -> Column:
    """``limbs * factor + carry`` on a little-endian array of base-10^9 limbs (factor, carry < 1000)."""
    return F.aggregate(
        limbs,
        F.struct(F.array().cast("array<bigint>").alias("out"), carry.cast("bigint").alias("carry")),
        lambda acc, limb: let(
            limb * factor + acc["carry"],
            lambda x: F.struct(F.array_append(acc["out"], x % _BASE).alias("out"), div(x, _BASE).alias("carry")),
        ),
        lambda acc: F.when(acc["carry"] > 0, F.array_append(acc["out"], acc["carry"])).otherwise(acc["out"]),
    )


def _limbs_text(limbs: Column) -> Column:
    return F.regexp_replace(
        F.array_join(
            F.transform(
                F.reverse(limbs),
                lambda x, i: F.when(i == 0, x.cast("string")).otherwise(F.lpad(x.cast("string"), 9, "0")),
            ),
            "",
        ),
        r"^0+(?=\d)",
        "",
    )


def _place_point(digits: Column, scale: Column) -> Column:
    """Unsigned digits and a scale -> plain decimal text."""
    return let(
        F.lpad(digits, F.greatest(F.length(digits), scale + 1), "0"),
        lambda padded: F.when(
            scale > 0,
            F.concat(
                F.substring(padded, F.lit(1), F.length(padded) - scale),
                F.lit("."),
                F.substring(padded, F.length(padded) - scale + 1, scale),
            ),
        ).otherwise(F.concat(digits, F.repeat(F.lit("0"), -scale))),
    )


MAX_UNSCALED_BYTES: Final = 1024
"""The longest unscaled integer :func:`unscaled_text` reads: 2,466 digits (MySQL's DECIMAL(65) takes 28 bytes,
PostgreSQL's NUMERIC(1000) 416). Its conversion is quadratic in the length, a lambda per byte over a growing array of
limbs (one value on one core: 1 KiB 1.4 s, 4 KiB 35 s), so one longer value would hold its batch for minutes or
hours; it is a value that does not fit instead (a dead letter with its text)."""
MAX_DECIMAL_SCALE: Final = 16_383
"""The largest scale, either sign, that :func:`unscaled_text` places (PostgreSQL's NUMERIC keeps up to 16,383 digits
after the point, Oracle's NUMBER scales -84 to 127). The text is padded with up to that many zeros: a corrupt scale
of 2**31 - 1 ran the driver out of memory."""


def unscaled_text(b64: Column, scale: Column) -> Column:
    """debezium.md 5: base64 of a big-endian two's-complement unscaled integer + scale -> exact decimal text.

    Any length up to :data:`MAX_UNSCALED_BYTES` (PostgreSQL NUMERIC and MySQL DECIMAL(65) exceed 128 bits), done with
    base-10^9 limbs. Null for text that is not base64, empty bytes, longer ones, or a scale beyond
    :data:`MAX_DECIMAL_SCALE`.
    """

    def from_octets(octets: Column) -> Column:
        negative = F.get(octets, 0) >= 128
        magnitude_bytes = F.when(negative, F.transform(octets, lambda b: 255 - b)).otherwise(octets)
        digits = F.aggregate(
            magnitude_bytes,
            F.array(F.lit(0).cast("bigint")),
            lambda acc, b: _mul_add(acc, 256, b.cast("bigint")),
            lambda limbs: _limbs_text(F.when(negative, _mul_add(limbs, 1, F.lit(1))).otherwise(limbs)),
        )
        sign = F.when(negative, F.lit("-")).otherwise(F.lit(""))
        placeable = scale.between(-MAX_DECIMAL_SCALE, MAX_DECIMAL_SCALE)
        return F.when((F.size(octets) >= 1) & placeable, F.concat(sign, _place_point(digits, scale)))

    def from_hex(hexed: Column) -> Column:
        octets = F.transform(
            F.sequence(F.lit(0), (F.length(hexed) / 2 - 1).cast("int")),
            lambda i: F.conv(F.substring(hexed, i * 2 + 1, F.lit(2)), 16, 10).cast("int"),
        )
        return F.when(F.length(hexed).between(2, 2 * MAX_UNSCALED_BYTES), let(octets, from_octets))

    return let(F.hex(F.try_to_binary(b64, F.lit("base64"))), from_hex)


def _time_text(micros_expr: Column) -> Column:
    """Microseconds since midnight -> ``[-]HH:mm:ss.ffffff``; hours may exceed 23 and 99 (MySQL TIME reaches 838), and
    any long is text (``-2562047788:00:54.775808``)."""

    def fmt(micros: Column) -> Column:
        # As a decimal: abs of the smallest long overflows, which under ANSI fails the batch, not the message.
        a = F.abs(micros.cast("decimal(20,0)"))
        return F.concat(
            F.when(micros < 0, F.lit("-")).otherwise(F.lit("")),
            let(div(a, 3_600_000_000).cast("string"), lambda h: F.lpad(h, F.greatest(F.length(h), F.lit(2)), "0")),
            F.lit(":"),
            F.lpad(div(a % 3_600_000_000, 60_000_000).cast("string"), 2, "0"),
            F.lit(":"),
            F.lpad(div(a % 60_000_000, 1_000_000).cast("string"), 2, "0"),
            F.lit("."),
            F.lpad((a % 1_000_000).cast("string"), 6, "0"),
        )

    return let(micros_expr, fmt)


def spark_type(info: Column) -> Column:
    """Spark type for a column described by a Connect field ``struct<field, type, name, parameters>``."""
    name, typ, params = info["name"], info["type"], info["parameters"]
    scale = params["scale"].try_cast("int")
    precision = params["connect.decimal.precision"].try_cast("int")
    by_type = F.element_at(F.create_map(*[F.lit(x) for kv in CONNECT_TYPES.items() for x in kv]), typ)
    decimal = F.when(
        scale.between(0, 38)
        & F.coalesce(precision, F.lit(38)).between(1, 38)
        & (scale <= F.coalesce(precision, F.lit(38))),
        F.format_string("decimal(%d,%d)", F.coalesce(precision, F.lit(38)), scale),
    ).when(scale.isNotNull(), F.lit("string"))
    return (
        F.when(name == DECIMAL, decimal)
        .when(name == VARIABLE_DECIMAL, F.lit("string"))
        .when(name.isin(*DATES), F.lit("date"))
        .when(name.isin(*MILLI_TIMESTAMPS, MICRO_TIMESTAMP, NANO_TIMESTAMP, ZONED_TIMESTAMP), F.lit("timestamp"))
        .when(name.isin(*MILLI_TIMES, MICRO_TIME, NANO_TIME), F.lit("string"))
        .otherwise(by_type)
    )


def canonical_value(value: Column, info: Column, text: Column | None = None) -> Column:
    """One JSON value (VARIANT) of a column -> canonical text; null for JSON null and for values that do not fit
    (the caller compares with the raw text to report those). ``text``: ``value`` cast to string, if the caller has
    it already."""
    name, typ = info["name"], info["type"]
    text = value.cast("string") if text is None else text
    scale = info["parameters"]["scale"].try_cast("int")
    whole = text.try_cast("bigint")
    zoned = F.when(
        text.rlike(r"^\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d(:?\d\d)?)$"),
        F.unix_micros(text.try_cast("timestamp")).cast("string"),
    )
    variable = unscaled_text(F.try_variant_get(value, "$.value", "string"), F.try_variant_get(value, "$.scale", "int"))
    converted = (
        F.when(text.isNull(), F.lit(None))
        .when(name == DECIMAL, unscaled_text(text, scale))
        .when(name == VARIABLE_DECIMAL, variable)
        .when(name.isin(*DATES), F.date_from_unix_date(text.try_cast("int")).cast("string"))
        .when(name.isin(*MILLI_TIMESTAMPS), F.try_multiply(whole, F.lit(1000)).cast("string"))
        .when(name == MICRO_TIMESTAMP, whole.cast("string"))
        .when(name == NANO_TIMESTAMP, div(whole, 1000).cast("string"))
        .when(name == ZONED_TIMESTAMP, zoned)
        .when(name.isin(*MILLI_TIMES), _time_text(F.try_multiply(whole, F.lit(1000))))
        .when(name == MICRO_TIME, _time_text(whole))
        .when(name == NANO_TIME, _time_text(div(whole, 1000)))
        .when(typ.isin("struct", "array", "map"), F.to_json(value))
        .otherwise(text)
    )
    return converted


CONNECT_SCHEMA: Final = f"STRUCT<fields: ARRAY<STRUCT<field: STRING, fields: ARRAY<{_FIELD}>>>>"
"""The parts of a Kafka Connect value schema that :func:`schema_fields` reads (parse the ``schema`` with it).

Typed rather than a VARIANT: the JSON reader skips what is not listed (``optional``, ``default``, the source block's
fields, nested ``fields`` of struct columns) instead of building a variant of the whole schema, which each message
repeats, and then casting parts of it back. Measured on 60,000 Debezium messages (2 cores): parsing the message and
picking its fields 1.40 -> 0.82 s; the whole decoder 5.5-5.7 -> 4.8-4.9 s. A schema this type cannot read (the spec's
examples abbreviate field lists as text) is read as a VARIANT instead (:func:`variant_schema_fields`), for those
messages only."""


def schema_fields(schema: Column) -> Column:
    """The row fields declared by a Connect value schema (typed by :data:`CONNECT_SCHEMA`): ``after``'s fields,
    then those only ``before`` declares.

    Debezium declares one Value struct for both images (debezium.md 1). Lindorm generates the schema from the
    payload (lindorm-debezium.md "Layout"), so a column whose cell an update deleted is only in ``before``'s struct
    ("Column deletion"): it is still a column of the message.
    """
    top = schema["fields"]

    def image(which: str) -> Column:
        """The fields of the first ``which`` element of the envelope's fields that declares a list of fields."""
        return F.get(F.filter(top, lambda f: (f["field"] == which) & f["fields"].isNotNull()), 0)["fields"]

    # Each image's fields are picked once (a lambda variable), not once per use.
    return let(F.struct(image("after").alias("a"), image("before").alias("b")), lambda i: _declared(i["a"], i["b"]))


def variant_schema_fields(schema: Column) -> Column:
    """:func:`schema_fields` of a Connect value schema parsed as a VARIANT: any JSON, each part cast when read (an
    element's field list that is not one counts as absent)."""
    top = F.try_variant_get(schema, "$.fields", "array<struct<field: string, fields: variant>>")

    def image(fields: Column, which: str) -> Column:
        typed = F.transform(
            F.filter(fields, lambda f: f["field"] == which),
            lambda f: F.try_variant_get(f["fields"], "$", f"array<{_FIELD}>"),
        )
        return F.get(F.filter(typed, lambda f: f.isNotNull()), 0)

    # Each image's fields are cast from the variant once (lambda variables), not once per use.
    return let(top, lambda t: let(image(t, "after"), lambda a: let(image(t, "before"), lambda b: _declared(a, b))))


def _declared(after: Column, before: Column) -> Column:
    """``after``'s fields, then those only ``before`` declares (either may be null)."""
    none = F.array().cast(f"array<{_FIELD}>")
    only_before = F.filter(
        F.coalesce(before, none), lambda b: ~F.exists(F.coalesce(after, none), lambda a: a["field"] == b["field"])
    )
    # The usual message declares the same names in both (one Value struct): no search per field then.
    same_names = F.coalesce(before["field"] == after["field"], F.lit(False)) | before.isNull()
    return F.when(after.isNotNull(), F.when(same_names, after).otherwise(F.concat(after, only_before))).otherwise(
        before
    )


_NO_VALUES: Final = "map<string, variant>"
_INFERRED_KINDS: Final = "_inferred_kinds"

_KINDS: Final = (
    # (vendor type, Connect type) of each JSON kind; the Connect type gives the Spark type (CONNECT_TYPES).
    (NULL_VALUE, "string"),
    ("string", "string"),
    ("integer", "int64"),
    ("number", "float64"),
    ("boolean", "boolean"),
    ("object", "string"),
    ("array", "string"),
)


def inferred_kinds(before: Column, after: Column) -> Column:
    """The JSON kind of each column of schemaless ``MAP<STRING, VARIANT>`` images, as ``schema_of_variant`` names it
    (null when the value is absent): after's columns first, then those only before has (``map_zip_with`` keeps that
    order). A column's kind is its after value's unless that is null (absent or JSON null), else its before value's
    (an update to NULL keeps the type the before image shows). Stage it as a column: :func:`inferred_columns` and
    :func:`inferred_fields` read it twice.

    The kind, not the number's text, tells whether a number is integral (:func:`_json_kind`), so the message is not
    parsed a second time for the numbers' JSON text.
    """
    none = F.create_map().cast(_NO_VALUES)

    def kind(_name: Column, in_after: Column, in_before: Column) -> Column:
        value = F.when(in_after.isNull() | F.is_variant_null(in_after), in_before).otherwise(in_after)
        return F.schema_of_variant(value)

    return F.map_zip_with(F.coalesce(after, none), F.coalesce(before, none), kind)


def _json_kind(kind: Column, describe: Callable[[str, str], Column]) -> Column:
    """``describe(vendor type, Connect type)`` of a VARIANT kind (see :data:`_KINDS`), one branch evaluated."""
    described = {vendor: describe(vendor, connect) for vendor, connect in _KINDS}
    return (
        F.when(kind.isNull() | (kind == "VOID"), described[NULL_VALUE])
        .when(kind == "STRING", described["string"])
        .when(kind == "BIGINT", described["integer"])
        # A JSON integer beyond 64 bits is a DECIMAL(p,0) of 19 digits or more (declared bigint: the value does
        # not fit, a dead letter). A VARIANT drops a fraction's trailing zeros, so ``120.0`` is a DECIMAL(3,0):
        # below 19 digits a scale of 0 was written with a fraction (double), as is ``1.0e20`` (DOUBLE).
        .when(kind.rlike(r"^DECIMAL\((19|[23]\d),0\)$"), described["integer"])
        .when(kind.isin("DOUBLE", "FLOAT") | kind.startswith("DECIMAL("), described["number"])
        .when(kind == "BOOLEAN", described["boolean"])
        .when(kind.startswith("OBJECT"), described["object"])
        .when(kind.startswith("ARRAY"), described["array"])
        # JSON has no other kinds; a VARIANT parsed from JSON holds none.
        .otherwise(described["string"])
    )


def _described_kinds(kinds: Column, describe: Callable[[Column, str, str], Column]) -> Column:
    """``describe(column name, vendor type, Connect type)`` of each column of the staged :func:`inferred_kinds`."""
    return F.zip_with(
        F.map_keys(kinds),
        F.map_values(kinds),
        lambda name, kind: _json_kind(kind, lambda vendor, connect: describe(name, vendor, connect)),
    )


def inferred_fields(kinds: Column) -> Column:
    """Connect-style field descriptions (``struct<field, type, name, parameters>``, the vendor type in ``name``)
    of the staged :func:`inferred_kinds` ``kinds``."""
    return _described_kinds(
        kinds,
        lambda name, vendor, connect: F.struct(
            name.alias("field"),
            F.lit(connect).alias("type"),
            F.lit(vendor).alias("name"),
            F.create_map().cast("map<string,string>").alias("parameters"),
        ),
    )


def inferred_columns(kinds: Column) -> Column:
    """The canonical ``columns`` of the staged :func:`inferred_kinds` ``kinds``: the same as
    :func:`fields_columns` of :func:`inferred_fields`, built directly."""
    return _described_kinds(
        kinds,
        lambda name, vendor, connect: F.struct(
            name.alias("name"),
            F.lit(vendor).alias("vendor_type"),
            F.lit(CONNECT_TYPES[connect]).alias("spark_type"),
        ),
    )


def inferred_image_stages(df: DataFrame, payload: Column) -> DataFrame:
    """Adds ``_columns`` (the canonical ``columns``) and ``_before_text`` / ``_after_text`` (the canonical images) of
    a schemaless payload ``struct<before, after>`` of ``MAP<STRING, VARIANT>`` images (Maxwell, OGG).

    The same result as :func:`image_stages` with :func:`inferred_fields`, then :func:`fields_columns` and
    :func:`texts`, for a fraction of the work: an inferred type is one of ``bigint``, ``double``, ``string`` and
    ``boolean`` and no Connect logical type applies, so a value's canonical text is its JSON text (the VARIANT cast
    to string) and no value can fail its conversion. No per-value conversion, no map of column descriptions, no
    lookup by name.

    Measured with the decode benchmark's workloads (20,000 events, 2 idle cores, best of 3), against the Connect-style
    staging and a second parse for the numbers' JSON text used before: Maxwell 6.80 -> 5.73 s, OGG 4.40 -> 3.00 s;
    with :func:`inferred_kinds` alone (no second parse), schemaless Debezium 6.69 -> 5.09 s, Lindorm 3.19 -> 2.56 s.
    """
    staged = df.select(
        "*",
        inferred_kinds(payload["before"], payload["after"]).alias(_INFERRED_KINDS),
        exact_text_image(payload["before"]).alias("_before_text"),
        exact_text_image(payload["after"]).alias("_after_text"),
    )
    return staged.select("*", inferred_columns(F.col(_INFERRED_KINDS)).alias("_columns"))


def image_stages(
    df: DataFrame,
    payload: Column,
    fields: Column,
    unavailable: tuple[str, ...] = (),
) -> DataFrame:
    """Adds the typed-image columns ``_fields``, ``_info``, ``_after_pairs``, ``_before_pairs``, ``_partial``.

    Staged selects, so that Spark evaluates each big expression once. ``_*_pairs`` map each column to
    ``struct<raw, text>`` (the value's JSON text and its canonical text; text null + raw not null = does not fit).
    Values equal to one of ``unavailable`` are left out of the images (``_partial`` = after lost a column).
    """

    def available(image: Column) -> Column:
        if not unavailable:
            return image
        return F.map_filter(image, lambda _k, v: ~F.coalesce(v.cast("string").isin(*unavailable), F.lit(False)))

    staged = df.select(
        "*",
        fields.alias("_fields"),
        available(payload["after"]).alias("_after_in"),
        available(payload["before"]).alias("_before_in"),
        F.coalesce(F.size(available(payload["after"])) < F.size(payload["after"]), F.lit(False)).alias("_partial"),
    )
    staged = staged.select("*", _field_index())
    return staged.select(
        "*", _typed_pairs("_after_in").alias("_after_pairs"), _typed_pairs("_before_in").alias("_before_pairs")
    )


# Built once per process and reused by every batch (no Column argument: see cdclake.formats.base's module doc).
@functools.cache
def _field_index() -> Column:
    """``_info``: the staged ``_fields`` by column name; null when a name is null or repeated (a Connect schema with
    such a field: the shared checks make the message a dead letter for its column names), where ``map_from_arrays``
    would fail the whole batch (``NULL_MAP_KEY``, ``DUPLICATED_MAP_KEY``)."""
    fields = F.col("_fields")
    names = fields["field"]
    usable = F.size(F.array_distinct(F.array_compact(names))) == F.size(names)
    return F.when(usable, F.map_from_arrays(names, fields)).alias("_info")


@functools.cache
def _typed_pairs(image_name: str) -> Column:
    """The staged image ``image_name`` as column -> ``struct<raw, text>`` (see :func:`image_stages`)."""
    info = F.col("_info")
    return F.transform_values(
        F.col(image_name),
        lambda k, v: let(
            F.struct(info[k].alias("i"), v.cast("string").alias("raw")),
            lambda c: F.struct(
                c["raw"].alias("raw"),
                F.when(c["i"].isNotNull(), canonical_value(v, c["i"], c["raw"])).otherwise(c["raw"]).alias("text"),
            ),
        ),
    )


def type_nulls_in_batch(events: DataFrame, changed_only: Column) -> DataFrame:
    """Gives the inferred columns whose value is JSON null a type from the rest of the batch (a format's
    ``CdcFormat.batch_step``, run on its decoded events; rewrites ``columns``, ``after``, ``before``).

    A JSON null carries no type. Declaring it ``string`` would create a ``string`` lake column whenever the newest
    message of a table has a NULL there (the table takes its types from its newest message), e.g. for every column
    just added by ALTER TABLE. Instead a null takes the type that the newest message of the same table in the batch
    with a value declares for the column (its name, vendor type and Spark type). A column that is NULL in every
    message of its table in the batch is left out of the images and the declared columns: a full image without a
    column sets it NULL anyway, and the lake column is created, with the right type, by the first batch with a
    value. In a changed-only image (``changed_only``) an absent column keeps its stored value, so a null is left out
    only if the before image has the column (NULL before and after: unchanged); an update to NULL from an unknown
    value stays declared ``string``.

    Run on the decoded events, not inside the decoder: the batch is read twice (the declarations, then each event),
    and reading decoded events from a local checkpoint costs a fraction of parsing the messages twice (measured:
    the second parse was 34-47% of Maxwell, OGG and Debezium decoding). Batches without a null-valued inferred column
    (any Debezium topic with schemas) skip the join.

    Args:
        events: one format's decoded events (canonical columns).
        changed_only: over the canonical columns, true where the after image lists only changed columns.
    """
    # A batch step before it may have stored them already (debezium.key_changes_rejoined): a copy would only cost.
    events = events if is_local_checkpoint(events) else events.localCheckpoint(eager=True)
    columns = F.col(model.COLUMNS)

    def is_null_valued(c: Column) -> Column:
        return F.coalesce(c["vendor_type"] == NULL_VALUE, F.lit(False))

    if events.where(F.exists(columns, is_null_valued)).isEmpty():
        return events
    # The table's identity; a null part is told apart from an empty one.
    key = F.concat_ws(
        "\x00", *(F.coalesce(F.col(c), F.lit("\x01")) for c in (model.DATABASE, model.SCHEMA, model.TABLE))
    )
    declared = (
        events.select(
            key.alias("_table_key"),
            F.struct(F.col(model.PARTITION), F.col(model.OFFSET)).alias("_at"),
            # A dead letter's columns may have a null name (a Connect field without one): never a map key.
            F.explode(F.filter(columns, lambda c: ~is_null_valued(c) & c["name"].isNotNull())).alias("_c"),
        )
        .groupBy("_table_key", F.col("_c")["name"].alias("_column"))
        .agg(F.max_by(F.col("_c"), F.col("_at")).alias("_declared"))
        .groupBy("_table_key")
        .agg(F.map_from_entries(F.collect_list(F.struct("_column", "_declared"))).alias("_batch_columns"))
    )
    joined = events.withColumn("_table_key", key).join(F.broadcast(declared), "_table_key", "left")
    batch = F.col("_batch_columns")
    typed = F.transform(columns, lambda c: F.when(is_null_valued(c), F.coalesce(batch[c["name"]], c)).otherwise(c))
    always_null = F.filter(columns, lambda c: is_null_valued(c) & batch[c["name"]].isNull())["name"]
    # In a changed-only image a null is only left out where the before image says the column was NULL already.
    dropped = F.filter(
        always_null,
        lambda n: (
            ~F.coalesce(changed_only, F.lit(False))
            | F.coalesce(F.map_contains_key(F.col(model.BEFORE), n), F.lit(False))
        ),
    )
    # Staged: the list is computed once per row, not inside the lambdas that use it.
    staged = joined.withColumns({"_typed": typed, "_dropped": dropped})
    left_out = F.col("_dropped")

    def kept(image: Column) -> Column:
        return F.map_filter(image, lambda k, _v: ~F.array_contains(left_out, k))

    rewritten = staged.withColumns(
        {
            model.COLUMNS: F.filter(F.col("_typed"), lambda c: ~F.array_contains(left_out, c["name"])),
            model.AFTER: kept(F.col(model.AFTER)),
            model.BEFORE: kept(F.col(model.BEFORE)),
        }
    )
    # The shared checks ran before: a key column left out is reported here, as they would have.
    is_row = F.col(model.OP).isin(*(o.value for o in model.ROW_OPS))
    missing_key = is_row & (
        F.size(F.array_except(F.coalesce(F.col(model.KEY_COLUMNS), F.array()), F.col(model.COLUMNS)["name"])) > 0
    )
    error = F.coalesce(F.col(model.ERROR), F.when(missing_key, F.lit("a key column is not among the declared columns")))
    return rewritten.withColumn(model.ERROR, error).select(*model.CANONICAL_COLUMNS)


def fields_columns(fields: Column) -> Column:
    """``columns`` (name, vendor type, Spark type) of Connect-style field descriptions."""
    return F.transform(
        fields,
        lambda f: F.struct(
            f["field"].alias("name"),
            F.coalesce(f["name"], f["type"]).alias("vendor_type"),
            F.coalesce(spark_type(f), F.lit("string")).alias("spark_type"),
        ),
    )


def fields_errors(is_row: Column) -> list[tuple[Column, str | Column]]:
    """Per-message errors about the staged images (see :func:`image_stages`)."""
    fields = F.col("_fields")
    unknown = F.filter(fields, lambda f: spark_type(f).isNull())
    names = fields["field"]
    return [
        (is_row & (F.size(F.array_distinct(names)) < F.size(names)), "the value schema declares a column twice"),
        (
            # exists stops at the first match and builds no array; the filter runs only for the message.
            is_row & F.exists(fields, lambda f: spark_type(f).isNull()),
            F.format_string(
                "column %s has unsupported Connect type %s (%s)",
                F.get(unknown, 0)["field"],
                F.get(unknown, 0)["type"],
                F.coalesce(F.get(unknown, 0)["name"], F.lit("no logical name")),
            ),
        ),
        _bad_value_error(is_row, F.col("_after_pairs"), "after"),
        _bad_value_error(is_row, F.col("_before_pairs"), "before"),
    ]


def _bad_value_error(is_row: Column, pairs: Column, which: str) -> tuple[Column, Column]:
    def does_not_fit(value: Column) -> Column:
        return value["raw"].isNotNull() & value["text"].isNull()

    bad = F.filter(F.map_entries(pairs), lambda e: does_not_fit(e["value"]))
    descr = F.col("_info")[F.get(bad, 0)["key"]]
    return (
        # Tested on the values alone (no entry structs), for every row; the entries are built only for the message.
        is_row & F.exists(F.map_values(pairs), does_not_fit),
        F.format_string(
            f"{which} value %s of column %s does not fit its type %s",
            F.substring(F.get(bad, 0)["value"]["raw"], 1, 80),
            F.get(bad, 0)["key"],
            F.coalesce(descr["name"], descr["type"]),
        ),
    )


def texts(pairs: Column) -> Column:
    """Canonical image of staged pairs."""
    return F.transform_values(pairs, lambda _k, v: v["text"])
