"""The Lark transformer that turns parse results into `flowc.syntax.ast` nodes.

It runs inline with the LALR parser (no intermediate tree, no recursion, so nesting depth
cannot overflow the stack) and with `keep_all_tokens`, so each rule sees its first and last
token and every node gets an exact span. Problems found while building (a bad escape, a number
too large) go to the `Report` of the parse in progress.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from dataclasses import dataclass

from lark import Token, Transformer

from flowc.diagnostics import Report
from flowc.spans import Span
from flowc.syntax import ast


@dataclass
class BuildContext:
    file: str
    text: str
    report: Report
    comments: list[ast.Comment]


current: ContextVar[BuildContext] = ContextVar("flowc_build_context")

_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE_UNITS = {
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}  # fmt: skip
_NUMBER_UNIT = re.compile(r"(\d+(?:\.\d+)?)([A-Za-z]+)")
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r"}
MAX_INT_DIGITS = 18


def token_span(token: Token) -> Span:
    return Span(
        current.get().file,
        token.start_pos,
        token.end_pos,
        token.line,
        token.column,
        token.end_line,
        token.end_column,
    )


def _span_of(item: object) -> Span:
    return token_span(item) if isinstance(item, Token) else item.span  # type: ignore[attr-defined]


def _span(children: list) -> Span:
    return _span_of(children[0]).to(_span_of(children[-1]))


def _ident(token: Token) -> ast.Ident:
    return ast.Ident(text=str(token), span=token_span(token))


def _names(children: list) -> list[ast.Ident]:
    return [_ident(c) for c in children if isinstance(c, Token) and c.type == "NAME"]


def _nodes(children: list, kind: type | tuple[type, ...] = ast.Node) -> list:
    return [c for c in children if isinstance(c, kind)]


def _has(children: list, token_type: str) -> bool:
    return any(isinstance(c, Token) and c.type == token_type for c in children)


def on_comment(token: Token) -> None:
    ctx = current.get()
    line_start = ctx.text.rfind("\n", 0, token.start_pos) + 1
    trailing = bool(ctx.text[line_start : token.start_pos].strip())
    ctx.comments.append(ast.Comment(text=str(token).rstrip(), trailing=trailing, span=token_span(token)))


class AstBuilder(Transformer):
    """One method per grammar rule; each receives all tokens of the rule, anonymous ones included."""

    # ── module ──

    def start(self, children: list) -> ast.Module:
        ctx = current.get()
        headers = _nodes(children, ast.Header)
        decls = children[-1]
        return ast.Module(
            header=headers[0] if headers else None,
            decls=tuple(decls),
            span=Span(ctx.file, 0, len(ctx.text), 1, 1, 1, 1),
        )

    def decls(self, children: list) -> list[ast.Decl]:
        if not children:
            return []
        collected, decl = children
        collected.append(decl)
        return collected

    def header(self, children: list) -> ast.Header:
        return ast.Header(name=_names(children)[0], span=_span(children))

    def import_decl(self, children: list) -> ast.Import:
        return ast.Import(path=tuple(_names(children)), span=_span(children))

    def type_decl(self, children: list) -> ast.TypeAlias:
        return ast.TypeAlias(name=_ident(children[1]), type=children[3], span=_span(children))

    def placeholder_decl(self, children: list) -> ast.Placeholder:
        return ast.Placeholder(name=_names(children)[0], type=children[-1], stream=_has(children, "STREAM"), span=_span(children))

    def global_decl(self, children: list) -> ast.Global:
        blocks = _nodes(children, ast.BlockValue)
        return ast.Global(
            name=_ident(children[1]),
            kind=_ident(children[3]),
            entries=blocks[0].entries if blocks else (),
            span=_span(children),
        )

    # ── roles ──

    def role_decl(self, children: list) -> ast.Role:
        return ast.Role(name=_ident(children[1]), items=tuple(_nodes(children)), span=_span(children))

    def share_decl(self, children: list) -> ast.ShareGpus:
        return ast.ShareGpus(resource=_ident(children[1]), target=_ident(children[3]), span=_span(children))

    def allow_clause(self, children: list) -> ast.AllowClause:
        return ast.AllowClause(codes=tuple(_names(children)), span=_span(children))

    def setting(self, children: list) -> ast.Setting:
        return ast.Setting(key=_ident(children[0]), values=tuple(_nodes(children[1:])), span=_span(children))

    kv = setting

    # ── interfaces ──

    def interface_decl(self, children: list) -> ast.Interface:
        return ast.Interface(name=_ident(children[1]), items=tuple(_nodes(children)), span=_span(children))

    def in_clause(self, children: list) -> ast.InClause:
        return ast.InClause(groups=tuple(_nodes(children, ast.AndGroup)), span=_span(children))

    def and_group(self, children: list) -> ast.AndGroup:
        return ast.AndGroup(inputs=tuple(_nodes(children, ast.InputRef)), span=_span(children))

    def input_ref(self, children: list) -> ast.InputRef:
        types = _nodes(children, (ast.NamedType, ast.ListType))
        sources = _nodes(children, ast.SourceRef)
        return ast.InputRef(
            field=_ident(children[0]),
            type=types[0] if types else None,
            source=sources[0] if sources else None,
            span=_span(children),
        )

    def source(self, children: list) -> ast.SourceRef:
        role, interface = _names(children)
        return ast.SourceRef(role=role, interface=interface, span=_span(children))

    def out_clause(self, children: list) -> ast.OutClause:
        return ast.OutClause(
            stream=_has(children, "STREAM"),
            fields=tuple(_nodes(children, ast.OutField)),
            span=_span(children),
        )

    def out_field(self, children: list) -> ast.OutField:
        return ast.OutField(name=_ident(children[0]), type=children[2], span=_span(children))

    def join_clause(self, children: list) -> ast.JoinClause:
        return ast.JoinClause(items=tuple(_nodes(children, ast.JoinItem)), span=_span(children))

    def join_item(self, children: list) -> ast.JoinItem:
        sources = _nodes(children, ast.SourceRef)
        threshold = children[-1]
        count = None if threshold.type == "ALL" else self._int(threshold)
        return ast.JoinItem(
            field=_ident(children[0]),
            source=sources[0] if sources else None,
            count=count,
            span=_span(children),
        )

    # ── graphs ──

    def graph_decl(self, children: list) -> ast.Graph:
        return ast.Graph(name=_ident(children[1]), items=tuple(_nodes(children)), span=_span(children))

    def interruptible_clause(self, children: list) -> ast.InterruptibleClause:
        return ast.InterruptibleClause(span=_span(children))

    def entry_clause(self, children: list) -> ast.EntryClause:
        return ast.EntryClause(names=tuple(_names(children)), span=_span(children))

    def stream_clause(self, children: list) -> ast.StreamClause:
        return ast.StreamClause(
            field=_nodes(children, ast.GraphField)[0],
            ordered=_has(children, "ORDERED"),
            span=_span(children),
        )

    def return_clause(self, children: list) -> ast.ReturnClause:
        return ast.ReturnClause(fields=tuple(_nodes(children, ast.GraphField)), span=_span(children))

    def graph_field(self, children: list) -> ast.GraphField:
        types = _nodes(children, (ast.NamedType, ast.ListType))
        return ast.GraphField(name=_ident(children[0]), type=types[0] if types else None, span=_span(children))

    # ── types ──

    def named_type(self, children: list) -> ast.NamedType:
        return ast.NamedType(name=_ident(children[0]), span=_span(children))

    def list_type(self, children: list) -> ast.ListType:
        return ast.ListType(item=children[1], span=_span(children))

    # ── values ──

    def int_value(self, children: list) -> ast.IntValue:
        return ast.IntValue(value=self._int(children[0]), span=_span(children))

    def float_value(self, children: list) -> ast.FloatValue:
        token = children[0]
        return ast.FloatValue(value=float(token), text=str(token), span=_span(children))

    def duration_value(self, children: list) -> ast.DurationValue:
        number, unit = _NUMBER_UNIT.fullmatch(str(children[0])).groups()  # type: ignore[union-attr]
        return ast.DurationValue(text=str(children[0]), seconds=float(number) * _DURATION_UNITS[unit], span=_span(children))

    def size_value(self, children: list) -> ast.SizeValue:
        number, unit = _NUMBER_UNIT.fullmatch(str(children[0])).groups()  # type: ignore[union-attr]
        return ast.SizeValue(text=str(children[0]), bytes=int(float(number) * _SIZE_UNITS[unit]), span=_span(children))

    def unknown_unit_value(self, children: list) -> ast.IntValue:
        token = children[0]
        number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(.*)", str(token)).groups()  # type: ignore[union-attr]
        current.get().report.add(
            "E007",
            f"unknown unit `{_shorten(unit)}` in `{_shorten(str(token))}`",
            token_span(token),
            hint=f"sizes take {', '.join(_SIZE_UNITS)} (`{number}MiB`), durations {', '.join(_DURATION_UNITS)} "
            f"(`{number}s`); a plain number takes none",
        )
        return ast.IntValue(value=0, span=_span(children))

    def string_value(self, children: list) -> ast.StringValue:
        return ast.StringValue(value=self._unescape(children[0]), span=_span(children))

    def name_value(self, children: list) -> ast.NameValue:
        return ast.NameValue(name=str(children[0]), span=_span(children))

    def list_value(self, children: list) -> ast.ListValue:
        return ast.ListValue(items=tuple(_nodes(children)), span=_span(children))

    def kv_block(self, children: list) -> ast.BlockValue:
        return ast.BlockValue(entries=tuple(_nodes(children, ast.Setting)), span=_span(children))

    # ── helpers that may report ──

    def _int(self, token: Token) -> int:
        digits = str(token).lstrip("0") or "0"
        if len(digits) > MAX_INT_DIGITS:
            current.get().report.add(
                "E005",
                f"number `{_shorten(str(token))}` is too large",
                token_span(token),
                hint=f"numbers in .flow files have at most {MAX_INT_DIGITS} digits",
            )
            return 0
        return int(digits)

    def _unescape(self, token: Token) -> str:
        raw = str(token)[1:-1]

        def replace(match: re.Match[str]) -> str:
            char = match.group(1)
            if char in _ESCAPES:
                return _ESCAPES[char]
            span = token_span(token)
            current.get().report.add(
                "E004",
                f"unknown escape `\\{char}` in string",
                span,
                hint='the escapes are \\" \\\\ \\n \\t \\r; write \\\\ for a backslash',
            )
            return char

        return _ESCAPE.sub(replace, raw)


def _shorten(text: str, limit: int = 24) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
