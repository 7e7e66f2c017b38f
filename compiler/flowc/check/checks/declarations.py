"""Checks on declarations: duplicates, types and aliases, globals, settings, `impl`."""

from __future__ import annotations

from collections.abc import Iterator

from flowc.check import schema
from flowc.check.checks.common import repeated, repeats, text
from flowc.check.impl_names import impl_problem
from flowc.check.model import BUILTIN_TYPES, Program
from flowc.check.registry import Check, register
from flowc.diagnostics import Diagnostic
from flowc.syntax import ast


@register
class DuplicateDeclarations(Check):
    codes = {"E110": "name declared twice", "E111": "interface declared twice in a role"}

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for (kind, name, _), (_, first, _) in repeats(program.declarations, lambda d: (_namespace(d[0]), d[1].text)):
            yield repeated(
                "E110",
                f"{kind} `{name.text}` is declared twice",
                name,
                first,
                "rename or remove one of them",
                "first declared here",
            )
        for role in program.roles.values():
            names = [i.name for i in role.decl.items if isinstance(i, ast.Interface)]
            for name, first in repeats(names, text):
                message = f"role `{role.name}` declares interface `{name.text}` twice"
                yield repeated("E111", message, name, first, "rename or merge the two interfaces", "first declared here")


def _namespace(kind: str) -> str:
    # placeholders and globals are values; roles, graphs and types each have their own table
    return "value" if kind in ("placeholder", "global") else kind


def all_type_exprs(program: Program) -> Iterator[ast.TypeExpr]:
    for _kind, _name, node in program.declarations:
        match node:
            case ast.Placeholder(type=t) | ast.TypeAlias(type=t):
                yield t
            case ast.Role():
                for item in node.items:
                    if isinstance(item, ast.Interface):
                        yield from _interface_types(item)
            case ast.Graph():
                for item in node.items:
                    if isinstance(item, ast.StreamClause) and item.field.type is not None:
                        yield item.field.type
                    if isinstance(item, ast.ReturnClause):
                        yield from (f.type for f in item.fields if f.type is not None)


def _interface_types(interface: ast.Interface) -> Iterator[ast.TypeExpr]:
    for item in interface.items:
        if isinstance(item, ast.OutClause):
            yield from (f.type for f in item.fields)
        if isinstance(item, ast.InClause):
            yield from (r.type for g in item.groups for r in g.inputs if r.type is not None)


def _base_name(type_expr: ast.TypeExpr) -> ast.Ident:
    while isinstance(type_expr, ast.ListType):
        type_expr = type_expr.item
    return type_expr.name


@register
class TypeNames(Check):
    codes = {
        "E112": "unknown type",
        "E113": "type alias refers to itself",
        "E114": "type alias redefines a builtin type",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        known = set(BUILTIN_TYPES) | set(program.aliases)
        for type_expr in all_type_exprs(program):
            name = _base_name(type_expr)
            if name.text not in known:
                hint = (
                    schema.did_you_mean(name.text, known)
                    or f"the builtin types are {', '.join(BUILTIN_TYPES)}; declare others with `type Name = ...`"
                )
                yield Diagnostic("E112", f"unknown type `{name.text}`", name.span, hint)
        for alias in program.aliases.values():
            if alias.name.text in BUILTIN_TYPES:
                yield Diagnostic(
                    "E114",
                    f"type alias `{alias.name.text}` redefines a builtin type",
                    alias.name.span,
                    "choose another name for the alias",
                )
            elif self._cycles(program, alias):
                yield Diagnostic(
                    "E113",
                    f"type alias `{alias.name.text}` refers to itself",
                    alias.name.span,
                    "an alias must end in a builtin type such as `Tensor`",
                )

    def _cycles(self, program: Program, alias: ast.TypeAlias) -> bool:
        seen = {alias.name.text}
        current = alias
        while True:
            name = _base_name(current.type).text
            if name in seen:
                return True
            nxt = program.aliases.get(name)
            if nxt is None or name in BUILTIN_TYPES:
                return False
            seen.add(name)
            current = nxt


@register
class Globals(Check):
    codes = {
        "E115": "unknown kind of global",
        "E116": "`uses` names an unknown global",
        "W181": "global never used",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        used: set[str] = set()
        for role in program.roles.values():
            setting = next((s for s in role.settings if s.key.text == "uses"), None)
            for name in role.config.get("uses", ()):
                used.add(name)
                if name not in program.globals:
                    span = next(v.span for v in _flat_values(setting) if isinstance(v, ast.NameValue) and v.name == name)
                    hint = schema.did_you_mean(name, program.globals) or "declare it with `global NAME: KVCache { ... }`"
                    yield Diagnostic("E116", f"role `{role.name}` uses unknown global `{name}`", span, hint)
        for decl in program.globals.values():
            if decl.kind.text not in schema.GLOBAL_KINDS:
                kinds = ", ".join(f"`{k}`" for k in schema.GLOBAL_KINDS)
                hint = schema.did_you_mean(decl.kind.text, schema.GLOBAL_KINDS) or f"the kinds of global are {kinds}"
                yield Diagnostic("E115", f"unknown kind of global `{decl.kind.text}`", decl.kind.span, hint)
            if decl.name.text not in used and not program.is_library:  # a library's importers' roles may use it
                yield Diagnostic(
                    "W181",
                    f"global `{decl.name.text}` is not used by any role",
                    decl.name.span,
                    f"add `uses {decl.name.text}` to the roles that need it, or remove it",
                )


ITEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3": 1, "int8": 1}  # flowrt.params.layout's


@register
class KVCacheSize(Check):
    codes = {"E128": "a `KVCache` global that cannot hold pages (no page fits, no device tier, repeated slices or tiers)"}

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for decl in program.globals.values():
            if decl.kind.text != "KVCache":
                continue
            read = schema.interpret(decl.entries, schema.GLOBAL_KINDS["KVCache"])
            values, settings = read.values, read.settings
            tiers = values.get("tiers")
            known = isinstance(tiers, tuple) and all(tier in schema.TIERS for tier in tiers)  # (others: the schema's error)
            if known and (tiers[:1] != ("device",) or list(tiers) != sorted(set(tiers), key=schema.TIERS.index)):
                yield Diagnostic(
                    "E128",
                    f"global `{decl.name.text}`: tiers {list(tiers)} are not distinct tiers, fastest first, starting with `device`",
                    settings["tiers"].span,
                    "list each tier once, in the order device, host, disk (device is required: attention reads pages "
                    "from it), e.g. `tiers [device, host]`",
                )
            slices = values.get("slices")
            if isinstance(slices, tuple) and len(set(slices)) != len(slices):
                yield Diagnostic(
                    "E128",
                    f"global `{decl.name.text}`: slices {list(slices)} name a slice twice",
                    settings["slices"].span,
                    "name each slice once, e.g. `slices [k, v]`",
                )
            numbers = [
                values.get(key, default) for key, default in (("layers", 1), ("page_tokens", 16), ("heads", 1), ("head_dim", 1))
            ]
            slices = values.get("slices", ("k", "v"))
            capacity = values.get("capacity")
            if not all(isinstance(n, int) for n in numbers) or not isinstance(slices, tuple) or not isinstance(capacity, int):
                continue
            layers, page_tokens, heads, head_dim = numbers
            page = layers * len(slices) * page_tokens * heads * head_dim * ITEM_BYTES.get(str(values.get("dtype", "float16")), 2)
            if capacity < page:
                yield Diagnostic(
                    "E128",
                    f"global `{decl.name.text}`: capacity {capacity} bytes holds no page (one page is {page} bytes)",
                    settings["capacity"].span,
                    f"give `capacity` at least {page} bytes (a tier's pages = capacity / page bytes), or shrink the page",
                )


def _flat_values(setting: ast.Setting | None) -> list[ast.Value]:
    if setting is None:
        return []
    values = list(setting.values)
    if len(values) == 1 and isinstance(values[0], ast.ListValue):
        return list(values[0].items)
    return values


@register
class Settings(Check):
    codes = {
        "E120": "unknown setting",
        "E121": "setting given twice",
        "E122": "setting has the wrong kind of value",
        "E123": "setting out of range",
        "E124": "unknown load-balancing policy",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for role in program.roles.values():
            yield from schema.interpret(role.settings, schema.ROLE).problems
            for interface in role.interfaces.values():
                yield from schema.interpret(interface.settings, schema.INTERFACE).problems
        for graph in program.graphs.values():
            yield from schema.interpret(graph.settings, schema.GRAPH).problems
        for decl in program.globals.values():
            kind = schema.GLOBAL_KINDS.get(decl.kind.text)
            if kind is not None:
                yield from schema.interpret(decl.entries, kind).problems


@register
class Impl(Check):
    codes = {"E125": '`impl` is not "module:Class"', "E126": "role without `impl`"}

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for role in program.roles.values():
            impl = role.config.get("impl")
            setting = next((s for s in role.settings if s.key.text == "impl"), None)
            if setting is None:
                yield Diagnostic(
                    "E126",
                    f"role `{role.name}` has no `impl`",
                    role.decl.name.span,
                    f'add `impl "module:Class"` naming the Python class that implements `{role.name}`',
                )
            elif isinstance(impl, str) and (problem := impl_problem(impl)) is not None:
                what, fix = problem
                yield Diagnostic(
                    "E125",
                    f'`impl` of role `{role.name}` must look like "package.module:Class", but {what}',
                    setting.values[0].span,
                    fix,
                )
