"""`--deploy local` with FLOWRT_CONTROL=shards: each replica process hosts its role's part of
every call (flowrt.control.shards, flowrt.deploy.peers) and frames go replica to replica; the
gateway sends the entry values and receives the caller's frames and the credit back."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed, wait_for
from tests.runtime.harness import done, returned

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
    lines = ["placeholder request: Json", ""]
    for i in range(stages):
        source = "request" if i == 0 else f"x{i}"
        lines += [f"role s{i} {{", '    impl "roles:Stage"', f"    interface run {{ in {source}  out x{i + 1}: Json }}", "}", ""]
    lines += ["graph g {", "    entry request", f"    return x{stages}", "}", ""]
    return "\n".join(lines)


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
