"""The tiered pool of one process (flowrt.params.pool): commit, write-through, match across
tiers, promotion into L1 in few copies, demotion down the tiers, guarded L2 eviction."""

from __future__ import annotations

import asyncio
import functools

import pytest

torch = pytest.importorskip("torch", reason="the KV pool's tiers are torch tensors (the torch extra)")

from flowrt.params.layout import KVLayout  # noqa: E402
from flowrt.params.meta import EmbeddedStore  # noqa: E402
from flowrt.params.pool import KVPool  # noqa: E402
from flowrt.params.slots import SlotsExhausted  # noqa: E402

LAYOUT = KVLayout("kv", ("0", "1"), ("k", "v"), page_tokens=4, heads=2, head_dim=3, dtype="float32")


def sync(test):
    """Run an async test body on a fresh event loop (the pool is single-loop, like its engines)."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


def keys(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i:04d}" for i in range(n)]


def fill(pool: KVPool, slots: list[int], seed: int) -> dict[int, torch.Tensor]:
    """Write distinct values into every chunk of L1 `slots`; returns each slot's page as written."""
    written = {}
    for i, slot in enumerate(slots):
        for chunk, stack in enumerate(pool.device.stacks):
            stack[slot] = torch.full(LAYOUT.item_shape, float(seed * 1000 + i * 10 + chunk))
        written[slot] = torch.stack([stack[slot].clone() for stack in pool.device.stacks])
    return written


def page_in_l1(pool: KVPool, slot: int) -> torch.Tensor:
    return torch.stack([stack[slot] for stack in pool.device.stacks])


def write(pool: KVPool, session: str, names: list[str], seed: int, start: int | None = None) -> list[torch.Tensor]:
    slots = pool.allocate(names, "writer")
    pages = fill(pool, slots, seed)
    assert pool.commit(session, names, "writer", start)
    pool.release("writer")
    return [pages[slot] for slot in slots]


@pytest.fixture
def pool(tmp_path):
    pools = []

    def make(device=8, host=16, disk=0, store=None, node="n1"):
        made = KVPool(
            LAYOUT,
            device_pages=device,
            host_pages=host,
            disk_pages=disk,
            disk_dir=tmp_path,
            store=store or EmbeddedStore("t"),
            deployment="t",
            node=node,
        )
        pools.append(made)
        return made

    yield make
    for made in pools:
        made.close()


def test_commit_writes_through_to_l2_and_publishes_with_slots(pool):
    kv = pool()
    pages = write(kv, "s1", keys("a", 5), seed=1)
    assert kv.statistics()["published"] == 5
    match = kv.store.match("s1", kv.layout_id, keys("a", 5))
    assert match.length == 5
    for i, key in enumerate(keys("a", 5)):
        host_slot = kv.l2.slot_of(key)
        assert match.segments[0].slots[0][i] == host_slot
        assert torch.equal(torch.stack(kv.host.view(None, host_slot)), pages[i])
    assert kv.counters.copy_segments == 1  # five fresh pages, one run on each side: one copy


@sync
async def test_match_promotes_from_l2_in_one_copy_per_run(pool):
    kv = pool(device=6, host=16)
    pages = write(kv, "s1", keys("a", 6), seed=2)
    write(kv, "s2", keys("b", 6), seed=3)  # pushes session 1's pages out of L1 (still in L2)
    assert not any(kv.l1.slot_of(key) is not None for key in keys("a", 6))
    before = kv.counters.copy_segments
    hit = await kv.match("s1", keys("a", 6) + ["zzz"], "reader")
    assert hit.pages == 6 and hit.sources == ("host",) * 6
    assert kv.counters.copy_segments - before == 1
    for slot, page in zip(hit.slots, pages, strict=True):
        assert torch.equal(page_in_l1(kv, slot), page)
    assert all("reader" in kv.l1.trackers(key).active_requests for key in keys("a", 6))
    kv.release("reader")
    assert kv.l1.statistics()["held_pages"] == 0


@sync
async def test_concurrent_matches_of_the_same_pages_copy_them_once(pool):
    kv = pool(device=6, host=16)
    kv.offload_bytes = 0  # copy on a worker thread: the other matches arrive while it runs
    write(kv, "s1", keys("a", 4), seed=4)
    write(kv, "s2", keys("b", 6), seed=5)
    before = kv.counters.promoted_pages
    hits = await asyncio.gather(*(kv.match("s1", keys("a", 4), f"r{i}") for i in range(5)))
    assert {hit.slots for hit in hits} == {hits[0].slots}
    assert kv.counters.promoted_pages - before == 4
    assert kv.l1.counters.dedup_joins >= 4


@sync
async def test_l1_eviction_demotes_what_l2_lacks_and_l2_eviction_spills_to_disk(pool):
    kv = pool(device=4, host=4, disk=16)
    pages = write(kv, "s1", keys("a", 4), seed=6)
    write(kv, "s2", keys("b", 4), seed=7)  # L2 full: session 1's pages go down to L3 (unguarded: no run lock)
    assert all(kv.l3.slot_of(key) is not None for key in keys("a", 4))
    hit = await kv.match("s1", keys("a", 4), "reader")
    assert hit.pages == 4 and set(hit.sources) == {"disk"}
    for slot, page in zip(hit.slots, pages, strict=True):
        assert torch.equal(page_in_l1(kv, slot), page)


@sync
async def test_a_run_lock_keeps_a_sessions_pages_in_l2(pool):
    kv = pool(device=4, host=4)
    write(kv, "s1", keys("a", 4), seed=8)
    kv.store.lock_run("s1", "turn", 60)
    slots = kv.allocate(keys("b", 4), "w")
    fill(kv, slots, seed=9)
    assert kv.commit("s2", keys("b", 4), "w") is False  # L2 has no room: they stay in L1, readable
    kv.release("w")
    assert kv.counters.evictions_refused >= 4 and kv.counters.write_through_refused == 4
    assert all(kv.l2.slot_of(key) is not None for key in keys("a", 4))
    assert all(kv.committed(key) and kv.l2.slot_of(key) is None for key in keys("b", 4))
    kv.l1.remove(keys("b", 4))
    kv.store.unlock_run("s1", "turn")
    write(kv, "s2", keys("b", 4), seed=9)
    assert kv.l2.slot_of("b0000") is not None


@sync
async def test_a_page_made_by_another_request_is_shared_not_rewritten(pool):
    kv = pool()
    write(kv, "s1", keys("a", 3), seed=10)
    slots = kv.allocate(keys("a", 4), "second")
    assert [kv.fresh(key, "second") for key in keys("a", 4)] == [False, False, False, True]
    fill(kv, slots[3:], seed=11)
    kv.commit("s2", keys("a", 4), "second")
    assert kv.counters.committed_pages == 4  # three from s1, one new
    kv.release("second")
    assert kv.l1.statistics()["held_pages"] == 0


def test_close_removes_the_tier_files_and_leaves_the_store(pool, tmp_path):
    kv = pool(disk=4)
    path, disk = kv.host.path, kv.disk.path
    write(kv, "s1", keys("a", 2), seed=12)
    assert kv.store.node_alive("n1") and disk.exists()
    kv.close()
    assert not path.exists() and not disk.exists()  # (L3 pages are this node's alone: nobody reopens them)
    assert not kv.store.node_alive("n1")


@sync
async def test_a_page_allocated_and_never_committed_is_never_read(pool):
    kv = pool()
    kv.allocate(keys("a", 2), "writer")  # its request fails before writing anything
    assert (await kv.match("s", keys("a", 2), "reader")).pages == 0  # not readable while being written
    kv.release("writer")
    assert kv.l1.slot_of("a0000") is None and kv.l1.statistics()["free"] == 8  # dropped, not cached
    assert (await kv.match("s", keys("a", 2), "reader")).pages == 0


def test_two_requests_writing_one_page_never_share_unwritten_data(pool):
    kv = pool()
    (first,) = kv.allocate(["p"], "A")
    (second,) = kv.allocate(["p"], "B")
    assert first != second and kv.fresh("p", "A") and kv.fresh("p", "B")  # B writes a private copy
    fill(kv, [second], seed=5)
    kv.commit("s2", ["p"], "B")  # A is still writing p: B's copy stays B's
    assert not kv.committed("p") and kv.l2.slot_of("p") is None
    written = fill(kv, [first], seed=7)[first]
    kv.commit("s1", ["p"], "A")
    assert torch.equal(torch.stack(kv.host.view(None, kv.l2.slot_of("p"))), written)
    kv.release("A")
    kv.release("B")
    (slot,) = kv.allocate(["q"], "C")
    (other,) = kv.allocate(["q"], "D")
    copy = fill(kv, [other], seed=9)[other]
    kv.release("C")  # C gives up: D's copy becomes the page
    kv.commit("s3", ["q"], "D")
    assert kv.committed("q") and torch.equal(page_in_l1(kv, kv.l1.slot_of("q")), copy)
    kv.release("D")
    assert kv.l1.statistics()["held_pages"] == 0


def test_a_private_copy_another_request_committed_first_stays_its_writers_until_it_releases(pool):
    # B wrote p into a private slot while A wrote p; A committed first, so A's slot is the page. B's
    # context still reads its own slot: until B releases, no allocation (B's next pages, its scratch,
    # anybody's) may be given that slot (a generation once read the same slot twice in one context)
    kv = pool(device=4, host=8)
    (first,) = kv.allocate(["p"], "A")
    (second,) = kv.allocate(["p"], "B")
    copy = fill(kv, [second], seed=3)[second]
    fill(kv, [first], seed=3)
    assert kv.commit("s1", ["p"], "A") and kv.commit("s2", ["p"], "B")
    assert kv.l1.slot_of("p") == first
    later = kv.allocate(["q", "r"], "B")  # every other slot of the device tier
    assert second not in later and first not in later
    with pytest.raises(SlotsExhausted):
        kv.l1.allocate(["x"], writer="C")  # (B's copy is held, not idle: nothing to evict for C)
    assert torch.equal(page_in_l1(kv, second), copy)  # B's context reads what B wrote
    kv.release("A")
    kv.release("B")
    assert kv.l1.statistics()["held_pages"] == 0
    assert kv.l1.key_at(second) is None  # the copy went with B's holds
    assert kv.committed("p") and kv.l1.slot_of("p") == first


def test_commit_of_pages_nobody_allocated_is_refused(pool):
    kv = pool()
    with pytest.raises(Exception, match="did not allocate"):
        kv.commit("s", ["never"], "writer")


def test_a_commit_when_a_heartbeat_is_due_publishes_once(tmp_path):
    now = [0.0]
    kv = KVPool(LAYOUT, device_pages=8, host_pages=8, store=EmbeddedStore("t"), deployment="t", node="n", clock=lambda: now[0])
    try:
        write(kv, "s", keys("a", 1), seed=1)
        now[0] += kv.node_ttl  # the next call renews the node (and publishes what waits) first
        write(kv, "s", keys("b", 1), seed=2)
        assert kv.store.chain(kv.layout_id, "s") == ["a0000", "b0000"]
    finally:
        kv.close()


def test_a_view_of_one_layer_named_alone_is_that_layer(pool):
    kv = pool()
    stacks = [kv.device.stack("1", "k"), kv.device.stack("1", "v")]
    views = kv.device.view("1", 3)  # not the layers "1" and then ... of the string's characters
    assert [v.data_ptr() for v in views] == [s[3].data_ptr() for s in stacks]
    with pytest.raises(Exception, match="whole number"):
        kv.device.view(None, True)


def test_allocating_resident_and_new_pages_at_once_never_evicts_the_resident_ones():
    pool = KVPool(LAYOUT, device_pages=2, store=EmbeddedStore("t"), deployment="t", node="n")
    try:
        slots = pool.allocate(["a", "b"], "w")
        fill(pool, slots, seed=1)
        pool.commit("s", ["a", "b"], "w")
        pool.release("w")  # a and b resident and idle: the only pages L1 can give up
        kept = page_in_l1(pool, pool.l1.slot_of("a")).clone()
        a, c = pool.allocate(["a", "c"], "r")  # room for c comes from b, never from a (which r reads)
        assert pool.committed("a") and not pool.committed("b") and torch.equal(page_in_l1(pool, a), kept)
        assert pool.fresh("c", "r") and not pool.fresh("a", "r") and a != c
        pool.release("r")
        pool.allocate(["a"], "q")  # q reads a; then asks for a with two new pages: one slot too few
        with pytest.raises(SlotsExhausted):
            pool.allocate(["a", "d", "e"], "q")
        assert pool.l1.trackers("a").active_requests == {"q"}  # q's earlier hold on a stays
        pool.release("q")
        with pytest.raises(SlotsExhausted):
            pool.allocate(["a", "d", "e"], "p")
        assert pool.l1.trackers("a").idle()  # a failed call leaves no hold of its own behind
    finally:
        pool.close()
