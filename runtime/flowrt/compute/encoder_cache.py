"""The encoder cache (DESIGN §7, Omni-Flow §5.1): an encoder's outputs across requests, keyed by
the content hash of the raw payload (an image's bytes, its URL, base64 text), so a request that
sends a payload already encoded skips the encoder's forward.

- **LRU, bounded twice**: at most `max_entries` outputs and `max_bytes` bytes of them; the least
  recently used go first. An output larger than `max_bytes` on its own is returned, not kept.
- **In-flight dedup**: requests for a payload being encoded wait for that one forward instead of
  starting their own. The forward runs in a task of its own, so a requester that is cancelled
  does not cancel it for the others (and its output is still kept). A forward that raises is
  not cached: every waiter gets the error, the next request tries again.
- `statistics()`: hits, misses (forwards started), joins (requests that waited for one in
  flight), evictions, failures, oversized, and the entries and bytes held.

Outputs are shared between requests: treat them as read-only. One event loop, like the pool.
Any value works; its size comes from `sizeof` (default: torch tensors, numpy arrays, bytes).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import asdict, dataclass
from typing import Any

from flowrt.errors import FlowrtError

DEFAULT_CACHE_BYTES = 256 << 20
DEFAULT_CACHE_ENTRIES = 1024


class EncoderCacheError(FlowrtError, ValueError):
    """An encoder cache set up or used wrongly (a bad bound, a value whose size is unknown)."""


def default_sizeof(value: Any) -> int:
    """Bytes of an encoder output: torch tensors, numpy arrays, bytes-like values."""
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        return int(value.element_size() * value.numel())
    if hasattr(value, "nbytes"):
        return int(value.nbytes)
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    raise EncoderCacheError(
        f"the encoder cache cannot tell the size of a {type(value).__name__}: return a tensor or array, "
        f"or give EncoderCache(sizeof=...)"
    )


@dataclass
class EncoderCacheCounters:
    hits: int = 0
    misses: int = 0  # forwards started
    joins: int = 0  # requests that waited for a forward already running
    evictions: int = 0
    failures: int = 0  # forwards that raised
    oversized: int = 0  # outputs larger than max_bytes: returned, not kept


class EncoderCache:
    """An LRU of encoder outputs with in-flight dedup (see the module docstring)."""

    def __init__(
        self,
        max_bytes: int = DEFAULT_CACHE_BYTES,
        max_entries: int = DEFAULT_CACHE_ENTRIES,
        *,
        name: str = "encoder",
        sizeof: Callable[[Any], int] = default_sizeof,
    ) -> None:
        for what, bound in (("max_bytes", max_bytes), ("max_entries", max_entries)):
            if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
                raise EncoderCacheError(f"EncoderCache({what}={bound!r}): a bound is an int >= 0 (0 keeps nothing)")
        self.name = name
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.sizeof = sizeof
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._in_flight: dict[Hashable, asyncio.Task] = {}
        self.bytes = 0
        self.counters = EncoderCacheCounters()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def state(self, key: Hashable) -> str:
        """What `get(key)` would do now: "hit" (cached), "join" (a forward for it is running) or
        "miss" (it would start one)."""
        return "hit" if key in self._entries else "join" if key in self._in_flight else "miss"

    def peek(self, key: Hashable) -> Any | None:
        """The cached output for `key` (None: not cached), counted as neither hit nor miss."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    async def get(self, key: Hashable, encode: Callable[[], Awaitable[Any] | Any]) -> Any:
        """The output for `key`: cached (a hit), or awaited from the forward already running for it
        (a join), or from `encode()` (a miss; sync or async), which is then kept."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.counters.hits += 1
            return entry[0]
        task = self._in_flight.get(key)
        if task is not None:
            self.counters.joins += 1
        else:
            self.counters.misses += 1
            task = asyncio.ensure_future(self._run(key, encode))
            self._in_flight[key] = task
            task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    async def _run(self, key: Hashable, encode: Callable[[], Awaitable[Any] | Any]) -> Any:
        try:
            value = encode()
            if inspect.isawaitable(value):
                value = await value
        except BaseException:
            self.counters.failures += 1
            raise
        else:
            self._keep(key, value)
            return value
        finally:
            self._in_flight.pop(key, None)

    def _keep(self, key: Hashable, value: Any) -> None:
        size = self.sizeof(value)
        if size > self.max_bytes or self.max_entries == 0:
            self.counters.oversized += 1
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._entries[key] = (value, size)
        self.bytes += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped
            self.counters.evictions += 1

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def statistics(self) -> dict:
        return {
            "name": self.name,
            **asdict(self.counters),
            "entries": len(self._entries),
            "bytes": self.bytes,
            "in_flight": len(self._in_flight),
            "max_entries": self.max_entries,
            "max_bytes": self.max_bytes,
        }


def _retrieve(task: asyncio.Task) -> None:
    """Fetch a finished forward's exception, so one nobody waited for (all its requesters were
    cancelled) is not reported as never retrieved; the requesters that did wait got it."""
    if not task.cancelled():
        task.exception()
