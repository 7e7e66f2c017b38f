"""Interrupting a call (barge-in; docs/runtime.md, "Interrupting a call"): what a call made with
`interrupt=True` does to the calls of its session ahead of it, what the caller of an interrupted
call keeps, and what the next call's roles learn of it.

A graph says `interruptible` (docs/language.md); the runtime reads it from the plan
(`flowrt.tables.interruptible`). When a call with `interrupt` comes to its session, the session's
running call is cancelled with the reason `interrupted` if its graph is interruptible, and so is
every call of an interruptible graph still waiting ahead of it (they never start); a running call
of another graph is waited for as usual. An interrupted call's caller keeps the events it has
taken; from then on it gets nothing but `done` (status `cancelled`, reason `interrupted`), so
what the user was given is exactly what was taken before the interruption. The call leaves its
session as soon as it has ended, whether or not its caller reads that `done`, and the calls
behind it run.

What was delivered is counted where the caller takes events (`Taken`, one per call of an
interruptible graph): the frames of each streamed field. The interrupting call carries the
count (`Interrupted`: the interrupted call's id, graph and frames per field) to its roles as
`ctx.interrupted`: the record is written into the session's state of every global, under
`RECORD_KEY`, when the call takes its session's turn, and removed when it retires, so it travels
to a role in another process with the session's globals, as the prefix scope does
(flowrt.control.sessions). Roles that keep a history there (flowstd's `llm`) roll it back to
what was delivered; a role that uses no global keeps no history and sees None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

REASON = "interrupted"  # the `reason` of an interrupted call's `done`
RECORD_KEY = "~interrupted"  # where a global's session state carries the record (not a role's key)


@dataclass(frozen=True, slots=True)
class Interrupted:
    """What the user received of the call a call interrupted: `ctx.interrupted` (docs/runtime.md)."""

    call_id: int  # the interrupted call's `ctx.call_id`
    graph: str
    frames: Mapping[str, int] = field(default_factory=dict)  # per streamed field, the frames its caller took

    def state(self) -> dict[str, Any]:
        """The record as session state carries it (plain values, to any process)."""
        return {"call_id": self.call_id, "graph": self.graph, "frames": dict(self.frames)}

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> Interrupted:
        return cls(int(state["call_id"]), str(state["graph"]), MappingProxyType(dict(state["frames"])))


def seen(globals_: Mapping[str, Any]) -> Interrupted | None:
    """The record an activation's globals carry (`ctx.interrupted`), else None."""
    for state in globals_.values():
        record = state.get(RECORD_KEY) if isinstance(state, Mapping) else None
        if record is not None:
            return Interrupted.of(record)
    return None


class Taken:
    """What the caller of one call of an interruptible graph has taken: per streamed field, the
    frames. Once the call is interrupted (`stopped`), it takes nothing more but `done`."""

    __slots__ = ("frames", "stopped")

    def __init__(self) -> None:
        self.frames: dict[str, int] = {}
        self.stopped = False

    def take(self, event: dict) -> bool:
        """Whether the caller gets `event`; counts it if it is a streamed frame."""
        kind = event["event"]
        if self.stopped:
            return kind == "done"
        if kind == "stream":
            name = event["field"]
            self.frames[name] = self.frames.get(name, 0) + 1
        return True


class Waiting:
    """A call waiting for its session's turn: interrupted (never to start) by a later call, which
    then carries the record this one carried (what the user last received is still that)."""

    __slots__ = ("interruptible", "interrupted", "record")

    def __init__(self, interruptible: bool, record: Interrupted | None):
        self.interruptible = interruptible
        self.interrupted = False
        self.record = record


class Interrupts:
    """One runtime's: which graphs are interruptible, what the callers of their running calls
    have taken, the calls waiting per session, and the records the interrupting calls carry."""

    __slots__ = ("interruptible", "taken", "waiting", "carried")

    def __init__(self, interruptible: frozenset[str]):
        self.interruptible = interruptible
        self.taken: dict[Any, Taken] = {}  # call -> its caller's tally, while it is in flight
        self.waiting: dict[str, list[Waiting]] = {}  # session -> its calls waiting for their turn
        self.carried: dict[Any, tuple[str, ...]] = {}  # call -> the globals whose state carries its record

    def interrupt(self, session: str, calls: Any) -> tuple[Interrupted | None, list]:
        """A call with `interrupt` came to `session`: cancel its running call of an interruptible
        graph and every such call waiting. The record the new call carries, and the calls cancelled
        (the runtime retires each once it has ended)."""
        record = None
        cancelled = []
        for call in calls:
            if call.session != session or call.ended or call.cancelled or call.graph not in self.interruptible:
                continue
            taken = self.taken.get(call)
            if taken is not None:
                taken.stopped = True
                record = Interrupted(call.call_id, call.graph, MappingProxyType(dict(taken.frames)))
            call.cancel(REASON)
            cancelled.append(call)
        for waiting in self.waiting.get(session, ()):
            if waiting.interruptible and not waiting.interrupted:
                waiting.interrupted = True
                if record is None:
                    record = waiting.record
        return record, cancelled

    def wait(self, session: str, graph: str, record: Interrupted | None) -> Waiting:
        waiting = Waiting(graph in self.interruptible, record)
        self.waiting.setdefault(session, []).append(waiting)
        return waiting

    def admitted(self, session: str, waiting: Waiting) -> None:
        """`waiting` has its session's turn (or gave up waiting)."""
        queue = self.waiting.get(session)
        if queue is not None and waiting in queue:
            queue.remove(waiting)
            if not queue:
                del self.waiting[session]

    def started(self, call: Any, record: Interrupted | None, states: dict, names: list[str]) -> None:
        """`call` has its turn: its caller's tally, and the record it carries written into the
        session's state of each global in `names` (`states`: the runtime's session globals)."""
        if call.graph in self.interruptible:
            self.taken[call] = Taken()
        if record is not None and names:
            value = record.state()
            for name in names:
                states[(call.session, name)][RECORD_KEY] = value
            self.carried[call] = tuple(names)

    def retired(self, call: Any, states: dict) -> None:
        self.taken.pop(call, None)
        for name in self.carried.pop(call, ()):
            state = states.get((call.session, name))
            if state is not None:
                state.pop(RECORD_KEY, None)
