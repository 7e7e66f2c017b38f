"""Streaming entries (`placeholder stream NAME: T`, docs/language.md): the model and the IR know
the placeholder streams, and the checks treat it as they treat a field of an `out stream`."""

from __future__ import annotations

import pytest

from flowc.check import check_file, check_source
from flowc.check.endpoints import endpoints_of
from flowc.ir import graph_irs
from tests.conftest import REPO

DUPLEX = REPO / "tests" / "data" / "streaming" / "duplex.flow"

# one topology written twice: the stream comes from the caller, or from an `out stream`
BY_ENTRY = """\
placeholder stream audio: Audio
placeholder voice: Text
{meet}
graph talk {{
    entry  audio, voice
    stream speech
}}
"""
BY_PRODUCER = """\
placeholder request: Json
placeholder voice: Text

role mic {{
    impl "m:Mic"
    interface listen {{
        in  request
        out stream audio: Audio
    }}
}}
{meet}
graph talk {{
    entry  request, voice
    stream speech
}}
"""
# how the stream meets `voice`, another entry, under the call's start
MEETINGS = {
    "per frame, then a bucket": """
role ear {
    impl "m:Ear"
    interface hear { in audio  out heard: Text }
}

role speaker {
    impl "m:Speaker"
    interface speak { in heard & voice  out speech: Audio }
}
""",
    "a stream slot": """
role speaker {
    impl "m:Speaker"
    interface speak { in audio & voice  out speech: Audio }
}
""",
    "a count join": """
role speaker {
    impl "m:Speaker"
    interface speak {
        join { audio: 3, voice: 1 }
        out speech: Audio
    }
}
""",
}


def codes(text: str) -> list[tuple[str, int]]:
    """Each diagnostic's code and the line of the role it is in (the two texts differ above it)."""
    result = check_source(text, "t.flow")
    lines = text.splitlines()
    return [(d.code, lines[d.span.line - 1].strip()) for d in result.diagnostics]


def test_the_model_and_the_ir_know_which_placeholder_streams():
    result = check_file(DUPLEX)
    assert result.ok and result.diagnostics == [], [d.message for d in result.diagnostics]
    program = result.program
    assert program.placeholders["audio_in"].stream and not program.placeholders["voice"].stream
    ir = graph_irs(program)["talk"]
    assert ir.nodes["$audio_in"].stream and not ir.nodes["$voice"].stream
    assert ir.nodes["$audio_in"].span == program.placeholders["audio_in"].name.span


@pytest.mark.parametrize("meeting", MEETINGS, ids=list(MEETINGS))
def test_a_streaming_entry_gets_the_diagnostics_of_a_stream_producer(meeting):
    by_entry = codes(BY_ENTRY.format(meet=MEETINGS[meeting]))
    by_producer = codes(BY_PRODUCER.format(meet=MEETINGS[meeting]))
    assert by_entry == by_producer
    # a stream slot and a count join take the frames as they come; per-frame work meeting
    # another entry in a bucket cannot be told apart (E209, the same for both)
    expected = [("E209", "interface speak { in heard & voice  out speech: Audio }")] if meeting.startswith("per frame") else []
    assert by_entry == expected


ENDPOINT_OUTPUTS = {"chat": "Text", "images": "Image", "speech": "Audio", "embeddings": "Tensor"}


@pytest.mark.parametrize("endpoint", ENDPOINT_OUTPUTS)
def test_an_openai_endpoint_cannot_fill_a_streaming_entry(endpoint):
    text = f"""\
placeholder stream prompt: Text

role maker {{
    impl "m:Maker"
    interface make {{ in prompt  out made: {ENDPOINT_OUTPUTS[endpoint]} }}
}}

graph g {{
    entry  prompt
    return made
    serves {endpoint}
}}
"""
    result = check_source(text, "t.flow")
    (diagnostic,) = result.diagnostics
    assert diagnostic.code == "E177"
    assert "its entry `prompt` streams (`placeholder stream`)" in diagnostic.message
    assert text[diagnostic.span.start : diagnostic.span.end] == endpoint
    assert diagnostic.hint == (
        f"remove `stream` from `placeholder prompt` if one value is its whole input, or take `{endpoint}` out of `serves`"
    )
    assert check_source(text.replace("placeholder stream", "placeholder"), "t.flow").diagnostics == []


def test_a_graph_with_a_streaming_entry_is_not_served_as_a_chat_model_by_default():
    text = 'placeholder stream prompt: Text\nrole w {\n    impl "m:W"\n    interface w { in prompt  out answer: Text }\n}\n'
    text += "graph chat {\n    entry  prompt\n    stream answer\n}\n"
    for source, served in ((text, {}), (text.replace("placeholder stream", "placeholder"), {"chat": {"text": "answer"}})):
        result = check_source(source, "t.flow")
        assert result.diagnostics == []
        assert endpoints_of(result.program, result.program.graphs["chat"]) == served


def test_a_streaming_placeholder_no_graph_enters_is_reported_as_any_placeholder():
    # placeholders are also read by `in`; one that is no graph's entry feeds roles that never run
    # (W205), streaming or not: `stream` needs no diagnostic of its own there
    text = (
        'placeholder stream mic: Audio\nplaceholder p: Text\nrole w {\n    impl "m:W"\n    interface w { in p  out a: Text }\n}\n'
    )
    text += 'role ear {\n    impl "m:E"\n    interface hear { in mic  out heard: Text }\n}\n'
    text += "graph g {\n    entry  p\n    return a\n}\n"
    assert codes(text) == codes(text.replace("placeholder stream", "placeholder"))
    assert [c for c, _ in codes(text)] == ["W205", "W143"]
