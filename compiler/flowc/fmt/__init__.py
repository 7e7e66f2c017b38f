"""`flowc fmt`: one canonical layout for .flow files, idempotent, comments kept."""

from flowc.fmt.printer import format_module, quote
from flowc.sources import split_bom
from flowc.syntax import parse


def format_source(text: str, file: str = "<input>"):
    """Return (formatted text, diagnostics); the text is None when the source does not parse.

    A byte-order mark at the start is kept: formatting changes the layout, not the encoding."""
    source = split_bom(text)
    result = parse(source.text, file)
    if result.module is None:
        return None, result.diagnostics
    return source.bom + format_module(result.module, source.text), result.diagnostics


__all__ = ["format_module", "format_source", "quote"]
