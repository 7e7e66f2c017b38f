"""Streams are bounded (docs/runtime.md, rule 13): a streaming role that never awaits still
gives the loop a turn, so its timeout and the caller's cancellation reach it; it waits while
the caller has not taken its events, or while the activations its frames readied are behind,
so memory stays bounded however fast it yields."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flowrt.control import bounds
from flowrt.errors import shown
from tests.runtime.harness import assert_clean, collect, done, finishes_within, open_runtime

FIREHOSE = """
placeholder request: Json

role hose {
    impl "m:Hose"
    interface run { in request  out stream drop: Json  TIMEOUT }
}

graph g {
    entry  request
    stream drop
}
"""

FIREHOSE_INTO_SLOW = """
placeholder request: Json

role hose {
    impl "m:Hose"
    interface run { in request  out stream drop: Json }
}

role slow {
    impl "m:Slow"
    interface run { in drop  out stream sip: Json }
}

graph g {
    entry  request
    stream sip
}
"""


class Hose:
    """Yields without ever awaiting: only the runtime can give the loop a turn."""

    def __init__(self, frames: int | None = None):
        self.frames = frames
        self.yielded = 0

    async def run(self, ctx, request):
        while self.frames is None or self.yielded < self.frames:
            self.yielded += 1
            yield {"drop": self.yielded}


class Slow:
    """Waits for `gate` on every frame; counts how many run at once."""

    def __init__(self):
        self.gate = asyncio.Event()
        self.running = self.most = self.done = 0

    async def run(self, ctx, drop):
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.gate.wait()
            yield {"sip": drop}
        finally:
            self.running -= 1
            self.done += 1


def line_of(text: str) -> int:
    return next(n for n, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line)


def test_an_interface_timeout_stops_a_stream_that_never_awaits(tmp_path):
    hose = Hose()

    async def main():
        rt = await open_runtime(FIREHOSE.replace("TIMEOUT", "timeout 200ms"), tmp_path, {"hose": hose})
        taken = 0
        async for event in rt.call("g", {"request": 1}):
            taken += 1
            if event["event"] == "done":
                end = event
        assert_clean(rt)
        return end, taken

    end, taken = finishes_within(30, main())
    assert end["status"] == "cancelled" and end["reason"] == "timeout"
    assert [e["message"] for e in end["errors"]] == ["timed out after 0.2s"]
    yield_line = line_of('yield {"drop"')
    assert end["errors"][0]["where"] == f"{shown(__file__)}:{yield_line}"  # the `yield` it stood at
    assert taken == hose.yielded + 1  # every frame it yielded reached the caller, then `done`


def test_a_caller_that_stops_reading_stops_a_stream_that_never_awaits(tmp_path):
    hose = Hose()

    async def main():
        rt = await open_runtime(FIREHOSE.replace("TIMEOUT", ""), tmp_path, {"hose": hose})
        events = rt.call("g", {"request": 1})
        async for event in events:
            if event["value"] == 1000:
                break
        await events.aclose()
        assert_clean(rt)

    finishes_within(30, main())
    # it ran ahead of the caller by at most the outbox's bound and one turn's frames
    assert 1000 <= hose.yielded <= 1000 + bounds.OUTBOX_HIGH + bounds.PAUSE_EVERY


def test_a_stream_waits_while_its_caller_has_not_taken_its_events(tmp_path):
    hose = Hose(frames=5000)

    async def main():
        rt = await open_runtime(FIREHOSE.replace("TIMEOUT", ""), tmp_path, {"hose": hose})
        events = rt.call("g", {"request": 1})
        most = 0
        values = []
        async for event in events:
            most = max(most, rt.statistics()["undelivered_events"])
            if event["event"] == "stream":
                values.append(event["value"])
                for _ in range(3):  # a slow reader: the producer gets turns between our reads
                    await asyncio.sleep(0)
        assert_clean(rt)
        return most, values

    most, values = finishes_within(60, main())
    assert values == list(range(1, 5001))  # nothing lost, nothing reordered
    assert most <= bounds.OUTBOX_HIGH + bounds.PAUSE_EVERY


def test_a_stream_waits_while_the_activations_its_frames_readied_are_behind(tmp_path):
    hose, slow = Hose(frames=2000), Slow()

    async def main():
        rt = await open_runtime(FIREHOSE_INTO_SLOW, tmp_path, {"hose": hose, "slow": slow})
        task = asyncio.ensure_future(collect(rt, "g", {"request": 1}))
        while hose.yielded < bounds.CHILDREN_HIGH:  # it fills its quota of unfinished children
            await asyncio.sleep(0)
        for _ in range(50):  # and then waits, however many turns the loop takes
            await asyncio.sleep(0)
        held = hose.yielded
        slow.gate.set()
        events = await task
        assert_clean(rt)
        return held, events

    held, events = finishes_within(60, main())
    assert held == bounds.CHILDREN_HIGH
    assert slow.most <= bounds.CHILDREN_HIGH and slow.done == 2000
    assert done(events)["status"] == "ok"
    assert sorted(e["value"] for e in events if e["event"] == "stream") == list(range(1, 2001))


@pytest.mark.parametrize("frames", [1, bounds.PAUSE_EVERY, bounds.PAUSE_EVERY + 1, 3 * bounds.OUTBOX_HIGH])
def test_bounded_streams_deliver_every_frame_at_the_edges_of_the_bounds(tmp_path, frames):
    async def main():
        rt = await open_runtime(FIREHOSE.replace("TIMEOUT", ""), tmp_path, {"hose": Hose(frames)})
        events = await collect(rt, "g", {"request": 1})
        assert_clean(rt)
        return events

    events = finishes_within(30, main())
    assert [e["value"] for e in events if e["event"] == "stream"] == list(range(1, frames + 1))
    assert done(events)["status"] == "ok"


FIREHOSE_INTO_SESSION = FIREHOSE_INTO_SLOW.replace('impl "m:Slow"', 'impl "m:Slow"\n    lb session')


def test_a_stream_into_a_session_node_waits_while_the_session_node_is_behind(tmp_path):
    hose, slow = Hose(frames=3000), Slow()
    slow.gate.set()  # each activation still awaits once: the session node runs one at a time

    async def main():
        rt = await open_runtime(FIREHOSE_INTO_SESSION, tmp_path, {"hose": hose, "slow": slow})
        most, values = 0, []
        async for event in rt.call("g", {"request": 1}):
            most = max(most, rt.statistics()["held_for_order"])
            if event["event"] == "stream":
                values.append(event["value"])
        assert_clean(rt)
        return most, values

    most, values = finishes_within(60, main())
    assert values == list(range(1, 3001))  # a session node runs in key order: the hose's order
    assert most <= bounds.CHILDREN_HIGH
