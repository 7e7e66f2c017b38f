"""What a role sees of shared tensors (docs/memory.md): numpy arrays arrive read-only, a write
into a received torch tensor is the writer's own and is what it sends on, the LRU lends a
cached block to later calls, a timed-out call releases its blocks, and under `inproc` objects
pass by reference with the same `ctx.memory` calls."""

from __future__ import annotations

import asyncio
import gc

import pytest

torch = pytest.importorskip("torch", reason="the data plane's tensors need torch (pip install 'flowc[torch]')")

from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed  # noqa: E402

FLOW = """
placeholder request: Json

role source {
    impl "semantic_roles:Source"
    interface run { in request  out x: Tensor, arr: Tensor, a: Json }
}
role arrays {
    impl "semantic_roles:Arrays"
    interface run { in arr  out n: Json }
}
role writer {
    impl "semantic_roles:Writer"
    interface run { in x  out y: Tensor, w: Json }
}
role reader {
    impl "semantic_roles:Reader"
    interface run { in x  out r: Json }
}
role after {
    impl "semantic_roles:Reader"
    interface run { in y  out r2: Json }
}
role cacher {
    impl "semantic_roles:Cacher"
    interface run { in request  out c: Json }
    interface slow { in request  out s: Json }
}

graph write {
    entry request
    return w, r, r2, a, n
}

graph cache {
    entry request
    return c
}

graph slow {
    entry request
    return s
}
"""

ROLES = """
import asyncio, os
import numpy
import torch

N = 1 << 18  # 1 MiB of float32: large enough to travel through the pool


class Source:
    async def run(self, ctx, request):
        return {"x": torch.ones(N), "arr": numpy.ones(N), "a": {"same": "inproc" if ctx.memory.__class__.__name__ == "InprocMemory" else "pool"}}


class Writer:
    async def run(self, ctx, x):
        x.mul_(5)  # a private copy-on-write page set: the reader still sees ones
        return {"y": x, "w": float(x.sum())}


class Reader:
    async def run(self, ctx, **fields):
        (name, x), = fields.items()
        await asyncio.sleep(0.2)  # (after the writer wrote)
        return {"r" if name == "x" else "r2": {"sum": float(x.sum())}}


class Arrays:
    async def run(self, ctx, arr):
        try:
            arr[0] = 7
            return {"n": {"wrote": float(arr.sum())}}
        except ValueError as error:
            return {"n": {"refused": str(error), "sum": float(arr.sum())}}


class Cacher:
    async def run(self, ctx, request):
        key = request["key"]
        hit = ctx.memory.lookup(key)
        if hit is None:
            made = ctx.memory.empty((N,))
            made.fill_(request["value"])
            ctx.memory.cache(made, key)
            return {"c": {"hit": False, "sum": float(made.sum())}}
        return {"c": {"hit": True, "sum": float(hit.sum())}}

    async def slow(self, ctx, request):
        t = ctx.memory.empty((N,))
        t.fill_(1)
        await asyncio.sleep(30)
        return {"s": 0}
"""


def test_a_write_into_a_received_tensor_is_the_writers_own_and_travels_on(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path, module="semantic_roles")

    async def main():
        async with deployed(bundle, pool_mb=64) as deployment:
            events = await calls(deployment.runtime, "write", {"request": {}})
            values = {e["field"]: e["value"] for e in events if e["event"] == "return"}
            n = 1 << 18
            assert values["a"] == {"same": "pool"}
            assert values["w"] == 5 * n  # the writer sees its write
            assert values["r"]["sum"] == n  # the other consumer of x does not
            assert values["r2"]["sum"] == 5 * n  # what the writer sent on is what it wrote (copied)
            assert "read-only" in values["n"]["refused"] and values["n"]["sum"] == n  # numpy arrays arrive read-only
            del events, values
            gc.collect()
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_the_lru_lends_a_cached_block_to_later_calls_and_a_timeout_releases_blocks(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path, module="semantic_roles")

    async def main():
        async with deployed(bundle, pool_mb=64) as deployment:
            first = await calls(deployment.runtime, "cache", {"request": {"key": "k", "value": 3}})
            assert first[0]["value"] == {"hit": False, "sum": 3 * (1 << 18)}
            stats = deployment.memory_statistics()
            assert stats["blocks"] == 1 and stats["idle_cached"] == 1 and stats["refs"] == 0  # idle, kept by key
            second = await calls(deployment.runtime, "cache", {"request": {"key": "k", "value": 9}})
            assert second[0]["value"]["hit"] is True and second[0]["value"]["sum"] == 3 * (1 << 18)
            stats = deployment.memory_statistics()
            assert stats["lru_hits"] == 1 and stats["idle_cached"] == 1 and stats["refs"] == 0
            timed_out = await calls(deployment.runtime, "slow", {"request": {}}, timeout=0.5)
            assert timed_out[-1]["status"] == "cancelled" and timed_out[-1]["reason"] == "timeout"
            await assert_clean_everywhere(deployment)
            assert deployment.memory_statistics()["blocks"] == 1  # only the cached one

    asyncio.run(main())


def test_under_inproc_tensors_pass_by_reference_and_ctx_memory_works(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path, module="semantic_roles")

    async def main():
        async with deployed(bundle, "inproc") as deployment:
            events = await calls(deployment.runtime, "write", {"request": {}})
            values = {e["field"]: e["value"] for e in events if e["event"] == "return"}
            n = 1 << 18
            assert values["a"] == {"same": "inproc"}
            assert values["w"] == 5 * n and values["r2"]["sum"] == 5 * n
            assert values["r"]["sum"] == 5 * n  # one object: the reader sees the writer's change
            assert values["n"] == {"wrote": n + 6}  # an ordinary, writable array
            first = await calls(deployment.runtime, "cache", {"request": {"key": "k", "value": 3}})
            second = await calls(deployment.runtime, "cache", {"request": {"key": "k", "value": 9}})
            assert first[0]["value"]["hit"] is False and second[0]["value"]["hit"] is True
            assert second[0]["value"]["sum"] == 3 * n

    asyncio.run(main())


STREAM = """
placeholder request: Json

role producer {
    impl "stream_roles:Producer"
    interface run { in request  out stream chunk: Tensor }
}
role consumer {
    impl "stream_roles:Consumer"
    interface run { in chunk  out stream total: Json }
}

graph g {
    entry request
    stream total ordered
}
"""

STREAM_ROLES = """
import asyncio, os, pathlib
import torch


class Producer:
    async def run(self, ctx, request):
        seen = pathlib.Path(request["dir"])
        for i in range(request["chunks"]):
            t = ctx.memory.empty((4 << 20,), torch.uint8)  # 4 MiB a chunk
            t.fill_(i % 256)
            yield {"chunk": t}
            del t
            for _ in range(3000):  # until the consumer has taken it (bounded: 30 s)
                if (seen / str(i)).exists():
                    break
                await asyncio.sleep(0.01)


class Consumer:
    async def run(self, ctx, chunk):
        value = int(chunk[0])
        (pathlib.Path(os.environ["SEEN"]) / str(ctx.call_id * 0 + value)).touch()
        return {"total": value}
"""


def test_a_stream_of_pool_tensors_frees_each_block_as_it_is_consumed(tmp_path, monkeypatch):
    """40 chunks of 4 MiB through a 64 MiB pool: it only fits if every chunk's block goes back
    once its consumer is done, long before the producer's activation ends."""
    seen = tmp_path / "seen"
    seen.mkdir()
    monkeypatch.setenv("SEEN", str(seen))
    bundle = bundle_with_roles(STREAM, STREAM_ROLES, tmp_path, module="stream_roles")

    async def main():
        async with deployed(bundle, pool_mb=64) as deployment:
            events = await calls(deployment.runtime, "g", {"request": {"chunks": 40, "dir": str(seen)}})
            assert events[-1]["status"] == "ok", events[-1]
            assert [e["value"] for e in events if e["event"] == "stream"] == list(range(40))
            await assert_clean_everywhere(deployment)
            assert deployment.memory_statistics()["blocks"] == 0

    asyncio.run(main())
