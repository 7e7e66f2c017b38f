"""Property: flowrt and the reference interpreter agree on random programs under random
interleavings: the multiset of activations per node with the inputs each received, every
streamed frame, the number of errors and the call's status; and nothing is left behind."""

from __future__ import annotations

import asyncio
import copy
import random
import zlib
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from flowc.check import check_source
from flowc.plan import build_plan
from flowrt.control.contract import MAX_REPORTED_ERRORS
from tests.runtime.harness import assert_clean, collect, done, jitter, open_runtime
from tests.runtime.reference import freeze, run_reference
from tests.runtime.shard_fabric import open_fabric

REQUEST = ("request", 0, 0, 0)
MAX_DEPTH = 6


@dataclass
class Spec:
    outputs: list[list[str]]
    stream: list[bool]
    groups: list[list[list[str]]]
    join: list[str] | None
    session: list[bool]
    replicas: list[int]
    ordered: tuple[str, ...] | None = None  # fields streamed `ordered` (None: chosen by the seed)
    load_aware: list[bool] = field(default_factory=list)  # roles with `lb load_aware` (none where empty)

    def text(self) -> str:
        lines = ["placeholder request: Json", ""]
        for i, outs in enumerate(self.outputs):
            groups = " | ".join(" & ".join(g) for g in self.groups[i])
            lines += [f"role r{i} {{", f'    impl "m:R{i}"', f"    replicas {self.replicas[i]}"]
            if self.session[i]:
                lines.append("    lb session")
            elif i < len(self.load_aware) and self.load_aware[i]:
                lines.append("    lb load_aware")
            lines += [
                "    interface run {",
                f"        in  {groups}",
                f"        out {'stream ' if self.stream[i] else ''}{', '.join(f'{f}: Json' for f in outs)}",
                "    }",
                "}",
                "",
            ]
        streamed = sorted({f for outs in self.outputs for f in outs})
        ordered = set(self.ordered or ())
        if self.join:
            items = ", ".join(f"{f}: all" for f in self.join)
            lines += [
                "role gather {",
                '    impl "m:Gather"',
                "    interface run {",
                f"        join {{ {items} }}",
                "        out gathered: Json",
                "    }",
                "}",
                "",
            ]
        lines += ["graph g {", "    entry  request"]
        lines += [f"    stream {f}" + (" ordered" if f in ordered else "") for f in streamed]
        if self.join:
            lines.append("    return gathered")
        lines += ["}", ""]
        return "\n".join(lines)


@st.composite
def specs(draw, back_edges: bool) -> Spec:
    n = draw(st.integers(3, 8))
    outputs = [[f"f{i}", *draw(st.lists(st.sampled_from(["s0", "s1"]), max_size=1))] for i in range(n)]
    stream = [draw(st.booleans()) for _ in range(n)]
    groups = []
    for i in range(n):
        earlier = sorted({f for j in range(i) for f in outputs[j]} - {f for j in range(i, n) for f in outputs[j]})
        if not earlier or draw(st.integers(0, 4)) == 0:
            earlier = ["request", *earlier]
        node_groups = [draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=2, unique=True))]
        later = sorted({f for j in range(i, n) for f in outputs[j]})
        if back_edges and later and draw(st.integers(0, 2)) == 0:
            node_groups.append(draw(st.lists(st.sampled_from(later), min_size=1, max_size=1)))
        elif draw(st.integers(0, 3)) == 0 and len(earlier) > 1:
            node_groups.append(draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=2, unique=True)))
        groups.append(node_groups)
    join = None
    if not back_edges and draw(st.booleans()):
        join = draw(st.lists(st.sampled_from(sorted({f for o in outputs for f in o})), min_size=1, max_size=2, unique=True))
    session = [draw(st.integers(0, 3)) == 0 for _ in range(n)]
    replicas = [draw(st.integers(1, 3)) for _ in range(n)]
    load_aware = [not pinned and draw(st.integers(0, 3)) == 0 for pinned in session]
    return Spec(outputs, stream, groups, join, session, replicas, load_aware=load_aware)


def depth_of(value) -> int:
    if isinstance(value, list):
        return max((depth_of(v) for v in value), default=0)
    return value[3] if isinstance(value, tuple) and len(value) == 4 else 0


def behaviour_for(spec: Spec):
    def behaviour(node: str, inputs: dict) -> list[dict]:
        if node == "gather.run":
            return [{"gathered": sorted((freeze(v) for vs in inputs.values() for v in vs), key=repr)}]
        index = int(node[1:].split(".")[0])
        digest = zlib.crc32(repr(sorted((k, freeze(v)) for k, v in inputs.items())).encode())
        depth = 1 + max(depth_of(v) for v in inputs.values())
        if depth > MAX_DEPTH:
            return []  # every loop exits: deeper activations yield nothing
        if digest % 7 == 0:
            raise ValueError(f"{node} failed")
        count = digest % 4 if spec.stream[index] else (0 if digest % 9 == 0 else 1)
        frames = []
        for k in range(count):
            frame = {f: (node, digest % 997, k, depth) for i, f in enumerate(spec.outputs[index]) if (digest >> (k * 4 + i)) % 4}
            frames.append(frame)
        return frames

    return behaviour


class Role:
    def __init__(self, node: str, behaviour, rng: random.Random, log: list):
        self.node, self.behaviour, self.rng, self.log = node, behaviour, rng, log

    async def run(self, ctx, **inputs):
        self.log.append((self.node, tuple(sorted((k, freeze(v)) for k, v in inputs.items()))))
        await jitter(self.rng)
        frames = self.behaviour(self.node, inputs)
        for frame in frames:
            await jitter(self.rng, 2)
            yield frame


def normalize(activations):
    # a join passes `all` frames in arrival order, which depends on the schedule: compare sorted
    return sorted(
        (
            (node, tuple((k, tuple(sorted(v, key=repr)) if node == "gather.run" else v) for k, v in inputs))
            for node, inputs in activations
        ),
        key=repr,
    )


def event(text: str) -> None:
    if currently_in_test_context():  # the statistics of hypothesis runs; plain tests have none
        hypothesis_event(text)


def require(condition: bool) -> None:
    """Skip a generated example that is not a valid program; a hand-written one must be valid."""
    if currently_in_test_context():
        assume(condition)
    assert condition


def in_key_order(got: list, keyed: list) -> bool:
    """Whether `got` is the reference's (key, value) frames in key order, equal keys in any order."""
    keyed = sorted(keyed, key=lambda kv: kv[0])
    position = 0
    while position < len(keyed):
        key = keyed[position][0]
        block = [freeze(v) for k, v in keyed if k == key]
        if sorted(got[position : position + len(block)], key=repr) != sorted(block, key=repr):
            return False
        position += len(block)
    return position == len(got)


def timed(graph: dict, output: dict, untimed: set, reach: dict) -> bool:
    """Whether the keys of `output`'s frames are a function of the program and its inputs: no
    session node whose run order depends on timing is one of its producers or feeds one."""
    return not any(n in output["producers"] or any(p in reach[n] for p in output["producers"]) for n in untimed)


def check(spec: Spec, seed: int, tmp_path, behaviour=None, deploy: str = "inproc") -> None:
    """Run `spec` on flowrt (embedded, or `deploy`ed: flowrt.deploy) and on the reference
    interpreter, and compare."""
    if spec.ordered is None:  # stream `ordered` about two fields in three (docs/runtime.md, rule 7)
        streamed = sorted({f for outs in spec.outputs for f in outs})
        spec.ordered = tuple(f for f in streamed if zlib.crc32(f"{seed}{f}".encode()) % 3)
    text = spec.text()
    result = check_source(text, "random.flow")
    require(result.ok)
    plan = build_plan(result.program).as_json()
    behaviour = behaviour or behaviour_for(spec)
    expected = run_reference(plan, "g", {"request": REQUEST}, behaviour)
    assert expected.leftover_buckets == 0

    def roles(rng: random.Random, log: list) -> dict[str, list]:
        replicas = {f"r{i}": spec.replicas[i] for i in range(len(spec.outputs))} | ({"gather": 1} if spec.join else {})
        return {role: [Role(f"{role}.run", behaviour, rng, log) for _ in range(n)] for role, n in replicas.items()}

    async def flowrt_run():
        rng = random.Random(seed)
        log: list = []
        rt = await open_runtime(text, tmp_path, roles(rng, log))
        events = await asyncio.wait_for(collect(rt, "g", {"request": REQUEST}), 5)
        assert_clean(rt)
        return events, log

    async def sharded_run():
        rng = random.Random(seed)
        log: list = []
        fabric = await open_fabric(text, tmp_path, roles(rng, log), rng)
        try:
            events = await asyncio.wait_for(collect(fabric.runtimes[0], "g", {"request": REQUEST}), 5)
            await asyncio.wait_for(fabric.drained(), 5)
            assert not fabric.failures, fabric.failures
            assert_clean(fabric.runtimes[0])
            assert all(not any(stats.values()) for stats in fabric.statistics().values()), fabric.statistics()
        finally:
            await fabric.close()
        return events, log

    if deploy == "inproc":
        events, log = asyncio.run(flowrt_run())
    elif deploy == "shards":
        events, log = asyncio.run(sharded_run())
    else:
        from tests.deploy.reference_roles import run_deployed

        events, log = run_deployed(spec, behaviour, text, seed, tmp_path, deploy)
    event(f"activations: {min(len(log) // 5 * 5, 40)}+")
    event(f"errors: {bool(expected.errors)}")
    event(f"status: {done(events)['status']}")
    assert normalize(log) == normalize(expected.activations)
    got_streams: dict = {}
    for e in events:
        if e["event"] == "stream":
            got_streams.setdefault(e["field"], []).append(freeze(e["value"]))
    assert {f: sorted(v, key=repr) for f, v in got_streams.items()} == {
        f: sorted((freeze(x) for x in v), key=repr) for f, v in expected.streams.items()
    }
    outputs = {o["field"]: o for o in plan["graphs"]["g"]["outputs"]}
    for name in spec.ordered:
        if not timed(plan["graphs"]["g"], outputs[name], expected.untimed, expected.reach):
            event("ordered stream not compared (a session node runs in arrival order)")
            continue
        keys = [k for k, _ in expected.stream_keys.get(name, [])]
        event(f"ordered stream compared ({'with' if len(set(keys)) < len(keys) else 'no'} equal keys)")
        assert in_key_order(got_streams.get(name, []), expected.stream_keys.get(name, [])), name
    end = done(events)
    # (`done` lists the first MAX_REPORTED_ERRORS errors and one line counting the rest)
    shown = expected.errors if expected.errors <= MAX_REPORTED_ERRORS else MAX_REPORTED_ERRORS + 1
    assert len(end["errors"]) == shown
    missing = [f for f in (["gathered"] if spec.join else []) if f not in expected.returns]
    assert end["missing"] == missing
    status = "error" if expected.errors and (expected.errored_outputs or missing) else "ok"
    assert end["status"] == status


# Programs the compiler rejects (E209 shapes, by design) are skipped with assume(); with loops
# that can be most of a batch, which is expected, not a sign of a broken generator.
SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)


# a stream put back in order by an `lb session` node: r0 streams once; r1 (3 replicas, round
# robin, random delays) passes each frame on, out of order; r2 (`lb session`, 2 replicas) must
# run in r0's order and streams 3 frames per activation; r3 consumes those
SESSION_ORDERED = Spec(
    outputs=[["f0"], ["f1"], ["f2"], ["f3"]],
    stream=[True, False, True, False],
    groups=[[["request"]], [["f0"]], [["f1"]], [["f2"]]],
    join=None,
    session=[False, False, True, False],
    replicas=[1, 3, 2, 1],
    ordered=("f0", "f1", "f2", "f3"),
)


def session_chain(node: str, inputs: dict) -> list[dict]:
    depth = 1 + max(depth_of(v) for v in inputs.values())
    (value,) = inputs.values() if inputs else (("request", 0, 0, 0),)
    if node == "r0.run":
        return [{"f0": (node, k, k, depth)} for k in range(6)]
    if node == "r1.run":
        return [{"f1": (node, value[1], 0, depth)}]
    if node == "r2.run":
        return [{"f2": (node, value[1] * 10 + k, k, depth)} for k in range(3)]
    return [{"f3": (node, value[1], 0, depth)}]


@pytest.mark.parametrize("seed", range(8))
def test_a_stream_reordered_by_a_session_node_matches_the_reference(seed, tmp_path):
    # 18 frames of f2 from 6 activations of r2, whose inputs reach it out of order
    check(SESSION_ORDERED, seed, tmp_path, session_chain)


@SETTINGS
@given(spec=specs(back_edges=False), seed=st.integers(0, 2**16))
def test_random_dags_match_the_reference(spec, seed, tmp_path):
    check(spec, seed, tmp_path)


@SETTINGS
@given(spec=specs(back_edges=True), seed=st.integers(0, 2**16))
def test_random_loops_match_the_reference(spec, seed, tmp_path):
    check(spec, seed, tmp_path)


# cases the random search found (kept so every run checks them)
FOUND = {
    # a join's `all` field fed by a session node whose activation is still held for order: the
    # join must wait for it (the reference fired without it)
    "join-after-held-session-work": Spec(
        outputs=[["f0"], ["f1"], ["f2"], ["f3"], ["f4", "s0"], ["f5", "s1"], ["f6", "s1"]],
        stream=[False] * 7,
        groups=[[["request"]], [["request"]], [["request"]], [["request"]], [["request"], ["f0"]], [["request"]], [["request"]]],
        join=["s1"],
        session=[True, True, True, True, True, True, False],
        replicas=[1] * 7,
    ),
    # an ordered stream fed by two session nodes, r1 (streaming) and r4 (fed by r1, its frames
    # also feeding a loop): while r4's frame was being dispatched, a reorder set off by its
    # absent field saw r4's counter already past the frame and let r1's key (1,) out before
    # r4's (0,) (found under --deploy local; the counter now advances once the frame is out)
    "session-counter-mid-dispatch": Spec(
        outputs=[["f0", "s0"], ["f1", "s1"], ["f2"], ["f3"], ["f4", "s1"]],
        stream=[False, True, False, False, False],
        groups=[[["request"]], [["f0", "s0"]], [["request"], ["f4"]], [["request"], ["s1"]], [["f1"]]],
        join=None,
        session=[True] * 5,
        replicas=[1] * 5,
        ordered=("s1",),
    ),
    # an ordered session node with an open bucket of its own (`request & f0`, key ()): an
    # activation with a larger key must wait for it (flowrt ran it first)
    "session-node-own-bucket": Spec(
        outputs=[["f0"], ["f1"], ["f2"], ["f3"], ["f4"], ["f5"], ["f6"]],
        stream=[False, False, False, True, False, False, False],
        groups=[
            [["request"]],
            [["request"]],
            [["request", "f0"]],
            [["f1"]],
            [["f3"], ["request", "f0"]],
            [["request"]],
            [["request"], ["request"]],
        ],
        join=None,
        session=[True] * 7,
        replicas=[1] * 7,
    ),
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", sorted(FOUND))
def test_cases_the_search_found_match_the_reference(name, seed, tmp_path):
    check(copy.deepcopy(FOUND[name]), seed, tmp_path)


# ── the same programs with every role's replicas in hosts of their own (flowrt.control.shards) ──


@pytest.mark.parametrize("seed", range(8))
def test_sharded_a_stream_reordered_by_a_session_node_matches_the_reference(seed, tmp_path):
    check(SESSION_ORDERED, seed, tmp_path, session_chain, deploy="shards")


@SETTINGS
@given(spec=specs(back_edges=False), seed=st.integers(0, 2**16))
def test_sharded_random_dags_match_the_reference(spec, seed, tmp_path):
    check(spec, seed, tmp_path, deploy="shards")


@SETTINGS
@given(spec=specs(back_edges=True), seed=st.integers(0, 2**16))
def test_sharded_random_loops_match_the_reference(spec, seed, tmp_path):
    check(spec, seed, tmp_path, deploy="shards")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", sorted(FOUND))
def test_sharded_cases_the_search_found_match_the_reference(name, seed, tmp_path):
    check(copy.deepcopy(FOUND[name]), seed, tmp_path, deploy="shards")
