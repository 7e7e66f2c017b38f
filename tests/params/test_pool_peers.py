"""Two processes of one machine share KV pages through L2 and the Redis metadata store: one writes
a session's pages, the other finds them by prefix match and reads them in place (no copy); and
a Redis that dies or whose script fails loses nothing from L1/L2."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

torch = pytest.importorskip("torch", reason="the KV pool's tiers are torch tensors (the torch extra)")

import redis  # noqa: E402

from flowrt.params.meta.redis_store import RedisStore  # noqa: E402
from flowrt.params.pool import KVPool  # noqa: E402
from tests.deploy.helpers import free_port  # noqa: E402
from tests.params.test_meta_helpers import redis_server  # noqa: E402
from tests.params.test_pool import LAYOUT, fill, keys, page_in_l1, write  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (the CI machine has it)")

WRITER = textwrap.dedent(
    """
    import json, sys
    from flowrt.params.meta.redis_store import RedisStore
    from flowrt.params.pool import KVPool
    from tests.params.test_pool import LAYOUT, keys, write

    url, deployment = sys.argv[1], sys.argv[2]
    pool = KVPool(LAYOUT, device_pages=8, host_pages=16, store=RedisStore.connect(url, deployment),
                  deployment=deployment, node="writer")
    pages = write(pool, "chat-1", keys("p", 6), seed=7)
    print(json.dumps({"host": str(pool.host.path), "pages": [page.flatten().tolist() for page in pages]}), flush=True)
    sys.stdin.readline()  # keep the pages (and the process) until the test is done reading
    pool.close()
    """
)


def start_writer(url: str, deployment: str) -> tuple[subprocess.Popen, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, deployment], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    line = writer.stdout.readline()
    assert line, f"the writer process failed (exit {writer.wait(timeout=30)})"
    return writer, json.loads(line)


def stop(writer: subprocess.Popen) -> None:
    writer.stdin.write("\n")
    writer.stdin.flush()
    writer.wait(timeout=30)


def test_a_second_process_finds_the_pages_by_prefix_and_reads_them_from_l2_without_a_copy():
    port = free_port()
    url, deployment = f"redis://127.0.0.1:{port}/0", f"peers-{uuid.uuid4().hex[:8]}"
    with redis_server(port):
        writer, told = start_writer(url, deployment)
        reader = KVPool(
            LAYOUT, device_pages=8, host_pages=8, store=RedisStore.connect(url, deployment), deployment=deployment, node="reader"
        )
        try:
            expected = [torch.tensor(page).view(len(LAYOUT.chunks()), *LAYOUT.item_shape) for page in told["pages"]]
            with reader.read_shared("chat-1", keys("p", 6) + ["p9999"]) as shared:
                assert shared.pages == 6
                tier = reader.peers.find("writer")
                assert str(tier.path) == told["host"]  # the writer's own shared file, mapped here
                start = tier.bytes.data_ptr()
                for i in range(6):
                    views = shared.view(i)
                    assert torch.equal(torch.stack(views), expected[i])
                    for view in views:  # in place: every view points into the writer's pages
                        assert start <= view.data_ptr() < start + tier.nbytes
                # the writer's pages are replica-locked while they are read: its eviction refuses them
                probe = RedisStore.connect(url, deployment)
                refused = probe.evict("writer", reader.layout_id, keys("p", 6)[:1], drop=True)
                assert refused[0].reason == "replica_lock"
                probe.close()
            hit = asyncio.run(reader.match("chat-1", keys("p", 6), "turn-2"))  # into L1: a copy, counted
            assert hit.pages == 6 and set(hit.sources) == {"peer"}
            for slot, page in zip(hit.slots, expected, strict=True):
                assert torch.equal(page_in_l1(reader, slot), page)
            assert reader.counters.peer_pages == 6 and reader.counters.copy_segments == 1
        finally:
            stop(writer)
            reader.close()
        # the writer gone, its pages stop matching (it left the store) and its file is gone
        fresh = KVPool(LAYOUT, device_pages=4, store=RedisStore.connect(url, deployment), deployment=deployment, node="late")
        try:
            assert asyncio.run(fresh.match("chat-1", keys("p", 6), "late")).pages == 0
            assert not os.path.exists(told["host"])
        finally:
            fresh.close()


def test_redis_down_keeps_every_page_and_publishes_them_once_it_is_back():
    port = free_port()
    url, deployment = f"redis://127.0.0.1:{port}/0", f"down-{uuid.uuid4().hex[:8]}"
    with redis_server(port) as server:
        pool = KVPool(
            LAYOUT, device_pages=8, host_pages=16, store=RedisStore.connect(url, deployment), deployment=deployment, node="n"
        )
        try:
            before = write(pool, "s", keys("a", 3), seed=1)
            server.kill()  # SIGKILL: Redis is gone mid-use
            server.wait(timeout=10)
            slots = pool.allocate(keys("b", 3), "w")
            fill(pool, slots, seed=2)
            assert pool.commit("s", keys("b", 3), "w", start=3) is False  # kept here, not published
            pool.release("w")
            assert "cannot reach" in pool.last_meta_error or "redis" in pool.last_meta_error.lower()
            stats = pool.statistics()
            assert stats["pending_publishes"] == 3 and stats["meta_errors"] >= 1
            hit = asyncio.run(pool.match("s", keys("a", 3) + keys("b", 3), "r"))  # served from this process
            assert hit.pages == 6 and hit.degraded is None  # (all local: the store was not needed)
            for slot, page in zip(hit.slots[:3], before, strict=True):
                assert torch.equal(page_in_l1(pool, slot), page)
            pool.release("r")
            assert all(pool.l2.slot_of(key) is not None for key in keys("a", 3) + keys("b", 3))
        finally:
            pass
        with redis_server(port):  # back (empty: it kept nothing): the node registers again and publishes
            pool._beat_at = -1e9  # its next call renews at once rather than after a third of the TTL
            asyncio.run(pool.match("s", ["nothing"], "r2"))
            assert pool.statistics()["pending_publishes"] == 0
            other = RedisStore.connect(url, deployment)
            assert (
                other.match(
                    "s",
                    pool.layout_id,
                    keys("b", 3),
                ).length
                == 0
            )  # b was published at 3..5
            assert other.chain(pool.layout_id, "s")[3:6] == keys("b", 3)
            other.close()
            pool.close()


def test_a_failing_script_is_named_and_nothing_is_dropped():
    port = free_port()
    url, deployment = f"redis://127.0.0.1:{port}/0", f"script-{uuid.uuid4().hex[:8]}"
    with redis_server(port):
        pool = KVPool(
            LAYOUT, device_pages=8, host_pages=8, store=RedisStore.connect(url, deployment), deployment=deployment, node="n"
        )
        try:
            pages = write(pool, "s", keys("a", 2), seed=3)
            server = redis.Redis(port=port)
            chain = [key for key in server.keys(f"*{deployment}*") if b"chain" in key]
            assert chain, "the session's chain is a key of the deployment's namespace"
            server.delete(*chain)
            server.set(chain[0], "not a list")  # a key of the wrong type: the publish script fails
            slots = pool.allocate(keys("b", 2), "w")
            fill(pool, slots, seed=4)
            assert pool.commit("s", keys("b", 2), "w", start=2) is False
            pool.release("w")
            assert "script" in pool.last_meta_error.lower()
            for key, page in zip(keys("a", 2), pages, strict=True):
                assert torch.equal(torch.stack(pool.host.view(None, pool.l2.slot_of(key))), page)
            assert all(pool.l1.slot_of(key) is not None for key in keys("b", 2))
        finally:
            pool.close()


def test_odd_descriptors_are_ignored_and_never_block(tmp_path):
    from flowrt.memory import slab
    from flowrt.params import peers as peers_

    digest = peers_.node_digest("odd", "victim")
    shm = slab.shm_dir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    made = []

    def plant(pid: int, host: str) -> None:
        path = shm / f"{slab.PREFIX}{pid}-kvnode-{digest}"
        text = {"version": 1, "deployment": "odd", "node": "victim", "layout_id": LAYOUT.layout_id(), "host_path": host,
                "host_slots": 4, "pid": pid}  # fmt: skip
        path.write_text(json.dumps(text))
        made.append(path)

    fifo = shm / f"{slab.PREFIX}{os.getpid()}-kvnode-{digest}"
    os.mkfifo(fifo)  # read naively, a FIFO blocks forever
    made.append(fifo)
    outside = tmp_path / f"{slab.PREFIX}{os.getpid()}-kv-x"
    outside.write_bytes(bytes(4 * LAYOUT.page_bytes))
    try:
        plant(dead.pid, str(shm / f"{slab.PREFIX}{dead.pid}-kv-gone"))  # its process is gone
        peers = peers_.Peers("odd", LAYOUT)
        assert peers.find("victim") is None
        for path in made:
            path.unlink()
        made.clear()
        plant(os.getpid(), str(outside))  # a live process, but its "L2" is not in the shared-memory directory
        assert peers.find("victim") is None
    finally:
        for path in made:
            path.unlink(missing_ok=True)
