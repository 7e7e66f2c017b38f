"""The metadata stores (flowrt.params.meta), one suite over the embedded store and the machine's
real Redis (a namespace per test, deleted after): layouts and candidate combinations,
publishing and prefix matching, liveness, locks and the three eviction guards."""

from __future__ import annotations

import pytest

from flowrt.params.meta import (
    EVICTED,
    LAST_REPLICA,
    NOT_PROVIDER,
    REPLICA_LOCK,
    RUN_LOCK,
    MetaError,
    Provider,
)
from tests.params.test_meta_helpers import FID, FULL, KID, VID, K, V, open_kind, wait_until

LONG = 60.0
PAGES = [f"h{i:04d}" for i in range(8)]


@pytest.fixture(params=["embedded", "redis"])
def store(request):
    with open_kind(request.param) as store:
        store.register_layout(FULL)
        yield store


def reasons(answers):
    return [a.reason for a in answers]


# ── layouts and combinations ──


def test_layouts_are_stored_by_id_and_parts_need_their_full_layout(store):
    assert store.layout(FID) == FULL and store.layout("0" * 16) is None
    other = FULL.part(sub_names=["0"]).__class__("other", ("0",), ("k",), 16)
    with pytest.raises(MetaError, match="no registered full layout covers it; register_layout the full layout first"):
        store.register_node("A", [other], LONG)
    with pytest.raises(MetaError, match="without '|'"):
        store.register_node("A|B", [K], LONG)


def test_node_with_k_and_node_with_v_form_the_combination_that_covers(store):
    store.register_node("A", [K], LONG)
    assert store.combinations(FID) == []  # k alone covers no page
    store.register_node("B", [V], LONG)
    assert store.combinations(FID) == [tuple(sorted((KID, VID)))]
    store.register_node("F", [FULL], LONG)
    assert store.combinations(FID) == [(FID,), tuple(sorted((KID, VID)))]  # size first
    store.unregister_node("F")
    assert store.combinations(FID) == [tuple(sorted((KID, VID)))]


# ── publishing and prefix matching ──


def test_match_returns_the_longest_prefix_of_the_chain(store):
    store.register_node("F", [FULL], LONG)
    assert store.publish("F", "s", FID, PAGES[:5], LONG) == 5
    assert store.chain(FID, "s") == PAGES[:5]
    assert store.match("s", FID, PAGES[:3] + ["x"]).length == 3
    assert store.match("s", FID, [PAGES[0], "x", *PAGES[2:5]]).length == 1
    found = store.match("s", FID, PAGES)
    assert (found.length, found.chain_length) == (5, 5)
    assert found.providers(4) == (Provider("F", FID),)
    assert store.match("other", FID, PAGES).length == 0
    assert store.match("s", FID, []).length == 0


def test_publishing_appends_and_a_changed_history_cuts_the_chain(store):
    store.register_node("F", [FULL], LONG)
    store.publish("F", "s", FID, PAGES[:3], LONG)
    assert store.publish("F", "s", FID, PAGES[3:5], LONG) == 5  # appended
    assert store.publish("F", "s", FID, PAGES[1:3], LONG, start=1) == 5  # the same pages again: no change
    assert store.publish("F", "s", FID, ["y2", "y3"], LONG, start=2) == 4  # history changed at page 2
    assert store.chain(FID, "s") == PAGES[:2] + ["y2", "y3"]
    with pytest.raises(MetaError, match=r"session s has 4 pages: cannot publish from page 6 \(a gap\)"):
        store.publish("F", "s", FID, ["z"], LONG, start=6)
    with pytest.raises(MetaError, match="node G does not hold layout .* register_node first"):
        store.publish("G", "s", FID, ["z"], LONG)


def test_an_expired_tail_is_cut_from_the_chain(store):
    store.register_node("F", [FULL], LONG)
    store.publish("F", "s", FID, PAGES[:3], LONG)
    store.publish("F", "s", FID, PAGES[3:6], 0.3)  # a shorter-lived tail
    assert store.match("s", FID, PAGES).length == 6
    found = wait_until(lambda: (m := store.match("s", FID, PAGES)).length == 3 and m, 5, "the tail expiring")
    assert found.chain_length == 3 and store.chain(FID, "s") == PAGES[:3]


def test_a_dead_provider_stops_the_match_at_its_first_page(store):
    store.register_node("A", [K], LONG)
    store.register_node("B", [V], LONG)
    store.register_node("C", [V], 0.3)
    store.publish("A", "s", KID, PAGES[:6], LONG)
    store.publish("B", "s", VID, PAGES[:2], LONG, start=0)
    store.publish("C", "s", VID, PAGES[:6], LONG, start=0)
    assert store.match("s", FID, PAGES[:6]).length == 6
    wait_until(lambda: not store.node_alive("C"), 5, "node C lapsing")
    found = store.match("s", FID, PAGES[:6])
    assert found.length == 2 and found.chain_length == 6  # the pages are there, their v provider is not
    assert found.providers(1) == tuple(sorted((Provider("A", KID), Provider("B", VID)), key=lambda p: p.layout_id))
    assert not store.heartbeat("C", LONG)  # a lapsed node registers again
    store.register_node("C", [V], LONG)
    assert store.match("s", FID, PAGES[:6]).length == 6
    store.unregister_node("A")
    assert store.match("s", FID, PAGES[:6]).length == 0


def test_provider_choice_prefers_the_node_covering_more_pages(store):
    store.register_node("A", [K], LONG)
    store.register_node("B", [V], LONG)
    store.register_node("C", [V], LONG)
    store.publish("A", "s", KID, PAGES, LONG)
    store.publish("B", "s", VID, PAGES[:3], LONG, start=0)  # B: fewer pages ("B" < "C" by name)
    store.publish("C", "s", VID, PAGES, LONG, start=0)
    found = store.match("s", FID, PAGES)
    assert found.length == 8 and len(found.segments) == 1
    assert set(found.segments[0].providers) == {Provider("A", KID), Provider("C", VID)}
    # a full replica of the first pages: a combination of one wins where it provides
    store.register_node("F", [FULL], LONG)
    store.publish("F", "s", FID, PAGES[:4], LONG, start=0)
    found = store.match("s", FID, PAGES)
    assert [(s.start, s.stop) for s in found.segments] == [(0, 4), (4, 8)]
    assert found.providers(0) == (Provider("F", FID),)
    assert set(found.providers(5)) == {Provider("A", KID), Provider("C", VID)}


def test_a_page_with_only_half_its_layout_does_not_match(store):
    store.register_node("A", [K], LONG)
    store.register_node("B", [V], LONG)
    store.publish("A", "s", KID, PAGES[:4], LONG)
    store.publish("B", "s", VID, PAGES[:2], LONG, start=0)
    assert store.match("s", FID, PAGES[:4]).length == 2


# ── locks and eviction ──


def test_a_session_run_lock_stops_eviction_until_released_or_expired(store):
    store.register_node("F", [FULL], LONG)
    store.register_node("G", [FULL], LONG)
    store.publish("F", "s", FID, PAGES[:2], LONG)
    store.publish("G", "s", FID, PAGES[:2], LONG, start=0)
    store.lock_run("s", "req-1", LONG)
    assert reasons(store.evict("F", FID, PAGES[:2])) == [RUN_LOCK, RUN_LOCK]
    store.unlock_run("s", "req-1")
    assert reasons(store.evict("F", FID, PAGES[:1])) == [EVICTED]
    store.lock_run("s", "req-2", 0.3)
    assert reasons(store.evict("F", FID, PAGES[1:2])) == [RUN_LOCK]
    wait_until(lambda: store.evict("F", FID, PAGES[1:2])[0].reason == EVICTED, 5, "the run lock expiring")
    assert reasons(store.evict("F", FID, PAGES[:2])) == [NOT_PROVIDER, NOT_PROVIDER]
    assert store.match("s", FID, PAGES[:2]).providers(0) == (Provider("G", FID),)


def test_a_replica_lock_stops_only_the_provider_it_names(store):
    for node in ("F", "G", "H"):
        store.register_node(node, [FULL], LONG)
        store.publish(node, "s", FID, PAGES[:2], LONG, start=0)
    store.lock_replica("X", "F", FID, PAGES[:2], LONG)  # X reads from F
    store.lock_replica("G", "G", FID, PAGES[:2], LONG)  # a node's own lock does not stop itself
    assert reasons(store.evict("F", FID, PAGES[:2])) == [REPLICA_LOCK, REPLICA_LOCK]
    assert reasons(store.evict("G", FID, PAGES[:1])) == [EVICTED]
    store.unlock_replica("X", "F", FID, PAGES[:1])
    assert reasons(store.evict("F", FID, PAGES[:2])) == [EVICTED, REPLICA_LOCK]
    store.lock_replica("X", "H", FID, PAGES[1:2], 0.3)
    assert reasons(store.evict("H", FID, PAGES[1:2])) == [REPLICA_LOCK]
    wait_until(lambda: store.evict("H", FID, PAGES[1:2])[0].reason == EVICTED, 5, "the replica lock expiring")


def test_the_last_complete_copy_a_live_session_references_stays_unless_dropped(store):
    store.register_node("A", [K], LONG)
    store.register_node("B", [V], LONG)
    store.register_node("F", [FULL], LONG)
    store.publish("A", "s", KID, PAGES[:3], LONG)
    store.publish("B", "s", VID, PAGES[:3], LONG, start=0)
    store.publish("F", "s", FID, PAGES[:3], LONG, start=0)
    assert reasons(store.evict("F", FID, PAGES[:1])) == [EVICTED]  # A + B still hold it whole
    assert reasons(store.evict("A", KID, PAGES[:1])) == [LAST_REPLICA]  # B alone holds half
    assert reasons(store.evict("A", KID, PAGES[1:2])) == [EVICTED]  # F still holds page 1 whole
    assert reasons(store.evict("A", KID, PAGES[:1], drop=True)) == [EVICTED]  # dropped for good
    assert reasons(store.evict("B", VID, PAGES[:1])) == [EVICTED]  # a fragment (v only) may go
    assert store.match("s", FID, PAGES[:3]).length == 0  # page 0 is gone: the chain is cut there
    assert store.chain(FID, "s") == []


def test_a_page_no_live_session_references_may_lose_its_last_copy(store):
    store.register_node("F", [FULL], LONG)
    store.publish("F", "short", FID, PAGES[:1], 0.3)
    store.publish("F", "long", FID, PAGES[1:2], LONG)
    assert reasons(store.evict("F", FID, PAGES[1:2])) == [LAST_REPLICA]
    store.publish("F", "long", FID, PAGES[1:2], LONG, start=0)
    wait_until(lambda: not store.chain(FID, "short"), 5, "session `short` expiring")
    # page 0 expired with its session: nothing to evict; a page of a dead session is not protected
    assert reasons(store.evict("F", FID, PAGES[:1])) == [NOT_PROVIDER]


# ── locations (slots) ──


def by_layout(providers):
    return tuple(sorted(providers, key=lambda p: p.layout_id))


def test_locations_of_each_provider_come_back_with_the_match(store):
    store.register_node("A", [K], LONG)
    store.register_node("B", [V], LONG)
    store.publish("A", "s", KID, PAGES[:4], LONG, slots=[10, 11, 12, 13])
    store.publish("B", "s", VID, PAGES[:4], LONG, start=0, slots=range(40, 44))
    found = store.match("s", FID, PAGES[:4])
    assert found.length == 4 and len(found.segments) == 1
    (segment,) = found.segments
    expected = {Provider("A", KID): (10, 11, 12, 13), Provider("B", VID): (40, 41, 42, 43)}
    assert dict(zip(segment.providers, segment.slots, strict=True)) == expected
    assert dict(zip(found.providers(2), found.slots(2), strict=True)) == {Provider("A", KID): 12, Provider("B", VID): 42}
    assert segment.slot(segment.providers.index(Provider("B", VID)), 3) == 43
    assert store.locate("A", KID, PAGES[:5]) == [10, 11, 12, 13, None]  # page 4: never published
    assert store.locate("B", VID, PAGES[3:4]) == [43]
    assert store.locate("A", KID, []) == []


def test_each_segment_carries_the_slots_of_its_own_providers(store):
    store.register_node("A", [K], LONG)
    store.register_node("B", [V], LONG)
    store.register_node("F", [FULL], LONG)
    store.publish("A", "s", KID, PAGES, LONG, slots=range(100, 108))
    store.publish("B", "s", VID, PAGES, LONG, start=0, slots=range(200, 208))
    store.publish("F", "s", FID, PAGES[:3], LONG, start=0, slots=[7, 5, 3])  # a full replica of the first pages
    found = store.match("s", FID, PAGES)
    assert [(s.start, s.stop) for s in found.segments] == [(0, 3), (3, 8)]
    assert found.segments[0].providers == (Provider("F", FID),) and found.segments[0].slots == ((7, 5, 3),)
    second = found.segments[1]
    assert by_layout(second.providers) == by_layout((Provider("A", KID), Provider("B", VID)))
    slots = dict(zip(second.providers, second.slots, strict=True))
    assert slots == {Provider("A", KID): tuple(range(103, 108)), Provider("B", VID): tuple(range(203, 208))}


def test_a_republish_replaces_the_location_and_none_records_none(store):
    store.register_node("A", [K], LONG)
    store.register_node("B", [V], LONG)
    store.publish("A", "s", KID, PAGES[:3], LONG, slots=[1, 2, 3])
    store.publish("B", "s", VID, PAGES[:3], LONG, start=0)  # B records no location
    found = store.match("s", FID, PAGES[:3])
    slots = dict(zip(found.segments[0].providers, found.segments[0].slots, strict=True))
    assert slots == {Provider("A", KID): (1, 2, 3), Provider("B", VID): (None, None, None)}
    store.publish("A", "s", KID, PAGES[1:2], LONG, start=1, slots=[9])  # page 1 moved to slot 9
    store.publish("B", "s", VID, PAGES[2:3], LONG, start=2, slots=[0])  # slot 0 is a slot
    assert store.locate("A", KID, PAGES[:3]) == [1, 9, 3]
    assert store.locate("B", VID, PAGES[:3]) == [None, None, 0]
    found = store.match("s", FID, PAGES[:3])
    assert dict(zip(found.providers(1), found.slots(1), strict=True)) == {Provider("A", KID): 9, Provider("B", VID): None}
    assert dict(zip(found.providers(2), found.slots(2), strict=True)) == {Provider("A", KID): 3, Provider("B", VID): 0}
    store.publish("A", "s", KID, PAGES[:1], LONG, start=0)  # published again without a location: forgotten
    assert store.locate("A", KID, PAGES[:3]) == [None, 9, 3]


def test_eviction_takes_the_providers_location_with_it(store):
    for node in ("F", "G"):
        store.register_node(node, [FULL], LONG)
    store.publish("F", "s", FID, PAGES[:2], LONG, slots=[3, 4])
    store.publish("G", "s", FID, PAGES[:2], LONG, start=0, slots=[30, 40])
    assert reasons(store.evict("F", FID, PAGES[:1])) == [EVICTED]
    assert store.locate("F", FID, PAGES[:2]) == [None, 4]
    assert store.locate("G", FID, PAGES[:2]) == [30, 40]
    found = store.match("s", FID, PAGES[:2])
    assert found.providers(0) == (Provider("G", FID),) and found.slots(0) == (30,)
    store.publish("F", "s", FID, PAGES[:1], LONG, start=0)  # provides it again, no location: none comes back
    assert store.locate("F", FID, PAGES[:1]) == [None]
    assert reasons(store.evict("F", FID, PAGES[:2])) == [EVICTED, EVICTED]
    assert reasons(store.evict("G", FID, PAGES[:2], drop=True)) == [EVICTED, EVICTED]
    assert store.locate("G", FID, PAGES[:2]) == [None, None]
    store.register_node("H", [FULL], LONG)
    store.publish("H", "t", FID, PAGES[:1], LONG)  # the page again, from someone else
    assert store.locate("G", FID, PAGES[:1]) == [None]


def test_a_departed_or_lapsed_node_has_no_locations(store):
    store.register_node("F", [FULL], LONG)
    store.register_node("G", [FULL], 0.3)
    store.publish("F", "s", FID, PAGES[:2], LONG, slots=[0, 1])
    store.publish("G", "s", FID, PAGES[:2], LONG, start=0, slots=[5, 6])
    assert store.locate("G", FID, PAGES[:2]) == [5, 6]
    wait_until(lambda: not store.node_alive("G"), 5, "node G lapsing")
    assert store.locate("G", FID, PAGES[:2]) == [None, None]
    found = store.match("s", FID, PAGES[:2])
    assert found.segments[0].providers == (Provider("F", FID),) and found.segments[0].slots == ((0, 1),)
    store.unregister_node("F")
    assert store.locate("F", FID, PAGES[:2]) == [None, None]
    assert store.match("s", FID, PAGES[:2]).length == 0
    assert store.locate("nobody", FID, PAGES[:1]) == [None]
    with pytest.raises(MetaError, match="layout 0000000000000000 was never registered by a node"):
        store.locate("F", "0" * 16, PAGES[:1])


def test_a_location_lives_as_long_as_its_page(store):
    store.register_node("F", [FULL], LONG)
    store.register_node("G", [FULL], LONG)
    store.publish("F", "s", FID, PAGES[:1], LONG)
    store.publish("G", "s", FID, PAGES[:2], 0.3, start=0, slots=[8, 9])  # page 0 lives LONG (F), page 1 0.3 s
    wait_until(lambda: store.locate("G", FID, PAGES[1:2]) == [None], 5, "page 1 expiring")
    assert store.locate("G", FID, PAGES[:1]) == [8]  # page 0 is still live, with G's location


@pytest.mark.parametrize(
    ("slots", "message"),
    [
        ([1], r"publish got 2 pages but 1 slots: give one slot per page \(or slots=None\)"),
        ([1, 2, 3], "publish got 2 pages but 3 slots"),
        ([0, -1], f"the slot of page {PAGES[1]} must be an int >= 0, not -1"),
        ([True, 1], f"the slot of page {PAGES[0]} must be an int >= 0, not True"),
        ([0, 1.0], f"the slot of page {PAGES[1]} must be an int >= 0, not 1.0"),
        ([0, "1"], f"the slot of page {PAGES[1]} must be an int >= 0, not '1'"),
        ([0, None], f"the slot of page {PAGES[1]} must be an int >= 0, not None"),
        ("01", "slots must be a sequence of ints .* or None, not '01'"),
        (5, "slots must be a sequence of ints .* or None, not 5"),
    ],
)
def test_bad_slots_are_refused_and_nothing_is_published(store, slots, message):
    store.register_node("F", [FULL], LONG)
    with pytest.raises(MetaError, match=message):
        store.publish("F", "s", FID, PAGES[:2], LONG, slots=slots)
    assert store.chain(FID, "s") == [] and store.locate("F", FID, PAGES[:2]) == [None, None]


def test_numpy_integers_are_slots(store):
    np = pytest.importorskip("numpy")
    store.register_node("F", [FULL], LONG)
    store.publish("F", "s", FID, PAGES[:3], LONG, slots=np.arange(3, 6, dtype=np.int64))
    assert store.locate("F", FID, PAGES[:3]) == [3, 4, 5]
    assert all(type(slot) is int for slot in store.match("s", FID, PAGES[:3]).segments[0].slots[0])
    with pytest.raises(MetaError, match="must be an int >= 0, not "):
        store.publish("F", "s", FID, PAGES[:1], LONG, slots=np.array([True]))
