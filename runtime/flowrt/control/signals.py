"""What travels along control edges within a call: frames as ARRIVED, end of a stream as
SLOT_EOS, a frame or activation that will not happen as UNREACHABLE (with its reason).

`roots` is the diamond-root table (outermost first) of the frame: `(node, aid, yield index)`
entries appended by diamond roots, used by Rule C to key buckets. `seq` is the frame's SeqId
(contiguous per order source), `origin` identifies where an unreachability started, for the
(origin, node, group) deduplication that makes loops terminate.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

RootEntry = tuple[str, tuple, int]  # (node, aid, yield index)


class Kind(Enum):
    ARRIVED = "arrived"
    SLOT_EOS = "slot_eos"
    UNREACHABLE = "unreachable"


class Reason(Enum):
    EMPTY = "empty"
    ERROR = "error"
    CANCEL = "cancel"

    @classmethod
    def worst(cls, reasons) -> Reason:
        """The most serious of `reasons` (error > cancel > empty); empty when there are none."""
        worst = cls.EMPTY
        for reason in reasons:
            if reason is cls.ERROR:
                return reason
            if reason is cls.CANCEL:
                worst = reason
        return worst


@dataclass(slots=True)
class Signal:
    """Not frozen: a frozen dataclass pays an `object.__setattr__` per field (5x slower to build),
    and one is built per frame and edge. Nothing mutates a signal once sent."""

    kind: Kind
    field: str
    key: tuple  # the bucket key (activation id of the receiving group)
    slot: int
    value: object = None
    roots: tuple[RootEntry, ...] = ()
    seq: int = 0
    reason: Reason | None = None
    origin: tuple | None = None
