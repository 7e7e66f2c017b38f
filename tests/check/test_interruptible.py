"""`interruptible` (docs/language.md, "Interruptible graphs"): parsed into its own clause with its
place, given once (E179), warned of where nothing is streamed (W175), planned as the graph's
`interruptible`, printed by `flowc fmt` and the plan, shown by the language server's hover."""

from __future__ import annotations

import jsonschema
import pytest

from flowc.check import check_file, check_source
from flowc.fmt import format_source
from flowc.lsp import answers
from flowc.lsp.index import at, occurrences
from flowc.plan import build_plan
from flowc.plan.text import plan_text
from flowc.syntax import ast, parse
from tests.conftest import REPO
from tests.plan.test_plan_outputs import SCHEMA

TALK = REPO / "tests" / "data" / "interrupt" / "talk.flow"


def program():
    result = check_file(TALK)
    assert result.ok and result.diagnostics == [], [d.message for d in result.diagnostics]
    return result.program


def test_the_clause_parses_with_its_place():
    text = TALK.read_text(encoding="utf-8")
    module = parse(text, "talk.flow").module
    chat = next(d for d in module.decls if isinstance(d, ast.Graph) and d.name.text == "chat")
    clauses = [i for i in chat.items if isinstance(i, ast.InterruptibleClause)]
    assert len(clauses) == 1
    span = clauses[0].span
    assert text[span.start : span.end] == "interruptible"
    assert span.line == text[: span.start].count("\n") + 1


def test_it_is_a_reserved_word():
    result = parse('role interruptible {\n    impl "m:A"\n}\n', "t.flow")
    assert result.module is None and result.diagnostics[0].code == "E001"
    assert result.diagnostics[0].hint == "`interruptible` is a reserved word; choose another name"


def test_given_twice_is_E179_and_without_a_stream_W175():
    base = TALK.read_text(encoding="utf-8")
    twice = base.replace("    interruptible\n", "    interruptible\n    interruptible\n")
    assert [d.code for d in check_source(twice).diagnostics] == ["E179"]
    returned = base.replace("graph grade {\n", "graph grade {\n    interruptible\n")
    (warning,) = check_source(returned).diagnostics
    assert warning.code == "W175" and "graph `grade` is `interruptible` but streams nothing" in warning.message
    allowed = base.replace("graph grade {\n", "graph grade {\n    interruptible\n    allow W175\n")
    assert check_source(allowed).diagnostics == []


def test_the_plan_says_which_graphs_are_interruptible():
    plan = build_plan(program())
    assert plan.graphs["chat"].interruptible and not plan.graphs["grade"].interruptible
    text = plan_text(plan)
    assert "graph chat (entry prompt, interruptible)" in text and "graph grade (entry prompt)\n" in text
    data = plan.as_json()
    jsonschema.validate(data, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert (data["graphs"]["chat"]["interruptible"], data["graphs"]["grade"]["interruptible"]) == (True, False)
    del data["graphs"]["chat"]["interruptible"]
    with pytest.raises(jsonschema.ValidationError, match="interruptible"):
        jsonschema.validate(data, SCHEMA, cls=jsonschema.Draft202012Validator)


def test_fmt_prints_it_in_place_and_is_idempotent():
    messy = TALK.read_text(encoding="utf-8").replace("    interruptible\n", "        interruptible   # may be cut short\n")
    once, diagnostics = format_source(messy)
    assert diagnostics == []
    assert (
        "    stream reply ordered\n    interruptible       # may be cut short\n    allow W210\n}" in once
    )  # (the comment keeps its column)
    assert format_source(once)[0] == once
    assert format_source(TALK.read_text(encoding="utf-8"))[0] == TALK.read_text(encoding="utf-8")


def test_hover_on_the_graph_says_so():
    talk = program()
    text = TALK.read_text(encoding="utf-8")
    chat = at(occurrences(talk.root.ast), text.index("graph chat") + len("graph c"))
    hover = answers.hover(talk, chat)
    assert "interruptible }" in hover and "**Interruptible**" in hover
    grade = at(occurrences(talk.root.ast), text.index("graph grade") + len("graph g"))
    assert "nterruptible" not in answers.hover(talk, grade)
    assert "interruptible" in [c.label for c in answers.completions(talk, "    interr")]
