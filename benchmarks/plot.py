"""Bar charts as PNG with the standard library only (zlib + struct): matplotlib is not a dependency of cdclake.

A chart is a column of panels; each panel has a title, horizontal bars (a bar may be stacked from segments) with a
label on the left and a value text on the right, and an optional legend. Text uses a built-in 5x7 pixel font
(upper case, digits and a little punctuation; lower case is drawn upper case).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

Color = tuple[int, int, int]

PALETTE: dict[str, Color] = {
    "baseline": (150, 150, 150),
    "cdclake": (31, 119, 180),
    "decode": (31, 119, 180),
    "plan": (255, 127, 14),
    "fold": (44, 160, 44),
    "merge": (214, 39, 40),
    "tombstones": (148, 103, 189),
    "progress": (140, 86, 75),
    "other": (188, 189, 34),
    "limit": (214, 39, 40),
    "p50": (44, 160, 44),
    "p95": (255, 127, 14),
}

_GLYPHS: dict[str, str] = {
    "0": "01110 10001 10011 10101 11001 10001 01110",
    "1": "00100 01100 00100 00100 00100 00100 01110",
    "2": "01110 10001 00001 00010 00100 01000 11111",
    "3": "11111 00010 00100 00010 00001 10001 01110",
    "4": "00010 00110 01010 10010 11111 00010 00010",
    "5": "11111 10000 11110 00001 00001 10001 01110",
    "6": "00110 01000 10000 11110 10001 10001 01110",
    "7": "11111 00001 00010 00100 01000 01000 01000",
    "8": "01110 10001 10001 01110 10001 10001 01110",
    "9": "01110 10001 10001 01111 00001 00010 01100",
    "A": "01110 10001 10001 11111 10001 10001 10001",
    "B": "11110 10001 10001 11110 10001 10001 11110",
    "C": "01110 10001 10000 10000 10000 10001 01110",
    "D": "11100 10010 10001 10001 10001 10010 11100",
    "E": "11111 10000 10000 11110 10000 10000 11111",
    "F": "11111 10000 10000 11110 10000 10000 10000",
    "G": "01110 10001 10000 10111 10001 10001 01111",
    "H": "10001 10001 10001 11111 10001 10001 10001",
    "I": "01110 00100 00100 00100 00100 00100 01110",
    "J": "00111 00010 00010 00010 00010 10010 01100",
    "K": "10001 10010 10100 11000 10100 10010 10001",
    "L": "10000 10000 10000 10000 10000 10000 11111",
    "M": "10001 11011 10101 10101 10001 10001 10001",
    "N": "10001 10001 11001 10101 10011 10001 10001",
    "O": "01110 10001 10001 10001 10001 10001 01110",
    "P": "11110 10001 10001 11110 10000 10000 10000",
    "Q": "01110 10001 10001 10001 10101 10010 01101",
    "R": "11110 10001 10001 11110 10100 10010 10001",
    "S": "01111 10000 10000 01110 00001 00001 11110",
    "T": "11111 00100 00100 00100 00100 00100 00100",
    "U": "10001 10001 10001 10001 10001 10001 01110",
    "V": "10001 10001 10001 10001 10001 01010 00100",
    "W": "10001 10001 10001 10101 10101 10101 01010",
    "X": "10001 10001 01010 00100 01010 10001 10001",
    "Y": "10001 10001 10001 01010 00100 00100 00100",
    "Z": "11111 00001 00010 00100 01000 10000 11111",
    " ": "00000 00000 00000 00000 00000 00000 00000",
    ".": "00000 00000 00000 00000 00000 01100 01100",
    ",": "00000 00000 00000 00000 01100 00100 01000",
    "-": "00000 00000 00000 11111 00000 00000 00000",
    "_": "00000 00000 00000 00000 00000 00000 11111",
    ":": "00000 01100 01100 00000 01100 01100 00000",
    "/": "00000 00001 00010 00100 01000 10000 00000",
    "%": "11000 11001 00010 00100 01000 10011 00011",
    "(": "00010 00100 01000 01000 01000 00100 00010",
    ")": "01000 00100 00010 00010 00010 00100 01000",
    "=": "00000 00000 11111 00000 11111 00000 00000",
    "<": "00010 00100 01000 10000 01000 00100 00010",
    ">": "01000 00100 00010 00001 00010 00100 01000",
    "+": "00000 00100 00100 11111 00100 00100 00000",
    "?": "01110 10001 00001 00010 00100 00000 00100",
}

SCALE = 2
"""Pixels per font pixel."""
CHAR_WIDTH = 6 * SCALE
LINE_HEIGHT = 10 * SCALE


@dataclass
class Bar:
    label: str
    segments: list[tuple[float, str]]
    """(value, palette name) stacked left to right."""
    text: str = ""


@dataclass
class Panel:
    title: str
    bars: list[Bar]
    legend: list[str] = field(default_factory=list)
    """Palette names to explain under the title."""
    limit: float | None = None
    """A vertical line at this value (e.g. a goal)."""


class Canvas:
    """An RGB pixel buffer."""

    def __init__(self, width: int, height: int, background: Color = (255, 255, 255)) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def rect(self, x: int, y: int, width: int, height: int, color: Color) -> None:
        x0, y0 = max(0, x), max(0, y)
        x1, y1 = min(self.width, x + width), min(self.height, y + height)
        if x1 <= x0 or y1 <= y0:
            return
        row = bytes(color) * (x1 - x0)
        for yy in range(y0, y1):
            start = (yy * self.width + x0) * 3
            self.pixels[start : start + len(row)] = row

    def text(self, x: int, y: int, text: str, color: Color = (0, 0, 0)) -> None:
        for index, char in enumerate(text.upper()):
            rows = _GLYPHS.get(char, _GLYPHS["?"]).split()
            for dy, bits in enumerate(rows):
                for dx, bit in enumerate(bits):
                    if bit == "1":
                        self.rect(x + index * CHAR_WIDTH + dx * SCALE, y + dy * SCALE, SCALE, SCALE, color)

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * self.width * 3 : (y + 1) * self.width * 3]) for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
        )


def render(panels: list[Panel], width: int = 1100) -> bytes:
    """The panels one below the other, as PNG bytes."""
    margin, bar_height, gap = 16, 16, 6
    label_width = max([len(bar.label) for panel in panels for bar in panel.bars] + [8]) * CHAR_WIDTH + margin
    text_width = max([len(bar.text) for panel in panels for bar in panel.bars] + [8]) * CHAR_WIDTH + margin
    plot_width = max(100, width - label_width - text_width - 2 * margin)
    heights = [
        LINE_HEIGHT * (2 if panel.legend else 1) + len(panel.bars) * (bar_height + gap) + 2 * margin for panel in panels
    ]
    canvas = Canvas(width, sum(heights) + margin)
    y = margin
    for panel, height in zip(panels, heights, strict=True):
        canvas.text(margin, y, panel.title)
        line = y + LINE_HEIGHT
        if panel.legend:
            x = margin
            for name in panel.legend:
                canvas.rect(x, line + 2, 12, 12, PALETTE.get(name, PALETTE["other"]))
                canvas.text(x + 18, line, name)
                x += 18 + (len(name) + 2) * CHAR_WIDTH
            line += LINE_HEIGHT
        largest = max([sum(v for v, _ in bar.segments) for bar in panel.bars] + [panel.limit or 0.0, 1e-12])
        origin = margin + label_width
        for index, bar in enumerate(panel.bars):
            top = line + index * (bar_height + gap)
            canvas.text(margin, top + 1, bar.label)
            x = origin
            for value, name in bar.segments:
                length = round(plot_width * max(0.0, value) / largest)
                canvas.rect(x, top, length, bar_height, PALETTE.get(name, PALETTE["other"]))
                x += length
            canvas.text(x + 8, top + 1, bar.text)
        canvas.rect(origin - 1, line - 2, 1, len(panel.bars) * (bar_height + gap), (0, 0, 0))
        if panel.limit is not None:
            limit_x = origin + round(plot_width * panel.limit / largest)
            canvas.rect(limit_x, line - 4, 2, len(panel.bars) * (bar_height + gap) + 4, PALETTE["limit"])
        y += height
    return canvas.png()


def write(path: Path, panels: list[Panel]) -> None:
    path.write_bytes(render(panels))
