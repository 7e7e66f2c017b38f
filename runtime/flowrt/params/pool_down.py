"""The KV pool's way down: committed pages written through to L2, room made in L2 through the
metadata store's guarded eviction, pages demoted L1 -> L2 -> L3; every slot written below L1 is
labelled with the page it holds (tiers.MappedTier). A mixin of `KVPool` (flowrt.params.pool)."""

from __future__ import annotations

import logging
from typing import Any

from flowrt.params.meta.types import EVICTED, LAST_REPLICA
from flowrt.params.slots import SlotsExhausted, Tracker
from flowrt.params.tiers import CopyStats, copy_slots

log = logging.getLogger("flowrt.params")

EVICTOR = "pool-evict"  # the owner of the pool's own eviction holds


class Demotion:
    """Needs of its KVPool: layout, node, layout_id, store, counters, device, host, disk, l1, l2,
    l3, last_meta_error, _published, _meta, _count."""

    layout: Any
    node: str
    layout_id: str
    store: Any
    counters: Any
    device: Any
    host: Any
    disk: Any
    l1: Any
    l2: Any
    l3: Any
    last_meta_error: str | None
    _published: set[str]

    def _meta(self, operation: Any) -> Any: ...

    def _count(self, stats: CopyStats) -> None: ...

    def _write_through(self, keys: list[str]) -> bool:
        """Copy committed pages L2 lacks into L2; False when L2 has no room (they stay in L1)."""
        assert self.l2 is not None and self.host is not None
        missing = [key for key in keys if self.l2.slot_of(key) is None and self.l1.slot_of(key) is not None]
        if not missing:
            return True
        try:
            self._make_room(len(missing))
        except SlotsExhausted as error:
            self.counters.write_through_refused += len(missing)
            log.warning("%s; the pages stay in this process's device tier", error)
            return False
        host_slots = self.l2.allocate(missing)
        self._copy_labelled(self.device, [self.l1.slot_of(key) for key in missing], self.host, host_slots, missing)
        return True

    def _copy_labelled(self, src: Any, src_slots: list[int], dst: Any, dst_slots: list[int], keys: list[str]) -> None:
        """Copy pages `keys` into slots of L2 or L3, labelled (tiers.MappedTier): a reader never
        takes a slot being rewritten, or the page that was there before, for one of them."""
        dst.unlabel(dst_slots)
        self._count(copy_slots(src, src_slots, dst, dst_slots))
        dst.label(dst_slots, keys)

    def _make_room(self, wanted: int) -> None:
        """Free `wanted` L2 slots: idle pages, coldest first, that the metadata guards let go.

        A page a peer is reading (replica lock) or a running session uses (run lock) stays. The
        last copy of a live session's page (guard 3) goes down to L3 when there is one; without
        one it is dropped only when nothing else can make the room (KV is recomputable)."""
        assert self.l2 is not None
        shortfall = wanted - self.l2.free_slots.free
        kept: list[str] = []  # held in EVICT until the end, so the loop never picks them again
        last_copies: list[tuple[str, int]] = []
        while shortfall > 0:
            chosen = self.l2.evict_candidates(shortfall, EVICTOR)
            if not chosen:
                break
            verdicts = self._unpublish([key for key, _ in chosen], drop=self.l3 is not None)
            freed = []
            for key, slot in chosen:
                verdict = verdicts.get(key, EVICTED)
                if verdict == EVICTED:
                    freed.append((key, slot))
                elif verdict == LAST_REPLICA:
                    last_copies.append((key, slot))
                else:
                    self.counters.evictions_refused += 1
                    kept.append(key)
            shortfall -= self._free_host(freed)
        if shortfall > 0 and last_copies:
            verdicts = self._unpublish([key for key, _ in last_copies[:shortfall]], drop=True)
            freed = [(key, slot) for key, slot in last_copies[:shortfall] if verdicts.get(key) == EVICTED]
            shortfall -= self._free_host(freed)
        self.l2.release([key for key, _ in last_copies] + kept, EVICTOR, Tracker.EVICT)
        if shortfall > 0:
            raise SlotsExhausted(
                f"KV pool `{self.layout.name}`: the host tier has no room for {wanted} page(s): every page in it is "
                f"held, being read by another process or used by a running session"
                + (f" (and the metadata store failed: {self.last_meta_error})" if self.last_meta_error else "")
                + "; give the global more `capacity` or end sessions"
            )

    def _unpublish(self, keys: list[str], *, drop: bool) -> dict[str, str]:
        """Ask the metadata store to stop listing this node for the published ones of `keys`:
        {key: reason} for those (pages never published need nobody's leave). A store that fails
        keeps them all: their slots may be what a peer is about to read."""
        published = [key for key in keys if key in self._published]
        if not published:
            return {}
        answers = self._meta(lambda: self.store.evict(self.node, self.layout_id, published, drop=drop))
        if answers is None:
            return {key: "meta_unavailable" for key in published}
        for answer in answers:
            if answer.evicted:
                self._published.discard(answer.page)
        return {answer.page: answer.reason for answer in answers}

    def _free_host(self, pages: list[tuple[str, int]]) -> int:
        assert self.l2 is not None
        for key, slot in pages:
            self._demote_to_disk(key, slot)
        return len(self.l2.finish_evict([key for key, _ in pages], EVICTOR))

    def _demote_to_disk(self, key: str, host_slot: int) -> None:
        if self.l3 is None or self.disk is None or self.host is None or self.l3.slot_of(key) is not None:
            return
        if self.host.holds(host_slot, key) is None:  # not what L2 was told to hold (rewritten by another process)
            self.counters.mismatched_pages += 1
            return
        (disk_slot,) = self.l3.allocate([key])
        self._copy_labelled(self.host, [host_slot], self.disk, [disk_slot], [key])
        self.counters.demoted_pages += 1

    def _demote_from_l1(self, key: str, slot: int) -> None:
        """L1 drops idle page `key`: keep a copy below when no lower tier has it (before the
        slot is reused, its data is still there)."""
        if self.host is None or self.l2 is None or self.l2.slot_of(key) is not None:
            return
        if self.l3 is not None and self.l3.slot_of(key) is not None:
            return
        try:
            self._make_room(1)
        except SlotsExhausted:
            return  # nothing below can take it: the page goes (KV is a cache; it is recomputed)
        (host_slot,) = self.l2.allocate([key])
        self._copy_labelled(self.device, [slot], self.host, [host_slot], [key])
        self.counters.demoted_pages += 1
