"""The hooks the control core calls while a graph runs, and a fan-out to several observers.

An observer is installed as `Runtime.observer` (every call) or passed to `Runtime.call(...,
observer=)` (one call). The core calls it at four places, each behind one `is None` check, so
a runtime without an observer pays nothing else (bench/observe_overhead.py measures it):

    call_started(call)                   before the entry values are dispatched
    activation_started(call, act)        before a role's method is invoked
    activation_ended(call, act, reason)  after it returned, raised or was cancelled
    call_ended(call, status)             before the `done` event is emitted

`call` has `graph`, `call_id` and `session`; `act` has `node.role`, `node.method` (the
interface), `replica` (known once it started: -1 if it never did, -2 for `lb broadcast`),
`aid` (unique in the call), `sources` (the ids (producer aid, yield index) of the frames it
consumed; (0, 0) is the caller's entry values), `inputs`, `yielded` (frames produced) and
`started`; `reason` is None when the role ended normally, else an enum whose `value` is
"error" or "cancel". Hooks run inside the core's state machine: they must be quick and must
not raise, and they must not keep `call` or `act` beyond the call.

An observer whose `frames` attribute is true (a trace) also gets `act.sources`; tracking them
costs the core a little per frame, so observers that do not read them leave it false.

`Activation.started` is shared by every observer of a call: the first to see an activation
sets it from `now` (only while it is 0.0), so every observer measures from the same instant.
"""

from __future__ import annotations

import time
from typing import Any

now = time.perf_counter  # the clock of every observer: seconds, monotonic


def outcome(reason: Any) -> str:
    """An activation's outcome as metrics and traces label it: ok, error, cancel (or empty)."""
    return "ok" if reason is None else str(getattr(reason, "value", reason))


class Observer:
    """Hooks that do nothing: subclass and override the ones you need."""

    frames = False  # whether `act.sources` is wanted (module docstring)

    def call_started(self, call: Any) -> None:
        pass

    def activation_started(self, call: Any, act: Any) -> None:
        pass

    def activation_ended(self, call: Any, act: Any, reason: Any) -> None:
        pass

    def call_ended(self, call: Any, status: str) -> None:
        pass


class Fanout(Observer):
    """Several observers, each called in turn (metrics and a call's trace, say)."""

    def __init__(self, *observers: Observer):
        self.observers = observers
        self.frames = any(observer.frames for observer in observers)

    def call_started(self, call: Any) -> None:
        for observer in self.observers:
            observer.call_started(call)

    def activation_started(self, call: Any, act: Any) -> None:
        for observer in self.observers:
            observer.activation_started(call, act)

    def activation_ended(self, call: Any, act: Any, reason: Any) -> None:
        for observer in self.observers:
            observer.activation_ended(call, act, reason)

    def call_ended(self, call: Any, status: str) -> None:
        for observer in self.observers:
            observer.call_ended(call, status)


def combine(*observers: Observer | None) -> Observer | None:
    """The observers given that are not None, as one: None if none is, the one if one is."""
    present = [o for o in observers if o is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else Fanout(*present)
