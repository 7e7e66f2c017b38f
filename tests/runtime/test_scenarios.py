"""Every guarantee of DESIGN §4, each shown by a scenario on the real runtime; after each call
nothing is left (buckets, joins, queues, tasks, sessions)."""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.runtime.harness import assert_clean, collect, done, jitter, open_runtime, returned, streamed, where_in


def run(coro):
    return asyncio.run(coro)


DIAMOND = """
placeholder clip: Json

role root {
    impl "m:Root"
    interface fork {
        in  clip
        out {root_stream}x: Json
    }
}

role a {
    impl "m:A"
    replicas 3
    interface run {
        in  x
        out {mid_stream}fa: Json
    }
}

role b {
    impl "m:B"
    interface run { in x  out fb: Json }
}

role sink {
    impl "m:Sink"
    interface meet {
        in  fa & fb
        out met: Json
    }
}

graph g {
    entry  clip
    stream met
}
"""


class Root:
    def __init__(self, stream: bool):
        self.stream = stream

    async def fork(self, ctx, clip):
        if self.stream:
            for i in range(clip["frames"]):
                yield {"x": i}
        else:
            yield {"x": 0}


class Mid:
    def __init__(self, rng, per_frame: int | None):
        self.rng, self.per_frame = rng, per_frame

    async def run(self, ctx, x):
        if self.per_frame is None:
            await jitter(self.rng)
            yield {"fa": ("a", x)}
        else:
            for j in range(self.per_frame):
                await jitter(self.rng)
                yield {"fa": ("a", x, j)}


class B:
    def __init__(self, rng, fail_on=None):
        self.rng, self.fail_on = rng, fail_on

    async def run(self, ctx, x):
        await jitter(self.rng)
        if x == self.fail_on:
            raise ValueError(f"b cannot handle frame {x}")
        return {"fb": ("b", x)}


class Sink:
    def __init__(self):
        self.seen = []

    async def meet(self, ctx, fa, fb):
        self.seen.append((fa, fb))
        return {"met": [fa, fb]}


def diamond(root_stream: bool, mid_stream: bool) -> str:
    return DIAMOND.replace("{root_stream}", "stream " if root_stream else "").replace(
        "{mid_stream}", "stream " if mid_stream else ""
    )


def test_diamond_with_multi_frame_root(tmp_path):
    async def main():
        rng = random.Random(1)
        sink = Sink()
        rt = await open_runtime(
            diamond(True, False),
            tmp_path,
            {"root": Root(True), "a": [Mid(rng, None) for _ in range(3)], "b": B(rng), "sink": sink},
        )
        events = await collect(rt, "g", {"clip": {"frames": 20}})
        assert done(events)["status"] == "ok"
        # one bucket per root frame: both halves of frame i meet, never halves of different frames
        assert sorted(sink.seen) == [(("a", i), ("b", i)) for i in range(20)]
        assert_clean(rt)

    run(main())


def test_intermediate_multi_frame_accumulates_in_order(tmp_path):
    async def main():
        rng = random.Random(2)
        sink = Sink()
        rt = await open_runtime(
            diamond(False, True), tmp_path, {"root": Root(False), "a": [Mid(rng, 7) for _ in range(3)], "b": B(rng), "sink": sink}
        )
        events = await collect(rt, "g", {"clip": {}})
        assert done(events)["status"] == "ok"
        # Case 2: a single root frame, seven frames of `a` arrive as one list, in production order
        assert sink.seen == [([("a", 0, j) for j in range(7)], ("b", 0))]
        assert_clean(rt)

    run(main())


def test_both_nested_multi_frame(tmp_path):
    async def main():
        rng = random.Random(3)
        sink = Sink()
        rt = await open_runtime(
            diamond(True, True), tmp_path, {"root": Root(True), "a": [Mid(rng, 4) for _ in range(3)], "b": B(rng), "sink": sink}
        )
        events = await collect(rt, "g", {"clip": {"frames": 6}})
        assert done(events)["status"] == "ok"
        # Case 3: one bucket per root frame, each accumulating that frame's four `a` frames
        assert sorted(sink.seen) == [([("a", i, j) for j in range(4)], ("b", i)) for i in range(6)]
        assert_clean(rt)

    run(main())


def test_critical_slot_dead_propagates(tmp_path):
    async def main():
        rng = random.Random(4)
        sink = Sink()
        rt = await open_runtime(
            diamond(True, False),
            tmp_path,
            {"root": Root(True), "a": [Mid(rng, None) for _ in range(3)], "b": B(rng, fail_on=2), "sink": sink},
        )
        events = await collect(rt, "g", {"clip": {"frames": 5}})
        end = done(events)
        # b failed on frame 2: fb is a critical slot, so frame 2's bucket is DEAD and sink never
        # runs for it; the unreachable(error) reaches the caller's stream, so the status is error
        assert sorted(i for (_, i), _ in sink.seen) == [0, 1, 3, 4]
        assert end["status"] == "error"
        assert end["errors"] == [
            {"role": "b", "interface": "run", "message": "ValueError: b cannot handle frame 2", "where": where_in(B.run, "raise")}
        ]
        assert len(streamed(events, "met")) == 4
        assert_clean(rt)

    run(main())


ORDERED = """
placeholder prompt: Json

role writer {
    impl "m:Writer"
    lb session
    interface write {
        in  prompt
        out stream token: Json
    }
}

role stylist {
    impl "m:Stylist"
    replicas 4
    lb round_robin
    interface style { in token  out styled: Json }
}

role editor {
    impl "m:Editor"
    lb session
    interface edit { in styled  out line: Json }
}

graph write {
    entry  prompt
    stream line ordered
}
"""


class Writer:
    async def write(self, ctx, prompt):
        for i in range(prompt["n"]):
            yield {"token": i}


class Stylist:
    def __init__(self, rng):
        self.rng = rng

    async def style(self, ctx, token):
        await jitter(self.rng, 20)
        return {"styled": token}


class Editor:
    def __init__(self):
        self.order = []

    async def edit(self, ctx, styled):
        self.order.append(styled)
        return {"line": styled}


def test_ordered_stream_through_round_robin_stage(tmp_path):
    async def main():
        rng = random.Random(5)
        editor = Editor()
        rt = await open_runtime(
            ORDERED, tmp_path, {"writer": Writer(), "stylist": [Stylist(rng) for _ in range(4)], "editor": editor}
        )
        events = await collect(rt, "write", {"prompt": {"n": 1000}})
        assert done(events)["status"] == "ok"
        # the session node released the 1,000 activations strictly in production order even
        # though the stylists finished out of order, and the caller saw them in that order
        assert editor.order == list(range(1000))
        assert streamed(events, "line") == list(range(1000))
        assert_clean(rt)

    run(main())


def test_the_round_robin_stage_really_finishes_out_of_order(tmp_path):
    async def main():
        rng = random.Random(5)
        finished = []

        class Tracing(Stylist):
            async def style(self, ctx, token):
                result = await super().style(ctx, token)
                finished.append(token)
                return result

        rt = await open_runtime(
            ORDERED, tmp_path, {"writer": Writer(), "stylist": [Tracing(rng) for _ in range(4)], "editor": Editor()}
        )
        await collect(rt, "write", {"prompt": {"n": 200}})
        assert finished != sorted(finished)  # so the previous test shows real reordering
        assert_clean(rt)

    run(main())


JOIN = """
placeholder request: Json

role reader {
    impl "m:Reader"
    interface read {
        in  request
        out stream prompt: Json, reference: Json
    }
}

role encoder {
    impl "m:Encoder"
    replicas 2
    interface encode { in reference  out condition: Json }
}

role painter {
    impl "m:Painter"
    interface paint {
        join { prompt: 1, condition: all }
        out picture: Json
    }
}

graph paint {
    entry  request
    return picture
}
"""


class Reader:
    async def read(self, ctx, request):
        yield {"prompt": request["prompt"]}
        for i in range(request["n"]):
            yield {"reference": i}


class Encoder:
    def __init__(self, rng):
        self.rng = rng

    async def encode(self, ctx, reference):
        await jitter(self.rng)
        return {"condition": reference}


class Painter:
    def __init__(self):
        self.calls = []

    async def paint(self, ctx, prompt, condition):
        self.calls.append((prompt, sorted(condition)))
        return {"picture": {"prompt": prompt[0], "conditions": len(condition)}}


@pytest.mark.parametrize("n", [0, 1, 5])
def test_count_join_with_fan_in_unknown_in_advance(tmp_path, n):
    async def main():
        rng = random.Random(n)
        painter = Painter()
        rt = await open_runtime(JOIN, tmp_path, {"reader": Reader(), "encoder": [Encoder(rng), Encoder(rng)], "painter": painter})
        events = await collect(rt, "paint", {"request": {"prompt": "barn", "n": n}})
        assert done(events)["status"] == "ok"
        # exactly one activation, after every reference was encoded, however many there were
        assert painter.calls == [(["barn"], list(range(n)))]
        assert returned(events) == {"picture": {"prompt": "barn", "conditions": n}}
        assert_clean(rt)

    run(main())


BRANCHES = """
placeholder request: Json

role frontend {
    impl "m:Frontend"
    interface parse {
        in  request
        out stream text_seg: Json, image_seg: Json
    }
}

role embed {
    impl "m:Embed"
    interface encode { in text_seg  out txt_emb: Json }
}

role vit {
    impl "m:Vit"
    interface encode { in image_seg  out vit_emb: Json }
}

role vae {
    impl "m:Vae"
    interface encode { in image_seg  out vae_lat: Json }
}

role llm {
    impl "m:Llm"
    lb session
    interface generate {
        in  txt_emb | vit_emb & vae_lat
        out stream token: Json
    }
}

graph chat {
    entry  request
    stream token ordered
}
"""


class Frontend:
    async def parse(self, ctx, request):
        for i, kind in enumerate(request["segments"]):
            yield {"text_seg": i} if kind == "t" else {"image_seg": i}


class Enc:
    def __init__(self, field, rng):
        self.field, self.rng = field, rng

    async def encode(self, ctx, **inputs):
        await jitter(self.rng)
        (value,) = inputs.values()
        return {self.field: value}


class Llm:
    def __init__(self):
        self.branches = []

    async def generate(self, ctx, txt_emb=None, vit_emb=None, vae_lat=None):
        if txt_emb is not None:
            self.branches.append(("text", txt_emb))
            yield {"token": f"t{txt_emb}"}
        else:
            assert vit_emb == vae_lat
            self.branches.append(("image", vit_emb))
            yield {"token": f"i{vit_emb}a"}
            yield {"token": f"i{vit_emb}b"}


def test_or_groups_choose_a_branch_per_frame(tmp_path):
    async def main():
        rng = random.Random(6)
        llm = Llm()
        roles = {
            "frontend": Frontend(),
            "embed": Enc("txt_emb", rng),
            "vit": Enc("vit_emb", rng),
            "vae": Enc("vae_lat", rng),
            "llm": llm,
        }
        rt = await open_runtime(BRANCHES, tmp_path, roles)
        segments = "ttiittit"
        events = await collect(rt, "chat", {"request": {"segments": segments}})
        assert done(events)["status"] == "ok"
        expected = [("text" if k == "t" else "image", i) for i, k in enumerate(segments)]
        assert llm.branches == expected  # one branch per frame, in frame order (llm is a session node)
        tokens = [t for i, k in enumerate(segments) for t in ([f"t{i}"] if k == "t" else [f"i{i}a", f"i{i}b"])]
        assert streamed(events, "token") == tokens
        assert_clean(rt)

    run(main())


LOOP = """
placeholder question: Json

role agent {
    impl "m:Agent"
    lb session
    interface think {
        in  question | observation
        out stream tool_call: Json, answer: Json
    }
}

role tools {
    impl "m:Tools"
    interface run { in tool_call  out observation: Json }
}

graph ask {
    entry  question
    return answer
}
"""


class Agent:
    def __init__(self):
        self.rounds = 0

    async def think(self, ctx, question=None, observation=None):
        state = ctx.globals.setdefault("state", {}) if False else self.__dict__
        if question is not None:
            state["left"] = question["rounds"]
        self.rounds += 1
        if state["left"] > 0:
            state["left"] -= 1
            yield {"tool_call": state["left"]}
        else:
            yield {"answer": self.rounds}


class Tools:
    def __init__(self):
        self.runs = 0

    async def run(self, ctx, tool_call):
        self.runs += 1
        return {"observation": tool_call}


@pytest.mark.parametrize("k", [0, 1, 4])
def test_loop_exits_after_k_rounds(tmp_path, k):
    async def main():
        agent, tools = Agent(), Tools()
        rt = await open_runtime(LOOP, tmp_path, {"agent": agent, "tools": tools})
        events = await collect(rt, "ask", {"question": {"rounds": k}})
        assert done(events) == {"event": "done", "status": "ok", "errors": [], "missing": []}
        assert returned(events) == {"answer": k + 1}  # k tool rounds, then the answer
        assert tools.runs == k
        assert_clean(rt)

    run(main())


class Failing:
    async def run(self, ctx, tool_call):
        raise RuntimeError("tool crashed")


def test_exception_in_a_role_ends_the_call_with_error(tmp_path):
    async def main():
        rt = await open_runtime(LOOP, tmp_path, {"agent": Agent(), "tools": Failing()})
        events = await asyncio.wait_for(collect(rt, "ask", {"question": {"rounds": 2}}), 10)
        end = done(events)
        assert end["status"] == "error"
        assert end["errors"] == [
            {
                "role": "tools",
                "interface": "run",
                "message": "RuntimeError: tool crashed",
                "where": where_in(Failing.run, "raise"),
            }
        ]
        assert end["missing"] == ["answer"]
        assert_clean(rt)

    run(main())


TIMEOUT = """
placeholder request: Json

role slow {
    impl "m:Slow"
    interface run {
        in  request
        out result: Json
        timeout 50ms
    }
}

graph g {
    entry  request
    return result
}
"""


class Slow:
    def __init__(self):
        self.release = asyncio.Event()
        self.cancelled = False

    async def run(self, ctx, request):
        try:
            await self.release.wait()  # never set: only the timeout ends this
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return {"result": 1}


def test_interface_timeout_cancels_the_call(tmp_path):
    async def main():
        slow = Slow()
        rt = await open_runtime(TIMEOUT, tmp_path, {"slow": slow})
        events = await asyncio.wait_for(collect(rt, "g", {"request": 1}), 10)
        end = done(events)
        assert end["status"] == "cancelled" and end["missing"] == ["result"]
        assert slow.cancelled
        assert_clean(rt)

    run(main())


def test_graph_timeout_and_caller_disconnect_cancel(tmp_path):
    async def main():
        slow = Slow()
        rt = await open_runtime(TIMEOUT.replace("        timeout 50ms\n", ""), tmp_path, {"slow": slow})
        events = await asyncio.wait_for(collect(rt, "g", {"request": 1}, timeout=0.05), 10)
        assert done(events)["status"] == "cancelled" and slow.cancelled
        assert_clean(rt)
        slow.cancelled = False
        stream = rt.call("g", {"request": 2})
        task = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        task.cancel()  # the client goes away
        with pytest.raises(asyncio.CancelledError):
            await task
        await stream.aclose()
        assert slow.cancelled
        assert_clean(rt)

    run(main())


SESSION = """
placeholder request: Json

role work {
    impl "m:Work"
    interface run { in request  out result: Json }
}

graph g {
    entry  request
    return result
}
"""


class Gate:
    """Each call waits for its own event, so the test decides when a call may finish."""

    def __init__(self):
        self.gates: dict[str, asyncio.Event] = {}
        self.started: list[str] = []

    async def run(self, ctx, request):
        self.started.append(request)
        await self.gates.setdefault(request, asyncio.Event()).wait()
        return {"result": request}


def test_session_fifo_and_independent_sessions(tmp_path):
    async def main():
        gate = Gate()
        rt = await open_runtime(SESSION, tmp_path, {"work": gate})
        first = asyncio.ensure_future(collect(rt, "g", {"request": "s1-a"}, session="s1"))
        second = asyncio.ensure_future(collect(rt, "g", {"request": "s1-b"}, session="s1"))
        other = asyncio.ensure_future(collect(rt, "g", {"request": "s2-a"}, session="s2"))
        while len(gate.started) < 2:
            await asyncio.sleep(0)
        # s1's second call waits for its first; s2 runs beside s1
        assert gate.started == ["s1-a", "s2-a"]
        gate.gates["s2-a"].set()
        assert returned(await other) == {"result": "s2-a"}
        assert "s1-b" not in gate.started
        gate.gates["s1-a"].set()
        assert returned(await first) == {"result": "s1-a"}
        while "s1-b" not in gate.started:
            await asyncio.sleep(0)
        gate.gates["s1-b"].set()
        assert returned(await second) == {"result": "s1-b"}
        assert_clean(rt)

    run(main())


ABSORB = """
placeholder request: Json

role p1 {
    impl "m:P1"
    interface run { in request  out x: Json }
}

role p2 {
    impl "m:P2"
    interface run { in request  out x: Json }
}

role sink {
    impl "m:Sink"
    interface take { in x  out result: Json }
}

graph g {
    entry  request
    return result
}
"""


class Ok:
    async def run(self, ctx, request):
        return {"x": "fine"}


class Bad:
    async def run(self, ctx, request):
        raise ValueError("p1 failed")


class Take:
    async def take(self, ctx, x):
        return {"result": x}


def test_an_error_absorbed_by_another_slot_is_listed_but_ok(tmp_path):
    async def main():
        rt = await open_runtime(ABSORB, tmp_path, {"p1": Bad(), "p2": Ok(), "sink": Take()})
        events = await collect(rt, "g", {"request": 1})
        end = done(events)
        # x arrives on two paths; p1's failure leaves the other, so the call succeeds
        assert returned(events) == {"result": "fine"}
        assert end["status"] == "ok"
        assert end["errors"] == [
            {"role": "p1", "interface": "run", "message": "ValueError: p1 failed", "where": where_in(Bad.run, "raise")}
        ]
        assert_clean(rt)

    run(main())


GLOBALS = """
placeholder request: Json

global memory: KVCache {
    layers 1
    page_tokens 16
    slices [k, v]
}

role counter {
    impl "m:Counter"
    uses memory
    interface run { in request  out seen: Json }
}

graph g {
    entry  request
    return seen
}
"""


class Counter:
    async def run(self, ctx, request):
        state = ctx.globals["memory"]
        state["calls"] = state.get("calls", 0) + 1
        return {"seen": state["calls"]}


def test_globals_are_kept_per_session_and_dropped_with_an_anonymous_call(tmp_path):
    async def main():
        rt = await open_runtime(GLOBALS, tmp_path, {"counter": Counter()})
        # a session's calls share the state of the globals their roles use; other sessions do not
        assert [returned(await collect(rt, "g", {"request": 0}, session="s1"))["seen"] for _ in range(3)] == [1, 2, 3]
        assert returned(await collect(rt, "g", {"request": 0}, session="s2")) == {"seen": 1}
        # a call without a session is a session of its own: its state goes when it ends
        for _ in range(5):
            assert returned(await collect(rt, "g", {"request": 0})) == {"seen": 1}
        assert sorted(rt.globals) == [("s1", "memory"), ("s2", "memory")]
        stats = rt.statistics()
        assert stats["sessions"] == stats["idle_sessions"] == 2  # kept while idle (tests/runtime/test_sessions.py)
        assert not any(v for k, v in stats.items() if k not in ("sessions", "idle_sessions")), stats

    run(main())


class GatedFrontend:
    """Yields one frame per segment ('t' text, 'i' image, '?' neither), then holds the call open
    until the test has seen what it waits for."""

    def __init__(self):
        self.release = asyncio.Event()

    async def parse(self, ctx, request):
        for i, kind in enumerate(request["segments"]):
            yield {"text_seg": i} if kind == "t" else {"image_seg": i} if kind == "i" else {}
        await self.release.wait()


def test_a_session_node_moves_past_a_seq_whose_groups_all_died_early(tmp_path):
    """Frame 1 carries neither field: both of llm's groups die for SeqId 1 before SeqId 0 has
    run. When SeqId 0 settles, the session queue must move on to SeqId 2 at once, not wait
    until the call has nothing else to do (here: never, the frontend holds it open)."""

    async def main():
        rng = random.Random(7)
        frontend, llm = GatedFrontend(), Llm()
        roles = {
            "frontend": frontend,
            "embed": Enc("txt_emb", rng),
            "vit": Enc("vit_emb", rng),
            "vae": Enc("vae_lat", rng),
            "llm": llm,
        }
        rt = await open_runtime(BRANCHES, tmp_path, roles)
        events = []
        async for event in rt.call("chat", {"request": {"segments": "t?i"}}):
            events.append(event)
            if event.get("value") == "i2b":
                frontend.release.set()
        assert streamed(events, "token") == ["t0", "i2a", "i2b"]
        assert llm.branches == [("text", 0), ("image", 2)]
        assert done(events)["status"] == "ok"
        assert_clean(rt)

    run(asyncio.wait_for(main(), 10))


NESTED_STREAM_SLOT = """
placeholder request: Json

role src {
    impl "m:Src"
    interface run {
        in  request
        out stream a: Json, b: Json
    }
}

role inner {
    impl "m:Inner"
    interface run {
        in  a
        out w: Json, x: Json, y: Json
    }
}

role p {
    impl "m:P"
    interface run {
        in  x
        out stream f: Json
    }
}

role p2 {
    impl "m:P2"
    interface run { in w  out f: Json }
}

role q {
    impl "m:Q"
    interface run { in y  out g: Json }
}

role sink {
    impl "m:Sink"
    interface run {
        in  f & g
        out h: Json
    }
}

role r {
    impl "m:R"
    interface run { in b  out k: Json }
}

role final {
    impl "m:Final"
    interface run {
        in  h & k
        out z: Json
    }
}

graph g {
    entry  request
    stream z
}
"""


class Frames:
    async def run(self, ctx, request):
        for i in range(3):
            yield {"a": i, "b": i}


class Fork:
    async def run(self, ctx, a):
        return {"w": a, "x": a, "y": a}


class EvenOnly:
    """A stream that delivers f only for even inputs; for odd ones it yields a frame without f."""

    async def run(self, ctx, x):
        yield {"f": x} if x % 2 == 0 else {}


class Later:
    """Answers after the other branches have had their turn."""

    def __init__(self, field: str):
        self.field = field

    async def run(self, ctx, **inputs):
        await asyncio.sleep(0)
        (value,) = inputs.values()
        return {self.field: value}


class Pair:
    def __init__(self, left: str, right: str, out: str):
        self.left, self.right, self.out = left, right, out

    async def run(self, ctx, **inputs):
        return {self.out: [inputs[self.left], inputs[self.right]]}


def test_a_stream_slot_closed_empty_first_keeps_the_frames_roots(tmp_path):
    """Nested diamonds (src around inner). For frame 1, p's stream ends without f before p2
    and q answer: that end of stream is the first signal sink's bucket sees (f has a second
    producer, so it does not die). sink then fires with p2's f; its frame must still carry
    src's root entry, or final's bucket for frame 1 is keyed apart from r's k and never fires."""

    async def main():
        roles = {
            "src": Frames(),
            "inner": Fork(),
            "p": EvenOnly(),
            "p2": Later("f"),
            "q": Later("g"),
            "sink": Pair("f", "g", "h"),
            "r": Later("k"),
            "final": Pair("h", "k", "z"),
        }
        rt = await open_runtime(NESTED_STREAM_SLOT, tmp_path, roles)
        events = await asyncio.wait_for(collect(rt, "g", {"request": 1}), 10)
        # f: p's list where it delivered, else p2's value (the first slot that received, in plan order)
        expected = [[[[0], 0], 0], [[1, 1], 1], [[[2], 2], 2]]
        assert sorted(streamed(events, "z"), key=repr) == sorted(expected, key=repr)
        assert done(events)["status"] == "ok"
        assert_clean(rt)

    run(main())


def test_a_request_that_reaches_nothing_ends_without_a_false_alarm(tmp_path):
    """image_chat with no segments: the frontend yields nothing, the DiT's join resolves empty
    and its phantom kills the decode downstream, inside the same step. The call ends `ok` with
    `image` missing, and no "flowrt bug" is logged on the way (nested phantoms hold the call)."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    bundle = tmp_path / "chat"
    subprocess.run(
        [sys.executable, "-m", "flowc", "build", "examples/image_chat/pipeline.flow", "-o", str(bundle)],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowc",
            "run",
            str(bundle),
            "--once",
            "chat",
            "--input",
            json.dumps({"request": {"segments": []}}),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert json.loads(result.stdout.splitlines()[-1]) == {"event": "done", "status": "ok", "errors": [], "missing": ["image"]}
    assert "flowrt bug" not in result.stderr, result.stderr
