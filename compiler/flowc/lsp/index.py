"""Where each name of a module is written: the symbol occurrences the language server looks up.

One walk over a module's AST records every identifier the user can point at (a role, an
interface, a field, a type, a global, a graph, a setting key, an lb policy, an import) with its
span and whether it declares or uses the name. Hover, definition, references and completion
read this list together with the checked `Program`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from flowc.spans import Span
from flowc.syntax import ast


class Kind(StrEnum):
    ROLE = "role"
    INTERFACE = "interface"
    FIELD = "field"
    TYPE = "type"
    GLOBAL = "global"
    GLOBAL_KIND = "global kind"
    GRAPH = "graph"
    KEY = "setting"
    POLICY = "policy"
    IMPORT = "import"


@dataclass(frozen=True)
class Occurrence:
    kind: Kind
    name: str
    span: Span
    declares: bool = False
    role: str | None = None  # the role of an interface occurrence
    context: str = ""  # for settings: "role", "interface", "graph", "batch" or a global kind


class _Walker:
    def __init__(self) -> None:
        self.found: list[Occurrence] = []

    def add(self, kind: Kind, ident: ast.Ident, declares: bool = False, **extra: str | None) -> None:
        self.found.append(Occurrence(kind, ident.text, ident.span, declares, **extra))

    def module(self, module: ast.Module) -> list[Occurrence]:
        for decl in module.decls:
            match decl:
                case ast.Import():
                    span = decl.path[0].span.to(decl.path[-1].span)
                    self.found.append(Occurrence(Kind.IMPORT, decl.dotted, span))
                case ast.TypeAlias():
                    self.add(Kind.TYPE, decl.name, declares=True)
                    self.type_expr(decl.type)
                case ast.Placeholder():
                    self.add(Kind.FIELD, decl.name, declares=True)
                    self.type_expr(decl.type)
                case ast.Global():
                    self.add(Kind.GLOBAL, decl.name, declares=True)
                    self.add(Kind.GLOBAL_KIND, decl.kind)
                    self.settings(decl.entries, decl.kind.text)
                case ast.Role():
                    self.role(decl)
                case ast.Graph():
                    self.graph(decl)
        return sorted(self.found, key=lambda o: o.span.start)

    def type_expr(self, type_expr: ast.TypeExpr | None) -> None:
        while isinstance(type_expr, ast.ListType):
            type_expr = type_expr.item
        if type_expr is not None:
            self.add(Kind.TYPE, type_expr.name)

    def settings(self, settings: tuple[ast.Setting, ...] | list[ast.Setting], context: str) -> None:
        for setting in settings:
            self.add(Kind.KEY, setting.key, context=context)
            key = setting.key.text
            for value in setting.values:
                if isinstance(value, ast.NameValue) and key in ("uses", "lb"):
                    kind = Kind.GLOBAL if key == "uses" else Kind.POLICY
                    self.found.append(Occurrence(kind, value.name, value.span))
                elif isinstance(value, ast.BlockValue):
                    self.settings(value.entries, key)

    def source(self, source: ast.SourceRef | None) -> None:
        if source is not None:
            self.add(Kind.ROLE, source.role)
            self.add(Kind.INTERFACE, source.interface, role=source.role.text)

    def role(self, role: ast.Role) -> None:
        self.add(Kind.ROLE, role.name, declares=True)
        for item in role.items:
            match item:
                case ast.Setting():
                    self.settings([item], "role")
                case ast.ShareGpus():
                    self.add(Kind.ROLE, item.target)
                case ast.Interface():
                    self.interface(role.name.text, item)

    def interface(self, role: str, interface: ast.Interface) -> None:
        self.add(Kind.INTERFACE, interface.name, declares=True, role=role)
        for item in interface.items:
            match item:
                case ast.InClause():
                    for group in item.groups:
                        for ref in group.inputs:
                            self.add(Kind.FIELD, ref.field)
                            self.type_expr(ref.type)
                            self.source(ref.source)
                case ast.OutClause():
                    for out in item.fields:
                        self.add(Kind.FIELD, out.name, declares=True)
                        self.type_expr(out.type)
                case ast.JoinClause():
                    for join in item.items:
                        self.add(Kind.FIELD, join.field)
                        self.source(join.source)
                case ast.Setting():
                    self.settings([item], "interface")

    def graph(self, graph: ast.Graph) -> None:
        self.add(Kind.GRAPH, graph.name, declares=True)
        for item in graph.items:
            match item:
                case ast.EntryClause():
                    for name in item.names:
                        self.add(Kind.FIELD, name)
                case ast.StreamClause():
                    self.add(Kind.FIELD, item.field.name)
                    self.type_expr(item.field.type)
                case ast.ReturnClause():
                    for field in item.fields:
                        self.add(Kind.FIELD, field.name)
                        self.type_expr(field.type)
                case ast.Setting():
                    self.settings([item], "graph")


def occurrences(module: ast.Module) -> list[Occurrence]:
    """Every pointable name of `module`, in source order."""
    return _Walker().module(module)


def at(found: list[Occurrence], offset: int) -> Occurrence | None:
    """The occurrence under `offset`; a cursor just after a name still points at it."""
    for occurrence in found:
        if occurrence.span.start <= offset <= occurrence.span.end:
            return occurrence
    return None
