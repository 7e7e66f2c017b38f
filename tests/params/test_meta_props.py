"""Both metadata stores give identical answers on random operation sequences (registrations,
departures, publishing, matching, locks, eviction), and the combination enumeration keeps to
its definition (minimal covers only, best first)."""

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
    ),
    st.tuples(st.just("match"), st.sampled_from(["s", "t"]), page_lists),
    st.tuples(st.just("lock_run"), st.sampled_from(["s", "t"])),
    st.tuples(st.just("unlock_run"), st.sampled_from(["s", "t"])),
    st.tuples(st.just("lock_replica"), nodes, nodes, page_lists),
    st.tuples(st.just("unlock_replica"), nodes, nodes, page_lists),
    st.tuples(st.just("evict"), nodes, st.sampled_from(range(len(PARTS))), page_lists, st.booleans()),
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
            node, part, session, pages, start = args
            return store.publish(node, session, PARTS[part].layout_id(), pages, LONG, start), store.chain(fid, session)
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
