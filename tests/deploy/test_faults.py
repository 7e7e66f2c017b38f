"""Faults on real processes: kill -9 under load, a role process that exits mid-call, a replica
that stops answering (SIGSTOP: its heartbeat lapses), a role that never returns, garbage on the
sockets. After each, calls that were not hit complete, the replica comes back and takes
traffic, and nothing is left in any process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import zmq
import zmq.asyncio

from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed, wait_for

FLOW = """
placeholder request: Json

role front {
    impl "roles:Front"
    interface run { in request  out job: Json }
}

role worker {
    impl "roles:Worker"
    replicas 2
    interface run { in job  out result: Json }
}

graph g {
    entry request
    return result
    timeout 20s
}
"""

ROLES = """
import asyncio, os

class Front:
    async def run(self, ctx, request):
        return {"job": request}

class Worker:
    async def run(self, ctx, job):
        if job.get("exit") and ctx.replica == job["exit"]:
            os._exit(7)
        await asyncio.sleep(job.get("sleep", 0))
        if job.get("hang"):
            await asyncio.Event().wait()
        return {"result": {"pid": os.getpid(), "n": job.get("n")}}
"""


def status_and_errors(events: list[dict]) -> tuple[str, list[dict]]:
    return events[-1]["status"], events[-1]["errors"]


def test_kill_9_of_a_replica_under_load(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    ttl = 1.0

    async def main():
        async with deployed(bundle, heartbeat_ttl=ttl) as deployment:
            supervisor, runtime = deployment.supervisor, deployment.runtime
            victim = supervisor.pids()["worker/0"]
            loop = asyncio.get_running_loop()
            ended_at: dict[int, float] = {}

            async def one(n: int):
                events = await calls(runtime, "g", {"request": {"n": n, "sleep": 0.6}})
                ended_at[n] = loop.time()
                return events

            load = [asyncio.ensure_future(one(n)) for n in range(8)]
            await wait_for(lambda: runtime.statistics()["busy_replicas"] == 2, 5, "both replicas busy")
            killed_at = loop.time()
            os.kill(victim, signal.SIGKILL)
            results = await asyncio.gather(*load)
            failed = [(n, e) for n, e in enumerate(results) if e[-1]["status"] != "ok"]
            assert failed and len(failed) < len(results)  # the victim's calls fail, the others complete
            for n, events in failed:
                status, errors = status_and_errors(events)
                assert status == "error"
                assert [e["role"] for e in errors] == ["worker"]
                assert "replica 0 of role `worker` went away" in errors[0]["message"]
                assert "killed by SIGKILL" in errors[0]["message"]
                assert ended_at[n] - killed_at < ttl + 1
            for events in (e for e in results if e[-1]["status"] == "ok"):
                assert events[0]["value"]["pid"] != victim
            # restarted, re-registered, and taking traffic again
            await wait_for(lambda: supervisor.restarted == 1 and len(supervisor.remote.live["worker"]) == 2, 15, "restart")
            reborn = supervisor.pids()["worker/0"]
            assert reborn != victim
            pids = {(await calls(runtime, "g", {"request": {"n": i}}))[0]["value"]["pid"] for i in range(4)}
            assert reborn in pids
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_a_role_process_that_exits_during_a_call(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            supervisor, runtime = deployment.supervisor, deployment.runtime
            results = [await calls(runtime, "g", {"request": {"n": n, "exit": 1}}) for n in range(2)]
            statuses = sorted(e[-1]["status"] for e in results)
            assert statuses == ["error", "ok"]  # round robin: replica 1 exits on its call
            (failed,) = [e for e in results if e[-1]["status"] == "error"]
            (error,) = failed[-1]["errors"]
            assert error["role"] == "worker" and "exited with status 7" in error["message"]
            await wait_for(lambda: supervisor.restarted == 1 and len(supervisor.remote.live["worker"]) == 2, 15, "restart")
            ok = [await calls(runtime, "g", {"request": {"n": n}}) for n in range(4)]
            assert all(e[-1]["status"] == "ok" for e in ok)
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_a_replica_that_stops_answering_is_dropped_when_its_heartbeat_lapses(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    ttl = 1.0

    async def main():
        async with deployed(bundle, heartbeat_ttl=ttl) as deployment:
            supervisor, runtime = deployment.supervisor, deployment.runtime
            frozen = supervisor.pids()["worker/1"]
            os.kill(frozen, signal.SIGSTOP)
            try:
                loop = asyncio.get_running_loop()
                started = loop.time()
                results = await asyncio.gather(*(calls(runtime, "g", {"request": {"n": n}}) for n in range(2)))
                took = loop.time() - started
                (failed,) = [e for e in results if e[-1]["status"] == "error"]
                assert "heartbeat lapsed" in failed[-1]["errors"][0]["message"]
                assert failed[-1]["errors"][0]["role"] == "worker"
                assert took < ttl + 1
                await wait_for(lambda: supervisor.restarted == 1 and len(supervisor.remote.live["worker"]) == 2, 15, "restart")
                assert supervisor.pids()["worker/1"] != frozen
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(frozen, signal.SIGCONT)  # (it should have been killed)
            ok = [await calls(runtime, "g", {"request": {"n": n}}) for n in range(4)]
            assert all(e[-1]["status"] == "ok" for e in ok)
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_a_role_that_never_answers_times_out_and_is_stopped_in_its_process(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            events = await calls(deployment.runtime, "g", {"request": {"hang": True}}, timeout=0.5)
            assert events[-1]["status"] == "cancelled" and events[-1]["reason"] == "timeout"
            await assert_clean_everywhere(deployment)  # the replica's task was cancelled there too

    asyncio.run(main())


NOT_UTF8 = b"\x98\xa9\xffeartbeat\x01\xa1x\x00\xa1i\x00\x00\x00"


def test_garbage_on_the_sockets_is_logged_and_dropped(tmp_path, capfd, caplog):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            supervisor = deployment.supervisor
            context = zmq.asyncio.Context()
            try:
                # (peers holding the deployment's keys, a buggy one's garbage: without them nothing
                # even arrives, tests/deploy/test_attacks.py)
                address = supervisor.remote.links[("worker", 0)].record.address
                replica = context.socket(zmq.DEALER)
                replica.setsockopt(zmq.LINGER, 0)
                supervisor.keys.dial(replica, "gateway", address)
                replica.connect(address)
                registry = context.socket(zmq.PUSH)
                registry.setsockopt(zmq.LINGER, 0)
                supervisor.keys.dial(registry, "member", supervisor.registry_endpoint)
                registry.connect(supervisor.registry_endpoint)
                from flowrt.transport import messages as m

                start = m.encode(m.Start(m.VERSION, 1, 1, "s", "g", "run", False))
                for frames in (
                    [b"\x00garbage"],
                    [b""],
                    [m.encode(m.Start(99, 1, 1, "s", "g", "run", False))],  # another protocol version
                    [start],  # no payload
                    [start, b"\x80\x05truncated"],
                    [NOT_UTF8],  # msgpack that decodes to a string that is not UTF-8
                ):
                    await replica.send_multipart(frames)
                await registry.send(b"\xff\xfe not a registration")
                await registry.send(NOT_UTF8)
                await registry.send(m.encode(m.Heartbeat(m.VERSION, "nobody", 0, "x", 0, 0, 0)))
                for _ in range(3):
                    events = await calls(deployment.runtime, "g", {"request": {"n": 1}})
                    assert events[-1]["status"] == "ok"
                await wait_for(lambda: supervisor.source.garbage == 2, 5, "the registry's garbage counted")
                beats = supervisor.directory.records[("worker", 0)].beats
                await wait_for(lambda: supervisor.directory.records[("worker", 0)].beats > beats, 5, "the registry still reads")
                replica.close(0)
                registry.close(0)
            finally:
                context.term()
            await assert_clean_everywhere(deployment)

    asyncio.run(main())
    err = capfd.readouterr().err
    assert err.count("replica 0 of role `worker`: dropped") == 6, err
    assert "Traceback" not in err
    assert "registry: dropped a message that is not a registry message" in caplog.text  # (the gateway's own log)


ERRORS_FLOW = """
placeholder request: Json

role bad {
    impl "roles:Bad"
    interface run {
        in request
        out stream word: Json
        timeout 300ms
    }
}

graph g {
    entry request
    stream word
}
"""

ERRORS_ROLES = """
import asyncio

class Bad:
    async def run(self, ctx, request):
        if request == "raise":
            raise ValueError("no such word")
        if request == "not a dict":
            yield ["a", "list"]
        if request == "undeclared":
            yield {"word": 1, "extra": 2}
        if request == "slow":
            await asyncio.sleep(30)
        yield {"word": request}
"""


def test_role_errors_read_the_same_under_inproc_and_local(tmp_path):
    """An exception, a broken contract and a timeout: the same error events (message and
    `where`, the place in the role's code) whether the role ran here or in its own process."""
    bundle = bundle_with_roles(ERRORS_FLOW, ERRORS_ROLES, tmp_path)

    async def main(deploy: str) -> list[dict]:
        async with deployed(bundle, deploy) as deployment:
            ends = []
            for request in ("raise", "not a dict", "undeclared", "slow", "fine"):
                events = await calls(deployment.runtime, "g", {"request": request})
                ends.append({k: events[-1][k] for k in ("status", "errors", "missing")} | {"reason": events[-1].get("reason")})
            if deployment.supervisor is not None:
                await assert_clean_everywhere(deployment)
            return ends

    inproc, local = asyncio.run(main("inproc")), asyncio.run(main("local"))
    assert local == inproc
    messages = [end["errors"][0]["message"] if end["errors"] else "" for end in inproc]
    assert "ValueError: no such word" in messages[0]
    assert "must yield or return a dict" in messages[1] and "which its interface does not declare" in messages[2]
    assert "timed out after 0.3s" in messages[3] and inproc[3]["errors"][0]["where"].endswith(
        "roles.py:13"
    )  # the line it waited at
    assert inproc[4]["status"] == "ok"


def test_replicas_exit_when_their_supervisor_is_killed(tmp_path):
    import subprocess
    import sys
    import time

    from tests.deploy.test_cli_deploy import workers_of

    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    server = subprocess.Popen(
        [sys.executable, "-m", "flowc", "run", str(bundle), "--deploy", "local", "--http", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout.readline().startswith("serving ")
        assert len(workers_of(bundle)) == 3
        server.kill()
        server.wait(10)
        deadline = time.monotonic() + 10
        while workers_of(bundle) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert workers_of(bundle) == []
    finally:
        if server.poll() is None:
            server.kill()
        server.stdout.close()
