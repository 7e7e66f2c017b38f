"""What callers and operators see of a checked program: the *surface* `flowc diff` compares.

Read from the compiler's own model (`flowc.check`) and static plan, so imports are followed,
aliases resolved and defaults filled in (a role without `replicas` has 1), and layout,
comments and declaration order do not count:

- per graph: its entry placeholders, their types and whether they stream, its streamed and returned fields (their
  kind, `ordered`, type) and its timeout: what a caller sends and gets back;
- per role: impl, replicas, lb, gpus, nodes, `share gpus with`, uses, batch; per interface:
  its inputs, outputs, whether it streams, its timeout and batch (a role's own timeout and
  batch count where the interface has none): what an operator deploys and an error names;
- per global: its kind and settings.

Every fact keeps the span it was declared at, so a change can be shown at its place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flowc.check.model import GraphInfo, Program, RoleInfo
from flowc.codegen import entry_types
from flowc.fmt.printer import value_text
from flowc.plan import build_plan
from flowc.plan.model import RolePlan
from flowc.spans import Span
from flowc.syntax import ast

ROLE_SETTINGS = ("impl", "replicas", "lb", "gpus", "nodes", "share_gpus_with", "uses", "batch")


@dataclass(frozen=True)
class Fact:
    value: object
    place: Span


@dataclass(frozen=True)
class Output:
    kind: str  # "stream" | "return"
    ordered: bool
    type: Fact
    place: Span


@dataclass
class GraphSurface:
    place: Span
    entry: dict[str, Fact]  # placeholder -> its place in `entry`; value: the declared type, aliases resolved
    entry_types: dict[str, Fact]  # placeholder -> type, placed at the placeholder's declaration
    entry_stream: dict[str, Fact]  # placeholder -> whether it streams (`placeholder stream`), placed there too
    outputs: dict[str, Output]
    timeout: Fact
    interruptible: Fact  # whether it says `interruptible`, placed at the clause (else at its name)


@dataclass
class InterfaceSurface:
    place: Span
    facts: dict[str, Fact]  # inputs, outputs, stream, timeout, batch


@dataclass
class RoleSurface:
    place: Span
    facts: dict[str, Fact]  # ROLE_SETTINGS
    interfaces: dict[str, InterfaceSurface]


@dataclass
class GlobalSurface:
    place: Span
    kind: Fact
    settings: Fact


@dataclass
class Surface:
    flow: Fact
    graphs: dict[str, GraphSurface] = field(default_factory=dict)
    roles: dict[str, RoleSurface] = field(default_factory=dict)
    globals: dict[str, GlobalSurface] = field(default_factory=dict)


def surface(program: Program) -> Surface:
    """The surface of a program that checked without errors."""
    plan = build_plan(program)
    root = program.root
    header = root.ast.header
    result = Surface(Fact(plan.flow, header.name.span if header else root.ast.span))
    for name, graph in program.graphs.items():
        result.graphs[name] = _graph(program, graph, plan.graphs[name].outputs)
    for name, role in program.roles.items():
        result.roles[name] = _role(program, role, plan.roles[name])
    for name, decl in program.globals.items():
        settings = {e.key.text: _value_text(e.values) for e in decl.entries}
        result.globals[name] = GlobalSurface(decl.name.span, Fact(decl.kind.text, decl.kind.span), Fact(settings, decl.name.span))
    return result


def _graph(program: Program, graph: GraphInfo, outputs) -> GraphSurface:
    types = entry_types(program, [e.text for e in graph.entries])
    entry = {e.text: Fact(types[e.text], e.span) for e in graph.entries}
    declared = {e.text: Fact(types[e.text], program.placeholders[e.text].span) for e in graph.entries}
    streaming = {e.text: Fact(program.placeholders[e.text].stream, program.placeholders[e.text].span) for e in graph.entries}
    fields = {c.field.name.text: c.field for c in graph.streams} | {f.name.text: f for f in graph.returns}
    result = {}
    for output in outputs:
        decl = fields[output.field]
        result[output.field] = Output(output.kind, output.ordered, _output_type(program, decl), decl.span)
    timeout = _setting(graph.settings, "timeout", graph.decl.name.span)
    interruptible = Fact(bool(graph.interruptible), graph.interruptible[0].span if graph.interruptible else graph.decl.name.span)
    return GraphSurface(
        graph.decl.name.span, entry, declared, streaming, result, Fact(graph.config.get("timeout"), timeout), interruptible
    )


def _output_type(program: Program, decl: ast.GraphField) -> Fact:
    """A graph output's type: its own annotation, else what its producers declare."""
    if decl.type is not None:
        return Fact(str(program.type_of(decl.type)), decl.type.span)
    producers = program.field(decl.name.text).producers
    types = sorted({str(program.type_of(p.decl.type)) for p in producers})
    place = producers[0].decl.span if producers else decl.span
    return Fact(" | ".join(types) or "?", place)


def _role(program: Program, role: RoleInfo, plan: RolePlan) -> RoleSurface:
    values = {
        "impl": plan.impl,
        "replicas": plan.replicas,
        "lb": plan.lb,
        "gpus": plan.gpus,
        "nodes": plan.nodes,
        "share_gpus_with": plan.share_gpus_with,
        "uses": sorted(plan.uses),
        "batch": plan.batch,
    }
    places = {key: _setting(role.settings, key, role.decl.name.span) for key in values}
    if role.shares:
        places["share_gpus_with"] = role.shares[0].span
    facts = {key: Fact(values[key], places[key]) for key in ROLE_SETTINGS}
    interfaces = {}
    for name, info in role.interfaces.items():
        config = plan.interfaces[name]
        clauses = [*info.in_clauses, *info.join_clauses]
        inputs_place = clauses[0].span if clauses else info.decl.name.span
        outputs_place = info.out_clauses[0].span if info.out_clauses else info.decl.name.span
        own_or_role = {
            key: _setting(info.settings, key, _setting(role.settings, key, info.decl.name.span)) for key in ("timeout", "batch")
        }
        interfaces[name] = InterfaceSurface(
            info.decl.name.span,
            {
                "inputs": Fact(_inputs_text(info), inputs_place),
                "outputs": Fact({o.name.text: str(program.type_of(o.type)) for o in info.outputs}, outputs_place),
                "stream": Fact(info.stream, outputs_place),
                "timeout": Fact(config.timeout_s, own_or_role["timeout"]),
                "batch": Fact(config.batch, own_or_role["batch"]),
            },
        )
    return RoleSurface(role.decl.name.span, facts, interfaces)


def _setting(settings: list[ast.Setting], key: str, default: Span) -> Span:
    return next((s.span for s in settings if s.key.text == key), default)


def _inputs_text(info) -> str:
    """An interface's inputs as the language writes them (`a | b & c`, `join { x: 1, y: all }`)."""

    def source(ref: ast.SourceRef | None) -> str:
        return f" from {ref.role.text}.{ref.interface.text}" if ref is not None else ""

    if info.join is not None:
        items = ", ".join(f"{i.field.text}{source(i.source)}: {'all' if i.count is None else i.count}" for i in info.join.items)
        return f"join {{ {items} }}"
    return " | ".join(" & ".join(f"{i.field.text}{source(i.source)}" for i in group.inputs) for group in info.groups)


def _value_text(values: tuple[ast.Value, ...]) -> str:
    return ", ".join(value_text(v) for v in values)
