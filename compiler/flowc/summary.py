"""A plain summary of a checked program: graphs, roles, interfaces, and who produces and
consumes each field. `flowc plan` prints it; it is plain data (dicts, lists, strings, numbers)
with every collection sorted, so its JSON form is deterministic."""

from __future__ import annotations

from flowc.check.model import InterfaceInfo, Program
from flowc.syntax import ast


def summarize(program: Program) -> dict:
    return {
        "flow": program.root.name,
        "graphs": {name: _graph(g) for name, g in sorted(program.graphs.items())},
        "roles": {name: _role(program, name) for name in sorted(program.roles)},
        "fields": {
            name: {
                "type": _field_type(program, name),
                "producers": sorted(f"{p.role}.{p.interface}" for p in info.producers),
                "consumers": sorted({f"{c.role}.{c.interface}" for c in info.consumers}),
            }
            for name, info in sorted(program.fields.items())
        },
    }


def _field_type(program: Program, name: str) -> str:
    placeholder = program.placeholders.get(name)
    if placeholder is not None:
        return str(program.type_of(placeholder.type))
    producers = program.field(name).producers
    return str(program.type_of(producers[0].decl.type)) if producers else "?"


def _graph(graph) -> dict:
    return {
        "entry": [e.text for e in graph.entries],
        "stream": [{"field": s.field.name.text, "ordered": s.ordered} for s in graph.streams],
        "return": [r.name.text for r in graph.returns],
    }


def _role(program: Program, name: str) -> dict:
    role = program.roles[name]
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(role.config.items())}
    if role.share_target:
        config["share_gpus_with"] = role.share_target
    return {
        "config": config,
        "interfaces": {i: _interface(iface) for i, iface in sorted(role.interfaces.items())},
    }


def _input(ref: ast.InputRef) -> str:
    return ref.field.text + (f" from {ref.source.role.text}.{ref.source.interface.text}" if ref.source else "")


def _interface(interface: InterfaceInfo) -> dict:
    join = interface.join
    return {
        "in": [[_input(r) for r in g.inputs] for g in interface.groups],
        "join": {i.field.text: ("all" if i.count is None else i.count) for i in join.items} if join else None,
        "out": [o.name.text for o in interface.outputs],
        "stream": interface.stream,
    }


def summary_text(summary: dict) -> str:
    lines = [f"flow {summary['flow']}", ""]
    for name, graph in summary["graphs"].items():
        streams = ", ".join(s["field"] + (" (ordered)" if s["ordered"] else "") for s in graph["stream"]) or "-"
        lines.append(f"graph {name}: entry {', '.join(graph['entry'])}; stream {streams}; return {', '.join(graph['return']) or '-'}")
    lines.append("")
    for name, role in summary["roles"].items():
        config = " ".join(f"{k}={_show(v)}" for k, v in role["config"].items() if k != "impl")
        lines.append(f"role {name}  {config}".rstrip())
        for iface_name, iface in role["interfaces"].items():
            if iface["join"] is not None:
                inputs = "join " + ", ".join(f"{f}: {n}" for f, n in iface["join"].items())
            else:
                inputs = " | ".join(" & ".join(g) for g in iface["in"])
            stream = "stream " if iface["stream"] else ""
            lines.append(f"  {iface_name}: {inputs} -> {stream}{', '.join(iface['out']) or '-'}")
    lines.append("")
    lines.append("fields:")
    for name, field in summary["fields"].items():
        producers = ", ".join(field["producers"]) or "(placeholder)"
        consumers = ", ".join(field["consumers"]) or "-"
        lines.append(f"  {name}: {field['type']}  {producers} -> {consumers}")
    return "\n".join(lines)


def _show(value: object) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} {v}" for k, v in value.items()) + "}"
    return str(value)
