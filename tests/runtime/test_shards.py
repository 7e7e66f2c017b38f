"""Calls spread over shard hosts (flowrt.control.shards), in one test process: what the gateway
sends and receives does not grow with the graph, and failures, timeouts and a caller that
goes away end the call as in one process, with nothing left in any host."""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.runtime.harness import collect, done, jitter, returned
from tests.runtime.shard_fabric import open_fabric


def chain(stages: int, impl: str = "m:Stage") -> str:
    """entry → s0 → s1 → ... → return: `stages` one-replica roles, all implemented by `impl`."""
    lines = ["placeholder request: Json", ""]
    for i in range(stages):
        source = "request" if i == 0 else f"x{i}"
        lines += [f"role s{i} {{", f'    impl "{impl}"', f"    interface run {{ in {source}  out x{i + 1}: Json }}", "}", ""]
    lines += ["graph g {", "    entry request", f"    return x{stages}", "}", ""]
    return "\n".join(lines)


def stage_roles(stages: int, rng: random.Random) -> dict[str, list[object]]:
    roles = {}
    for i in range(stages):
        out = f"x{i + 1}"

        class One:
            field = out

            async def run(self, ctx, **inputs):
                (value,) = inputs.values()
                await jitter(rng, 2)
                return {self.field: value + 1}

        roles[f"s{i}"] = [One()]
    return roles


async def settled(fabric) -> None:
    await asyncio.wait_for(fabric.drained(), 5)
    assert not fabric.failures, fabric.failures
    left = {host: {k: v for k, v in stats.items() if v} for host, stats in fabric.statistics().items()}
    assert all(not stats for stats in left.values()), left


@pytest.mark.parametrize("seed", range(3))
def test_a_100_stage_chain_costs_the_gateway_what_one_stage_does(seed, tmp_path):
    async def messages(stages: int) -> tuple[int, int]:
        directory = tmp_path / str(stages)
        directory.mkdir()
        fabric = await open_fabric(chain(stages), directory, stage_roles(stages, random.Random(seed)), random.Random(seed))
        try:
            events = await collect(fabric.runtimes[0], "g", {"request": 0})
            assert returned(events) == {f"x{stages}": stages}
            await settled(fabric)
            assert sum(fabric.messages.values()) > stages  # the frames went host to host
            return fabric.gateway_messages()
        finally:
            await fabric.close()

    async def main():
        one = await messages(1)
        hundred = await messages(100)
        assert one == (1, 2)  # the entry value out; the returned frame and the credit back
        sent, received = hundred
        assert sent == 1 and received <= 3, hundred  # (credit that missed a forgotten shard may come back apart)

    asyncio.run(main())


FAN = """
placeholder request: Json

role head {
    impl "m:Head"
    interface run { in request  out stream item: Json }
}

role work {
    impl "m:Work"
    replicas 2
    timeout 50ms
    interface run { in item  out result: Json }
}

graph g {
    entry request
    stream result
}
"""


class Head:
    async def run(self, ctx, request):
        for n in range(request["items"]):
            yield {"item": {"n": n, **request}}


class Work:
    def __init__(self, started: list, gate: asyncio.Event):
        self.started, self.gate = started, gate

    async def run(self, ctx, item):
        self.started.append(item["n"])
        if item["n"] == item.get("fail"):
            raise ValueError(f"item {item['n']} is bad")
        if item["n"] == item.get("hang"):
            await self.gate.wait()  # never set: the interface's timeout, or the caller, ends it
        return {"result": item["n"]}


async def fan(tmp_path, rng_seed: int = 0):
    started: list = []
    gate = asyncio.Event()
    roles = {"head": [Head()], "work": [Work(started, gate), Work(started, gate)]}
    return await open_fabric(FAN, tmp_path, roles, random.Random(rng_seed)), started


@pytest.mark.parametrize("seed", range(3))
def test_a_role_that_raises_on_another_host_fails_its_output_and_the_rest_arrive(seed, tmp_path):
    async def main():
        fabric, _ = await fan(tmp_path, seed)
        try:
            events = await collect(fabric.runtimes[0], "g", {"request": {"items": 6, "fail": 3}})
            got = sorted(e["value"] for e in events if e["event"] == "stream")
            assert got == [0, 1, 2, 4, 5]
            end = done(events)
            assert end["status"] == "error" and [e["role"] for e in end["errors"]] == ["work"]
            assert "item 3 is bad" in end["errors"][0]["message"]
            await settled(fabric)
        finally:
            await fabric.close()

    asyncio.run(main())


@pytest.mark.parametrize("seed", range(3))
def test_a_timeout_on_a_replica_host_cancels_the_whole_call(seed, tmp_path):
    async def main():
        fabric, started = await fan(tmp_path, seed)
        try:
            events = await asyncio.wait_for(collect(fabric.runtimes[0], "g", {"request": {"items": 6, "hang": 2}}), 5)
            end = done(events)
            assert end["status"] == "cancelled" and end["reason"] == "timeout", end
            assert [e["message"] for e in end["errors"]] == ["timed out after 0.05s"]
            await settled(fabric)
            # the next call runs as if nothing happened
            events = await collect(fabric.runtimes[0], "g", {"request": {"items": 4}})
            assert sorted(e["value"] for e in events if e["event"] == "stream") == [0, 1, 2, 3]
            await settled(fabric)
        finally:
            await fabric.close()

    asyncio.run(main())


@pytest.mark.parametrize("seed", range(3))
def test_a_caller_that_goes_away_frees_every_host(seed, tmp_path):
    async def main():
        fabric, started = await fan(tmp_path, seed)
        gateway = fabric.runtimes[0]
        try:
            got = []
            async for event in gateway.call("g", {"request": {"items": 8, "hang": 5}}):
                if event["event"] == "stream":
                    got.append(event["value"])
                if len(got) == 2:
                    break  # the caller leaves with work in flight on the other hosts
            await asyncio.wait_for(gateway.wait_idle(), 5)
            await settled(fabric)
            assert gateway.last_call is not None and gateway.last_call.cancel_reason == "client gone"
            # a call's own timeout (the gateway's watchdog) ends it the same way
            events = await collect(gateway, "g", {"request": {"items": 8, "hang": 5}}, timeout=0.02)
            assert done(events)["status"] == "cancelled"
            await settled(fabric)
        finally:
            await fabric.close()

    asyncio.run(main())


TURNS = """
placeholder request: Json

global chat: History {
    max_turns 20
}

role counter {
    impl "m:Counter"
    uses chat
    interface run { in request  out turn: Json }
}

role echo {
    impl "m:Echo"
    replicas 2
    uses chat
    interface run { in turn  out stream seen: Json }
}

graph g {
    entry request
    stream seen
}
"""


class Counter:
    async def run(self, ctx, request):
        ctx.globals["chat"]["turns"] = ctx.globals["chat"].get("turns", 0) + 1
        ctx.globals["chat"].pop("gone", None)
        return {"turn": ctx.globals["chat"]["turns"]}


class Echo:
    async def run(self, ctx, turn):
        ctx.globals["chat"].setdefault("echoes", []).append(turn)
        yield {"seen": (turn, list(ctx.globals["chat"]["echoes"]))}


def test_session_globals_on_other_hosts_carry_over_from_call_to_call(tmp_path):
    async def main():
        roles = {"counter": [Counter()], "echo": [Echo(), Echo()]}
        fabric = await open_fabric(TURNS, tmp_path, roles, random.Random(0))
        gateway = fabric.runtimes[0]
        try:
            gateway.globals[("s", "chat")]["gone"] = True
            seen = []
            for _ in range(3):
                events = await collect(gateway, "g", {"request": {}}, session="s")
                seen += [e["value"] for e in events if e["event"] == "stream"]
                await settled(fabric)
            # each call saw what the calls before it left, whichever replica ran it
            assert seen == [(1, [1]), (2, [1, 2]), (3, [1, 2, 3])]
            assert gateway.globals[("s", "chat")] == {"turns": 3, "echoes": [1, 2, 3]}  # ("gone" deleted)
            for host, runtime in fabric.runtimes.items():
                assert host == 0 or not any(state for state in runtime.globals.values()), host  # kept in the gateway only
        finally:
            await fabric.close()

    asyncio.run(main())


ORDERED_NOTES = """
placeholder request: Json

global chat: History {
    max_turns 20
}

role split {
    impl "m:Split"
    interface run { in request  out stream part: Json }
}

role keeper {
    impl "m:Keeper"
    lb session
    uses chat
    interface run { in part  out noted: Json }
}

role tally {
    impl "m:Tally"
    uses chat
    interface run {
        join { noted: all }
        out total: Json
    }
}

graph g {
    entry request
    return total
}
"""


class Split:
    async def run(self, ctx, request):
        for part in range(request["parts"]):
            yield {"part": part}


class Keeper:
    async def run(self, ctx, part):
        ctx.globals["chat"].setdefault("parts", []).append(part)
        return {"noted": len(ctx.globals["chat"]["parts"])}


class Tally:
    async def run(self, ctx, noted):
        ctx.globals["chat"]["tallies"] = ctx.globals["chat"].get("tallies", 0) + 1
        return {"total": (sorted(noted), list(ctx.globals["chat"]["parts"]))}


@pytest.mark.parametrize("seed", range(3))
def test_work_the_gateway_lets_run_gets_the_session_globals_with_the_decision(seed, tmp_path):
    # an ordered session node's inputs wait for the gateway's RELEASE, a count join's activation
    # for its RESOLVE: both carry a copy of the session's globals, so the first activation each
    # lets run need not ask for it; what one activation changes, the next one still sees
    from flowrt.control.envelopes import GLOBALS_GET

    async def main():
        roles = {"split": [Split()], "keeper": [Keeper()], "tally": [Tally()]}
        fabric = await open_fabric(ORDERED_NOTES, tmp_path, roles, random.Random(seed))
        gateway = fabric.runtimes[0]
        try:
            for call in range(2):
                events = await collect(gateway, "g", {"request": {"parts": 3}}, session="s")
                await settled(fabric)
                parts = [0, 1, 2] * (call + 1)
                assert returned(events) == {"total": ([1 + 3 * call, 2 + 3 * call, 3 + 3 * call], parts)}
            assert gateway.globals[("s", "chat")] == {"parts": [0, 1, 2, 0, 1, 2], "tallies": 2}
            # 4 activations per call use the globals: each call's first keeper and its tally are given them
            assert fabric.kinds.get(GLOBALS_GET, 0) <= 2 * 2
        finally:
            await fabric.close()

    asyncio.run(main())


SEGMENTS = """
placeholder request: Json

role split {
    impl "m:Split2"
    interface run { in request  out stream text: Json, image: Json }
}

role embed {
    impl "m:Embed"
    interface run { in text  out t: Json }
}

role vit {
    impl "m:Vit"
    interface run { in image  out v: Json }
}

role llm {
    impl "m:Llm"
    lb session
    interface run {
        in t | v
        out stream token: Json
    }
}

graph g {
    entry request
    stream token ordered
}
"""


def test_the_first_segment_runs_while_a_later_one_is_still_being_encoded(tmp_path):
    # the llm's inputs wait for order (a session node); the text segment's (key (0,)) cannot be
    # overtaken by anything (all its work comes through split's stream), so it runs at once:
    # vit finishes only after the llm has started on the text, which would hang if the llm's
    # first input waited for the call to be quiet (the gateway's RELEASE)
    started = asyncio.Event()

    class Split2:
        async def run(self, ctx, request):
            yield {"text": "hello"}
            yield {"image": "pixels"}

    class Embed:
        async def run(self, ctx, text):
            return {"t": text}

    class Vit:
        async def run(self, ctx, image):
            await started.wait()
            return {"v": image}

    class Llm:
        async def run(self, ctx, t=None, v=None):
            started.set()
            for word in range(2):
                yield {"token": (t or v, word)}

    async def main():
        roles = {"split": [Split2()], "embed": [Embed()], "vit": [Vit()], "llm": [Llm()]}
        fabric = await open_fabric(SEGMENTS, tmp_path, roles, random.Random(0))
        try:
            events = await asyncio.wait_for(collect(fabric.runtimes[0], "g", {"request": {}}, session="s"), 5)
            tokens = [e["value"] for e in events if e["event"] == "stream"]
            assert tokens == [("hello", 0), ("hello", 1), ("pixels", 0), ("pixels", 1)], events
            await settled(fabric)
        finally:
            await fabric.close()

    asyncio.run(main())


def test_order_floors_from_the_graph_alone(tmp_path):
    from flowrt.bundle import load_bundle
    from flowrt.control import Runtime
    from flowrt.control.quiescence import floors
    from tests.runtime.harness import bundle_of

    def floors_of(text: str, name: str) -> tuple:
        directory = tmp_path / name
        directory.mkdir()
        return floors(Runtime(load_bundle(bundle_of(text, directory))).programs["g"])

    # the llm's inputs come out of split's stream, and its tokens out of a session node
    assert floors_of(SEGMENTS, "segments") == ((0,), (0,))
    # keeper's inputs come out of split's stream
    assert floors_of(ORDERED_NOTES, "notes") == ((0,),)
    # the entry feeds the session node itself: its frame has the empty key
    direct = SEGMENTS.replace("in t | v", "in request | t | v")
    assert sorted(floors_of(direct, "direct")) == [(), (0,)]
