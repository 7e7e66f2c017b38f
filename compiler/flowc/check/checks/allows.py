"""`allow CODE, ...` in a role or graph (docs/language.md, "Allowing a warning"): the codes it
names are checked here (E190: no such code, E191: an error, which cannot be allowed), and
`without_allowed` drops from a compilation's diagnostics the warnings a role or graph allows:
each whose place lies inside it, and for `W210`, which is reported at the graph, the interfaces
of a role that allows it are left out of the graph's list."""

from __future__ import annotations

from collections.abc import Iterator

from flowc.check.model import Program
from flowc.check.registry import CODES, Check, register
from flowc.check.schema import did_you_mean
from flowc.diagnostics import Diagnostic, Severity
from flowc.syntax import ast


def allow_clauses(program: Program) -> Iterator[tuple[ast.Role | ast.Graph, ast.AllowClause]]:
    """Each `allow` clause of the program with the role or graph holding it (an imported
    module's roles included; its graphs are not part of the program)."""
    for module in program.modules:
        for decl in module.ast.decls:
            if isinstance(decl, ast.Role) or (module.is_root and isinstance(decl, ast.Graph)):
                for item in decl.items:
                    if isinstance(item, ast.AllowClause):
                        yield decl, item


def role_allows(program: Program, role: str, code: str) -> bool:
    info = program.roles.get(role)
    return info is not None and any(
        code == c.text for item in info.decl.items if isinstance(item, ast.AllowClause) for c in item.codes
    )


@register
class Allows(Check):
    codes = {
        "E190": "`allow` names an unknown diagnostic code",
        "E191": "`allow` names an error (only warnings can be allowed)",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        warnings = [code for code in CODES if code.startswith("W")]
        for _, clause in allow_clauses(program):
            for code in clause.codes:
                if code.text not in CODES:
                    yield Diagnostic(
                        "E190",
                        f"`allow {code.text}`: flowc has no diagnostic `{code.text}`",
                        code.span,
                        did_you_mean(code.text, warnings) or "docs/diagnostics.md lists the warning codes (`W...`)",
                    )
                elif not code.text.startswith("W"):
                    yield Diagnostic(
                        "E191",
                        f"`allow {code.text}`: `{code.text}` is an error ({CODES[code.text]}), and errors cannot be allowed",
                        code.span,
                        f"fix what {code.text} reports and remove it from `allow`; only warnings (`W...`) can be allowed",
                    )


def without_allowed(program: Program, diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """`diagnostics` less the warnings that a role or graph holding them allows."""
    scopes = [(decl.span, {code.text for code in clause.codes}) for decl, clause in allow_clauses(program)]
    if not scopes:
        return diagnostics
    return [
        d
        for d in diagnostics
        if d.severity is not Severity.WARNING
        or not any(
            d.code in codes and span.file == d.span.file and span.start <= d.span.start < span.end for span, codes in scopes
        )
    ]
