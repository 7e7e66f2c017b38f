"""Resolution and checking of a whole program: `check_file` and `check_source`.

Loading parses the root module and its imports; resolution builds the `Program` model; the
registered checks report problems. The result holds every diagnostic, sorted by position, and
the program (None only when a file did not parse).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flowc.check import checks as _checks  # noqa: F401  (registers the checks)
from flowc.check.checks.allows import without_allowed
from flowc.check.loader import load
from flowc.check.model import Program
from flowc.check.registry import CODES, run_checks
from flowc.check.resolve import build_program
from flowc.diagnostics import Diagnostic, Report, Severity
from flowc.gcpause import gc_paused
from flowc.sources import read_source


@dataclass
class CheckResult:
    program: Program | None
    diagnostics: list[Diagnostic]
    sources: dict[str, str]

    @property
    def ok(self) -> bool:
        return self.program is not None and not any(d.severity is Severity.ERROR for d in self.diagnostics)


def check_source(text: str, display: str = "<input>", path: Path | None = None) -> CheckResult:
    """Check `text` as the root module; `path` (if any) locates its imports."""
    with gc_paused():
        return _check(text, display, path)


def _check(text: str, display: str, path: Path | None) -> CheckResult:
    loaded = load(text, display, path)
    report = Report()
    report.extend(loaded.diagnostics)
    if not loaded.ok:
        return CheckResult(None, report.sorted(), loaded.sources)
    program = build_program(loaded.modules)
    report.extend(run_checks(program, phase=1))
    if not report.has_errors:
        report.extend(run_checks(program, phase=2))
    return CheckResult(program, without_allowed(program, report.sorted()), loaded.sources)


def check_file(path: Path, display: str | None = None) -> CheckResult:
    """Check the file at `path`; raises OSError/UnicodeDecodeError if it cannot be read."""
    return check_source(read_source(path).text, display or str(path), path)


__all__ = ["CODES", "CheckResult", "Program", "check_file", "check_source"]
