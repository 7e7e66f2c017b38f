"""Credit recovery (weight throwing): knowing, without a message per activation, that a call
spread over several processes has nothing left to do (docs/design/decentralised.md).

The gateway starts a call with the whole credit, `Credit.ONE`. Every message that can start
work (an entry value, a frame, a signal) carries a share of its sender's credit; a process
holds the credit of the work it has been given and not finished; work that sends messages
splits what it holds among them (`Holding.give`); a process that has nothing left of a call
returns what it holds to the gateway (`Holding.release`), in one message per idle turn
rather than one per activation. Credit is never made or lost, only moved, so the gateway
holds all of it again (`Recovery.complete`) exactly when no process holds any, i.e. no work
is running and no message is on its way: the call is quiescent. A message lost with a dead
process loses its credit: that call never completes by credit, and the fault path ends it.

Shares are dyadic rationals, `numerator / 2**exponent` with Python's unbounded integers, so
halving never rounds and no depth of splitting (a loop that runs a million rounds) runs out of
precision; on the wire a share is two integers (`Credit.wire`), the numerator as bytes when it
outgrows 64 bits. Imports nothing of flowrt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

MAX_WIRE_EXPONENT = 1 << 20  # a share this small is refused on decoding: no honest sender splits that deep


class CreditError(ValueError):
    """A share that cannot be one: negative, non-dyadic, larger than the whole, or garbled."""


@dataclass(frozen=True, slots=True)
class Credit:
    """`numerator / 2**exponent`, normalised (one form per value): the numerator is odd, or the exponent is 0."""

    numerator: int
    exponent: int

    ONE: ClassVar[Credit]
    ZERO: ClassVar[Credit]

    @staticmethod
    def of(numerator: int, exponent: int) -> Credit:
        if numerator < 0 or exponent < 0:
            raise CreditError(f"credit is never negative: {numerator}/2**{exponent}")
        if numerator == 0:
            return ZERO
        shift = (numerator & -numerator).bit_length() - 1  # trailing zero bits
        shift = min(shift, exponent)
        return Credit(numerator >> shift, exponent - shift)

    def __add__(self, other: Credit) -> Credit:
        exponent = max(self.exponent, other.exponent)
        total = (self.numerator << (exponent - self.exponent)) + (other.numerator << (exponent - other.exponent))
        return Credit.of(total, exponent)

    def __sub__(self, other: Credit) -> Credit:
        exponent = max(self.exponent, other.exponent)
        left = (self.numerator << (exponent - self.exponent)) - (other.numerator << (exponent - other.exponent))
        if left < 0:
            raise CreditError(f"cannot take {other} from {self}")
        return Credit.of(left, exponent)

    def half(self) -> Credit:
        return Credit.of(self.numerator, self.exponent + 1)

    def __bool__(self) -> bool:
        return self.numerator != 0

    def __le__(self, other: Credit) -> bool:
        exponent = max(self.exponent, other.exponent)
        return (self.numerator << (exponent - self.exponent)) <= (other.numerator << (exponent - other.exponent))

    def __str__(self) -> str:
        return f"{self.numerator}/2**{self.exponent}"

    # ── the wire ──

    def wire(self) -> tuple[int | bytes, int]:
        """Two msgpack-able values: the numerator (an int, or big-endian bytes past 64 bits) and the exponent."""
        if self.numerator < 1 << 63:
            return self.numerator, self.exponent
        return self.numerator.to_bytes((self.numerator.bit_length() + 7) // 8, "big"), self.exponent

    @staticmethod
    def from_wire(numerator: object, exponent: object) -> Credit:
        """A share as a message carried it; CreditError for anything that is not one."""
        if isinstance(numerator, bytes):
            numerator = int.from_bytes(numerator, "big")
        if type(numerator) is not int or type(exponent) is not int or not 0 <= exponent <= MAX_WIRE_EXPONENT:
            raise CreditError(f"a credit is (numerator, exponent) with 0 <= exponent <= {MAX_WIRE_EXPONENT}")
        credit = Credit.of(numerator, exponent)
        if not credit <= ONE:
            raise CreditError(f"a share of a call's credit is at most 1, not {credit}")
        return credit


ONE = Credit(1, 0)
ZERO = Credit(0, 0)
Credit.ONE, Credit.ZERO = ONE, ZERO


class Holding:
    """The credit one process holds for one call: what its messages brought, less what it sent on."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = ZERO

    def take(self, share: Credit) -> None:
        """A message that may start work arrived with `share`."""
        self.held = self.held + share

    def give(self) -> Credit:
        """A share for a message this process sends: half of what it holds (it keeps the rest,
        so it can go on sending). A process holding nothing sends nothing that may start work."""
        if not self.held:
            raise CreditError("a process holding no credit of a call cannot start work in it")
        share = self.held.half()
        self.held = self.held - share
        return share

    def release(self) -> Credit:
        """Everything held, for the gateway: this process has nothing left to do in the call."""
        share, self.held = self.held, ZERO
        return share


class Recovery:
    """The gateway's side: the credit it handed out when the call started, and what came back."""

    __slots__ = ("returned", "started")

    def __init__(self) -> None:
        self.returned = ZERO
        self.started = False

    def start(self, messages: int) -> list[Credit]:
        """The shares of the call's first `messages` messages (its entry values), which add up to one."""
        if self.started or messages < 1:
            raise CreditError("a call starts once, with at least one message")
        self.started = True
        shares, left = [], ONE
        for _ in range(messages - 1):
            share = left.half()
            shares.append(share)
            left = left - share
        return [*shares, left]

    def back(self, share: Credit) -> bool:
        """A process returned `share`; whether the call is now complete. More than was handed
        out is a CreditError (a forged or replayed return)."""
        total = self.returned + share
        if not total <= ONE:
            raise CreditError(f"credit returned past the whole: {self.returned} + {share}")
        self.returned = total
        return self.complete

    @property
    def complete(self) -> bool:
        return self.returned == ONE
