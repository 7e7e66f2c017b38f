"""Streaming entries (`placeholder stream`) under `--deploy local`, under both controls: the
gateway process feeds the entry's frames to the call's control core, whose consumers run in
replica processes (the gateway's control), or sends them to the consumers' replicas, which run
the call among themselves (FLOWRT_CONTROL=shards). The events equal the reference
interpreter's for random chunkings (random programs and the hand-written topologies of the
in-process test, both ways of sending: `start` and `call`); an ordered stream fed by the input
flows while the input is still open; a call cancelled mid-input frees everything in every
process; a replica killed mid-input fails its frame (the gateway's control) or the call (the
spread control, which ends every call that sent the replica work), and the session goes on."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, deployed, wait_for
from tests.runtime.test_against_reference import SETTINGS
from tests.runtime.test_streaming_reference import MODES, check_hand, check_spec, chunkings, streaming_specs

LOCAL = settings(SETTINGS, max_examples=3)  # (each example starts a process per replica)


@pytest.fixture(autouse=True, params=["gateway", "shards"])
def control(request, monkeypatch) -> str:
    """Every test here runs under both controls."""
    if request.param == "shards":
        monkeypatch.setenv("FLOWRT_CONTROL", "shards")
    else:
        monkeypatch.delenv("FLOWRT_CONTROL", raising=False)
    return request.param


@LOCAL
@given(spec=streaming_specs(back_edges=False), frames=chunkings(), seed=st.integers(0, 2**16), mode=st.sampled_from(MODES))
def test_random_dags_with_a_streaming_entry_match_the_reference_under_local(spec, frames, seed, mode, tmp_path):
    check_spec(spec, frames, seed, tmp_path, mode, deploy="local")


@pytest.mark.parametrize(("name", "mode", "seed"), [("chain", "start", 1), ("duplex", "call", 3)])
def test_hand_written_topologies_match_the_reference_under_local(name, mode, seed, tmp_path):
    check_hand(name, mode, seed, tmp_path, deploy="local")


FLOW = """
placeholder stream audio_in: Text

role listener {
    impl "roles:Listener"
    replicas 2
    interface hear { in audio_in  out stream heard: Text }
}

role recorder {
    impl "roles:Recorder"
    interface keep { join { audio_in: all }  out recording: Text }
}

graph g {
    entry  audio_in
    stream heard ordered
    return recording
}
"""

ROLES = """
import asyncio
import os


class Listener:
    async def hear(self, ctx, audio_in):
        if audio_in.startswith("slow "):  # (a chunk that keeps its replica busy, and says where)
            yield {"heard": f"pid {os.getpid()}"}
            await asyncio.sleep(30)
        for word in audio_in.split():
            yield {"heard": word}


class Recorder:
    async def keep(self, ctx, audio_in):
        return {"recording": " | ".join(audio_in)}
"""


def test_frames_sent_one_by_one_reach_replica_processes_in_order(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            call = deployment.runtime.start("g", {}, session="s1")
            reading = asyncio.ensure_future(_events(call))
            for chunk in ("one two", "three", "", "four five six"):
                await call.send("audio_in", chunk)
            await call.end("audio_in")
            events = await asyncio.wait_for(reading, 20)
            await assert_clean_everywhere(deployment)
        return events

    events = asyncio.run(main())
    assert [e["value"] for e in events if e["event"] == "stream"] == ["one", "two", "three", "four", "five", "six"]
    assert [e["value"] for e in events if e["event"] == "return"] == ["one two | three |  | four five six"]
    assert events[-1]["status"] == "ok"


def test_a_call_cancelled_mid_input_frees_everything_in_every_process(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            call = deployment.runtime.start("g", {}, session="s1")
            heard: list[dict] = []

            async def read():
                async for event in call:
                    heard.append(event)

            reading = asyncio.ensure_future(read())
            await call.send("audio_in", "hello there")
            await wait_for(lambda: len(heard) == 2, 20, "the first frame's words")
            await call.cancel()
            await asyncio.wait_for(reading, 20)
            with pytest.raises(Exception, match="ended|cancel|closed"):
                await call.send("audio_in", "too late")
            await assert_clean_everywhere(deployment)
            # the deployment goes on serving the session
            again = deployment.runtime.start("g", {}, session="s1")
            again_reading = asyncio.ensure_future(_events(again))
            await again.send("audio_in", "again")
            await again.end("audio_in")
            second = await asyncio.wait_for(again_reading, 20)
            await assert_clean_everywhere(deployment)
        return heard, second

    heard, second = asyncio.run(main())
    assert [e["value"] for e in heard if e["event"] == "stream"] == ["hello", "there"]
    assert heard[-1]["event"] == "done" and heard[-1]["status"] != "ok"
    assert [e["value"] for e in second if e["event"] == "return"] == ["again"]


def test_a_replica_killed_mid_input_fails_its_frame_and_the_input_goes_on(tmp_path, control):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    spread = control == "shards"

    async def main():
        async with deployed(bundle, heartbeat_ttl=1.0) as deployment:
            supervisor, runtime = deployment.supervisor, deployment.runtime
            call = runtime.start("g", {}, session="s1")
            events: list[dict] = []

            async def read():
                async for event in call:
                    events.append(event)

            reading = asyncio.ensure_future(read())
            await call.send("audio_in", "slow chunk")
            await wait_for(lambda: any(e.get("value", "").startswith("pid ") for e in events), 20, "the slow chunk running")
            (where,) = [e["value"] for e in events if e.get("value", "").startswith("pid ")]
            loop = asyncio.get_running_loop()
            killed = loop.time()
            os.kill(int(where.split()[1]), signal.SIGKILL)
            if spread:  # the call sent the replica work: it ends, within the heartbeat TTL and a second
                await asyncio.wait_for(reading, 30)
                assert loop.time() - killed < 1.0 + 1.0
            await wait_for(lambda: len(supervisor.remote.live["listener"]) == 1, 20, "the killed replica seen down")
            if not spread:
                for chunk in ("after the", "kill"):  # (to the replica left, until the other is back)
                    await call.send("audio_in", chunk)
                await call.end("audio_in")
                await asyncio.wait_for(reading, 30)
            await wait_for(lambda: supervisor.restarted == 1 and len(supervisor.remote.live["listener"]) == 2, 20, "restart")
            again = await asyncio.wait_for(_events_of(runtime.start("g", {}, session="s1"), ["back again"]), 20)
            await assert_clean_everywhere(deployment)
        return events, again

    events, again = asyncio.run(main())
    done = events[-1]
    (error,) = done["errors"]
    assert error["role"] == "listener" and "killed by SIGKILL" in error["message"], error
    if spread:
        assert done["status"] == "error" and "replica" in error["message"], done
    else:
        assert done["event"] == "done" and done["missing"] == []  # (the stream's error leaves `recording` whole)
        assert [e["value"] for e in events if e["event"] == "stream"][1:] == ["after", "the", "kill"]  # the rest ran
    assert [e["value"] for e in again if e["event"] == "return"] == ["back again"]


async def _events(call) -> list[dict]:
    return [event async for event in call]


async def _events_of(call, chunks: list[str]) -> list[dict]:
    """The events of `call` with `chunks` sent, then its input ended."""
    reading = asyncio.ensure_future(_events(call))
    for chunk in chunks:
        await call.send("audio_in", chunk)
    await call.end("audio_in")
    return await reading
