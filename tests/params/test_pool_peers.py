"""Two processes of one machine share KV pages through L2 and the Redis metadata store: one writes
a session's pages, the other finds them by prefix match and reads them in place (no copy); a
Redis that dies or whose script fails loses nothing from L1/L2; and page locations rewritten in
Redis to point at another session's slots are misses (counted), never that session's K/V."""

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
    others = write(pool, "chat-2", keys("q", 6), seed=8)  # another session's pages, in other slots
    print(json.dumps({"host": str(pool.host.path), "pages": [page.flatten().tolist() for page in pages],
                      "others": [page.flatten().tolist() for page in others]}), flush=True)
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


def as_pages(told: list) -> list[torch.Tensor]:
    return [torch.tensor(page).view(len(LAYOUT.chunks()), *LAYOUT.item_shape) for page in told]


def test_page_locations_rewritten_in_redis_are_counted_misses_and_poison_nobody(caplog):
    """The attack of issue 32: someone who can write to the metadata Redis points session chat-1's
    pages at the slots where the writer keeps session chat-2's. A reader must not take chat-2's
    K/V for chat-1's: the slots' labels say which page they hold, so each is a miss (recomputed),
    counted and logged; what the reader then computes is right, for this session and a fresh one."""
    port = free_port()
    url, deployment = f"redis://127.0.0.1:{port}/0", f"tamper-{uuid.uuid4().hex[:8]}"
    with redis_server(port):
        writer, told = start_writer(url, deployment)
        reader = KVPool(
            LAYOUT,
            device_pages=16,
            host_pages=16,
            store=RedisStore.connect(url, deployment),
            deployment=deployment,
            node="reader",
        )
        server = redis.Redis(port=port, decode_responses=True)
        try:
            mine, theirs = as_pages(told["pages"]), as_pages(told["others"])
            layout_id = reader.layout_id
            prefix = f"flowkv:{{{deployment}}}:"  # the store's own key layout (redis_store.py)
            member = f"writer|{layout_id}"
            for own, other in zip(keys("p", 6), keys("q", 6), strict=True):
                where = server.hget(f"{prefix}page:{layout_id}:{other}", member)
                assert where is not None and where.startswith("@")
                server.hset(f"{prefix}page:{layout_id}:{own}", member, where)  # chat-1's page i "is" at chat-2's slot i
            with caplog.at_level("WARNING", logger="flowrt.params"):
                hit = asyncio.run(reader.match("chat-1", keys("p", 6), "turn-2"))
            assert hit.pages == 0 and reader.counters.peer_pages == 0  # nothing of chat-2's reached L1
            assert reader.statistics()["mismatched_pages"] == 6
            assert "does not hold page" in caplog.text
            with reader.read_shared("chat-1", keys("p", 6)) as shared:  # in place, no copy: refused too
                assert shared.pages == 0
            assert reader.statistics()["mismatched_pages"] == 12
            # turn 2 recomputes the pages (here: writes the right K/V) and commits them
            slots = reader.allocate(keys("p", 6), "turn-2")
            for slot, page in zip(slots, mine, strict=True):
                for chunk, stack in enumerate(reader.device.stacks):
                    stack[slot] = page[chunk]
            reader.commit("chat-1", keys("p", 6), "turn-2", start=0)
            reader.release("turn-2")
            # a fresh session on this replica finds chat-1's pages by hash: the right ones
            fresh = asyncio.run(reader.match("fresh", keys("p", 6), "fresh"))
            assert fresh.pages == 6 and set(fresh.sources) == {"device"}
            for slot, page in zip(fresh.slots, mine, strict=True):
                assert torch.equal(page_in_l1(reader, slot), page)
            reader.release("fresh")
            # and chat-2, read from the writer by another process, is untouched
            other = KVPool(
                LAYOUT,
                device_pages=8,
                host_pages=8,
                store=RedisStore.connect(url, deployment),
                deployment=deployment,
                node="other",
            )
            try:
                hit = asyncio.run(other.match("chat-2", keys("q", 6), "r"))
                assert hit.pages == 6 and set(hit.sources) == {"peer"}
                for slot, page in zip(hit.slots, theirs, strict=True):
                    assert torch.equal(page_in_l1(other, slot), page)
                assert other.statistics()["mismatched_pages"] == 0
            finally:
                other.close()
        finally:
            stop(writer)
            reader.close()
            server.close()
