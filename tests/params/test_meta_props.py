"""Both metadata stores give identical answers on random operation sequences (registrations,
departures, publishing with and without locations, matching with its slots, locating, locks,
eviction), and the combination enumeration keeps to its definition (minimal covers only, best
first)."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowrt.params.layout import KVLayout
from flowrt.params.meta import MetaError
from flowrt.params.meta.combos import candidate_combinations
from tests.params.test_meta_helpers import FULL, open_kind

LONG = 600.0
PARTS = [FULL, FULL.part(slice_names=["k"]), FULL.part(slice_names=["v"]), FULL.part(sub_names=["0"]), FULL.part(sub_names=["1"])]
NODES = ["A", "B", "C"]
HASHES = [f"p{i}" for i in range(6)]

nodes = st.sampled_from(NODES)
page_lists = st.lists(st.sampled_from(HASHES), min_size=0, max_size=5)
# publish's slots: none, one per page (drawn for 5 pages, cut to the page count), or one too many
slot_lists = st.one_of(st.none(), st.just("extra"), st.lists(st.integers(0, 20), min_size=5, max_size=5))
operation = st.one_of(
    st.tuples(st.just("register"), nodes, st.lists(st.sampled_from(range(len(PARTS))), min_size=1, max_size=2, unique=True)),
    st.tuples(st.just("unregister"), nodes),
    st.tuples(
        st.just("publish"),
        nodes,
        st.sampled_from(range(len(PARTS))),
        st.sampled_from(["s", "t"]),
        page_lists,
        st.sampled_from([None, 0, 1, 3]),
        slot_lists,
    ),
    st.tuples(st.just("match"), st.sampled_from(["s", "t"]), page_lists),
    st.tuples(st.just("lock_run"), st.sampled_from(["s", "t"])),
    st.tuples(st.just("unlock_run"), st.sampled_from(["s", "t"])),
    st.tuples(st.just("lock_replica"), nodes, nodes, page_lists),
    st.tuples(st.just("unlock_replica"), nodes, nodes, page_lists),
    st.tuples(st.just("evict"), nodes, st.sampled_from(range(len(PARTS))), page_lists, st.booleans()),
    st.tuples(st.just("locate"), nodes, st.sampled_from(range(len(PARTS))), page_lists),
)


def apply(store, op):
    fid = FULL.layout_id()
    kind, *args = op
    try:
        if kind == "register":
            return store.register_node(args[0], [PARTS[i] for i in args[1]], LONG), store.combinations(fid)
        if kind == "unregister":
            return store.unregister_node(args[0]), store.combinations(fid)
        if kind == "publish":
            node, part, session, pages, start, slots = args
            slots = [0] * (len(pages) + 1) if slots == "extra" else slots if slots is None else slots[: len(pages)]
            return store.publish(node, session, PARTS[part].layout_id(), pages, LONG, start, slots), store.chain(fid, session)
        if kind == "match":
            return store.match(args[0], fid, args[1]), store.chain(fid, args[0])
        if kind == "lock_run":
            return store.lock_run(args[0], "h", LONG)
        if kind == "unlock_run":
            return store.unlock_run(args[0], "h")
        if kind == "lock_replica":
            return store.lock_replica(args[0], args[1], fid, args[2], LONG)
        if kind == "unlock_replica":
            return store.unlock_replica(args[0], args[1], fid, args[2])
        if kind == "locate":
            return store.locate(args[0], PARTS[args[1]].layout_id(), args[2])
        node, part, pages, drop = args
        return store.evict(node, PARTS[part].layout_id(), pages, drop)
    except MetaError as error:
        return type(error).__name__, str(error)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, min_size=1, max_size=25))
def test_the_embedded_and_the_redis_store_answer_alike(operations):
    with open_kind("embedded") as embedded, open_kind("redis") as redis_store:
        for store in (embedded, redis_store):
            store.register_layout(FULL)
        for op in operations:
            assert apply(embedded, op) == apply(redis_store, op), op


# Locations: fixed holdings (a full node, a k node, a v node, a node holding both halves by
# layer), publishes by one to three holders at once (often a complete combination) and matches
# along the session's chain, so that most matches answer pages with slots to compare.
HOLDINGS = {"A": [0], "B": [1], "C": [2], "D": [3, 4]}
holders = st.sampled_from([(node, part) for node, parts in HOLDINGS.items() for part in parts])
sessions = st.sampled_from(["s", "s", "s", "t"])
given_slots = st.lists(st.integers(0, 20), min_size=5, max_size=5)
located_slots = st.one_of(st.none(), st.just("extra"), given_slots, given_slots, given_slots)  # mostly given
located_operation = st.one_of(
    st.tuples(
        st.just("publish"),
        st.lists(st.tuples(holders, located_slots), min_size=1, max_size=3, unique_by=lambda h: h[0]),
        sessions,
        st.lists(st.sampled_from(HASHES), min_size=1, max_size=5),
        st.sampled_from([None, None, 0, 1]),
    ),
    st.tuples(st.just("match"), sessions, st.sampled_from(HASHES + [None])),
    st.tuples(st.just("locate"), holders, page_lists),
    st.tuples(st.just("evict"), holders, page_lists, st.booleans()),
    st.tuples(st.just("unregister"), st.sampled_from(sorted(HOLDINGS))),
    st.tuples(st.just("register"), st.sampled_from(sorted(HOLDINGS))),
)


def apply_located(store, op):
    """`op` on `store` (a publish by several holders is one publish each, at the first's
    position)."""
    fid = FULL.layout_id()
    kind, *args = op
    if kind == "publish":
        publishers, session, pages, start = args
        answers = []
        for (node, part), slots in publishers:
            answer = apply(store, ("publish", node, part, session, pages, start, slots))
            if start is None and isinstance(answer[0], int):
                start = answer[0] - len(pages)  # the others publish at the same positions
            answers.append(answer)
        return answers
    if kind == "match":
        return apply(store, ("match", *args))
    if kind == "locate":
        (node, part), pages = args
        return apply(store, ("locate", node, part, pages))
    if kind == "evict":
        (node, part), pages, drop = args
        return apply(store, ("evict", node, part, pages, drop))
    if kind == "register":
        return apply(store, ("register", args[0], HOLDINGS[args[0]]))
    return apply(store, ("unregister", args[0])), store.chain(fid, "s"), store.chain(fid, "t")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(located_operation, min_size=1, max_size=30))
def test_both_stores_answer_alike_where_pages_are_kept(operations):
    with open_kind("embedded") as embedded, open_kind("redis") as redis_store:
        for store in (embedded, redis_store):
            store.register_layout(FULL)
            for node, parts in HOLDINGS.items():
                store.register_node(node, [PARTS[i] for i in parts], LONG)

        for op in operations:
            if op[0] == "match":  # along the session's chain (both stores' alike), plus one page or none
                session, extra = op[1:]
                op = ("match", session, embedded.chain(FULL.layout_id(), session) + ([extra] if extra else []))
            assert apply_located(embedded, op) == apply_located(redis_store, op), op


LAYER_PARTS = st.lists(
    st.tuples(
        st.lists(st.sampled_from(["0", "1", "2"]), min_size=1, unique=True),
        st.lists(st.sampled_from(["k", "v"]), min_size=1, unique=True),
    ),
    max_size=6,
)


@given(LAYER_PARTS, st.lists(st.integers(0, 5), min_size=6, max_size=6))
def test_combinations_are_exactly_the_minimal_covers_best_first(shapes, counts):
    full = KVLayout("kv", ("0", "1", "2"), ("k", "v"), 4)
    parts = {}
    for subs, slices in shapes:
        part = full.part(subs, slices)
        parts[part.layout_id()] = part
    frequency = {lid: counts[i] for i, lid in enumerate(sorted(parts))}
    combos = candidate_combinations(full, parts, frequency)
    everything = set(full.chunks())

    def covers(members):
        return set().union(*(parts[m].chunks() for m in members)) >= everything if members else False

    expected = [
        tuple(sorted(c))
        for size in range(1, len(parts) + 1)
        for c in itertools.combinations(parts, size)
        if covers(c) and not any(covers(set(c) - {m}) for m in c)
    ]
    assert set(combos) == set(expected)  # small inputs: nothing is cut by the cap
    keys = [(len(c), -sum(frequency[m] for m in c), list(c)) for c in combos]
    assert keys == sorted(keys)
