"""`flowc fmt`: canonical, idempotent, meaning-preserving, comment-preserving."""

from __future__ import annotations

import pytest

from flowc.fmt import format_source
from flowc.syntax import parse
from tests.conftest import EXAMPLES, REPO

STDLIB = sorted((REPO / "stdlib/flowstd/lib").rglob("*.flow"))
VALID = EXAMPLES + STDLIB

MESSY = """# top comment
flow   messy
import text
import   text_extra

placeholder   req :  Json   # the request
role r{impl "m:C"   # impl comment
  # about the interface
  interface i{ in req out y:Text}
  interface j {in y|req&y out stream z:[Tensor],w:Any timeout 30s
     }


  batch {max 8 , wait 5ms}
}
global g: KVCache {layers 2 slices [k,v]}
graph   g{ entry req stream z ordered return w
 # end of the graph
}
# final words
"""


def fmt(text: str) -> str:
    formatted, diagnostics = format_source(text, "t.flow")
    assert formatted is not None, diagnostics
    return formatted


@pytest.mark.parametrize("path", VALID, ids=[p.relative_to(REPO).as_posix() for p in VALID])
def test_committed_files_are_formatted(path):
    text = path.read_text()
    assert fmt(text) == text, f"run `flowc fmt {path.relative_to(REPO)}`"


def test_design_example_is_its_own_canonical_form():
    # examples/image_chat/pipeline.flow is DESIGN.md §3 verbatim.
    text = (REPO / "examples/image_chat/pipeline.flow").read_text()
    assert text.startswith("flow image_chat\n\nplaceholder request: Json                       # injected")
    assert fmt(text) == text


def test_messy_input_canonical_form(golden):
    assert fmt(MESSY) == golden


@pytest.mark.parametrize("text", [MESSY] + [p.read_text() for p in VALID])
def test_idempotent_and_meaning_preserving(text):
    once = fmt(text)
    assert fmt(once) == once
    assert parse(once).module == parse(text).module


@pytest.mark.parametrize("text", [MESSY] + [p.read_text() for p in VALID])
def test_comments_are_kept(text):
    before = [c.text for c in parse(text).module.comments]
    after = [c.text for c in parse(fmt(text)).module.comments]
    assert after == before


def test_trailing_comment_keeps_its_column_when_it_fits():
    text = "placeholder p: Json          # aligned\n"
    assert fmt(text) == text


def test_trailing_comment_moves_right_of_longer_code():
    text = "placeholder  p   :  [ [Json] ]   # c\n"
    assert fmt(text) == "placeholder p: [[Json]]" + " " * 10 + "# c\n"  # the code shrank; the column stays
    crowded = "type VeryLongAliasName = Json # c\n"
    assert fmt(crowded) == "type VeryLongAliasName = Json  # c\n"


def test_one_line_interface_rules():
    text = 'role r {\n    impl "m:R"\n    interface a {\n        in x\n        out y: Json\n    }\n}\n'
    assert fmt(text) == 'role r {\n    impl "m:R"\n    interface a { in x  out y: Json }\n}\n'
    streaming = 'role r {\n    impl "m:R"\n    interface a { in x out stream y: Json }\n}\n'
    assert "        in  x\n        out stream y: Json\n" in fmt(streaming)


def test_a_streaming_placeholder_keeps_stream_and_is_idempotent():
    messy = "placeholder   stream\n   audio :[ Audio ]\nplaceholder stream mic: Audio  # the mic\nplaceholder p: Json\n"
    once = fmt(messy)
    assert once == "placeholder stream audio: [Audio]\nplaceholder stream mic: Audio  # the mic\nplaceholder p: Json\n"
    assert fmt(once) == once
    assert [d.stream for d in parse(once).module.decls] == [True, True, False]
    fixture = (REPO / "tests/data/streaming/duplex.flow").read_text()
    assert fmt(fixture) == fixture


def test_blank_lines_collapse_to_one():
    text = "placeholder a: Json\n\n\n\nplaceholder b: Json\nplaceholder c: Json\n"
    assert fmt(text) == "placeholder a: Json\n\nplaceholder b: Json\nplaceholder c: Json\n"


def test_declarations_are_separated_by_one_blank_line():
    text = 'placeholder a: Json\nrole r { impl "m:R" }\ngraph g { entry a return a }\n'
    assert fmt(text) == 'placeholder a: Json\n\nrole r {\n    impl "m:R"\n}\n\ngraph g {\n    entry  a\n    return a\n}\n'


def test_strings_are_reescaped():
    text = 'role r {\n    impl "m:\\x52"\n}\n'
    assert format_source(text)[0] is None  # \\x is not an escape flowc knows
    text = 'role r {\n    impl "a\\"b\\\\c\\td"\n}\n'
    assert fmt(text) == text


def test_syntax_errors_are_not_formatted():
    formatted, diagnostics = format_source("role {", "t.flow")
    assert formatted is None
    assert diagnostics[0].code == "E001"
