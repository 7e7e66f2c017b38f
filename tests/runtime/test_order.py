"""Order keys (docs/runtime.md, rule 7; DESIGN §4.3): every frame's key gains one level per
streaming hop, `lb session` nodes restart keys at their output counter, a join's activation has
the empty key; ordered streams reach the caller, and ordered session nodes run, in the
lexicographic order of keys, whatever the replicas and delays; no frame is ever dropped."""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.runtime.harness import assert_clean, collect, done, jitter, open_runtime, streamed


def run(coro):
    return asyncio.run(coro)


def pipeline(stages: list[tuple[str, str, bool, int, str]], ordered: str = "ordered") -> str:
    """Roles in a chain: (name, in field, streams, replicas, lb) producing `{name}_out`."""
    text = "placeholder request: Json\n\n"
    for name, field, streams, replicas, lb in stages:
        out = f"out {'stream ' if streams else ''}{name}_out: Json"
        text += (
            f'role {name} {{\n    impl "m:X"\n    replicas {replicas}\n    lb {lb}\n'
            f"    interface run {{\n        in {field}\n        {out}\n    }}\n}}\n\n"
        )
    last = stages[-1][0]
    return text + f"graph g {{\n    entry request\n    stream {last}_out {ordered}\n}}\n"


class Parts:
    """Streams `n` parts, or passes its input on with `pieces` pieces per part."""

    def __init__(self, rng: random.Random | None = None, n: int = 0, pieces: int = 0, name: str = ""):
        self.rng, self.n, self.pieces, self.name = rng, n, pieces, name
        self.log: list = []

    async def run(self, ctx, **inputs):
        (value,) = inputs.values()
        self.log.append(value)
        if self.rng is not None:
            await jitter(self.rng, 8)
        if self.n:
            for i in range(self.n):
                if self.rng is not None:
                    await jitter(self.rng, 3)
                yield {f"{self.name}_out": (i,)}
            return
        for k in range(self.pieces or 1):
            if self.rng is not None:
                await jitter(self.rng, 3)
            yield {f"{self.name}_out": (*value, k) if self.pieces else value}


def test_an_ordered_stream_of_a_stage_that_runs_once_per_part_loses_no_frame(tmp_path):
    # the reproducer: s streams 10 frames into w (default lb, one replica), which streams y
    text = pipeline([("s", "request", True, 1, "round_robin"), ("w", "s_out", True, 1, "round_robin")])

    async def main():
        rt = await open_runtime(text, tmp_path, {"s": Parts(n=10, name="s"), "w": Parts(pieces=1, name="w")})
        events = await collect(rt, "g", {"request": {}})
        assert_clean(rt)
        return events

    events = run(main())
    assert streamed(events, "w_out") == [(i, 0) for i in range(10)]
    assert done(events)["status"] == "ok"


@pytest.mark.parametrize("seed", range(6))
def test_parts_into_a_stage_that_streams_three_pieces_each_arrive_lexicographically(tmp_path, seed):
    # DESIGN §4.3's example, with 3 replicas of the stage and random delays everywhere
    text = pipeline([("s", "request", True, 1, "round_robin"), ("w", "s_out", True, 3, "round_robin")])
    rng = random.Random(seed)

    async def main():
        stage = [Parts(rng, pieces=3, name="w") for _ in range(3)]
        rt = await open_runtime(text, tmp_path, {"s": Parts(rng, n=8, name="s"), "w": stage})
        events = await collect(rt, "g", {"request": {}})
        assert_clean(rt)
        return events, stage

    events, stage = run(main())
    assert streamed(events, "w_out") == [(i, k) for i in range(8) for k in range(3)]
    # the replicas really did finish out of order (else the test shows nothing)
    assert sorted(v for r in stage for v in r.log) == [(i,) for i in range(8)]


@pytest.mark.parametrize("seed", range(4))
def test_three_streaming_hops_and_a_plain_stage_keep_the_order_of_keys(tmp_path, seed):
    text = pipeline(
        [
            ("a", "request", True, 1, "round_robin"),
            ("b", "a_out", True, 2, "load_aware"),
            ("c", "b_out", False, 3, "round_robin"),
            ("d", "c_out", True, 2, "round_robin"),
        ]
    )
    rng = random.Random(seed)

    async def main():
        roles = {
            "a": Parts(rng, n=4, name="a"),
            "b": [Parts(rng, pieces=2, name="b") for _ in range(2)],
            "c": [Parts(rng, name="c") for _ in range(3)],
            "d": [Parts(rng, pieces=3, name="d") for _ in range(2)],
        }
        rt = await open_runtime(text, tmp_path, roles)
        events = await collect(rt, "g", {"request": {}})
        assert_clean(rt)
        return events

    events = run(main())
    assert streamed(events, "d_out") == [(i, j, k) for i in range(4) for j in range(2) for k in range(3)]


class Session:
    """An `lb session` stage: records the order it runs in, streams `pieces` per input."""

    def __init__(self, rng: random.Random, pieces: int, log: list):
        self.rng, self.pieces, self.log = rng, pieces, log

    async def run(self, ctx, **inputs):
        (value,) = inputs.values()
        self.log.append(value)
        await jitter(self.rng, 4)
        for k in range(self.pieces):
            await jitter(self.rng, 2)
            yield {"e_out": (*value, k)}


@pytest.mark.parametrize("seed", range(4))
def test_a_session_node_fed_through_two_streaming_hops_runs_in_key_order(tmp_path, seed):
    # keys reaching e are (i, j): e runs them in that order, and its frames restart flat (0,), (1,) ...
    text = pipeline(
        [
            ("a", "request", True, 1, "round_robin"),
            ("b", "a_out", True, 3, "round_robin"),
            ("e", "b_out", True, 2, "session"),
        ]
    )
    rng = random.Random(seed)
    log: list = []

    async def main():
        roles = {
            "a": Parts(rng, n=3, name="a"),
            "b": [Parts(rng, pieces=3, name="b") for _ in range(3)],
            "e": [Session(rng, 2, log) for _ in range(2)],
        }
        rt = await open_runtime(text, tmp_path, roles)
        events = await collect(rt, "g", {"request": {}}, session="s1")
        assert_clean(rt)
        return events

    events = run(main())
    keys = [(i, j) for i in range(3) for j in range(3)]
    assert log == keys
    assert streamed(events, "e_out") == [(*key, k) for key in keys for k in range(2)]


JOIN_AND_STREAM = """
placeholder request: Json

role src {
    impl "m:Src"
    interface run { in request  out stream part: Json }
}

role gather {
    impl "m:Gather"
    interface run {
        join { part: all }
        out stream y: Json
    }
}

role echo {
    impl "m:Echo"
    replicas 2
    interface run { in part  out y: Json }
}

graph g {
    entry  request
    stream y ordered
}
"""


class Src:
    async def run(self, ctx, request):
        for i in range(4):
            await asyncio.sleep(0)
            yield {"part": i}


class Gather:
    async def run(self, ctx, part):
        for k, value in enumerate(sorted(part)):
            yield {"y": ("gathered", k, value)}


class Echo:
    def __init__(self, rng):
        self.rng = rng

    async def run(self, ctx, part):
        await jitter(self.rng, 5)
        return {"y": ("echo", part)}


@pytest.mark.parametrize("seed", range(3))
def test_a_join_has_the_empty_key_so_its_frames_come_first(tmp_path, seed):
    # two producers of y: echo (keys (i,)) and the join's activation (key (), its frames (k,)).
    # (k,) ties with echo's (i,) when k == i: equal keys go in arrival order, so compare per key
    rng = random.Random(seed)

    async def main():
        rt = await open_runtime(JOIN_AND_STREAM, tmp_path, {"src": Src(), "gather": Gather(), "echo": [Echo(rng), Echo(rng)]})
        events = await collect(rt, "g", {"request": {}})
        assert_clean(rt)
        return events

    values = streamed(run(main()), "y")
    keys = [(v[1],) for v in values]  # ("gathered", k, _) has key (k,); ("echo", i) has (i,)
    assert keys == sorted(keys)  # lexicographic by key, whatever finished first
    assert sorted(values) == sorted([("gathered", k, k) for k in range(4)] + [("echo", i) for i in range(4)])


def test_many_frames_out_of_order_are_all_delivered_in_order(tmp_path):
    # 200 parts (fewer than a stream's bound on unfinished activations, rule 13), each through a
    # stage whose replicas answer in reverse order of arrival: the caller holds almost every
    # frame for a while, then gets all of them in key order
    text = pipeline([("s", "request", True, 1, "round_robin"), ("w", "s_out", False, 4, "round_robin")])

    class Reverse:
        def __init__(self, gate: asyncio.Event, seen: list):
            self.gate, self.seen = gate, seen

        async def run(self, ctx, s_out):
            self.seen.append(s_out)
            if len(self.seen) < 200:
                await self.gate.wait()
            else:
                self.gate.set()
            for _ in range(200 - s_out[0]):  # the last part finishes first
                await asyncio.sleep(0)
            return {"w_out": s_out}

    async def main():
        gate, seen = asyncio.Event(), []
        rt = await open_runtime(text, tmp_path, {"s": Parts(n=200, name="s"), "w": [Reverse(gate, seen) for _ in range(4)]})
        events = await asyncio.wait_for(collect(rt, "g", {"request": {}}), 30)
        assert_clean(rt)
        return events

    assert streamed(run(main()), "w_out") == [(i,) for i in range(200)]
