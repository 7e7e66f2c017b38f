"""The Tmp Buffer Pool's bookkeeping (flowrt.memory.pool): the buddy allocator, refs per
holder, the LRU, find_alloc_by_ptr; then a hypothesis state machine against a simple model."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from flowrt.memory.pool import BufferPool, PoolExhausted, TooLarge, UnknownBlock

KIB = 1024
A, B = ("c1", ""), ("c2", "")
P = ("", "42")


def test_requests_round_up_to_power_of_two_blocks_that_merge_back():
    pool = BufferPool(1024 * KIB)
    first = pool.alloc(5 * KIB, A)
    assert (first.offset, first.size, first.nbytes) == (0, 8 * KIB, 5 * KIB)
    second = pool.alloc(1, A)
    assert second.size == 4 * KIB and second.offset == 8 * KIB
    pool.check()
    assert pool.free(first.id, A) and pool.free(second.id, A)
    pool.check()
    assert pool.statistics()["largest_free"] == 1024 * KIB  # coalesced into the one top-level block


def test_a_capacity_that_is_not_a_power_of_two_is_covered_by_several_roots():
    pool = BufferPool(96 * KIB + 100)  # rounded down to 96 KiB: 64 + 32
    assert pool.capacity == 96 * KIB
    big = pool.alloc(64 * KIB, A)
    small = pool.alloc(32 * KIB, A)
    assert (big.offset, small.offset) == (0, 64 * KIB)
    with pytest.raises(PoolExhausted):
        pool.alloc(4 * KIB, A)
    pool.check()


def test_too_large_and_exhausted_say_what_to_do():
    pool = BufferPool(64 * KIB)
    with pytest.raises(TooLarge, match="--pool-mb"):
        pool.alloc(65 * KIB, A)
    pool.alloc(32 * KIB, A)
    pool.alloc(4 * KIB, A)
    with pytest.raises(PoolExhausted) as caught:
        pool.alloc(32 * KIB, A)
    message = str(caught.value)
    assert "exhausted" in message and "largest free block" in message and "--pool-mb" in message


def test_a_cache_hit_borrows_the_block_without_popping_it():
    pool = BufferPool(256 * KIB)
    block = pool.alloc(10 * KIB, A)
    pool.cache(block.id, "k")
    assert pool.free(block.id, A) is False  # idle, still cached
    assert pool.statistics()["idle_cached"] == 1
    hit = pool.lookup("k", B)
    again = pool.lookup("k", P)
    assert hit is again is block and block.ref == 2
    assert "k" in pool.lru  # both borrowed it; it stays in the LRU
    assert pool.lookup("missing", B) is None
    stats = pool.statistics()
    assert (stats["lru_hits"], stats["lru_misses"]) == (2, 1)


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
    pool.check()


def test_a_call_and_a_process_release_exactly_what_they_hold():
    pool = BufferPool(256 * KIB)
    shared = pool.alloc(8 * KIB, A)
    pool.add_ref(shared.id, B)
    pool.add_ref(shared.id, P, 2)
    assert pool.release_call("c1") == 1 and shared.ref == 3
    assert pool.release_process("42") == 2 and shared.ref == 1
    assert pool.release_call("c2") == 1
    assert pool.statistics()["blocks"] == 0


def test_late_and_foreign_frees_are_ignored_and_counted():
    pool = BufferPool(256 * KIB)
    block = pool.alloc(8 * KIB, A)
    assert pool.free(block.id, B) is False  # B holds nothing on it
    assert block.ref == 1
    assert pool.free(block.id, A) is True
    assert pool.free(block.id, A) is False  # already reclaimed
    assert pool.statistics()["stale_frees"] == 2
    with pytest.raises(UnknownBlock):
        pool.add_ref(block.id, A)


def test_find_alloc_by_ptr_from_any_byte_inside_a_block():
    pool = BufferPool(256 * KIB)
    pool.alloc(4 * KIB, A)
    block = pool.alloc(16 * KIB, A)
    start, end = block.offset, block.offset + block.size
    assert pool.find_alloc_by_ptr(start) is block
    assert pool.find_alloc_by_ptr(start + 5000) is block
    assert pool.find_alloc_by_ptr(end - 1) is block
    assert pool.find_alloc_by_ptr(end) is not block
    assert pool.find_alloc_by_ptr(255 * KIB) is None


# ── the model ──

HOLDERS = [("c1", ""), ("c2", ""), ("", "p1"), ("", "p2"), ("c1", "p1")]
KEYS = ["a", "b", "c"]


class PoolMachine(RuleBasedStateMachine):
    """The pool against dicts: live blocks with their refs per holder and their key; the model
    decides nothing about placement, only what must stay live and what may be reclaimed."""

    @initialize(capacity=st.integers(16, 300).map(lambda pages: pages * 4 * KIB))
    def start(self, capacity):
        self.pool = BufferPool(capacity)
        self.refs: dict[int, dict] = {}  # block id -> {holder: n}
        self.keys: dict[str, int] = {}  # key -> block id
        self.sizes: dict[int, tuple[int, int]] = {}  # block id -> (offset, size)

    def _live(self, block_id: int) -> bool:
        return bool(self.refs.get(block_id)) or block_id in self.keys.values()

    def _settle(self, block_id: int) -> None:
        if not self._live(block_id):
            self.refs.pop(block_id, None)
            self.sizes.pop(block_id, None)

    @rule(nbytes=st.integers(1, 400 * KIB), holder=st.sampled_from(HOLDERS))
    def alloc(self, nbytes, holder):
        idle_before = {b for k, b in self.keys.items() if not self.refs.get(b)}
        try:
            block = self.pool.alloc(nbytes, holder)
        except (PoolExhausted, TooLarge):
            block = None
        evicted = idle_before - set(self.pool.live)  # (idle ones only: the invariant checks the rest)
        for key in [k for k, b in self.keys.items() if b in evicted]:
            del self.keys[key]
        for b in evicted:
            self._settle(b)
        if block is None:
            return
        assert block.size >= nbytes
        self.refs[block.id] = {holder: 1}
        self.sizes[block.id] = (block.offset, block.size)

    @precondition(lambda self: self.refs)
    @rule(data=st.data(), holder=st.sampled_from(HOLDERS), n=st.integers(1, 2))
    def add_ref(self, data, holder, n):
        block_id = data.draw(st.sampled_from(sorted(self.sizes)))
        self.pool.add_ref(block_id, holder, n)
        self.refs.setdefault(block_id, {})
        self.refs[block_id][holder] = self.refs[block_id].get(holder, 0) + n

    @precondition(lambda self: self.sizes)
    @rule(data=st.data(), holder=st.sampled_from(HOLDERS))
    def free(self, data, holder):
        block_id = data.draw(st.sampled_from(sorted(self.sizes)))
        self.pool.free(block_id, holder)
        held = self.refs.get(block_id, {})
        if held.get(holder, 0) > 1:
            held[holder] -= 1
        else:
            held.pop(holder, None)
        self._settle(block_id)

    @rule(call=st.sampled_from(["c1", "c2"]))
    def release_call(self, call):
        self.pool.release_call(call)
        for block_id in list(self.refs):
            self.refs[block_id] = {h: n for h, n in self.refs[block_id].items() if h[0] != call}
            self._settle(block_id)

    @rule(process=st.sampled_from(["p1", "p2"]))
    def release_process(self, process):
        self.pool.release_process(process)
        for block_id in list(self.refs):
            self.refs[block_id] = {h: n for h, n in self.refs[block_id].items() if h[1] != process}
            self._settle(block_id)

    @precondition(lambda self: any(self.refs.values()))
    @rule(data=st.data(), key=st.sampled_from(KEYS))
    def cache(self, data, key):
        block_id = data.draw(st.sampled_from(sorted(b for b, r in self.refs.items() if r)))
        self.pool.cache(block_id, key)
        old = self.keys.get(key)
        for other, b in list(self.keys.items()):
            if b == block_id:
                del self.keys[other]
        self.keys[key] = block_id
        if old is not None and old != block_id:
            self._settle(old)

    @rule(key=st.sampled_from(KEYS), holder=st.sampled_from(HOLDERS))
    def lookup(self, key, holder):
        block = self.pool.lookup(key, holder)
        if key not in self.keys:
            assert block is None
            return
        assert block is not None and block.id == self.keys[key]
        assert key in self.pool.lru  # borrowed, not popped
        self.refs.setdefault(block.id, {})
        self.refs[block.id][holder] = self.refs[block.id].get(holder, 0) + 1

    @rule()
    def evict(self):
        self.pool.evict()
        for key, block_id in list(self.keys.items()):
            if not self.refs.get(block_id):
                del self.keys[key]
                self._settle(block_id)

    @rule(data=st.data())
    def find_alloc_by_ptr(self, data):
        offset = data.draw(st.integers(0, self.pool.capacity - 1))
        block = self.pool.find_alloc_by_ptr(offset)
        scan = [b for b, (o, s) in self.sizes.items() if o <= offset < o + s]
        assert (block.id if block else None) == (scan[0] if scan else None)

    @invariant()
    def agrees_with_the_model(self):
        if not hasattr(self, "pool"):
            return
        self.pool.check()
        live = {b.id: {h: n for h, n in b.refs.items()} for b in self.pool.blocks()}
        assert live == {b: r for b, r in self.refs.items() if self._live(b)}  # nothing referenced was reclaimed
        assert {k: b for k, b in self.pool.lru.items()} == self.keys
        stats = self.pool.statistics()
        assert stats["bytes_allocated"] + stats["bytes_free"] == self.pool.capacity

    def teardown(self):
        if not hasattr(self, "pool"):
            return
        for holder in HOLDERS:  # everybody lets go, the cache is emptied: nothing may leak
            self.pool.release_call(holder[0]) if holder[0] else self.pool.release_process(holder[1])
        self.pool.evict()
        assert self.pool.statistics()["blocks"] == 0
        assert self.pool.statistics()["bytes_free"] == self.pool.capacity
        self.pool.check()
        roots = BufferPool(self.pool.capacity)
        assert self.pool.free_lists_snapshot() == roots.free_lists_snapshot()


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
