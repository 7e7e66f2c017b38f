"""`--deploy local` with FLOWRT_CONTROL=shards: each replica process hosts its role's part of
every call (flowrt.control.shards, flowrt.deploy.peers) and frames go replica to replica; the
gateway sends the entry values and receives the caller's frames and the credit back."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal

import pytest
import zmq

from flowrt.deploy.local import DeployError
from flowrt.transport import messages as m
from tests.deploy import test_local
from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed, wait_for
from tests.deploy.test_attacks import intruder, offer
from tests.runtime.harness import done, returned
from tests.runtime.test_shards import chain as runtime_chain

ROLES = """
import asyncio
import os


class Stage:
    async def run(self, ctx, **inputs):
        (name, value), = inputs.items()
        if isinstance(value, dict) and value.get("hang") == ctx.role:
            open(value["mark"], "w").close()  # (the test waits for it, then kills this process)
            await asyncio.Event().wait()
        number = int(name[1:]) if name.startswith("x") else 0
        return {f"x{number + 1}": value if isinstance(value, dict) else value + 1}
"""


def chain(stages: int) -> str:
    return runtime_chain(stages, "roles:Stage")


@pytest.fixture
def sharded(monkeypatch):
    monkeypatch.setenv("FLOWRT_CONTROL", "shards")


def test_a_long_chain_costs_the_gateway_what_a_short_one_does(sharded, tmp_path):
    async def messages(stages: int) -> tuple[int, int]:
        bundle = bundle_with_roles(chain(stages), ROLES, tmp_path / str(stages))
        async with deployed(bundle) as deployment:
            supervisor = deployment.supervisor
            runtime = deployment.runtime
            for n in range(3):
                events = await calls(runtime, "g", {"request": n})
                assert returned(events) == {f"x{stages}": n + stages}, events
            await assert_clean_everywhere(deployment)
            return supervisor.peers.sent, supervisor.peers.received

    async def main():
        one = await messages(1)
        six = await messages(6)
        assert one == (3, 3)  # per call: the entry value out; the returned frame with the credit back, in one batch
        assert six[0] == 3 and six[1] <= 6, six  # (credit that missed a forgotten shard may come back apart)

    asyncio.run(main())


def test_a_replica_killed_mid_call_ends_the_call_naming_it_and_the_next_call_runs(sharded, tmp_path):
    bundle = bundle_with_roles(chain(3), ROLES, tmp_path)

    async def main():
        async with deployed(bundle, heartbeat_ttl=1.0) as deployment:
            supervisor = deployment.supervisor
            runtime = deployment.runtime
            victim = supervisor.pids()["s1/0"]
            mark = tmp_path / "s1-started"
            call = asyncio.ensure_future(calls(runtime, "g", {"request": {"hang": "s1", "mark": str(mark)}}))
            await wait_for(mark.exists, 10, "s1 running the call's frame (sent it by s0, not by the gateway)")
            loop = asyncio.get_running_loop()
            killed = loop.time()
            os.kill(victim, signal.SIGKILL)
            events = await asyncio.wait_for(call, 10)
            assert loop.time() - killed < 1.0 + 1.0  # within the TTL and a second
            end = done(events)
            assert end["status"] == "error", end
            assert "replica 0 of role `s1`" in end["errors"][0]["message"], end
            await wait_for(
                lambda: supervisor.restarted >= 1 and supervisor.pids().get("s1/0") not in (None, victim), 15, "s1 back"
            )
            await wait_for(
                lambda: ("s1", 0) in supervisor.remote.links and supervisor.remote.links[("s1", 0)].record.pid != victim,
                15,
                "s1 up",
            )
            events = await calls(runtime, "g", {"request": 5})
            assert returned(events) == {"x3": 8}, events
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


# what the gateway control's tests say of broadcast, session globals and examples holds here too


def test_broadcast_reaches_every_replica_process(sharded, tmp_path):
    test_local.test_broadcast_reaches_every_replica_process(tmp_path)


def test_load_aware_sends_work_to_the_least_loaded_replica(sharded, tmp_path):
    test_local.test_load_aware_sends_work_to_the_least_loaded_replica(tmp_path)


def test_what_every_broadcast_replica_sets_in_the_session_globals_is_kept(sharded, tmp_path):
    test_local.test_what_every_broadcast_replica_sets_in_the_session_globals_is_kept(tmp_path)


def test_session_globals_carry_across_calls_and_processes(sharded, tmp_path):
    test_local.test_session_globals_carry_across_calls_and_processes(tmp_path)


@pytest.mark.parametrize("name", ["image_chat", "voice_chat"])
def test_an_example_prints_its_readme_events(sharded, name):
    (path,) = [p for p in test_local.EXAMPLES if p.parent.name == name]
    test_local.test_every_example_prints_the_same_events_under_local_as_its_readme(path)


def test_a_peer_without_the_keys_is_refused_and_garbage_from_a_member_is_dropped(sharded, tmp_path):
    bundle = bundle_with_roles(chain(2), ROLES, tmp_path)
    context = zmq.Context()

    async def main():
        async with deployed(bundle) as deployment:
            supervisor = deployment.supervisor
            peers = supervisor.peers
            endpoint = peers.endpoints[0]
            stranger = intruder(context, endpoint)  # no key at all
            offer(stranger, [b"", m.encode(m.Shard(m.VERSION, 1, "g", "s", 1, 3)), pickle.dumps(())])
            await wait_for(lambda: peers.guard.refused >= 1, 10, "the stranger refused")
            member = intruder(context, endpoint, zmq.DEALER, plain=("member", supervisor.keys.member_token))
            member.send_multipart([m.encode(m.Stop(m.VERSION)), b"x"])  # not a peer message
            member.send_multipart([m.encode(m.Shard(m.VERSION, 1, "g", "s", 99, 3)), pickle.dumps(())])  # no process 99
            member.send_multipart([m.encode(m.Shard(m.VERSION, 1, "g", "s", 1, 3)), b"not a pickle"])
            member.send_multipart([m.encode(m.Shard(m.VERSION, 1, "g", "s", 1, 3, None, [99])), pickle.dumps(())])  # around no 99
            await wait_for(lambda: peers.garbage >= 4, 10, "the member's garbage dropped")
            events = await calls(deployment.runtime, "g", {"request": 1})
            assert returned(events) == {"x2": 3}
            await assert_clean_everywhere(deployment)
            for sock in (stranger, member):
                sock.close(0)

    try:
        asyncio.run(main())
    finally:
        context.destroy(linger=0)


def test_an_unknown_control_is_refused_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("FLOWRT_CONTROL", "central")
    bundle = bundle_with_roles(chain(1), ROLES, tmp_path)

    async def main():
        with pytest.raises(DeployError, match="FLOWRT_CONTROL='central': say `shards`"):
            async with deployed(bundle):
                pass

    asyncio.run(main())


STUBBORN = """
import asyncio


class Stage:
    async def run(self, ctx, **inputs):
        (name, value), = inputs.items()
        number = int(name[1:]) if name.startswith("x") else 0
        if value == "lambda" and number == 0:
            return {"x1": lambda: 0}  # cannot cross processes
        if value == "stubborn" and number == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await asyncio.sleep(30)  # ignores its cancellation
        return {f"x{number + 1}": value}
"""


def test_a_frame_that_cannot_cross_processes_fails_its_role_and_a_stubborn_role_does_not_hold_the_call(sharded, tmp_path):
    bundle = bundle_with_roles(chain(2), STUBBORN, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            runtime = deployment.runtime
            events = await asyncio.wait_for(calls(runtime, "g", {"request": "lambda"}), 10)
            end = done(events)
            assert end["status"] == "error" and [e["role"] for e in end["errors"]] == ["s0"], end
            loop = asyncio.get_running_loop()
            started = loop.time()
            events = await asyncio.wait_for(calls(runtime, "g", {"request": "stubborn"}, timeout=0.5), 10)
            assert done(events)["status"] == "cancelled"
            assert loop.time() - started < 0.5 + 1.0 + 1.0  # the timeout, the grace, and some slack
            events = await calls(runtime, "g", {"request": "again"})
            assert returned(events) == {"x2": "again"}

    asyncio.run(main())
