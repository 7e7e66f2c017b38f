"""The queue of an `lb session` node in one call (Omni-Flow Algorithm 1, with order keys).

A session node runs one activation at a time. Outside loops it is *ordered*: it holds its
activations and releases the one with the smallest order key once no work still in flight can
bring it an input with a smaller key; the call works that bound out (`Call._lower_bound`) and
passes it to `release`. Activations with equal keys go in arrival order. Inside a loop, where
keys repeat, it runs them in arrival order (FIFO).

Keys replace Algorithm 1's expected sequence number: a key has one level per streaming hop, so
"the next number" is not known in advance, but "nothing smaller can still come" is, and it also
passes over a key that never comes (a frame whose groups all died) without waiting.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from typing import Any


class Sequencer:
    __slots__ = ("ordered", "busy", "held", "fifo")

    def __init__(self, ordered: bool):
        self.ordered = ordered
        self.busy = False  # an activation released by this queue is running
        self.held: list = []  # ordered: a heap of (order key, ticket, activation)
        self.fifo: deque = deque()

    def hold(self, act: Any, order: tuple, ticket: int) -> None:
        if self.ordered:
            heappush(self.held, (order, ticket, act))
        else:
            self.fifo.append(act)

    def release(self, bound: tuple | None) -> Any:
        """The activation to start now, if one may: none while one runs; ordered, the held one
        with the smallest key if no smaller key can still come (`bound`: the smallest key that
        can, None if none can); FIFO, the oldest."""
        if self.busy:
            return None
        if self.ordered:
            held = self.held
            if not held or (bound is not None and held[0][0] > bound):
                return None
            self.busy = True
            return heappop(held)[2]
        if not self.fifo:
            return None
        self.busy = True
        return self.fifo.popleft()

    def finished(self) -> None:
        """The activation it released has ended."""
        self.busy = False

    def waiting(self) -> int:
        return len(self.held) + len(self.fifo)
