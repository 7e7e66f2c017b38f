"""The four-level frequency-aware LRU of the slot engine: which idle page to evict next.

It holds the *idle* pages of one tier (resident, no tracker: see `slots`), each in one of four
levels, each level an LRU (an OrderedDict, least recent first):

| level | sketch frequency | what lands there |
|---|---|---|
| cold  | 0-1  | pages asked for once lately: one-off scans, first turns |
| warm1 | 2-3  | pages asked for again |
| warm2 | 4-7  | pages of a busy prefix |
| hot   | 8+   | system prompts, shared prefixes (the 4-bit counters stop at 15) |

The thresholds are powers of two because the sketch's decay halves counts: one halving moves a page
that stopped being asked for exactly one level down.

- A page enters (or, touched, moves to) the most recent end of the level of its frequency now.
- **Eviction always takes the least recent page of the coldest non-empty level**: a scan of one-off
  pages only ever displaces other cold pages, and a page asked for often survives a burst of new
  ones (TinyLFU's admission, done by placement: the sketch remembers pages that were evicted, so a
  page coming back enters above cold).
- **Caps**: warm1, warm2 and hot may each hold at most a share of the capacity (`LEVEL_SHARES`); a
  level over its cap demotes its least recent page one level down. Together with decay, this keeps
  the pages of a conversation that ended from squatting in the upper levels: newer frequent pages
  push them down to cold, where they are evicted first.
- **Decay**: after the sketch halves its counters (`sketch.resets` moved on), every page whose
  frequency now maps to a lower level moves down, to that level's most recent end.

Pinned pages (any tracker) are never here, so eviction needs no skipping: the slot engine removes a
page when it takes its first tracker and puts it back when the last one is released.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from flowrt.params.sketch import FrequencySketch

LEVELS = ("cold", "warm1", "warm2", "hot")
COLD, WARM1, WARM2, HOT = range(4)
LEVEL_FLOORS = (0, 2, 4, 8)  # the least sketch frequency of each level
# the most of the capacity each level may hold: cold is not capped, and the others together hold at
# most 60%, so that a new page (cold) survives a while before it must prove itself (bench/kv_hit_ratio)
LEVEL_SHARES = (1.0, 0.2, 0.2, 0.2)


def level_for(frequency: int) -> int:
    """The level of a page with this sketch frequency."""
    if frequency >= LEVEL_FLOORS[HOT]:
        return HOT
    if frequency >= LEVEL_FLOORS[WARM2]:
        return WARM2
    if frequency >= LEVEL_FLOORS[WARM1]:
        return WARM1
    return COLD


class FrequencyLRU:
    """Idle pages by level, least recent first in each (see the module docstring)."""

    def __init__(self, sketch: FrequencySketch, capacity: int, shares: tuple[float, ...] = LEVEL_SHARES) -> None:
        if len(shares) != len(LEVELS):
            raise ValueError(f"one share per level {LEVELS}, not {shares}")
        self.sketch = sketch
        self._levels: list[OrderedDict[str, None]] = [OrderedDict() for _ in LEVELS]
        self._level_of: dict[str, int] = {}
        # cold is never capped: it is where everything else is pushed down to
        self._caps = [capacity] + [max(1, int(share * capacity)) for share in shares[1:]]
        self._resets_seen = sketch.resets

    def __len__(self) -> int:
        return len(self._level_of)

    def __contains__(self, key: str) -> bool:
        return key in self._level_of

    def level_of(self, key: str) -> int | None:
        return self._level_of.get(key)

    def counts(self) -> dict[str, int]:
        """How many idle pages each level holds."""
        return {name: len(level) for name, level in zip(LEVELS, self._levels, strict=True)}

    def put(self, key: str) -> None:
        """Place `key` (new or present) at the most recent end of the level of its frequency now."""
        self._follow_decay()
        level = level_for(self.sketch.frequency(key))
        old = self._level_of.get(key)
        if old is not None:
            del self._levels[old][key]
        self._levels[level][key] = None
        self._level_of[key] = level
        self._enforce_cap(level)

    def remove(self, key: str) -> bool:
        """Take `key` out (it was pinned or dropped); whether it was here."""
        level = self._level_of.pop(key, None)
        if level is None:
            return False
        del self._levels[level][key]
        return True

    def coldest(self) -> Iterator[str]:
        """Every idle page, the next to evict first (coldest level, least recent within it)."""
        self._follow_decay()
        for level in self._levels:
            yield from list(level)

    def pop_coldest(self) -> str | None:
        """Remove and return the next page to evict (None when there is none)."""
        self._follow_decay()
        for level in self._levels:
            if level:
                key, _ = level.popitem(last=False)
                del self._level_of[key]
                return key
        return None

    def _enforce_cap(self, level: int) -> None:
        # a level over its cap pushes its least recent page one level down, which may cascade
        while level > COLD and len(self._levels[level]) > self._caps[level]:
            key, _ = self._levels[level].popitem(last=False)
            self._levels[level - 1][key] = None
            self._level_of[key] = level - 1
            level -= 1

    def _follow_decay(self) -> None:
        if self.sketch.resets == self._resets_seen:
            return
        self._resets_seen = self.sketch.resets
        frequency = self.sketch.frequency
        for level in range(WARM1, len(LEVELS)):
            for key in list(self._levels[level]):
                lower = level_for(frequency(key))
                if lower < level:
                    del self._levels[level][key]
                    self._levels[lower][key] = None
                    self._level_of[key] = lower
