"""`allow CODE, ...` in a role or graph (issue 33): a warning that is intended is allowed where
the reader sees it, so `check --strict` passes a graph that imports a library and leaves some
of its roles out; only the allowing role or graph is quiet, and an allow of an unknown code or
of an error is itself an error (E190, E191; their programs are under tests/invalid/)."""

from __future__ import annotations

import subprocess
import sys

from flowc.check import check_source
from flowc.fmt import format_source
from flowc.syntax import ast, parse
from tests.conftest import REPO

LIBRARY_GRAPH = """flow describe

import multimodal

# the text path alone: the library's image decoder and DiT are left out on purpose
graph describe {
    entry  request
    stream token ordered
    allow W210
}
"""

TWO_GRAPHS = """placeholder request: Json

role echo {
    impl "m:Echo"
    interface run { in request  out reply: Json }
}

role listen {
    impl "m:Listen"
    interface run { in request  out heard: Json }
}

graph talk {
    entry  request
    return reply
}

graph wait {
    entry  request
    return heard
}
"""


def codes(text: str) -> list[tuple[str, int]]:
    return [(d.code, d.span.line) for d in check_source(text, "p.flow", REPO / "p.flow").diagnostics]


def strict(tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "pipeline.flow"
    path.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "flowc", "check", "--strict", str(path)], capture_output=True, text=True, timeout=60
    )


def test_a_graph_that_leaves_library_roles_out_passes_strict_once_it_allows_w210(tmp_path):
    without = LIBRARY_GRAPH.replace("    allow W210\n", "")
    assert [code for code, _ in codes(without)] == ["W210"]
    failed = strict(tmp_path, without)
    assert failed.returncode == 1 and "add `allow W210` to `describe`" in failed.stdout
    assert codes(LIBRARY_GRAPH) == []
    passed = strict(tmp_path, LIBRARY_GRAPH)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert passed.stdout.strip() == "checked 1 file: no problems"


def test_a_graphs_allow_quiets_that_graph_only():
    assert codes(TWO_GRAPHS) == [("W210", 13), ("W210", 18)]
    allowed = TWO_GRAPHS.replace("    return reply\n", "    return reply\n    allow W210\n")
    assert codes(allowed) == [("W210", 19)]


def test_a_role_that_allows_w210_is_left_out_of_every_graphs_list():
    allowed = TWO_GRAPHS.replace('impl "m:Listen"\n', 'impl "m:Listen"\n    allow W210\n')
    result = check_source(allowed, "p.flow")
    assert [(d.code, d.span.line) for d in result.diagnostics] == [("W210", 19)]  # `wait` still leaves `echo` out
    assert "`echo.run`" in result.diagnostics[0].message and "listen" not in result.diagnostics[0].message


def test_a_roles_allow_covers_the_warnings_inside_it_and_no_other_code():
    text = TWO_GRAPHS.replace("out reply: Json }", "out reply: Json, note: Json }")
    assert ("W143", 5) in codes(text)
    allowed = text.replace('impl "m:Echo"\n', 'impl "m:Echo"\n    allow W143\n')
    assert ("W143", 6) not in codes(allowed)
    assert [code for code, _ in codes(allowed)] == ["W210", "W210"]  # W210 is the graphs' to allow
    elsewhere = text.replace('impl "m:Listen"\n', 'impl "m:Listen"\n    allow W143\n')
    assert ("W143", 5) in codes(elsewhere)


def test_allow_parses_with_spans_and_formats_canonically():
    messy = TWO_GRAPHS.replace("    return reply\n", "    return reply\n    allow   W210 ,W206\n")
    module = parse(messy).module
    clause = next(i for d in module.decls if isinstance(d, ast.Graph) for i in d.items if isinstance(i, ast.AllowClause))
    assert [c.text for c in clause.codes] == ["W210", "W206"]
    assert messy[clause.span.start : clause.span.end] == "allow   W210 ,W206"
    assert messy[clause.codes[1].span.start : clause.codes[1].span.end] == "W206"
    formatted, _ = format_source(messy)
    assert "    allow W210, W206\n" in formatted
    assert format_source(formatted)[0] == formatted
    assert parse(formatted).module == module


def test_allow_outside_a_role_or_graph_body_is_a_syntax_error_with_a_hint():
    in_interface = TWO_GRAPHS.replace("out reply: Json }", "out reply: Json  allow W143 }")
    (error,) = parse(in_interface).diagnostics
    assert error.code == "E001" and "unexpected `allow`" in error.message
    bare = TWO_GRAPHS.replace("    entry  request\n    return reply\n", "    entry  request\n    allow\n    return reply\n")
    (error,) = parse(bare).diagnostics
    assert error.hint == "`allow` needs one or more warning codes, such as `W210`, after it, before `return`"


def test_the_language_server_publishes_what_check_does_and_completes_allow():
    from flowc.lsp import answers
    from flowc.lsp.scheduler import Snapshot
    from flowc.lsp.server import analyse

    text = TWO_GRAPHS.replace("    return reply\n", "    return reply\n    allow W210\n")
    analysis = analyse(Snapshot("untitled:p.flow", 1, text))
    assert [(d.code, d.span.line) for d in analysis.result.diagnostics] == [("W210", 19)]
    assert {o.name for o in analysis.found} >= {"echo", "listen", "talk", "wait", "reply", "heard"}
    assert "allow" in [c.label for c in answers.completions(analysis.result.program, "    al")]
