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

A traced call pays for its trace at its end, so the text is made the fast way: activations and
arrows are msgspec structs encoded in C (building dicts and running json.dumps over them cost
four times as much: bench/observe_overhead.py).
"""

from __future__ import annotations

import dataclasses
import operator
import os
from typing import Any

import msgspec

from flowrt.observe.hooks import Observer, now, outcome

CALLER_LANE = "call"
RECORD = ("aid", "role", "interface", "replica", "start", "end", "inputs", "frames", "outcome", "input_bytes")
ENTRY = (0, 0)  # the frame id of the caller's entry values (flowrt.control.call.ENTRY_FRAMES)


def payload_bytes(inputs: dict) -> int:
    """The bytes of the tensors and byte strings among an activation's inputs (a list's items
    and a dataclass's fields counted too: an audio clip's samples, say): what a deployment that
    copies frames moves; in process nothing is copied."""
    total = 0
    for value in inputs.values():
        if type(value) in _NO_PAYLOAD:
            continue  # (most inputs are small values: one set lookup, not an attribute search)
        for item in value if isinstance(value, list) else (value,):
            total += _item_bytes(item)
            if dataclasses.is_dataclass(item) and not isinstance(item, type):
                total += sum(_item_bytes(getattr(item, field.name)) for field in dataclasses.fields(item))
    return total


def _item_bytes(item: Any) -> int:
    if isinstance(item, (bytes, bytearray, memoryview)):
        return len(item)
    if type(item) in _NO_PAYLOAD:
        return 0
    nbytes = getattr(item, "nbytes", None)
    return nbytes if isinstance(nbytes, int) and not isinstance(nbytes, bool) else 0


_NO_PAYLOAD = frozenset({str, int, float, bool, type(None), dict, tuple})  # values that carry no tensor or bytes


class CallTrace(Observer):
    """Records the first call it hears of (a trace is one call's); later calls are ignored."""

    frames = True  # every activation's consumed frames, for the arrows

    def __init__(self, process: str = "flowrt") -> None:
        self.process = process
        self.pid = os.getpid()
        self.call_id: int | None = None
        self.graph = ""
        self.session = ""
        self.status = ""
        self.started = 0.0
        self.ended = 0.0
        self.activations: list[tuple] = []  # RECORD's fields, in the order they ended

    def call_started(self, call: Any) -> None:
        if self.call_id is None:
            self.call_id, self.graph, self.session = call.call_id, call.graph, call.session
            self.started = now()

    def activation_started(self, call: Any, act: Any) -> None:
        if act.started == 0.0:
            act.started = now()

    def activation_ended(self, call: Any, act: Any, reason: Any) -> None:
        if call.call_id != self.call_id:
            return
        node = act.node  # a tuple now (RECORD names its fields), dicts and strings when the JSON is built
        inputs = act.inputs
        self.activations.append(
            (act.aid, node.role, node.method, act.replica, act.started, now(), act.sources, act.yielded, reason,
             payload_bytes(inputs) if inputs else 0)
        )  # fmt: skip

    def call_ended(self, call: Any, status: str) -> None:
        if call.call_id == self.call_id:
            self.status = status
            self.ended = now()

    # ── the JSON ──

    def chrome_trace(self) -> dict:
        """The call as Chrome trace JSON: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}."""
        return msgspec.json.decode(self.chrome_trace_json())

    def chrome_trace_json(self) -> bytes:
        """`chrome_trace()` as JSON text (UTF-8), made without the dicts (module docstring)."""
        pid, call_id, session, graph, origin = self.pid, self.call_id, self.session, self.graph, self.started
        records = sorted(self.activations, key=_START_THEN_AID)
        lanes = _lanes(records)
        tids, metadata = _layout(self.process, pid, frozenset(lanes.values()))
        events: list[Any] = list(metadata)
        call_args = {"call_id": call_id, "graph": graph, "session": session, "status": self.status}
        events.append(_complete(f"call {graph}", "call", 0.0, _us(self.ended, origin), pid, 1, call_args))
        where = {ENTRY[0]: (1, 0.0, _us(self.ended, origin))}  # a producer's aid -> its lane and times (µs)
        for record in records:
            aid, start, end = record[0], record[4], record[5]
            where[aid] = (tids[lanes[aid]], int((start - origin) * 1e9) / 1e3, int((end - origin) * 1e9) / 1e3)
        arrows = 0
        for aid, role, interface, replica, _, _, sources, frames, reason, input_bytes in records:
            tid, start, end = where[aid]
            inputs = [f"{producer}:{index}" for producer, index in sources]
            args = _ActivationArgs(
                role, interface, replica, pid, call_id, session, graph, aid, inputs, frames,
                "ok" if reason is None else outcome(reason), input_bytes,
            )  # fmt: skip
            duration = int((end - start) * 1e3 + 0.5) / 1e3 or 0.001  # (zero would hide it)
            events.append(_Complete(_label(role, interface), "activation", start, duration, pid, tid, args))
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


_START_THEN_AID = operator.itemgetter(4, 0)  # a record's start, then its aid


def _replica_name(role: str, replica: int) -> str:
    name = _REPLICA_NAMES.get((role, replica))
    if name is None:
        name = f"{role}#{'all' if replica == -2 else '?' if replica < 0 else replica}"
        _remember(_REPLICA_NAMES, (role, replica), name)
    return name


def _label(role: str, interface: str) -> str:
    label = _LABELS.get((role, interface))
    if label is None:
        label = _remember(_LABELS, (role, interface), f"{role}.{interface}")
    return label


def _layout(process: str, pid: int, lanes: frozenset[str]) -> tuple[dict[str, int], tuple[dict, ...]]:
    """The lanes' thread ids (the caller's first, then by `_lane_order`) and the metadata
    events naming the process and its lanes. The same lanes recur call after call, so both are
    made once and shared by every trace that has them (traces are read, never changed)."""
    key = (process, pid, lanes)
    layout = _LAYOUTS.get(key)
    if layout is not None:
        return layout
    tids = {CALLER_LANE: 1}
    for index, name in enumerate(sorted(lanes, key=_lane_order)):
        tids[name] = index + 2
    metadata = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"{process} (pid {pid})"}}]
    for name, tid in tids.items():
        metadata.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        metadata.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return _remember(_LAYOUTS, key, (tids, tuple(metadata)))


# names and layouts made once, by what they are made of; bounded, as a call's roles and replicas
# are (a cache that fills up starts over)
_REPLICA_NAMES: dict[tuple[str, int], str] = {}
_LABELS: dict[tuple[str, str], str] = {}
_LAYOUTS: dict[tuple, tuple[dict[str, int], tuple[dict, ...]]] = {}
_CACHE_SIZE = 4096


def _remember(cache: dict, key: Any, value: Any) -> Any:
    if len(cache) >= _CACHE_SIZE:
        cache.clear()
    cache[key] = value
    return value


def _lanes(records: list[tuple]) -> dict[int, str]:
    """Each activation's lane (by aid), `records` sorted by start: its replica's, or a further
    lane of that replica where it overlaps one already there (interval partitioning: the first
    lane free at its start)."""
    placed: dict[int, str] = {}
    free_at: dict[str, list[float]] = {}  # replica -> when each of its lanes is free again
    for record in records:
        name = _replica_name(record[1], record[3])
        start, end = record[4], record[5]
        ends = free_at.get(name)
        if ends is None:
            free_at[name] = [end]
            placed[record[0]] = name
            continue
        for index, free in enumerate(ends):
            if free <= start:
                ends[index] = end
                break
        else:
            index = len(ends)
            ends.append(end)
        placed[record[0]] = name if index == 0 else f"{name} ({index + 1})"
    return placed


def _lane_order(name: str) -> tuple:
    """Lanes by role, then replica number, then overflow lane."""
    replica, _, extra = name.partition(" (")
    role, _, number = replica.rpartition("#")
    return (role, int(number) if number.isdigit() else 1 << 30, int(extra.rstrip(")") or 1))
