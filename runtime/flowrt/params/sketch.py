"""The TinyLFU frequency sketch of the slot engine: how often each page was asked for lately.

A count-min sketch (Cormode & Muthukrishnan) of small saturating counters, as TinyLFU (Einziger &
Friedman) and Caffeine's FrequencySketch use it: `depth` rows of `width` counters (a power of two at
least the tier's capacity), each key mapped to one counter per row by an independent hash; an
access increments the key's counters, the estimate is the smallest of them. The estimate never
falls below the true count of the current period (capped at `COUNTER_MAX`); it exceeds it only by
collisions, about `total / width` on average.

Two choices keep it small and fresh:

- Counters saturate at 15 (4 bits, held one per byte for speed): beyond that, the exact count does
  not change any decision of the four-level LRU (`lru.level_for` tops out at 8).
- **Periodic decay** ("reset"): after `sample_size` increments (10x the capacity by default, as
  Caffeine) every counter is halved, so a page that was hot an hour ago and is not asked for now
  cools down instead of squatting in the cache; `resets` counts the halvings so that the LRU can
  re-level its pages after one. Measured with the four levels (bench/kv_hit_ratio.py): periods of
  1x to 3x the capacity lose most of the lead over LRU on Zipf traffic, and 30x gains nothing on
  multi-turn sessions, so 10x stays.

What a sketch cannot tell is whether a page is *still* in use: the pages of a conversation that
ended keep the high counts of the turns that read them until decay wears them down, which is many
turns later. The four-level LRU (`lru`) answers that from each page's own reuse history (a page
idle for many times its usual reuse interval is stale and evicted first); the sketch only says how
often, and it is the only memory of pages that were evicted long ago.

Increments are *conservative* (only the counters equal to the minimum grow): the estimate stays an
upper bound of the true count, with less overestimation than incrementing every row.

Keys are hashed with BLAKE2b (8 bytes), never Python's salted `hash()`, so that every process of a
machine, and every run of a benchmark, puts a key in the same counters.
"""

from __future__ import annotations

import hashlib

COUNTER_MAX = 15
DEFAULT_DEPTH = 4
MIN_WIDTH = 16
SAMPLE_FACTOR = 10  # increments per decay period, per slot of capacity (Caffeine's choice)

_MASK64 = (1 << 64) - 1
# Odd 64-bit multipliers (from splitmix64 and the golden ratio), one per row: multiply-shift hashing
# of the key's 64-bit digest, the top bits of each product indexing one row.
_ROW_MULTIPLIERS = (
    0x9E3779B97F4A7C15,
    0xBF58476D1CE4E5B9,
    0x94D049BB133111EB,
    0xD6E8FEB86659FD93,
    0xC2B2AE3D27D4EB4F,
    0x165667B19E3779F9,
    0x27D4EB2F165667C5,
    0xFF51AFD7ED558CCD,
)
_HALVED = bytes(value >> 1 for value in range(256))  # bytes.translate table: every counter halved


def stable_hash(key: str) -> int:
    """A 64-bit hash of `key`, the same in every process and run."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


class FrequencySketch:
    """Estimated access counts of keys over the recent past (see the module docstring)."""

    def __init__(self, capacity: int, *, depth: int = DEFAULT_DEPTH, sample_size: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"a frequency sketch needs a capacity >= 1, not {capacity}")
        if not 1 <= depth <= len(_ROW_MULTIPLIERS):
            raise ValueError(f"a frequency sketch has 1 to {len(_ROW_MULTIPLIERS)} rows, not {depth}")
        self.capacity = capacity
        self.width = max(MIN_WIDTH, 1 << (capacity - 1).bit_length())
        self.depth = depth
        self.sample_size = sample_size if sample_size is not None else SAMPLE_FACTOR * max(capacity, MIN_WIDTH)
        self._shift = 64 - (self.width.bit_length() - 1)
        self._multipliers = _ROW_MULTIPLIERS[:depth]
        self._rows = [bytearray(self.width) for _ in range(depth)]
        self.additions = 0  # increments in the current period
        self.resets = 0  # how many times the counters were halved

    def _columns(self, key: str) -> list[int]:
        digest = stable_hash(key)
        shift = self._shift
        return [((digest * multiplier) & _MASK64) >> shift for multiplier in self._multipliers]

    def frequency(self, key: str) -> int:
        """The estimated count of `key` in the current period (0 to COUNTER_MAX)."""
        return min(row[column] for row, column in zip(self._rows, self._columns(key), strict=True))

    def increment(self, key: str) -> int:
        """Record one access of `key`; returns its new estimate."""
        columns = self._columns(key)
        rows = self._rows
        counts = [row[column] for row, column in zip(rows, columns, strict=True)]
        lowest = min(counts)
        if lowest >= COUNTER_MAX:
            return lowest
        for row, column, count in zip(rows, columns, counts, strict=True):
            if count == lowest:  # conservative update: only the counters that bound the estimate grow
                row[column] = count + 1
        self.additions += 1
        if self.additions >= self.sample_size:
            self.decay()
        return lowest + 1

    def decay(self) -> None:
        """Halve every counter (the periodic reset); the period's count halves too."""
        for index, row in enumerate(self._rows):
            self._rows[index] = bytearray(row.translate(_HALVED))
        self.additions //= 2
        self.resets += 1

    def clear(self) -> None:
        for row in self._rows:
            row[:] = bytes(self.width)
        self.additions = 0
