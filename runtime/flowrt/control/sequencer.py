"""Order preservation at `lb session` nodes (Omni-Flow Algorithm 1), per (session, call, interface).

In ordered mode activations are released strictly by the SeqId of their input frames: the
one with the expected SeqId runs, and the expected SeqId advances once every OR group of the
node has settled (fired and finished, or DEAD) for it, and on past every later SeqId that
settled before its turn (a frame whose groups all died early). In FIFO mode (inputs without one
common order source, or the node sits in a loop) activations run one at a time in arrival
order. Either way one activation runs at a time. `release_stalled` lets a call that went idle
skip a SeqId that can no longer arrive, so a gap never hangs a call.

Each method returns the activation to start now, if one may start, else None.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class Sequencer:
    __slots__ = ("groups", "ordered", "expected", "busy", "pending", "settled", "done_ahead", "fifo")

    def __init__(self, groups: int, ordered: bool):
        self.groups = groups
        self.ordered = ordered
        self.expected = 0
        self.busy = False
        self.pending: dict[int, deque] = {}  # SeqId -> activations waiting for their turn
        self.settled: dict[int, set[int]] = {}  # SeqId -> groups done with it
        self.done_ahead: set[int] = set()  # SeqIds every group settled before their turn
        self.fifo: deque = deque()

    def ready(self, seq: int, act: Any) -> Any:
        if self.ordered:
            queue = self.pending.get(seq)
            if queue is None:
                queue = self.pending[seq] = deque()
            queue.append(act)
        else:
            self.fifo.append(act)
        return self._advance()

    def settle(self, seq: int, group: int, ran: bool) -> Any:
        """Group `group` is done for `seq` (`ran`: an activation finished, else it was DEAD)."""
        if ran:
            self.busy = False
        if self.ordered:
            settled = self.settled.get(seq)
            if settled is None:
                settled = self.settled[seq] = set()
            settled.add(group)
            if len(settled) >= self.groups and not self.pending.get(seq):
                del self.settled[seq]
                self.pending.pop(seq, None)
                if seq == self.expected:
                    self._next()
                elif seq > self.expected:
                    self.done_ahead.add(seq)
        return self._advance()

    def _next(self) -> None:
        """The expected SeqId is done: expect the next one not done already."""
        expected = self.expected + 1
        while expected in self.done_ahead:
            self.done_ahead.discard(expected)
            expected += 1
        self.expected = expected

    def _advance(self) -> Any:
        if self.busy:
            return None
        if not self.ordered:
            if self.fifo:
                self.busy = True
                return self.fifo.popleft()
            return None
        queue = self.pending.get(self.expected)
        if queue:
            self.busy = True
            return queue.popleft()
        return None

    def release_stalled(self) -> Any:
        """When nothing else can happen: move on to the smallest SeqId still waiting."""
        if self.busy or not self.ordered:
            return None
        waiting = [s for s, q in self.pending.items() if q]
        if not waiting:
            return None
        self.expected = min(waiting)
        self.done_ahead = {s for s in self.done_ahead if s > self.expected}
        return self._advance()
