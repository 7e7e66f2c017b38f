"""The check registry: each check is a small class that owns a few diagnostic codes.

A check reads the `Program` and yields `Diagnostic`s; it never mutates the model and never
raises for bad input. `CODES` maps every code flowc can emit (syntax and loading included) to
a one-line summary, which `docs/diagnostics.md` lists and a test keeps in step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

from flowc.check.model import Program
from flowc.diagnostics import Diagnostic

CODES: dict[str, str] = {
    "E001": "syntax error: unexpected token or end of file",
    "E002": "unterminated string",
    "E003": "unexpected character",
    "E004": "unknown escape in a string",
    "E005": "number too large",
    "E006": "brackets nested too deeply",
    "E007": "number with an unknown unit",
    "E101": "imported module not found",
    "E102": "import cycle",
    "E103": "imported module cannot be read",
    "W104": "module imported twice",
}


class Check:
    codes: ClassVar[dict[str, str]] = {}
    # Phase 1 checks the program; phase 2 analyses each graph and runs only when phase 1
    # found no errors, so an unknown name is never also reported as a dead branch.
    phase: ClassVar[int] = 1

    def run(self, program: Program) -> Iterable[Diagnostic]:
        raise NotImplementedError


REGISTRY: list[type[Check]] = []


def register(cls: type[Check]) -> type[Check]:
    for code, summary in cls.codes.items():
        if code in CODES:
            raise ValueError(f"diagnostic code {code} registered twice")
        CODES[code] = summary
    REGISTRY.append(cls)
    return cls


def run_checks(program: Program, phase: int = 1) -> Iterator[Diagnostic]:
    for check in REGISTRY:
        if check.phase == phase:
            yield from check().run(program)
