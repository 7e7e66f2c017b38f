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
  level over its cap demotes its least recent page one level down.
- **Decay**: after the sketch halves its counters (`sketch.resets` moved on), every page whose
  frequency now maps to a lower level moves down, to that level's most recent end.
- **Stale pages** (recency across levels): frequency says how often a page was used, not whether it
  is still in use. The pages of a conversation that ended were read every turn, so they sit in the
  upper levels while they will never be read again, and a plain frequency policy keeps them longer
  than LRU would: it loses to LRU on multi-turn traffic (bench/kv_hit_ratio.py, `sessions`). So the
  LRU also keeps each page's reuse history (first and last use, number of uses), and a page idle
  for more than `STALE_FACTOR` times its own mean reuse interval (once it has `MIN_ACCESSES` uses to
  measure one) is presumed finished: it leaves its level for the eviction end of cold (`is_stale`),
  whatever its frequency. A page used at random intervals stays idle that long with probability
  about e^-8 (0.03%), so a page still in use is rarely taken for a finished one; a page of a
  conversation that stopped after being read every few turns is. Touched again, it is placed by
  its frequency as any page.
- **Retention guard**: a stale page is evicted before the least recent page of the coldest level
  only if it has been idle at least `RETENTION_GUARD` (a quarter) as long as that page. In a cache
  big enough to keep pages for much longer than the stale page has been idle, the plain order's
  victim is the staler of the two, and evicting a page that merely paused would cost a hit.
- **The clock counts reuses**: idle times and reuse intervals are measured in uses of pages seen
  before (`clock`), not in all accesses, so a scan of one-off pages does not age anything: the
  frequent pages a long scan interrupts do not turn stale meanwhile and are not flushed by it.

The history is bounded (`HISTORY_FACTOR` x capacity records, least recently used forgotten first,
never an idle page's), so a page evicted and soon asked for again keeps its history, as it keeps
its sketch count.

Not done: a W-TinyLFU admission window (a small LRU in front, whose leaving page enters the levels
only if the sketch rates it above the levels' victim). Measured on the bench (quick run), a fixed
window of 1% to 50% of the capacity gains up to 2 points on Zipf but falls 4 to 17 points behind
LRU on `sessions` at 1,000 pages (a conversation's new pages are read once per turn and lose the
duel to pages of finished conversations, whose counts are high), and a 99% window only ties LRU.

Pinned pages (any tracker) are never here, so eviction needs no skipping: the slot engine removes a
page when it takes its first tracker and puts it back when the last one is released (that put
counts as the page's use).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterator

from flowrt.params.sketch import FrequencySketch

LEVELS = ("cold", "warm1", "warm2", "hot")
COLD, WARM1, WARM2, HOT = range(4)
LEVEL_FLOORS = (0, 2, 4, 8)  # the least sketch frequency of each level
# the most of the capacity each level may hold: cold is not capped, and the others together hold at
# most 60%, so that a new page (cold) survives a while before it must prove itself (bench/kv_hit_ratio)
LEVEL_SHARES = (1.0, 0.2, 0.2, 0.2)
# idle for more than this many of its mean reuse intervals: presumed finished (stale). Poisson reuse
# stays idle that long with probability e^-8. Measured from 6 to 16 (bench/kv_hit_ratio.py): from 12
# on, finished conversations are caught too late to beat LRU on multi-turn sessions at 1,000 pages;
# 6 takes more pages of a Zipf workload for finished; 8 costs Zipf at most 0.1 point.
STALE_FACTOR = 8
MIN_ACCESSES = 3  # uses (two reuse intervals) before a page's mean interval is trusted
RETENTION_GUARD = 0.25  # a stale page goes first only if idle >= this x the coldest page's idle time
HISTORY_FACTOR = 4  # reuse histories kept, per slot of capacity


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
    """Idle pages by level, least recent first in each, stale pages first (see the module docstring)."""

    def __init__(
        self,
        sketch: FrequencySketch,
        capacity: int,
        shares: tuple[float, ...] = LEVEL_SHARES,
        *,
        stale_factor: float | None = STALE_FACTOR,
        min_accesses: int = MIN_ACCESSES,
        retention_guard: float = RETENTION_GUARD,
    ) -> None:
        if len(shares) != len(LEVELS):
            raise ValueError(f"one share per level {LEVELS}, not {shares}")
        if min_accesses < 2:
            raise ValueError(f"a reuse interval needs at least 2 uses, not {min_accesses}")
        self.sketch = sketch
        self._levels: list[OrderedDict[str, None]] = [OrderedDict() for _ in LEVELS]
        self._level_of: dict[str, int] = {}
        # cold is never capped: it is where everything else is pushed down to
        self._caps = [capacity] + [max(1, int(share * capacity)) for share in shares[1:]]
        self._resets_seen = sketch.resets
        self.stale_factor = stale_factor  # None: no page is ever presumed finished
        self.min_accesses = min_accesses
        self.retention_guard = retention_guard
        self._stale: OrderedDict[str, None] = OrderedDict()  # the eviction end of cold, first stale first
        self.clock = 0  # uses of pages seen before (see the module docstring)
        self._history: OrderedDict[str, list[int]] = OrderedDict()  # key -> [first use, last use, uses]
        self._history_cap = HISTORY_FACTOR * max(capacity, 16)
        self._deadlines: list[tuple[float, int, str]] = []  # (stale from, last use then, key); lazy

    def __len__(self) -> int:
        return len(self._level_of) + len(self._stale)

    def __contains__(self, key: str) -> bool:
        return key in self._level_of or key in self._stale

    def level_of(self, key: str) -> int | None:
        if key in self._stale:
            return COLD
        return self._level_of.get(key)

    def is_stale(self, key: str) -> bool:
        """Whether idle page `key` is presumed finished (evicted before the levels' pages)."""
        self._expire()
        return key in self._stale

    def counts(self) -> dict[str, int]:
        """How many idle pages each level holds (stale pages are cold)."""
        counts = {name: len(level) for name, level in zip(LEVELS, self._levels, strict=True)}
        counts["cold"] += len(self._stale)
        return counts

    def put(self, key: str) -> None:
        """Record a use of `key` and place it (new or present) at the most recent end of the level
        of its frequency now."""
        self._follow_decay()
        self._record_use(key)
        self._stale.pop(key, None)
        level = level_for(self.sketch.frequency(key))
        old = self._level_of.get(key)
        if old is not None:
            del self._levels[old][key]
        self._levels[level][key] = None
        self._level_of[key] = level
        self._enforce_cap(level)

    def remove(self, key: str) -> bool:
        """Take `key` out (it was pinned or dropped); whether it was here. Its history stays."""
        if key in self._stale:
            del self._stale[key]
            return True
        level = self._level_of.pop(key, None)
        if level is None:
            return False
        del self._levels[level][key]
        return True

    def coldest(self) -> Iterator[str]:
        """Every idle page, the next to evict first (the order `pop_coldest` would take them in)."""
        self._follow_decay()
        self._expire()
        stale = list(self._stale)
        ordered = [key for level in self._levels for key in level]
        s = o = 0
        while s < len(stale) or o < len(ordered):
            if s < len(stale) and (o == len(ordered) or self._stale_goes_first(stale[s], ordered[o])):
                yield stale[s]
                s += 1
            else:
                yield ordered[o]
                o += 1

    def pop_coldest(self) -> str | None:
        """Remove and return the next page to evict (None when there is none)."""
        self._follow_decay()
        self._expire()
        victim = None
        for level in self._levels:
            if level:
                victim = next(iter(level))
                break
        if self._stale:
            first_stale = next(iter(self._stale))
            if victim is None or self._stale_goes_first(first_stale, victim):
                del self._stale[first_stale]
                return first_stale
        if victim is None:
            return None
        del self._levels[self._level_of.pop(victim)][victim]
        return victim

    # ── stale pages ──

    def _idle(self, key: str) -> float:
        record = self._history.get(key)
        return float("inf") if record is None else self.clock - record[1]

    def _stale_goes_first(self, stale: str, victim: str) -> bool:
        return self._idle(stale) >= self.retention_guard * self._idle(victim)

    def _record_use(self, key: str) -> None:
        history = self._history
        record = history.get(key)
        if record is None:  # a page never seen (or forgotten): its first use does not move the clock
            history[key] = [self.clock, self.clock, 1]
            self._trim_history()
            return
        self.clock += 1
        history.move_to_end(key)
        record[1] = self.clock
        record[2] += 1
        if self.stale_factor is not None and record[2] >= self.min_accesses:
            interval = (record[1] - record[0]) / (record[2] - 1)
            heapq.heappush(self._deadlines, (record[1] + self.stale_factor * interval, record[1], key))
            if len(self._deadlines) > 2 * self._history_cap:
                self._compact_deadlines()

    def _expire(self) -> None:
        """Move every idle page whose deadline passed (and was not used since) to the stale end."""
        deadlines, history, now = self._deadlines, self._history, self.clock
        while deadlines and deadlines[0][0] < now:
            _, last_use, key = heapq.heappop(deadlines)
            record = history.get(key)
            if record is None or record[1] != last_use:
                continue  # used since (a later deadline stands) or forgotten
            level = self._level_of.pop(key, None)
            if level is None:
                continue  # pinned (in use) or gone: not an eviction candidate
            del self._levels[level][key]
            self._stale[key] = None

    def _trim_history(self) -> None:
        history = self._history
        for _ in range(len(history)):
            if len(history) <= self._history_cap:
                return
            key, record = history.popitem(last=False)
            if key in self:  # an idle page keeps its history
                history[key] = record

    def _compact_deadlines(self) -> None:
        history = self._history
        self._deadlines = [
            entry for entry in self._deadlines if (record := history.get(entry[2])) is not None and record[1] == entry[1]
        ]
        heapq.heapify(self._deadlines)

    # ── levels ──

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
