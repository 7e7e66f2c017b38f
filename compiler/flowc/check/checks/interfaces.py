"""Checks on the shape of roles and interfaces: clauses, duplicate fields, join thresholds, and
names the role's Python class cannot spell."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from keyword import iskeyword

from flowc.check.checks.common import repeated, repeats, text
from flowc.check.model import InterfaceInfo, Program
from flowc.check.registry import Check, register
from flowc.diagnostics import Diagnostic, Note
from flowc.syntax import ast


@register
class InterfaceShape(Check):
    codes = {
        "E130": "interface with no inputs",
        "E131": "interface with both `in` and `join`",
        "E132": "clause given twice in one interface",
        "W135": "role without interfaces",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for role in program.roles.values():
            if not role.interfaces:
                yield Diagnostic(
                    "W135",
                    f"role `{role.name}` has no interfaces and can never run",
                    role.decl.name.span,
                    "add `interface NAME { in ... out ... }`",
                )
            for interface in role.interfaces.values():
                yield from self._shape(interface)

    def _shape(self, interface: InterfaceInfo) -> Iterator[Diagnostic]:
        name = interface.decl.name
        if not interface.in_clauses and not interface.join_clauses:
            yield Diagnostic(
                "E130",
                f"interface `{interface.qualname}` has no inputs, so nothing can ever activate it",
                name.span,
                "add `in FIELD` (a placeholder or another interface's output) or a `join { ... }`",
            )
        if interface.in_clauses and interface.join_clauses:
            yield Diagnostic(
                "E131",
                f"interface `{interface.qualname}` has both `in` and `join`",
                interface.join_clauses[0].span,
                "use `join { FIELD: N | all }` for count joins, or `in` for per-frame activation, not both",
                (Note(interface.in_clauses[0].span, "`in` given here"),),
            )
        for keyword, clauses in (("in", interface.in_clauses), ("out", interface.out_clauses), ("join", interface.join_clauses)):
            for extra in clauses[1:]:
                yield Diagnostic(
                    "E132",
                    f"interface `{interface.qualname}` has more than one `{keyword}` clause",
                    extra.span,
                    _merge_hint(keyword),
                    (Note(clauses[0].span, f"first `{keyword}` here"),),
                )


@register
class PythonNames(Check):
    codes = {"W137": "interface or input field named with a Python keyword (the role's method cannot spell it)"}

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for role in program.roles.values():
            for interface in role.interfaces.values():
                name = interface.decl.name
                if iskeyword(name.text):
                    yield Diagnostic(
                        "W137",
                        f"interface `{interface.qualname}` is named `{name.text}`, a Python keyword: the role's class "
                        f"cannot define `async def {name.text}(...)`",
                        name.span,
                        f"rename the interface (e.g. `{name.text}_`), or set the method with `setattr` in the role's module",
                    )
                for ref in (r for group in interface.groups for r in group.inputs):
                    if iskeyword(ref.field.text):
                        yield Diagnostic(
                            "W137",
                            f"input `{ref.field.text}` of `{interface.qualname}` is a Python keyword: the role's method "
                            f"cannot take it as a named parameter",
                            ref.field.span,
                            f'rename the field, or take it with `**fields` and read `fields["{ref.field.text}"]`',
                        )


def _merge_hint(keyword: str) -> str:
    return {
        "in": "merge them into one: `in a | b & c` (OR of AND groups)",
        "out": "list every output in one clause: `out a: T, b: T` (add `stream` once for the interface)",
        "join": "list every field in one `join { ... }`",
    }[keyword]


@register
class RepeatedFields(Check):
    codes = {"E133": "field repeated in one clause"}

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for interface in program.interfaces():
            for clause in interface.in_clauses:
                for group in clause.groups:
                    yield from self._report(interface, (r.field for r in group.inputs), "AND group")
            for clause in interface.out_clauses:
                yield from self._report(interface, (f.name for f in clause.fields), "`out` clause")
            for join in interface.join_clauses:
                yield from self._report(interface, (i.field for i in join.items), "`join`")

    def _report(self, interface: InterfaceInfo, idents: Iterable[ast.Ident], where: str) -> Iterator[Diagnostic]:
        for dup, first in repeats(idents, text):
            message = f"field `{dup.text}` appears twice in one {where} of `{interface.qualname}`"
            yield repeated("E133", message, dup, first, "remove the repetition")


@register
class JoinThresholds(Check):
    codes = {"E136": "join threshold of zero"}

    def run(self, program: Program) -> Iterator[Diagnostic]:
        for interface in program.interfaces():
            for join in interface.join_clauses:
                for item in join.items:
                    if item.count == 0:
                        yield Diagnostic(
                            "E136",
                            f"join threshold of `{item.field.text}` in `{interface.qualname}` is 0, so the field would never be waited for",
                            item.span,
                            "use a count of at least 1, or `all` to wait until every upstream slot has ended",
                        )
