"""The checked program model and the check registry."""

from __future__ import annotations

from flowc.check import CODES, check_source
from flowc.check.model import FlowType
from flowc.check.registry import REGISTRY
from tests.conftest import REPO

IMAGE_CHAT = (REPO / "examples/image_chat/pipeline.flow").read_text()


def program_of(text):
    result = check_source(text, "t.flow")
    assert result.ok, [(d.code, d.message) for d in result.diagnostics]
    return result.program


def test_image_chat_model():
    program = program_of(IMAGE_CHAT)
    assert set(program.roles) == {"frontend", "embed", "vit", "vae", "llm", "dit"}
    frontend, llm, dit = program.roles["frontend"], program.roles["llm"], program.roles["dit"]
    assert frontend.config == {"impl": "image_chat.roles:Frontend", "replicas": 2, "lb": "round_robin"}
    assert llm.gpus == 1 and llm.config["uses"] == ("kv",)
    assert dit.share_target == "llm" and dit.gpus == 0
    assert llm.interfaces["generate"].stream
    assert [[r.field.text for r in g.inputs] for g in llm.interfaces["generate"].groups] == [["txt_emb"], ["vit_emb", "vae_lat"]]
    assert {(p.role, p.interface) for p in program.field("image_seg").producers} == {("frontend", "parse")}
    assert {(c.role, c.interface) for c in program.field("vit_emb").consumers} == {("llm", "generate"), ("dit", "denoise")}
    graph = program.graphs["chat"]
    assert [e.text for e in graph.entries] == ["request"]
    assert [(s.field.name.text, s.ordered) for s in graph.streams] == [("token", True)]
    assert [r.name.text for r in graph.returns] == ["image"]
    kv = program.globals["kv"]
    assert kv.kind.text == "KVCache"


def test_any_matches_everything_and_aliases_expand():
    assert FlowType("Any").compatible(FlowType("Tensor", 2))
    assert not FlowType("Any", 1).compatible(FlowType("Text"))
    text = """type Emb = Tensor
placeholder p: Json
role a {
    impl "m:A"
    interface x { in p  out e: Emb }
}
role b {
    impl "m:B"
    interface y { in p  out e: Tensor }
    interface z { in e: Any  out done: Json }
}
graph g {
    entry  p
    return done
}
"""
    program = program_of(text)
    assert program.type_of(program.field("e").producers[0].decl.type) == FlowType("Tensor")


def test_list_types_must_agree():
    text = 'placeholder p: Json\nrole a {\n    impl "m:A"\n    interface x { in p  out e: [Text] }\n    interface y { in e: Text  out f: Json }\n}\ngraph g {\n    entry  p\n    return f\n}\n'
    result = check_source(text, "t.flow")
    assert [d.code for d in result.diagnostics] == ["E151"]


def test_library_module_may_consume_fields_it_does_not_produce():
    text = 'role r {\n    impl "m:R"\n    interface run { in from_importer  out made: Json }\n}\n'
    result = check_source(text, "lib.flow")
    assert result.ok and result.diagnostics == []
    with_graph = text + "\nplaceholder p: Json\n\ngraph g {\n    entry  p\n    return made\n}\n"
    assert [d.code for d in check_source(with_graph, "t.flow").diagnostics] == ["E140"]


def test_registry_codes_are_unique_and_described():
    seen = set()
    for check in REGISTRY:
        assert check.codes, f"{check.__name__} owns no codes"
        assert not seen & set(check.codes)
        seen |= set(check.codes)
    assert all(code[0] in "EW" and len(code) == 4 for code in CODES)
    assert all(summary for summary in CODES.values())


def test_checks_never_mutate_the_program():
    program = program_of(IMAGE_CHAT)
    before = (dict(program.roles), dict(program.fields), list(program.declarations))
    from flowc.check.registry import run_checks

    assert list(run_checks(program)) == []
    assert (dict(program.roles), dict(program.fields), list(program.declarations)) == before
