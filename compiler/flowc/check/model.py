"""The checked program: every module of a compilation, its symbol tables and field index.

The model is tolerant: duplicates and dangling references are kept (the first declaration of a
name wins the table) so that each check can report what it owns. Later passes (IR, plan, LSP
hover) read the same model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flowc.syntax import ast

BUILTIN_TYPES = ("Json", "Text", "Tokens", "Tensor", "Image", "Audio", "Bytes", "Any")


@dataclass(frozen=True)
class FlowType:
    """A resolved type: a builtin name under `depth` list brackets; `None` name = unknown."""

    name: str | None
    depth: int = 0

    def __str__(self) -> str:
        return "[" * self.depth + (self.name or "?") + "]" * self.depth

    def compatible(self, other: FlowType) -> bool:
        if self.name is None or other.name is None:
            return True  # an unknown type was reported already
        if self.name == "Any" or other.name == "Any":
            return self.depth <= other.depth if self.name == "Any" else other.depth <= self.depth
        return self == other


@dataclass
class ModuleInfo:
    name: str
    path: str  # display path
    text: str
    ast: ast.Module
    is_root: bool
    imports: list[tuple[ast.Import, str]] = field(default_factory=list)  # (import, display path)


@dataclass
class Producer:
    role: str
    interface: str
    decl: ast.OutField
    stream: bool


@dataclass
class Consumer:
    role: str
    interface: str
    field_ref: ast.Ident
    source: ast.SourceRef | None
    decl: ast.InputRef | ast.JoinItem


@dataclass
class FieldInfo:
    name: str
    producers: list[Producer] = field(default_factory=list)
    consumers: list[Consumer] = field(default_factory=list)


@dataclass
class InterfaceInfo:
    role: str
    name: str
    decl: ast.Interface
    in_clauses: list[ast.InClause]
    out_clauses: list[ast.OutClause]
    join_clauses: list[ast.JoinClause]
    settings: list[ast.Setting]
    config: dict = field(default_factory=dict)

    @property
    def qualname(self) -> str:
        return f"{self.role}.{self.name}"

    @property
    def groups(self) -> tuple[ast.AndGroup, ...]:
        return self.in_clauses[0].groups if self.in_clauses else ()

    @property
    def join(self) -> ast.JoinClause | None:
        return self.join_clauses[0] if self.join_clauses and not self.in_clauses else None

    @property
    def stream(self) -> bool:
        return any(c.stream for c in self.out_clauses)

    @property
    def outputs(self) -> list[ast.OutField]:
        return [f for c in self.out_clauses for f in c.fields]


@dataclass
class RoleInfo:
    name: str
    module: str
    decl: ast.Role
    interfaces: dict[str, InterfaceInfo]
    settings: list[ast.Setting]
    shares: list[ast.ShareGpus]
    config: dict = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return int(self.config.get("gpus", 0))

    @property
    def share_target(self) -> str | None:
        return self.shares[0].target.text if self.shares else None


@dataclass
class GraphInfo:
    name: str
    decl: ast.Graph
    entries: list[ast.Ident]
    entry_clauses: list[ast.EntryClause]
    streams: list[ast.StreamClause]
    returns: list[ast.GraphField]
    settings: list[ast.Setting]
    config: dict = field(default_factory=dict)
    interruptible: list[ast.InterruptibleClause] = field(default_factory=list)  # `interruptible` clauses (one expected)


@dataclass
class Program:
    modules: list[ModuleInfo]
    roles: dict[str, RoleInfo] = field(default_factory=dict)
    placeholders: dict[str, ast.Placeholder] = field(default_factory=dict)
    globals: dict[str, ast.Global] = field(default_factory=dict)
    aliases: dict[str, ast.TypeAlias] = field(default_factory=dict)
    graphs: dict[str, GraphInfo] = field(default_factory=dict)
    fields: dict[str, FieldInfo] = field(default_factory=dict)
    # every declaration in order, duplicates included, as (kind, name ident, node)
    declarations: list[tuple[str, ast.Ident, ast.Node]] = field(default_factory=list)
    resolved_types: dict[int, FlowType] = field(default_factory=dict, repr=False)
    derived: dict[str, object] = field(default_factory=dict, repr=False)  # caches of later passes (graph IRs)

    @property
    def root(self) -> ModuleInfo:
        return next(m for m in self.modules if m.is_root)

    @property
    def is_library(self) -> bool:
        """A root module without graphs is a library: importers produce and consume its fields."""
        return not any(isinstance(d, ast.Graph) for d in self.root.ast.decls)

    @property
    def sources(self) -> dict[str, str]:
        return {m.path: m.text for m in self.modules}

    def interfaces(self) -> list[InterfaceInfo]:
        return [i for r in self.roles.values() for i in r.interfaces.values()]

    def field(self, name: str) -> FieldInfo:
        return self.fields.get(name) or FieldInfo(name)

    def type_of(self, type_expr: ast.TypeExpr) -> FlowType:
        """The resolved type of a type expression (aliases expanded; unknown names give `?`)."""
        key = id(type_expr)
        if key not in self.resolved_types:
            self.resolved_types[key] = self._resolve_type(type_expr)
        return self.resolved_types[key]

    def _resolve_type(self, type_expr: ast.TypeExpr) -> FlowType:
        depth = 0
        seen: set[str] = set()
        while True:
            while isinstance(type_expr, ast.ListType):
                type_expr, depth = type_expr.item, depth + 1
            name = type_expr.name.text
            if name in BUILTIN_TYPES:
                return FlowType(name, depth)
            alias = self.aliases.get(name)
            if alias is None or name in seen:
                return FlowType(None, depth)
            seen.add(name)
            type_expr = alias.type
