"""The trace recorder and writer in C (flowrt.observe._tracewriter) against their Python
specification (flowrt.observe.trace): the same record per activation for any inputs, the same
JSON text for any trace (hypothesis), the same trace of a real call; and which one runs
(flowrt.extensions.TRACE_WRITER: not compiled, stale or FLOWRT_PURE=1 runs the Python)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import shutil
import threading
from array import array
from types import SimpleNamespace

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowrt.control.signals import Reason
from flowrt.extensions import TRACE_WRITER
from flowrt.observe import Observer, trace
from tests.observe.helpers import REQUEST, RUNS, activations, check_trace

C = trace._native
needs_c = pytest.mark.skipif(C is None, reason=f"the C trace writer is not in use: {trace.BACKEND}")


# -- any trace: the same text ---------------------------------------------------------------------

text = st.text(max_size=12)  # any characters: quotes, backslashes, controls, non-ASCII
lane_names = st.sampled_from(["frontend", "vae", "llm"]) | st.text(min_size=1, max_size=6)


@st.composite
def traces(draw) -> SimpleNamespace:
    origin = draw(st.floats(0, 1e5))  # (a day: past 1e15 ns from the start the Python writer writes it)
    aids = draw(st.lists(st.integers(1, 10_000), unique=True, max_size=12))
    producers = st.sampled_from([0, 99_999, *aids])  # the caller's entry values, a producer not seen, an activation
    records = []
    for aid in aids:
        started = draw(st.just(0.0) | st.floats(0, 100).map(lambda s: origin + s))  # (0.0: it never started)
        ended = started + draw(st.floats(0, 10))
        sources = tuple(draw(st.lists(st.tuples(producers, st.integers(0, 40)), max_size=4)))
        reason = draw(st.sampled_from([None, Reason.ERROR, Reason.CANCEL]))
        role, interface = draw(lane_names), draw(lane_names)
        replica = draw(st.integers(-2, 3))
        frames, input_bytes = draw(st.integers(0, 100)), draw(st.integers(0, 2**40))
        records.append((aid, role, interface, replica, started, ended, sources, frames, reason, input_bytes))
    return SimpleNamespace(
        process=draw(text), pid=draw(st.integers(1, 2**22)), call_id=draw(st.integers(0, 2**63) | text),
        graph=draw(text), session=draw(text | st.none()), status=draw(st.sampled_from(["ok", "error", "cancelled"])),
        started=origin, ended=origin + draw(st.floats(0, 200)), activations=draw(st.permutations(records)),
    )  # fmt: skip


@needs_c
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_the_c_writer_writes_the_very_text_of_the_python_one(call):
    written = C.write_only(call)  # (not handed over to the Python writer)
    assert written == trace.chrome_trace_json(call)
    assert msgspec.json.decode(written)["otherData"]["activations"] == len(call.activations)


@pytest.mark.parametrize("session", ["lone \ud800 surrogate", "undecodable \udcff byte"])
def test_a_str_utf8_cannot_encode_is_written_escaped_alike(session):
    # (an HTTP header or a command-line argument with bytes that are not UTF-8 decodes so)
    call = SimpleNamespace(process="p", pid=1, call_id=1, graph="g", session=session, status="ok", started=0.0,
                           ended=1.0, activations=[(1, "r", "m", 0, 0.5, 0.6, ((0, 0),), 1, None, 0)])  # fmt: skip
    written = trace.chrome_trace_json(call)
    assert msgspec.json.decode(written)["otherData"]["session"] == session.encode("utf-8", "backslashreplace").decode()
    if C is not None:
        assert C.chrome_trace_json(call) == written


@needs_c
def test_a_long_trace_in_any_order_is_sorted_alike():
    rng = random.Random(7)
    records = [(aid, f"r{aid % 5}", "m", aid % 3, rng.uniform(0, 50), 0.0, ((rng.randrange(aid), 0),), 1, None, 0)
               for aid in range(1, 2001)]  # fmt: skip
    records = [(*r[:5], r[4] + rng.uniform(0, 5), *r[6:]) for r in records]
    for order in (records, records[::-1], rng.sample(records, len(records))):
        call = SimpleNamespace(process="p", pid=1, call_id=1, graph="g", session="s", status="ok", started=0.0,
                               ended=60.0, activations=order)  # fmt: skip
        assert C.write_only(call) == trace.chrome_trace_json(call)


@needs_c
@pytest.mark.parametrize("count", [47, 48, 49])  # (the C writer lays out and sorts up to 48 itself; past that, Python does)
def test_crowded_lanes_on_either_side_of_the_c_layouts_limit_are_laid_out_alike(count):
    rng = random.Random(count)
    records = []
    for aid in range(1, count + 1):  # two roles' replicas, their activations overlapping in many ways
        start = rng.choice([0.0, 1.0, rng.uniform(0, 4)])
        records.append((aid, f"r{aid % 2}", "m", aid % 3 - 1, start, start + rng.choice([0.0, 0.5, rng.uniform(0, 3)]),
                        ((rng.randrange(aid), 0), (aid + 500, 1)), 1, None, 0))  # fmt: skip
    call = SimpleNamespace(process="p", pid=1, call_id=1, graph="g", session="s", status="ok", started=0.0, ended=9.0,
                           activations=rng.sample(records, count))  # fmt: skip
    written = C.write_only(call)
    assert written == trace.chrome_trace_json(call)
    lanes = {e["args"]["name"] for e in msgspec.json.decode(written)["traceEvents"] if e["name"] == "thread_name"}
    assert any(" (" in lane for lane in lanes)  # overflow lanes were needed


@needs_c
@pytest.mark.parametrize("uptime", [1e5, 8803921.195016755, 3e9])  # seconds of perf_counter: a day, 102 days, a century
def test_an_activation_that_never_started_on_a_long_running_host_is_written_alike(uptime):
    # (its start is 0.0 in perf_counter's clock, which counts from the host's boot)
    call = SimpleNamespace(process="p", pid=1, call_id=1, graph="g", session="s", status="cancelled", started=uptime,
                           ended=uptime + 0.25, activations=[(1, "r", "m", -1, 0.0, uptime + 0.2, (), 0, None, 0),
                                                             (2, "r", "m", 0, uptime + 0.1, uptime + 0.2, ((1, 0),), 1, None, 0)])  # fmt: skip
    assert C.chrome_trace_json(call) == trace.chrome_trace_json(call)


def odd(**changes) -> SimpleNamespace:
    """A trace of three activations, with `changes` (of the trace, or `records`)."""
    records = changes.pop("records", None) or [
        (1, "r", "m", 0, 0.1, 0.2, ((0, 0),), 1, None, 0), (2, "r", "m", 1, 0.15, 0.3, ((1, 0),), 1, None, 0),
        (3, "s", "m", 0, 0.3, 0.4, ((1, 0), (2, 0)), 0, Reason.ERROR, 5),
    ]  # fmt: skip
    fields = dict(process="p", pid=1, call_id=1, graph="g", session="s", status="ok", started=0.0, ended=1.0)
    return SimpleNamespace(**{**fields, **changes, "activations": records})


@needs_c
@pytest.mark.parametrize(
    "call",
    [
        odd(ended=math.inf), odd(started=math.nan), odd(ended=1e30),
        odd(records=[(2**70, "r", "m", 0, 0.1, 0.2, (), 1, None, 0)]), odd(records=[(None, "r", "m", 0, 0.1, 0.2, (), 1, None, 0)]),
        odd(records=[(1, "r", "m", 0, 0.1, 0.2, (), 1, None, 0), (1, "r", "m", 0, 0.3, 0.4, ((1, 0),), 1, None, 0)]),
        odd(records=[(0, "r", "m", 0, 0.1, 0.2, ((0, 0),), 1, None, 0)]), odd(records=[(1.5, "r", "m", 0, 0.1, 0.2, ((1, 0),), 1, None, 0)]),
        odd(records=[(1, "r", "m", 0, 0.1, 0.2, [(0, 0)], 1, None, 0)]), odd(records=[(1, "r", "m", 0, math.nan, 0.2, (), 1, None, 0)]),
    ],
    ids=["inf end", "nan start", "far end", "huge aid", "no aid", "one aid twice", "aid 0", "float aid", "list sources", "nan"],
)  # fmt: skip
def test_what_the_c_writer_cannot_write_exactly_the_python_one_writes(call):
    with pytest.raises((C.Unwritable, TypeError, ValueError, OverflowError)):
        C.write_only(call)
    try:
        expected = trace.chrome_trace_json(call)
    except (TypeError, ValueError, OverflowError) as error:
        with pytest.raises(type(error)):
            C.chrome_trace_json(call)
    else:
        assert C.chrome_trace_json(call) == expected


# -- any activation: the same record --------------------------------------------------------------


@dataclasses.dataclass
class Clip:  # as flowstd's audio clips carry their samples
    pcm: bytes
    sample_rate: int


class Sized:
    def __init__(self, nbytes):
        self.nbytes = nbytes


class NumpyLike(Sized):
    """What payload counting reads of a tensor or an array: `nbytes`."""


leaves = st.one_of(
    st.text(max_size=3), st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False), st.binary(max_size=64),
    st.binary(max_size=64).map(bytearray), st.binary(max_size=64).map(memoryview),
    st.integers(0, 16).map(lambda n: array("d", bytes(8 * n))),  # (no `nbytes`: 0 both ways)
    st.binary(max_size=32).map(lambda b: Clip(b, 16000)), st.integers(0, 16).map(lambda n: NumpyLike(4 * n)),
    st.just(Clip), st.integers(0, 1000).map(Sized), st.sampled_from([Sized(True), Sized("many"), Sized(None)]),
    st.tuples(st.binary(max_size=8)), st.dictionaries(st.text(max_size=2), st.binary(max_size=8), max_size=2),
)  # fmt: skip
input_values = leaves | st.lists(leaves, max_size=4)


@needs_c
@settings(max_examples=300, deadline=None)
@given(inputs=st.dictionaries(st.text(max_size=4), input_values, max_size=4), reason=st.sampled_from([None, Reason.ERROR]))
def test_the_c_recorder_records_the_very_tuple_of_the_python_one(inputs, reason):
    call = SimpleNamespace(call_id=7, graph="chat", session="s1")
    act = SimpleNamespace(aid=3, node=SimpleNamespace(role="vae", method="encode"), replica=1, started=2.5,
                          sources=((0, 0), (2, 1)), yielded=4, inputs=inputs)  # fmt: skip
    records = []
    for recorder in (trace.Recorder("p"), C.Recorder("p")):
        recorder.call_started(call)
        recorder.activation_ended(call, act, reason)
        recorder.call_ended(call, "ok")
        ((record,),) = [recorder.activations]
        assert recorder.started <= record[5] <= recorder.ended  # (the end: when it was recorded)
        records.append(record[:5] + record[6:])
    assert records[0] == records[1]
    assert records[0][-1] == trace.payload_bytes(inputs)


@needs_c
def test_the_c_recorder_keeps_the_first_call_only():
    first, other = SimpleNamespace(call_id=1, graph="a", session="s"), SimpleNamespace(call_id=2, graph="b", session="t")
    act = SimpleNamespace(aid=1, node=SimpleNamespace(role="r", method="m"), replica=0, started=0.0, sources=(),
                          yielded=0, inputs={})  # fmt: skip
    recorder = C.Recorder()
    recorder.call_started(first)
    recorder.call_started(other)
    recorder.activation_ended(other, act, None)
    recorder.call_ended(other, "error")
    assert (recorder.call_id, recorder.graph, recorder.session, recorder.activations, recorder.status) == (1, "a", "s", [], "")
    assert recorder.process == "flowrt" and recorder.pid > 0


# -- a real call ---------------------------------------------------------------------------------


class PythonTrace(trace.Recorder, Observer):
    """CallTrace on the Python recorder (the specification), whichever one CallTrace uses."""

    frames, starts, first_output = True, False, None


def test_a_real_call_is_recorded_and_written_alike_by_both(tmp_path):
    from flowrt.control import Runtime
    from tests.observe.helpers import build_image_chat

    async def scenario() -> dict:
        runtime = await Runtime.open(build_image_chat(tmp_path))
        traces = {"C": trace.CallTrace("t"), "Python": PythonTrace("t")}
        try:
            for each in traces.values():
                async for _ in runtime.call("chat", REQUEST, session="s", observer=each):
                    pass
        finally:
            await runtime.close()
        return traces

    traces = asyncio.run(scenario())
    assert type(traces["C"]).__mro__[1] is (trace.Recorder if C is None else C.Recorder)
    texts = {name: trace.chrome_trace_json(each) for name, each in traces.items()}
    assert traces["C"].chrome_trace_json() == texts["C"]
    if C is not None:
        assert C.chrome_trace_json(traces["Python"]) == texts["Python"]
    shapes = {}
    for name, text in texts.items():
        value = msgspec.json.decode(text)
        check_trace(value, RUNS["request"])
        # the same activations, frames and arrows (not the same times: two calls)
        runs = sorted(
            (e["name"], e["tid"], e["args"]["inputs"], e["args"]["frames"], e["args"]["input_bytes"]) for e in activations(value)
        )
        arrows = sorted((e["ph"], e["tid"], e["args"]["frame"]) for e in value["traceEvents"] if e["ph"] in ("s", "f"))
        shapes[name] = (runs, arrows)
    assert shapes["C"] == shapes["Python"] and shapes["C"][1]


# -- which one runs ------------------------------------------------------------------------------


def test_a_stale_or_missing_trace_writer_falls_back_to_python(tmp_path, monkeypatch):
    monkeypatch.delenv("FLOWRT_PURE", raising=False)
    for name in TRACE_WRITER.sources:
        shutil.copy(TRACE_WRITER.directory / name, tmp_path)
    built_from = TRACE_WRITER.source_digest(tmp_path)
    assert TRACE_WRITER.choose(built_from, tmp_path) == (True, "C (Cython)")
    assert TRACE_WRITER.choose(None, tmp_path) == (False, "Python (the C extension was not compiled when flowrt was installed)")
    assert TRACE_WRITER.choose("anything", tmp_path / "wheel") == (True, "C (Cython)")  # no sources beside it
    with (tmp_path / "_tracewriter.pyx").open("a") as source:
        source.write("# edited\n")
    with pytest.warns(RuntimeWarning, match=r"trace recorder and writer .* older than its sources"):
        assert TRACE_WRITER.choose(built_from, tmp_path) == (False, "Python (the C extension is stale)")
    monkeypatch.setenv("FLOWRT_PURE", "1")
    assert TRACE_WRITER.choose(built_from, tmp_path) == (False, "Python (FLOWRT_PURE=1)")
    assert TRACE_WRITER.load() == (None, "Python (FLOWRT_PURE=1)")


@needs_c
def test_the_installed_trace_writer_was_built_from_these_sources():
    assert TRACE_WRITER.source_digest() == C.SOURCE_DIGEST
    assert issubclass(trace.CallTrace, C.Recorder)


class Sparse:
    """A value that cannot say its size, as a torch sparse tensor's `nbytes` raises (image_chat's
    roles read two numbers off it)."""

    def __getitem__(self, index):
        return 8.0

    def __len__(self):
        return 2

    @property
    def nbytes(self):
        raise RuntimeError("nbytes is not defined for sparse tensors")


class SparseVit:
    """image_chat's vit, answering with a Sparse."""

    async def encode(self, ctx, image_seg):
        return {"vit_emb": Sparse()}


def test_a_traced_call_whose_inputs_cannot_say_their_size_still_ends(tmp_path):
    from flowrt.control import Runtime
    from tests.observe.helpers import build_image_chat

    async def scenario() -> tuple[list, trace.CallTrace]:
        runtime = await Runtime.open(build_image_chat(tmp_path), instances={"vit": [SparseVit()]})
        traced = trace.CallTrace()
        try:
            events = [e async for e in runtime.call("chat", REQUEST, observer=traced, timeout=30)]
        finally:
            await runtime.close()
        return events, traced

    finished: list = []  # (in a thread of its own: such a call used to hang its loop past any timeout)
    runner = threading.Thread(target=lambda: finished.append(asyncio.run(scenario())), daemon=True)
    runner.start()
    runner.join(60)
    assert finished, "the traced call did not end within 60 s"
    events, traced = finished[0]
    assert events[-1]["event"] == "done" and events[-1]["status"] == "ok", events[-1]
    value = traced.chrome_trace()
    check_trace(value, RUNS["request"])
    assert any(e["args"]["inputs"] and e["name"] == "llm.generate" for e in activations(value))
    assert trace.payload_bytes({"view": memoryview(bytes(12)).cast("I", (3,))}) == 12  # (bytes, not items)
