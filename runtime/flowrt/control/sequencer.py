"""Order preservation at `lb session` nodes (Omni-Flow Algorithm 1), per (session, call, interface).

In `ordered` mode activations are released strictly by the SeqId of their input frames: the
one with the expected SeqId runs, and the expected SeqId advances once every OR group of the
node has settled (fired and finished, or DEAD) for it. In `fifo` mode (inputs without one
common order source, or the node sits in a loop) activations run one at a time in arrival order.
Either way one activation runs at a time. `release_stalled` lets a call that went idle skip a
SeqId that can no longer arrive, so a gap never hangs a call.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

Runner = Callable[[], None]


@dataclass
class Sequencer:
    groups: int
    ordered: bool
    expected: int = 0
    busy: bool = False
    pending: dict[int, deque[tuple[int, Runner]]] = field(default_factory=lambda: defaultdict(deque))
    settled: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    fifo: deque[Runner] = field(default_factory=deque)

    def ready(self, seq: int, group: int, runner: Runner) -> None:
        if self.ordered:
            self.pending[seq].append((group, runner))
        else:
            self.fifo.append(runner)
        self._advance()

    def settle(self, seq: int, group: int, ran: bool) -> None:
        """Group `group` is done for `seq` (`ran`: an activation finished, else it was DEAD)."""
        if ran:
            self.busy = False
        if self.ordered:
            self.settled[seq].add(group)
            if len(self.settled[seq]) >= self.groups and not self.pending.get(seq):
                self.settled.pop(seq, None)
                self.pending.pop(seq, None)
                if seq == self.expected:
                    self.expected += 1
        self._advance()

    def _advance(self) -> None:
        if self.busy:
            return
        if not self.ordered:
            if self.fifo:
                self.busy = True
                self.fifo.popleft()()
            return
        queue = self.pending.get(self.expected)
        if queue:
            self.busy = True
            queue.popleft()[1]()

    def release_stalled(self) -> bool:
        """When nothing else can happen: move on to the smallest SeqId still waiting."""
        if self.busy or not self.ordered:
            return False
        waiting = [s for s, q in self.pending.items() if q]
        if not waiting:
            return False
        self.expected = min(waiting)
        self._advance()
        return True

    @property
    def idle(self) -> bool:
        return not self.busy and not self.fifo and not any(self.pending.values())
