"""Routing around processes that are down (flowrt.control.shard_faults.Faults.pick): while the
first pick is up nothing moves, whatever else is down; a pick that is down goes to one that is
up, the same one for the same number; with every host down, the first pick (the work waits for
its restart)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flowrt.control.shard_faults import Faults


@given(st.lists(st.integers(1, 40), min_size=1, max_size=6, unique=True), st.integers(0, 2**32), st.data())
def test_only_what_a_down_process_held_moves(hosts, number, data):
    hosts = tuple(hosts)
    down = frozenset(data.draw(st.sets(st.sampled_from(hosts))))
    first = hosts[number % len(hosts)]
    picked = Faults.pick(hosts, number, down)
    assert Faults.pick(hosts, number, frozenset()) == first
    if first not in down or down == set(hosts):
        assert picked == first
    else:
        assert picked in hosts and picked not in down
    assert Faults.pick(hosts, number, down) == picked  # the same everywhere, every time
