"""What the language server answers, computed from a document's analysis, free of protocol I/O.

Hover text (Markdown), definition targets (spans, possibly in imported modules), references,
completion candidates and document symbols. `flowc.lsp.server` wraps these in LSP messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flowc.check import schema
from flowc.check.model import BUILTIN_TYPES, InterfaceInfo, Program, RoleInfo
from flowc.lsp.index import Kind, Occurrence
from flowc.spans import Span
from flowc.syntax import ast, keywords

LB_DOCS = {
    "round_robin": "each activation goes to the next replica in turn",
    "session": "a session always reaches the same replica, which sees its calls in order",
    "broadcast": "every replica receives every activation",
    "load_aware": "the replica with the fewest activations in flight",
}


def _code(text: str) -> str:
    return f"```flow\n{text}\n```"


def interface_signature(interface: InterfaceInfo, program: Program) -> str:
    parts = []
    if interface.groups:
        groups = [" & ".join(ref.field.text for ref in group.inputs) for group in interface.groups]
        parts.append("in " + " | ".join(groups))
    if interface.join is not None:
        items = [f"{item.field.text}: {'all' if item.count is None else item.count}" for item in interface.join.items]
        parts.append("join { " + ", ".join(items) + " }")
    if interface.outputs:
        outs = ", ".join(f"{f.name.text}: {program.type_of(f.type)}" for f in interface.outputs)
        parts.append(("out stream " if interface.stream else "out ") + outs)
    return f"interface {interface.name} {{ " + "  ".join(parts) + " }"


def _field_type(program: Program, name: str) -> str:
    placeholder = program.placeholders.get(name)
    if placeholder is not None:
        return str(program.type_of(placeholder.type))
    producers = program.field(name).producers
    return str(program.type_of(producers[0].decl.type)) if producers else "?"


def _field_hover(program: Program, name: str) -> str:
    info = program.field(name)
    lines = [_code(f"field {name}: {_field_type(program, name)}")]
    placeholder = program.placeholders.get(name)
    if placeholder is not None and placeholder.stream:
        lines.append(
            "A streaming placeholder: its values are given as frames while a graph call runs; each frame "
            "activates its consumers, and the end of the input ends its stream."
        )
    elif placeholder is not None:
        lines.append("A placeholder: its value is given when a graph is called.")
    if info.producers:
        lines.append(
            "**Produced by** "
            + ", ".join(f"`{p.role}.{p.interface}`" + (" (stream)" if p.stream else "") for p in info.producers)
        )
    elif name not in program.placeholders:
        lines.append("**Produced by** nothing")
    readers = sorted({f"`{c.role}.{c.interface}`" for c in info.consumers})
    lines.append("**Consumed by** " + (", ".join(readers) if readers else "nothing"))
    graphs = [g.name for g in program.graphs.values() if any(e.text == name for e in g.entries)]
    if graphs:
        lines.append("**Entry of** " + ", ".join(f"`{g}`" for g in graphs))
    return "\n\n".join(lines)


def _role_hover(program: Program, role: RoleInfo) -> str:
    config = role.config
    resources = [f"replicas {config.get('replicas', 1)}", f"lb {config.get('lb', 'round_robin')}", f"gpus {role.gpus}"]
    if role.share_target:
        resources.append(f"shares gpus with `{role.share_target}`")
    if config.get("uses"):
        resources.append("uses " + ", ".join(f"`{g}`" for g in config["uses"]))
    lines = [_code(f"role {role.name}"), "**Resources** " + ", ".join(resources)]
    if "impl" in config:
        lines.append(f"**Implemented by** `{config['impl']}`")
    if role.interfaces:
        lines.append(_code("\n".join(interface_signature(i, program) for i in role.interfaces.values())))
    return "\n\n".join(lines)


def _type_hover(program: Program, name: str) -> str:
    if name in BUILTIN_TYPES:
        return _code(f"type {name}") + "\n\nA builtin type."
    alias = program.aliases.get(name)
    if alias is None:
        return _code(f"type {name}") + "\n\nNot declared."
    return _code(f"type {name} = {ast.type_text(alias.type)}") + f"\n\nResolves to `{program.type_of(alias.type)}`."


def _key_hover(occurrence: Occurrence) -> str | None:
    key = _schema_for(occurrence.context).by_name.get(occurrence.name)
    if key is None:
        return None
    text = f"`{key.name}`: {key.doc}.\n\nTakes {key.kind.value}" + (f", {key.range_text}." if key.range_text else ".")
    if key.choices:
        text += " One of " + ", ".join(f"`{c}`" for c in key.choices) + "."
    return text


def _schema_for(context: str) -> schema.Schema:
    contexts = {"role": schema.ROLE, "interface": schema.INTERFACE, "graph": schema.GRAPH, "batch": schema.BATCH}
    return contexts.get(context) or schema.GLOBAL_KINDS.get(context) or schema.Schema(context, ())


def hover(program: Program, occurrence: Occurrence) -> str | None:
    name = occurrence.name
    match occurrence.kind:
        case Kind.FIELD:
            return _field_hover(program, name)
        case Kind.ROLE:
            role = program.roles.get(name)
            return _role_hover(program, role) if role else None
        case Kind.INTERFACE:
            role = program.roles.get(occurrence.role or "")
            interface = role.interfaces.get(name) if role else None
            return _code(f"role {role.name}\n{interface_signature(interface, program)}") if interface else None
        case Kind.TYPE:
            return _type_hover(program, name)
        case Kind.GLOBAL:
            decl = program.globals.get(name)
            return (
                _code(f"global {name}: {decl.kind.text}") + "\n\nSession-scoped state kept by the data plane." if decl else None
            )
        case Kind.GLOBAL_KIND:
            known = schema.GLOBAL_KINDS.get(name)
            return f"A `{name}` global." + (" Keys: " + ", ".join(f"`{k.name}`" for k in known.keys) + "." if known else "")
        case Kind.GRAPH:
            graph = program.graphs.get(name)
            if graph is None:
                return None
            parts = ["entry " + ", ".join(e.text for e in graph.entries)]
            parts += [f"stream {s.field.name.text}" + (" ordered" if s.ordered else "") for s in graph.streams]
            if graph.returns:
                parts.append("return " + ", ".join(r.name.text for r in graph.returns))
            if graph.interruptible:
                parts.append("interruptible")
            text = _code(f"graph {name} {{ " + "  ".join(parts) + " }")
            streaming = [e.text for e in graph.entries if (p := program.placeholders.get(e.text)) is not None and p.stream]
            if streaming:
                text += (
                    "\n\n**Streaming entry** " + ", ".join(f"`{e}`" for e in streaming) + ": frames given while the call runs."
                )
            if graph.interruptible:
                text += (
                    "\n\n**Interruptible**: a later call of the same session made with `interrupt` cancels its running "
                    "call; what the caller took of it stays."
                )
            return text
        case Kind.KEY:
            return _key_hover(occurrence)
        case Kind.POLICY:
            return f"lb `{name}`: {LB_DOCS[name]}." if name in LB_DOCS else None
        case Kind.IMPORT:
            return _code(f"import {name}")
    return None


def definition(program: Program, occurrence: Occurrence) -> list[Span]:
    """Where the name under the cursor is declared (a field may have several producers)."""
    name = occurrence.name
    match occurrence.kind:
        case Kind.FIELD:
            spans = [p.decl.name.span for p in program.field(name).producers]
            if name in program.placeholders:
                spans.insert(0, program.placeholders[name].name.span)
            return spans
        case Kind.ROLE if name in program.roles:
            return [program.roles[name].decl.name.span]
        case Kind.INTERFACE:
            role = program.roles.get(occurrence.role or "")
            if role and name in role.interfaces:
                return [role.interfaces[name].decl.name.span]
        case Kind.TYPE if name in program.aliases:
            return [program.aliases[name].name.span]
        case Kind.GLOBAL if name in program.globals:
            return [program.globals[name].name.span]
        case Kind.GRAPH if name in program.graphs:
            return [program.graphs[name].decl.name.span]
    return []


def imported_file(program: Program, occurrence: Occurrence) -> str | None:
    """The display path of the module an import occurrence names."""
    for decl, display in program.root.imports:
        if decl.dotted == occurrence.name:
            return display
    return None


def references(found: list[Occurrence], occurrence: Occurrence) -> list[Occurrence]:
    same = (occurrence.kind, occurrence.name, occurrence.role)
    return [o for o in found if (o.kind, o.name, o.role) == same]


# ── completion ──


@dataclass(frozen=True)
class Candidate:
    label: str
    kind: str  # "keyword", "role", "interface", "field", "type", "global", "policy", "setting"
    detail: str = ""


_AFTER_LB = re.compile(r"\blb\s+\w*$")
_AFTER_FROM = re.compile(r"\bfrom\s+\w*$")
_AFTER_FROM_ROLE = re.compile(r"\bfrom\s+(\w+)\.\w*$")
_AFTER_WITH = re.compile(r"\bwith\s+\w*$")
_AFTER_USES = re.compile(r"\buses\s+(\w+\s*,\s*)*\w*$")
_AFTER_COLON = re.compile(r":\s*\[*\w*$")
_FIELD_CONTEXT = re.compile(r"(\b(in|entry|stream|return|ordered)\b|[&|,{])[^:]*$")
_LINE_START = re.compile(r"^\s*\w*$")
_AFTER_PLACEHOLDER = re.compile(r"^\s*placeholder\s+(stream\s+)?\w*$")


def completions(program: Program | None, before_cursor: str) -> list[Candidate]:
    """Candidates for the word being typed; `before_cursor` is its line up to the cursor."""
    roles = sorted(program.roles) if program else []
    if _AFTER_LB.search(before_cursor):
        return [Candidate(p, "policy", LB_DOCS[p]) for p in schema.LB_POLICIES]
    if match := _AFTER_FROM_ROLE.search(before_cursor):
        role = program.roles.get(match.group(1)) if program else None
        return [Candidate(i.name, "interface", interface_signature(i, program)) for i in role.interfaces.values()] if role else []
    if _AFTER_FROM.search(before_cursor) or _AFTER_WITH.search(before_cursor):
        return [Candidate(r, "role") for r in roles]
    if _AFTER_USES.search(before_cursor):
        return [Candidate(g, "global", program.globals[g].kind.text) for g in sorted(program.globals)] if program else []
    if _AFTER_COLON.search(before_cursor) and "join" not in before_cursor:
        aliases = sorted(program.aliases) if program else []
        return [Candidate(t, "type", "builtin") for t in BUILTIN_TYPES] + [Candidate(a, "type", "alias") for a in aliases]
    if match := _AFTER_PLACEHOLDER.search(before_cursor):  # a new name, or `stream` before it
        return [] if match.group(1) else [Candidate("stream", "keyword", "its values come as frames while the call runs")]
    fields = (
        [Candidate(f, "field", _field_type(program, f)) for f in sorted(set(program.fields) | set(program.placeholders))]
        if program
        else []
    )
    if _FIELD_CONTEXT.search(before_cursor) and not _LINE_START.match(before_cursor):
        return fields
    settings = {k.name: k.doc for s in (schema.ROLE, schema.INTERFACE, schema.GRAPH) for k in s.keys}
    return (
        [Candidate(k, "keyword") for k in keywords()]
        + [Candidate(k, "setting", doc) for k, doc in sorted(settings.items())]
        + [Candidate(r, "role") for r in roles]
        + fields
    )


# ── document symbols ──


@dataclass(frozen=True)
class Symbol:
    name: str
    kind: str  # "role", "interface", "graph", "field", "type", "global", "module"
    span: Span
    selection: Span
    detail: str = ""
    children: tuple[Symbol, ...] = ()


def symbols(module: ast.Module) -> list[Symbol]:
    found: list[Symbol] = []
    for decl in module.decls:
        match decl:
            case ast.Import():
                found.append(Symbol(decl.dotted, "module", decl.span, decl.span, "import"))
            case ast.TypeAlias():
                found.append(Symbol(decl.name.text, "type", decl.span, decl.name.span, ast.type_text(decl.type)))
            case ast.Placeholder():
                detail = ("placeholder stream " if decl.stream else "placeholder ") + ast.type_text(decl.type)
                found.append(Symbol(decl.name.text, "field", decl.span, decl.name.span, detail))
            case ast.Global():
                found.append(Symbol(decl.name.text, "global", decl.span, decl.name.span, decl.kind.text))
            case ast.Role():
                interfaces = tuple(
                    Symbol(i.name.text, "interface", i.span, i.name.span) for i in decl.items if isinstance(i, ast.Interface)
                )
                found.append(Symbol(decl.name.text, "role", decl.span, decl.name.span, "role", interfaces))
            case ast.Graph():
                found.append(Symbol(decl.name.text, "graph", decl.span, decl.name.span, "graph"))
    return found
