"""Tensors between role processes under `--deploy local`: one block in shared memory, handles
on the wire, refs released with activations and calls, and the faults (a role process killed
holding refs, the pool exhausted, the manager killed)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal

import pytest

torch = pytest.importorskip("torch", reason="the data plane's tensors need torch (pip install 'flowc[torch]')")

from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed, wait_for  # noqa: E402

MB = 1 << 20

PIPELINE = """
placeholder request: Json

role make {
    impl "roles:Make"
    interface run { in request  out x1: Tensor, digest: Json }
}
role stage_b {
    impl "roles:Pass"
    interface run { in x1  out x2: Tensor, b: Json }
}
role stage_c {
    impl "roles:Pass"
    interface run { in x2  out x3: Tensor, c: Json }
}
role d1 {
    impl "roles:Consume"
    interface run { in x3  out s1: Json }
}
role d2 {
    impl "roles:Consume"
    interface run { in x3  out s2: Json }
}
role d3 {
    impl "roles:Consume"
    interface run { in x3  out s3: Json }
}

graph g {
    entry request
    return digest, b, c, s1, s2, s3
}
"""

ROLES = """
import asyncio, hashlib, os, pathlib
import torch


def digest(t):
    return hashlib.sha256(memoryview(t.numpy()).cast("B")).hexdigest()


def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024


class Make:
    async def run(self, ctx, request):
        t = ctx.memory.empty((request["mb"] * 2**20 // 4,), torch.float32)
        t.uniform_(generator=torch.Generator().manual_seed(request["seed"]))
        return {"x1": t, "digest": digest(t)}


class Pass:
    async def run(self, ctx, **fields):
        (name, x), = fields.items()
        out = {"x1": "x2", "x2": "x3"}[name]
        return {out: x, out.replace("x2", "b").replace("x3", "c"): {"digest": digest(x), "pid": os.getpid(), "rss": rss()}}


class Consume:
    async def run(self, ctx, x3):
        pathlib.Path(os.environ["GATE"] + "-" + ctx.role).touch()
        gate = pathlib.Path(os.environ["GATE"])
        for _ in range(3000):  # until the test has looked at the manager (bounded: 30 s)
            if gate.exists():
                break
            await asyncio.sleep(0.01)
        return {f"s{ctx.role[-1]}": digest(x3)}
"""


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("control", ["gateway", "shards"])
def test_a_256_mb_tensor_passes_three_stages_and_reaches_three_consumers_in_one_block(tmp_path, monkeypatch, control):
    monkeypatch.setenv("FLOWRT_CONTROL", control)  # (shards: the frames go replica to replica, docs/design/decentralised.md)
    gate = tmp_path / "gate"
    monkeypatch.setenv("GATE", str(gate))
    bundle = bundle_with_roles(PIPELINE, ROLES, tmp_path)

    async def main():
        async with deployed(bundle, pool_mb=512) as deployment:
            gateway_rss = rss_of(os.getpid())
            call = asyncio.ensure_future(calls(deployment.runtime, "g", {"request": {"mb": 256, "seed": 7}}))

            def three_consumers_hold_it():
                return all((tmp_path / f"gate-{role}").exists() for role in ("d1", "d2", "d3"))

            await wait_for(three_consumers_hold_it, 60, "three consumers running with the tensor")
            stats = deployment.memory_statistics()
            assert stats["blocks"] == 1, stats  # one block through every stage and for every consumer
            assert stats["bytes_requested"] == 256 * MB
            if control == "gateway":
                (held,) = stats["refs_by_call"].values()
                assert held == 3  # one per consumer activation (the producers' activations ended)
                assert set(stats["refs_by_process"]) == {str(os.getpid())}  # and the gateway's, while its frames live
            else:  # the tensor never went through the gateway: each consumer's process holds it while it lives
                assert stats["refs_by_call"] == {} and str(os.getpid()) not in stats["refs_by_process"], stats
                assert sorted(stats["refs_by_process"].values()) == [1, 1, 1], stats
            gate.touch()
            events = await call
            assert rss_of(os.getpid()) - gateway_rss < 64 * MB  # the gateway never touched the pages
            (done,) = [e for e in events if e["event"] == "done"]
            assert done["status"] == "ok", events
            values = {e["field"]: e["value"] for e in events if e["event"] == "return"}
            want = values["digest"]
            assert values["b"]["digest"] == values["c"]["digest"] == want
            assert values["s1"] == values["s2"] == values["s3"] == want
            # the stage that sent it to three consumers did not copy it once per consumer
            sender = values["c"]["pid"]
            assert rss_of(sender) - values["c"]["rss"] < 64 * MB
            del events, values, call
            gc.collect()
            await assert_clean_everywhere(deployment)
            stats = deployment.memory_statistics()
            assert stats["blocks"] == 0 and stats["refs"] == 0, stats

    asyncio.run(main())


HOLD = """
placeholder request: Json

role hold {
    impl "roles:Hold"
    interface run { in request  out x: Json }
}

graph g {
    entry request
    return x
}
"""

HOLD_ROLES = """
import asyncio, os, pathlib
import torch


class Hold:
    async def setup(self, ctx):
        self.kept = ctx.memory.empty((1 << 20,), torch.uint8)  # the process's: until it dies

    async def run(self, ctx, request):
        t = ctx.memory.empty((request["mb"] << 20,), torch.uint8)
        t.fill_(1)
        if request.get("wait"):
            pathlib.Path(request["wait"]).touch()
            await asyncio.sleep(60)
        return {"x": int(t[:8].sum())}
"""


def test_killing_a_process_that_holds_blocks_reclaims_them(tmp_path):
    bundle = bundle_with_roles(HOLD, HOLD_ROLES, tmp_path)
    started = tmp_path / "started"

    async def main():
        async with deployed(bundle, pool_mb=64) as deployment:
            baseline = deployment.memory_statistics()
            assert baseline["blocks"] == 1 and list(baseline["refs_by_process"].values()) == [1]  # setup's block
            call = asyncio.ensure_future(calls(deployment.runtime, "g", {"request": {"mb": 8, "wait": str(started)}}))
            await wait_for(started.exists, 30, "the activation holding a block")
            assert deployment.memory_statistics()["blocks"] == 2
            os.kill(deployment.supervisor.pids()["hold/0"], signal.SIGKILL)
            events = await call
            assert events[-1]["status"] == "error" and "hold" in events[-1]["errors"][0]["message"], events
            await wait_for(
                lambda: deployment.memory_statistics()["refs_by_process"].keys().isdisjoint(baseline["refs_by_process"]),
                10,
                "the dead process's block reclaimed",
            )
            await wait_for(
                lambda: "hold/0" in deployment.supervisor.pids() and len(deployment.supervisor.remote.live["hold"]) == 1,
                30,
                "the replica restarted",
            )
            stats = deployment.memory_statistics()
            assert stats["refs_by_call"] == {} and stats["blocks"] == 1, stats  # only the new process's setup block
            assert (await calls(deployment.runtime, "g", {"request": {"mb": 8}}))[-1]["status"] == "ok"

    asyncio.run(main())


def test_an_exhausted_pool_fails_the_call_clearly_and_nothing_else(tmp_path):
    bundle = bundle_with_roles(HOLD, HOLD_ROLES, tmp_path)
    started = tmp_path / "started"

    async def main():
        async with deployed(bundle, pool_mb=128) as deployment:
            too_large = await calls(deployment.runtime, "g", {"request": {"mb": 200}})
            assert too_large[-1]["status"] == "error"
            message = too_large[-1]["errors"][0]["message"]
            assert "pool" in message and "--pool-mb" in message, message
            holding = asyncio.ensure_future(calls(deployment.runtime, "g", {"request": {"mb": 40, "wait": str(started)}}))
            await wait_for(started.exists, 30, "a call holding 40 MiB")
            refused = await calls(deployment.runtime, "g", {"request": {"mb": 48}}, session="other")
            assert refused[-1]["status"] == "error" and "exhausted" in refused[-1]["errors"][0]["message"], refused
            deployment.runtime.cancel_all("test over")
            await holding
            assert (await calls(deployment.runtime, "g", {"request": {"mb": 48}}))[-1]["status"] == "ok"
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_a_killed_memory_manager_ends_the_calls_in_flight_and_is_restarted(tmp_path):
    bundle = bundle_with_roles(HOLD, HOLD_ROLES, tmp_path)
    started = tmp_path / "started"

    async def main():
        async with deployed(bundle, pool_mb=64) as deployment:
            manager = deployment.supervisor.manager
            first = manager.pid
            call = asyncio.ensure_future(calls(deployment.runtime, "g", {"request": {"mb": 8, "wait": str(started)}}))
            await wait_for(started.exists, 30, "a call holding a block")
            os.kill(first, signal.SIGKILL)
            events = await call
            done = events[-1]
            assert done["status"] == "error", events
            assert [e["where"] for e in done["errors"]] == ["memory manager"], done
            assert "memory manager (pid" in done["errors"][0]["message"] and "died" in done["errors"][0]["message"], done
            await wait_for(lambda: manager.pid not in (None, first), 30, "a new memory manager")
            assert "blocks" in deployment.memory_statistics()
            after = await calls(deployment.runtime, "g", {"request": {"mb": 8}})
            assert after[-1]["status"] == "ok", after

    asyncio.run(main())
