"""`--deploy local`: every replica in its own process, the same events as the embedded runtime,
load balancers across processes, session globals, the socket directory's permissions."""

from __future__ import annotations

import asyncio
import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO, by_field
from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed

PIDS = """
placeholder request: Json

role who {
    impl "roles:Who"
    replicas 3
    lb LB
    interface run { in request  out pid: Json }
}

graph g {
    entry request
    return pid
}
"""

WHO = """
import os

class Who:
    async def run(self, ctx, request):
        return {"pid": os.getpid()}
"""


def where_pages_came_from(line: str) -> str:
    """pd_split's `split` return says where decode found prefill's pages: its own process under
    the README's inproc run, nowhere (recomputed) in a process of its own without a shared
    metadata store. Everything else, the tokens included, must match."""
    event = json.loads(line)
    if event.get("field") == "split":
        decode = event["value"]["decode"]
        assert decode["reused_tokens"] + decode["computed_tokens"] == event["value"]["prefill"]["computed_tokens"]
        event["value"]["decode"] = {"steps": decode["decode_steps"]}
    return json.dumps(event, ensure_ascii=False)


# examples whose events report where data came from, which a deployment changes by design
DEPLOYMENT_FACTS = {"pd_split": where_pages_came_from}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.parent.name for p in EXAMPLES])
def test_every_example_prints_the_same_events_under_local_as_its_readme(path):
    readme = (path.parent / "README.md").read_text()
    (command,) = re.findall(r"```sh\n(flowc run .*?)\n```", readme)
    (expected,) = re.findall(r"```json\n(.*?)\n```", readme, re.DOTALL)
    args = [*command.split()[1:], "--deploy", "local"]
    result = subprocess.run([sys.executable, "-m", "flowc", *args], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    got, want = result.stdout.rstrip().splitlines(), expected.splitlines()
    facts = DEPLOYMENT_FACTS.get(path.parent.name)
    if facts is not None:
        got, want = [facts(line) for line in got], [facts(line) for line in want]
    assert sorted(got) == sorted(want)  # the same lines
    ordered = set(re.findall(r"^\s*stream\s+(\w+)\s+ordered\b", path.read_text(), re.MULTILINE))
    assert by_field(got, ordered) == by_field(want, ordered)  # ordered streams in order, `done` last


def test_each_replica_runs_in_a_process_of_its_own_and_round_robin_spreads_over_them(tmp_path):
    bundle = bundle_with_roles(PIDS.replace("LB", "round_robin"), WHO, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            pids = deployment.supervisor.pids()
            assert len(set(pids.values())) == 3
            seen = []
            for i in range(6):
                events = await calls(deployment.runtime, "g", {"request": i})
                seen.append(events[0]["value"])
            assert sorted(set(seen)) == sorted(pids.values())
            assert seen[:3] == seen[3:]  # in turn
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_a_session_sticks_to_its_replica_and_moves_only_when_it_dies(tmp_path):
    bundle = bundle_with_roles(PIDS.replace("LB", "session"), WHO, tmp_path)

    async def main():
        async with deployed(bundle, heartbeat_ttl=1.0) as deployment:
            homes = {}
            for session in ("a", "b", "c", "d", "e", "f"):
                first = (await calls(deployment.runtime, "g", {"request": 0}, session=session))[0]["value"]
                for _ in range(3):
                    again = (await calls(deployment.runtime, "g", {"request": 0}, session=session))[0]["value"]
                    assert again == first
                homes[session] = first
            victim = homes["a"]
            moved_before = {s for s, pid in homes.items() if pid != victim}
            import os
            import signal

            os.kill(victim, signal.SIGKILL)
            supervisor = deployment.supervisor
            await _until(lambda: supervisor.restarted >= 1 and len(supervisor.remote.links) == 3, 15)
            after = {s: (await calls(deployment.runtime, "g", {"request": 0}, session=s))[0]["value"] for s in homes}
            assert after["a"] != victim
            for session in moved_before:  # their replicas did not die: they stay
                assert after[session] == homes[session]

    asyncio.run(main())


def test_broadcast_reaches_every_replica_process(tmp_path):
    flow = """
    placeholder request: Json

    role log {
        impl "roles:Log"
        replicas 3
        lb broadcast
        interface run { in request  out done: Json }
    }
    graph g {
        entry request
        return done
    }
    """
    roles = f"""
    import os

    class Log:
        async def run(self, ctx, request):
            with open({str(tmp_path / "seen")!r}, "a") as out:
                out.write(f"{{os.getpid()}} {{request}}\\n")
            return {{"done": ctx.replica}}
    """
    bundle = bundle_with_roles(flow, roles, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            events = await calls(deployment.runtime, "g", {"request": 7})
            assert events[-1]["status"] == "ok"
            lines = (tmp_path / "seen").read_text().split()
            assert sorted(lines[0::2]) == sorted(str(p) for p in deployment.supervisor.pids().values())
            assert lines[1::2] == ["7", "7", "7"]

    asyncio.run(main())


def test_load_aware_sends_work_to_the_least_loaded_replica(tmp_path):
    flow = """
    placeholder request: Json

    role work {
        impl "roles:Work"
        replicas 2
        lb load_aware
        interface run { in request  out pid: Json }
    }
    graph g {
        entry request
        return pid
    }
    """
    roles = """
    import asyncio, os

    class Work:
        async def run(self, ctx, request):
            await asyncio.sleep(request)
            return {"pid": os.getpid()}
    """
    bundle = bundle_with_roles(flow, roles, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            runtime = deployment.runtime
            slow = asyncio.ensure_future(calls(runtime, "g", {"request": 1.0}))
            await _until(lambda: runtime.statistics()["busy_replicas"] == 1, 5)
            quick = [(await calls(runtime, "g", {"request": 0}))[0]["value"] for _ in range(4)]
            busy = (await slow)[0]["value"]
            assert busy not in quick and len(set(quick)) == 1  # every quick call went to the idle replica

    asyncio.run(main())


def test_session_globals_carry_across_calls_and_processes(tmp_path):
    flow = """
    placeholder request: Json

    global history: History {
        max_turns 4
    }
    role note {
        impl "roles:Note"
        replicas 2
        uses history
        interface run { in request  out seen: Json }
    }
    role count {
        impl "roles:Count"
        uses history
        interface run { in seen  out total: Json }
    }
    graph g {
        entry request
        return seen, total
    }
    """
    roles = """
    class Note:
        async def run(self, ctx, request):
            turns = ctx.globals["history"].setdefault("turns", [])
            turns.append(request)
            return {"seen": list(turns)}

    class Count:
        async def run(self, ctx, seen):
            ctx.globals["history"]["total"] = ctx.globals["history"].get("total", 0) + len(seen)
            return {"total": ctx.globals["history"]["total"]}
    """
    bundle = bundle_with_roles(flow, roles, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            totals = []
            for word in ("a", "b", "c"):
                events = await calls(deployment.runtime, "g", {"request": word}, session="s")
                returned = {e["field"]: e["value"] for e in events if e["event"] == "return"}
                totals.append((returned["seen"], returned["total"]))
            assert totals == [(["a"], 1), (["a", "b"], 3), (["a", "b", "c"], 6)]

    asyncio.run(main())


def test_what_every_broadcast_replica_sets_in_the_session_globals_is_kept(tmp_path):
    flow = """
    placeholder request: Json

    global history: History {
        max_turns 4
    }
    role log {
        impl "roles:Log"
        replicas 3
        lb broadcast
        uses history
        interface run { in request  out logged: Json }
    }
    graph g {
        entry request
        return logged
    }
    """
    roles = """
    class Log:
        async def run(self, ctx, request):
            seen = sorted(ctx.globals["history"])
            ctx.globals["history"][f"replica {ctx.replica}"] = request
            return {"logged": seen}
    """
    bundle = bundle_with_roles(flow, roles, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            first = await calls(deployment.runtime, "g", {"request": 1}, session="s")
            second = await calls(deployment.runtime, "g", {"request": 2}, session="s")
            assert first[0]["value"] == []
            assert second[0]["value"] == ["replica 0", "replica 1", "replica 2"]  # each replica's entry was kept

    asyncio.run(main())


def test_sockets_are_private_to_the_user(tmp_path):
    bundle = bundle_with_roles(PIDS.replace("LB", "round_robin"), WHO, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            directory = deployment.supervisor.directory_path
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700
            sockets = list(directory.iterdir())
            assert len(sockets) == 5  # the registry, the memory manager and three replicas
            for path in sockets:
                assert stat.S_ISSOCK(path.stat().st_mode)
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            slab = Path(deployment.supervisor.manager.slab)  # the tensors' shared memory: this user's alone too
            assert stat.S_IMODE(slab.stat().st_mode) == 0o600

    asyncio.run(main())


async def _until(condition, seconds: float) -> None:
    from tests.deploy.helpers import wait_for

    await wait_for(condition, seconds, "condition")
