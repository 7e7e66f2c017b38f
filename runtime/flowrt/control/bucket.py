"""The bucket state machine of one OR group for one key (DESIGN §4.1; docs/runtime.md rule 4).

Slots are pending, received (a value, or for a stream slot a growing list closed by its end
of stream), or unreachable with a reason. Each offer returns what the bucket became: still
WAITING, FIRED (every slot resolved and one received; `inputs()` gives the values) or DEAD
(every slot of some field unreachable, a critical slot being the one-slot case, or every slot
resolved with none received; `reason` says why).

A bucket's order key (docs/runtime.md, rule 7) is the smallest key among the frames that
arrived in it; until it closes, that is the smallest key its activation can have.
"""

from __future__ import annotations

from flowrt.control.program import GroupProgram
from flowrt.control.signals import Reason

PENDING, RECEIVED, UNREACHABLE = 0, 1, 2
WAITING, FIRED, DEAD = 0, 1, 2


class Bucket:
    __slots__ = ("group", "state", "values", "reasons", "roots", "order", "closed", "origin", "reason")

    def __init__(self, group: GroupProgram, roots: tuple):
        self.group = group
        self.state = [PENDING] * group.size
        self.values: list = [[] if stream else None for stream in group.stream_slots]
        self.reasons: list = [None] * group.size
        self.roots = roots  # the key's first signal decides the roots the activation inherits
        self.order: tuple | None = None  # the smallest order key that arrived
        self.closed = False
        self.origin: tuple | None = None  # where the first unreachability came from
        self.reason: Reason | None = None  # why it died

    def arrived(self, slot: int, value: object, order: tuple) -> int:
        if self.order is None or order < self.order:
            self.order = order
        if self.group.stream_slots[slot]:
            self.values[slot].append(value)
            return WAITING  # a stream slot resolves at its end of stream
        self.values[slot] = value
        self.state[slot] = RECEIVED
        return self._decide()

    def ended(self, slot: int) -> int:
        """The stream feeding `slot` ended: received if it delivered frames, else unreachable."""
        self.state[slot] = RECEIVED if self.values[slot] else UNREACHABLE
        self.reasons[slot] = Reason.EMPTY
        return self._decide()

    def unreachable(self, slot: int, reason: Reason, origin: tuple | None) -> int:
        if self.origin is None:
            self.origin = origin
        if self.state[slot] != RECEIVED:
            self.state[slot] = UNREACHABLE
            self.reasons[slot] = reason
        return self._decide()

    def _decide(self) -> int:
        state = self.state
        # DEAD when a field can no longer arrive: its only (critical) slot, or every slot of it,
        # is unreachable; the AND of the group needs every field
        for indices in self.group.slots_by_field:
            for i in indices:
                if state[i] != UNREACHABLE:
                    break
            else:
                self.reason = Reason.worst([self.reasons[i] for i in indices])
                return DEAD
        if PENDING in state:
            return WAITING
        if RECEIVED not in state:
            self.reason = Reason.worst(self.reasons)
            return DEAD
        return FIRED

    def received(self, slot: int) -> bool:
        """Whether `slot` holds what the activation gets (a value, or a stream's frames)."""
        return self.state[slot] == RECEIVED

    def order_bound(self) -> tuple | None:
        """The smallest order key the activation of this bucket can have (None once closed)."""
        return None if self.closed else self.order

    def inputs(self) -> dict[str, object]:
        """A fired bucket's values: per field, the first of its slots that received one."""
        inputs: dict[str, object] = {}
        fields = self.group.fields
        for i, state in enumerate(self.state):
            if state == RECEIVED and fields[i] not in inputs:
                inputs[fields[i]] = self.values[i]
        return inputs
