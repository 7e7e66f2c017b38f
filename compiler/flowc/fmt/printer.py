"""The canonical printer behind `flowc fmt`.

Layout rules (docs/language.md, "Formatting"):
- four-space indentation; one blank line between top-level declarations, except inside a run
  of imports, placeholders or type aliases, where the source's blank lines are kept (at most one);
- inside blocks, a blank line is kept where the source had one;
- `in` is padded to line up with `out` (`in  x`), graph `entry` with `stream`/`return`;
- an interface whose body is a single-field `in` and a non-stream single-field `out` prints on one
  line; the gap before its `out` is kept as written (two spaces at least), so hand-made tables
  of one-line interfaces survive;
- `join { ... }` and `batch { ... }` print inline; globals print one setting per line;
- standalone comments keep their place; a trailing comment keeps its column when the code
  before it still fits, otherwise it follows the code after two spaces.
The printer only reads the AST and the comments; `parse(fmt(x)) == parse(x)`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from flowc.syntax import ast

INDENT = "    "
MAX_WIDTH = 100
SIMPLE_DECLS = (ast.Import, ast.Placeholder, ast.TypeAlias)


@dataclass
class _Line:
    text: str  # without indentation
    indent: int
    anchor: int  # source line of the code it prints; 0 for blank lines and comments
    comment: str | None = None
    comment_column: int = 0


class Printer:
    def __init__(self, module: ast.Module, source: str):
        self.module = module
        self.source_lines = source.split("\n")
        self.lines: list[_Line] = []
        self.standalone = [c for c in module.comments if not c.trailing]
        self.trailing = {c.span.line: c for c in module.comments if c.trailing}
        self.next_comment = 0

    # ── driver ──

    def render(self) -> str:
        previous: ast.Node | None = None
        if self.module.header is not None:
            self._flush_comments(self.module.header.span.line, 0)
            self._emit(0, f"flow {self.module.header.name.text}", self.module.header.span.line)
            previous = self.module.header
        for decl in self.module.decls:
            self._before_item(decl, previous, 0, force_blank=self._force_blank(previous, decl))
            self._decl(decl)
            previous = decl
        self._flush_comments(len(self.source_lines) + 1, 0)
        self._attach_trailing()
        return self._join()

    def _force_blank(self, previous: ast.Node | None, decl: ast.Decl) -> bool:
        if previous is None:
            return False
        return not (isinstance(decl, SIMPLE_DECLS) and type(previous) is type(decl))

    def _join(self) -> str:
        out: list[str] = []
        for line in self.lines:
            text = (INDENT * line.indent + line.text) if line.text else ""
            if line.comment is not None:
                text = text + " " * max(2, line.comment_column - len(text)) + line.comment
            out.append(text.rstrip())
        while out and not out[-1]:
            out.pop()
        return "\n".join(out) + "\n" if out else ""

    # ── lines, blank lines, comments ──

    def _emit(self, indent: int, text: str, anchor: int) -> None:
        self.lines.append(_Line(text, indent, anchor))

    def _blank(self) -> None:
        if self.lines and self.lines[-1].text and not self.lines[-1].text.endswith("{"):
            self.lines.append(_Line("", 0, 0))

    def _source_blank_above(self, line: int) -> bool:
        return line >= 2 and not self.source_lines[line - 2].strip()

    def _before_item(self, node: ast.Node, previous: ast.Node | None, indent: int, force_blank: bool = False) -> None:
        first_comment = self._peek_comment(node.span.line)
        first_line = first_comment.span.line if first_comment is not None else node.span.line
        if previous is not None and (force_blank or self._source_blank_above(first_line)):
            self._blank()
        self._flush_comments(node.span.line, indent)
        if first_comment is not None and self._source_blank_above(node.span.line):
            self._blank()

    def _peek_comment(self, before_line: int) -> ast.Comment | None:
        if self.next_comment < len(self.standalone) and self.standalone[self.next_comment].span.line < before_line:
            return self.standalone[self.next_comment]
        return None

    def _flush_comments(self, before_line: int, indent: int) -> None:
        first = True
        while (comment := self._peek_comment(before_line)) is not None:
            if not first and self._source_blank_above(comment.span.line):
                self._blank()
            self.lines.append(_Line(comment.text, indent, 0))
            self.next_comment += 1
            first = False

    def _close(self, node: ast.Node, indent: int) -> None:
        self._flush_comments(node.span.end_line, indent + 1)
        self._emit(indent, "}", node.span.end_line)

    def _attach_trailing(self) -> None:
        """Give each trailing comment to the last printed line whose code starts at or above it."""
        by_anchor: dict[int, _Line] = {}
        for line in self.lines:
            if line.anchor:
                by_anchor[line.anchor] = line
        anchors = sorted(by_anchor)
        for source_line, comment in sorted(self.trailing.items()):
            index = bisect.bisect_right(anchors, source_line) - 1
            if index < 0:
                continue
            target = by_anchor[anchors[index]]
            if target.comment is None:
                target.comment, target.comment_column = comment.text, comment.span.column - 1
            else:
                target.comment = f"{target.comment} {comment.text}"

    # ── declarations ──

    def _decl(self, decl: ast.Decl) -> None:
        line = decl.span.line
        match decl:
            case ast.Import():
                self._emit(0, f"import {decl.dotted}", line)
            case ast.TypeAlias():
                self._emit(0, f"type {decl.name.text} = {ast.type_text(decl.type)}", line)
            case ast.Placeholder():
                stream = "stream " if decl.stream else ""
                self._emit(0, f"placeholder {stream}{decl.name.text}: {ast.type_text(decl.type)}", line)
            case ast.Global():
                head = f"global {decl.name.text}: {decl.kind.text}"
                self._block(head, decl, decl.entries, 0, self._setting)
            case ast.Role():
                self._block(f"role {decl.name.text}", decl, decl.items, 0, self._role_item)
            case ast.Graph():
                self._block(f"graph {decl.name.text}", decl, decl.items, 0, self._graph_item)

    def _block(self, head: str, node: ast.Node, items: tuple, indent: int, print_item) -> None:
        if not items and not self._has_comments_within(node):
            self._emit(indent, f"{head} {{}}" if not isinstance(node, ast.Global) else head, node.span.line)
            return
        self._emit(indent, f"{head} {{", node.span.line)
        previous: ast.Node | None = None
        for item in items:
            self._before_item(item, previous, indent + 1)
            print_item(item, indent + 1)
            previous = item
        self._close(node, indent)

    def _has_comments_within(self, node: ast.Node) -> bool:
        return any(node.span.start < c.span.start < node.span.end for c in self.module.comments)

    def _role_item(self, item: ast.RoleItem, indent: int) -> None:
        match item:
            case ast.Interface():
                self._interface(item, indent)
            case ast.ShareGpus():
                self._emit(indent, f"share {item.resource.text} with {item.target.text}", item.span.line)
            case ast.AllowClause():
                self._emit(indent, allow_text(item), item.span.line)
            case ast.Setting():
                self._setting(item, indent)

    def _setting(self, item: ast.Setting, indent: int) -> None:
        text = f"{item.key.text} {', '.join(value_text(v) for v in item.values)}"
        if len(INDENT * indent + text) > MAX_WIDTH and len(item.values) == 1 and isinstance(item.values[0], ast.BlockValue):
            self._block(item.key.text, item, item.values[0].entries, indent, self._setting)
            return
        self._emit(indent, text, item.span.line)

    # ── interfaces ──

    def _interface(self, item: ast.Interface, indent: int) -> None:
        head = f"interface {item.name.text}"
        if self._one_line(item):
            in_clause, out_clause = item.items
            gap = 2
            if item.span.line == item.span.end_line:
                gap = max(2, out_clause.span.column - in_clause.span.end_column)
            text = f"{head} {{ {self._in_text(in_clause)}{' ' * gap}{self._out_text(out_clause)} }}"
            if len(INDENT * indent + text) <= MAX_WIDTH:
                self._emit(indent, text, item.span.line)
                return
        self._block(head, item, item.items, indent, self._interface_item)

    def _one_line(self, item: ast.Interface) -> bool:
        if len(item.items) != 2 or self._has_comments_within(item):
            return False
        first, second = item.items
        return (
            isinstance(first, ast.InClause)
            and len(first.groups) == 1
            and len(first.groups[0].inputs) == 1
            and isinstance(second, ast.OutClause)
            and not second.stream
            and len(second.fields) == 1
        )

    def _interface_item(self, item: ast.InterfaceItem, indent: int) -> None:
        line = item.span.line
        match item:
            case ast.InClause():
                self._emit(indent, "in  " + self._in_text(item)[3:], line)
            case ast.OutClause():
                self._emit(indent, self._out_text(item), line)
            case ast.JoinClause():
                self._join_clause(item, indent)
            case ast.Setting():
                self._setting(item, indent)

    def _in_text(self, clause: ast.InClause) -> str:
        return "in " + " | ".join(" & ".join(self._input(r) for r in g.inputs) for g in clause.groups)

    def _input(self, ref: ast.InputRef) -> str:
        text = ref.field.text
        if ref.type is not None:
            text += f": {ast.type_text(ref.type)}"
        if ref.source is not None:
            text += f" from {ref.source.role.text}.{ref.source.interface.text}"
        return text

    def _out_text(self, clause: ast.OutClause) -> str:
        fields = ", ".join(f"{f.name.text}: {ast.type_text(f.type)}" for f in clause.fields)
        return f"out {'stream ' if clause.stream else ''}{fields}"

    def _join_clause(self, clause: ast.JoinClause, indent: int) -> None:
        items = [self._join_item(i) for i in clause.items]
        text = f"join {{ {', '.join(items)} }}"
        if len(INDENT * indent + text) <= MAX_WIDTH and not self._has_comments_within(clause):
            self._emit(indent, text, clause.span.line)
            return
        self._emit(indent, "join {", clause.span.line)
        previous: ast.Node | None = None
        for item, text in zip(clause.items, items, strict=True):
            self._before_item(item, previous, indent + 1)
            self._emit(indent + 1, f"{text},", item.span.line)
            previous = item
        self._close(clause, indent)

    def _join_item(self, item: ast.JoinItem) -> str:
        source = f" from {item.source.role.text}.{item.source.interface.text}" if item.source else ""
        count = "all" if item.count is None else str(item.count)
        return f"{item.field.text}{source}: {count}"

    # ── graphs ──

    def _graph_item(self, item: ast.GraphItem, indent: int) -> None:
        line = item.span.line
        match item:
            case ast.EntryClause():
                self._emit(indent, "entry  " + ", ".join(n.text for n in item.names), line)
            case ast.StreamClause():
                ordered = " ordered" if item.ordered else ""
                self._emit(indent, f"stream {self._graph_field(item.field)}{ordered}", line)
            case ast.ReturnClause():
                self._emit(indent, "return " + ", ".join(self._graph_field(f) for f in item.fields), line)
            case ast.InterruptibleClause():
                self._emit(indent, "interruptible", line)
            case ast.AllowClause():
                self._emit(indent, allow_text(item), line)
            case ast.Setting():
                self._setting(item, indent)

    def _graph_field(self, item: ast.GraphField) -> str:
        return item.name.text + (f": {ast.type_text(item.type)}" if item.type is not None else "")


def allow_text(clause: ast.AllowClause) -> str:
    return "allow " + ", ".join(code.text for code in clause.codes)


def value_text(value: ast.Value) -> str:
    """A setting's value as the canonical layout writes it (also what `flowc diff` shows)."""
    match value:
        case ast.IntValue():
            return str(value.value)
        case ast.FloatValue() | ast.DurationValue() | ast.SizeValue():
            return value.text
        case ast.StringValue():
            return quote(value.value)
        case ast.NameValue():
            return value.name
        case ast.ListValue():
            return "[" + ", ".join(value_text(v) for v in value.items) + "]"
        case ast.BlockValue():
            if not value.entries:
                return "{}"
            inner = ", ".join(f"{e.key.text} {', '.join(value_text(v) for v in e.values)}" for e in value.entries)
            return f"{{ {inner} }}"
    raise TypeError(f"not a value: {value!r}")


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def quote(text: str) -> str:
    return '"' + "".join(_ESCAPES.get(c, c) for c in text) + '"'


def format_module(module: ast.Module, source: str) -> str:
    return Printer(module, source.replace("\r\n", "\n")).render()
