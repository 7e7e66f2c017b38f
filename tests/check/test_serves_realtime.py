"""`serves realtime` (flowc.check.endpoints; docs/openai.md, "Realtime"): a graph served at
/v1/realtime takes the client's audio in one streaming `Audio` entry and may take one more entry
(the session's instructions or settings); it needs a Text output, and reads an Audio one if it
has one. What the compiler decides is recorded in bundle.json (`graphs.G.endpoints.realtime`),
which is all the server reads."""

from __future__ import annotations

import json

import pytest

from flowc.check import check_source
from flowc.check.endpoints import endpoints_of
from tests.runtime.harness import bundle_of

FLOW = """\
placeholder stream audio_in: Audio
placeholder settings: Json

role ear {
    impl "m:Ear"
    interface hear { in audio_in  out stream heard: Json }
}

role voice {
    impl "m:Voice"
    interface reply { join { heard: all, settings: 1 }  out stream text: Text, speech: Audio }
}

graph talk {
    entry  audio_in, settings
    stream text ordered
    stream speech ordered
    serves realtime
}
"""


def test_a_voice_graph_serves_realtime_and_the_bundle_records_its_fields(tmp_path):
    result = check_source(FLOW, "t.flow")
    assert result.diagnostics == []
    want = {"realtime": {"audio": "speech", "input": "audio_in", "session": "settings", "text": "text"}}
    assert endpoints_of(result.program, result.program.graphs["talk"]) == want
    manifest = json.loads((bundle_of(FLOW, tmp_path) / "bundle.json").read_text())
    assert manifest["graphs"]["talk"]["endpoints"] == want


def test_the_session_entry_and_the_audio_output_are_optional():
    text = FLOW.replace("placeholder settings: Json\n", "").replace("join { heard: all, settings: 1 }", "join { heard: all }")
    text = text.replace("entry  audio_in, settings", "entry  audio_in").replace("text: Text, speech: Audio", "text: Text")
    text = text.replace("    stream speech ordered\n", "")
    result = check_source(text, "t.flow")
    assert result.diagnostics == []
    assert endpoints_of(result.program, result.program.graphs["talk"]) == {"realtime": {"input": "audio_in", "text": "text"}}


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        (("stream audio_in: Audio", "stream audio_in: Text"), "E177", ["one streaming `Audio` entry", "audio_in: Text"]),
        (("placeholder stream audio_in", "placeholder audio_in"), "E177", ["one streaming `Audio` entry", "none"]),
        (("placeholder settings: Json", "placeholder settings: Image"), "E177", ["`settings` is `Image`", "(`Json`)"]),
        (("text: Text, speech: Audio", "speech: Audio"), "E178", ["no `Text` output"]),
    ],
)
def test_a_graph_that_cannot_serve_realtime_is_told_why_and_how_to_fix_it(change, code, words):
    text = FLOW.replace(*change)
    if code == "E178":
        text = text.replace("    stream text ordered\n", "")
    result = check_source(text, "t.flow")
    (diagnostic,) = [d for d in result.diagnostics if d.code in ("E177", "E178")]
    assert diagnostic.code == code
    assert diagnostic.message.startswith("graph `talk` serves `realtime` (/v1/realtime), but ")
    for word in words:
        assert word in diagnostic.message, diagnostic.message
    assert "take `realtime` out of `serves`" in diagnostic.hint
    assert text[diagnostic.span.start : diagnostic.span.end] == "realtime"


def test_two_entries_besides_the_audio_are_one_too_many():
    text = FLOW.replace("placeholder settings: Json\n", "placeholder settings: Json\nplaceholder voice: Text\n")
    text = text.replace("join { heard: all, settings: 1 }", "join { heard: all, settings: 1, voice: 1 }")
    text = text.replace("entry  audio_in, settings", "entry  audio_in, settings, voice")
    (diagnostic,) = check_source(text, "t.flow").diagnostics
    assert diagnostic.code == "E177" and "2 entry values besides its audio (settings, voice)" in diagnostic.message
