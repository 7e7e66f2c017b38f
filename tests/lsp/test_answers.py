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
