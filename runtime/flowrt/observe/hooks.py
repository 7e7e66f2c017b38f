"""The hooks the control core calls while a graph runs, and a fan-out to several observers.

An observer is installed as `Runtime.observer` (every call) or passed to `Runtime.call(...,
observer=)` (one call). The core calls it at five places, each behind one check, so a runtime
without an observer pays nothing else (bench/observe_overhead.py measures it):

    call_started(call)                   before the entry values are dispatched
    activation_started(call, act)        before a role's method is invoked
    activation_ended(call, act, reason)  after it returned, raised or was cancelled
    first_output(call)                   as the call's first event carrying an output (a
                                         `stream` or `return` event) is emitted; not at all
                                         for a call that emits none
    call_ended(call, status)             before the `done` event is emitted

`call` has `graph`, `call_id` and `session`; `act` has `node.role`, `node.method` (the
interface), `replica` (known once it started: -1 if it never did, -2 for `lb broadcast`),
`aid` (unique in the call), `sources` (the ids (producer aid, yield index) of the frames it
consumed; (0, 0) is the caller's entry values), `inputs`, `yielded` (frames produced) and
`started`; `reason` is None when the role ended normally, else an enum whose `value` is
"error" or "cancel". Hooks run inside the core's state machine: they must be quick and must
not raise, and they must not keep `call` or `act` beyond the call.

An observer whose `frames` attribute is true (a trace) also gets `act.sources`; tracking them
costs the core a little per frame, so observers that do not read them leave it false. One whose
`starts` (or `ends`) attribute is false is not called at `activation_started` (or
`activation_ended`): metrics need neither, their counts being the core's own (below). One whose
`first_output` is None is not called there either (a trace needs no such call).

`Activation.started` is when the activation started, in `now`'s clock: the control core sets it
before `activation_started` whenever a call has an observer, so every observer measures from
the same instant (an observer written for an older core sets it itself while it is 0.0).

The control core also counts, with no observer at all, each graph program's calls
(`calls_started`, and `calls_ended` by status), each interface node's activations
(`acts_started`, `acts_ended`, `acts_failed`, `acts_cancelled`, `frames_out`) and the frames
each node sent to each consumer (`outlets`). Where an observer installed a histogram on a node
(`duration_bounds`, and `duration_counts` one longer: the last bucket is +Inf), the core adds
each activation of a call with an observer to it (from `act.started` to its end) and to
`duration_sum`; where one installed them on a graph program (`call_bounds` for both,
`call_counts` and `first_counts`), it adds each call with an observer (from its start to its
end, and to its first output event) to them and to `call_sum` and `first_sum`.
flowrt.observe.metrics and flowrt.deploy.observed read them when metrics are scraped.
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
    starts = True  # whether `activation_started` is wanted (module docstring)
    ends = True  # whether `activation_ended` is wanted

    def call_started(self, call: Any) -> None:
        pass

    def activation_started(self, call: Any, act: Any) -> None:
        pass

    def activation_ended(self, call: Any, act: Any, reason: Any) -> None:
        pass

    def first_output(self, call: Any) -> None:
        pass

    def call_ended(self, call: Any, status: str) -> None:
        pass


HOOKS = ("call_started", "activation_started", "activation_ended", "first_output", "call_ended")


class Fanout(Observer):
    """Several observers, each called in turn (metrics and a call's trace, say). A hook only
    reaches the observers that override it, and where one does, the hook is its very method
    (an observer of calls alone adds nothing to an activation's cost)."""

    def __init__(self, *observers: Observer):
        self.observers = observers
        self.frames = any(observer.frames for observer in observers)
        self.starts = any(getattr(o, "starts", True) and _overrides(o, "activation_started") for o in observers)
        self.ends = any(getattr(o, "ends", True) and _overrides(o, "activation_ended") for o in observers)
        for hook in HOOKS:
            overriding = tuple(getattr(o, hook) for o in observers if _overrides(o, hook))
            if len(overriding) == 1:
                setattr(self, hook, overriding[0])
            elif not overriding:
                setattr(self, hook, getattr(Observer(), hook))
            else:
                setattr(self, f"_{hook}", overriding)

    def call_started(self, call: Any) -> None:
        for hook in self._call_started:
            hook(call)

    def activation_started(self, call: Any, act: Any) -> None:
        for hook in self._activation_started:
            hook(call, act)

    def activation_ended(self, call: Any, act: Any, reason: Any) -> None:
        for hook in self._activation_ended:
            hook(call, act, reason)

    def first_output(self, call: Any) -> None:
        for hook in self._first_output:
            hook(call)

    def call_ended(self, call: Any, status: str) -> None:
        for hook in self._call_ended:
            hook(call, status)


def _overrides(observer: Any, hook: str) -> bool:
    """Whether `observer` has `hook` and it is not Observer's no-op."""
    method = getattr(observer, hook, None)
    return method is not None and getattr(method, "__func__", None) is not getattr(Observer, hook)


def combine(*observers: Observer | None) -> Observer | None:
    """The observers given that are not None, as one: None if none is, the one if one is."""
    present = [each for o in observers if o is not None for each in (o.observers if type(o) is Fanout else (o,))]
    if not present:
        return None
    return present[0] if len(present) == 1 else Fanout(*present)
