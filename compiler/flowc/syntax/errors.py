"""Syntax errors in the user's words.

Lark reports terminal names (`RBRACE`, `__ANON_0`) and parser states; this module turns them
into messages such as "expected `}` to close `role a` opened at line 5", with a caret on the
offending text and a did-you-mean where a keyword was misspelled. It also finds the top-level
declaration around an error, so the parser can blank it out and keep looking for more errors.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
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


# `stream a ordered, b`: a graph's `stream` clause before the comma (an interface's
# `out stream a: T, b: T` takes a list, so there the comma is no error).
_STREAM_BEFORE = re.compile(r"(?<![\w])(?<!out )stream\s+[A-Za-z_]\w*(?:\s*:\s*[\w\[\]\s]*?)?(?:\s+ordered)?\s*$")
_NEXT_FIELD = re.compile(r"\s*([A-Za-z_]\w*)(?:\s*:\s*[\w\[\]]+)?(\s+ordered\b)?")


def _stream_list_hint(masked: str, comma: Token) -> str | None:
    """The hint for a comma after a graph's `stream` clause: each `stream` takes one field."""
    line_start = masked.rfind("\n", 0, comma.start_pos) + 1
    if _STREAM_BEFORE.search(masked[line_start : comma.start_pos]) is None:
        return None
    following = _NEXT_FIELD.match(masked, comma.end_pos)
    if following is None:
        return "each `stream` clause takes one field: remove the `,` and stream the next field on a line of its own"
    clause = f"stream {following.group(1)}{' ordered' if following.group(2) else ''}"
    return f"each `stream` clause takes one field: remove the `,` and write `{clause}` on a line of its own"


# Keywords after which a name is declared: a keyword there was meant as the name.
_NAMING_KEYWORDS = frozenset(
    {"flow", "import", "type", "placeholder", "global", "role", "interface", "graph", "share", "with", "from"}
)
# Clause keywords that take names, and what they take.
_NEEDS_NAMES = {
    "entry": "one or more placeholder names",
    "return": "one or more field names",
    "stream": "a field name",
    "in": "one or more field names",
    "out": "one or more `name: Type` fields",
    "allow": "one or more warning codes, such as `W210`,",
}
# Keywords that cannot appear directly in a kind of block: the LALR tables share the states
# after a setting between roles, interfaces and graphs, so their expected sets offer them all.
_NOT_IN_BLOCK = {
    "role": {"ENTRY", "STREAM", "ORDERED", "RETURN", "IN", "OUT", "JOIN", "INTERRUPTIBLE"},
    "interface": {"ENTRY", "ORDERED", "RETURN", "INTERFACE", "SHARE", "ALLOW", "INTERRUPTIBLE"},
    "graph": {"IN", "OUT", "JOIN", "INTERFACE", "SHARE"},
}


def _possible_here(expected: set[str], innermost: OpenBlock | None, blocks: list[OpenBlock]) -> set[str]:
    """`expected` less what cannot follow in this block (LALR states are shared by every
    block that takes settings, so their expected sets mix roles, interfaces and graphs)."""
    kind = innermost.label.split(" ")[0] if innermost is not None else ""
    narrowed = set(expected) - _NOT_IN_BLOCK.get(kind, set())
    if not any(b.opener == "[" for b in blocks):
        narrowed.discard("RSQB")
    return narrowed or expected


def _next_char(text: str, offset: int) -> str:
    rest = text[offset : offset + 200].lstrip()
    return rest[:1]


def _character_hint(text: str, offset: int) -> str | None:
    char = text[offset]
    before = text[offset - 1] if offset > 0 else ""
    after = text[offset + 1] if offset + 1 < len(text) else ""
    if char == ";":
        return "statements need no separator; remove the `;`"
    if char == "'":
        return 'strings use double quotes: "..."'
    if char == "/" and after in "/*":
        return "comments start with `#` and run to the end of the line"
    if char == "-" and after.isdigit() and not (before.isalnum() or before == "_"):
        return "numbers in .flow files are never negative"
    if char == "-" and (before.isalnum() or before == "_"):
        return "names hold ASCII letters, digits and `_`, not `-`: use `_`"
    if char == "\ufeff":
        return "remove the invisible byte-order mark: it is allowed only at the very start of the file"
    if char.isalpha() or char.isdigit():  # a letter or digit outside ASCII
        return f"names hold ASCII letters, digits and `_`; `{char}` may appear only in strings and comments"
    if unicodedata.category(char) == "Cc":  # NUL, ESC, ...: binary data, not text
        return f"delete the control character U+{ord(char):04X}; is this a .flow text file?"
    if not char.isprintable() or char.isspace():
        return f"delete the invisible character U+{ord(char):04X} (copied from a web page or a word processor?)"
    return None


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
        self._lark = lark
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
        if token is not None:
            token = self._stream_as_name(token, set(error.expected), text, masked) or token
        return self._unexpected(token, set(error.expected), file, text, masked)

    def _stream_as_name(self, token: Token, expected: set[str], text: str, masked: str) -> Token | None:
        """`placeholder stream: T` stops the parser at `:` (a streaming placeholder without its
        name), but `stream` was more likely meant as the name: the `stream` token, to report there."""
        if expected != {"NAME"} or token.type == "NAME" or str(token) in self._keywords:
            return None
        keyword = self._token_before(masked, token.start_pos)
        if keyword is None or keyword.type != "STREAM":
            return None
        declaration = self._token_before(masked, keyword.start_pos)
        if declaration is None or str(declaration) != "placeholder":
            return None
        start, end = point("", text, keyword.start_pos), point("", text, keyword.start_pos + len(keyword))
        return Token(
            "STREAM",
            str(keyword),
            start_pos=keyword.start_pos,
            line=start.line,
            column=start.column,
            end_line=end.line,
            end_column=end.column,
            end_pos=keyword.start_pos + len(keyword),
        )

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
        shown = f"`{char}`" if char.isprintable() and not char.isspace() else f"U+{ord(char):04X} (invisible)"
        return Diagnostic("E003", f"unexpected character {shown}", span, hint=_character_hint(text, offset))

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
        expected = _possible_here(expected, innermost, open_blocks(masked, offset))
        message = f"unexpected {what}{where}; expected {self._expected_words(expected)}"
        before = self._token_before(masked, offset) if token is not None else None
        return Diagnostic("E001", message, span, hint=self._hint(token, expected, before, masked))

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

    def _token_before(self, masked: str, offset: int) -> Token | None:
        """The last token before `offset`, lexed again from the start of its declaration."""
        begin, _ = declaration_region(masked, offset)
        last = None
        try:
            for last in self._lark.lex(masked[begin:offset]):  # noqa: B007 - only the last one is wanted
                pass
        except UnexpectedInput:  # pragma: no cover - the parser read this text already
            return None
        if last is None:
            return None
        return Token(last.type, last.value, start_pos=begin + last.start_pos)  # positions in the whole text

    def _hint(self, token: Token | None, expected: set[str], before: Token | None, masked: str) -> str | None:
        if token is None:
            return None
        word, previous = str(token), str(before) if before is not None else ""
        wanted = [self._words[n].strip("`") for n in expected if n in self._words and self._words[n].strip("`") in self._keywords]
        if token.type == "NAME" and wanted:
            close = difflib.get_close_matches(word, wanted, n=1, cutoff=0.6)
            if close:
                return f"did you mean `{close[0]}`?"
        if word in _CLAUSE_KEYWORDS and "INTERFACE" in expected:
            return f"`{token}` clauses belong inside an `interface NAME {{ ... }}` block of the role"
        if word == "," and {"`&`", "`|`"} <= {self._words.get(n) for n in expected}:
            return "an `in` clause joins fields with `&` (all of them) or `|` (any of them), not `,`"
        if word == "=" and before is not None and before.type == "NAME":
            return f"settings take no `=`: write `{previous} VALUE`"
        if word == ",":
            stream = _stream_list_hint(masked, token)
            if stream is not None:
                return stream
        if word not in self._keywords or expected != {"NAME"}:
            return self._comma_hint(token, before, masked)
        # a keyword where a name was wanted: was it meant as a name, or does the text before lack one?
        meant_as_name = _next_char(masked, token.end_pos) in (":", "{", "=") or previous in _NAMING_KEYWORDS
        if meant_as_name and previous == "placeholder" and word == "stream":
            return "`stream` is a reserved word; choose another name (a placeholder whose values stream is declared `placeholder stream NAME: TYPE`)"
        if meant_as_name:
            return f"`{token}` is a reserved word; choose another name"
        if previous == ",":
            return (
                f"remove the `,` before `{token}`: a comma continues the list of the clause before it; "
                "clauses and settings are separated by newlines or spaces"
            )
        if previous in ("&", "|"):
            what = "field" if previous == "&" else "alternative"
            return f"nothing follows the `{previous}` before `{token}`: add the {what}, or remove the `{previous}`"
        if previous in _NEEDS_NAMES:
            return f"`{previous}` needs {_NEEDS_NAMES[previous]} after it, before `{token}`"
        return f"`{token}` is a reserved word; choose another name"

    def _comma_hint(self, token: Token, before: Token | None, masked: str) -> str | None:
        """A setting name read as one more value of the setting before it: `impl "m:A", replicas 2`."""
        if before is None or before.type != "NAME" or token.type not in VALUE_TERMINALS:
            return None
        comma = masked.rfind(",", 0, before.start_pos)
        if comma < 0 or masked[comma + 1 : before.start_pos].strip():
            return None
        return (
            f"`{before}` was read as one more value of the setting before it, because of the `,` before `{before}`: "
            "settings are separated by newlines or spaces, not commas; remove the `,`"
        )
