"""MySQL ``Character`` values in charsets beyond UTF-8 (DTS and DRS Avro, ``_avro_images.character``).

The reference is Python's own codec for each charset: every MySQL charset cdclake maps to a Java charset must decode
what Python encodes into the same text, and bytes the charset cannot decode must be an error, never a silent U+FFFD.
"""

from __future__ import annotations

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdclake.formats import _avro_images as av
from cdclake.formats.base import JAVA_CHARSET_SETTINGS, FormatOptions, analysed_with_java_charsets
from cdclake.spark import local_frame

pytestmark = pytest.mark.spark

# MySQL charset -> (Python codec, a text that charset holds).
PYTHON_CODECS = {
    "gbk": ("gbk", "张三的账户"),
    "gb18030": ("gb18030", "丁\ufffd𠀀ǹ"),
    "gb2312": ("gb2312", "北京欢迎你"),
    "big5": ("big5", "臺灣銀行"),
    "sjis": ("shift_jis", "東京タワー"),
    "cp932": ("cp932", "①ｱ東京"),
    "ujis": ("euc_jp", "大阪"),
    "eucjpms": ("euc_jp", "名古屋"),
    "euckr": ("euc_kr", "서울"),
    "latin2": ("iso8859_2", "Łódź"),
    "greek": ("iso8859_7", "Αθήνα"),
    "hebrew": ("iso8859_8", "שלום"),
    "latin5": ("iso8859_9", "İstanbul"),
    "latin7": ("iso8859_13", "Rīga"),
    "cp1250": ("cp1250", "Přílišžluťoučký"),
    "cp1251": ("cp1251", "Москва"),
    "cp1256": ("cp1256", "مرحبا"),
    "cp1257": ("cp1257", "Kaunas ąč"),
    "cp850": ("cp850", "Ça für"),
    "cp852": ("cp852", "Łódź"),
    "cp866": ("cp866", "Привет"),
    "koi8r": ("koi8_r", "Привет"),
    "koi8u": ("koi8_u", "Київ"),
    "macce": ("mac_latin2", "Łódź"),
    "macroman": ("mac_roman", "café"),
    "tis620": ("tis_620", "สวัสดี"),
    "ucs2": ("utf_16_be", "Zoë"),
    "utf16": ("utf_16_be", "Zoë 🚀"),
    "utf16le": ("utf_16_le", "Zoë 🚀"),
    "utf32": ("utf_32_be", "Zoë 🚀"),
}


def _characters(messages: DataFrame, options: FormatOptions) -> DataFrame:
    del options
    return messages.select("charset", av.character(F.struct("charset", "value")).alias("converted"))


def _decode(spark, rows: list[tuple[str, bytes]]) -> list[tuple[str | None, str | None]]:
    frame = local_frame(spark, rows, "charset string, value binary")
    decoded = analysed_with_java_charsets(_characters)(frame, {})
    return [(r.converted.text, r.converted.error) for r in decoded.collect()]


def test_every_mapped_charset_decodes_as_python_does(spark) -> None:
    assert set(PYTHON_CODECS) == set(av.MYSQL_JAVA_CHARSETS)
    rows = [(charset, text.encode(codec)) for charset, (codec, text) in PYTHON_CODECS.items()]
    decoded = _decode(spark, rows)
    assert decoded == [(text, None) for _, text in PYTHON_CODECS.values()]


@pytest.mark.parametrize(
    ("charset", "raw"),
    [
        ("gbk", b"\xd5\xc5\x81 "),  # a lead byte followed by no trail byte
        ("gbk", b"\xff"),  # no GBK byte
        ("big5", b"\xa4"),  # cut in the middle of a character
        ("gb18030", b"\x84\x31"),  # half a four-byte sequence
        ("sjis", b"\x82"),
        ("utf16", b"\xd8\x00\x00A"),  # a lone high surrogate
        ("utf32", b"\x00\x11\x00\x00"),  # beyond U+10FFFF
    ],
)
def test_bytes_a_charset_cannot_decode_are_an_error(spark, charset: str, raw: bytes) -> None:
    [(_, error)] = _decode(spark, [(charset, raw)])
    assert error == f"Character value is not valid {charset}"


def test_a_charset_without_a_java_charset_is_unsupported(spark) -> None:
    assert _decode(spark, [("armscii8", b"\xb1")]) == [(None, "unsupported Character charset 'armscii8'")]


def test_the_java_charset_settings_hold_only_while_a_decoder_is_analysed(spark) -> None:
    """Set during the decoder's analysis, restored after: unset stays unset, a user's value is kept."""
    charsets, codings = JAVA_CHARSET_SETTINGS  # javaCharsets, codingErrorAction
    spark.conf.unset(charsets)
    spark.conf.set(codings, "false")
    seen: list[tuple[str | None, str | None]] = []

    def looks(messages: DataFrame, options: FormatOptions) -> DataFrame:
        seen.append((spark.conf.get(charsets, None), spark.conf.get(codings, None)))
        return _characters(messages, options)

    try:
        frame = local_frame(spark, [("gbk", "上海".encode("gbk"))], "charset string, value binary")
        decoded = analysed_with_java_charsets(looks)(frame, {})
        assert seen == [("true", "true")]
        assert (spark.conf.get(charsets, None), spark.conf.get(codings, None)) == (None, "false")
        # Analysed with them, the frame still decodes once they are gone.
        assert [r.converted.text for r in decoded.collect()] == ["上海"]
    finally:
        spark.conf.unset(codings)
