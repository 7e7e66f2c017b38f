"""The Tmp Buffer Pool's bookkeeping (flowrt.memory.pool): the buddy allocator, refs per
holder, the LRU, find_alloc_by_ptr; then a hypothesis state machine against a model that
knows nothing of buddies, only which byte ranges are taken and by whom."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from flowrt.memory.pool import BufferPool, PoolError, PoolExhausted, TooLarge, UnknownBlock

KIB = 1024
A, B = ("c1", ""), ("c2", "")
P = ("", "42")


def test_requests_round_up_to_power_of_two_blocks_that_merge_back():
    pool = BufferPool(1024 * KIB)
    first = pool.alloc(5 * KIB, A)
    assert (first.offset, first.size, first.nbytes) == (0, 8 * KIB, 5 * KIB)
    second = pool.alloc(1, A)
    assert second.size == 4 * KIB and second.offset == 8 * KIB
    exact = pool.alloc(16 * KIB, A)
    assert exact.size == 16 * KIB and exact.offset % (16 * KIB) == 0
    assert (first.id, second.id, exact.id) == (1, 2, 3)
    pool.check()
    assert pool.statistics()["largest_free"] == 512 * KIB  # the splits left one free half of each order
    assert all(pool.free(block.id, A) for block in (first, second, exact))
    pool.check()
    assert pool.free_lists_snapshot() == [(0, 1024 * KIB)]  # coalesced into the one top-level block
    assert pool.alloc(1, A).id == 4  # ids are never reused


def test_a_capacity_that_is_not_a_power_of_two_is_covered_by_several_roots():
    pool = BufferPool(96 * KIB + 100)  # rounded down to 96 KiB: 64 + 32
    assert pool.capacity == 96 * KIB
    assert pool.free_lists_snapshot() == [(0, 64 * KIB), (64 * KIB, 32 * KIB)]
    big = pool.alloc(64 * KIB, A)
    small = pool.alloc(32 * KIB, A)
    assert (big.offset, small.offset) == (0, 64 * KIB)
    with pytest.raises(PoolExhausted):
        pool.alloc(4 * KIB, A)
    pool.check()
    pool.free(small.id, A)
    quarter = pool.alloc(16 * KIB, A)
    assert quarter.offset == 64 * KIB  # a block never spans two roots
    with pytest.raises(TooLarge):
        pool.alloc(65 * KIB, A)  # 96 KiB in all, but no block of 128


def test_bad_arguments_are_refused():
    with pytest.raises(PoolError, match="power of two"):
        BufferPool(64 * KIB, min_block=3000)
    with pytest.raises(PoolError, match="holds no block"):
        BufferPool(4095)
    pool = BufferPool(64 * KIB)
    with pytest.raises(PoolError, match="at least one byte"):
        pool.alloc(0, A)
    block = pool.alloc(1, A)
    for n in (0, -1):
        with pytest.raises(PoolError, match="at least 1"):
            pool.add_ref(block.id, A, n)
        with pytest.raises(PoolError, match="at least 1"):
            pool.free(block.id, A, n)
    assert block.refs == {A: 1}


def test_too_large_and_exhausted_say_what_to_do():
    pool = BufferPool(64 * KIB)
    with pytest.raises(TooLarge, match="--pool-mb") as caught:
        pool.alloc(65 * KIB, A)
    assert "65 KiB" in str(caught.value) and "64 KiB" in str(caught.value)  # what was asked, what fits
    pool.alloc(32 * KIB, A)
    idle = pool.alloc(4 * KIB, B)
    pool.cache(idle.id, "k")
    pool.free(idle.id, B)
    pool.alloc(3 * KIB, A)
    with pytest.raises(PoolExhausted) as caught:
        pool.alloc(20 * KIB, A)
    message = str(caught.value)
    assert message.startswith("the Tmp Buffer Pool is exhausted: 20 KiB asked, 28 KiB free")
    assert "largest free block 16 KiB" in message and "36 KiB held by blocks in use" in message
    assert message.endswith("raise the pool size (flowc run --pool-mb / FLOWRT_POOL_MB)")
    assert "k" not in pool.lru  # the idle block went, in vain


def test_a_cache_hit_borrows_the_block_without_popping_it():
    pool = BufferPool(256 * KIB)
    block = pool.alloc(10 * KIB, A)
    pool.cache(block.id, "k")
    assert pool.free(block.id, A) is False  # idle, still cached
    assert pool.statistics()["idle_cached"] == 1
    hit = pool.lookup("k", B)
    again = pool.lookup("k", P)
    assert hit is again is block and block.ref == 2
    assert list(pool.lru) == ["k"]  # both borrowed it; it stays in the LRU
    assert pool.statistics()["idle_cached"] == 0
    assert pool.lookup("missing", B) is None
    stats = pool.statistics()
    assert (stats["lru_hits"], stats["lru_misses"]) == (2, 1)
    assert pool.free(block.id, B) is False and pool.free(block.id, P) is False
    assert pool.statistics()["idle_cached"] == 1


def test_a_hit_makes_the_key_the_most_recent():
    pool = BufferPool(256 * KIB)
    for key in "abc":
        block = pool.alloc(4 * KIB, A)
        pool.cache(block.id, key)
    pool.release_call("c1")
    pool.lookup("a", B)
    pool.free(pool.lru["a"], B)
    assert list(pool.lru) == ["b", "c", "a"]
    assert pool.evict(1) == 4 * KIB and list(pool.lru) == ["c", "a"]  # the oldest, and only as many as asked


def test_an_idle_cached_block_lives_until_it_is_evicted():
    pool = BufferPool(256 * KIB)
    block = pool.alloc(8 * KIB, A)
    pool.cache(block.id, "k")
    pool.release_call("c1")
    for _ in range(3):
        pool.alloc(8 * KIB, B)  # room enough: nothing evicted
    assert pool.block(block.id) is block and pool.find_alloc_by_ptr(block.offset) is block
    assert pool.evict() == 8 * KIB
    assert pool.statistics()["evictions"] == 1 and pool.statistics()["idle_cached"] == 0
    with pytest.raises(UnknownBlock, match="not in the pool"):
        pool.block(block.id)
    assert pool.lookup("k", A) is None
    assert pool.evict() == 0


def test_allocation_evicts_idle_cached_blocks_and_never_referenced_ones():
    pool = BufferPool(64 * KIB)
    idle = pool.alloc(32 * KIB, A)
    pool.cache(idle.id, "idle")
    pool.free(idle.id, A)
    busy = pool.alloc(32 * KIB, A)
    pool.cache(busy.id, "busy")
    fresh = pool.alloc(32 * KIB, B)  # only the idle one can go
    assert fresh.offset == idle.offset and pool.statistics()["evictions"] == 1
    assert "busy" in pool.lru and busy.ref == 1
    with pytest.raises(PoolExhausted):
        pool.alloc(32 * KIB, B)
    assert pool.block(busy.id) is busy
    pool.check()


def test_caching_under_a_taken_key_replaces_the_older_block():
    pool = BufferPool(256 * KIB)
    old = pool.alloc(8 * KIB, A)
    pool.cache(old.id, "k")
    pool.free(old.id, A)
    new = pool.alloc(8 * KIB, A)
    pool.cache(new.id, "k")  # the older one was idle: reclaimed at once
    assert [b.id for b in pool.blocks()] == [new.id] and pool.lru == {"k": new.id}
    newer = pool.alloc(8 * KIB, B)
    pool.cache(newer.id, "k")  # `new` is still held by A: it only loses its key
    assert new.cache_key is None and pool.block(new.id) is new
    assert pool.free(new.id, A) is True  # and then goes like any uncached block
    pool.cache(newer.id, "other")  # a block has one key at most
    assert pool.lru == {"other": newer.id}
    pool.check()


def test_a_call_and_a_process_release_exactly_what_they_hold():
    pool = BufferPool(256 * KIB)
    shared = pool.alloc(8 * KIB, A)
    pool.add_ref(shared.id, B)
    pool.add_ref(shared.id, P, 2)
    pool.add_ref(shared.id, ("c1", "42"))
    stats = pool.statistics()
    assert stats["refs_by_call"] == {"c1": 2, "c2": 1} and stats["refs_by_process"] == {"42": 3}
    assert pool.release_call("") == 0 and pool.release_process("") == 0  # "" names nobody
    assert pool.release_call("c1") == 2 and shared.ref == 3
    assert pool.release_process("42") == 2 and shared.ref == 1
    assert pool.release_call("nobody") == 0
    assert pool.release_call("c2") == 1
    assert pool.statistics()["blocks"] == 0
    pool.check()


def test_late_and_foreign_frees_are_ignored_and_counted():
    pool = BufferPool(256 * KIB)
    block = pool.alloc(8 * KIB, A)
    pool.add_ref(block.id, B)
    assert pool.free(block.id, P) is False  # P holds nothing on it
    assert pool.free(block.id, B, 2) is False  # B held one: that one goes, the other counts as stale
    assert block.refs == {A: 1}
    assert pool.free(block.id, A) is True
    assert pool.free(block.id, A) is False  # already reclaimed
    assert pool.free(12345, A) is False  # never was
    assert pool.statistics()["stale_frees"] == 4
    with pytest.raises(UnknownBlock):
        pool.add_ref(block.id, A)


def test_find_alloc_by_ptr_from_any_byte_inside_a_block():
    pool = BufferPool(256 * KIB)
    head = pool.alloc(4 * KIB, A)
    block = pool.alloc(16 * KIB, A)
    start, end = block.offset, block.offset + block.size
    assert pool.find_alloc_by_ptr(start) is block
    assert pool.find_alloc_by_ptr(start + 5000) is block
    assert pool.find_alloc_by_ptr(end - 1) is block  # inside the power-of-two block, past what was asked
    assert pool.find_alloc_by_ptr(end) is None
    assert pool.find_alloc_by_ptr(head.offset + head.size - 1) is head
    assert pool.find_alloc_by_ptr(head.offset + head.size) is None  # the free buddy between them
    assert pool.find_alloc_by_ptr(-1) is None and pool.find_alloc_by_ptr(pool.capacity) is None


def test_statistics_keys_are_sorted():
    pool = BufferPool(256 * KIB)
    pool.alloc(1, ("z", "9"))
    pool.alloc(1, ("a", "1"))
    stats = pool.statistics()
    assert list(stats) == sorted(stats)
    assert list(stats["refs_by_call"]) == ["a", "z"] and list(stats["refs_by_process"]) == ["1", "9"]
    assert stats["bytes_requested"] == 2 and stats["bytes_allocated"] == 8 * KIB


def test_check_catches_corruption():
    pool = BufferPool(64 * KIB)
    block = pool.alloc(4 * KIB, A)
    pool.free_lists[4 * KIB].add(block.offset)  # handed out and free at once
    with pytest.raises(AssertionError, match="overlap"):
        pool.check()


# ── the model ──

HOLDERS = [("c1", ""), ("c2", ""), ("", "p1"), ("", "p2"), ("c1", "p1"), ("c2", "p2")]
KEYS = ["a", "b", "c"]


class Model:
    """Live blocks as plain byte ranges with counts per holder, and an ordered dict for the
    LRU. Where a block lands is the pool's business; the model checks what any buddy allocator
    must satisfy: aligned ranges inside one top-level block, never overlapping."""

    def __init__(self, capacity: int, min_block: int):
        self.min_block = min_block
        self.capacity = capacity - capacity % min_block
        self.roots = []
        at = 0
        while self.capacity - at >= min_block:
            size = min_block
            while size * 2 <= self.capacity - at:
                size *= 2
            self.roots.append((at, size))
            at += size
        self.blocks: dict[int, dict] = {}  # id -> {"offset", "size", "nbytes", "refs": {holder: n}}
        self.lru: OrderedDict[str, int] = OrderedDict()  # key -> id, oldest first
        self.dead: list[int] = []
        self.hits = self.misses = self.evictions = self.stale = 0

    def size_for(self, nbytes: int) -> int:
        size = self.min_block
        while size < nbytes:
            size *= 2
        return size

    def idle_keys(self) -> list[str]:
        return [key for key, b in self.lru.items() if not self.blocks[b]["refs"]]

    def settle(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if not block["refs"] and block_id not in self.lru.values():
            del self.blocks[block_id]
            self.dead.append(block_id)

    def evict_key(self, key: str) -> int:
        block_id = self.lru.pop(key)
        self.evictions += 1
        size = self.blocks[block_id]["size"]
        self.settle(block_id)
        return size

    def free_run(self, size: int, taken: list[tuple[int, int]]) -> bool:
        """Whether some `size`-aligned range of a root overlaps none of `taken`."""
        for root, root_size in self.roots:
            for start in range(root, root + root_size - size + 1, size):
                if all(o + s <= start or start + size <= o for o, s in taken):
                    return True
        return False

    def taken(self) -> list[tuple[int, int]]:
        return [(b["offset"], b["size"]) for b in self.blocks.values()]

    def largest_free(self) -> int:
        taken = self.taken()
        sizes = sorted({s for _, s in self.roots}, reverse=True)
        size = sizes[0]
        while size >= self.min_block:
            if self.free_run(size, taken):
                return size
            size //= 2
        return 0


class PoolMachine(RuleBasedStateMachine):
    @initialize(
        min_block=st.sampled_from([1024, 4096]),
        units=st.integers(16, 300),
        extra=st.integers(0, 4095),
    )
    def start(self, min_block, units, extra):
        capacity = units * min_block + extra % min_block
        self.pool = BufferPool(capacity, min_block)
        self.model = Model(capacity, min_block)
        assert self.pool.capacity == self.model.capacity
        assert self.pool.free_lists_snapshot() == self.model.roots

    def live_ids(self) -> list[int]:
        return sorted(self.model.blocks)

    @rule(data=st.data(), holder=st.sampled_from(HOLDERS))
    def alloc(self, data, holder):
        m = self.model
        nbytes = data.draw(
            st.one_of(
                st.integers(1, 4 * m.min_block),
                st.integers(1, m.capacity * 5 // 4),
                st.sampled_from([m.min_block, m.min_block + 1, m.roots[0][1], m.roots[0][1] + 1]),
            ),
            label="nbytes",
        )
        size = m.size_for(nbytes)
        idle = m.idle_keys()
        try:
            block = self.pool.alloc(nbytes, holder)
        except TooLarge:
            assert size > m.roots[0][1] and list(self.pool.lru) == list(m.lru)
            return
        except PoolExhausted:
            assert size <= m.roots[0][1]
            for key in idle:  # everything idle went first, and even so no aligned range was free
                m.evict_key(key)
            assert not m.free_run(size, m.taken())
            return
        assert size <= m.roots[0][1]
        gone = [key for key in idle if key not in self.pool.lru]
        assert gone == idle[: len(gone)], "evicted out of LRU order"
        last = m.blocks[m.lru[gone[-1]]] if gone else None
        for key in gone:
            m.evict_key(key)
        if last is not None:  # the last eviction was needed: without it nothing fitted
            assert not m.free_run(size, m.taken() + [(last["offset"], last["size"])])
        assert block.id not in m.blocks and block.id not in m.dead
        assert (block.size, block.nbytes, block.refs, block.cache_key) == (size, nbytes, {holder: 1}, None)
        root = next(r for r, s in m.roots if r <= block.offset < r + s)
        root_size = dict(m.roots)[root]
        assert (block.offset - root) % size == 0 and block.offset + size <= root + root_size
        assert all(o + s <= block.offset or block.offset + size <= o for o, s in m.taken())
        m.blocks[block.id] = {"offset": block.offset, "size": size, "nbytes": nbytes, "refs": {holder: 1}}

    @precondition(lambda self: self.model.blocks)
    @rule(data=st.data(), holder=st.sampled_from(HOLDERS), n=st.integers(1, 2))
    def add_ref(self, data, holder, n):
        block_id = data.draw(st.sampled_from(self.live_ids()), label="block")
        self.pool.add_ref(block_id, holder, n)
        refs = self.model.blocks[block_id]["refs"]
        refs[holder] = refs.get(holder, 0) + n

    @precondition(lambda self: self.model.dead)
    @rule(data=st.data())
    def add_ref_to_a_reclaimed_block(self, data):
        block_id = data.draw(st.sampled_from(self.model.dead), label="dead block")
        with pytest.raises(UnknownBlock):
            self.pool.add_ref(block_id, HOLDERS[0])

    @precondition(lambda self: self.model.blocks or self.model.dead)
    @rule(data=st.data(), holder=st.sampled_from(HOLDERS), n=st.integers(1, 2))
    def free(self, data, holder, n):
        m = self.model
        block_id = data.draw(st.sampled_from(self.live_ids() + m.dead), label="block")
        reclaimed = self.pool.free(block_id, holder, n)
        block = m.blocks.get(block_id)
        held = block["refs"].get(holder, 0) if block else 0
        if held < n:
            m.stale += 1
        if not held:
            assert reclaimed is False
            return
        if held > n:
            block["refs"][holder] = held - n
        else:
            del block["refs"][holder]
        m.settle(block_id)
        assert reclaimed is (block_id not in m.blocks)

    @rule(call=st.sampled_from(["c1", "c2", ""]))
    def release_call(self, call):
        self.release(self.pool.release_call(call), lambda holder: call and holder[0] == call)

    @rule(process=st.sampled_from(["p1", "p2", ""]))
    def release_process(self, process):
        self.release(self.pool.release_process(process), lambda holder: process and holder[1] == process)

    def release(self, dropped, matches):
        expected = 0
        for block_id in self.live_ids():
            refs = self.model.blocks[block_id]["refs"]
            for holder in [h for h in refs if matches(h)]:
                expected += refs.pop(holder)
            self.model.settle(block_id)
        assert dropped == expected

    @precondition(lambda self: self.model.blocks)
    @rule(data=st.data(), key=st.sampled_from(KEYS))
    def cache(self, data, key):
        m = self.model
        block_id = data.draw(st.sampled_from(self.live_ids()), label="block")
        self.pool.cache(block_id, key)
        old = m.lru.pop(key, None)
        for other in [k for k, b in m.lru.items() if b == block_id]:
            del m.lru[other]
        m.lru[key] = block_id
        if old is not None and old != block_id:
            m.settle(old)

    @rule(key=st.sampled_from(KEYS), holder=st.sampled_from(HOLDERS))
    def lookup(self, key, holder):
        m = self.model
        block = self.pool.lookup(key, holder)
        if key not in m.lru:
            m.misses += 1
            assert block is None
            return
        m.hits += 1
        assert block is not None and block.id == m.lru[key]
        m.lru.move_to_end(key)
        refs = m.blocks[block.id]["refs"]
        refs[holder] = refs.get(holder, 0) + 1

    @rule(needed=st.none() | st.integers(0, 64 * KIB))
    def evict(self, needed):
        m = self.model
        reclaimed = self.pool.evict(needed)
        expected = 0
        for key in m.idle_keys():
            if needed is not None and expected >= needed:
                break
            expected += m.evict_key(key)
        assert reclaimed == expected

    @rule(data=st.data())
    def find_alloc_by_ptr(self, data):
        m = self.model
        edges = [-1, m.capacity] + [e for b in m.blocks.values() for e in (b["offset"], b["offset"] + b["size"] - 1)]
        offsets = data.draw(
            st.lists(st.integers(0, m.capacity - 1) | st.sampled_from(edges), min_size=1, max_size=6),
            label="offsets",
        )
        for offset in offsets:
            found = self.pool.find_alloc_by_ptr(offset)
            scan = [i for i, b in m.blocks.items() if b["offset"] <= offset < b["offset"] + b["size"]]
            assert (found.id if found else None) == (scan[0] if scan else None), offset

    @invariant()
    def agrees_with_the_model(self):
        if not hasattr(self, "pool"):
            return
        m = self.model
        self.pool.check()
        live = {b.id: (b.offset, b.size, b.nbytes, dict(b.refs)) for b in self.pool.blocks()}
        assert live == {i: (b["offset"], b["size"], b["nbytes"], b["refs"]) for i, b in m.blocks.items()}
        assert list(self.pool.lru.items()) == list(m.lru.items())
        by_call: dict[str, int] = {}
        by_process: dict[str, int] = {}
        for b in m.blocks.values():
            for (call, process), n in b["refs"].items():
                if call:
                    by_call[call] = by_call.get(call, 0) + n
                if process:
                    by_process[process] = by_process.get(process, 0) + n
        allocated = sum(b["size"] for b in m.blocks.values())
        assert self.pool.statistics() == {
            "blocks": len(m.blocks),
            "bytes_allocated": allocated,
            "bytes_free": m.capacity - allocated,
            "bytes_requested": sum(b["nbytes"] for b in m.blocks.values()),
            "capacity": m.capacity,
            "evictions": m.evictions,
            "idle_cached": len(m.idle_keys()),
            "largest_free": m.largest_free(),
            "lru_hits": m.hits,
            "lru_misses": m.misses,
            "refs": sum(sum(b["refs"].values()) for b in m.blocks.values()),
            "refs_by_call": by_call,
            "refs_by_process": by_process,
            "stale_frees": m.stale,
        }

    def teardown(self):
        if not hasattr(self, "pool"):
            return
        for call in ("c1", "c2"):  # everybody lets go, the cache is emptied: nothing may leak
            self.pool.release_call(call)
        for process in ("p1", "p2"):
            self.pool.release_process(process)
        self.pool.evict()
        assert self.pool.statistics()["blocks"] == 0
        assert self.pool.statistics()["bytes_free"] == self.pool.capacity
        self.pool.check()
        assert self.pool.free_lists_snapshot() == self.model.roots  # merged back into the top-level blocks


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
