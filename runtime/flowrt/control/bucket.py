"""The bucket state machine of one OR group for one key (DESIGN §4.1).

Slots are pending, received (a value, or for a stream slot a growing list closed by SLOT_EOS),
or unreachable with a reason. The bucket FIREs when every slot is resolved and one was
received; it is DEAD as soon as a critical slot is unreachable, or when every slot is resolved
and none was received. A direct group is the special case of one producer's frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flowrt.control.signals import Kind, Reason, RootEntry, Signal
from flowrt.tables import Group

PENDING, RECEIVED, UNREACHABLE = 0, 1, 2


@dataclass(slots=True)
class Outcome:
    fired: bool
    inputs: dict[str, object]
    reason: Reason | None
    roots: tuple[RootEntry, ...]
    seq: int
    origin: tuple | None


@dataclass
class Bucket:
    group: Group
    state: list[int] = field(default_factory=list)
    values: list[object] = field(default_factory=list)
    reasons: list[Reason | None] = field(default_factory=list)
    roots: tuple[RootEntry, ...] | None = None
    seq: int = 0
    origin: tuple | None = None

    def __post_init__(self) -> None:
        n = len(self.group.slots)
        self.state = [PENDING] * n
        self.values = [[] if s.stream else None for s in self.group.slots]
        self.reasons = [None] * n

    def offer(self, signal: Signal) -> Outcome | None:
        """Apply one signal; return the outcome once the bucket fires or dies, else None."""
        if self.roots is None:
            self.roots, self.seq = signal.roots, signal.seq
        if self.origin is None and signal.origin is not None:
            self.origin = signal.origin
        slot = signal.slot
        stream = self.group.slots[slot].stream
        if signal.kind is Kind.ARRIVED:
            if stream:
                self.values[slot].append(signal.value)  # type: ignore[union-attr]
            else:
                self.values[slot] = signal.value
                self.state[slot] = RECEIVED
        elif signal.kind is Kind.SLOT_EOS:
            self.state[slot] = RECEIVED if self.values[slot] else UNREACHABLE
            self.reasons[slot] = Reason.EMPTY
        elif self.state[slot] != RECEIVED:
            self.state[slot] = UNREACHABLE
            self.reasons[slot] = signal.reason or Reason.EMPTY
        return self._decide()

    def _decide(self) -> Outcome | None:
        slots = self.group.slots
        # DEAD when a field can no longer arrive: its only (critical) slot, or every slot of it,
        # is unreachable; the AND of the group needs every field
        state = self.state
        for indices in self.group.slots_by_field:
            for i in indices:
                if state[i] != UNREACHABLE:
                    break
            else:
                return self._dead(Reason.worst(r for i in indices if (r := self.reasons[i])))
        if PENDING in self.state:
            return None
        if RECEIVED not in self.state:
            return self._dead(Reason.worst(r for r in self.reasons if r))
        inputs: dict[str, object] = {}
        for i, s in enumerate(slots):
            if self.state[i] == RECEIVED and s.field not in inputs:
                inputs[s.field] = self.values[i]
        return Outcome(True, inputs, None, self.roots or (), self.seq, None)

    def _dead(self, reason: Reason | None) -> Outcome:
        return Outcome(False, {}, reason or Reason.EMPTY, self.roots or (), self.seq, self.origin)
