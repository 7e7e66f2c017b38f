"""The embedded metadata store: one machine, in-process, plain Python, the default.

Same semantics as the Redis store (whose Lua scripts this mirrors): TTLs are deadlines on a
monotonic clock (injectable for tests), checked when read; one lock makes every method atomic.
A page's record holds its providers' slots, so a location lives and goes with its provider.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flowrt.params.layout import KVLayout
from flowrt.params.meta.combos import assign, candidate_combinations, first_complete
from flowrt.params.meta.types import (
    EVICTED,
    LAST_REPLICA,
    NOT_PROVIDER,
    REPLICA_LOCK,
    RUN_LOCK,
    Eviction,
    Match,
    MetaError,
    MetaStore,
    Provider,
    Segment,
    check_name,
    check_slots,
    check_ttl,
)


@dataclass
class _Page:
    expires: int
    providers: set[tuple[str, str]] = field(default_factory=set)  # (node, part layout id)
    sessions: set[str] = field(default_factory=set)
    slots: dict[tuple[str, str], int] = field(default_factory=dict)  # provider -> its slot, where published


@dataclass
class _Chain:
    expires: int
    pages: list[str] = field(default_factory=list)


class EmbeddedStore(MetaStore):
    def __init__(self, deployment: str = "default", clock: Callable[[], float] = time.monotonic):
        self.deployment = check_name("deployment", deployment)
        self._clock = clock
        self._lock = threading.RLock()
        self._layouts: dict[str, KVLayout] = {}
        self._full_of: dict[str, str] = {}  # part layout id -> full layout id
        self._parts: dict[str, dict[str, KVLayout]] = {}  # full -> part id -> part
        self._members: dict[str, set[tuple[str, str]]] = {}  # full -> {(node, part)} as registered
        self._combos: dict[str, list[tuple[str, ...]]] = {}
        self._nodes: dict[str, tuple[int, dict[str, str]]] = {}  # node -> (expires, part -> full)
        self._chains: dict[tuple[str, str], _Chain] = {}
        self._pages: dict[tuple[str, str], _Page] = {}
        self._replica_locks: dict[
            tuple[str, str], dict[tuple[str, str], int]
        ] = {}  # (full, page) -> (reader, provider) -> expires
        self._run_locks: dict[str, dict[str, int]] = {}  # session -> holder -> expires

    def _now(self) -> int:
        return int(self._clock() * 1000)

    # ── layouts and combinations ──

    def register_layout(self, layout: KVLayout) -> str:
        lid = layout.layout_id()
        with self._lock:
            self._layouts[lid] = layout
        return lid

    def layout(self, layout_id: str) -> KVLayout | None:
        with self._lock:
            return self._layouts.get(layout_id)

    def register_node(self, node: str, layouts: Sequence[KVLayout], ttl: float) -> None:
        check_name("node", node)
        ms = check_ttl("a node's ttl", ttl)
        with self._lock:
            holdings = {part.layout_id(): full_of(self._layouts, part) for part in layouts}
            affected = set(holdings.values())
            _, old = self._nodes.pop(node, (0, {}))
            for part, full in old.items():
                self._members.get(full, set()).discard((node, part))
                affected.add(full)
            self._nodes[node] = (self._now() + ms, holdings)
            for part_layout in layouts:
                part, full = part_layout.layout_id(), holdings[part_layout.layout_id()]
                self._full_of[part] = full
                self._parts.setdefault(full, {})[part] = part_layout
                self._members.setdefault(full, set()).add((node, part))
            for full in affected:
                self._recompute(full)

    def _recompute(self, full: str) -> None:
        frequency: dict[str, int] = {}
        for node, part in self._members.get(full, ()):
            if self._holds(node, part):
                frequency[part] = frequency.get(part, 0) + 1
        parts = {lid: layout for lid, layout in self._parts.get(full, {}).items() if frequency.get(lid)}
        self._combos[full] = candidate_combinations(self._layouts[full], parts, frequency)

    def heartbeat(self, node: str, ttl: float) -> bool:
        ms = check_ttl("a node's ttl", ttl)
        with self._lock:
            if not self.node_alive(node):
                return False
            self._nodes[node] = (self._now() + ms, self._nodes[node][1])
            return True

    def unregister_node(self, node: str) -> None:
        with self._lock:
            _, old = self._nodes.pop(node, (0, {}))
            for part, full in old.items():
                self._members.get(full, set()).discard((node, part))
            for full in set(old.values()):
                self._recompute(full)

    def node_alive(self, node: str) -> bool:
        with self._lock:
            entry = self._nodes.get(node)
            return entry is not None and entry[0] > self._now()

    def _holds(self, node: str, part: str) -> bool:
        entry = self._nodes.get(node)
        return entry is not None and entry[0] > self._now() and part in entry[1]

    def combinations(self, layout_id: str) -> list[tuple[str, ...]]:
        with self._lock:
            return list(self._combos.get(layout_id, ()))

    # ── publishing and matching ──

    def publish(
        self,
        node: str,
        session: str,
        layout_id: str,
        pages: Sequence[str],
        ttl: float,
        start: int | None = None,
        slots: Sequence[int] | None = None,
    ) -> int:
        check_name("node", node)
        check_name("session", session)
        for page in pages:
            check_name("page hash", page)
        ms = check_ttl("a page's ttl", ttl)
        located = check_slots(pages, slots)
        with self._lock:
            now = self._now()
            entry = self._nodes.get(node)
            if entry is None or entry[0] <= now or layout_id not in entry[1]:
                raise MetaError(f"node {node} does not hold layout {layout_id} (or its heartbeat lapsed): register_node first")
            full = entry[1][layout_id]
            chain = self._live_chain(full, session, now) or _Chain(0)
            begin = len(chain.pages) if start is None else start
            if begin < 0 or begin > len(chain.pages):
                raise MetaError(f"session {session} has {len(chain.pages)} pages: cannot publish from page {begin} (a gap)")
            for offset, page in enumerate(pages):
                position = begin + offset
                if position < len(chain.pages) and chain.pages[position] != page:
                    del chain.pages[position:]
                if position >= len(chain.pages):
                    chain.pages.append(page)
                record = self._live_page(full, page, now) or _Page(0)
                record.expires = max(record.expires, now + ms)
                record.providers.add((node, layout_id))
                record.sessions.add(session)
                if located is None:
                    record.slots.pop((node, layout_id), None)
                else:
                    record.slots[(node, layout_id)] = located[offset]
                self._pages[(full, page)] = record
            if chain.pages:
                chain.expires = max(chain.expires, now + ms)
                self._chains[(full, session)] = chain
            return len(chain.pages)

    def _live_chain(self, full: str, session: str, now: int) -> _Chain | None:
        chain = self._chains.get((full, session))
        if chain is not None and chain.expires <= now:
            del self._chains[(full, session)]
            return None
        return chain

    def _live_page(self, full: str, page: str, now: int) -> _Page | None:
        record = self._pages.get((full, page))
        if record is not None and record.expires <= now:
            del self._pages[(full, page)]
            return None
        return record

    def chain(self, layout_id: str, session: str) -> list[str]:
        with self._lock:
            chain = self._live_chain(layout_id, session, self._now())
            return list(chain.pages) if chain else []

    def _avail(self, record: _Page, exclude: tuple[str, str] | None = None) -> dict[str, set[str]]:
        avail: dict[str, set[str]] = {}
        for node, part in record.providers:
            if (node, part) != exclude and self._holds(node, part):
                avail.setdefault(part, set()).add(node)
        return avail

    def match(self, session: str, layout_id: str, pages: Sequence[str]) -> Match:
        with self._lock:
            now = self._now()
            chain = self._live_chain(layout_id, session, now)
            combos = self._combos.get(layout_id, [])
            found: list[dict[str, set[str]]] = []
            records: list[_Page] = []
            for i, page in enumerate(pages):
                if chain is None or i >= len(chain.pages) or chain.pages[i] != page:
                    break
                record = self._live_page(layout_id, page, now)
                if record is None or not record.providers:  # expired: cut the tail
                    del chain.pages[i:]
                    if not chain.pages:
                        del self._chains[(layout_id, session)]
                        chain = None
                    break
                avail = self._avail(record)
                if first_complete(avail, combos) is None:
                    break
                found.append(avail)
                records.append(record)
            segments = tuple(
                Segment(
                    start,
                    stop,
                    tuple(Provider(node, lid) for lid, node in chosen),
                    tuple(tuple(records[i].slots.get((node, lid)) for i in range(start, stop)) for lid, node in chosen),
                )
                for start, stop, chosen in assign(found, combos)
            )
            return Match(len(found), len(chain.pages) if chain else 0, segments)

    def locate(self, node: str, layout_id: str, pages: Sequence[str]) -> list[int | None]:
        with self._lock:
            now = self._now()
            full = self._full_of.get(layout_id)
            if full is None:
                raise MetaError(f"layout {layout_id} was never registered by a node: nothing provides it")
            if not self._holds(node, layout_id):
                return [None] * len(pages)
            found: list[int | None] = []
            for page in pages:
                record = self._live_page(full, page, now)
                found.append(None if record is None else record.slots.get((node, layout_id)))
            return found

    # ── locks ──

    def lock_replica(self, reader: str, provider: str, layout_id: str, pages: Sequence[str], ttl: float) -> None:
        check_name("reader", reader)
        check_name("provider", provider)
        ms = check_ttl("a lock's ttl", ttl)
        with self._lock:
            now = self._now()
            for page in pages:
                locks = self._replica_locks.setdefault((layout_id, page), {})
                locks[(reader, provider)] = now + ms
                for key in [key for key, expires in locks.items() if expires <= now]:
                    del locks[key]

    def unlock_replica(self, reader: str, provider: str, layout_id: str, pages: Sequence[str]) -> None:
        with self._lock:
            for page in pages:
                locks = self._replica_locks.get((layout_id, page), {})
                locks.pop((reader, provider), None)
                if not locks:
                    self._replica_locks.pop((layout_id, page), None)

    def lock_run(self, session: str, holder: str, ttl: float) -> None:
        check_name("session", session)
        check_name("holder", holder)
        ms = check_ttl("a lock's ttl", ttl)
        with self._lock:
            now = self._now()
            locks = self._run_locks.setdefault(session, {})
            locks[holder] = now + ms
            for key in [key for key, expires in locks.items() if expires <= now]:
                del locks[key]

    def unlock_run(self, session: str, holder: str) -> None:
        with self._lock:
            locks = self._run_locks.get(session, {})
            locks.pop(holder, None)
            if not locks:
                self._run_locks.pop(session, None)

    # ── eviction ──

    def evict(self, node: str, layout_id: str, pages: Sequence[str], drop: bool = False) -> list[Eviction]:
        with self._lock:
            now = self._now()
            full = self._full_of.get(layout_id)
            if full is None:
                raise MetaError(f"layout {layout_id} was never registered by a node: nothing provides it")
            combos = self._combos.get(full, [])
            member = (node, layout_id)
            answers = []
            for page in pages:
                record = self._live_page(full, page, now)
                answers.append(Eviction(page, self._evict_one(full, page, record, member, combos, drop, now)))
            return answers

    def _evict_one(self, full, page, record, member, combos, drop, now) -> str:
        if record is None or member not in record.providers:
            return NOT_PROVIDER
        node = member[0]
        locks = self._replica_locks.get((full, page), {})
        if any(reader != node and provider == node and expires > now for (reader, provider), expires in locks.items()):
            return REPLICA_LOCK
        for session in record.sessions:
            if any(expires > now for expires in self._run_locks.get(session, {}).values()):
                return RUN_LOCK
        if not drop:
            complete_before = first_complete(self._avail(record), combos) is not None
            complete_after = first_complete(self._avail(record, exclude=member), combos) is not None
            referenced = any(self._live_chain(full, session, now) is not None for session in record.sessions)
            if complete_before and not complete_after and referenced:
                return LAST_REPLICA
        record.providers.discard(member)
        record.slots.pop(member, None)
        if not record.providers:
            del self._pages[(full, page)]
        return EVICTED


def full_of(layouts: dict[str, KVLayout], part: KVLayout) -> str:
    """The id of the one registered full layout that `part` is a part of; MetaError if none or
    more than one."""
    fulls = [lid for lid, full in layouts.items() if full.covers(part)]
    if len(fulls) != 1:
        what = (
            "no registered full layout covers it" if not fulls else f"several registered full layouts cover it: {sorted(fulls)}"
        )
        raise MetaError(
            f"layout {part.layout_id()} ({part.name}: {list(part.sub_names)} x {list(part.slice_names)}): {what}; register_layout the full layout first"
        )
    return fulls[0]
