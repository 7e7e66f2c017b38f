"""Property: a graph whose entry streams (`placeholder stream`) gives, in process, the reference
interpreter's events for random chunkings of the same input, whatever the moments its frames are
sent (random turns of the loop between sends, and in the roles): the same activations with the
same inputs, the same streamed frames (every `ordered` stream in the order of the keys the
reference computes), returns, errors and status; and nothing is left behind. The input goes
through `Runtime.start` (`send`, `end`) or through `Runtime.call` (the list of its frames)."""

from __future__ import annotations

import asyncio
import copy
import random
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowc.check import check_source
from flowc.plan import build_plan
from flowrt.control.contract import MAX_REPORTED_ERRORS
from tests.runtime.harness import assert_clean, collect, done, jitter, open_runtime
from tests.runtime.reference import freeze, run_reference
from tests.runtime.test_against_reference import (
    SETTINGS,
    Role,
    Spec,
    behaviour_for,
    depth_of,
    event,
    in_key_order,
    normalize,
    require,
    specs,
    timed,
)

ITEMS = tuple(range(12))  # the input: what every chunking splits into frames
MODES = ("start", "call")


def chunked(cuts: list[int]) -> list[tuple]:
    """The frames of one chunking of ITEMS (`cuts`: where frames end), as 4-tuples like the
    request of the reference tests (depth 0): ("request", frame index, items, 0)."""
    edges = sorted({c for c in cuts if 0 < c < len(ITEMS)})
    bounds = [0, *edges, len(ITEMS)]
    return [("request", j, ITEMS[a:b], 0) for j, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))]


@st.composite
def chunkings(draw) -> list[tuple]:
    """A random chunking of ITEMS into 1 to 12 frames; now and then no frame at all (the input
    ends at once)."""
    if draw(st.integers(0, 9)) == 0:
        return []
    count = draw(st.integers(0, len(ITEMS) - 1))
    return chunked(draw(st.lists(st.integers(1, len(ITEMS) - 1), min_size=count, max_size=count)))


VOICE = ("voice", 0, 0, 0)  # the value of a second entry, given when the call starts


def uses_voice(spec: Spec) -> bool:
    return any("voice" in group for groups in spec.groups for group in groups)


def streaming_text(spec: Spec) -> str:
    text = spec.text().replace("placeholder request: Json", "placeholder stream request: Json", 1)
    if uses_voice(spec):
        text = text.replace("placeholder stream request: Json", "placeholder stream request: Json\nplaceholder voice: Json", 1)
        text = text.replace("    entry  request\n", "    entry  request, voice\n", 1)
    return text


async def drive(runtime, frames: list, rng: random.Random, mode: str, given: dict | None = None) -> list[dict]:
    """The call's events, its input sent `mode`'s way at random moments."""
    given = dict(given or {})
    if mode == "call":
        return await collect(runtime, "g", {**given, "request": list(frames)})
    call = runtime.start("g", given)
    events: list[dict] = []

    async def read():
        async for item in call:
            events.append(item)
            await jitter(rng, 2)

    reader = asyncio.ensure_future(read())
    for frame in frames:
        await jitter(rng, 3)
        await call.send("request", frame)
    await jitter(rng)
    await call.end("request")
    await reader
    return events


def compare(
    text: str,
    behaviour,
    roles: dict[str, int],
    frames: list,
    seed: int,
    tmp_path,
    mode: str,
    given=None,
    ordered=(),
    deploy: str = "inproc",
    spec: Spec | None = None,
    behaviour_name: str | None = None,
):
    """Run `text` (graph `g`, streaming entry `request`) on flowrt and on the reference, and
    compare. `deploy` "local": the roles in replica processes (tests.deploy.reference_roles,
    which builds them from `spec`, or from `behaviour_name` for a hand-written program)."""
    result = check_source(text, "streaming.flow")
    require(result.ok)
    plan = build_plan(result.program).as_json()
    assert plan["graphs"]["g"]["entry_stream"] == ["request"]
    expected = run_reference(plan, "g", {**(given or {}), "request": list(frames)}, behaviour)
    assert expected.leftover_buckets == 0

    async def flowrt_run():
        rng = random.Random(seed)
        log: list = []
        instances = {role: [Role(f"{role}.run", behaviour, rng, log) for _ in range(n)] for role, n in roles.items()}
        runtime = await open_runtime(text, tmp_path, instances)
        try:
            events = await asyncio.wait_for(drive(runtime, frames, rng, mode, given), 5)
            assert_clean(runtime)
        finally:
            await runtime.close()
        return events, log

    if deploy == "inproc":
        events, log = asyncio.run(flowrt_run())
    else:
        from tests.deploy.reference_roles import run_deployed

        def deployed_drive(runtime):
            return drive(runtime, frames, random.Random(seed), mode, given)

        events, log = run_deployed(spec, behaviour, text, seed, tmp_path, deploy, deployed_drive, behaviour_name)
    event(f"frames: {min(len(frames), 6)}{'+' if len(frames) > 6 else ''}; mode: {mode}")
    event(f"status: {done(events)['status']}")
    assert normalize(log) == normalize(expected.activations)
    got: dict = {}
    for e in events:
        if e["event"] == "stream":
            got.setdefault(e["field"], []).append(freeze(e["value"]))
    want = {f: sorted((freeze(x) for x in v), key=repr) for f, v in expected.streams.items()}
    assert {f: sorted(v, key=repr) for f, v in got.items()} == want
    outputs = {o["field"]: o for o in plan["graphs"]["g"]["outputs"]}
    for name in ordered:
        if name in outputs and timed(plan["graphs"]["g"], outputs[name], expected.untimed, expected.reach):
            assert in_key_order(got.get(name, []), expected.stream_keys.get(name, [])), name
    returned = {e["field"]: freeze(e["value"]) for e in events if e["event"] == "return"}
    for name, value in expected.returns.items():
        if name != "gathered":  # (a join's `all` frames come in arrival order: compared in the activations)
            assert returned.get(name) == freeze(value), name
    end = done(events)
    shown = expected.errors if expected.errors <= MAX_REPORTED_ERRORS else MAX_REPORTED_ERRORS + 1
    assert len(end["errors"]) == shown
    returns = [o["field"] for o in plan["graphs"]["g"]["outputs"] if o["kind"] == "return"]
    missing = [f for f in returns if f not in expected.returns]
    assert end["missing"] == missing
    assert end["status"] == ("error" if expected.errors and (expected.errored_outputs or missing) else "ok")


def check_spec(spec: Spec, frames: list, seed: int, tmp_path, mode: str, deploy: str = "inproc") -> None:
    if spec.ordered is None:
        streamed = sorted({f for outs in spec.outputs for f in outs})
        spec.ordered = tuple(f for f in streamed if zlib.crc32(f"{seed}{f}".encode()) % 3)
    roles = {f"r{i}": spec.replicas[i] for i in range(len(spec.outputs))} | ({"gather": 1} if spec.join else {})
    given = {"voice": VOICE} if uses_voice(spec) else None
    event(f"a second entry: {given is not None}")
    text = streaming_text(spec)
    compare(text, behaviour_for(spec), roles, frames, seed, tmp_path, mode, given, spec.ordered, deploy, spec)


@st.composite
def streaming_specs(draw, back_edges: bool) -> Spec:
    """The reference tests' random programs, whose entry streams; a join may also take every
    frame, and a group that takes the entry may also take a second entry given at the start
    (`request & voice`: the frames are then a stream slot, collected until the input ends)."""
    spec = draw(specs(back_edges=back_edges))
    if not back_edges and draw(st.integers(0, 2)) == 0:
        spec.join = ["request", *(spec.join or [])][:2]
    if draw(st.booleans()):
        for groups in spec.groups:
            for group in groups:
                if "request" in group and draw(st.booleans()):
                    group.append("voice")
    return spec


@SETTINGS
@given(spec=streaming_specs(back_edges=False), frames=chunkings(), seed=st.integers(0, 2**16), mode=st.sampled_from(MODES))
def test_random_dags_with_a_streaming_entry_match_the_reference(spec, frames, seed, mode, tmp_path):
    check_spec(spec, frames, seed, tmp_path, mode)


@SETTINGS
@given(spec=streaming_specs(back_edges=True), frames=chunkings(), seed=st.integers(0, 2**16), mode=st.sampled_from(MODES))
def test_random_loops_with_a_streaming_entry_match_the_reference(spec, frames, seed, mode, tmp_path):
    check_spec(spec, frames, seed, tmp_path, mode)


# ── hand-written topologies, each under random chunkings and delays ──

# the entry met every way a stream producer's field is: per frame by an `lb session` node that
# streams (r0, ordered), in a bucket beside another entry (r1: a stream slot, the input's end
# closes it), by a count join (r2: its first 2 frames) and by an `all` join (r3, over r0's words)
DUPLEX = """
placeholder stream request: Json
placeholder voice: Json

role r0 {
    impl "m:R0"
    lb session
    interface run { in request  out stream f0: Json }
}
role r1 {
    impl "m:R1"
    interface run { in request & voice  out f1: Json }
}
role r2 {
    impl "m:R2"
    interface run { join { request: 2 }  out f2: Json }
}
role r3 {
    impl "m:R3"
    interface run { join { f0: all }  out f3: Json }
}

graph g {
    entry  request, voice
    stream f0 ordered
    stream f1
    return f2, f3
}
"""

# the entry is a diamond root: two roles per frame (3 replicas each), their outputs met per frame
# by r2 (Rule C, keyed by the entry's frame), which streams, ordered
DIAMOND = """
placeholder stream request: Json

role r0 {
    impl "m:R0"
    replicas 3
    interface run { in request  out f0: Json }
}
role r1 {
    impl "m:R1"
    replicas 3
    interface run { in request  out stream f1: Json }
}
role r2 {
    impl "m:R2"
    interface run { in f0 & f1  out stream f2: Json }
}

graph g {
    entry  request
    stream f2 ordered
}
"""

# per frame through 3 replicas (out of order), then put back in order by an `lb session` node
# and an ordered stream; an `all` join over the entry sees every frame once it has ended
CHAIN = """
placeholder stream request: Json

role r0 {
    impl "m:R0"
    replicas 3
    interface run { in request  out f0: Json }
}
role r1 {
    impl "m:R1"
    lb session
    replicas 2
    interface run { in f0  out stream f1: Json }
}
role r2 {
    impl "m:R2"
    interface run { join { request: all, f1: all }  out f2: Json }
}

graph g {
    entry  request
    stream f0 ordered
    stream f1 ordered
    return f2
}
"""


def hand_behaviour(streaming: set[str]):
    """Deterministic per input: a role in `streaming` yields 0 to 2 frames per input (so some
    frames yield nothing), another 0 or 1; a join returns what it got (sorted: `all` comes in
    arrival order)."""

    def behaviour(node: str, inputs: dict) -> list[dict]:
        role = node.split(".")[0]
        out = f"f{role[1:]}"
        digest = zlib.crc32(repr(sorted((k, freeze(v)) for k, v in inputs.items())).encode())
        if any(isinstance(v, list) for v in inputs.values()):  # a join, or a stream slot
            return [
                {out: sorted((freeze(v) for vs in inputs.values() for v in (vs if isinstance(vs, list) else [vs])), key=repr)}
            ]
        depth = 1 + max(depth_of(v) for v in inputs.values())
        count = digest % 3 if role in streaming else (0 if digest % 5 == 0 else 1)
        return [{out: (node, digest % 997, k, depth)} for k in range(count)]

    return behaviour


HAND = {  # text, replicas, the entry given when the call starts, streaming roles, ordered streams
    "duplex": (DUPLEX, {"r0": 1, "r1": 1, "r2": 1, "r3": 1}, {"voice": ("voice", 0, 0, 0)}, {"r0"}, ("f0",)),
    "diamond": (DIAMOND, {"r0": 3, "r1": 3, "r2": 1}, None, {"r1", "r2"}, ("f2",)),
    "chain": (CHAIN, {"r0": 3, "r1": 2, "r2": 1}, None, {"r1"}, ("f0", "f1")),
}


def check_hand(name: str, mode: str, seed: int, tmp_path, deploy: str = "inproc") -> None:
    text, roles, given, streaming, ordered = HAND[name]
    rng = random.Random(seed)
    frames = chunked([rng.randint(0, len(ITEMS)) for _ in range(rng.randint(0, 8))]) if seed else []
    behaviour = hand_behaviour(streaming)
    named = "hand:" + ",".join(sorted(streaming))
    compare(text, behaviour, roles, frames, seed, tmp_path, mode, copy.deepcopy(given), ordered, deploy, None, named)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(HAND))
def test_hand_written_topologies_match_the_reference_for_random_chunkings(name, mode, seed, tmp_path):
    check_hand(name, mode, seed, tmp_path)
