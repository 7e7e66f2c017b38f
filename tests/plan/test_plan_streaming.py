"""The plan of a graph with a streaming entry (`placeholder stream`, docs/plan.md): the graph
lists it under `entry_stream`, its placeholder node streams, and its consumers are planned as
those of an `out stream` field; pinned in golden/test_plan_streaming/."""

from __future__ import annotations

import json

import jsonschema
import pytest

from flowc.check import check_file
from flowc.plan import build_plan, pictures
from flowc.plan.text import plan_text
from tests.conftest import REPO, display
from tests.plan.test_plan import example, slots
from tests.plan.test_plan_outputs import SCHEMA

DUPLEX = REPO / "tests" / "data" / "streaming" / "duplex.flow"


@pytest.fixture(scope="module")
def plan():
    result = check_file(DUPLEX, display(DUPLEX))
    assert result.ok and result.diagnostics == [], [d.message for d in result.diagnostics]
    return build_plan(result.program)


def test_the_graph_lists_its_streaming_entries_and_their_nodes_stream(plan):
    talk = plan.graphs["talk"]
    assert talk.entry == ("audio_in", "voice")
    assert talk.entry_stream == ("audio_in",)
    assert talk.nodes["$audio_in"].stream and not talk.nodes["$voice"].stream
    # a graph without one lists none
    assert all(graph.entry_stream == () for graph in example("image_chat").graphs.values())


def test_its_consumers_are_planned_as_a_stream_producers(plan):
    nodes = plan.graphs["talk"].nodes
    # alone in its group: direct, one activation per frame (Rule A), not a stream slot
    (hear,) = nodes["listener.hear"].groups
    assert (hear.routing, slots(hear)) == ("direct", [("$audio_in", "audio_in", True, False)])
    # with another entry, under the call's start: a stream slot, a list at the end of the input
    (mix,) = nodes["mixer.mix"].groups
    assert (mix.routing, mix.root) == ("bucket", "@talk")
    assert slots(mix) == [("$audio_in", "audio_in", True, True), ("$voice", "voice", True, False)]
    # a count join counts its frames; an `all` join downstream waits for the end of the input too
    assert [(j.field, j.threshold) for j in nodes["sampler.keep"].join] == [("audio_in", 2)]
    assert [(j.field, j.threshold, j.upstream) for j in nodes["counter.count"].join] == [
        ("heard", None, ("$audio_in", "listener.hear"))
    ]
    control = {(t.node, t.aid_rule, t.root) for t in nodes["$audio_in"].control["audio_in"]}
    assert control == {("listener.hear", "A", None), ("mixer.mix", "C", "@talk"), ("sampler.keep", "join", None)}
    # each frame has a key of its own: what is ordered after it has no ties
    assert [(o.field, o.key_ties) for o in plan.graphs["talk"].outputs if o.ordered] == [("heard", ())]


def test_the_json_plan_matches_the_schema_and_is_pinned(plan, golden):
    data = plan.as_json()
    jsonschema.validate(data, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert data["graphs"]["talk"]["entry_stream"] == ["audio_in"]
    assert json.dumps(data, indent=2, sort_keys=True) + "\n" == golden
    del data["graphs"]["talk"]["entry_stream"]
    with pytest.raises(jsonschema.ValidationError, match="entry_stream"):
        jsonschema.validate(data, SCHEMA, cls=jsonschema.Draft202012Validator)


def test_the_text_plan_and_the_pictures_mark_the_streaming_entry(plan, golden):
    text = plan_text(plan)
    assert "graph talk (entry audio_in [stream], voice)" in text
    assert text == golden
    talk = plan.graphs["talk"]
    assert 'ph_audio_in[/"audio_in<br/>stream"/]' in pictures.mermaid(talk)
    assert 'ph_voice[/"voice"/]' in pictures.mermaid(talk)
    assert 'ph_audio_in [label="audio_in\\nstream", shape=parallelogram];' in pictures.dot(talk)
