"""Checks on fields: every consumed field has a producer, `from role.interface` restrictions,
placeholders, and fields or placeholders nobody uses."""

from __future__ import annotations

from collections.abc import Iterator

from flowc.check import schema
from flowc.check.model import Program
from flowc.check.registry import Check, register
from flowc.diagnostics import Diagnostic, Note
from flowc.syntax import ast


def field_candidates(program: Program) -> set[str]:
    return {name for name, info in program.fields.items() if info.producers} | set(program.placeholders)


@register
class Producers(Check):
    codes = {
        "E140": "consumed field has no producer",
        "E142": "interface produces a placeholder",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        candidates = None
        root = program.root.path
        for name, info in program.fields.items():
            if not info.producers and name not in program.placeholders and not program.is_library:
                for consumer in info.consumers:
                    if consumer.field_ref.span.file != root:
                        continue  # an imported role left unfed simply never runs
                    if candidates is None:
                        candidates = field_candidates(program)
                    hint = schema.did_you_mean(name, candidates) or (
                        f"declare `placeholder {name}: TYPE` for a value given at the call, or add `{name}` to some interface's `out`"
                    )
                    yield Diagnostic(
                        "E140",
                        f"field `{name}` consumed by `{consumer.role}.{consumer.interface}` is produced by no interface and is not a placeholder",
                        consumer.field_ref.span,
                        hint,
                    )
            if name in program.placeholders:
                for producer in info.producers:
                    yield Diagnostic(
                        "E142",
                        f"`{producer.role}.{producer.interface}` produces `{name}`, which is a placeholder",
                        producer.decl.name.span,
                        "placeholders are given when the graph is called; give the output another name",
                        (Note(program.placeholders[name].name.span, "placeholder declared here"),),
                    )


@register
class SourceRestrictions(Check):
    codes = {
        "E117": "unknown role",
        "E118": "unknown interface",
        "E141": "`from role.interface` names an interface that does not produce the field",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for info in program.fields.values():
            for consumer in info.consumers:
                if consumer.source is not None:
                    yield from self._check(program, info.name, consumer.source)

    def _check(self, program: Program, field: str, source: ast.SourceRef) -> Iterator[Diagnostic]:
        role = program.roles.get(source.role.text)
        if role is None:
            yield unknown_role(program, source.role)
            return
        interface = role.interfaces.get(source.interface.text)
        if interface is None:
            hint = schema.did_you_mean(source.interface.text, role.interfaces) or (
                f"role `{role.name}` has interfaces {', '.join(f'`{i}`' for i in role.interfaces) or 'none'}"
            )
            yield Diagnostic(
                "E118", f"role `{role.name}` has no interface `{source.interface.text}`", source.interface.span, hint
            )
            return
        if field not in {o.name.text for o in interface.outputs}:
            producers = [f"`{p.role}.{p.interface}`" for p in program.field(field).producers]
            hint = (
                f"`{field}` is produced by {', '.join(producers)}"
                if producers
                else f"add `{field}` to the `out` of `{interface.qualname}`"
            )
            yield Diagnostic(
                "E141",
                f"`{interface.qualname}` does not produce `{field}`",
                source.span,
                hint,
                (Note(interface.decl.name.span, f"`{interface.qualname}` declared here"),),
            )


def unknown_role(program: Program, ident: ast.Ident) -> Diagnostic:
    hint = schema.did_you_mean(ident.text, program.roles) or "declare the role, or `import` the module that declares it"
    return Diagnostic("E117", f"unknown role `{ident.text}`", ident.span, hint)


@register
class UnusedValues(Check):
    codes = {
        "W143": "field produced but never used",
        "W144": "placeholder never used",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        if program.is_library:
            return
        graph_outputs = {c.field.name.text for g in program.graphs.values() for c in g.streams}
        graph_outputs |= {f.name.text for g in program.graphs.values() for f in g.returns}
        entries = {e.text for g in program.graphs.values() for e in g.entries}
        root = program.root.path
        for name, info in program.fields.items():
            if info.consumers or name in graph_outputs or name in program.placeholders:
                continue
            for producer in info.producers:
                if producer.decl.span.file != root:
                    continue  # an imported module's outputs are the importer's to use or not
                yield Diagnostic(
                    "W143",
                    f"field `{name}` produced by `{producer.role}.{producer.interface}` is never consumed, streamed or returned",
                    producer.decl.name.span,
                    f"consume it with `in {name}`, add `return {name}` to a graph, or drop it from the `out`",
                )
        for name, decl in program.placeholders.items():
            if decl.span.file != root:
                continue
            if name not in entries and not program.field(name).consumers:
                yield Diagnostic(
                    "W144", f"placeholder `{name}` is never used", decl.name.span, f"add `entry {name}` to a graph, or remove it"
                )
