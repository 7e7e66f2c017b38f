"""Type agreement: producers of one field, input annotations, graph stream/return annotations."""

from __future__ import annotations

from collections.abc import Iterator

from flowc.check.model import FlowType, Program
from flowc.check.registry import Check, register
from flowc.diagnostics import Diagnostic, Note
from flowc.syntax import ast


def field_type(program: Program, name: str) -> FlowType | None:
    """The type of a field: its placeholder's, or its first producer's; None if it has neither."""
    placeholder = program.placeholders.get(name)
    if placeholder is not None:
        return program.type_of(placeholder.type)
    producers = program.field(name).producers
    return program.type_of(producers[0].decl.type) if producers else None


@register
class ProducerTypes(Check):
    codes = {"E150": "producers of one field disagree on its type"}

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for name, info in program.fields.items():
            if len(info.producers) < 2:
                continue
            first = info.producers[0]
            first_type = program.type_of(first.decl.type)
            for other in info.producers[1:]:
                other_type = program.type_of(other.decl.type)
                if not first_type.compatible(other_type):
                    yield Diagnostic(
                        "E150",
                        f"`{other.role}.{other.interface}` produces `{name}` as {other_type}, but `{first.role}.{first.interface}` produces it as {first_type}",
                        other.decl.type.span,
                        "give both the same type, or rename one of the outputs",
                        (Note(first.decl.type.span, f"`{name}` is {first_type} here"),),
                    )


@register
class AnnotatedTypes(Check):
    codes = {
        "E151": "input annotation disagrees with the field's type",
        "E152": "graph stream or return annotation disagrees with the field's type",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for interface in program.interfaces():
            for clause in interface.in_clauses:
                for group in clause.groups:
                    for ref in group.inputs:
                        if ref.type is not None:
                            yield from self._compare(program, "E151", ref.field.text, ref.type, f"`{interface.qualname}` expects")
        for graph in program.graphs.values():
            annotated = [c.field for c in graph.streams] + graph.returns
            for graph_field in annotated:
                if graph_field.type is not None:
                    yield from self._compare(
                        program, "E152", graph_field.name.text, graph_field.type, f"graph `{graph.name}` declares"
                    )

    def _compare(self, program: Program, code: str, name: str, annotation: ast.TypeExpr, who: str) -> Iterator[Diagnostic]:
        expected = program.type_of(annotation)
        actual = field_type(program, name)
        if actual is not None and not expected.compatible(actual):
            yield Diagnostic(
                code,
                f"{who} `{name}` as {expected}, but it is {actual}",
                annotation.span,
                f"write `{name}: {actual}`, or drop the annotation",
            )
