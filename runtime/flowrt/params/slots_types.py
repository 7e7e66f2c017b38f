"""The slot engine's vocabulary: its errors, the four trackers of a slot, its counters, where a
write goes, and one load in flight (flowrt.params.slots uses them; importers take them from there).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum

from flowrt.errors import FlowrtError


class SlotError(FlowrtError):
    """A slot engine operation that cannot be done as asked (a missing page, a busy one)."""


class SlotsExhausted(SlotError):
    """A tier has not enough free or evictable slots for an allocation."""


class Tracker(Enum):
    """The four kinds of hold on a slot (the names of `SlotTrackers`' sets)."""

    ACTIVE = "active_requests"
    WRITE = "write_tasks"
    EVICT = "eviction_tasks"
    READBACK = "readback_tasks"


@dataclass
class SlotTrackers:
    """Who holds one slot, by kind; a slot is idle when all four sets are empty."""

    active_requests: set[str] = field(default_factory=set)
    write_tasks: set[str] = field(default_factory=set)
    eviction_tasks: set[str] = field(default_factory=set)
    readback_tasks: set[str] = field(default_factory=set)

    def of(self, kind: Tracker) -> set[str]:
        return getattr(self, kind.value)

    def idle(self) -> bool:
        return not (self.active_requests or self.write_tasks or self.eviction_tasks or self.readback_tasks)

    def holds(self, owner: str) -> bool:
        return any(owner in self.of(kind) for kind in Tracker)


@dataclass
class SlotCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    dedup_joins: int = 0
    copies_on_write: int = 0
    loads_failed: int = 0


class PageLoadAbandoned(SlotError):
    """The request that was loading a page was cancelled before the load finished."""


@dataclass(frozen=True)
class WriteTarget:
    """Where a write goes: page `key` in `slot`. With `copy_from` set (copy-on-write), the caller
    first copies that slot's data into `slot`; None means the page is written in place."""

    key: str
    slot: int
    copy_from: int | None = None


@dataclass
class _InFlight:
    """One load in progress: its outcome, and the requesters that joined it (each gets an active
    hold the moment the page is ready, so none of them can lose it before it resumes)."""

    outcome: asyncio.Future
    joined: set[str] = field(default_factory=set)
