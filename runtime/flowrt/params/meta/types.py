"""The metadata layer's interface: the typed records it answers with, its errors, and the
abstract `MetaStore` both stores (embedded, Redis) implement with the same semantics.

Names of nodes, sessions and lock holders are non-empty strings without `|` (the stores join
`node|layout_id` and `reader|provider` into one member); page hashes are non-empty strings
without `|` either. Times are seconds (floats) at the interface; the stores keep milliseconds.
A **slot** (a page's location at one provider, e.g. its index in the provider's host
shared-memory segment) is an int >= 0; None where a provider published no location.
"""

from __future__ import annotations

import abc
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from flowrt.errors import FlowrtError
from flowrt.params.layout import KVLayout

SEP = "|"

# why `evict` did or did not drop a page (Eviction.reason)
EVICTED = "evicted"
NOT_PROVIDER = "not_provider"  # this node does not provide the page (already gone, or never)
REPLICA_LOCK = "replica_lock"  # guard 1: another node is reading the page from this node
RUN_LOCK = "run_lock"  # guard 2: a session using the page has inference running
LAST_REPLICA = "last_replica"  # guard 3: the last complete copy of a page a live session references
REASONS = (EVICTED, NOT_PROVIDER, REPLICA_LOCK, RUN_LOCK, LAST_REPLICA)


class MetaError(FlowrtError):
    """The metadata store refused an operation (an unknown node or layout, a bad name)."""


class MetaUnavailable(MetaError):
    """The metadata store cannot be reached or refuses us (Redis down, wrong password)."""


class MetaScriptError(MetaError):
    """A Lua script of the Redis store failed (a bug, or a Redis too old for it)."""


@dataclass(frozen=True, order=True)
class Provider:
    """One node holding one (partial) layout of a page."""

    node: str
    layout_id: str


@dataclass(frozen=True)
class Segment:
    """Pages [start, stop) of a match, all read from the same providers (one per layout of the
    chosen candidate combination, in the combination's order). `slots[j]` holds where provider
    `providers[j]` keeps pages start..stop-1 (None where it published no location); the stores
    always fill it, the default () only spares hand-made segments from spelling it out."""

    start: int
    stop: int
    providers: tuple[Provider, ...]
    slots: tuple[tuple[int | None, ...], ...] = ()

    def slot(self, provider: int, page: int) -> int | None:
        """Where `providers[provider]` keeps page `page` (start <= page < stop), or None."""
        if not self.start <= page < self.stop:
            raise IndexError(f"page {page} is outside the segment [{self.start}, {self.stop})")
        if provider >= len(self.slots):
            return None
        return self.slots[provider][page - self.start]


@dataclass(frozen=True)
class Match:
    """The answer to a prefix match: `length` pages of the query match the session's chain and
    each has a complete combination of live providers; `chain_length` is the session's chain
    after any expired tail was cut; `segments` cover [0, length) in order."""

    length: int
    chain_length: int
    segments: tuple[Segment, ...]

    def providers(self, page: int) -> tuple[Provider, ...]:
        """The providers chosen for page `page` (0 <= page < length)."""
        return self._segment(page).providers

    def slots(self, page: int) -> tuple[int | None, ...]:
        """Where each of `providers(page)` (same order) keeps page `page`; None where unknown."""
        segment = self._segment(page)
        return tuple(segment.slot(j, page) for j in range(len(segment.providers)))

    def _segment(self, page: int) -> Segment:
        for segment in self.segments:
            if segment.start <= page < segment.stop:
                return segment
        raise IndexError(f"page {page} is outside the match (length {self.length})")

    @property
    def sources(self) -> int:
        """How many times the reader switches providers: the number of segments."""
        return len(self.segments)


@dataclass(frozen=True)
class Eviction:
    """What `evict` did with one page: `evicted`, or refused with one of REASONS."""

    page: str
    reason: str

    @property
    def evicted(self) -> bool:
        return self.reason == EVICTED


def check_name(what: str, value: str) -> str:
    if not isinstance(value, str) or not value or SEP in value:
        raise MetaError(f"a {what} must be a non-empty string without {SEP!r}, not {value!r}")
    return value


def check_slots(pages: Sequence[str], slots: Sequence[int] | None) -> list[int] | None:
    """`slots` as plain ints, one per page; MetaError on a length mismatch or a slot that is not
    an int >= 0 (a bool is not a slot)."""
    if slots is None:
        return None
    try:
        values = None if isinstance(slots, str | bytes | bytearray) else list(slots)
    except TypeError:
        values = None
    if values is None:
        raise MetaError(f"slots must be a sequence of ints (one per page) or None, not {slots!r}")
    if len(values) != len(pages):
        raise MetaError(f"publish got {len(pages)} pages but {len(values)} slots: give one slot per page (or slots=None)")
    checked = []
    for page, slot in zip(pages, values, strict=True):
        if isinstance(slot, bool) or not isinstance(slot, numbers.Integral) or slot < 0:
            raise MetaError(f"the slot of page {page} must be an int >= 0, not {slot!r}")
        checked.append(int(slot))
    return checked


def check_ttl(what: str, seconds: float) -> int:
    """Seconds -> whole milliseconds (at least 1)."""
    if not isinstance(seconds, int | float) or not seconds > 0 or seconds != seconds:
        raise MetaError(f"{what} must be a number of seconds greater than zero, not {seconds!r}")
    return max(1, int(seconds * 1000))


class MetaStore(abc.ABC):
    """The Global Params Pool's metadata (paper §4.1.3): layouts and candidate combinations,
    publishing, session prefix matching, provider liveness, locks and guarded eviction. Each
    method is atomic: the Redis store runs each write as one Lua script."""

    deployment: str

    # ── layouts and combinations ──

    @abc.abstractmethod
    def register_layout(self, layout: KVLayout) -> str:
        """Record a full layout (a parameter's whole page); returns its layout id."""

    @abc.abstractmethod
    def layout(self, layout_id: str) -> KVLayout | None:
        """A full layout registered under `layout_id`, or None."""

    @abc.abstractmethod
    def register_node(self, node: str, layouts: Sequence[KVLayout], ttl: float) -> None:
        """Node `node` holds these (partial or full) layouts, each a part of one registered full
        layout, and is live for `ttl` seconds unless renewed by `heartbeat`. Replaces what the
        node registered before, and recomputes the candidate combinations it affects."""

    @abc.abstractmethod
    def heartbeat(self, node: str, ttl: float) -> bool:
        """Renew the node for `ttl` seconds; False when it had lapsed (register it again)."""

    @abc.abstractmethod
    def unregister_node(self, node: str) -> None:
        """The node leaves: its provided pages stop matching at once."""

    @abc.abstractmethod
    def node_alive(self, node: str) -> bool: ...

    @abc.abstractmethod
    def combinations(self, layout_id: str) -> list[tuple[str, ...]]:
        """The candidate combinations of a full layout, best first (see combos.py)."""

    # ── publishing and matching ──

    @abc.abstractmethod
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
        """Node `node` (holding part `layout_id`) provides `pages`, in order, at positions
        start.. of the session's chain (None: appended at its end). A position that holds another
        hash cuts the chain there (the session's history changed). Pages, the session's page
        sets and the chain live at least `ttl` seconds from now (a TTL is extended, never
        shortened). `slots[i]` (an int >= 0) is where the node keeps `pages[i]`: recorded per
        (page, provider), living as long as the page, replaced by the next publish of that page
        by that provider; slots=None records no location (and forgets one published before: a
        location is only as current as the provider's last publish). Returns the chain's length."""

    @abc.abstractmethod
    def chain(self, layout_id: str, session: str) -> list[str]:
        """The session's page chain for full layout `layout_id` ([] if none)."""

    @abc.abstractmethod
    def match(self, session: str, layout_id: str, pages: Sequence[str]) -> Match:
        """The longest prefix of `pages` that is the session's chain with, page by page, a
        complete candidate combination of live providers; cuts the chain at an expired page.
        Each segment carries its providers' slots of its pages (the same round trip)."""

    @abc.abstractmethod
    def locate(self, node: str, layout_id: str, pages: Sequence[str]) -> list[int | None]:
        """Where node `node` keeps `pages` in its part `layout_id`: one slot per page, None where
        it published no location, does not provide the page (evicted, expired, never) or is not
        live (lapsed, unregistered). MetaError if no node ever registered `layout_id`."""

    # ── locks ──

    @abc.abstractmethod
    def lock_replica(self, reader: str, provider: str, layout_id: str, pages: Sequence[str], ttl: float) -> None:
        """`reader` reads these pages (of full layout `layout_id`) from `provider`: until
        released or `ttl` passes, the provider may not evict them."""

    @abc.abstractmethod
    def unlock_replica(self, reader: str, provider: str, layout_id: str, pages: Sequence[str]) -> None: ...

    @abc.abstractmethod
    def lock_run(self, session: str, holder: str, ttl: float) -> None:
        """Inference by `holder` runs on the session's pages: none of them may be evicted until
        released or `ttl` passes. Taking it again renews it."""

    @abc.abstractmethod
    def unlock_run(self, session: str, holder: str) -> None: ...

    # ── eviction ──

    @abc.abstractmethod
    def evict(self, node: str, layout_id: str, pages: Sequence[str], drop: bool = False) -> list[Eviction]:
        """Stop `node` providing `pages` of its part `layout_id`, each page only if the three
        guards allow (replica lock, run lock, combination integrity; `drop` waives the last one
        only: the caller drops the page for good). One answer per page, in order."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections (nothing is lost: the store holds metadata only)."""
