"""The slot engine of one tier of the Global Params Pool: which page lives in which slot, who holds
it, and which idle page goes when room is needed (shared/DESIGN.md §6, Omni-Flow §4.1.2).

It is pure bookkeeping: it holds no page data. The tier (`tiers`) owns the storage and copies; the
engine tells it which slot to use and when a slot may be reused.

- **Mapping**: a page key (its chained hash) -> one slot of `slots`. A slot is free, loading (a
  readback is filling it: `lookup` does not see it yet) or resident.
- **Trackers**: each resident slot has four `set[str]` of owners: active requests (readers), write
  tasks, eviction tasks and readback tasks. Acquiring adds the owner, releasing discards it, so
  releasing twice, or releasing what was never acquired, changes nothing: no negative counts, no
  leaks. A slot with any live tracker is never evicted nor reused; `release_owner` drops every hold
  of a request that ended.
- **Eviction**: idle pages (no tracker) sit in the four-level frequency-aware LRU (`lru`), fed by the
  TinyLFU sketch (`sketch`); room is always made from the coldest level first. `evict_candidates`
  hands pages to the layer above with the eviction tracker taken (it writes them down a tier, then
  calls `finish_evict`); `allocate` and `evict` drop idle pages at once, reporting each to
  `on_evict`.
- **Contiguous runs** (FlowKV): free slots are kept as runs of consecutive slots (merged on free);
  `allocate(keys)` takes one run of n slots when one exists (the smallest that fits), else the fewest
  runs, so that a transfer of n pages is a few segment copies, not n page copies.
- **In-flight deduplication** (`fetch`): concurrent misses on one page make one `load`; the first
  requester owns it (its slot holds the readback tracker), the others await the same outcome.
- **Copy-on-write** (`write`): writing into a page other requests hold moves the writer to a copy.

Single-threaded: call it from one event loop (every method but `fetch` is synchronous and atomic).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

from flowrt.params.lru import FrequencyLRU
from flowrt.params.sketch import FrequencySketch
from flowrt.params.slots_runs import FreeRuns
from flowrt.params.slots_types import (
    PageLoadAbandoned,
    SlotCounters,
    SlotError,
    SlotsExhausted,
    SlotTrackers,
    Tracker,
    WriteTarget,
    _InFlight,
)

__all__ = [
    "PageLoadAbandoned",
    "SlotCounters",
    "SlotEngine",
    "SlotError",
    "SlotTrackers",
    "SlotsExhausted",
    "Tracker",
    "WriteTarget",
]


class SlotEngine:
    """The slots of one tier (see the module docstring)."""

    def __init__(
        self,
        slots: int,
        *,
        name: str = "device",
        sketch: FrequencySketch | None = None,
        on_evict: Callable[[str, int], None] | None = None,
    ) -> None:
        if not isinstance(slots, int) or slots < 1:
            raise SlotError(f"tier `{name}`: a slot engine needs a whole number of slots >= 1, not {slots!r}")
        self.name = name
        self.slots = slots
        self.sketch = sketch if sketch is not None else FrequencySketch(slots)
        self.idle_pages = FrequencyLRU(self.sketch, slots)
        self.on_evict = on_evict
        self.counters = SlotCounters()
        self._slot_of: dict[str, int] = {}
        self._key_of: dict[int, str] = {}
        self._trackers: dict[int, SlotTrackers] = {}  # only slots with at least one hold
        self._held_by: dict[str, set[int]] = {}  # owner -> slots it holds in any tracker
        self.free_slots = FreeRuns(slots)
        self._in_flight: dict[str, _InFlight] = {}  # key -> the load filling it

    # ── looking pages up ──

    def __len__(self) -> int:
        """How many pages are resident (loading ones included)."""
        return len(self._slot_of)

    def __contains__(self, key: str) -> bool:
        return key in self._slot_of and not self.loading(key)

    def lookup(self, key: str) -> int | None:
        """The slot of resident page `key`, or None (absent, or still loading: `fetch` joins that);
        counts a hit or a miss. It holds nothing: take a tracker (`reading`) before using the slot
        across an await."""
        slot = self._slot_of.get(key)
        if slot is None:
            self.counters.misses += 1
            return None
        if self.loading(key):
            return None
        self.counters.hits += 1
        return slot

    def slot_of(self, key: str) -> int | None:
        """The slot of page `key` (resident or loading), or None; counts nothing."""
        return self._slot_of.get(key)

    def key_at(self, slot: int) -> str | None:
        return self._key_of.get(slot)

    def loading(self, key: str) -> bool:
        """Whether a readback is filling `key`'s slot right now."""
        return key in self._in_flight

    def trackers(self, key: str) -> SlotTrackers:
        """A copy of the holds on resident page `key`."""
        held = self._trackers.get(self._slot_or_raise(key))
        if held is None:
            return SlotTrackers()
        return SlotTrackers(*(set(held.of(kind)) for kind in Tracker))

    def touch(self, key: str) -> None:
        """Record one access of `key` (resident or not): the sketch counts it and an idle page moves
        to the recent end of its level."""
        self.sketch.increment(key)
        if key in self.idle_pages:
            self.idle_pages.put(key)

    # ── holding pages ──

    def acquire(self, kind: Tracker, keys: Iterable[str], owner: str) -> list[int]:
        """Add `owner` to tracker `kind` of every page of `keys`; returns their slots. A page that
        is loading can only be held by its readback (readers `await fetch`)."""
        keys = list(keys)
        slots = [self._slot_or_raise(key) for key in keys]
        if kind is not Tracker.READBACK:
            for key in keys:
                if self.loading(key):
                    raise SlotError(f"tier `{self.name}`: page {key} is still loading; `await fetch(...)` it first")
        for slot in slots:
            self._hold(slot, kind, owner)
        return slots

    def release(self, keys: Iterable[str], owner: str, kind: Tracker = Tracker.ACTIVE) -> None:
        """Discard `owner` from tracker `kind` of `keys`; idempotent, and harmless for pages that
        `owner` never held or that are gone."""
        for key in keys:
            slot = self._slot_of.get(key)
            if slot is not None:
                self._unhold(slot, kind, owner)

    def release_owner(self, owner: str) -> int:
        """Drop every hold of `owner` (a request that ended, a task that died); returns how many
        slots it held."""
        slots = self._held_by.pop(owner, set())
        for slot in slots:
            held = self._trackers.get(slot)
            if held is not None:
                for kind in Tracker:
                    held.of(kind).discard(owner)
                self._settle(slot)
        return len(slots)

    @contextmanager
    def holding(self, kind: Tracker, keys: Sequence[str], owner: str) -> Iterator[list[int]]:
        """Hold `keys` in tracker `kind` for the block; yields their slots."""
        slots = self.acquire(kind, keys, owner)
        try:
            yield slots
        finally:
            self.release(keys, owner, kind)

    @contextmanager
    def reading(self, keys: Sequence[str], request_id: str) -> Iterator[list[int]]:
        """Hold resident `keys` as active request `request_id` for the block (each read counts as
        an access); yields their slots."""
        slots = self.acquire(Tracker.ACTIVE, keys, request_id)
        for key in keys:
            self.touch(key)
        try:
            yield slots
        finally:
            self.release(keys, request_id, Tracker.ACTIVE)

    def writing(self, keys: Sequence[str], task_id: str):
        """Hold `keys` as write task `task_id` for the block (a context manager)."""
        return self.holding(Tracker.WRITE, keys, task_id)

    # ── allocating ──

    def allocate(self, keys: Sequence[str], writer: str | None = None) -> list[int]:
        """Slots for new pages `keys` (one access each), evicting idle pages, coldest first, when
        the free slots do not suffice. With `writer`, the new pages are held in its write tracker
        (release it, or `finish_write`, once written); without, they are idle at once."""
        keys = list(keys)
        self._check_new(keys)
        slots = self._take_slots(keys)
        for key, slot in zip(keys, slots, strict=True):
            self.sketch.increment(key)
            if writer is not None:
                self._hold(slot, Tracker.WRITE, writer)
            else:
                self.idle_pages.put(key)
        return slots

    def remove(self, keys: Iterable[str]) -> None:
        """Drop idle pages `keys` now (their data is gone or obsolete); a held page is an error."""
        keys = list(keys)
        for key in keys:
            slot = self._slot_or_raise(key)
            if key in self._in_flight:
                raise SlotError(f"tier `{self.name}`: page {key} is loading; it can be removed once its fetch ends")
            if slot in self._trackers:
                raise SlotError(f"tier `{self.name}`: page {key} is held ({self._describe(slot)}); release it first")
        for key in keys:
            self._drop(key)

    def _check_new(self, keys: list[str]) -> None:
        if len(set(keys)) != len(keys):
            raise SlotError(f"tier `{self.name}`: allocate() got the same page twice in {keys}")
        present = [key for key in keys if key in self._slot_of]
        if present:
            raise SlotError(f"tier `{self.name}`: pages {present} already have slots; look them up instead")

    def _take_slots(self, keys: list[str]) -> list[int]:
        """Map `keys` to free slots (evicting idle pages first if needed); holds nothing."""
        wanted = len(keys)
        shortfall = wanted - self.free_slots.free
        if shortfall > 0:
            if shortfall > len(self.idle_pages):
                raise self._exhausted(wanted)
            for _ in range(shortfall):
                self._evict_one()
        slots = self.free_slots.take(wanted)
        for key, slot in zip(keys, slots, strict=True):
            self._slot_of[key] = slot
            self._key_of[slot] = key
        return slots

    def _exhausted(self, wanted: int) -> SlotsExhausted:
        held = len(self._trackers)
        return SlotsExhausted(
            f"tier `{self.name}`: {wanted} new page(s) asked, but only {self.free_slots.free} slot(s) are free and "
            f"{len(self.idle_pages)} idle page(s) evictable of {self.slots}; the other {held} are held by "
            f"requests or transfers in flight. Release pages (end requests, `release_owner`), demote pages "
            f"to a lower tier, or give the tier more capacity"
        )

    # ── loading pages: in-flight deduplication ──

    async def fetch(self, key: str, load: Callable[[str, int], Awaitable[object]], owner: str) -> int:
        """The slot of page `key`, held as active request `owner`, loading it first on a miss.

        On a miss the first requester owns the load: a slot is allocated for `key` (held in its
        readback tracker, invisible to `lookup`) and `await load(key, slot)` fills it (the tier
        copies it up from a lower tier or a remote node). Requesters arriving meanwhile await the
        same load: exactly one load per page at a time. If `load` raises, every waiter gets the
        error and the slot is freed, nothing half-made left behind."""
        self.sketch.increment(key)
        slot = self._slot_of.get(key)
        if slot is not None and not self.loading(key):
            self.counters.hits += 1
            self._hold(slot, Tracker.ACTIVE, owner)
            return slot
        in_flight = self._in_flight.get(key)
        if in_flight is not None:
            return await self._join(key, in_flight, owner)
        self.counters.misses += 1
        (slot,) = self._take_slots([key])
        self._hold(slot, Tracker.READBACK, owner)
        in_flight = self._in_flight[key] = _InFlight(asyncio.get_running_loop().create_future())
        # the outcome may have no waiter at all: mark its exception as seen so asyncio does not log it
        in_flight.outcome.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            await load(key, slot)
        except BaseException as error:
            del self._in_flight[key]
            self.counters.loads_failed += 1
            self._discard_holds(slot)  # only readbacks can hold a loading page
            self._drop(key)
            if not isinstance(error, Exception):  # cancelled: the joiners get an error of their own
                error = PageLoadAbandoned(f"tier `{self.name}`: the load of page {key} was cancelled")
            in_flight.outcome.set_exception(error)
            raise
        del self._in_flight[key]
        for requester in (owner, *in_flight.joined):  # held before the readback goes: never idle between
            self._hold(slot, Tracker.ACTIVE, requester)
        self._unhold(slot, Tracker.READBACK, owner)
        in_flight.outcome.set_result(slot)
        return slot

    async def _join(self, key: str, in_flight: _InFlight, owner: str) -> int:
        self.counters.dedup_joins += 1
        in_flight.joined.add(owner)
        try:
            # shielded: one joiner cancelled must not cancel the outcome the others await
            return await asyncio.shield(in_flight.outcome)
        except asyncio.CancelledError:
            in_flight.joined.discard(owner)
            outcome = in_flight.outcome
            if outcome.done() and not outcome.cancelled() and outcome.exception() is None:
                self.release([key], owner)  # it was ready and held for us: give the hold back
            raise

    async def fetch_many(
        self, keys: Sequence[str], load_many: Callable[[list[str], list[int]], Awaitable[object]], owner: str
    ) -> list[int]:
        """`fetch` for several pages at once: the slots of `keys`, all held as active request
        `owner`. The misses nobody is loading are given slots together (one run when one is
        free) and filled by ONE `await load_many(missed_keys, their_slots)`, so a transfer of n
        pages is a few segment copies; pages another request is loading are joined, as `fetch`
        joins them. On any failure nothing stays held for `owner` and the error is raised."""
        keys = list(keys)
        if len(set(keys)) != len(keys):
            raise SlotError(f"tier `{self.name}`: fetch_many() got the same page twice")
        joins: list[tuple[str, _InFlight]] = []
        missed: list[str] = []
        for key in keys:
            self.sketch.increment(key)
            slot = self._slot_of.get(key)
            in_flight = self._in_flight.get(key)
            if slot is not None and in_flight is None:
                self.counters.hits += 1
                self._hold(slot, Tracker.ACTIVE, owner)
            elif in_flight is not None:
                joins.append((key, in_flight))
            else:
                missed.append(key)
        try:
            if missed:
                await self._load_together(missed, load_many, owner)
            for key, in_flight in joins:
                await self._join(key, in_flight, owner)
        except BaseException:
            self.release(keys, owner)
            raise
        return [self._slot_of[key] for key in keys]

    async def _load_together(
        self, keys: list[str], load_many: Callable[[list[str], list[int]], Awaitable[object]], owner: str
    ) -> None:
        self.counters.misses += len(keys)
        slots = self._take_slots(keys)
        loop = asyncio.get_running_loop()
        flights = []
        for key, slot in zip(keys, slots, strict=True):
            self._hold(slot, Tracker.READBACK, owner)
            in_flight = self._in_flight[key] = _InFlight(loop.create_future())
            in_flight.outcome.add_done_callback(lambda done: done.cancelled() or done.exception())
            flights.append(in_flight)
        try:
            await load_many(keys, slots)
        except BaseException as error:
            if not isinstance(error, Exception):
                error = PageLoadAbandoned(f"tier `{self.name}`: the load of {len(keys)} page(s) was cancelled")
            for key, slot, in_flight in zip(keys, slots, flights, strict=True):
                del self._in_flight[key]
                self._discard_holds(slot)
                self._drop(key)
                in_flight.outcome.set_exception(error)
            self.counters.loads_failed += len(keys)
            raise
        for key, slot, in_flight in zip(keys, slots, flights, strict=True):
            del self._in_flight[key]
            for requester in (owner, *in_flight.joined):
                self._hold(slot, Tracker.ACTIVE, requester)
            self._unhold(slot, Tracker.READBACK, owner)
            in_flight.outcome.set_result(slot)

    def loads_in_flight(self) -> list[str]:
        return list(self._in_flight)

    # ── writing: copy-on-write ──

    def write(self, key: str, writer: str, new_key: str | None = None) -> WriteTarget:
        """Prepare `writer` to write into page `key`; the page's new content is page `new_key`
        (its new chained hash; default: the same key). Returns where to write, held in `writer`'s
        write tracker until `finish_write`.

        When anybody else holds the page (another active request, another writer, an eviction
        copying it down) the write is **copy-on-write**: a new slot is allocated for `new_key`
        (which must then differ from `key`), the writer's active hold moves to it, and the caller
        copies `copy_from` into it before writing; the others keep the old page unchanged.
        Otherwise the page is written in place (and renamed to `new_key`)."""
        new_key = key if new_key is None else new_key
        slot = self._slot_or_raise(key)
        if self.loading(key):
            raise SlotError(f"tier `{self.name}`: page {key} is still loading; `await fetch(...)` it before writing")
        if new_key != key and new_key in self._slot_of:
            raise SlotError(f"tier `{self.name}`: page {new_key} already exists; write to it as a page of its own")
        held = self._trackers.get(slot, SlotTrackers())
        others = (held.active_requests | held.write_tasks) - {writer} | held.eviction_tasks
        if not others:
            if new_key != key:
                self._rename(key, new_key, slot)
            self._hold(slot, Tracker.WRITE, writer)
            return WriteTarget(new_key, slot)
        if new_key == key:
            raise SlotError(
                f"tier `{self.name}`: page {key} is shared ({self._describe(slot)}), so writing makes a copy, "
                f"which needs a key of its own: pass new_key (the hash of the new content)"
            )
        (copy,) = self._take_slots([new_key])  # never `slot`: it is held
        self.sketch.increment(new_key)
        self._hold(copy, Tracker.WRITE, writer)
        if writer in held.active_requests:
            self._hold(copy, Tracker.ACTIVE, writer)
            self._unhold(slot, Tracker.ACTIVE, writer)
        self.counters.copies_on_write += 1
        return WriteTarget(new_key, copy, copy_from=slot)

    def finish_write(self, key: str, writer: str) -> None:
        """The write into `key` is done (its data is valid): release `writer`'s write hold."""
        self.release([key], writer, Tracker.WRITE)

    def _rename(self, key: str, new_key: str, slot: int) -> None:
        was_idle = self.idle_pages.remove(key)
        del self._slot_of[key]
        self._slot_of[new_key] = slot
        self._key_of[slot] = new_key
        if was_idle:
            self.idle_pages.put(new_key)

    # ── evicting ──

    def evict(self, count: int) -> list[tuple[str, int]]:
        """Drop up to `count` idle pages now, coldest first; returns them as (key, slot)."""
        evicted = []
        while len(evicted) < count and len(self.idle_pages):
            evicted.append(self._evict_one())
        return evicted

    def evict_candidates(self, count: int, owner: str) -> list[tuple[str, int]]:
        """Up to `count` idle pages, coldest first, now held in tracker EVICT by `owner`: the caller
        copies them down a tier, then calls `finish_evict` (or `release(..., Tracker.EVICT)` to
        keep them)."""
        chosen = []
        while len(chosen) < count:
            key = self.idle_pages.pop_coldest()
            if key is None:
                break
            slot = self._slot_of[key]
            self._hold(slot, Tracker.EVICT, owner)
            chosen.append((key, slot))
        return chosen

    def finish_evict(self, keys: Iterable[str], owner: str) -> list[str]:
        """Release `owner`'s eviction hold on `keys` and drop those left idle; a page somebody took
        meanwhile (a reader) stays. Returns the keys dropped."""
        dropped = []
        for key in keys:
            slot = self._slot_of.get(key)
            if slot is None:
                continue
            held = self._trackers.get(slot)
            if held is None or owner not in held.eviction_tasks:
                continue
            held.eviction_tasks.discard(owner)
            self._forget_hold(slot, owner)
            if held.idle():
                del self._trackers[slot]
                self._drop(key)
                self.counters.evictions += 1
                dropped.append(key)
        return dropped

    def _evict_one(self) -> tuple[str, int]:
        key = self.idle_pages.pop_coldest()
        assert key is not None, "callers check that an idle page exists"
        slot = self._slot_of[key]
        self._drop(key)
        self.counters.evictions += 1
        if self.on_evict is not None:
            self.on_evict(key, slot)
        return key, slot

    def _drop(self, key: str) -> None:
        slot = self._slot_of.pop(key)
        del self._key_of[slot]
        self.idle_pages.remove(key)
        self.free_slots.give(slot)

    # ── trackers ──

    def _hold(self, slot: int, kind: Tracker, owner: str) -> None:
        held = self._trackers.get(slot)
        if held is None:
            held = self._trackers[slot] = SlotTrackers()
            self.idle_pages.remove(self._key_of[slot])  # pinned: no longer an eviction candidate
        held.of(kind).add(owner)
        self._held_by.setdefault(owner, set()).add(slot)

    def _unhold(self, slot: int, kind: Tracker, owner: str) -> None:
        held = self._trackers.get(slot)
        if held is None:
            return
        held.of(kind).discard(owner)
        self._forget_hold(slot, owner)
        self._settle(slot)

    def _forget_hold(self, slot: int, owner: str) -> None:
        held = self._trackers.get(slot)
        if held is not None and held.holds(owner):
            return
        slots = self._held_by.get(owner)
        if slots is not None:
            slots.discard(slot)
            if not slots:
                del self._held_by[owner]

    def _settle(self, slot: int) -> None:
        """A slot whose last hold went becomes idle: an eviction candidate again (unless a load is
        still filling it: that load settles it when it ends)."""
        held = self._trackers.get(slot)
        if held is not None and held.idle():
            del self._trackers[slot]
            key = self._key_of[slot]
            if key not in self._in_flight:
                self.idle_pages.put(key)

    def _discard_holds(self, slot: int) -> None:
        held = self._trackers.pop(slot, None)
        if held is not None:
            for owner in set().union(*(held.of(kind) for kind in Tracker)):
                self._forget_hold(slot, owner)

    def _describe(self, slot: int) -> str:
        held = self._trackers[slot]
        return ", ".join(f"{kind.value}: {sorted(held.of(kind))}" for kind in Tracker if held.of(kind))

    def _slot_or_raise(self, key: str) -> int:
        slot = self._slot_of.get(key)
        if slot is None:
            raise SlotError(f"tier `{self.name}` has no page {key}; allocate or fetch it first")
        return slot

    # ── statistics ──

    def statistics(self) -> dict:
        """Slots used and free, idle pages per level, holds by kind, and the counters."""
        totals = {kind.value: 0 for kind in Tracker}
        for held in self._trackers.values():
            for kind in Tracker:
                totals[kind.value] += len(held.of(kind))
        return {
            "tier": self.name,
            "slots": self.slots,
            "used": len(self._slot_of),
            "free": self.free_slots.free,
            "free_runs": len(self.free_slots),
            "idle_levels": self.idle_pages.counts(),
            "held_pages": len(self._trackers),
            "trackers": totals,
            "owners": len(self._held_by),
            "in_flight": len(self._in_flight),
            **vars(self.counters),
        }
