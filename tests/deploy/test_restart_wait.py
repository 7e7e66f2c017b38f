"""While every replica of a role is down and restarting (kill -9), its activations wait for one to
come up instead of failing (flowrt.deploy.remote.REPLICA_WAIT): a call made then completes with
the events it has without the kill; calls queued in a session behind the killed one complete in
order; a role that never comes back fails within the deadline saying why; a waiting call that is
cancelled leaves nothing behind. The restart is held in the replica's `setup` while a file
exists, so the window in which none is up is as long as the test needs, not a race."""

from __future__ import annotations

import asyncio
import os
import re
import signal

import pytest

from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed, wait_for

FLOW = """
placeholder start: Json

role ticker {
    impl "roles:Ticker"
    replicas REPLICAS
    lb LB
    interface tick { in start  out stream tick: Json }
    interface count { in start  out n: Json }
}

graph ticks {
    entry start
    stream tick ordered
}

graph count {
    entry start
    return n
}
"""

ROLES = """
import asyncio, os

HOLD, FAIL = {hold!r}, {fail!r}

class Ticker:
    async def setup(self, ctx):
        self.n = 0
        while os.path.exists(HOLD):  # the test holds the restart here (and lets it go by removing the file)
            await asyncio.sleep(0.01)
        if os.path.exists(FAIL):
            raise RuntimeError("the test says no")

    async def tick(self, ctx, start):
        for i in range(start["n"]):
            yield {{"tick": [start.get("tag"), i]}}

    async def count(self, ctx, start):
        if start.get("hang"):
            await asyncio.Event().wait()
        self.n += 1
        return {{"n": [start.get("tag"), self.n]}}
"""


def ticker_bundle(tmp_path, lb: str = "round_robin", replicas: int = 1):
    hold, fail = tmp_path / "hold", tmp_path / "fail"
    flow = FLOW.replace("LB", lb).replace("REPLICAS", str(replicas))
    return bundle_with_roles(flow, ROLES.format(hold=str(hold), fail=str(fail)), tmp_path), hold, fail


async def kill_and_hold(deployment, hold) -> None:
    """kill -9 every replica of the ticker, their restarts held in setup; returns once none is up."""
    supervisor = deployment.supervisor
    hold.touch()
    for name, pid in supervisor.pids().items():
        if name.startswith("ticker/"):
            os.kill(pid, signal.SIGKILL)
    await wait_for(lambda: not supervisor.remote.live["ticker"], 5, "the killed replicas dropped")


def waiting(deployment) -> int:
    return deployment.supervisor.remote.statistics()["waiting_activations"]


@pytest.mark.parametrize(("lb", "replicas"), [("round_robin", 1), ("broadcast", 2)])
def test_a_call_made_while_every_replica_restarts_waits_for_one(tmp_path, lb, replicas):
    bundle, hold, _ = ticker_bundle(tmp_path, lb, replicas)

    async def main():
        async with deployed(bundle) as deployment:
            runtime, remote = deployment.runtime, deployment.supervisor.remote
            before = await calls(runtime, "ticks", {"start": {"n": 5, "tag": "a"}})
            assert before[-1]["status"] == "ok" and len(before) == 6
            await kill_and_hold(deployment, hold)
            streamed = asyncio.ensure_future(calls(runtime, "ticks", {"start": {"n": 5, "tag": "a"}}))
            returned = asyncio.ensure_future(calls(runtime, "count", {"start": {"tag": "b"}}))
            await wait_for(lambda: waiting(deployment) == 2, 5, "both calls waiting for the replica")
            assert not streamed.done() and not returned.done() and runtime.statistics()["busy_replicas"] == 0
            hold.unlink()  # the restart goes on
            assert await streamed == before  # the same events as without the kill
            assert (await returned)[0]["value"] == ["b", 1]  # (on a new process)
            await wait_for(lambda: remote.live["ticker"] == list(range(replicas)), 10, "every replica back")
            assert deployment.supervisor.restarted == replicas
            await assert_clean_everywhere(deployment)
            assert waiting(deployment) == 0

    asyncio.run(main())


def test_calls_queued_in_a_session_behind_a_killed_call_complete_in_order(tmp_path):
    bundle, hold, _ = ticker_bundle(tmp_path, "session")

    async def main():
        async with deployed(bundle) as deployment:
            runtime = deployment.runtime
            first = asyncio.ensure_future(calls(runtime, "count", {"start": {"hang": True}}, session="s"))
            await wait_for(lambda: runtime.statistics()["busy_replicas"] == 1, 5, "the first call running")
            ended: list[str] = []

            async def queued(tag: str) -> list[dict]:
                events = await calls(runtime, "count", {"start": {"tag": tag}}, session="s")
                ended.append(tag)
                return events

            tags = ["b", "c", "d", "e"]
            rest = [asyncio.ensure_future(queued(tag)) for tag in tags]
            await wait_for(lambda: runtime.statistics()["queued_calls"] == 4, 5, "four calls queued in the session")
            await kill_and_hold(deployment, hold)
            killed = await first  # it had started there: it fails, naming the kill
            assert killed[-1]["status"] == "error" and "killed by SIGKILL" in killed[-1]["errors"][0]["message"]
            await wait_for(lambda: waiting(deployment) == 1, 5, "the next call waiting for the replica")
            assert runtime.statistics()["queued_calls"] == 3  # the others still behind it, in the session's queue
            hold.unlink()
            results = await asyncio.gather(*rest)
            assert ended == tags
            # one at a time, in order, on the one new process (whose count starts again at 1)
            assert [events[0]["value"] for events in results] == [[tag, n] for n, tag in enumerate(tags, 1)]
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_a_role_that_does_not_come_back_fails_within_the_deadline_saying_why(tmp_path):
    bundle, hold, fail = ticker_bundle(tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            supervisor, runtime = deployment.supervisor, deployment.runtime
            supervisor.remote.wait = 0.5  # (REPLICA_WAIT, FLOWRT_REPLICA_WAIT: tested in test_replica_wait_from_the_environment)
            fail.touch()  # every restart fails in setup
            await kill_and_hold(deployment, hold)
            hold.unlink()
            process = supervisor.processes[("ticker", 0)]
            await wait_for(lambda: "the test says no" in process.last_exit, 10, "a restart failed")
            loop = asyncio.get_running_loop()
            started = loop.time()
            results = await asyncio.gather(
                calls(runtime, "ticks", {"start": {"n": 2}}), calls(runtime, "count", {"start": {}}, session="s")
            )
            took = loop.time() - started
            assert 0.5 <= took < 3, took
            for events in results:
                assert events[-1]["status"] == "error"
                (error,) = events[-1]["errors"]
                message = error["message"]
                assert error["role"] == "ticker", error
                assert message.startswith("no replica of role `ticker` came up within the 0.5s this call waited for one: "), (
                    message
                )
                assert re.search(
                    r"replica 0 was restarted \d+ times?; the last time, its process exited with status 3: ", message
                )
                assert "setup() of replica 0 raised RuntimeError: the test says no" in message, message
                assert "FLOWRT_REPLICA_WAIT" in message
            assert waiting(deployment) == 0
            fail.unlink()  # it comes back (after its backoff) and serves again
            await wait_for(lambda: supervisor.remote.live["ticker"] == [0], 10, "the replica back")
            assert (await calls(runtime, "count", {"start": {"tag": "z"}}))[0]["value"] == ["z", 1]
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_a_waiting_call_that_is_cancelled_or_times_out_leaves_nothing_behind(tmp_path):
    bundle, hold, _ = ticker_bundle(tmp_path, "session")

    async def main():
        async with deployed(bundle) as deployment:
            runtime = deployment.runtime
            await kill_and_hold(deployment, hold)
            gone = asyncio.ensure_future(calls(runtime, "ticks", {"start": {"n": 3}}, session="s"))  # its client goes away
            behind = asyncio.ensure_future(calls(runtime, "count", {"start": {"tag": "b"}}, session="s"))
            timed = await calls(runtime, "count", {"start": {}}, timeout=0.3)
            assert timed[-1]["status"] == "cancelled" and timed[-1]["reason"] == "timeout", timed
            await wait_for(lambda: waiting(deployment) == 1, 5, "the client's call waiting")
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            await wait_for(lambda: waiting(deployment) == 1 and runtime.statistics()["queued_calls"] == 0, 5, "the next one")
            hold.unlink()
            assert (await behind)[0]["value"] == ["b", 1]
            await assert_clean_everywhere(deployment)
            stats = await deployment.statistics()
            assert stats["waiting_activations"] == 0 and stats["remote_activations"] == 0, stats

    asyncio.run(main())


def test_replica_wait_from_the_environment(monkeypatch):
    from flowrt.deploy.remote import REPLICA_WAIT, WAIT_ENV, replica_wait

    monkeypatch.delenv(WAIT_ENV, raising=False)
    assert replica_wait() == REPLICA_WAIT == 10.0
    monkeypatch.setenv(WAIT_ENV, "2.5")
    assert replica_wait() == 2.5
    monkeypatch.setenv(WAIT_ENV, "soon")
    with pytest.raises(ValueError, match="expected a number of seconds"):
        replica_wait()
