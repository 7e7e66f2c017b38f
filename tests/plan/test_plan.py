"""The static plan on the paper's cases, with the reason each value is right."""

from __future__ import annotations

import pytest

from flowc.check import check_source
from flowc.plan import build_plan
from tests.conftest import REPO


def plan_of(text: str, name: str = "t.flow"):
    result = check_source(text, name)
    assert result.ok, [f"{d.code} {d.message}" for d in result.diagnostics]
    return build_plan(result.program)


def example(name: str):
    return plan_of((REPO / f"examples/{name}/pipeline.flow").read_text())


def slots(group):
    return [(s.producer, s.field, s.critical, s.stream) for s in group.slots]


def test_fig3_image_chat():
    chat = example("image_chat").graphs["chat"]
    llm = chat.nodes["llm.generate"]
    # Group 0 (`txt_emb`) has one direct predecessor, embed.encode: no bucket, one activation per frame.
    assert llm.groups[0].routing == "direct"
    # Group 1 (`vit_emb & vae_lat`) converges from vit.encode and vae.encode: a bucket. Both paths
    # leave frontend.parse with the same image segment, so frontend.parse (the fork source every
    # path passes through) is the diamond root: both halves of one segment meet in one bucket.
    assert llm.groups[1].routing == "bucket"
    assert llm.groups[1].root == "frontend.parse"
    # Each field has exactly one upstream path, so each slot is critical: if the VAE path of a
    # segment is unreachable the AND can never hold and the bucket is DEAD at once.
    assert slots(llm.groups[1]) == [("vit.encode", "vit_emb", True, False), ("vae.encode", "vae_lat", True, False)]
    # The edges into the bucket use Rule C seeded from the root; the encoders themselves have no
    # bucket, so frontend.parse's edges to them use Rule A (each segment its own activation).
    assert [(t.node, t.aid_rule, t.root) for t in chat.nodes["vit.encode"].control["vit_emb"]] == [
        ("dit.denoise", "join", None),
        ("llm.generate", "C", "frontend.parse"),
    ]
    assert {t.aid_rule for targets in chat.nodes["frontend.parse"].control.values() for t in targets} == {"A"}
    assert chat.nodes["frontend.parse"].diamond_root
    assert [n for n, node in chat.nodes.items() if node.diamond_root] == ["frontend.parse"]
    # dit.denoise is a count join: one bucket per call. `all` of vit_emb completes when the path
    # that can produce it (request -> frontend.parse -> vit.encode) has ended for the call.
    denoise = chat.nodes["dit.denoise"]
    assert denoise.groups[0].routing == "join"
    assert [(j.field, j.threshold, j.upstream) for j in denoise.join] == [
        ("hidden", 1, ()),
        ("vit_emb", None, ("$request", "frontend.parse", "vit.encode")),
        ("vae_lat", None, ("$request", "frontend.parse", "vae.encode")),
    ]
    # llm is `lb session`: it runs in key order and numbers its frames afresh; nothing on the way
    # lets two token frames share a key, so the ordered token stream is totally ordered
    assert llm.session and llm.key_ties == ()
    (token,) = [o for o in chat.outputs if o.field == "token"]
    assert token.ordered and token.key_ties == ()
    assert chat.sccs == () and chat.back_edges == () and chat.unreachable == ()


CASE = """
placeholder request: Json

role root {{
    impl "m:Root"
    interface fork {{
        in  request
        out {root_stream}x: Json
    }}
}}

role a {{
    impl "m:A"
    interface run {{
        in  x
        out {mid_stream}fa: Tensor
    }}
}}

role b {{
    impl "m:B"
    interface run {{ in x  out fb: Tensor }}
}}

role sink {{
    impl "m:Sink"
    lb session
    interface meet {{
        in  fa & fb
        out result: Json
    }}
}}

graph g {{
    entry  request
    stream result ordered
}}
"""


def case(root_stream: bool, mid_stream: bool):
    text = CASE.format(root_stream="stream " if root_stream else "", mid_stream="stream " if mid_stream else "")
    return plan_of(text).graphs["g"]


def test_appendix_a_case_1_multi_frame_root_single_frame_intermediates():
    g = case(root_stream=True, mid_stream=False)
    meet = g.nodes["sink.meet"].groups[0]
    # root.fork is the diamond root; each of its K yields seeds a different aid (Rule C with the
    # root's yield index), so the sink splits into K buckets, one per root frame. The
    # intermediates yield once, so no slot accumulates.
    assert (meet.routing, meet.root) == ("bucket", "root.fork")
    assert slots(meet) == [("a.run", "fa", True, False), ("b.run", "fb", True, False)]
    assert g.nodes["root.fork"].diamond_root
    # sink is a session node: the K buckets are released in the root's order.
    assert g.nodes["sink.meet"].session


def test_appendix_a_case_2_single_frame_root_multi_frame_intermediate():
    g = case(root_stream=False, mid_stream=True)
    meet = g.nodes["sink.meet"].groups[0]
    # The root yields once, so every one of a.run's M frames carries the same root entry and
    # the same aid: all M accumulate in one bucket, delivered in order as a list at a.run's end
    # of stream (a stream slot). b.run yields once: an ordinary slot.
    assert (meet.routing, meet.root) == ("bucket", "root.fork")
    assert slots(meet) == [("a.run", "fa", True, True), ("b.run", "fb", True, False)]


def test_appendix_a_case_3_multi_frame_root_and_intermediate():
    g = case(root_stream=True, mid_stream=True)
    meet = g.nodes["sink.meet"].groups[0]
    # Both layers at once: the root's yield index picks the outer bucket (one per root frame)
    # and a.run's frames for that root frame accumulate inside it as a list.
    assert (meet.routing, meet.root) == ("bucket", "root.fork")
    assert slots(meet) == [("a.run", "fa", True, True), ("b.run", "fb", True, False)]
    assert [(t.node, t.aid_rule, t.root) for t in g.nodes["a.run"].control["fa"]] == [("sink.meet", "C", "root.fork")]


NESTED = """
placeholder request: Json

role r {
    impl "m:R"
    interface fork {
        in  request
        out stream x: Json
    }
}

role p {
    impl "m:P"
    interface fork {
        in  x
        out y: Json
    }
}

role p1 {
    impl "m:P1"
    interface run { in y  out y1: Json }
}

role p2 {
    impl "m:P2"
    interface run { in y  out y2: Json }
}

role m {
    impl "m:M"
    interface meet {
        in  y1 & y2
        out inner: Json
    }
}

role q {
    impl "m:Q"
    interface run { in x  out side: Json }
}

role s {
    impl "m:S"
    interface meet {
        in  inner & side
        out result: Json
    }
}

role t {
    impl "m:T"
    interface meet {
        in  x & result
        out final: Json
    }
}

graph g {
    entry  request
    return final
}
"""


def test_nested_diamonds_have_one_root_per_level():
    g = plan_of(NESTED).graphs["g"]
    # Inner diamond p -> {p1, p2} -> m: its root is p. Outer diamond r -> {p..m, q} -> s: its
    # root is r, which both m and q are reached through.
    assert g.nodes["m.meet"].groups[0].root == "p.fork"
    assert g.nodes["s.meet"].groups[0].root == "r.fork"
    # t.meet takes x straight from r and result through s: r is a predecessor and dominates
    # the other, so r is the root of this triangle and its direct slot is not a stream slot
    # (each of r's frames is its own bucket).
    assert g.nodes["t.meet"].groups[0].root == "r.fork"
    assert slots(g.nodes["t.meet"].groups[0])[0] == ("r.fork", "x", True, False)
    # Messages between p and m carry both levels' entries, outermost first; after m only the
    # outer root is still needed (by s), and after s and t none is; q is not under p.
    assert g.nodes["p1.run"].carried_roots == ("r.fork", "p.fork")
    assert g.nodes["p.fork"].carried_roots == ("r.fork", "p.fork")
    assert g.nodes["m.meet"].carried_roots == ("r.fork",)
    assert g.nodes["q.run"].carried_roots == ("r.fork",)
    assert g.nodes["t.meet"].carried_roots == ()
    assert {n for n, node in g.nodes.items() if node.diamond_root} == {"r.fork", "p.fork"}


def test_loop_components_back_edges_and_dedup():
    ask = example("agent_loop").graphs["ask"]
    assert ask.sccs == (("agent.think", "tools.run"),)
    assert ask.back_edges == (("tools.run", "agent.think", "observation"),)
    assert ask.nodes["agent.think"].in_cycle and ask.nodes["tools.run"].in_cycle
    assert not ask.nodes["$question"].in_cycle
    think = ask.nodes["agent.think"]
    assert [(g.routing, g.fields) for g in think.groups] == [("direct", ("question",)), ("direct", ("observation",))]


def test_count_join_with_unknown_fan_in():
    paint = example("count_join").graphs["paint"]
    join = paint.nodes["painter.paint"]
    assert join.groups[0].routing == "join"
    (prompt, condition) = join.join
    assert (prompt.threshold, condition.threshold) == (1, None)
    assert condition.upstream == ("$request", "encoder.encode", "reader.read")
    assert {t.aid_rule for t in paint.nodes["encoder.encode"].control["condition"]} == {"join"}


def test_diamond_example_buckets_per_frame():
    describe = example("diamond").graphs["describe"]
    combine = describe.nodes["fuse.combine"].groups[0]
    assert (combine.routing, combine.root) == ("bucket", "split.frames")
    assert slots(combine) == [("color.encode", "color_feat", True, False), ("shape.encode", "shape_feat", True, False)]


def test_order_through_a_session_node():
    write = example("ordered_stream").graphs["write"]
    # stylist runs out of order on four replicas, but each frame keeps writer's key;
    # editor runs in key order and numbers afresh: no two lines share a key
    assert write.nodes["stylist.style"].key_ties == ()
    assert write.nodes["editor.edit"].key_ties == ()
    (line,) = write.outputs
    assert line.ordered and line.key_ties == ()
    assert write.timeout_s == 30.0


MULTI = """
placeholder text: Text
placeholder image: Image

role enc {
    impl "m:Enc"
    interface text { in text  out t: Tensor }
    interface image { in image  out i: Tensor }
}

role llm {
    impl "m:Llm"
    interface gen {
        in  t | t & i
        out answer: Text
    }
}

graph chat {
    entry  text
    return answer
}

graph vision {
    entry  text, image
    return answer
}
"""


def test_plans_are_per_graph():
    plan = plan_of(MULTI)
    chat, vision = plan.graphs["chat"], plan.graphs["vision"]
    # In `chat` no image is ever given: the second group can never fire there (it fires in
    # `vision`, so this is no error) and enc.image never runs.
    assert [g.routing for g in chat.nodes["llm.gen"].groups] == ["direct", "dead"]
    assert chat.nodes["llm.gen"].groups[1].missing == ("i",)
    assert chat.unreachable == ("enc.image",)
    assert [g.routing for g in vision.nodes["llm.gen"].groups] == ["direct", "bucket"]
    assert vision.nodes["llm.gen"].groups[1].root == "@vision"
    assert [t.node for t in chat.nodes["enc.text"].control["t"]] == ["llm.gen"]


def test_several_producers_give_non_critical_slots():
    text = """
placeholder request: Json

role a {
    impl "m:A"
    interface run { in request  out x: Json }
}

role b {
    impl "m:B"
    interface run { in request  out x: Json }
}

role c {
    impl "m:C"
    interface run { in request  out y: Json }
}

role sink {
    impl "m:Sink"
    interface meet {
        in  x & y
        out result: Json
    }
}

graph g {
    entry  request
    return result
}
"""
    meet = plan_of(text).graphs["g"].nodes["sink.meet"].groups[0]
    # x arrives on two paths: either may be unreachable without killing the bucket; y has one.
    assert slots(meet) == [("a.run", "x", False, False), ("b.run", "x", False, False), ("c.run", "y", True, False)]
    assert meet.root == "$request"


def test_from_restriction_limits_slots():
    text = """
placeholder request: Json

role a {
    impl "m:A"
    interface run { in request  out x: Json }
}

role b {
    impl "m:B"
    interface run { in request  out x: Json }
}

role sink {
    impl "m:Sink"
    interface take { in x from b.run  out result: Json }
}

graph g {
    entry  request
    return result
}
"""
    take = plan_of(text).graphs["g"].nodes["sink.take"].groups[0]
    assert (take.routing, slots(take)) == ("direct", [("b.run", "x", True, False)])


SHARED_ENTRY = """
placeholder request: Json

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


def test_a_graph_plans_only_the_roles_its_outputs_need():
    plan = plan_of(SHARED_ENTRY)
    talk, wait = plan.graphs["talk"], plan.graphs["wait"]
    # `talk`'s entry reaches `listen` too, but nothing `talk` returns depends on it
    assert sorted(talk.nodes) == ["$request", "@talk", "echo.run"]
    assert [t.node for t in talk.nodes["$request"].control["request"]] == ["echo.run"]
    assert talk.unreachable == ("listen.run",)
    assert sorted(wait.nodes) == ["$request", "@wait", "listen.run"]
    assert wait.unreachable == ("echo.run",)


FEEDERS = """
placeholder request: Json
placeholder extra: Json

role split {
    impl "m:Split"
    interface run { in request  out left: Json, right: Json, aside: Json }
}

role left {
    impl "m:Left"
    interface run { in left  out l: Json }
}

role right {
    impl "m:Right"
    interface run { in right  out stream r: Json }
}

role pair {
    impl "m:Pair"
    interface run { in l & left  out paired: Json }
}

role gather {
    impl "m:Gather"
    interface run {
        join { paired: 1, r: all }
        out result: Json
    }
}

role side {
    impl "m:Side"
    interface run { in aside  out noted: Json }
}

role late {
    impl "m:Late"
    interface run { in noted | noted & extra  out later: Json }
}

role helper {
    impl "m:Helper"
    interface run { in request  out hint: Json }
}

role answer {
    impl "m:Answer"
    interface run { in result | hint & extra  out final: Json }
}

graph main {
    entry  request
    return final
}

graph full {
    entry  request, extra
    return final, later
}
"""


def test_feeders_of_contributing_buckets_and_joins_contribute():
    plan = plan_of(FEEDERS)
    main = plan.graphs["main"]
    # every producer feeding a contributing bucket or join is kept, with the same slots and
    # `all` upstream set as when nothing is pruned; `side`/`late` feed no output of `main`, and
    # `helper` feeds only `hint & extra`, which cannot fire without `extra`
    assert sorted(main.nodes) == [
        "$request", "@main", "answer.run", "gather.run", "left.run", "pair.run", "right.run", "split.run",
    ]  # fmt: skip
    assert main.unreachable == ("helper.run", "late.run", "side.run")
    pair = main.nodes["pair.run"].groups[0]
    assert (pair.routing, pair.root) == ("bucket", "split.run")
    assert sorted(s.producer for s in pair.slots) == ["left.run", "split.run"]
    (paired, r) = main.nodes["gather.run"].join
    assert r.upstream == ("$request", "right.run", "split.run")
    assert [g.routing for g in main.nodes["answer.run"].groups] == ["direct", "dead"]
    assert main.nodes["answer.run"].groups[1].missing == ("extra",)
    assert set(main.nodes["split.run"].control) == {"aside", "left", "right"}
    assert main.nodes["split.run"].control["aside"] == ()
    # every control target and every node an `all` waits for is in the plan
    for node in main.nodes.values():
        for targets in node.control.values():
            assert all(t.node == "caller" or t.node in main.nodes for t in targets)
        for join in node.join or ():
            assert set(join.upstream) <= set(main.nodes)
    # where both graphs need them, the same roles are all there
    full = plan.graphs["full"]
    assert {"side.run", "late.run", "helper.run"} <= set(full.nodes)
    assert full.nodes["pair.run"].groups == main.nodes["pair.run"].groups


FANOUT = """
placeholder request: Json

role splitter {
    impl "m:Splitter"
    interface split { in request  out stream piece: Json }
}

role talker {
    impl "m:Talker"
    replicas 4
    interface talk { in piece  out stream token: Text }
}

graph g {
    entry  request
    stream token ordered
}
"""


def test_an_ordered_stream_through_streaming_hops_and_replicas_has_no_key_ties():
    # keys gain a level per streaming hop, so (part, piece) orders every token whatever the replicas
    result = check_source(FANOUT, "fanout.flow")
    assert result.ok and not [d for d in result.diagnostics if d.code == "W206"]
    (token,) = build_plan(result.program).graphs["g"].outputs
    assert token.ordered and token.key_ties == ()


@pytest.mark.parametrize(
    ("name", "ties", "words"),
    [
        ("W206_ordered_stream_from_two_producers", ("critic.review", "poet.write"), "it has 2 producers"),
        ("W206_ordered_stream_through_or_groups", ("describer.describe",), "runs once per OR group"),
        ("W206_ordered_stream_out_of_a_loop", ("agent.think",), "is in a loop"),
    ],
)
def test_where_keys_may_tie_the_plan_says_so_and_check_warns(name, ties, words):
    path = REPO / "tests" / "invalid" / f"{name}.flow"
    result = check_source(path.read_text(), path.name)
    (output,) = [o for o in build_plan(result.program).graphs["g"].outputs if o.ordered]
    assert output.key_ties == ties
    (warning,) = [d for d in result.diagnostics if d.code == "W206"]
    assert words in warning.message and "arrival order" in warning.message
