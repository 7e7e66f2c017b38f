"""Reading .flow source text: the one reader `check`, `fmt`, `plan`, `build`, imports and the
language server share.

Sources are UTF-8. A byte-order mark at the start of a file (some Windows editors write one) is
accepted and is not part of the text the compiler sees, so positions are the ones the user's
editor shows; `SourceText.bom` remembers it so `flowc fmt` writes it back (formatting changes
layout, never the encoding). Text that reaches the parser another way (the language server gets
it from the editor) may still start with a BOM: `split_bom` separates it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BOM = "\ufeff"


@dataclass(frozen=True)
class SourceText:
    text: str  # without the byte-order mark
    bom: str = ""  # BOM if the file started with one, else ""

    @property
    def original(self) -> str:
        """The text as stored in the file."""
        return self.bom + self.text


def split_bom(text: str) -> SourceText:
    if text.startswith(BOM):
        return SourceText(text[len(BOM) :], BOM)
    return SourceText(text)


def read_source(path: Path) -> SourceText:
    """Read and decode `path`; raises OSError or UnicodeDecodeError (callers name the file)."""
    return split_bom(path.read_text(encoding="utf-8"))  # text mode: \r\n reads as \n, as before
