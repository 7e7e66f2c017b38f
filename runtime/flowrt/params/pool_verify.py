"""The KV pool's check that a slot below L1 holds the page asked for, before anything is read
from it: the slot's label (tiers.MappedTier) must name the page's hash, before the copy and
still after it. A slot that holds another page (metadata that lied, a slot rewritten meanwhile)
is a miss from that page on: counted (`mismatched_pages`), logged at most once a minute, never
used. A mixin of `KVPool` (flowrt.params.pool)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from flowrt.params.slots import SlotError
from flowrt.params.tiers import MappedTier

log = logging.getLogger("flowrt.params")

MISMATCH_LOG_EVERY = 60.0  # seconds between two warnings about slots that held another page


class PageMismatch(SlotError):
    """Pages of a promotion (`keys`) were not in their slots when copied (rewritten meanwhile, or
    evicted from this pool's L2 or L3 to make room for this very fetch): the promotion is undone
    and `match` serves the prefix before them."""

    def __init__(self, message: str, keys: Sequence[str]):
        super().__init__(message)
        self.keys = list(keys)


class Verification:
    """Needs of its KVPool: layout, counters, clock, _mismatch_logged_at. The pages checked are
    the pool's `_Found` items (key, source, tier, slot, peer; `version` is set here)."""

    layout: Any
    counters: Any
    clock: Callable[[], float]
    _mismatch_logged_at: float | None

    def _verify(self, found: list[Any], count: bool = True) -> list[Any]:
        """The prefix of `found` whose slots below L1 hold the pages asked for, by their labels;
        the first that does not ends it (a miss: recomputed), counted and logged."""
        for i, item in enumerate(found):
            if item.tier is None or item.slot is None:
                continue  # in L1: this process's own slot engine placed it
            version = item.tier.holds(item.slot, item.key) if isinstance(item.tier, MappedTier) else None
            if version is None:
                if count:
                    self._mismatched(found[i:], item)
                return found[:i]
            item.version = version
        return found

    def _mismatched(self, lost: list[Any], first: Any) -> None:
        self.counters.mismatched_pages += len(lost)
        now = self.clock()
        if self._mismatch_logged_at is None or now - self._mismatch_logged_at >= MISMATCH_LOG_EVERY:
            self._mismatch_logged_at = now
            where = f"peer {first.peer}'s" if first.peer else "this process's"
            log.warning(
                "KV pool `%s`: slot %s of %s %s tier does not hold page %s as the %s said; %d page(s) from there "
                "are recomputed (%d so far: `mismatched_pages`)",
                self.layout.name,
                first.slot,
                where,
                first.source if first.source != "peer" else "host",
                first.key,
                "metadata store" if first.peer else "slot engine",
                len(lost),
                self.counters.mismatched_pages,
            )
