"""The trace of one graph call in Chrome's trace event format (the JSON that Perfetto and
chrome://tracing open): every activation a complete event (ph "X") on the lane of the replica
that ran it, and a flow arrow (ph "s" to ph "f") from each frame's producer to each activation
that consumed it; the call itself is a complete event on the caller's lane, where the entry
values' arrows start. docs/observe.md describes the events and their args.

A replica's activations can overlap in time (a role awaits; another activation of it runs): a
lane is a replica's, and where its activations overlap the later ones go on further lanes of
the same replica ("vae#0 (2)"), so no two events of a lane overlap and Perfetto draws every
one. `CallTrace` is an observer (flowrt.observe.hooks) of one call; `chrome_trace()` gives
the JSON value once the call has ended.
"""

from __future__ import annotations

import os
from typing import Any

from flowrt.observe.hooks import Observer, now, outcome

CALLER_LANE = "call"
RECORD = ("aid", "role", "interface", "replica", "start", "end", "inputs", "frames", "outcome", "input_bytes")
ENTRY = (0, 0)  # the frame id of the caller's entry values (flowrt.control.call.ENTRY_FRAMES)


def frame_id(frame: tuple) -> str:
    """A frame's id as traces write it: PRODUCER_AID:YIELD_INDEX ("0:0": the entry values)."""
    return f"{frame[0]}:{frame[1]}"


def payload_bytes(inputs: dict) -> int:
    """The bytes of the tensors and byte strings among an activation's inputs (a list's items
    counted too): what a deployment that copies frames moves; in process nothing is copied."""
    total = 0
    for value in inputs.values():
        for item in value if isinstance(value, list) else (value,):
            if isinstance(item, (bytes, bytearray, memoryview)):
                total += len(item)
            else:
                nbytes = getattr(item, "nbytes", None)
                if isinstance(nbytes, int):
                    total += nbytes
    return total


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
        pid = self.pid
        records = [dict(zip(RECORD, record, strict=True)) for record in self.activations]
        for record in records:
            record["inputs"] = [frame_id(f) for f in record["inputs"]]
            record["outcome"] = outcome(record["outcome"])
        lanes = _lanes(records)
        names = sorted({lane for lane, _ in lanes.values()}, key=_lane_order)
        tids = {name: index + 1 for index, name in enumerate([CALLER_LANE, *names])}
        events: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"{self.process} (pid {pid})"}}
        ]
        for name, tid in tids.items():
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        call_args = {"call_id": self.call_id, "graph": self.graph, "session": self.session, "status": self.status}
        events.append(self._complete(f"call {self.graph}", "call", self.started, self.ended, tids[CALLER_LANE], call_args))
        where = {ENTRY[0]: (tids[CALLER_LANE], self.started, self.ended)}  # a producer's aid -> its lane and times
        for record in records:
            where[record["aid"]] = (tids[lanes[record["aid"]][0]], record["start"], record["end"])
        arrows = 0
        for record in sorted(records, key=lambda r: (r["start"], r["aid"])):
            tid = tids[lanes[record["aid"]][0]]
            args = {
                "role": record["role"],
                "interface": record["interface"],
                "replica": record["replica"],
                "process": pid,
                "call_id": self.call_id,
                "session": self.session,
                "graph": self.graph,
                "aid": record["aid"],
                "inputs": record["inputs"],
                "frames": record["frames"],
                "outcome": record["outcome"],
                "input_bytes": record["input_bytes"],
            }
            name = f"{record['role']}.{record['interface']}"
            events.append(self._complete(name, "activation", record["start"], record["end"], tid, args))
            for frame in record["inputs"]:
                producer = int(frame.split(":")[0])
                if producer not in where:
                    continue  # (a producer this trace did not see: none in one call)
                producer_tid, producer_start, producer_end = where[producer]
                arrows += 1
                # the arrow leaves the producer while both run (a stream), else as it ends
                leaves = min(max(record["start"], producer_start), producer_end)
                common = {"name": "frame", "cat": "frame", "id": arrows, "pid": pid, "bp": "e", "args": {"frame": frame}}
                events.append({**common, "ph": "s", "ts": self._us(leaves), "tid": producer_tid})
                events.append({**common, "ph": "f", "ts": self._us(record["start"]), "tid": tid})
        other = {**call_args, "process": pid, "activations": len(self.activations), "flowrt_trace": 1}
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}

    def _us(self, seconds: float) -> float:
        """A time as the trace's `ts`: microseconds since the call started, to the nanosecond."""
        return round((seconds - self.started) * 1e6, 3)

    def _complete(self, name: str, category: str, start: float, end: float, tid: int, args: dict) -> dict:
        duration = max(round(self._us(end) - self._us(start), 3), 0.001)  # ts + dur is the end's ts; (zero would hide it)
        return {
            "name": name,
            "cat": category,
            "ph": "X",
            "ts": self._us(start),
            "dur": duration,
            "pid": self.pid,
            "tid": tid,
            "args": args,
        }


def _replica_name(role: str, replica: int) -> str:
    return f"{role}#{'all' if replica == -2 else '?' if replica < 0 else replica}"


def _lanes(activations: list[dict]) -> dict[int, tuple[str, int]]:
    """Each activation's lane (by aid): its replica's, or a further lane of that replica where
    it overlaps one already there (interval partitioning: the first lane free at its start)."""
    placed: dict[int, tuple[str, int]] = {}
    free_at: dict[str, list[float]] = {}  # replica -> when each of its lanes is free again
    for record in sorted(activations, key=lambda r: (r["start"], r["aid"])):
        replica = _replica_name(record["role"], record["replica"])
        ends = free_at.setdefault(replica, [])
        index = next((i for i, end in enumerate(ends) if end <= record["start"]), len(ends))
        if index == len(ends):
            ends.append(0.0)
        ends[index] = record["end"]
        placed[record["aid"]] = (replica if index == 0 else f"{replica} ({index + 1})", index)
    return placed


def _lane_order(name: str) -> tuple:
    """Lanes by role, then replica number, then overflow lane."""
    replica, _, extra = name.partition(" (")
    role, _, number = replica.rpartition("#")
    return (role, int(number) if number.isdigit() else 1 << 30, int(extra.rstrip(")") or 1))
