"""The in-process API of streaming entries (docs/runtime.md, "Streaming input"): `Runtime.start`
gives a handle that sends an entry's frames, ends it and yields the call's events; `Runtime.call`
takes the frames as a list. What a caller gets wrong is a FlowrtError saying what and why;
cancelling, closing, a timeout or a caller that goes away mid-input leave nothing behind; `send`
waits while the entry's consumers, or the caller, are behind (rule 13's bounds)."""

from __future__ import annotations

import asyncio

import pytest

from flowrt.control import CallHandle, InputClosed, bounds
from flowrt.errors import BadInputs, FlowrtError
from tests.runtime.harness import assert_clean, collect, done, open_runtime, returned, streamed

DICTATE = """
placeholder stream audio_in: Text
placeholder voice: Text

role listener {
    impl "m:Listener"
    lb session
    interface hear { in audio_in  out stream heard: Text }
}

role mixer {
    impl "m:Mixer"
    interface mix { in audio_in & voice  out mixed: Json }
}

role sampler {
    impl "m:Sampler"
    interface keep { join { audio_in: 2 }  out first: Json }
}

role recorder {
    impl "m:Recorder"
    interface keep { join { audio_in: all }  out recording: Json }
}

graph dictate {
    entry  audio_in, voice
    stream heard ordered
    stream mixed
    return first, recording
}

graph plain {
    entry  voice
    return mixed_voice
}

role echo {
    impl "m:Echo"
    interface run { in voice  out mixed_voice: Text }
}
"""


class Listener:
    """Hears each chunk as its words; waits for `gate` first when it is given one."""

    def __init__(self, gate: asyncio.Event | None = None):
        self.gate = gate
        self.started = 0
        self.all_started = asyncio.Event()
        self.expect = 0

    async def hear(self, ctx, audio_in):
        self.started += 1
        if self.started == self.expect:
            self.all_started.set()
        if self.gate is not None:
            await self.gate.wait()
        for word in audio_in.split():
            yield {"heard": word}


class Mixer:
    async def mix(self, ctx, audio_in, voice):
        return {"mixed": {"voice": voice, "chunks": audio_in}}


class Sampler:
    def __init__(self):
        self.fired = asyncio.Event()

    async def keep(self, ctx, audio_in):
        self.fired.set()
        return {"first": audio_in}


class Recorder:
    async def keep(self, ctx, audio_in):
        return {"recording": " | ".join(audio_in)}


class Echo:
    async def run(self, ctx, voice):
        return {"mixed_voice": voice}


def roles(listener: Listener | None = None, sampler: Sampler | None = None) -> dict:
    return {
        "listener": listener or Listener(),
        "mixer": Mixer(),
        "sampler": sampler or Sampler(),
        "recorder": Recorder(),
        "echo": Echo(),
    }


async def reading(call: CallHandle) -> tuple[asyncio.Future, list[dict]]:
    """A task reading the call's events into a list."""
    events: list[dict] = []

    async def read():
        async for event in call:
            events.append(event)

    return asyncio.ensure_future(read()), events


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 10))


def test_a_started_call_takes_its_frames_and_ends_with_its_input(tmp_path):
    async def main():
        sampler = Sampler()
        runtime = await open_runtime(DICTATE, tmp_path, roles(sampler=sampler))
        call = runtime.start("dictate", {"voice": "v"}, session="s1")
        reader, events = await reading(call)
        await call.send("audio_in", "hello there")
        assert not sampler.fired.is_set()
        await call.send("audio_in", "general")
        await sampler.fired.wait()  # a count join fires on its frames while the input is still open
        assert runtime.statistics()["running"] >= 1 and not reader.done()  # the input holds the call open
        await call.send("audio_in", "kenobi")
        await call.end("audio_in")
        await reader
        assert streamed(events, "heard") == ["hello", "there", "general", "kenobi"]  # ordered: frame by frame
        assert streamed(events, "mixed") == [{"voice": "v", "chunks": ["hello there", "general", "kenobi"]}]
        assert returned(events) == {"first": ["hello there", "general"], "recording": "hello there | general | kenobi"}
        assert done(events) == {"event": "done", "status": "ok", "errors": [], "missing": []}
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_call_takes_a_streaming_entrys_frames_as_a_list(tmp_path):
    async def main():
        runtime = await open_runtime(DICTATE, tmp_path, roles())
        events = await collect(runtime, "dictate", {"voice": "v", "audio_in": ["a b", "c"]})
        assert streamed(events, "heard") == ["a", "b", "c"]
        assert returned(events) == {"first": ["a b", "c"], "recording": "a b | c"}
        none = await collect(runtime, "dictate", {"voice": "v", "audio_in": []})  # no frame: the input ends at once
        assert streamed(none, "heard") == streamed(none, "mixed") == [] and done(none)["missing"] == ["first"]
        assert returned(none) == {"recording": ""} and done(none)["status"] == "ok"  # (`all` of no frames)
        with pytest.raises(BadInputs, match=r"entry `audio_in` streams, so a call takes the list of its frames, not str"):
            await collect(runtime, "dictate", {"voice": "v", "audio_in": "a b"})
        with pytest.raises(BadInputs, match=r"streaming entry `audio_in` takes frames of type `Text`, and"):
            await collect(runtime, "dictate", {"voice": "v", "audio_in": ["a", 3]})
        with pytest.raises(BadInputs, match=r"has streaming entries \(audio_in\): call it with `call`"):
            runtime.call_batches("dictate", {"voice": "v", "audio_in": ["a"]})
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_send_after_end_is_a_clear_error_and_the_call_goes_on(tmp_path):
    async def main():
        runtime = await open_runtime(DICTATE, tmp_path, roles())
        call = runtime.start("dictate", {"voice": "v"})
        reader, events = await reading(call)
        await call.send("audio_in", "one")
        await call.send("audio_in", "two")
        await call.end("audio_in")
        with pytest.raises(InputClosed) as error:
            await call.send("audio_in", "three")
        assert isinstance(error.value, FlowrtError)
        assert str(error.value) == (
            "graph `dictate`: streaming entry `audio_in` has ended (`end` was called); it takes no more frames"
        )
        with pytest.raises(InputClosed, match="has ended"):
            await call.end("audio_in")
        await reader
        assert done(events)["status"] == "ok" and streamed(events, "heard") == ["one", "two"]
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_a_field_that_does_not_stream_takes_no_frames(tmp_path):
    async def main():
        runtime = await open_runtime(DICTATE, tmp_path, roles())
        call = runtime.start("dictate", {"voice": "v"})
        with pytest.raises(BadInputs) as error:
            await call.send("voice", "again")
        assert str(error.value) == (
            "graph `dictate`: `voice` is an entry given when the call starts, so it takes no frames; "
            "its streaming entries are `audio_in`"
        )
        with pytest.raises(BadInputs, match="`audio` is not one of its entries"):
            await call.end("audio")
        with pytest.raises(BadInputs, match=r"streaming entry `audio_in` takes frames of type `Text`, and"):
            await call.send("audio_in", 3)
        plain = runtime.start("plain", {"voice": "v"})
        with pytest.raises(BadInputs, match="it has no streaming entry"):
            await plain.send("voice", "x")
        assert [e["event"] for e in [e async for e in plain]] == ["return", "done"]  # (a graph without one starts too)
        await call.send("audio_in", "still taken")  # none of that hurt the call
        await call.end("audio_in")
        events = [e async for e in call]
        assert streamed(events, "heard") == ["still", "taken"] and done(events)["status"] == "ok"
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_start_checks_its_inputs_at_once(tmp_path):
    async def main():
        runtime = await open_runtime(DICTATE, tmp_path, roles())
        with pytest.raises(BadInputs) as error:
            runtime.start("dictate", {"voice": "v", "audio_in": ["a"]})
        assert str(error.value) == (
            "graph `dictate` takes voice; unexpected audio_in (`audio_in` streams: send its frames with `call.send`, then `call.end`)"
        )
        with pytest.raises(BadInputs, match="graph `dictate` takes voice; missing voice"):
            runtime.start("dictate", {})
        with pytest.raises(BadInputs, match="session must be a str"):
            runtime.start("dictate", {"voice": "v"}, session=3)
        with pytest.raises(FlowrtError, match="timeout"):
            runtime.start("dictate", {"voice": "v"}, timeout=0)
        assert_clean(runtime)  # nothing was admitted
        await runtime.close()

    run(main())


@pytest.mark.parametrize("how", ["cancel", "aclose", "async with", "break"])
def test_cancelling_mid_input_frees_everything(tmp_path, how):
    async def main():
        gate = asyncio.Event()
        listener = Listener(gate)
        listener.expect = 1
        runtime = await open_runtime(DICTATE, tmp_path, roles(listener))
        if how == "async with":
            async with runtime.start("dictate", {"voice": "v"}, session="s") as call:
                await call.send("audio_in", "a")
                await call.send("audio_in", "b")
                await listener.all_started.wait()
        else:
            call = runtime.start("dictate", {"voice": "v"}, session="s")
            await call.send("audio_in", "a")
            await call.send("audio_in", "b")
            await listener.all_started.wait()  # one activation waits for the gate, one is held for order
            assert runtime.statistics()["held_for_order"] == 1
            if how == "cancel":
                await call.cancel()
                assert_clean(runtime)
                end = done([event async for event in call])  # its events stay readable, to its `done`
                assert (end["status"], end["reason"]) == ("cancelled", "client gone")
            elif how == "aclose":
                await call.aclose()
            else:
                async for _ in call:
                    break
                await call.aclose()  # (an async for that breaks leaves the iterator to its owner)
        assert_clean(runtime)
        with pytest.raises(InputClosed, match=r"the call is over \(cancelled: client gone\)|closed before it started"):
            await call.send("audio_in", "c")
        gate.set()
        events = await collect(
            runtime, "dictate", {"voice": "v", "audio_in": ["next"]}, session="s"
        )  # the session's next call runs
        assert done(events)["status"] == "ok"
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_a_reader_sees_the_cancelled_end_of_a_call_cancelled_by_another_task(tmp_path):
    async def main():
        runtime = await open_runtime(DICTATE, tmp_path, roles())
        call = runtime.start("dictate", {"voice": "v"})
        reader, events = await reading(call)
        await call.send("audio_in", "a b")
        await call.cancel("shutdown")
        await reader
        assert done(events)["status"] == "cancelled" and done(events)["reason"] == "shutdown"
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_a_call_whose_input_never_ends_runs_until_its_timeout(tmp_path):
    async def main():
        runtime = await open_runtime(DICTATE, tmp_path, roles())
        call = runtime.start("dictate", {"voice": "v"}, timeout=0.2)
        reader, events = await reading(call)
        await call.send("audio_in", "said")
        await reader  # (the input never ends: only the timeout ends the call)
        end = done(events)
        assert end["status"] == "cancelled" and end["reason"] == "timeout"
        assert returned(events) == {} and end["missing"] == ["first", "recording"]
        assert streamed(events, "heard") == ["said"]  # what came before the timeout stays delivered
        with pytest.raises(InputClosed, match=r"the call is over \(cancelled: timeout\); streaming entry `audio_in`"):
            await call.send("audio_in", "late")
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_a_timeout_wakes_a_send_waiting_for_room(tmp_path):
    async def main():
        gate = asyncio.Event()  # never set: every frame's activation waits
        runtime = await open_runtime(DICTATE, tmp_path, roles(Listener(gate)))
        call = runtime.start("dictate", {"voice": "v"}, timeout=0.3)
        reader, events = await reading(call)
        with pytest.raises(InputClosed, match=r"cancelled: timeout"):
            for n in range(10 * bounds.CHILDREN_HIGH):  # the sends stop at the bound, then the timeout ends them
                await call.send("audio_in", f"w{n}")
        await reader
        assert done(events)["reason"] == "timeout"
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_send_waits_while_the_entrys_consumers_are_behind(tmp_path):
    async def main():
        gate = asyncio.Event()
        listener = Listener(gate)
        runtime = await open_runtime(DICTATE, tmp_path, roles(listener))
        call = runtime.start("dictate", {"voice": "v"})
        reader, events = await reading(call)
        frames = bounds.CHILDREN_HIGH + 50
        sent = 0

        async def send_all():
            nonlocal sent
            for n in range(frames):
                await call.send("audio_in", f"w{n}")
                sent += 1
            await call.end("audio_in")

        sender = asyncio.ensure_future(send_all())
        while sent < bounds.CHILDREN_HIGH:  # the first runs and waits for the gate, the `lb session` node holds the others
            await asyncio.sleep(0)
        for _ in range(50):  # the loop turns, the sender stays where it is
            await asyncio.sleep(0)
        assert sent == bounds.CHILDREN_HIGH and not sender.done() and listener.started == 1
        assert runtime.statistics()["in_flight"] <= bounds.CHILDREN_HIGH + 2  # (the input, the join)
        gate.set()
        await sender
        await reader
        assert sent == frames
        assert streamed(events, "heard") == [f"w{n}" for n in range(frames)]
        assert done(events)["status"] == "ok"
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_send_waits_while_the_caller_has_not_taken_its_events(tmp_path):
    async def main():
        runtime = await open_runtime(DICTATE, tmp_path, roles())
        call = runtime.start("dictate", {"voice": "v"})
        sent = 0

        async def send_all():
            nonlocal sent
            for n in range(bounds.OUTBOX_HIGH * 2):
                await call.send("audio_in", f"w{n}")
                sent += 1
            await call.end("audio_in")

        sender = asyncio.ensure_future(send_all())
        for _ in range(20 * bounds.OUTBOX_HIGH):  # nobody reads: the sender stops once 256 events wait
            await asyncio.sleep(0)
            if sender.done():
                break
        assert not sender.done() and runtime.statistics()["undelivered_events"] >= bounds.OUTBOX_HIGH
        assert sent < bounds.OUTBOX_HIGH * 2
        events = [event async for event in call]  # reading lets it go on
        await sender
        assert len(streamed(events, "heard")) == bounds.OUTBOX_HIGH * 2
        assert_clean(runtime)
        await runtime.close()

    run(main())


def test_a_started_call_holds_its_sessions_turn_until_its_input_ends(tmp_path):
    async def main():
        runtime = await open_runtime(DICTATE, tmp_path, roles())
        first = runtime.start("dictate", {"voice": "v"}, session="s")
        await first.send("audio_in", "first")
        second = asyncio.ensure_future(collect(runtime, "dictate", {"voice": "v", "audio_in": ["second"]}, session="s"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not second.done() and runtime.statistics()["queued_calls"] == 1
        await first.end("audio_in")
        events = [event async for event in first]
        assert streamed(events, "heard") == ["first"]
        assert streamed(await second, "heard") == ["second"]
        assert_clean(runtime)
        await runtime.close()

    run(main())


TWO = """
placeholder stream left: Json
placeholder stream right: Json

role pair {
    impl "m:Pair"
    lb session
    interface run { in left | right  out stream both: Json }
}

graph g {
    entry  left, right
    stream both ordered
}
"""


class Pair:
    async def run(self, ctx, left=None, right=None):
        yield {"both": left if right is None else right}


def test_two_streaming_entries_each_sent_by_its_own_task(tmp_path):
    # the `lb session` node runs in key order: left's frame j and right's frame j share the key
    # (j,), so it holds left's later frames until right's come; each entry's sends are independent
    async def main():
        runtime = await open_runtime(TWO, tmp_path, {"pair": Pair()})
        call = runtime.start("g", {})
        reader, events = await reading(call)
        count = bounds.CHILDREN_HIGH + 10

        async def send(field: str):
            for n in range(count):
                await call.send(field, [field, n])
            await call.end(field)

        await asyncio.gather(send("left"), send("right"))
        await reader
        keys = [value[1] for value in streamed(events, "both")]
        assert keys == sorted(keys) and len(keys) == 2 * count
        listed = await collect(runtime, "g", {"left": [1, 2], "right": [3]})
        assert sorted(streamed(listed, "both")) == [1, 2, 3] and done(listed)["status"] == "ok"
        assert_clean(runtime)
        await runtime.close()

    run(main())
