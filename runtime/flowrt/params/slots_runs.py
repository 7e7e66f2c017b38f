"""The free slots of one tier as runs of consecutive slots (FlowKV's segment management).

A transfer between tiers copies one contiguous segment per run of consecutive slots, so the slot
engine asks this allocator for runs, not single slots: `take(n)` returns one run of n slots when a
free run that long exists (the smallest such: best fit, keeping long runs for long requests), else
the fewest runs (the longest first, the last one the smallest run that covers the rest). `give`
returns a slot and merges it with its free neighbours, so freed runs grow back together.

Runs are indexed by start, by end and by length; best fit looks at the distinct lengths only,
which are few (at most about the square root of twice the slot count).
"""

from __future__ import annotations


class FreeRuns:
    """The free slots of `0..slots-1` as maximal runs (all free at first)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.free = 0
        self._length_at: dict[int, int] = {}  # run start -> length
        self._start_ending_at: dict[int, int] = {}  # run end (exclusive) -> start
        self._starts_of_length: dict[int, set[int]] = {}
        self._add(0, slots)

    def __len__(self) -> int:
        """How many runs there are."""
        return len(self._length_at)

    def runs(self) -> list[tuple[int, int]]:
        """Every run as (start, length), in slot order."""
        return sorted(self._length_at.items())

    def is_free(self, slot: int) -> bool:
        return any(start <= slot < start + length for start, length in self._length_at.items())

    def take(self, wanted: int) -> list[int]:
        """Take `wanted` free slots (the caller checked that `free` suffices), in runs."""
        if wanted > self.free:
            raise ValueError(f"{wanted} slots asked of {self.free} free")
        taken: list[int] = []
        while wanted:
            fitting = [length for length in self._starts_of_length if length >= wanted]
            if fitting:
                length = min(fitting)
                take = wanted
            else:
                length = max(self._starts_of_length)
                take = length
            start = next(iter(self._starts_of_length[length]))  # sets of ints iterate the same every run
            self._remove(start)
            if length > take:
                self._add(start + take, length - take)
            taken.extend(range(start, start + take))
            wanted -= take
        return taken

    def give(self, slot: int) -> None:
        """Return one slot, merged with the free runs either side of it."""
        start, length = slot, 1
        before = self._start_ending_at.get(slot)
        if before is not None:
            length += self._remove(before)
            start = before
        if slot + 1 in self._length_at:
            length += self._remove(slot + 1)
        self._add(start, length)

    def _add(self, start: int, length: int) -> None:
        self._length_at[start] = length
        self._start_ending_at[start + length] = start
        self._starts_of_length.setdefault(length, set()).add(start)
        self.free += length

    def _remove(self, start: int) -> int:
        length = self._length_at.pop(start)
        del self._start_ending_at[start + length]
        starts = self._starts_of_length[length]
        starts.discard(start)
        if not starts:
            del self._starts_of_length[length]
        self.free -= length
        return length


def runs_of(slots: list[int]) -> list[tuple[int, int]]:
    """`slots` (in the given order) as (start, length) runs of consecutive slots: the segments a
    transfer of them copies."""
    runs: list[tuple[int, int]] = []
    for slot in slots:
        if runs and runs[-1][0] + runs[-1][1] == slot:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((slot, 1))
    return runs
