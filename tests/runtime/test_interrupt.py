"""Interrupting a call (barge-in; docs/runtime.md, "Interrupting a call"): a call made with
`interrupt=True` cancels its session's running call of an `interruptible` graph (and the calls
of such graphs waiting ahead of it); the interrupted caller keeps what it took and gets nothing
more but `done` (reason `interrupted`); the new call's roles see what was delivered as
`ctx.interrupted`; a running call of another graph is waited for; nothing is left behind."""

from __future__ import annotations

import asyncio

import pytest

from flowrt.control.interrupts import Interrupted
from flowrt.errors import BadInputs
from tests.runtime.harness import done, open_runtime, streamed

FLOW = """
placeholder prompt: Text

global history: History {
    max_turns 8
}

role speaker {
    impl "m:Speaker"
    lb session
    uses history
    interface say {
        in  prompt
        out stream reply: Text
    }
}

graph chat {
    entry  prompt
    stream reply ordered
    interruptible
}

graph steady {
    entry  prompt
    stream reply ordered
}
"""


class Speaker:
    """Says the prompt's words one at a time, each when the test lets it (`allow`), and remembers
    what each activation saw: its call id, graph and `ctx.interrupted`."""

    def __init__(self):
        self.permits: asyncio.Queue = asyncio.Queue()
        self.seen: list[tuple[int, str, Interrupted | None]] = []
        self.waiting = asyncio.Event()  # set while an activation waits for its next permit
        self.said = 0

    def allow(self, frames: int) -> None:
        for _ in range(frames):
            self.permits.put_nowait(None)

    async def say(self, ctx, prompt):
        self.seen.append((ctx.call_id, ctx.graph, ctx.interrupted))
        for word in prompt.split():
            self.waiting.set()
            await self.permits.get()
            self.waiting.clear()
            self.said += 1
            yield {"reply": word}


class Reader:
    """A caller that reads a call's events in a task; with `pause_after`, it stops reading once it
    has taken that many frames, until `resume` is set."""

    def __init__(self, events, pause_after: int | None = None):
        self.events: list[dict] = []
        self.pause_after = pause_after
        self.resume = asyncio.Event()
        self.took: dict[int, asyncio.Event] = {}
        self.task = asyncio.ensure_future(self._read(events))

    async def _read(self, events):
        async for event in events:
            self.events.append(event)
            frames = len(streamed(self.events, "reply"))
            if event["event"] == "stream":
                if frames in self.took:
                    self.took[frames].set()
                if frames == self.pause_after:
                    await self.resume.wait()

    async def has(self, frames: int) -> None:
        if len(streamed(self.events, "reply")) < frames:
            await self.took.setdefault(frames, asyncio.Event()).wait()

    async def finished(self) -> list[dict]:
        await self.task
        return self.events


def assert_clean(runtime) -> None:
    """Nothing in flight; the session `s` keeps its globals' state while idle (the speaker `uses` one)."""
    stats = runtime.statistics()
    kept = {"sessions": stats.pop("sessions"), "idle_sessions": stats.pop("idle_sessions")}
    assert all(v == 0 for v in stats.values()), stats
    assert kept["sessions"] == kept["idle_sessions"] <= 1, kept


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 10))


async def waiting_for_permit(speaker: Speaker) -> None:
    await speaker.waiting.wait()
    await asyncio.sleep(0)  # (its frame before is dispatched: the activation is past its yield)


def test_an_interrupting_call_cancels_the_running_one_within_a_frame(tmp_path):
    async def main():
        speaker = Speaker()
        runtime = await open_runtime(FLOW, tmp_path, {"speaker": speaker})
        first = Reader(runtime.call("chat", {"prompt": "one two three four five six"}, session="s"), pause_after=2)
        speaker.allow(2)
        await first.has(2)  # the caller stops reading: frame 3, made next, waits in its outbox
        speaker.allow(1)
        await waiting_for_permit(speaker)
        assert speaker.said == 3
        second = Reader(runtime.call("chat", {"prompt": "yes no"}, session="s", interrupt=True))
        speaker.allow(10)  # (the first's speaker, cancelled, takes none of them)
        events = await second.finished()
        first.resume.set()
        interrupted = await first.finished()
        assert streamed(interrupted, "reply") == ["one", "two"]  # what was taken stays; frame 3 never comes
        assert done(interrupted)["status"] == "cancelled" and done(interrupted)["reason"] == "interrupted"
        assert len(interrupted) == 3
        assert streamed(events, "reply") == ["yes", "no"] and done(events)["status"] == "ok"
        (first_id, _, before), (second_id, graph, seen) = speaker.seen
        assert before is None and graph == "chat"
        assert seen == Interrupted(first_id, "chat", {"reply": 2})
        assert speaker.said == 5  # three of the first, two of the second: nothing after the interruption
        assert_clean(runtime)
        # the record is the interrupting call's: the next call sees none, and the session keeps no trace of it
        third = Reader(runtime.call("chat", {"prompt": "again"}, session="s"))
        speaker.allow(1)
        assert done(await third.finished())["status"] == "ok"
        assert speaker.seen[-1][2] is None
        assert all("~interrupted" not in state for state in runtime.globals.values())
        await runtime.close()
        assert_clean(runtime)

    run(main())


def test_a_reader_stopped_from_taking_while_it_waits_counts_nothing_more_as_delivered(tmp_path):
    # a front door that decides on a barge-in while its reader is already waiting for the next
    # event (the Realtime endpoint) calls `stop_taking`: the frame made after that is dropped,
    # not counted, so the interrupting call learns only of what was delivered
    async def main():
        speaker = Speaker()
        runtime = await open_runtime(FLOW, tmp_path, {"speaker": speaker})
        handle = runtime.start("chat", {"prompt": "one two three four"}, session="s")
        reader = Reader(handle)
        speaker.allow(2)
        await reader.has(2)
        await waiting_for_permit(speaker)  # the reader waits for frame 3, which is not made yet
        handle.stop_taking()
        speaker.allow(1)  # frame 3 is made now, while the reader waits
        await waiting_for_permit(speaker)
        assert speaker.said == 3
        second = Reader(runtime.call("chat", {"prompt": "yes"}, session="s", interrupt=True))
        speaker.allow(1)
        await second.finished()
        interrupted = await reader.finished()
        assert streamed(interrupted, "reply") == ["one", "two"] and done(interrupted)["reason"] == "interrupted"
        assert speaker.seen[1][2] == Interrupted(speaker.seen[0][0], "chat", {"reply": 2})  # not 3
        await runtime.close()
        assert_clean(runtime)

    run(main())


def test_the_interrupted_call_leaves_its_session_though_its_caller_never_reads_again(tmp_path):
    async def main():
        speaker = Speaker()
        runtime = await open_runtime(FLOW, tmp_path, {"speaker": speaker})
        first = runtime.start("chat", {"prompt": "a b c d"}, session="s")
        events = first.__aiter__()
        speaker.allow(1)
        assert (await events.__anext__())["value"] == "a"
        second = Reader(runtime.call("chat", {"prompt": "x"}, session="s", interrupt=True))
        speaker.allow(5)
        assert done(await second.finished())["status"] == "ok"  # ran while the first's `done` waited unread
        rest = [event async for event in events]
        assert rest == [{"event": "done", "status": "cancelled", "errors": [], "missing": [], "reason": "interrupted"}]
        assert speaker.seen[-1][2] == Interrupted(speaker.seen[0][0], "chat", {"reply": 1})
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_a_running_call_of_a_graph_not_interruptible_is_waited_for(tmp_path):
    async def main():
        speaker = Speaker()
        runtime = await open_runtime(FLOW, tmp_path, {"speaker": speaker})
        first = Reader(runtime.call("steady", {"prompt": "one two three"}, session="s"))
        speaker.allow(1)
        await first.has(1)
        second = Reader(runtime.call("chat", {"prompt": "yes"}, session="s", interrupt=True))
        await asyncio.sleep(0)
        assert runtime.statistics()["queued_calls"] == 1
        speaker.allow(3)
        assert streamed(await first.finished(), "reply") == ["one", "two", "three"]
        assert done(first.events) == {"event": "done", "status": "ok", "errors": [], "missing": []}
        assert streamed(await second.finished(), "reply") == ["yes"]
        assert [seen for _, _, seen in speaker.seen] == [None, None]
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_calls_of_interruptible_graphs_waiting_ahead_are_interrupted_and_never_start(tmp_path):
    async def main():
        speaker = Speaker()
        runtime = await open_runtime(FLOW, tmp_path, {"speaker": speaker})
        running = Reader(runtime.call("steady", {"prompt": "one two"}, session="s"))
        speaker.allow(1)
        await running.has(1)
        queued = Reader(runtime.call("chat", {"prompt": "never said"}, session="s"))
        steady = Reader(runtime.call("steady", {"prompt": "kept"}, session="s"))
        await asyncio.sleep(0)
        barging = Reader(runtime.call("chat", {"prompt": "now"}, session="s", interrupt=True))
        await asyncio.sleep(0)
        assert runtime.statistics()["queued_calls"] == 3
        speaker.allow(10)
        assert streamed(await running.finished(), "reply") == ["one", "two"]
        assert await queued.finished() == [
            {"event": "done", "status": "cancelled", "errors": [], "missing": [], "reason": "interrupted"}
        ]
        assert streamed(await steady.finished(), "reply") == ["kept"]  # not interruptible: it waits its turn
        assert streamed(await barging.finished(), "reply") == ["now"]
        assert [(graph, seen) for _, graph, seen in speaker.seen] == [("steady", None), ("steady", None), ("chat", None)]
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_interrupt_needs_a_session(tmp_path):
    async def main():
        runtime = await open_runtime(FLOW, tmp_path, {"speaker": Speaker()})
        with pytest.raises(BadInputs, match=r"graph `chat`: `interrupt` cancels the running call of the caller's session"):
            await runtime.call("chat", {"prompt": "x"}, interrupt=True).__anext__()
        with pytest.raises(BadInputs, match="pass the conversation's session"):
            runtime.call_batches("chat", {"prompt": "x"}, interrupt=True)
        with pytest.raises(BadInputs, match="pass the conversation's session"):
            runtime.start("chat", {"prompt": "x"}, interrupt=True)
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_call_batches_drop_what_the_interrupted_caller_had_not_taken(tmp_path):
    async def main():
        speaker = Speaker()
        runtime = await open_runtime(FLOW, tmp_path, {"speaker": speaker})
        batches = runtime.call_batches("chat", {"prompt": "a b c d"}, session="s")
        speaker.allow(1)
        assert await batches.__anext__() == [{"event": "stream", "field": "reply", "value": "a"}]
        speaker.allow(1)
        await waiting_for_permit(speaker)
        await asyncio.sleep(0)
        assert speaker.said == 2  # frame "b" waits in the outbox, not taken
        second = Reader(runtime.call("chat", {"prompt": "x"}, session="s", interrupt=True))
        speaker.allow(5)
        await second.finished()
        rest = [batch async for batch in batches]
        assert rest == [[{"event": "done", "status": "cancelled", "errors": [], "missing": [], "reason": "interrupted"}]]
        assert speaker.seen[-1][2] == Interrupted(speaker.seen[0][0], "chat", {"reply": 1})
        assert_clean(runtime)
        await runtime.close()

    run(main())


LISTEN = """
placeholder stream words: Text

role echo {
    impl "m:Echo"
    interface hear {
        in  words
        out stream heard: Text
    }
}

graph talk {
    entry  words
    stream heard ordered
    interruptible
}
"""


class Echo:
    def __init__(self):
        self.gate = asyncio.Event()

    async def hear(self, ctx, words):
        await self.gate.wait()
        yield {"heard": words}


def test_barge_ins_in_quick_succession_each_end_and_the_last_runs(tmp_path):
    # a streaming call waiting for its turn when a later one interrupts it never takes a frame:
    # its input is over at once, its caller gets `done` (interrupted), and the session moves on
    async def main():
        echo = Echo()
        runtime = await open_runtime(LISTEN, tmp_path, {"echo": [echo]})
        try:
            first = runtime.start("talk", {}, session="s")
            await first.send("words", "hello")
            reading = [asyncio.ensure_future(_events(first))]
            later = [runtime.start("talk", {}, session="s", interrupt=True) for _ in range(3)]
            reading += [asyncio.ensure_future(_events(call)) for call in later]
            sends = [asyncio.ensure_future(_send_and_end(call, f"turn {n}")) for n, call in enumerate(later)]
            echo.gate.set()
            outcomes = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 10)
            events = await asyncio.wait_for(asyncio.gather(*reading), 10)
            assert runtime.statistics()["calls"] == 0 and runtime.statistics()["queued_calls"] == 0
        finally:
            await asyncio.wait_for(runtime.close(), 10)  # (a call left behind would hold it for ever)
        return outcomes, events

    outcomes, events = asyncio.run(main())
    ends = [(done(e)["status"], done(e).get("reason")) for e in events]
    assert ends == [("cancelled", "interrupted")] * 3 + [("ok", None)]
    assert outcomes[:2] == [True, True] and outcomes[2] is None  # the interrupted ones' input was closed
    assert streamed(events[-1], "heard") == ["turn 2"]


async def _events(call) -> list[dict]:
    return [event async for event in call]


async def _send_and_end(call, words: str):
    """None once sent and ended; True where the call was over before it could take its input."""
    from flowrt.errors import InputClosed

    try:
        await call.send("words", words)
        await call.end("words")
    except InputClosed:
        return True
    return None
