"""Syntax errors in the user's words.

Lark reports terminal names (`RBRACE`, `__ANON_0`) and parser states; this module turns them
into messages such as "expected `}` to close `role a` opened at line 5", with a caret on the
offending text and a did-you-mean where a keyword was misspelled. It also finds the top-level
declaration around an error, so the parser can blank it out and keep looking for more errors.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from flowc.diagnostics import Diagnostic, Note
from flowc.spans import Span, point

DECL_KEYWORDS = ("flow", "import", "type", "placeholder", "global", "role", "graph")
VALUE_TERMINALS = frozenset({"INT", "FLOAT", "DURATION", "SIZE", "STRING", "NAME", "LSQB", "LBRACE"})
_REGEX_WORDS = {
    "NAME": "a name",
    "INT": "a whole number",
    "FLOAT": "a number",
    "DURATION": "a duration such as `30s`",
    "SIZE": "a size such as `16GiB`",
    "STRING": "a string",
    "$END": "end of file",
}
_CLAUSE_KEYWORDS = ("in", "out", "join")
_TOKEN_KINDS = {"NAME": "name", "INT": "number", "FLOAT": "number", "DURATION": "duration", "SIZE": "size", "STRING": "string"}
# Strings and comments, so that brackets and keywords inside them are not mistaken for code.
_OPAQUE = re.compile(r'"(?:[^"\\\n]|\\[^\n])*"|#[^\n]*')
_BRACKETS = re.compile(r"[\[\]{}]")
_DECL_START = re.compile(r"^(?:" + "|".join(DECL_KEYWORDS) + r")\b", re.MULTILINE)
_BLOCK_HEAD = re.compile(r"\b(role|interface|graph|global)\s+([A-Za-z_]\w*)[^{]*$|\b([A-Za-z_]\w*)\s*$")
MAX_NESTING = 32


def mask_opaque(text: str) -> str:
    """`text` with strings and comments blanked (same length, same line breaks)."""
    return _OPAQUE.sub(lambda m: " " * len(m.group(0)), text)


@dataclass(frozen=True)
class OpenBlock:
    label: str  # e.g. "role frontend", "join"
    offset: int
    opener: str


def open_blocks(masked: str, upto: int) -> list[OpenBlock]:
    """The stack of brackets still open at offset `upto` of masked source."""
    stack: list[OpenBlock] = []
    for match in _BRACKETS.finditer(masked, 0, upto):
        char = match.group(0)
        if char in "[{":
            stack.append(OpenBlock(_block_label(masked, match.start(), char), match.start(), char))
        elif stack and stack[-1].opener == ("[" if char == "]" else "{"):
            stack.pop()
    return stack


def too_deep(masked: str) -> int | None:
    """Offset of the first bracket nested deeper than MAX_NESTING, if any."""
    depth = 0
    for match in _BRACKETS.finditer(masked):
        if match.group(0) in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return match.start()
        else:
            depth = max(0, depth - 1)
    return None


def _block_label(masked: str, offset: int, opener: str) -> str:
    if opener == "[":
        return "["
    line_start = masked.rfind("\n", 0, offset) + 1
    head = _BLOCK_HEAD.search(masked[line_start:offset])
    if head is None:
        return "{"
    return f"{head.group(1)} {head.group(2)}" if head.group(1) else head.group(3)


def declaration_region(masked: str, offset: int) -> tuple[int, int]:
    """The extent of the top-level declaration holding `offset`, by declarations starting a line.

    If the error sits on the keyword that starts a declaration (the previous one lacked its
    closing brace), the region is the previous declaration.
    """
    starts = [m.start() for m in _DECL_START.finditer(masked)]
    before = [s for s in starts if s < offset]
    after = [s for s in starts if s > offset]
    begin = before[-1] if before else 0
    end = offset if offset in starts else (after[0] if after else len(masked))
    if end <= begin:
        end = len(masked)
    return begin, end


class SyntaxErrorTranslator:
    def __init__(self, lark: Lark):
        self._words = {t.name: f"`{t.pattern.value}`" for t in lark.terminals if t.pattern.type == "str"}
        self._words.update(_REGEX_WORDS)
        self._keywords = {t.pattern.value for t in lark.terminals if t.pattern.type == "str" and t.pattern.value.isalpha()}

    def translate(self, error: UnexpectedInput, file: str, text: str, masked: str) -> Diagnostic:
        if isinstance(error, UnexpectedCharacters):
            return self._bad_character(error, file, text)
        if isinstance(error, UnexpectedEOF):
            return self._unexpected(None, set(error.expected), file, text, masked)
        assert isinstance(error, UnexpectedToken)
        token = error.token if error.token.type != "$END" else None
        return self._unexpected(token, set(error.expected), file, text, masked)

    def _bad_character(self, error: UnexpectedCharacters, file: str, text: str) -> Diagnostic:
        offset = error.pos_in_stream
        span = point(file, text, offset)
        char = text[offset] if offset < len(text) else ""
        span = Span(file, offset, offset + 1, span.line, span.column, span.line, span.column + 1)
        if char == '"':
            line_end = text.find("\n", offset)
            line_end = len(text) if line_end < 0 else line_end
            span = Span(file, offset, line_end, span.line, span.column, span.line, span.column + line_end - offset)
            return Diagnostic("E002", "unterminated string", span, hint='close the string with `"` on the same line')
        hints = {
            ";": "statements need no separator; remove the `;`",
            "/": "comments start with `#`",
            "'": 'strings use double quotes: "..."',
            "-": "numbers in .flow files are never negative",
        }
        shown = char if char.isprintable() and not char.isspace() else repr(char)
        return Diagnostic("E003", f"unexpected character `{shown}`", span, hint=hints.get(char))

    def _unexpected(self, token: Token | None, expected: set[str], file: str, text: str, masked: str) -> Diagnostic:
        if token is None:
            span = point(file, text, len(text.rstrip()))
            what = "end of file"
            offset = len(text)
        else:
            span = Span(file, token.start_pos, token.end_pos, token.line, token.column, token.end_line, token.end_column)
            what = self._describe(token)
            offset = token.start_pos
        blocks = [b for b in open_blocks(masked, offset) if b.opener == "{"]
        innermost = blocks[-1] if blocks else None
        notes: tuple[Note, ...] = ()
        if innermost is not None and "RBRACE" in expected and (token is None or self._starts_declaration(token)):
            opened = point(file, text, innermost.offset)
            opened = Span(
                file, innermost.offset, innermost.offset + 1, opened.line, opened.column, opened.line, opened.column + 1
            )
            message = f"expected `}}` to close `{innermost.label}` opened at line {opened.line}"
            if token is not None:
                message += f", found {what}"
            notes = (Note(opened, f"`{innermost.label}` opened here"),)
            return Diagnostic("E001", message, span, hint=f"add `}}` to end `{innermost.label}`", notes=notes)
        where = f" in `{innermost.label}`" if innermost is not None else ""
        message = f"unexpected {what}{where}; expected {self._expected_words(expected)}"
        return Diagnostic("E001", message, span, hint=self._hint(token, expected))

    def _starts_declaration(self, token: Token) -> bool:
        return str(token) in DECL_KEYWORDS or str(token) == "interface"

    def _describe(self, token: Token) -> str:
        value = str(token)
        kind = _TOKEN_KINDS.get(token.type)
        if kind is None:
            return f"`{value}`"
        shown = value if len(value) <= 30 else value[:29] + "…"
        return f"{kind} `{shown}`"

    def _expected_words(self, expected: Iterable[str]) -> str:
        names = set(expected)
        words: list[str] = []
        if {k.upper() for k in DECL_KEYWORDS if k != "flow"} <= names:
            names -= {k.upper() for k in DECL_KEYWORDS}
            words.append("a declaration (`role`, `graph`, `placeholder`, `global`, `type`, `import`)")
        if names >= VALUE_TERMINALS:
            names -= VALUE_TERMINALS | {"FLOAT", "ALL"}
            words.append("a value")
        words += sorted(self._words.get(n, n.lower()) for n in names if not n.startswith("__"))
        if len(words) > 1:
            return ", ".join(words[:-1]) + " or " + words[-1]
        return words[0] if words else "something else"

    def _hint(self, token: Token | None, expected: set[str]) -> str | None:
        if token is None:
            return None
        wanted = [self._words[n].strip("`") for n in expected if n in self._words and self._words[n].strip("`") in self._keywords]
        if token.type == "NAME" and wanted:
            close = difflib.get_close_matches(str(token), wanted, n=1, cutoff=0.6)
            if close:
                return f"did you mean `{close[0]}`?"
        if str(token) in _CLAUSE_KEYWORDS and "INTERFACE" in expected:
            return f"`{token}` clauses belong inside an `interface NAME {{ ... }}` block of the role"
        if str(token) in self._keywords and expected == {"NAME"}:
            return f"`{token}` is a reserved word; choose another name"
        return None
