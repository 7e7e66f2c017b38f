"""Parsing .flow text into a `Module`, reporting every syntax error of the file.

The grammar is loaded once per process. On a syntax error the declaration holding it is
blanked out (same length, so positions hold) and parsing starts again, so one run reports the
errors of every broken declaration rather than only the first.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources

from lark import Lark
from lark.exceptions import UnexpectedInput

from flowc.diagnostics import Diagnostic, Report
from flowc.gcpause import gc_paused
from flowc.sources import BOM
from flowc.spans import Span, point
from flowc.syntax import ast
from flowc.syntax.builder import AstBuilder, BuildContext, current, on_comment
from flowc.syntax.errors import SyntaxErrorTranslator, declaration_region, mask_opaque, too_deep

MAX_SYNTAX_ERRORS = 20


@dataclass
class ParseResult:
    module: ast.Module | None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.module is not None


def grammar_text() -> str:
    return resources.files("flowc").joinpath("grammars/flow.lark").read_text(encoding="utf-8")


@functools.cache
def _parser() -> tuple[Lark, SyntaxErrorTranslator]:
    lark = Lark(
        grammar_text(),
        parser="lalr",
        lexer="basic",
        strict=True,
        keep_all_tokens=True,
        maybe_placeholders=False,
        transformer=AstBuilder(),
        lexer_callbacks={"COMMENT": on_comment},
    )
    return lark, SyntaxErrorTranslator(lark)


def keywords() -> tuple[str, ...]:
    """The reserved words of the language, read from the grammar (editors and completion use them)."""
    lark, _ = _parser()
    return tuple(sorted({t.pattern.value for t in lark.terminals if t.pattern.type == "str" and t.pattern.value.isalpha()}))


def parse(text: str, file: str = "<input>") -> ParseResult:
    """Parse `text`; `module` is None when the file has syntax errors."""
    with gc_paused():
        return _parse(text, file)


def _parse(text: str, file: str) -> ParseResult:
    lark, translator = _parser()
    text = text.replace("\r\n", "\n")
    if text.startswith(BOM):  # text from an editor may keep it: read it as a space, so offsets hold
        text = " " + text[len(BOM) :]
    masked = mask_opaque(text)
    deep = too_deep(masked)
    if deep is not None:
        span = point(file, text, deep)
        span = Span(file, deep, deep + 1, span.line, span.column, span.line, span.column + 1)
        return ParseResult(
            None,
            [
                Diagnostic(
                    "E006",
                    "brackets are nested too deeply",
                    span,
                    hint="flatten the nesting; at most 32 levels of `[` and `{` are allowed",
                )
            ],
        )

    syntax_errors: list[Diagnostic] = []
    attempt = text
    while True:
        report = Report()
        ctx = BuildContext(file=file, text=text, report=report, comments=[])
        token = current.set(ctx)
        try:
            module = lark.parse(attempt)
        except UnexpectedInput as error:
            diagnostic = translator.translate(error, file, text, mask_opaque(attempt))
            syntax_errors.append(diagnostic)
            begin, end = declaration_region(mask_opaque(attempt), diagnostic.span.start)
            blanked = _blank(attempt, begin, end)
            if blanked == attempt or len(syntax_errors) >= MAX_SYNTAX_ERRORS:
                return ParseResult(None, syntax_errors)
            attempt = blanked
            continue
        finally:
            current.reset(token)
        if syntax_errors:
            return ParseResult(None, syntax_errors + report.diagnostics)
        if report.has_errors:
            return ParseResult(None, report.diagnostics)
        module = ast.Module(
            header=module.header,
            decls=module.decls,
            comments=tuple(ctx.comments),
            span=Span(file, 0, len(text), 1, 1, *_end_position(text)),
        )
        return ParseResult(module, report.diagnostics)


def _blank(text: str, begin: int, end: int) -> str:
    region = "".join(c if c == "\n" else " " for c in text[begin:end])
    return text[:begin] + region + text[end:]


def _end_position(text: str) -> tuple[int, int]:
    end = point("", text, len(text))
    return end.line, end.column
