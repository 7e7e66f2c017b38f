"""The abstract syntax tree of a .flow module: frozen dataclasses, each with its source span.

Spans are excluded from equality, so `parse(fmt(x)) == parse(x)` compares meaning, not layout.
The tree mirrors the text closely (settings stay `key value` pairs, clauses keep their order)
so the formatter can print it back; meaning is given to it by `flowc.check`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from flowc.spans import Span


@dataclass(frozen=True, kw_only=True, slots=True)
class Node:
    span: Span = field(compare=False, repr=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class Ident(Node):
    text: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Comment(Node):
    text: str
    trailing: bool  # true when code precedes it on its line


# ── types ──


@dataclass(frozen=True, kw_only=True, slots=True)
class NamedType(Node):
    name: Ident


@dataclass(frozen=True, kw_only=True, slots=True)
class ListType(Node):
    item: TypeExpr


TypeExpr = Union[NamedType, ListType]


# ── values ──


@dataclass(frozen=True, kw_only=True, slots=True)
class IntValue(Node):
    value: int


@dataclass(frozen=True, kw_only=True, slots=True)
class FloatValue(Node):
    value: float
    text: str


@dataclass(frozen=True, kw_only=True, slots=True)
class DurationValue(Node):
    text: str
    seconds: float


@dataclass(frozen=True, kw_only=True, slots=True)
class SizeValue(Node):
    text: str
    bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class StringValue(Node):
    value: str


@dataclass(frozen=True, kw_only=True, slots=True)
class NameValue(Node):
    name: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ListValue(Node):
    items: tuple[Value, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockValue(Node):
    entries: tuple[Setting, ...]


Value = Union[IntValue, FloatValue, DurationValue, SizeValue, StringValue, NameValue, ListValue, BlockValue]


@dataclass(frozen=True, kw_only=True, slots=True)
class Setting(Node):
    """`key value[, value...]` in a role, interface or graph body, or `key value` in a block."""

    key: Ident
    values: tuple[Value, ...]


# ── interfaces ──


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceRef(Node):
    """`from role.interface`: restricts an input to one producer."""

    role: Ident
    interface: Ident


@dataclass(frozen=True, kw_only=True, slots=True)
class InputRef(Node):
    field: Ident
    type: TypeExpr | None = None
    source: SourceRef | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class AndGroup(Node):
    inputs: tuple[InputRef, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class InClause(Node):
    groups: tuple[AndGroup, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class OutField(Node):
    name: Ident
    type: TypeExpr


@dataclass(frozen=True, kw_only=True, slots=True)
class OutClause(Node):
    stream: bool
    fields: tuple[OutField, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class JoinItem(Node):
    field: Ident
    source: SourceRef | None
    count: int | None  # None means `all`


@dataclass(frozen=True, kw_only=True, slots=True)
class JoinClause(Node):
    items: tuple[JoinItem, ...]


InterfaceItem = Union[InClause, OutClause, JoinClause, Setting]


@dataclass(frozen=True, kw_only=True, slots=True)
class Interface(Node):
    name: Ident
    items: tuple[InterfaceItem, ...]


# ── roles ──


@dataclass(frozen=True, kw_only=True, slots=True)
class ShareGpus(Node):
    """`share gpus with ROLE`; `resource` holds the middle word so a typo can be reported."""

    resource: Ident
    target: Ident


@dataclass(frozen=True, kw_only=True, slots=True)
class AllowClause(Node):
    """`allow W210, ...` in a role or graph: warnings not reported inside it."""

    codes: tuple[Ident, ...]


RoleItem = Union[Interface, ShareGpus, AllowClause, Setting]


@dataclass(frozen=True, kw_only=True, slots=True)
class Role(Node):
    name: Ident
    items: tuple[RoleItem, ...]


# ── graphs ──


@dataclass(frozen=True, kw_only=True, slots=True)
class GraphField(Node):
    name: Ident
    type: TypeExpr | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class EntryClause(Node):
    names: tuple[Ident, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamClause(Node):
    field: GraphField
    ordered: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class ReturnClause(Node):
    fields: tuple[GraphField, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class InterruptibleClause(Node):
    """`interruptible`: a call of the session that asks to interrupt cancels this graph's running call."""


GraphItem = Union[EntryClause, StreamClause, ReturnClause, InterruptibleClause, AllowClause, Setting]


@dataclass(frozen=True, kw_only=True, slots=True)
class Graph(Node):
    name: Ident
    items: tuple[GraphItem, ...]


# ── top level ──


@dataclass(frozen=True, kw_only=True, slots=True)
class Header(Node):
    name: Ident


@dataclass(frozen=True, kw_only=True, slots=True)
class Import(Node):
    path: tuple[Ident, ...]

    @property
    def dotted(self) -> str:
        return ".".join(part.text for part in self.path)


@dataclass(frozen=True, kw_only=True, slots=True)
class TypeAlias(Node):
    name: Ident
    type: TypeExpr


@dataclass(frozen=True, kw_only=True, slots=True)
class Placeholder(Node):
    """`placeholder [stream] NAME: TYPE`: a value given at the call; with `stream`, frames of it
    arrive while the call runs, ended by the end of the input."""

    name: Ident
    type: TypeExpr
    stream: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Global(Node):
    name: Ident
    kind: Ident
    entries: tuple[Setting, ...]


Decl = Union[Import, TypeAlias, Placeholder, Global, Role, Graph]


@dataclass(frozen=True, kw_only=True, slots=True)
class Module(Node):
    header: Header | None
    decls: tuple[Decl, ...]
    comments: tuple[Comment, ...] = field(default=(), compare=False)


def type_text(type_expr: TypeExpr) -> str:
    """The source form of a type expression (`Tensor`, `[Text]`)."""
    depth = 0
    while isinstance(type_expr, ListType):
        type_expr, depth = type_expr.item, depth + 1
    return "[" * depth + type_expr.name.text + "]" * depth
