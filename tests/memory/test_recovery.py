"""The data plane under faults that a trial found, on real processes (`--deploy local`): a pool
tensor kept from before a manager restart is copied, never confused with a block of the new
pool; a stream of ordinary tensors that outruns the pool is pickled instead of failing; a
kv_pool_barrier agreed before a manager restart holds for a replica restarted after it; a
stopped manager fails requests without getting replicas killed; a call made once a killed
manager was restarted works, even from a process whose last request timed out (issue 32, item 7);
tensors whose layout a handle
cannot carry (conjugate and negative views, sparse CSR, quantized, nested) arrive as they do
under inproc; and inputs a replica cannot map are answered with an error, not dropped."""

from __future__ import annotations

import asyncio
import os
import resource
import signal

import pytest

torch = pytest.importorskip("torch", reason="the data plane's tensors need torch (pip install 'flowc[torch]')")

from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed, wait_for  # noqa: E402

FLOW = """
placeholder request: Json

role holder {
    impl "recovery_roles:Holder"
    interface run { in request  out x: Tensor }
}
role seven {
    impl "recovery_roles:Seven"
    interface run { in request  out seven: Json }
}
role total {
    impl "recovery_roles:Total"
    interface run { in x  out total: Json }
}
role odd {
    impl "recovery_roles:Odd"
    interface run { in request  out y: Tensor }
}
role describe {
    impl "recovery_roles:Describe"
    interface run { in y  out d: Json }
}
role streamer {
    impl "recovery_roles:Stream"
    interface run { in request  out stream z: Tensor }
}
role barrier {
    impl "recovery_roles:Barrier"
    replicas 2
    lb round_robin
    interface run { in request  out pages: Json }
}

graph held {
    entry request
    return total
}

graph fill {
    entry request
    return seven
}

graph odd {
    entry request
    return d
}

graph many {
    entry request
    stream z ordered
}

graph pages {
    entry request
    return pages
}
"""

ROLES = """
import torch

N = 1 << 18  # 1 MiB of float32


class Holder:
    async def setup(self, ctx):
        self.buf = ctx.memory.empty((N,))  # the pool's first block, kept for the process's life
        self.buf.fill_(1.0)

    async def run(self, ctx, request):
        return {"x": self.buf}


class Seven:
    async def run(self, ctx, request):
        t = ctx.memory.empty((N,))
        t.fill_(7.0)
        ctx.memory.cache(t, "seven")  # (stays in the pool, idle, after the call)
        return {"seven": True}


class Total:
    async def run(self, ctx, x):
        return {"total": float(x.sum())}


class Odd:
    async def run(self, ctx, request):
        kind = request["kind"]
        if kind in ("conj", "neg"):
            t = ctx.memory.empty((N,), torch.complex64)
            t.fill_(1 + 2j)
            return {"y": t.conj() if kind == "conj" else t.conj().imag}
        if kind == "csr":
            return {"y": torch.eye(512).to_sparse_csr()}
        if kind == "quantized":
            return {"y": torch.quantize_per_tensor(torch.ones(N), 0.5, 0, torch.qint8)}
        return {"y": torch.nested.nested_tensor([torch.ones(N // 2), torch.full((N // 4,), 2.0)])}


class Describe:
    async def run(self, ctx, y):
        if y.is_nested:
            values = [float(part.sum()) for part in y.unbind()]
        elif y.is_quantized:
            values = [float(y.dequantize().sum())]
        elif y.layout != torch.strided:
            values = [float(y.to_dense().sum()), float(y.to_dense().trace())]
        elif y.is_complex():
            values = [float(y.sum().real), float(y.sum().imag)]
        else:
            values = [float(y.sum())]
        return {"d": {"values": values}}  # (the conj bit itself is resolved on the way: docs/memory.md)


class Stream:
    async def run(self, ctx, request):
        for i in range(request["n"]):
            yield {"z": torch.full((N,), float(i))}  # ordinary tensors: each copied into the pool


class Barrier:
    async def setup(self, ctx):
        self.pages = await ctx.memory.kv_pool_barrier(100 + ctx.replica, group="trial", participants=2, timeout=20)

    async def run(self, ctx, request):
        return {"pages": self.pages}
"""

N = 1 << 18


@pytest.fixture
def bundle(tmp_path):
    return bundle_with_roles(FLOW, ROLES, tmp_path, module="recovery_roles")


def test_a_pool_tensor_kept_across_a_manager_restart_is_copied_not_confused(bundle):
    async def main():
        async with deployed(bundle, pool_mb=64) as deployment:
            manager = deployment.supervisor.manager
            first = manager.pid
            os.kill(first, signal.SIGKILL)
            await wait_for(lambda: manager.pid not in (None, first), 30, "a new memory manager")
            await wait_for(lambda: "blocks" in deployment.memory_statistics(), 30, "the new manager answering")
            # a block of the new pool where the kept tensor's block was in the old one
            assert (await calls(deployment.runtime, "fill", {"request": 1}))[-1]["status"] == "ok"
            events = await calls(deployment.runtime, "held", {"request": 1})
            assert events[-1]["status"] == "ok", events
            assert events[0]["value"] == N * 1.0, events  # the holder's ones, not the new block's sevens

    asyncio.run(main())


def test_a_stream_of_ordinary_tensors_larger_than_the_pool_is_pickled_not_failed(bundle):
    async def main():
        async with deployed(bundle, pool_mb=8) as deployment:
            events = await calls(deployment.runtime, "many", {"request": {"n": 24}})  # 24 MiB held by the caller
            assert events[-1]["status"] == "ok" and events[-1]["errors"] == [], events[-1]
            values = [e["value"] for e in events if e["event"] == "stream"]
            assert [float(v[0]) for v in values] == [float(i) for i in range(24)]
            assert all(float(v.sum()) == i * N for i, v in enumerate(values))
            del values, events
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_a_barrier_agreed_before_a_manager_restart_holds_for_a_replica_restarted_after(bundle):
    async def main():
        async with deployed(bundle, pool_mb=16, heartbeat_ttl=1.5) as deployment:
            supervisor = deployment.supervisor
            answers = {(await calls(deployment.runtime, "pages", {"request": i}))[0]["value"] for i in range(2)}
            assert answers == {100}
            manager = supervisor.manager
            first = manager.pid
            os.kill(first, signal.SIGKILL)
            await wait_for(lambda: manager.pid not in (None, first), 30, "a new memory manager")
            # the survivors re-announce the size they agreed on with their heartbeats
            await wait_for(
                lambda: deployment.memory_statistics().get("barriers", {}).get("trial", {}).get("value") == 100,
                30,
                "the new manager knowing the barrier's size",
            )
            restarts = supervisor.restarted
            os.kill(supervisor.pids()["barrier/0"], signal.SIGKILL)
            await wait_for(
                lambda: supervisor.restarted > restarts and ("barrier", 0) in supervisor.remote.links, 30, "barrier/0 back"
            )
            answers = {(await calls(deployment.runtime, "pages", {"request": i}))[0]["value"] for i in range(4)}
            assert answers == {100}

    asyncio.run(main())


def test_a_stopped_manager_fails_requests_without_getting_replicas_killed(bundle):
    async def main():
        async with deployed(bundle, pool_mb=16, heartbeat_ttl=1.5) as deployment:
            supervisor = deployment.supervisor
            manager = supervisor.manager
            os.kill(manager.pid, signal.SIGSTOP)
            try:
                failed = []
                for _ in range(40):  # bounded: a request waits 0.5 s at most, later ones fail at once
                    events = await calls(deployment.runtime, "fill", {"request": 1})
                    if events[-1]["status"] != "ok":
                        failed.append(events[-1]["errors"][0]["message"])
                    if len(failed) >= 6:
                        break
                assert len(failed) >= 6 and all("did not answer" in m for m in failed), failed
            finally:
                os.kill(manager.pid, signal.SIGCONT)
            await wait_for(lambda: "blocks" in deployment.memory_statistics(), 30, "the manager answering again")
            events = []
            for _ in range(40):  # (the replica's client waits out its quiet period first)
                events = await calls(deployment.runtime, "fill", {"request": 1})
                if events[-1]["status"] == "ok":
                    break
                await asyncio.sleep(0.1)
            assert events[-1]["status"] == "ok", events
            assert supervisor.restarted == 0  # no heartbeat lapsed while the manager was stopped

    asyncio.run(main())


def test_a_call_made_once_a_killed_manager_was_restarted_works(bundle):
    """Issue 32, item 7: a replica's request timed out (its manager was stopped), the manager was
    then killed with -9 and restarted; a call made after that failed for the rest of the client's
    quiet period, "did not answer within 5 s a moment ago", though a manager was there again."""

    async def main():
        async with deployed(bundle, pool_mb=16, heartbeat_ttl=15) as deployment:  # replicas' requests: 5 s
            supervisor = deployment.supervisor
            manager = supervisor.manager
            assert (await calls(deployment.runtime, "fill", {"request": 1}))[-1]["status"] == "ok"
            first = manager.pid
            os.kill(first, signal.SIGSTOP)
            try:
                events = await calls(deployment.runtime, "fill", {"request": 1})  # its Alloc waits 5 s, then fails
                assert events[-1]["status"] != "ok" and "did not answer Alloc within 5s" in str(events[-1]["errors"])
                events = await calls(deployment.runtime, "fill", {"request": 1})  # at once: what is true now
                message = str(events[-1]["errors"])
                assert events[-1]["status"] != "ok" and "has not answered since though its connection is open" in message
            finally:
                os.kill(first, signal.SIGKILL)
            await wait_for(lambda: manager.pid not in (None, first), 30, "a new memory manager")
            await wait_for(lambda: "blocks" in deployment.memory_statistics(), 30, "the new manager answering")
            events = await calls(deployment.runtime, "fill", {"request": 1})  # well within the 5 s of quiet
            assert events[-1]["status"] == "ok", events[-1]
            assert supervisor.restarted == 0

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["conj", "neg", "csr", "quantized", "nested"])
def test_tensors_a_handle_cannot_carry_arrive_as_under_inproc(bundle, kind):
    async def one(deploy: str, **options):
        async with deployed(bundle, deploy, **options) as deployment:
            events = await calls(deployment.runtime, "odd", {"request": {"kind": kind}})
            assert events[-1]["status"] == "ok", events
            return events[0]["value"]

    inproc = asyncio.run(one("inproc"))
    local = asyncio.run(one("local", pool_mb=16))
    assert local == inproc


def test_inputs_a_replica_cannot_map_fail_the_call_instead_of_hanging(bundle):
    async def main():
        async with deployed(bundle, pool_mb=64) as deployment:
            pid = deployment.supervisor.pids()["total/0"]
            with open(f"/proc/{pid}/status") as status:
                size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
            soft, hard = resource.prlimit(pid, resource.RLIMIT_AS)
            resource.prlimit(pid, resource.RLIMIT_AS, (size + (1 << 19), hard))  # no room to map 1 MiB more
            try:
                events = await asyncio.wait_for(calls(deployment.runtime, "held", {"request": 1}), 30)
            finally:
                resource.prlimit(pid, resource.RLIMIT_AS, (soft, hard))
            assert events[-1]["status"] == "error", events
            message = events[-1]["errors"][0]["message"]
            assert "could not read the inputs of `run`" in message and "replica 0 of role `total`" in message, message
            after = await calls(deployment.runtime, "held", {"request": 1})
            assert after[-1]["status"] == "ok" and after[0]["value"] == N * 1.0, after

    asyncio.run(main())
