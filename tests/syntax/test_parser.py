"""Parsing: spans, comments, values, keywords, error messages in the user's words."""

from __future__ import annotations

from flowc.syntax import ast, parse
from flowc.syntax.parser import _parser
from tests.conftest import EXAMPLES, REPO

IMAGE_CHAT = (REPO / "examples/image_chat/pipeline.flow").read_text()


def parse_ok(text: str) -> ast.Module:
    result = parse(text, "t.flow")
    assert result.module is not None, result.diagnostics
    return result.module


def role(module: ast.Module, name: str) -> ast.Role:
    return next(d for d in module.decls if isinstance(d, ast.Role) and d.name.text == name)


def test_every_example_parses():
    for path in EXAMPLES:
        assert parse(path.read_text(), str(path)).ok, path


def test_grammar_is_loaded_once():
    assert _parser() is _parser()


def test_spans_point_at_the_text():
    module = parse_ok(IMAGE_CHAT)
    llm = role(module, "llm")
    lines = IMAGE_CHAT.splitlines()
    assert (llm.name.span.line, llm.name.span.column) == (lines.index("role llm {") + 1, 6) == (37, 6)
    assert lines[llm.span.line - 1].startswith("role llm {")
    assert lines[llm.span.end_line - 1] == "}"
    generate = next(i for i in llm.items if isinstance(i, ast.Interface))
    (clause,) = [i for i in generate.items if isinstance(i, ast.InClause)]
    text = IMAGE_CHAT[clause.span.start : clause.span.end]
    assert text == "in  txt_emb | vit_emb & vae_lat"


def test_or_of_and_groups():
    module = parse_ok(IMAGE_CHAT)
    generate = next(i for i in role(module, "llm").items if isinstance(i, ast.Interface))
    (clause,) = [i for i in generate.items if isinstance(i, ast.InClause)]
    groups = [[r.field.text for r in g.inputs] for g in clause.groups]
    assert groups == [["txt_emb"], ["vit_emb", "vae_lat"]]


def test_join_thresholds_and_stream_flags():
    module = parse_ok(IMAGE_CHAT)
    denoise = next(i for i in role(module, "dit").items if isinstance(i, ast.Interface))
    join = next(i for i in denoise.items if isinstance(i, ast.JoinClause))
    assert [(i.field.text, i.count) for i in join.items] == [("hidden", 1), ("vit_emb", None), ("vae_lat", None)]
    parse_iface = next(i for i in role(module, "frontend").items if isinstance(i, ast.Interface))
    out = next(i for i in parse_iface.items if isinstance(i, ast.OutClause))
    assert out.stream and [f.name.text for f in out.fields] == ["text_seg", "image_seg"]


def test_comments_are_collected_with_their_kind():
    module = parse_ok("# lead\nflow x  # trailing\n\n# own line\nplaceholder p: Json\n")
    assert [(c.text, c.trailing) for c in module.comments] == [("# lead", False), ("# trailing", True), ("# own line", False)]


def test_values_durations_sizes_strings():
    module = parse_ok('global g: KVCache {\n  a 5ms\n  b 2m\n  c 16GiB\n  d "q\\"x\\\\n"\n  e [k, v]\n  f 1.5\n  g all\n}\n')
    (decl,) = module.decls
    values = {e.key.text: e.values[0] for e in decl.entries}
    assert values["a"].seconds == 0.005
    assert values["b"].seconds == 120.0
    assert values["c"].bytes == 16 * 2**30
    assert values["d"].value == 'q"x\\n'
    assert [v.name for v in values["e"].items] == ["k", "v"]
    assert values["f"].value == 1.5
    assert values["g"].name == "all"


def test_equality_ignores_spans():
    a = parse_ok("placeholder p: Json\n")
    b = parse_ok("\n\n   placeholder    p :Json   # moved\n")
    assert a == b
    assert a.decls[0].span != b.decls[0].span


def test_keywords_are_whole_words():
    result = parse("rolee a {}\n", "t.flow")
    (diagnostic,) = result.diagnostics
    assert "unexpected name `rolee`" in diagnostic.message
    assert diagnostic.hint == "did you mean `role`?"


def test_names_may_contain_keywords():
    module = parse_ok("placeholder instream: Json\nplaceholder roles: Json\n")
    assert [d.name.text for d in module.decls] == ["instream", "roles"]


def test_a_placeholder_may_stream():
    text = "placeholder stream audio_in: Audio\nplaceholder streamer: [Text]\n"
    streaming, plain = parse_ok(text).decls
    assert (streaming.name.text, streaming.stream, ast.type_text(streaming.type)) == ("audio_in", True, "Audio")
    assert (plain.name.text, plain.stream, ast.type_text(plain.type)) == ("streamer", False, "[Text]")
    # the declaration's span runs from `placeholder` over `stream` to the type; the name's is the name
    assert text[streaming.span.start : streaming.span.end] == "placeholder stream audio_in: Audio"
    assert text[streaming.name.span.start : streaming.name.span.end] == "audio_in"
    # `stream` is meaning, not layout: it takes part in equality
    assert parse_ok("placeholder stream a: Audio\n") != parse_ok("placeholder a: Audio\n")
    assert parse_ok("placeholder  stream\n  a :Audio\n") == parse_ok("placeholder stream a: Audio\n")


def test_a_streaming_placeholder_needs_a_name():
    result = parse("flow t\n\nplaceholder stream: Audio\n", "t.flow")
    (diagnostic,) = result.diagnostics
    # reported at `stream`, the word meant as the name, and saying how a streaming one is written
    assert (diagnostic.code, diagnostic.span.line, diagnostic.span.column, diagnostic.span.end_column) == ("E001", 3, 13, 19)
    assert "placeholder stream NAME: TYPE" in diagnostic.hint
    (late,) = parse("placeholder stream x Audio\n", "t.flow").diagnostics
    assert "expected `:`" in late.message


def test_missing_brace_names_the_open_block():
    result = parse('role a {\n  impl "m:A"\n\ngraph g {\n  entry x\n  return y\n}\n', "t.flow")
    (diagnostic,) = result.diagnostics
    assert diagnostic.code == "E001"
    assert diagnostic.message == "expected `}` to close `role a` opened at line 1, found `graph`"
    assert diagnostic.span.line == 4
    assert diagnostic.notes[0].span.line == 1


def test_unexpected_end_of_file_inside_a_block():
    result = parse("graph g {\n  entry x\n", "t.flow")
    (diagnostic,) = result.diagnostics
    assert diagnostic.message == "expected `}` to close `graph g` opened at line 1"


def test_crlf_line_endings():
    module = parse_ok("flow x\r\n\r\nplaceholder p: Json\r\n")
    assert module.decls[0].span.line == 3


def test_empty_file_is_an_empty_module():
    module = parse_ok("")
    assert module.header is None and module.decls == ()


def test_deep_nesting_is_a_diagnostic_not_a_crash():
    result = parse("type T = " + "[" * 10_000 + "Json" + "]" * 10_000, "t.flow")
    assert [d.code for d in result.diagnostics] == ["E006"]


def test_huge_numbers_are_a_diagnostic_not_a_crash():
    result = parse("role a { replicas " + "9" * 5000 + " }", "t.flow")
    assert [d.code for d in result.diagnostics] == ["E005"]
