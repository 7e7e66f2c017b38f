"""Reading sources (issue 12, item 17): a UTF-8 byte-order mark is accepted by check, fmt,
imports and the language server's path, and fmt keeps it; a diagnostic on a huge line prints a
window around the caret, not the line."""

from __future__ import annotations

import subprocess
import sys

from flowc.check import check_file, check_source
from flowc.diagnostics import MAX_EXCERPT, render_text
from flowc.fmt import format_source
from flowc.sources import BOM, read_source

PROGRAM = """flow t

placeholder request: Json

role a {
    impl "m:A"
    interface run { in request  out result: Json }
}

graph g {
    entry  request
    return result
}
"""


def flowc(*args, cwd):
    return subprocess.run([sys.executable, "-m", "flowc", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_a_bom_is_not_part_of_the_text(tmp_path):
    path = tmp_path / "p.flow"
    path.write_bytes(BOM.encode() + PROGRAM.encode())
    source = read_source(path)
    assert (source.bom, source.text) == (BOM, PROGRAM)
    result = check_file(path)
    assert result.ok and result.diagnostics == []


def test_check_and_fmt_accept_a_bom_and_fmt_keeps_it(tmp_path):
    path = tmp_path / "p.flow"
    path.write_bytes(BOM.encode() + PROGRAM.replace("    impl", "  impl").encode())
    checked = flowc("check", "p.flow", cwd=tmp_path)
    assert checked.returncode == 0 and "no problems" in checked.stdout, checked.stdout + checked.stderr
    formatted = flowc("fmt", "p.flow", cwd=tmp_path)
    assert formatted.returncode == 0, formatted.stderr
    assert path.read_bytes() == BOM.encode() + PROGRAM.encode()  # laid out again, BOM kept
    assert flowc("fmt", "--check", "p.flow", cwd=tmp_path).returncode == 0


def test_positions_after_a_bom_are_the_editors(tmp_path):
    path = tmp_path / "p.flow"
    path.write_bytes(BOM.encode() + b"flow t\nrole r {\n")
    result = flowc("check", "p.flow", cwd=tmp_path)
    assert result.returncode == 1
    # the error is at the end of the file; the first line's columns do not count the BOM
    path.write_bytes(BOM.encode() + b"flow 7\n")
    result = flowc("check", "p.flow", cwd=tmp_path)
    assert "p.flow:1:6: E001" in result.stdout, result.stdout


def test_an_imported_module_may_start_with_a_bom(tmp_path):
    (tmp_path / "lib.flow").write_bytes(BOM.encode() + b"placeholder request: Json\n")
    root = tmp_path / "main.flow"
    root.write_text(PROGRAM.replace("placeholder request: Json\n", "import lib\n"))
    result = check_file(root)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics]


def test_text_from_an_editor_may_keep_its_bom():
    # the language server checks and formats the editor's text as it is, BOM and all
    text = BOM + PROGRAM
    assert check_source(text, "p.flow").diagnostics == []
    broken = check_source(BOM + "flow 7\n", "p.flow").diagnostics[0]
    assert (broken.span.line, broken.span.column) == (1, 7)  # the BOM is one character of the editor's line
    formatted, _ = format_source(BOM + PROGRAM.replace("    impl", " impl"))
    assert formatted == BOM + PROGRAM


def test_a_diagnostic_on_a_huge_line_prints_a_window_around_the_caret():
    line = "placeholder x: Json " + " " * 1_200_000 + "$ tail"
    text = "flow t\n" + line + "\n"
    (diagnostic,) = check_source(text, "big.flow").diagnostics
    rendered = render_text([diagnostic], {"big.flow": text})
    assert len(rendered) < 1000
    excerpt, caret, note = rendered.splitlines()[1:4]
    assert excerpt.startswith("  2 | …") and excerpt.endswith("$ tail")
    # the caret sits under the offending character
    assert excerpt[caret.index("^")] == "$"
    assert "line 2 is 1,200,026 characters long; columns" in note


def test_a_long_caret_is_cut_and_short_lines_are_whole():
    value = "x" * 5000
    text = f'flow t\nrole r {{\n    impl "m:R"\n    lb "{value}"\n    interface i {{ in a  out b: Json }}\n}}\n'
    diagnostic = next(d for d in check_source(text, "t.flow").diagnostics if d.code == "E122")
    rendered = render_text([diagnostic], {"t.flow": text}).splitlines()
    excerpt, caret = rendered[1], rendered[2]
    assert len(excerpt) < MAX_EXCERPT + 20 and 1 <= caret.count("^") <= 40
    assert excerpt[caret.index("^")] == '"'  # the caret starts at the string
    short = check_source("flow t\nrole r {\n", "s.flow").diagnostics[0]
    assert "columns" not in render_text([short], {"s.flow": "flow t\nrole r {\n"})


def test_excerpts_count_lines_as_spans_do():
    # a form feed or U+2028 is not a line break for spans: the excerpt must show the right line
    text = "flow t\n# a \u2028 comment \x0c here\nrole r {\n    replicas 0\n}\n"
    diagnostic = next(d for d in check_source(text, "t.flow").diagnostics if d.code == "E123")
    excerpt = render_text([diagnostic], {"t.flow": text}).splitlines()[1]
    assert excerpt == "  4 |     replicas 0"
