"""The shared checks' lambda-free column-name tests judge every name list as the per-name definitions do."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StringType, StructField, StructType

from cdclake import model
from cdclake.formats import base

pytestmark = pytest.mark.spark

# Names at the edges of every rule: the separator inside a name, the reserved prefix in all its spellings, the length
# limit in characters (and in UTF-16 units, which the regular expression counts), each bad character, case pairs.
EDGE_NAMES = [
    "",
    "\n",
    "a\nb",
    "a\n",
    "id",
    "ID",
    "Id",
    model.ROW_ID_COLUMN,
    model.ROW_ID_COLUMN.upper(),
    "_CDC_row_id",
    f"{model.ROW_ID_COLUMN}x",
    "_cdc_position",
    "_Cdc_x",
    "x_cdc_",
    "_cdc",
    "a" * base.MAX_IDENTIFIER_LENGTH,
    "a" * (base.MAX_IDENTIFIER_LENGTH + 1),
    "é" * (base.MAX_IDENTIFIER_LENGTH + 1),
    "\U0001f600" * 200,  # 200 characters, 400 UTF-16 units: valid, only suspicious to the fast test
    "a b",
    "a;b",
    "a,b",
    "f(x)",
    "{",
    "a=b",
    "\t",
    "x\x7f",
    "\x00",
    "\x1f",
    "Zoë 张三",
    "zoë_张三",
    "ΣΑΣ",
    "σας",
]

NAME = st.one_of(
    st.sampled_from(EDGE_NAMES),
    # Names made of pieces, so that the prefix, separators and bad characters land anywhere in them.
    st.lists(st.sampled_from([*"aAzZ_09éΣσ\n\t ;=(){}\x7f\x00", "_cdc_", "row_id", "\U0001f600"]), max_size=8).map(
        "".join
    ),
)
NAME_LISTS = st.lists(st.lists(st.one_of(NAME, st.none()), max_size=6), min_size=20, max_size=80)

SCHEMA = StructType([StructField(model.OP, StringType()), StructField("names", ArrayType(StringType()))])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name_lists=NAME_LISTS)
def test_fast_name_checks_equal_the_per_name_definitions(spark, name_lists: list[list[str | None]]) -> None:
    rows = [("INSERT", names) for names in [*name_lists, *([n] for n in EDGE_NAMES), EDGE_NAMES]]
    frame = spark.createDataFrame(rows, SCHEMA).select(
        model.OP,
        F.transform(
            "names",
            lambda n: F.struct(n.alias("name"), F.lit("t").alias("vendor_type"), F.lit("string").alias("spark_type")),
        ).alias(model.COLUMNS),
        F.lit(None).cast("map<string,string>").alias(model.AFTER),
        F.lit(None).cast("map<string,string>").alias(model.BEFORE),
        F.lit(None).cast("array<string>").alias(model.KEY_COLUMNS),
        F.lit("t").alias(model.TABLE),
        F.lit("d").alias(model.DATABASE),
    )
    staged = base._stage_checks(frame)
    names = F.col(model.COLUMNS)["name"]
    # The definitions, one lambda per name: the bad names in order, and a case-insensitive duplicate.
    exact_bad = F.filter(names, base._bad_column_name)
    exact_duplicate = F.size(F.array_distinct(F.transform(names, F.lower))) < F.size(names)
    error = base._checks()
    result = staged.select(
        names.alias("names"),
        F.col("_chk_bad_names").alias("bad"),
        exact_bad.alias("exact_bad"),
        error.alias("error"),
        exact_duplicate.alias("exact_duplicate"),
    ).collect()
    assert len(result) == len(rows)
    for row in result:
        assert row["bad"] == row["exact_bad"], row["names"]
        if row["exact_bad"]:
            assert row["error"].startswith("invalid column name"), row["names"]
        elif row["exact_duplicate"]:
            assert row["error"] == "duplicate column names (names are compared case-insensitively)", row["names"]
        else:
            assert row["error"] is None or not row["error"].startswith(("invalid column", "duplicate")), row["names"]


# Images against declared columns: the same names in the same order (the positional fast path), shuffled, with a
# column missing or an undeclared one, values valid and invalid for their types, NULL values and NULL images.
TYPED_VALUES = {"bigint": ["1", "-7", "x", None], "boolean": ["true", "yes", None], "string": ["s", "", None]}
COLUMN = st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]), st.sampled_from(sorted(TYPED_VALUES)))


@st.composite
def image_cases(draw: st.DrawFn) -> tuple[list[tuple[str, str]], dict[str, str | None] | None]:
    columns = draw(st.lists(COLUMN, max_size=5, unique_by=lambda c: c[0]))
    shape = draw(st.sampled_from(["aligned", "shuffled", "missing", "undeclared", "null"]))
    if shape == "null":
        return columns, None
    names = [name for name, _ in columns]
    if shape == "shuffled":
        names = draw(st.permutations(names))
    elif shape == "missing" and names:
        names = names[1:]
    elif shape == "undeclared":
        names = [*names, "zz"]
    types = dict(columns)
    return columns, {n: draw(st.sampled_from(TYPED_VALUES[types.get(n, "string")])) for n in names}


IMAGE_SCHEMA = "columns array<struct<name:string,vendor_type:string,spark_type:string>>, image map<string,string>"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.lists(image_cases(), min_size=30, max_size=60))
def test_positional_image_checks_equal_the_by_name_definitions(spark, cases) -> None:
    rows = [([(n, t, t) for n, t in columns], image) for columns, image in cases]
    frame = spark.createDataFrame(rows, IMAGE_SCHEMA).select(
        F.lit("INSERT").alias(model.OP),
        F.col("columns").alias(model.COLUMNS),
        F.col("image").alias(model.AFTER),
        F.col("image").alias(model.BEFORE),
    )
    image, columns = F.col(model.AFTER), F.col(model.COLUMNS)
    result = (
        base._stage_checks(frame)
        .select(
            F.col("_chk_invalid_after").alias("invalid"),
            F.when(image.isNotNull(), F.size(base._invalid_values(image, columns)) > 0).alias("exact_invalid"),
            F.col("_chk_undeclared_after").alias("undeclared"),
            F.array_except(F.map_keys(image), F.coalesce(columns["name"], F.array().cast("array<string>"))).alias(
                "exact_undeclared"
            ),
            image.alias("image"),
        )
        .collect()
    )
    assert len(result) == len(rows)
    for row in result:
        assert row["invalid"] == row["exact_invalid"], row["image"]
        assert row["undeclared"] == row["exact_undeclared"], row["image"]
