"""The invalid-program corpus: each file under tests/invalid/ names on its first line the codes
it must produce; its full diagnostics are pinned in golden/test_corpus/."""

from __future__ import annotations

import re

import pytest

from flowc.check import CODES, check_file
from flowc.diagnostics import render_json, render_text
from tests.conftest import INVALID, display

EXPECT = re.compile(r"# expect: ((?:[EW]\d{3} ?)+)")
# Codes whose trigger cannot live in a corpus file, and the test that covers each instead.
COVERED_ELSEWHERE = {"E103": "tests/check/test_imports.py::test_unreadable_import_is_reported"}


def expected_codes(path) -> set[str]:
    match = EXPECT.match(path.read_text(encoding="utf-8"))
    assert match, f"{path.name} must start with '# expect: CODE...'"
    return set(match.group(1).split())


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_program(path, golden):
    result = check_file(path, display(path))
    codes = {d.code for d in result.diagnostics}
    missing = expected_codes(path) - codes
    assert not missing, f"{path.name} should report {sorted(missing)}; got {sorted(codes)}"
    assert not result.ok or all(c.startswith("W") for c in expected_codes(path))
    assert render_text(result.diagnostics, result.sources) == golden


def test_corpus_has_at_least_forty_programs():
    assert len(INVALID) >= 40


def test_every_code_has_a_corpus_program():
    covered = set().union(*(expected_codes(p) for p in INVALID))
    uncovered = set(CODES) - covered - set(COVERED_ELSEWHERE)
    assert not uncovered, f"add a program under tests/invalid/ for {sorted(uncovered)}"


def test_diagnostics_are_sorted_by_position():
    path = next(p for p in INVALID if p.stem == "many_errors_sorted_by_position")
    diagnostics = check_file(path, display(path)).diagnostics
    positions = [(d.span.line, d.span.column) for d in diagnostics]
    assert positions == sorted(positions)
    assert len({d.code for d in diagnostics}) >= 5


def test_several_broken_declarations_are_all_reported():
    path = next(p for p in INVALID if p.stem == "E001_several_broken_declarations")
    diagnostics = check_file(path, display(path)).diagnostics
    assert [d.span.line for d in diagnostics if d.code == "E001"] == [8, 18]


def test_json_diagnostics_carry_code_span_and_hint():
    path = next(p for p in INVALID if p.stem == "E140_field_without_producer")
    import json

    (entry,) = json.loads(render_json(check_file(path, display(path)).diagnostics))
    assert entry["code"] == "E140"
    assert entry["severity"] == "error"
    assert entry["span"]["file"] == display(path)
    assert (entry["span"]["line"], entry["span"]["column"]) == (8, 24)
    assert entry["hint"] == "did you mean `request`?"
