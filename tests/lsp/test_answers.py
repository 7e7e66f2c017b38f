"""The language server's answers computed directly from a checked program (no protocol)."""

from __future__ import annotations

import pytest

from flowc.check import check_file
from flowc.lsp import answers
from flowc.lsp.index import Kind, at, occurrences
from tests.conftest import REPO

IMAGE_CHAT = REPO / "examples" / "image_chat" / "pipeline.flow"


@pytest.fixture(scope="module")
def program():
    result = check_file(IMAGE_CHAT)
    assert result.ok
    return result.program


@pytest.mark.parametrize(
    ("before_cursor", "expected"),
    [
        ("        in  image_seg from vae.", ["encode", "decode"]),
        ("    uses ", ["kv"]),
        ("    lb ", ["round_robin", "session", "broadcast", "load_aware"]),
        ("    share gpus with ", ["dit", "embed", "frontend", "llm", "vae", "vit"]),
    ],
)
def test_completion_by_context(program, before_cursor, expected):
    assert [c.label for c in answers.completions(program, before_cursor)] == expected


def test_completion_after_a_colon_offers_types(program):
    labels = [c.label for c in answers.completions(program, "        out mask: ")]
    assert labels[:3] == ["Json", "Text", "Tokens"] and "Image" in labels
    assert "llm" not in labels


def test_every_name_in_the_example_is_indexed(program):
    text = IMAGE_CHAT.read_text(encoding="utf-8")
    found = occurrences(program.root.ast)
    kinds = {(o.kind, o.name) for o in found}
    assert (Kind.ROLE, "llm") in kinds and (Kind.POLICY, "session") in kinds and (Kind.GLOBAL, "kv") in kinds
    latent_use = text.index("in latent") + 3
    hit = at(found, latent_use)
    assert hit is not None and (hit.kind, hit.name, hit.declares) == (Kind.FIELD, "latent", False)
    (producer,) = answers.definition(program, hit)
    assert text[producer.start : producer.end] == "latent" and producer.start > text.index("out latent")


def test_hover_on_a_setting_explains_it(program):
    found = occurrences(program.root.ast)
    text = IMAGE_CHAT.read_text(encoding="utf-8")
    replicas = at(found, text.index("replicas 2") + 1)
    assert answers.hover(program, replicas) == "`replicas`: number of replicas.\n\nTakes a whole number, 1 to 1024."


DUPLEX = REPO / "tests" / "data" / "streaming" / "duplex.flow"


@pytest.fixture(scope="module")
def duplex():
    result = check_file(DUPLEX)
    assert result.ok
    return result.program


@pytest.mark.parametrize(
    "place",
    ["placeholder stream audio_in", "in  audio_in", "join { audio_in", "entry  audio_in"],
    ids=["declared", "in", "join", "entry"],
)
def test_hover_says_a_placeholder_streams_wherever_it_appears(duplex, place):
    text = DUPLEX.read_text(encoding="utf-8")
    hit = at(occurrences(duplex.root.ast), text.index(place) + len(place) - 1)
    assert hit is not None and (hit.kind, hit.name) == (Kind.FIELD, "audio_in")
    hover = answers.hover(duplex, hit)
    assert "A streaming placeholder: its values are given as frames while a graph call runs" in hover
    assert "**Entry of** `talk`" in hover
    voice = at(occurrences(duplex.root.ast), text.index("placeholder voice") + len("placeholder v"))
    assert "A placeholder: its value is given when a graph is called." in answers.hover(duplex, voice)


def test_hover_on_a_graph_names_its_streaming_entries(duplex):
    text = DUPLEX.read_text(encoding="utf-8")
    graph = at(occurrences(duplex.root.ast), text.index("graph talk") + len("graph t"))
    hover = answers.hover(duplex, graph)
    assert hover.startswith("```flow\ngraph talk { entry audio_in, voice ")
    assert hover.endswith("**Streaming entry** `audio_in`: frames given while the call runs.")


def test_completion_after_placeholder_offers_stream_then_a_new_name(duplex):
    assert [(c.label, c.kind) for c in answers.completions(duplex, "placeholder ")] == [("stream", "keyword")]
    assert [c.label for c in answers.completions(duplex, "placeholder str")] == ["stream"]
    assert answers.completions(duplex, "placeholder stream ") == []  # a new name: nothing to offer
    assert "Audio" in [c.label for c in answers.completions(duplex, "placeholder stream mic: ")]
    assert "placeholder" in [c.label for c in answers.completions(duplex, "place")]


def test_document_symbols_mark_a_streaming_placeholder(duplex):
    details = {s.name: s.detail for s in answers.symbols(duplex.root.ast) if s.kind == "field"}
    assert details == {"audio_in": "placeholder stream Audio", "voice": "placeholder Text"}
