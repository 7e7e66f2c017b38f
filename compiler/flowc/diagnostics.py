"""Diagnostics: what every compiler pass reports, and how flowc prints it.

A pass never raises for bad input; it appends `Diagnostic`s to a `Report`. The CLI renders
them sorted by position, as text (`file:line:col: E012 message`, the source line, a caret
span, a hint) or as JSON for tools.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from flowc.spans import Span


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Note:
    span: Span
    message: str


@dataclass(frozen=True, slots=True)
class Diagnostic:
    code: str
    message: str
    span: Span
    hint: str | None = None
    notes: tuple[Note, ...] = ()

    @property
    def severity(self) -> Severity:
        return Severity.WARNING if self.code.startswith("W") else Severity.ERROR

    def sort_key(self) -> tuple[str, int, int, str]:
        return (*self.span.sort_key(), self.code)

    def as_json(self) -> dict[str, object]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "span": self.span.as_json(),
            "hint": self.hint,
            "notes": [{"span": n.span.as_json(), "message": n.message} for n in self.notes],
        }


@dataclass
class Report:
    """Collects the diagnostics of one compilation, deduplicated, in arrival order."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    _seen: set[tuple[str, str, int]] = field(default_factory=set, repr=False)

    def add(
        self,
        code: str,
        message: str,
        span: Span,
        hint: str | None = None,
        notes: Iterable[Note] = (),
    ) -> None:
        key = (code, message, span.start)
        if key in self._seen:
            return
        self._seen.add(key)
        self.diagnostics.append(Diagnostic(code, message, span, hint, tuple(notes)))

    def extend(self, diagnostics: Iterable[Diagnostic]) -> None:
        for d in diagnostics:
            self.add(d.code, d.message, d.span, d.hint, d.notes)

    @property
    def has_errors(self) -> bool:
        return any(d.severity is Severity.ERROR for d in self.diagnostics)

    def sorted(self) -> list[Diagnostic]:
        return sorted(self.diagnostics, key=Diagnostic.sort_key)


def render_text(
    diagnostics: Iterable[Diagnostic],
    sources: Mapping[str, str],
    color: bool = False,
) -> str:
    """Human-readable diagnostics with source excerpts; `sources` maps file names to text."""
    lines = _SourceLines(sources)
    blocks = [_render_one(d, lines, color) for d in diagnostics]
    return "\n".join(blocks)


class _SourceLines:
    """Each source's lines, split once however many diagnostics quote it."""

    def __init__(self, sources: Mapping[str, str]):
        self._sources = sources
        self._lines: dict[str, list[str]] = {}

    def get(self, file: str) -> list[str] | None:
        if file not in self._lines:
            text = self._sources.get(file)
            if text is None:
                return None
            # lines end at "\n" only, as spans count them (`splitlines` would also split at
            # form feeds and U+2028, and the excerpt would show the wrong line)
            self._lines[file] = [line.removesuffix("\r") for line in text.split("\n")]
        return self._lines[file]


def render_json(diagnostics: Iterable[Diagnostic]) -> str:
    return json.dumps([d.as_json() for d in diagnostics], indent=2, sort_keys=True)


def summary_line(diagnostics: list[Diagnostic]) -> str:
    errors = sum(1 for d in diagnostics if d.severity is Severity.ERROR)
    warnings = len(diagnostics) - errors
    parts = []
    if errors:
        parts.append(f"{errors} error{'s' if errors != 1 else ''}")
    if warnings:
        parts.append(f"{warnings} warning{'s' if warnings != 1 else ''}")
    return ", ".join(parts) if parts else "no problems"


def _style(text: str, color: bool, **styles: object) -> str:
    if not color:
        return text
    import click

    return click.style(text, **styles)  # type: ignore[arg-type]


def _render_one(d: Diagnostic, sources: _SourceLines, color: bool) -> str:
    sev_color = "red" if d.severity is Severity.ERROR else "yellow"
    head = (
        f"{d.span.file}:{d.span.line}:{d.span.column}: "
        f"{_style(d.code, color, fg=sev_color, bold=True)} {_style(d.message, color, bold=True)}"
    )
    lines = [head]
    lines += _excerpt(d.span, sources.get(d.span.file), color, sev_color)
    for note in d.notes:
        lines.append(f"  note: {note.span.file}:{note.span.line}:{note.span.column}: {note.message}")
        lines += _excerpt(note.span, sources.get(note.span.file), color, "blue")
    if d.hint:
        lines.append(f"  {_style('hint', color, fg='green', bold=True)}: {d.hint}")
    return "\n".join(lines) + "\n"


def _excerpt(span: Span, source_lines: list[str] | None, color: bool, caret_color: str) -> list[str]:
    if source_lines is None:
        return []
    if not 1 <= span.line <= len(source_lines):
        return []
    line_text = source_lines[span.line - 1].expandtabs(1)
    gutter = str(span.line)
    start = span.column - 1
    end = span.end_column - 1 if span.end_line == span.line else len(line_text)
    width = max(1, end - start)
    shown, start, width, clipped = _clip(line_text, start, width)
    # control characters would move the caret or drive the terminal: one visible mark each
    shown = "".join(c if c.isprintable() else "\ufffd" for c in shown)
    caret = " " * start + "^" * width
    pad = " " * len(gutter)
    lines = [
        f"  {gutter} | {shown}",
        f"  {pad} | {_style(caret, color, fg=caret_color, bold=True)}",
    ]
    if clipped:
        lines.append(f"  {pad} | (line {span.line} is {len(line_text):,} characters long; {clipped})")
    return lines


# A source line longer than this is shown as a window around the caret (a minified or generated
# file can hold megabytes on one line, and printing it whole drowns the message).
MAX_EXCERPT = 160
_CONTEXT = 60  # characters kept on each side of the caret
_MAX_CARET = 40  # a longer caret is cut, so the context around it stays visible


def _clip(line: str, start: int, width: int) -> tuple[str, int, int, str]:
    """The part of `line` to print, the caret's start and width in it, and what was left out."""
    if len(line) <= MAX_EXCERPT:
        return line, start, width, ""
    width = min(width, _MAX_CARET)
    begin = max(0, start - _CONTEXT)
    end = min(len(line), start + width + _CONTEXT)
    head = "…" if begin > 0 else ""
    tail = "…" if end < len(line) else ""
    shown = head + line[begin:end] + tail
    what = f"columns {begin + 1}-{end} shown"
    return shown, start - begin + len(head), width, what
