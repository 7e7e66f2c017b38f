"""The Global Params Pool of one process for one parameter: the tiers, their slot engines and the
metadata joined into one cache (shared/DESIGN.md §6, Omni-Flow §4.1).

- **L1** (`device`): the block stacks attention reads; a `SlotEngine` decides which page lives in
  which slot. **L2** (`host`): flat pages in a shared-memory file other processes of the machine
  map (`peers`). **L3** (`disk`): flat pages in a memory-mapped file, a local spill of L2.
- **Writing**: `allocate(keys)` gives L1 slots for new pages (named by their chained hashes) held
  for the writer; `commit` makes them readable, writes them through to L2 (one copy per run of
  slots) and publishes them with their L2 slots in the metadata store, so any process finds them.
- **Reading**: `match` finds the longest prefix of a page list this process or a peer of the
  machine holds: L1 first, then this pool's L2 and L3, then the metadata store (one round trip)
  for pages peers hold. Every page found is brought into L1 by `SlotEngine.fetch_many`:
  concurrent misses on a page make one copy, runs of slots move as single segments (promotion).
  A slot of L2, L3 or a peer's L2 is used only if its label says it holds the page asked for
  (tiers.MappedTier), checked before the copy and again after it: a slot holding another page
  (the metadata store lied, or the slot was rewritten meanwhile) is a miss from that page on,
  counted (`mismatched_pages`) and logged, and nothing of it reaches L1.
- **Evicting**: L1 drops idle pages coldest first; a page that L2 lacks is copied down first
  (demotion). L2 makes room through the metadata store's guarded eviction: a page a peer is
  reading (replica lock), that a running session uses (run lock), or whose last full copy this
  is, stays; an evicted one is copied down to L3 when there is one.
- **Metadata down** (Redis stopped, a script failing): nothing in L1, L2 or L3 is dropped or
  changed. Reads fall back to what this process holds, commits stay local and their publishing
  is retried on later calls (`pending_publishes`); `last_meta_error` says what went wrong.

Single event loop, like the slot engines: call it from one thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrt.params import peers as peers_
from flowrt.params.layout import KVLayout
from flowrt.params.meta import EmbeddedStore, MetaStore
from flowrt.params.pool_down import Demotion
from flowrt.params.pool_publish import DONE, MAX_CHAINS, RETRY, UNKNOWN, Publishing
from flowrt.params.pool_verify import PageMismatch, Verification
from flowrt.params.slots import PageLoadAbandoned, SlotEngine, SlotError, SlotsExhausted, Tracker
from flowrt.params.tiers import CopyStats, DeviceTier, DiskTier, FlatTier, HostTier, Tier, copy_slots

log = logging.getLogger("flowrt.params")

PROMOTER = "pool-promote"  # ... and of the sources of its promotions
ALIAS = "~"  # joins a page key and a number: the key of a request's private copy of a page
OFFLOAD_BYTES = 1 << 20  # a promotion this large copies on a worker thread, not on the event loop
LOCK_TTL = 30.0  # seconds a replica lock outlives a reader that died holding it


@dataclass
class PoolCounters:
    committed_pages: int = 0
    published_pages: int = 0
    promoted_pages: int = 0  # copied up into L1 (from L2, L3 or a peer's L2)
    demoted_pages: int = 0  # copied down (L1 -> L2, L2 -> L3)
    peer_pages: int = 0  # read from another process's L2
    evictions_refused: int = 0  # L2 pages the metadata guards kept
    write_through_refused: int = 0  # committed pages L2 had no room for (they stayed in L1)
    publish_refused: int = 0  # pages the metadata store refused (a gap in the session's chain)
    copy_segments: int = 0
    copy_bytes: int = 0
    meta_errors: int = 0
    mismatched_pages: int = 0  # slots below L1 that did not hold the page asked for: recomputed, never used


@dataclass(frozen=True)
class Prefix:
    """What `match` found: the first `pages` keys, held in L1 slots `slots` for the owner, and
    where each came from (`sources[i]`: device, host, disk or peer)."""

    pages: int
    slots: tuple[int, ...]
    sources: tuple[str, ...]
    degraded: str | None = None  # why the metadata store was not asked, if it failed


@dataclass
class _Found:
    """Where a page of a match lies before it is brought into L1."""

    key: str
    source: str
    tier: Tier | None = None
    slot: int | None = None
    peer: str | None = None
    version: int | None = None  # the slot's label version when checked (tiers.MappedTier.holds)


def default_node(name: str) -> str:
    """This process's node name: host, pid, and a random incarnation (a pid reused after a
    restart, in a container say, must never inherit the metadata of the process before it)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}:{name}"


class KVPool(Publishing, Demotion, Verification):
    def __init__(
        self,
        layout: KVLayout,
        *,
        device_pages: int,
        host_pages: int = 0,
        disk_pages: int = 0,
        disk_dir: str | Path | None = None,
        device: Any = "cpu",
        store: MetaStore | None = None,
        deployment: str = "default",
        node: str | None = None,
        page_ttl: float = 600.0,
        node_ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.layout = layout
        self.layout_id = layout.layout_id()
        self.deployment = deployment
        self.node = node or default_node(layout.name)
        self.page_ttl = page_ttl
        self.node_ttl = node_ttl
        self.clock = clock
        self.offload_bytes = OFFLOAD_BYTES
        self._promotions = itertools.count()
        self.store = store if store is not None else EmbeddedStore(deployment)
        self.counters = PoolCounters()
        self.prefix_tokens: dict[str, dict[str, int]] = {}  # role -> hit/computed/recomputed tokens (KVSession.count_prefix)
        self.last_meta_error: str | None = None
        self.device = DeviceTier(layout, device_pages, device)
        self.l1 = SlotEngine(device_pages, name=f"{layout.name}/device", on_evict=self._demote_from_l1)
        self.host: HostTier | None = None
        self.l2: SlotEngine | None = None
        self.disk: DiskTier | None = None
        self.l3: SlotEngine | None = None
        self._descriptor: Path | None = None
        self._published: set[str] = set()  # L2 pages the metadata store lists for this node
        self._writing: dict[str, str] = {}  # page -> the request writing it (allocated, not committed)
        self._aliases: dict[tuple[str, str], str] = {}  # (request, page) -> its private slot's key
        self._aliases_made = itertools.count()
        self._superseded: dict[str, list[str]] = {}  # request -> its private copies of pages another committed first
        self._chains: dict[str, list[str]] = {}  # session -> its pages as committed here (recent last)
        self._unpublished: dict[str, int] = {}  # session -> first page the store has not taken
        self._beat_at: float | None = None
        self._mismatch_logged_at: float | None = None  # (pool_verify)
        try:
            if host_pages:
                self.host = HostTier.create(layout, host_pages)
                self.l2 = SlotEngine(host_pages, name=f"{layout.name}/host")
                self._descriptor = peers_.announce(deployment, self.node, layout, self.host)
            if disk_pages:
                directory = Path(disk_dir) if disk_dir is not None else Path(tempfile.gettempdir()) / "flowrt-kv"
                self.disk = DiskTier(directory / peers_.node_digest(deployment, self.node), layout, disk_pages)
                self.l3 = SlotEngine(disk_pages, name=f"{layout.name}/disk")
        except BaseException:
            self.close()
            raise
        self.peers = peers_.Peers(deployment, layout)
        self.keep_alive()

    # ── writing ──

    def allocate(self, keys: Sequence[str], owner: str) -> list[int]:
        """L1 slots for pages `keys`, held for `owner`. A page nobody has is new: `owner` writes
        its K/V there, then `commit`s it; until then no match sees it, and if `owner` releases
        it uncommitted it is dropped. A committed resident page is held as a read and needs no
        writing. A page another request is still writing gets a private slot of `owner`'s own
        (its data is not there yet). `fresh(key, owner)` tells whether to write."""
        keys = list(keys)
        new = [key for key in keys if self.l1.slot_of(key) is None]
        taken = [key for key in keys if self._writing.get(key, owner) != owner]
        skipped = set(new).union(taken)  # (a set: a long prompt has tens of thousands of pages)
        old = [key for key in keys if key not in skipped and self._writing.get(key) != owner]
        # the resident pages asked for are held first: making room for the new ones must not evict them
        first_holds = [key for key in old if owner not in self.l1.trackers(key).active_requests]
        if old:
            self.l1.acquire(Tracker.ACTIVE, old, owner)
        try:
            if new:
                self.l1.allocate(new, writer=owner)
                self._writing.update(dict.fromkeys(new, owner))
            for key in taken:
                alias = f"{key}{ALIAS}{next(self._aliases_made)}"
                self.l1.allocate([alias], writer=owner)
                self._aliases[(owner, key)] = alias
        except SlotsExhausted:
            self._drop_uncommitted(owner, new + taken)
            self.l1.release(first_holds, owner)
            raise
        return [self._slot_for(key, owner) for key in keys]

    def _slot_for(self, key: str, owner: str) -> int:
        alias = self._aliases.get((owner, key))
        slot = self.l1.slot_of(alias if alias is not None else key)
        assert slot is not None
        return slot

    def fresh(self, key: str, owner: str) -> bool:
        return self._writing.get(key) == owner or (owner, key) in self._aliases

    def committed(self, key: str) -> bool:
        """Whether page `key` is readable in L1 (resident, written and committed)."""
        return self.l1.slot_of(key) is not None and key not in self._writing

    def commit(self, session: str, keys: Sequence[str], owner: str, start: int | None = None) -> bool:
        """The K/V of `keys` (allocated by `owner`) are written: they become readable, are copied
        through to L2 and published as pages start.. of the session's chain (None: appended).
        Returns whether the metadata store took them all (False: kept here, published later, or
        L2 had no room for them)."""
        keys = list(keys)
        if start is not None and (not isinstance(start, int) or isinstance(start, bool) or start < 0):
            raise SlotError(f"KV pool `{self.layout.name}`: commit(start={start!r}): start is a page position, an int >= 0")
        strangers = [k for k in keys if not self.fresh(k, owner) and not self.committed(k)]
        if strangers:
            raise SlotError(
                f"KV pool `{self.layout.name}`: commit() of page(s) {strangers[:3]} that this request did not allocate "
                f"(and nobody committed): allocate them, write their K/V, then commit"
            )
        for key in keys:
            if self._writing.get(key) == owner:
                del self._writing[key]
                self.l1.acquire(Tracker.ACTIVE, [key], owner)  # the writer keeps reading what it wrote
                self.l1.finish_write(key, owner)
                self.counters.committed_pages += 1
            elif (owner, key) in self._aliases:
                self._settle_alias(owner, key)
        stored = True
        if self.l2 is not None:
            stored = self._write_through([key for key in keys if self.committed(key)])
        chain = self._chains.pop(session, [])
        start = len(chain) if start is None else start
        gap = [UNKNOWN] * (start - len(chain))  # pages before `start` this process never saw
        self._chains[session] = chain[:start] + gap + keys  # (a new hash at a position cuts the chain there)
        while len(self._chains) > MAX_CHAINS:
            oldest = next(iter(self._chains))
            del self._chains[oldest]
            self._unpublished.pop(oldest, None)
        self._unpublished[session] = min(start, self._unpublished.get(session, start))
        self.keep_alive()  # (which may publish the session itself)
        first = self._unpublished.get(session)
        if first is None:
            return stored
        outcome = RETRY if self.last_meta_error is not None else self._publish_now(session, first)
        if outcome != RETRY:
            self._unpublished.pop(session, None)
        return stored and outcome == DONE

    def _settle_alias(self, owner: str, key: str) -> None:
        """`owner` wrote `key` into a private slot while another request was writing it too: the
        private copy becomes the page if the other gave up; else the other's is the page, and the
        private copy (the same K/V) stays held for `owner` until it releases, because `owner`'s
        context still reads that slot: freed now, it could be handed out again to `owner` itself
        (a scratch page) or to anybody, under a context that still points at it."""
        alias = self._aliases.pop((owner, key))
        if self.l1.slot_of(key) is None:
            target = self.l1.write(alias, owner, key)  # renamed in place: nobody else holds it
            self.l1.acquire(Tracker.ACTIVE, [target.key], owner)
            self.l1.finish_write(target.key, owner)
            self.counters.committed_pages += 1
        else:
            self.l1.acquire(Tracker.ACTIVE, [alias], owner)
            self.l1.finish_write(alias, owner)
            self._superseded.setdefault(owner, []).append(alias)

    def _drop_uncommitted(self, owner: str, keys: Sequence[str] | None = None) -> None:
        """Forget pages `owner` allocated and never committed (all of them by default): their
        slots hold no valid data, so no lookup may ever find them."""
        mine = [key for key, writer in self._writing.items() if writer == owner and (keys is None or key in keys)]
        aliases = [alias for (who, key), alias in self._aliases.items() if who == owner and (keys is None or key in keys)]
        for key in mine:
            del self._writing[key]
        for who, key in [pair for pair, alias in self._aliases.items() if alias in aliases]:
            del self._aliases[(who, key)]
        for key in mine + aliases:
            self.l1.release([key], owner, Tracker.WRITE)
            self.l1.release([key], owner, Tracker.ACTIVE)
            if self.l1.slot_of(key) is not None and self.l1.trackers(key).idle():
                self.l1.remove([key])

    # ── reading ──

    async def match(self, session: str, keys: Sequence[str], owner: str) -> Prefix:
        """The longest prefix of `keys` this process or a peer of the machine holds, brought into
        L1 and held there for `owner` (release with `release`)."""
        keys = list(keys)
        found = self._local_prefix(keys)
        degraded = None
        if len(found) < len(keys):
            self.keep_alive()
            remote = self._meta(lambda: self.store.match(session, self.layout_id, keys))
            if remote is None:
                degraded = self.last_meta_error
            else:
                found.extend(self._peer_pages(keys, remote, len(found)))
        cut = next((i for i, item in enumerate(found) if item.key in self._writing), len(found))
        found = found[:cut]  # (a page being written here is not readable, wherever else it lies)
        locked = found
        found = self._verify(self._lock_peers(locked))
        chosen = [item.key for item in found]
        by_key = {item.key: item for item in found}
        retries = 0
        try:
            while True:
                try:
                    slots = await self.l1.fetch_many(chosen, lambda missed, into: self._promote(missed, into, by_key), owner)
                    break
                except SlotsExhausted:  # L1 cannot take them all (held by others): the prefix it can take
                    chosen = chosen[: self._fitting(chosen)]
                except PageLoadAbandoned:  # the request loading some of them was cancelled: load them ourselves
                    retries += 1
                    if retries > 3:
                        raise
                except PageMismatch as error:  # a slot changed under the copy: the prefix before it
                    bad = [i for i, key in enumerate(chosen) if key in error.keys]
                    chosen = chosen[: min(bad)] if bad else chosen
                    retries += 1
                    if retries > 3:
                        raise
        finally:
            self._unlock_peers(locked)
        for key in chosen:
            self.l1.touch(key)
        chain = self._chains.get(session)
        if chain is None or chain[: len(chosen)] != chosen:  # what this session's history is, as found
            self._chains.pop(session, None)
            self._chains[session] = list(chosen)
        return Prefix(len(chosen), tuple(slots), tuple(by_key[key].source for key in chosen), degraded)

    def _fitting(self, keys: list[str]) -> int:
        """How many leading `keys` L1 can hold now (free slots and idle pages make room), one
        less than len(keys) at most, so that a retry makes progress."""
        room = self.l1.free_slots.free + len(self.l1.idle_pages) - sum(1 for key in keys if key in self.l1.idle_pages)
        count = 0
        for index, key in enumerate(keys[:-1]):
            if self.l1.slot_of(key) is None:
                if room == 0:
                    return index
                room -= 1
            count = index + 1
        return count

    def _lock_peers(self, found: list[_Found]) -> list[_Found]:
        """Replica-lock the peers' pages of `found`, then check that each still lies where the
        match said (a peer may have moved it before the lock held): the prefix that does."""
        cut = len(found)
        for peer in sorted({item.peer for item in found if item.peer}):
            items = [(i, item) for i, item in enumerate(found) if item.peer == peer]
            keys = [item.key for _, item in items]
            locked = self._meta(lambda p=peer, k=keys: self.store.lock_replica(self.node, p, self.layout_id, k, LOCK_TTL) or True)
            where = None if locked is None else self._meta(lambda p=peer, k=keys: self.store.locate(p, self.layout_id, k))
            for (i, item), slot in zip(items, where or [None] * len(items), strict=True):
                if slot != item.slot:
                    cut = min(cut, i)
                    break
        return found[:cut]

    def _unlock_peers(self, found: list[_Found]) -> None:
        for peer in sorted({item.peer for item in found if item.peer}):
            keys = [item.key for item in found if item.peer == peer]
            self._meta(lambda p=peer, k=keys: self.store.unlock_replica(self.node, p, self.layout_id, k))

    def _local_prefix(self, keys: list[str]) -> list[_Found]:
        found: list[_Found] = []
        for key in keys:
            if key in self._writing:  # allocated, not yet written: nothing to read there
                break
            if self.l1.slot_of(key) is not None:
                found.append(_Found(key, "device"))
            elif below := self._below_l1([key]):
                found.extend(below)
            else:
                break
        return found

    def _below_l1(self, keys: list[str]) -> list[_Found]:
        """Where L2, else L3, of this process holds each of the leading `keys` it holds."""
        found: list[_Found] = []
        for key in keys:
            if self.l2 is not None and key in self.l2:
                found.append(_Found(key, "host", self.host, self.l2.slot_of(key)))
            elif self.l3 is not None and key in self.l3:
                found.append(_Found(key, "disk", self.disk, self.l3.slot_of(key)))
            else:
                break
        return found

    def _peer_pages(self, keys: list[str], remote: Any, begin: int) -> list[_Found]:
        """Pages begin.. of the metadata store's match that a peer of this machine can give."""
        found: list[_Found] = []
        for segment in remote.segments:
            if segment.stop <= begin:
                continue
            provider = next((p for p in segment.providers if p.node != self.node), None)
            if provider is None or len(segment.providers) != 1:
                break  # this node lost them, or they are split over providers: recompute from here
            tier = self.peers.find(provider.node)
            slots = segment.slots[0] if segment.slots else ()
            if tier is None or not slots:
                break
            for page in range(max(begin, segment.start), segment.stop):
                slot = slots[page - segment.start]
                if slot is None or not 0 <= slot < tier.slots:
                    return found
                found.append(_Found(keys[page], "peer", tier, slot, provider.node))
            begin = segment.stop
        return found

    async def _promote(self, missed: list[str], into: list[int], by_key: dict[str, _Found]) -> None:
        """Fill L1 slots `into` with pages `missed`, one copy per run from the same tier; the
        sources stay held (readback) until copied. Large transfers run off the event loop."""
        groups: dict[int, tuple[Tier, list[int], list[int]]] = {}
        holds: list[tuple[SlotEngine, str]] = []
        promoter = f"{PROMOTER}-{next(self._promotions)}"
        engines = {"host": self.l2, "disk": self.l3}
        moved = []
        for key in missed:  # moved L2 -> L3 since looked up (room made for this very fetch): read it there
            engine = engines.get(by_key[key].source)
            if engine is not None and engine.slot_of(key) != by_key[key].slot:
                again = self._verify(self._below_l1([key]), count=False)
                if again:
                    by_key[key] = again[0]
                else:
                    moved.append(key)
        if moved:  # in no tier of this process any more: misses
            raise PageMismatch(
                f"KV pool `{self.layout.name}`: {len(moved)} page(s) left every tier before they were copied", moved
            )
        for key, slot in zip(missed, into, strict=True):
            item = by_key[key]
            if item.tier is None or item.slot is None:  # it was in L1 when looked up: never between
                raise SlotError(f"KV pool `{self.layout.name}`: page {key} left every tier while it was being read")
            engine = engines.get(item.source)
            if engine is not None:
                engine.acquire(Tracker.READBACK, [key], promoter)
                holds.append((engine, key))
            group = groups.setdefault(id(item.tier), (item.tier, [], []))
            group[1].append(item.slot)
            group[2].append(slot)
        try:
            nbytes = len(missed) * self.layout.page_bytes
            if nbytes >= self.offload_bytes:
                stats = await asyncio.to_thread(self._copy_groups, list(groups.values()))
            else:
                stats = self._copy_groups(list(groups.values()))
        finally:
            for engine, key in holds:
                engine.release([key], promoter, Tracker.READBACK)
        changed = [key for key in missed if by_key[key].tier.version(by_key[key].slot) != by_key[key].version]
        if changed:  # rewritten while copied: what reached L1 may be another page (fetch_many frees it)
            first = min(missed.index(key) for key in changed)
            self._mismatched([by_key[key] for key in missed[first:]], by_key[missed[first]])
            raise PageMismatch(f"KV pool `{self.layout.name}`: {len(changed)} page(s) changed while they were copied", changed)
        self._count(stats)
        self.counters.promoted_pages += len(missed)
        self.counters.peer_pages += sum(1 for key in missed if by_key[key].source == "peer")

    def _copy_groups(self, groups: list[tuple[Tier, list[int], list[int]]]) -> CopyStats:
        total = CopyStats()
        for tier, sources, targets in groups:
            total = total + copy_slots(tier, sources, self.device, targets)
        return total

    def _count(self, stats: CopyStats) -> None:
        self.counters.copy_segments += stats.segments
        self.counters.copy_bytes += stats.bytes

    def read_shared(self, session: str, keys: Sequence[str]) -> SharedPages:
        """The prefix of `keys` that peers of this machine hold in L2, as zero-copy views of their
        pages (no copy into L1), held against eviction by replica locks until `close`."""
        keys = list(keys)
        self.keep_alive()
        remote = self._meta(lambda: self.store.match(session, self.layout_id, keys))
        found = [] if remote is None else self._peer_pages(keys, remote, 0)
        return SharedPages(self, found)

    def release(self, owner: str) -> None:
        """Drop every hold `owner` has on this pool's pages, and the pages it allocated but never
        committed (their slots hold no valid K/V)."""
        self._drop_uncommitted(owner)
        for engine in (self.l1, self.l2, self.l3):
            if engine is not None:
                engine.release_owner(owner)
        for alias in self._superseded.pop(owner, ()):  # (no lookup can find one: their keys are private)
            if self.l1.slot_of(alias) is not None and self.l1.trackers(alias).idle():
                self.l1.remove([alias])

    # ── the rest ──

    def statistics(self) -> dict:
        tiers = {"device": self.l1.statistics()}
        if self.l2 is not None:
            tiers["host"] = self.l2.statistics()
        if self.l3 is not None:
            tiers["disk"] = self.l3.statistics()
        return {
            "layout": self.layout.name,
            "layout_id": self.layout_id,
            "node": self.node,
            "tiers": tiers,
            "published": len(self._published),
            "pending_publishes": sum(len(self._chains.get(s, ())) - start for s, start in self._unpublished.items()),
            "last_meta_error": self.last_meta_error,
            **self.peers.statistics(),
            **vars(self.counters),
            "prefix_tokens": {role: dict(tokens) for role, tokens in sorted(self.prefix_tokens.items())},
        }

    def close(self) -> None:
        """Leave the metadata store and free every tier (the L2 file is removed)."""
        if getattr(self, "peers", None) is not None:
            self.peers.close()
        if self._beat_at is not None:
            self._meta(lambda: self.store.unregister_node(self.node))
            self._beat_at = None
        peers_.withdraw(self._descriptor)
        self._descriptor = None
        for tier in (self.host, self.disk, self.device):
            if tier is not None:
                tier.close()
        if self.disk is not None:  # its pages were this node's alone (never published): nobody reopens them
            with contextlib.suppress(OSError):
                self.disk.path.unlink()
                self.disk.path.parent.rmdir()
            self.disk = None


@dataclass
class SharedPages:
    """Pages another process of the machine holds, read in place (see `KVPool.read_shared`)."""

    pool: KVPool
    found: list[_Found]
    closed: bool = field(default=False)
    locked: list[_Found] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.locked = self.found
        self.found = self.pool._verify(self.pool._lock_peers(self.found))

    @property
    def pages(self) -> int:
        """How many leading pages of the keys asked for were found (also `len()`)."""
        return len(self.found)

    def __len__(self) -> int:
        return len(self.found)

    def view(self, page: int, sub_names: Sequence[str] | None = None, slice_names: Sequence[str] | None = None) -> list:
        """Zero-copy views (page_tokens, heads, head_dim) of page `page` of the match, one per
        (sub, slice) of the Cartesian product, sub-major (None: all)."""
        if self.closed:
            raise SlotError("these shared pages were closed; read them again")
        if not isinstance(page, int) or not 0 <= page < len(self.found):
            raise SlotError(
                f"shared page {page!r} is not one of the {len(self.found)} found (0..{len(self.found) - 1}); "
                f"check `.pages` first: only pages other processes of this machine hold for this session are found"
            )
        item = self.found[page]
        assert isinstance(item.tier, FlatTier) and item.slot is not None
        return item.tier.view(sub_names, item.slot, slice_names)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.pool._unlock_peers(self.locked)

    def __enter__(self) -> SharedPages:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
