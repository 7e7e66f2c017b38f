"""The one place where compiler positions and LSP positions meet.

Compiler spans count lines and columns from 1 in code points. LSP positions count from 0, and
their columns are in the units the client and server agreed on: UTF-16 code units unless the
client offered UTF-8 or UTF-32. Every conversion in the language server goes through here.
"""

from __future__ import annotations

from lsprotocol import types

from flowc.spans import Span

UTF16 = types.PositionEncodingKind.Utf16
UTF8 = types.PositionEncodingKind.Utf8
UTF32 = types.PositionEncodingKind.Utf32


def _units(text: str, encoding: str) -> int:
    if encoding == UTF32:
        return len(text)
    if encoding == UTF8:
        return len(text.encode("utf-8"))
    return len(text.encode("utf-16-le")) // 2


class LineIndex:
    """The lines of one document, for converting positions in both directions."""

    def __init__(self, text: str, encoding: str = UTF16):
        self.lines = text.replace("\r\n", "\n").split("\n")
        self.encoding = encoding
        starts = [0]
        for line in self.lines[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        self._starts = starts

    def _line(self, index: int) -> str:
        return self.lines[index] if 0 <= index < len(self.lines) else ""

    def position(self, line: int, column: int) -> types.Position:
        """The LSP position of a 1-based (line, code-point column)."""
        text = self._line(line - 1)
        return types.Position(line=max(line - 1, 0), character=_units(text[: max(column - 1, 0)], self.encoding))

    def range(self, span: Span) -> types.Range:
        return types.Range(start=self.position(span.line, span.column), end=self.position(span.end_line, span.end_column))

    def offset(self, position: types.Position) -> int:
        """The code-point offset into the (newline-normalised) text of an LSP position."""
        if position.line >= len(self.lines):
            return self._starts[-1] + len(self.lines[-1])
        text = self.lines[position.line]
        units = 0
        for index, char in enumerate(text):
            if units >= position.character:
                return self._starts[position.line] + index
            units += _units(char, self.encoding)
        return self._starts[position.line] + len(text)

    def end(self) -> types.Position:
        return types.Position(line=len(self.lines) - 1, character=_units(self.lines[-1], self.encoding))
