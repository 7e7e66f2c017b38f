"""The tiered pool against an obviously right model, over random interleavings (hypothesis).

The model is a dict of page -> the value its K/V holds (every element of every chunk), and the
pages each reader holds. Rules commit new pages (allocate, write, commit), read prefixes (match:
promotion from L2 and L3), hold pages across other rules, end readers, run concurrent matches of
the same pages, put the tiers under pressure so pages are demoted L1 -> L2 -> L3, and rewrite a
slot of L2 or L3 behind the pool's back (another process writing another page's K/V and label
there: what a lying metadata store makes a reader find). Invariants: every page any tier holds has
its value (no stale data, whatever slot reuse happened), but the rewritten slots; a read never
gives a page another page's value, and a rewritten slot is a counted miss; a page a reader holds
stays in its L1 slot; no committed page is lost (L3 is large enough to keep every page this run
makes) but through a rewritten slot; at the end every hold is gone.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

torch = pytest.importorskip("torch", reason="the KV pool's tiers are torch tensors (the torch extra)")

from flowrt.params.layout import KVLayout  # noqa: E402
from flowrt.params.meta import EmbeddedStore  # noqa: E402
from flowrt.params.pool import KVPool  # noqa: E402

LAYOUT = KVLayout("kv", ("0",), ("k", "v"), page_tokens=2, heads=1, head_dim=2, dtype="float32")
READERS = ["r0", "r1", "r2"]


class PoolModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.directory = tempfile.TemporaryDirectory()
        self.pool = KVPool(
            LAYOUT, device_pages=5, host_pages=6, disk_pages=200, disk_dir=self.directory.name, store=EmbeddedStore("m"), node="m"
        )
        self.values = itertools.count(1)
        self.pages: dict[str, float] = {}  # page -> its value
        self.chains: dict[str, list[str]] = {}  # session -> its pages, in order
        self.held: dict[str, dict[str, int]] = {reader: {} for reader in READERS}  # reader -> page -> L1 slot
        self.rewritten: dict[tuple[str, str], int] = {}  # (page, tier) -> the slot rewritten behind the pool's back

    def spoiled(self, key: str, kind: str) -> bool:
        """Whether the pool's copy of `key` in tier `kind` (host, disk) is a rewritten slot."""
        engine = self.pool.l2 if kind == "host" else self.pool.l3
        slot = self.rewritten.get((key, kind))
        return slot is not None and engine.slot_of(key) == slot

    def lost(self, key: str) -> bool:
        """Whether the only copies of `key` the pool has are rewritten slots."""
        pool = self.pool
        if pool.l1.slot_of(key) is not None:
            return False
        return all(
            engine.slot_of(key) is None or self.spoiled(key, kind) for kind, engine in (("host", pool.l2), ("disk", pool.l3))
        )

    def teardown(self) -> None:
        for reader in READERS:
            self.pool.release(reader)
        stats = self.pool.statistics()
        for tier in stats["tiers"].values():
            assert tier["held_pages"] == 0 and tier["owners"] == 0, tier
        self.pool.close()
        self.loop.close()
        self.directory.cleanup()

    def l1_value(self, slot: int) -> set[float]:
        return {float(v) for stack in self.pool.device.stacks for v in stack[slot].flatten().tolist()}

    # ── rules ──

    @rule(session=st.sampled_from(["s0", "s1", "s2"]), count=st.integers(1, 3))
    def commit(self, session: str, count: int) -> None:
        chain = self.chains.setdefault(session, [])
        count = min(count, 5 - len(chain))  # a session's history fits L1 (5 slots) when nobody else holds any
        if count <= 0:
            return
        keys = [f"{session}-{len(chain) + i}" for i in range(count)]
        try:
            slots = self.pool.allocate(keys, "writer")
        except Exception as error:  # every slot of L1 is held by readers: allowed, nothing changes
            assert "held" in str(error), error
            self.pool.release("writer")
            return
        for key, slot in zip(keys, slots, strict=True):
            value = float(next(self.values))
            for stack in self.pool.device.stacks:
                stack[slot] = value
            self.pages[key] = value
        self.pool.commit(session, keys, "writer", start=len(chain))
        self.pool.release("writer")
        chain.extend(keys)

    @rule(session=st.sampled_from(["s0", "s1", "s2"]), reader=st.sampled_from(READERS), keep=st.booleans())
    def read(self, session: str, reader: str, keep: bool) -> None:
        chain = self.chains.get(session, [])
        try:
            hit = self.loop.run_until_complete(self.pool.match(session, chain, reader))
        except Exception as error:  # L1 full of held pages
            assert "held" in str(error), error
            return
        if not any(self.held.values()) and not any(key == page for page, _ in self.rewritten for key in chain):
            assert hit.pages == len(chain), "a committed page was lost"  # (pages other readers hold may leave L1 too little room)
        for key, slot in zip(chain[: hit.pages], hit.slots, strict=True):
            assert self.l1_value(slot) == {self.pages[key]}, f"stale data in L1 slot {slot} for {key}"
            self.held[reader][key] = slot
        if not keep:
            self.end(reader)

    @rule(reader=st.sampled_from(READERS))
    def end(self, reader: str) -> None:
        self.pool.release(reader)
        self.held[reader].clear()

    @precondition(lambda self: any(self.chains.values()))
    @rule(count=st.integers(2, 4))
    def concurrent_misses(self, count: int) -> None:
        rewritten = {page for page, _ in self.rewritten}
        session = next((s for s, chain in sorted(self.chains.items()) if chain and not rewritten & set(chain)), None)
        if session is None:
            return
        chain = self.chains[session]
        for reader in READERS:
            self.end(reader)
        missing = sum(1 for key in chain if self.pool.l1.slot_of(key) is None)
        before = self.pool.counters.promoted_pages
        self.pool.offload_bytes = 0  # copies on a thread: every match arrives while the first copies

        async def all_at_once():
            return await asyncio.gather(*(self.pool.match(session, chain, f"c{i}") for i in range(count)))

        try:
            hits = self.loop.run_until_complete(all_at_once())
        finally:
            self.pool.offload_bytes = 1 << 20
            for i in range(count):
                self.pool.release(f"c{i}")
        assert {hit.slots for hit in hits} == {hits[0].slots} and hits[0].pages == len(chain)
        assert self.pool.counters.promoted_pages - before == missing, "N concurrent misses made more than one copy"

    @precondition(lambda self: self.pool.counters.committed_pages >= 2)
    @rule(data=st.data(), kind=st.sampled_from(["host", "disk"]))
    def rewrite_a_slot(self, data: st.DataObject, kind: str) -> None:
        """Another process writes page b's K/V and label into the slot where this pool keeps page a."""
        engine, tier = (self.pool.l2, self.pool.host) if kind == "host" else (self.pool.l3, self.pool.disk)
        there = sorted(key for key in self.pages if engine.slot_of(key) is not None)
        if not there:
            return
        victim = data.draw(st.sampled_from(there))
        other = data.draw(st.sampled_from(sorted(key for key in self.pages if key != victim)))
        slot = engine.slot_of(victim)
        tier.unlabel([slot])
        for view in tier.view(None, slot):
            view.fill_(self.pages[other])
        tier.label([slot], [other])
        self.rewritten[(victim, kind)] = slot
        for reader in READERS:  # read it now, from L2 or L3: a miss counted, never `other`'s value
            self.end(reader)
        session = next(s for s, chain in self.chains.items() if victim in chain)
        chain = self.chains[session]
        first_bad = next((i for i, key in enumerate(chain) if self.used_copy_is_spoiled(key)), len(chain))
        before = self.pool.counters.mismatched_pages
        hit = self.loop.run_until_complete(self.pool.match(session, chain, "tamper-check"))
        try:
            for key, l1_slot in zip(chain[: hit.pages], hit.slots, strict=True):
                assert self.l1_value(l1_slot) == {self.pages[key]}, f"{key} read as another page's value"
            assert hit.pages <= first_bad, "a rewritten slot was used"
            if hit.pages == first_bad < len(chain):
                assert self.pool.counters.mismatched_pages > before, "a rewritten slot was not counted"
        finally:
            self.pool.release("tamper-check")

    def used_copy_is_spoiled(self, key: str) -> bool:
        """Whether `match` would read `key` from a rewritten slot (L1 first, then L2, then L3)."""
        pool = self.pool
        if pool.l1.slot_of(key) is not None:
            return False
        if pool.l2.slot_of(key) is not None:
            return self.spoiled(key, "host")
        return pool.l3.slot_of(key) is not None and self.spoiled(key, "disk")

    # ── invariants ──

    @invariant()
    def held_pages_stay_put(self) -> None:
        for pages in self.held.values():
            for key, slot in pages.items():
                assert self.pool.l1.slot_of(key) == slot, f"held page {key} moved or was evicted"

    @invariant()
    def every_tier_holds_the_right_values(self) -> None:
        pool = self.pool
        for key in self.pages:
            slot = pool.l1.slot_of(key)
            if slot is not None and not pool.l1.loading(key):
                assert self.l1_value(slot) == {self.pages[key]}, f"L1 slot {slot} of {key}"
            for kind, engine, tier in (("host", pool.l2, pool.host), ("disk", pool.l3, pool.disk)):
                slot = engine.slot_of(key)
                if slot is not None and not self.spoiled(key, kind):
                    assert set(torch.stack(tier.view(None, slot)).flatten().tolist()) == {self.pages[key]}, key

    @invariant()
    def no_page_is_lost(self) -> None:
        pool = self.pool
        for key in self.pages:
            if not any((key, kind) in self.rewritten for kind in ("host", "disk")):
                assert any(engine.slot_of(key) is not None for engine in (pool.l1, pool.l2, pool.l3)), f"{key} is gone"


PoolModel.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestPoolModel = PoolModel.TestCase
