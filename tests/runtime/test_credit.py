"""Credit recovery (flowrt.control.credit), model-based: a hypothesis state machine runs a call
over a few simulated processes, messages delivered in any order, work that sends any number of
messages before it ends, loops that split credit hundreds of times, and returns batched per
process; the gateway's `Recovery.complete` must hold exactly when the obviously-right model (a
count of running work and messages in flight) says nothing is left, never before. Also the
arithmetic (exact, normalised) and the wire (round trip, garbage refused)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from flowrt.control.credit import ONE, ZERO, Credit, CreditError, Holding, Recovery

PROCESSES = 4


class CallOverProcesses(RuleBasedStateMachine):
    """The model: `running[p]` pieces of work at process p, `in_flight` messages (destination,
    share). The system: a Holding per process and the gateway's Recovery."""

    def __init__(self) -> None:
        super().__init__()
        self.recovery = Recovery()
        self.holdings = [Holding() for _ in range(PROCESSES)]
        self.running = [0] * PROCESSES
        self.in_flight: list[tuple[int, Credit]] = []
        self.started = False

    @rule(entries=st.integers(1, 3), data=st.data())
    @precondition(lambda self: not self.started)
    def start(self, entries: int, data) -> None:
        self.started = True
        shares = self.recovery.start(entries)
        assert sum(shares, ZERO) == ONE
        for share in shares:
            self.in_flight.append((data.draw(st.integers(0, PROCESSES - 1)), share))

    @rule(data=st.data())
    @precondition(lambda self: self.in_flight)
    def deliver(self, data) -> None:
        """Any message in flight arrives (any order): its process takes the share and runs work."""
        index = data.draw(st.integers(0, len(self.in_flight) - 1))
        destination, share = self.in_flight.pop(index)
        self.holdings[destination].take(share)
        self.running[destination] += 1

    @rule(data=st.data(), sends=st.integers(0, 3))
    @precondition(lambda self: any(self.running))
    def work_sends(self, data, sends: int) -> None:
        """A piece of running work sends messages to any processes (itself included)."""
        process = data.draw(st.sampled_from([p for p in range(PROCESSES) if self.running[p]]))
        for _ in range(sends):
            self.in_flight.append((data.draw(st.integers(0, PROCESSES - 1)), self.holdings[process].give()))

    @rule(rounds=st.integers(50, 400), data=st.data())
    @precondition(lambda self: any(self.running))
    def loop(self, rounds: int, data) -> None:
        """A loop: one message after another to the same process, each round splitting again."""
        process = data.draw(st.sampled_from([p for p in range(PROCESSES) if self.running[p]]))
        holding = self.holdings[process]
        for _ in range(rounds):
            holding.take(holding.give())  # sent to itself and taken back: credit is conserved at any depth
        self.in_flight.append((process, holding.give()))

    @rule(data=st.data())
    @precondition(lambda self: any(self.running))
    def work_ends(self, data) -> None:
        """A piece of work ends; a process with none left returns what it holds (one message)."""
        process = data.draw(st.sampled_from([p for p in range(PROCESSES) if self.running[p]]))
        self.running[process] -= 1
        if not self.running[process]:
            share = self.holdings[process].release()
            if share:
                self.recovery.back(share)

    @rule()
    def gateway_waits(self) -> None:
        """Nothing happens (the call may be over: every other rule needs work to do)."""

    @invariant()
    def complete_exactly_when_nothing_is_left(self) -> None:
        nothing_left = self.started and not self.in_flight and not any(self.running)
        assert self.recovery.complete == nothing_left, (self.recovery.returned, self.running, len(self.in_flight))

    @invariant()
    def credit_is_conserved(self) -> None:
        if self.started:
            total = (
                self.recovery.returned + sum((h.held for h in self.holdings), ZERO) + sum((s for _, s in self.in_flight), ZERO)
            )
            assert total == ONE


CallOverProcesses.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_completion_is_detected_exactly = CallOverProcesses.TestCase


@given(st.lists(st.integers(0, 2000), min_size=1, max_size=20))
def test_shares_add_exactly_and_stay_normalised(exponents):
    shares = [Credit.of(1, e) for e in exponents]
    total = sum(shares, ZERO)
    assert total.numerator % 2 == 1 or total.exponent == 0  # the one form of each value
    for share in shares:
        total = total - share
    assert total == ZERO and not total


@given(st.integers(0, 5000))
def test_the_wire_round_trips_any_share_and_refuses_garbage(depth):
    share = ONE
    for _ in range(depth):
        share = share.half()
    rest = ONE - share
    for credit in (share, rest):
        assert Credit.from_wire(*credit.wire()) == credit


@pytest.mark.parametrize(
    "wire",
    [(3, 1), (-1, 2), (1, -1), ("1", 0), (1.0, 0), (1, 2**21), (True, 0), (b"\x05", 2)],
)
def test_a_share_that_cannot_be_one_is_refused(wire):
    with pytest.raises(CreditError):
        Credit.from_wire(*wire)


def test_more_returned_than_handed_out_is_refused_and_nothing_can_be_sent_from_nothing():
    recovery = Recovery()
    first, second = recovery.start(2)
    assert not recovery.back(first)
    with pytest.raises(CreditError, match="past the whole"):
        recovery.back(first + first)  # a replayed or forged return
    assert recovery.back(second) and recovery.complete
    with pytest.raises(CreditError, match="holding no credit"):
        Holding().give()
