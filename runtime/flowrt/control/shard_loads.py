"""`lb load_aware` for calls spread over processes (flowrt.control.shards): which replica a
frame that fires a load-aware role's one-slot group goes to.

Every process that sends such work keeps, per replica process, what it has sent there and not
heard end: the replica process counts the work each sender gave it (by call and node) and, as
each of those activations ends, tells that sender (LOAD_DONE; one message per load-aware
activation, off the data path). The sender picks the replica up with the lowest score,
`max(its own count there, what the replica last reported)`, ties in turn; "reported" is the
replica's heartbeat (queued + running), which only the gateway reads, so a process other than
the gateway balances by its own count alone. A process that goes down takes its counts with it.

Owned by `Shards` (`shards.loads`); imports only flowrt.control's own modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flowrt.control.envelopes import LOAD_DONE, Envelope


class Loads:
    def __init__(self, shards: Any):
        self.shards = shards
        self.sent: dict[int, int] = {}  # process -> load-aware activations this one sent it, not heard end
        self.given: dict[tuple[int, int], list[int]] = {}  # (call, node) -> the senders of its load-aware work here
        self.reported: Callable[[int], float] = lambda process: 0.0  # the gateway's: what a heartbeat said

    def pick(self, hosts: tuple[int, ...], turn: int, down: frozenset[int]) -> int:
        """The replica process up with the lowest score; among equals, the first from `turn` on."""
        up = [host for host in hosts if host not in down] or list(hosts)
        start = turn % len(up)
        return min(up[start:] + up[:start], key=self.score)

    def score(self, process: int) -> float:
        return max(self.sent.get(process, 0), self.reported(process))

    def sending(self, process: int) -> None:
        self.sent[process] = self.sent.get(process, 0) + 1

    def given_by(self, call_id: int, node: int, sender: int) -> None:
        """Load-aware work of `node` in call `call_id` came from `sender` (this process: itself)."""
        self.given.setdefault((call_id, node), []).append(sender)

    def ended(self, call_id: int, node: int) -> None:
        """An activation of load-aware `node` ended here: tell a sender of its work."""
        senders = self.given.get((call_id, node))
        if not senders:
            return  # (work of a bucket, not a fire: nobody counts it)
        sender = senders.pop(0)
        if not senders:
            del self.given[(call_id, node)]
        self._tell(sender)

    def closed(self, call_id: int) -> None:
        """The call is over here: work of it that never ran is no load any more."""
        for key in [key for key in self.given if key[0] == call_id]:
            for sender in self.given.pop(key):
                self._tell(sender)

    def done(self, process: int) -> None:
        """`process` says one of the activations this one sent it has ended."""
        left = self.sent.get(process, 0) - 1
        if left > 0:
            self.sent[process] = left
        else:
            self.sent.pop(process, None)

    def forget(self, process: int) -> None:
        """`process` went down: what it ran is not coming back to be counted."""
        self.sent.pop(process, None)

    def _tell(self, sender: int) -> None:
        shards = self.shards
        if sender == shards.me:
            self.done(sender)
        else:
            shards.send(sender, Envelope(0, "", "", shards.me, LOAD_DONE, (), None))

    def statistics(self) -> dict[str, int]:
        return {"load_sent": sum(self.sent.values()), "load_given": sum(map(len, self.given.values()))}
