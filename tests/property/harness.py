"""What "never anything but diagnostics" means, as one function the test and the bench share."""

from __future__ import annotations

from flowc.check import CODES, check_source
from flowc.fmt import format_source
from flowc.syntax import parse


def compile_and_verify(text: str) -> bool:
    """Check `text`; raise AssertionError if flowc misbehaves (any other exception is a crash).

    Returns whether the text was a valid program (so callers can tell both paths were taken)."""
    result = check_source(text, "fuzz.flow")
    lines = text.replace("\r\n", "\n").count("\n") + 1
    for d in result.diagnostics:
        assert d.code in CODES, d
        assert d.message and d.span.file in result.sources, d
        assert 1 <= d.span.line <= lines + 1, d
        assert d.span.start <= d.span.end, d
    if result.program is not None:
        formatted, _ = format_source(text, "fuzz.flow")
        assert formatted is not None
        again, _ = format_source(formatted, "fuzz.flow")
        assert again == formatted, "fmt is not idempotent"
        assert parse(formatted).module == parse(text).module, "fmt changed the meaning"
    return result.ok
