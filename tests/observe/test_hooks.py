"""flowrt.observe.hooks: a Fanout calls each hook on the observers that override it only (and
says which activation hooks the core must call at all); `combine` flattens fanouts; on a real
runtime, the core stamps `act.started` and skips the hooks an observer says it does not need,
while the metrics still count every activation."""

from __future__ import annotations

import asyncio

from flowrt.control import Runtime
from flowrt.observe import Fanout, Metrics, Observer, combine
from tests.observe.helpers import REQUEST, RUNS, build_image_chat


class Calls(Observer):
    starts = ends = False

    def __init__(self) -> None:
        self.seen: list[str] = []

    def call_started(self, call) -> None:
        self.seen.append("call_started")


class Ends(Observer):
    def __init__(self) -> None:
        self.started: list[float] = []

    def activation_ended(self, call, act, reason) -> None:
        self.started.append(act.started)


def test_a_fanout_reaches_only_the_observers_that_override_a_hook():
    calls, ends = Calls(), Ends()
    both = Fanout(calls, ends)
    assert both.call_started == calls.call_started  # the very method: no loop, no other observer
    assert both.activation_ended == ends.activation_ended
    assert not both.starts and both.ends and not both.frames
    assert combine(both, None, Metrics()).observers[:2] == (calls, ends)  # flattened
    assert combine(None, calls) is calls and combine(None, None) is None


def test_the_core_stamps_starts_and_skips_the_hooks_an_observer_does_not_need(tmp_path):
    async def scenario():
        runtime = await Runtime.open(build_image_chat(tmp_path))
        calls, ends, metrics = Calls(), Ends(), Metrics()
        runtime.observer = combine(calls, ends, metrics)
        try:
            events = [event async for event in runtime.call("chat", REQUEST)]
        finally:
            await runtime.close()
        return events, calls, ends, metrics

    events, calls, ends, metrics = asyncio.run(scenario())
    assert events[-1]["status"] == "ok"
    assert calls.seen == ["call_started"]
    assert len(ends.started) == sum(RUNS["request"].values()) and all(t > 0 for t in ends.started)
    ran = {(r, i): n for (r, i, _), n in RUNS["request"].items()}
    counted = {key: stats.count("acts_ended") for key, stats in metrics.interfaces.items() if stats.count("acts_ended")}
    assert counted == ran
    assert {key: sum(stats.latency().counts) for key, stats in metrics.interfaces.items() if key in ran} == ran
