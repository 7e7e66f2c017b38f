"""Faults of a call spread over the replica processes (FLOWRT_CONTROL=shards): kill -9 of a
replica holding a half-filled bucket, of a session node's replica holding frames for order, of
a replica mid-stream; a caller that leaves and a call that times out while frames go replica
to replica. Each ends as under the gateway's control: the call that sent work to the dead
replica ends with an error naming it within the heartbeat TTL and a second, the others
finish, the replica comes back, and every process's statistics return to zero."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed, wait_for
from tests.runtime.harness import done, returned

TTL = 1.0

ROLES = """
import asyncio


async def hang(value, role):
    if isinstance(value, dict) and role in value.get("hang", ()):
        open(value["mark"] + "." + role, "w").close()  # (the test waits for it)
        await asyncio.Event().wait()


class Fast:
    async def run(self, ctx, request):
        await hang(request, ctx.role)
        return {"a": request}


class Slow:
    async def run(self, ctx, request):
        await hang(request, ctx.role)
        return {"b": request}


class Both:
    async def run(self, ctx, a, b):
        await hang(a, ctx.role)
        return {"result": a}


class Parts:
    async def run(self, ctx, request):
        for part in range(3):
            yield {"part": part}
        await hang(request, ctx.role)


class Keeper:
    async def run(self, ctx, part):
        return {"noted": part}


class Speaker:
    async def run(self, ctx, request):
        for word in range(3):
            yield {"word": word}
        await hang(request, ctx.role)
        yield {"word": 3}


class Step:
    async def run(self, ctx, **inputs):
        (name, value), = inputs.items()
        await asyncio.sleep(value.get("pause", 0.05) if isinstance(value, dict) else 0.05)
        number = int(name[1:]) if name.startswith("x") else 0
        return {f"x{number + 1}": value}
"""

BUCKET = """
placeholder request: Json
role fast { impl "roles:Fast"  interface run { in request  out a: Json } }
role slow { impl "roles:Slow"  interface run { in request  out b: Json } }
role both { impl "roles:Both"  interface run { in a & b  out result: Json } }
graph g {
    entry request
    return result
}
"""

SESSION = """
placeholder request: Json
role parts { impl "roles:Parts"  interface run { in request  out stream part: Json } }
role keeper {
    impl "roles:Keeper"
    lb session
    interface run { in part  out stream noted: Json }
}
graph g {
    entry request
    stream noted
}
"""

SPEAKER = """
placeholder request: Json
role speaker { impl "roles:Speaker"  interface run { in request  out stream word: Json } }
graph g {
    entry request
    stream word
}
"""


def chain(stages: int) -> str:
    lines = ["placeholder request: Json"]
    for i in range(stages):
        source = "request" if i == 0 else f"x{i}"
        lines.append(f'role s{i} {{ impl "roles:Step"  interface run {{ in {source}  out x{i + 1}: Json }} }}')
    lines.append(f"graph g {{\n    entry request\n    return x{stages}\n}}")
    return "\n".join(lines)


@pytest.fixture(autouse=True)
def sharded(monkeypatch):
    monkeypatch.setenv("FLOWRT_CONTROL", "shards")


async def tracked(deployment, replica: str) -> int:
    """What replica process `replica` ("role/n") holds of calls now (its shards and their state)."""
    stats = await deployment.statistics()
    return stats.get("processes", {}).get(replica, {}).get("tracked", 0)


async def killed_while(
    deployment, mark: str, request: dict, victim: str, holding: str = "", session: str = "", streamed: int = 0
) -> list[dict]:
    """Make a call of `request`, whose `hang` roles stop (each leaving `mark`.ROLE); once they
    have (and `victim`, "role/n", holds something of the call, if `holding` says what; and the
    caller has `streamed` frames), kill -9 `victim`: the call must end with an error naming it
    within TTL + 1 s. Waits for its restart; returns the call's events."""
    inputs = {"request": {**request, "mark": mark}}
    events: list[dict] = []

    async def call_() -> list[dict]:
        async for event in deployment.runtime.call("g", inputs, **({"session": session} if session else {})):
            events.append(event)
        return events

    call = asyncio.ensure_future(call_())
    for role in request["hang"]:
        await wait_for(Path(f"{mark}.{role}").exists, 10, f"{role} stopped where the test wants it")
    await wait_for(lambda: sum(e["event"] == "stream" for e in events) >= streamed, 10, f"{streamed} frames at the caller")
    if holding:
        await wait_for_async(lambda: tracked(deployment, victim), holding)
    role = victim.split("/")[0]
    supervisor = deployment.supervisor
    pid = supervisor.pids()[victim]
    loop = asyncio.get_running_loop()
    killed = loop.time()
    os.kill(pid, signal.SIGKILL)
    events = await asyncio.wait_for(call, 10)
    assert loop.time() - killed < TTL + 1.0
    end = done(events)
    assert end["status"] == "error", end
    assert f"replica 0 of role `{role}`" in end["errors"][0]["message"], end
    assert end["errors"][0]["role"] == role, end
    await wait_for(lambda: supervisor.pids().get(victim) not in (None, pid), 15, f"{victim} restarted")
    await wait_for(
        lambda: (role, 0) in supervisor.remote.links and supervisor.remote.links[(role, 0)].record.pid != pid, 15, f"{victim} up"
    )
    return events


def test_kill_9_of_a_replica_holding_a_half_filled_bucket(tmp_path):
    bundle = bundle_with_roles(BUCKET, ROLES, tmp_path)
    mark = str(tmp_path / "mark")

    async def main():
        async with deployed(bundle, heartbeat_ttl=TTL) as deployment:
            runtime = deployment.runtime
            await killed_while(deployment, mark, {"hang": ["slow"]}, "both/0", "both holding the bucket's `a`")
            # slow's activation, still running in its own process, was ended there too
            await assert_clean_everywhere(deployment)
            assert returned(await calls(runtime, "g", {"request": 7})) == {"result": 7}
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_kill_9_of_a_session_nodes_replica_holding_frames_for_order(tmp_path):
    bundle = bundle_with_roles(SESSION, ROLES, tmp_path)
    mark = str(tmp_path / "mark")

    async def main():
        async with deployed(bundle, heartbeat_ttl=TTL) as deployment:
            runtime = deployment.runtime
            # parts streams three frames, then hangs: keeper holds those that wait for order
            await killed_while(deployment, mark, {"hang": ["parts"]}, "keeper/0", "keeper holding the parts", session="s")
            await assert_clean_everywhere(deployment)
            events = await calls(runtime, "g", {"request": 1}, session="s")
            assert [e["value"] for e in events if e["event"] == "stream"] == [0, 1, 2]
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_kill_9_of_a_replica_mid_stream(tmp_path):
    bundle = bundle_with_roles(SPEAKER, ROLES, tmp_path)
    mark = str(tmp_path / "mark")

    async def main():
        async with deployed(bundle, heartbeat_ttl=TTL) as deployment:
            runtime = deployment.runtime
            events = await killed_while(deployment, mark, {"hang": ["speaker"]}, "speaker/0", streamed=3)
            assert [e["value"] for e in events if e["event"] == "stream"] == [0, 1, 2]  # what came before stays
            await assert_clean_everywhere(deployment)
            events = await calls(runtime, "g", {"request": 1})
            assert [e["value"] for e in events if e["event"] == "stream"] == [0, 1, 2, 3]

    asyncio.run(main())


def test_a_caller_that_leaves_and_a_timeout_while_frames_go_replica_to_replica(tmp_path):
    bundle = bundle_with_roles(chain(6), ROLES, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            runtime = deployment.runtime
            # the caller leaves while the call's frame is at s2 (sent there by s1)
            stream = runtime.call("g", {"request": {"pause": 0.4}})
            task = asyncio.ensure_future(stream.__anext__())
            await wait_for_async(lambda: tracked(deployment, "s2/0"), "the call's frame at s2")
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await stream.aclose()
            await assert_clean_everywhere(deployment)
            # a call that times out with its frame on the way
            events = await asyncio.wait_for(calls(runtime, "g", {"request": 2}, timeout=0.15), 10)
            assert done(events)["status"] == "cancelled", done(events)
            await assert_clean_everywhere(deployment)
            assert returned(await calls(runtime, "g", {"request": 3})) == {"x6": 3}
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


async def wait_for_async(probe, what: str, seconds: float = 10) -> None:
    """Wait until the coroutine function `probe` returns something true (polled, bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await probe():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_calls_made_while_a_replica_restarts_wait_for_it_and_one_that_stays_down_fails_saying_why(tmp_path):
    # (the gateway control's restart tests, tests/deploy/test_restart_wait.py, read its own counters)
    from tests.deploy.test_restart_wait import kill_and_hold, ticker_bundle

    bundle, hold, fail = ticker_bundle(tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            supervisor, runtime = deployment.supervisor, deployment.runtime
            before = await calls(runtime, "ticks", {"start": {"n": 5, "tag": "a"}})
            await kill_and_hold(deployment, hold)
            streamed = asyncio.ensure_future(calls(runtime, "ticks", {"start": {"n": 5, "tag": "a"}}))
            counted = asyncio.ensure_future(calls(runtime, "count", {"start": {"tag": "b"}}))
            await wait_for(lambda: supervisor.shards.statistics()["shards"] == 2, 5, "both calls in flight")
            hold.unlink()  # the restart goes on: what the calls sent it is delivered to the new process
            assert await streamed == before
            assert (await counted)[0]["value"] == ["b", 1]
            await assert_clean_everywhere(deployment)
            # now it does not come back: a call waits the replica wait, then fails saying why
            supervisor.remote.wait = 0.5
            fail.touch()
            await kill_and_hold(deployment, hold)
            hold.unlink()
            process = supervisor.processes[("ticker", 0)]
            await wait_for(lambda: "the test says no" in process.last_exit, 10, "a restart failed")
            loop = asyncio.get_running_loop()
            started = loop.time()
            events = await asyncio.wait_for(calls(runtime, "count", {"start": {}}), 10)
            assert 0.5 <= loop.time() - started < 3
            (error,) = done(events)["errors"]
            assert error["role"] == "ticker"
            assert error["message"].startswith("no replica of role `ticker` came up within the 0.5s"), error
            assert "setup() of replica 0 raised RuntimeError: the test says no" in error["message"], error
            fail.unlink()
            await wait_for(lambda: supervisor.remote.live["ticker"] == [0], 15, "the replica back")
            assert (await calls(runtime, "count", {"start": {"tag": "z"}}))[0]["value"] == ["z", 1]
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


COUNTERS = """
placeholder start: Json
role counter {
    impl "roles:Counter"
    replicas 2
    lb session
    interface count { in start  out n: Json }
}
graph count {
    entry start
    return n
}
"""

COUNTER = """
import asyncio, os

HOLD = {hold!r}

class Counter:
    async def setup(self, ctx):
        self.n = 0
        while os.path.exists(HOLD):  # the test holds the restart here
            await asyncio.sleep(0.01)

    async def count(self, ctx, start):
        self.n += 1
        return {{"n": [ctx.replica, self.n]}}
"""


def test_a_session_whose_replica_is_down_goes_to_another_until_it_is_back(tmp_path):
    hold = tmp_path / "hold"
    bundle = bundle_with_roles(COUNTERS, COUNTER.format(hold=str(hold)), tmp_path)

    async def count(runtime) -> list:
        return returned(await calls(runtime, "count", {"start": {}}, session="s"))["n"]

    async def main():
        async with deployed(bundle, heartbeat_ttl=TTL) as deployment:
            supervisor, runtime = deployment.supervisor, deployment.runtime
            pinned, _ = await count(runtime)
            assert await count(runtime) == [pinned, 2]  # the session stays on its replica
            other = 1 - pinned
            hold.touch()
            victim = f"counter/{pinned}"
            os.kill(supervisor.pids()[victim], signal.SIGKILL)
            await wait_for(lambda: supervisor.shards.faults.down, 5, "the gateway told the replica is down")
            # while it is held down, the session's calls go to the other replica and complete
            assert await asyncio.wait_for(count(runtime), 5) == [other, 1]
            assert await asyncio.wait_for(count(runtime), 5) == [other, 2]
            assert supervisor.pids().get(victim) is None or pinned not in supervisor.remote.live["counter"]
            hold.unlink()
            await wait_for(lambda: not supervisor.shards.faults.down, 15, "the replica back")
            assert await count(runtime) == [pinned, 1]  # back on its own replica (a new process)
            await assert_clean_everywhere(deployment)

    asyncio.run(main())
