"""Shared helpers of the Avro formats whose row images are arrays of a value union aligned with a field list
(Alibaba DTS Avro, ``shared/formats/dts.md`` 1.6, and Huawei DRS Avro, ``shared/formats/drs.md`` 1.2).

Spark's ``from_avro`` turns a union ``[null, A, B, ...]`` into ``STRUCT<member0: A, member1: B, ...>`` with exactly
one non-null member (all null for the Avro null branch). Each branch converter here returns a :data:`VALUE`
struct: the canonical text (see :mod:`cdclake.model`), the Spark type it implies (null when the value carries no
type, i.e. SQL NULL), an error text (null when fine) and ``absent`` (the value was not captured and must not be
written). Pure Spark SQL; no per-row Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from pyspark.sql import Column
from pyspark.sql import functions as F

VALUE_TYPE: Final = "struct<text:string,spark_type:string,error:string,absent:boolean>"


def value(
    text: Column,
    spark_type: Column | str | None,
    error: Column | None = None,
    absent: Column | None = None,
) -> Column:
    """One converted value (see the module doc)."""
    type_column = F.lit(spark_type) if isinstance(spark_type, str) or spark_type is None else spark_type
    return F.struct(
        text.cast("string").alias("text"),
        type_column.cast("string").alias("spark_type"),
        (error if error is not None else F.lit(None)).cast("string").alias("error"),
        (absent if absent is not None else F.lit(False)).alias("absent"),
    )


def null_value() -> Column:
    """SQL NULL (the union's null branch)."""
    return value(F.lit(None), None)


def choose(branches: list[tuple[Column, Column]], otherwise: Column | None = None) -> Column:
    """The converted value of the first branch whose member is not null (the union's present branch)."""
    result: Column | None = None
    for member, converted in branches:
        result = (F.when if result is None else result.when)(member.isNotNull(), converted)
    fallback = otherwise if otherwise is not None else null_value()
    return fallback if result is None else result.otherwise(fallback)


def integer(member: Column, spark_type: Column | str) -> Column:
    """``Integer{precision, value string}``: decimal text, kept exact (dts.md 1.6 / drs.md 1.2)."""
    text = F.trim(member["value"])
    bad = ~text.rlike(r"^[+-]?\d+$")
    clean = F.regexp_replace(text, r"^\+", "")
    return value(clean, spark_type, F.when(bad, F.format_string("Integer value '%s' is not an integer", text)))


# MySQL charset names (dts.md 1.6) -> how to decode. UTF-8 (and ASCII, its subset) is decoded by a cast and checked
# with is_valid_utf8; latin1 is decoded as ISO-8859-1, which cannot fail, then MySQL's latin1 (dts.md 1.6:
# "latin1->cp1252") is made of it: the bytes 0x80-0x9F are cp1252's letters and signs there (0x80 the euro sign, 0x92
# the right single quote of Windows text), not C1 control characters, except the five that cp1252 leaves undefined
# and MySQL keeps as those controls (0x81, 0x8D, 0x8F, 0x90, 0x9D).
UTF8_CHARSETS: Final = ("utf8mb4", "utf8", "utf8mb3", "utf-8", "ascii", "us-ascii", "")
MYSQL_LATIN1: Final = "latin1"
ISO_8859_1_CHARSETS: Final = ("iso-8859-1", "iso_8859_1")
BINARY_CHARSETS: Final = ("binary",)
# The other MySQL charsets a JVM can decode (dts.md 1.6 names gbk, gb18030 and big5), by the Java charset MySQL
# Connector/J reads each with. Spark's decode() accepts them only when the decoder is analysed with Java's charsets
# (formats.base.analysed_with_java_charsets), which also makes it replace malformed input instead of failing the
# batch: :func:`character` tells a replaced byte from a real U+FFFD itself. MySQL's utf16, utf32 and ucs2 are
# big-endian without a byte-order mark. armscii8, dec8, geostd8, hp8, keybcs2 and swe7 have no Java charset: their
# values are dead letters ("unsupported Character charset").
MYSQL_JAVA_CHARSETS: Final = {
    "gbk": "GBK",
    "gb18030": "GB18030",
    "gb2312": "GB2312",
    "big5": "Big5",
    "sjis": "Shift_JIS",
    "cp932": "windows-31j",
    "ujis": "EUC-JP",
    "eucjpms": "x-eucJP-Open",
    "euckr": "EUC-KR",
    "latin2": "ISO-8859-2",
    "greek": "ISO-8859-7",
    "hebrew": "ISO-8859-8",
    "latin5": "ISO-8859-9",
    "latin7": "ISO-8859-13",
    "cp1250": "windows-1250",
    "cp1251": "windows-1251",
    "cp1256": "windows-1256",
    "cp1257": "windows-1257",
    "cp850": "IBM850",
    "cp852": "IBM852",
    "cp866": "IBM866",
    "koi8r": "KOI8-R",
    "koi8u": "KOI8-U",
    "macce": "x-MacCentralEurope",
    "macroman": "x-MacRoman",
    "tis620": "TIS-620",
    "ucs2": "UTF-16BE",
    "utf16": "UTF-16BE",
    "utf16le": "UTF-16LE",
    "utf32": "UTF-32BE",
}
_REPLACEMENT_CHARACTER: Final = "\ufffd"


def _cp1252_letters() -> tuple[str, str]:
    """The C1 control characters that cp1252 gives a letter or sign, and those letters (``translate`` arguments)."""
    controls, letters = [], []
    for byte in range(0x80, 0xA0):
        try:
            letter = bytes([byte]).decode("cp1252")
        except UnicodeDecodeError:  # undefined in cp1252: MySQL's latin1 keeps the control character
            continue
        controls.append(chr(byte))
        letters.append(letter)
    return "".join(controls), "".join(letters)


_C1_CONTROLS, _CP1252_LETTERS = _cp1252_letters()


def _java_decoded(raw: Column, charset: Column) -> Column:
    """``raw`` decoded with the Java charset of MySQL ``charset`` (one of :data:`MYSQL_JAVA_CHARSETS`)."""
    java = F.create_map(*(F.lit(x) for pair in MYSQL_JAVA_CHARSETS.items() for x in pair))[charset]
    text = F.call_function("decode", raw, java)
    # A byte sequence the charset cannot decode became U+FFFD. GBK, Big5 and most others cannot hold U+FFFD at all,
    # GB18030 and the UTF-16/32 forms can: a U+FFFD is real only if the text encodes back to the very same bytes.
    malformed = F.contains(text, F.lit(_REPLACEMENT_CHARACTER)) & (F.call_function("encode", text, java) != raw)
    return value(text, "string", F.when(malformed, F.format_string("Character value is not valid %s", charset)))


def character(member: Column) -> Column:
    """``Character{charset, value bytes}`` -> text decoded with the charset (``binary`` keeps the bytes)."""
    charset = F.lower(F.coalesce(member["charset"], F.lit("")))
    raw = member["value"]
    as_utf8 = raw.cast("string")
    return (
        F.when(
            charset.isin(*UTF8_CHARSETS),
            value(
                as_utf8,
                "string",
                F.when(
                    ~F.is_valid_utf8(as_utf8),
                    F.format_string("Character value is not valid %s", charset),
                ),
            ),
        )
        .when(
            charset == MYSQL_LATIN1,
            value(F.translate(F.decode(raw, "ISO-8859-1"), _C1_CONTROLS, _CP1252_LETTERS), "string"),
        )
        .when(charset.isin(*ISO_8859_1_CHARSETS), value(F.decode(raw, "ISO-8859-1"), "string"))
        .when(charset.isin(*BINARY_CHARSETS), value(F.base64(raw), "binary"))
        .when(charset.isin(*MYSQL_JAVA_CHARSETS), _java_decoded(raw, charset))
        .otherwise(value(F.lit(None), "string", F.format_string("unsupported Character charset '%s'", charset)))
    )


def decimal(member: Column) -> Column:
    """``Decimal{value string, precision, scale}`` -> exact text; ``decimal(p,s)`` when p/s fit Spark, else string."""
    precision, scale = member["precision"], member["scale"]
    fits = (precision >= 1) & (precision <= 38) & (scale >= 0) & (scale <= precision)
    spark_type = F.when(fits, F.format_string("decimal(%d,%d)", precision, scale)).otherwise(F.lit("string"))
    return value(F.trim(member["value"]), spark_type)


def double(member: Column) -> Column:
    """``Float{value double, ...}`` -> Spark's double text (``NaN``, ``Infinity`` included)."""
    return value(member["value"].cast("string"), "double")


def epoch_micros(seconds: Column, micros: Column) -> Column:
    """``Timestamp{timestamp, millis}``: epoch seconds + microseconds -> canonical timestamp (epoch µs)."""
    total = F.try_add(F.try_multiply(seconds.cast("bigint"), F.lit(1_000_000)), F.coalesce(micros, F.lit(0)))
    return value(
        total,
        "timestamp",
        F.when(total.isNull(), F.format_string("Timestamp %s.%s out of range", seconds, micros)),
    )


def binary(member: Column) -> Column:
    """Raw bytes -> base64."""
    return value(F.base64(member["value"]), "binary")


def text(member: Column, spark_type: str = "string") -> Column:
    """A value that already is text."""
    return value(member["value"], spark_type)


def align(
    fields: Column,
    images: Column,
    convert: Callable[[Column, Column], Column],
) -> Column:
    """``ARRAY<STRUCT<name, value: VALUE>>``: each field with its converted image value (same index)."""
    return F.transform(
        fields, lambda f, i: F.struct(f["name"].alias("name"), convert(f, F.get(images, i)).alias("value"))
    )


def declared_columns(
    fields: Column, before: Column, after: Column, fallback_type: Callable[[Column], Column]
) -> Column:
    """The canonical ``columns`` of a DTS/DRS record: each field's Spark type as its value branch says (after image
    first, then before), else ``fallback_type`` of its type code (null when the code is unknown), else string.

    ``fallback_type`` runs inside the lambda: it should look codes up in constant maps, not build a map per row
    (Spark would build it again for every field)."""
    return F.transform(
        fields,
        lambda f, i: F.struct(
            f["name"].alias("name"),
            f["dataTypeNumber"].cast("string").alias("vendor_type"),
            F.coalesce(
                after[i]["value"]["spark_type"],
                before[i]["value"]["spark_type"],
                fallback_type(f["dataTypeNumber"]),
                F.lit("string"),
            ).alias("spark_type"),
        ),
    )


def image_shape_checks(
    is_row: Column, fields: Column, names: Column, before_items: Column, after_items: Column
) -> list[tuple[Column, Column | str]]:
    """Checks (for ``base.first_error``) that a DTS/DRS row record has fields, each once, and images aligned with
    them: ``beforeImages``/``afterImages`` hold one value per field, by position."""

    def misaligned(items: Column) -> Column:
        return items.isNotNull() & (F.size(items) != F.size(fields))

    def count_error(items: Column, which: str) -> Column:
        return F.format_string(f"{which} has %d values for %d fields", F.size(items), F.size(fields))

    return [
        (is_row & (F.size(fields) == 0), "row event without fields"),
        (is_row & (F.size(F.array_distinct(names)) < F.size(names)), "fields lists a column twice"),
        (is_row & misaligned(before_items), count_error(before_items, "beforeImages")),
        (is_row & misaligned(after_items), count_error(after_items, "afterImages")),
    ]


def image(aligned: Column, present: Column) -> Column:
    """Canonical image ``MAP<STRING, STRING>`` from :func:`align` output; absent values left out; null when the
    message carries no image."""
    kept = F.filter(aligned, lambda e: ~F.coalesce(e["value"]["absent"], F.lit(False)))
    entries = F.transform(kept, lambda e: F.struct(e["name"], e["value"]["text"]))
    return F.when(present, F.map_from_entries(entries))


def first_value_error(aligned: Column, which: str) -> Column:
    """Text of the first value that failed to convert, else null."""

    def failed(e: Column) -> Column:
        return e["value"]["error"].isNotNull()

    bad = F.filter(aligned, failed)
    return F.when(
        F.exists(aligned, failed),  # stops at the first failure; the array of failures is built for the message only
        F.format_string(f"{which} value of column %s: %s", F.get(bad, 0)["name"], F.get(bad, 0)["value"]["error"]),
    )


def strip_single_object_header(value_column: Column, fingerprint: bytes) -> tuple[Column, Column]:
    """Avro single-object encoding (``C3 01`` + 8-byte little-endian CRC-64-AVRO fingerprint): returns
    ``(body, error)``; a value without the marker is plain Avro binary, one with the marker but another fingerprint
    is an error (it was written with a different schema)."""
    marker = F.lit(b"\xc3\x01")
    has_marker = F.substring(value_column, 1, 2) == marker
    fingerprint_ok = F.substring(value_column, 3, 8) == F.lit(fingerprint)
    body = F.when(has_marker, F.substring(value_column, 11, 2_147_483_647)).otherwise(value_column)
    error = F.when(
        has_marker & ~fingerprint_ok,
        F.format_string(
            "Avro single-object fingerprint %s is not the expected schema's", F.hex(F.substring(value_column, 3, 8))
        ),
    )
    return body, error
