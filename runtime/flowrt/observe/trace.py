"""The trace of one graph call in Chrome's trace event format (the JSON that Perfetto and
chrome://tracing open): every activation a complete event (ph "X") on the lane of the replica
that ran it, and a flow arrow (ph "s" to ph "f") from each frame's producer to each activation
that consumed it; the call itself is a complete event on the caller's lane, where the entry
values' arrows start. docs/observe.md describes the events and their args.

A replica's activations can overlap in time (a role awaits; another activation of it runs): a
lane is a replica's, and where its activations overlap the later ones go on further lanes of
the same replica ("vae#0 (2)"), so no two events of a lane overlap and Perfetto draws every
one. `CallTrace` is an observer (flowrt.observe.hooks) of one call; once the call has ended,
`chrome_trace_json()` gives the JSON text (what `?trace=1` and `flowc run --trace` write) and
`chrome_trace()` the same as a JSON value.

A traced call pays for its trace as it runs and at its end, so both halves have a C
implementation (flowrt.observe._tracewriter, built as flowrt.extensions.TRACE_WRITER says):
recording an activation as it ends (`Recorder`) and writing the text. This module's Python is
their specification, and runs where the extension cannot (`BACKEND` says which runs); the
tests hold the two to the same bytes, and the C writer hands this one what it would not write
exactly (times that are not finite, say). tracelayout has what both share: lanes, names, payload.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

from flowrt.extensions import TRACE_WRITER
from flowrt.observe.hooks import Observer, now, outcome
from flowrt.observe.tracelayout import (
    CALLER_LANE,
    START_THEN_AID,
    label,
    lanes,
    layout,
    payload_bytes,
    printable_trace,
)

__all__ = ["BACKEND", "CALLER_LANE", "RECORD", "CallTrace", "Recorder", "chrome_trace_json"]

RECORD = ("aid", "role", "interface", "replica", "start", "end", "inputs", "frames", "outcome", "input_bytes")
ENTRY = (0, 0)  # the frame id of the caller's entry values (flowrt.control.call.ENTRY_FRAMES)


class Recorder:
    """The recording half of a trace, in Python (the C one is `_tracewriter.Recorder`): the
    first call it hears of (`call_id`, `graph`, `session`, `status`, its `started` and `ended`
    in `now`'s clock) and each of its activations as it ends, a tuple of RECORD's fields (the
    node's role and interface, its replica, its times, the consumed frames' ids, the frames it
    made, how it ended, the bytes of its inputs) in `activations`, in the order they ended.
    Later calls are ignored. The control core stamps each activation's start
    (`act.started`), so a trace needs no `activation_started`."""

    def __init__(self, process: str = "flowrt") -> None:
        self.process = process  # the name of the trace's process (its lanes are the replicas')
        self.pid = os.getpid()
        self.call_id: Any = None
        self.graph = ""
        self.session: Any = ""
        self.status = ""
        self.started = 0.0
        self.ended = 0.0
        self.activations: list[tuple] = []

    def call_started(self, call: Any) -> None:
        if self.call_id is None:
            self.call_id, self.graph, self.session = call.call_id, call.graph, call.session
            self.started = now()

    def activation_ended(self, call: Any, act: Any, reason: Any) -> None:
        if call.call_id != self.call_id:
            return
        node = act.node  # a tuple now, dicts and strings when the JSON is written
        inputs = act.inputs
        self.activations.append(
            (act.aid, node.role, node.method, act.replica, act.started, now(), act.sources, act.yielded, reason,
             payload_bytes(inputs) if inputs else 0)
        )  # fmt: skip

    def call_ended(self, call: Any, status: str) -> None:
        if call.call_id == self.call_id:
            self.status = status
            self.ended = now()


_native, BACKEND = TRACE_WRITER.load()  # the C extension, or None: this module; BACKEND says which, in words
_Recorder = Recorder if _native is None else _native.Recorder


class CallTrace(_Recorder, Observer):
    """A trace of one call (`Recorder`: the first call it hears of), and its JSON."""

    frames = True  # every activation's consumed frames, for the arrows
    starts = False  # (the core stamps `act.started`)
    first_output = None  # (not needed: the control core then does not call it)

    # ── the JSON ──

    def chrome_trace(self) -> dict:
        """The call as Chrome trace JSON: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}."""
        return msgspec.json.decode(self.chrome_trace_json())

    def chrome_trace_json(self) -> bytes:
        """`chrome_trace()` as JSON text (UTF-8): what `?trace=1` and `flowc run --trace` write."""
        return _write(self)


def chrome_trace_json(trace: CallTrace) -> bytes:
    """A trace's JSON text, in Python: the specification of `_tracewriter.chrome_trace_json`.
    Where UTF-8 cannot encode a str of it (a session holding undecodable bytes), the trace is
    written with that str `printable`."""
    try:
        return _write_python(trace)
    except UnicodeEncodeError:
        return _write_python(printable_trace(trace))


def _write_python(trace: CallTrace) -> bytes:
    pid, call_id, session, graph, origin = trace.pid, trace.call_id, trace.session, trace.graph, trace.started
    records = sorted(trace.activations, key=START_THEN_AID)
    placed = lanes(records)
    lanes_of = layout(trace.process, pid, frozenset(placed))
    tids = lanes_of.tids
    events: list[Any] = [msgspec.Raw(lanes_of.metadata_json)]
    call_args = {"call_id": call_id, "graph": graph, "session": session, "status": trace.status}
    events.append(_complete(f"call {graph}", "call", 0.0, _us(trace.ended, origin), pid, 1, call_args))
    where = {ENTRY[0]: (1, 0.0, _us(trace.ended, origin))}  # a producer's aid -> its lane and times (µs)
    for record, lane in zip(records, placed, strict=True):
        where[record[0]] = (tids[lane], _us(record[4], origin), _us(record[5], origin))
    arrows = 0
    for aid, role, interface, replica, _, _, sources, frames, reason, input_bytes in records:
        tid, start, end = where[aid]
        inputs = [f"{producer}:{index}" for producer, index in sources]
        args = _ActivationArgs(
            role, interface, replica, pid, call_id, session, graph, aid, inputs, frames,
            "ok" if reason is None else outcome(reason), input_bytes,
        )  # fmt: skip
        duration = int((end - start) * 1e3 + 0.5) / 1e3 or 0.001  # (zero would hide it)
        events.append(_Complete(label(role, interface), "activation", start, duration, pid, tid, args))
        for (producer, _), frame in zip(sources, inputs, strict=True):
            seen = where.get(producer)
            if seen is None:
                continue  # (a producer this trace did not see: none in one call)
            producer_tid, producer_start, producer_end = seen
            arrows += 1
            # the arrow leaves the producer while both run (a stream), else as it ends
            leaves = producer_start if start < producer_start else producer_end if start > producer_end else start
            arrow_args = {"frame": frame}
            events.append(_Arrow("s", arrows, leaves, pid, producer_tid, arrow_args))
            events.append(_Arrow("f", arrows, start, pid, tid, arrow_args))
    other = {**call_args, "process": pid, "activations": len(records), "flowrt_trace": 1}
    return _ENCODE({"traceEvents": events, "displayTimeUnit": "ms", "otherData": other})


class _ActivationArgs(msgspec.Struct):
    """An activation's `args` (docs/observe.md lists them)."""

    role: str
    interface: str
    replica: int
    process: int
    call_id: Any
    session: Any
    graph: str
    aid: int
    inputs: list[str]
    frames: int
    outcome: str
    input_bytes: int


class _Complete(msgspec.Struct):
    """A complete event (ph "X")."""

    name: str
    cat: str
    ts: float
    dur: float
    pid: int
    tid: int
    args: Any
    ph: str = "X"


class _Arrow(msgspec.Struct):
    """One end of a flow arrow: "s" on the producer's lane, "f" on the consumer's (bound to
    the enclosing slice, `bp` "e")."""

    ph: str
    id: int
    ts: float
    pid: int
    tid: int
    args: dict
    name: str = "frame"
    cat: str = "frame"
    bp: str = "e"


_ENCODE = msgspec.json.Encoder().encode


def _us(seconds: float, origin: float) -> float:
    """A time as the trace's `ts`: microseconds since the call started, to the nanosecond."""
    return int((seconds - origin) * 1e9) / 1e3


def _complete(name: str, category: str, start: float, end: float, pid: int, tid: int, args: Any) -> _Complete:
    """A complete event; its duration at least 1 ns (zero would hide it)."""
    return _Complete(name, category, start, max(int((end - start) * 1e3 + 0.5) / 1e3, 0.001), pid, tid, args)


_write = chrome_trace_json if _native is None else _native.chrome_trace_json
