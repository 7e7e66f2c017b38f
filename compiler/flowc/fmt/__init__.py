"""`flowc fmt`: one canonical layout for .flow files, idempotent, comments kept."""

from flowc.fmt.printer import format_module, quote
from flowc.syntax import parse


def format_source(text: str, file: str = "<input>"):
    """Return (formatted text, diagnostics); the text is None when the source does not parse."""
    result = parse(text, file)
    if result.module is None:
        return None, result.diagnostics
    return format_module(result.module, text), result.diagnostics


__all__ = ["format_module", "format_source", "quote"]
