"""Source positions: the `Span` every AST node, IR node and diagnostic carries.

Lines and columns are 1-based; `end_column` points one past the last character, so a span's
width on a single line is `end_column - column`. Offsets index the decoded source text.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    file: str
    start: int
    end: int
    line: int
    column: int
    end_line: int
    end_column: int

    def to(self, other: Span) -> Span:
        """The span from the start of `self` to the end of `other`."""
        return Span(
            self.file,
            self.start,
            other.end,
            self.line,
            self.column,
            other.end_line,
            other.end_column,
        )

    def sort_key(self) -> tuple[str, int, int]:
        return (self.file, self.line, self.column)

    def as_json(self) -> dict[str, int | str]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
        }


def point(file: str, text: str, offset: int) -> Span:
    """A zero-width span at `offset` of `text` (used for end of input)."""
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return Span(file, offset, offset, line, column, line, column)
