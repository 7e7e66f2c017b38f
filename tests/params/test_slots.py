"""The slot engine of one tier: contiguous allocation, trackers, eviction, in-flight deduplication
and copy-on-write, by examples and against a small model (hypothesis state machines)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowrt.params.slots import PageLoadAbandoned, SlotEngine, SlotError, SlotsExhausted, Tracker, WriteTarget
from flowrt.params.slots_runs import FreeRuns, runs_of


def assert_quiet(engine: SlotEngine) -> None:
    stats = engine.statistics()
    assert stats["held_pages"] == stats["owners"] == stats["in_flight"] == 0, stats
    assert set(stats["trackers"].values()) == {0}, stats
    assert stats["used"] + stats["free"] == stats["slots"]


# ── contiguous allocation ──


def test_n_consecutive_free_slots_make_one_run():
    engine = SlotEngine(16)
    slots = engine.allocate([f"p{index}" for index in range(5)])
    assert runs_of(slots) == [(0, 5)]
    assert engine.free_slots.runs() == [(5, 11)]


def test_best_fit_takes_the_smallest_run_that_holds_the_pages():
    engine = SlotEngine(12)
    engine.allocate([f"p{index}" for index in range(12)])
    engine.remove(["p1", "p2", "p3", "p4", "p6", "p7", "p9"])  # free runs: (1, 4), (6, 2), (9, 1)
    assert engine.free_slots.runs() == [(1, 4), (6, 2), (9, 1)]
    assert engine.allocate(["a", "b"]) == [6, 7]
    assert engine.allocate(["c"]) == [9]
    assert engine.allocate(["d", "e", "f"]) == [1, 2, 3]


def test_without_a_long_enough_run_it_takes_the_fewest_runs():
    engine = SlotEngine(12)
    engine.allocate([f"p{index}" for index in range(12)])
    engine.remove(["p0", "p2", "p3", "p5", "p6", "p7", "p8"])  # runs of 1, 2 and 4
    slots = engine.allocate(["a", "b", "c", "d", "e"])
    assert len(runs_of(slots)) == 2 and sorted(slots) == [0, 5, 6, 7, 8]


def test_freed_slots_merge_back_into_runs():
    engine = SlotEngine(8)
    engine.allocate([f"p{index}" for index in range(8)])
    engine.remove(["p3", "p5", "p4"])
    assert engine.free_slots.runs() == [(3, 3)]


@given(st.lists(st.booleans(), min_size=1, max_size=40), st.integers(1, 40))
def test_free_runs_always_take_the_fewest_runs(free_mask, wanted):
    runs = FreeRuns(len(free_mask))
    runs.take(len(free_mask))
    for slot, free in enumerate(free_mask):
        if free:
            runs.give(slot)
    lengths = sorted((length for _, length in runs.runs()), reverse=True)
    wanted = min(wanted, runs.free)
    if not wanted:
        return
    fewest = next(count for count in range(1, len(lengths) + 1) if sum(lengths[:count]) >= wanted)
    taken = runs.take(wanted)
    assert len(taken) == len(set(taken)) == wanted and all(free_mask[slot] for slot in taken)
    assert len(runs_of(sorted(taken))) == fewest


# ── trackers and eviction ──


def test_a_held_page_is_never_evicted_and_exhaustion_is_explained():
    engine = SlotEngine(3, name="device")
    engine.allocate(["a", "b", "c"])
    with engine.reading(["a", "b"], "req-1"):
        assert engine.evict(3) == [("c", 2)]
        with pytest.raises(SlotsExhausted) as error:
            engine.allocate(["x", "y"])
        message = str(error.value)
        assert "tier `device`" in message and "2 new page(s) asked" in message
        assert "1 slot(s) are free" in message and "0 idle page(s) evictable" in message and "capacity" in message
    assert len(engine.allocate(["x", "y"])) == 2 and len(engine) == 3  # one idle page evicted for them
    assert_quiet(engine)


def test_releasing_is_idempotent():
    engine = SlotEngine(4)
    engine.allocate(["a"])
    engine.acquire(Tracker.ACTIVE, ["a"], "r")
    engine.release(["a"], "r")
    engine.release(["a"], "r")  # twice
    engine.release(["a"], "never-held")
    engine.release(["gone"], "r")
    assert engine.release_owner("nobody") == 0
    assert engine.evict(1) == [("a", 0)]
    assert_quiet(engine)


def test_release_owner_drops_every_hold_of_a_request():
    engine = SlotEngine(4)
    engine.allocate(["a", "b"], writer="req")
    engine.acquire(Tracker.ACTIVE, ["a", "b"], "req")
    engine.acquire(Tracker.ACTIVE, ["a"], "other")
    assert engine.release_owner("req") == 2
    assert engine.trackers("a").active_requests == {"other"}
    assert engine.evict(2) == [("b", 1)]
    engine.release_owner("other")
    assert_quiet(engine)


def test_evict_candidates_hold_pages_until_finish_evict_and_a_late_reader_keeps_its_page():
    engine = SlotEngine(4)
    engine.allocate(["a", "b"])
    chosen = engine.evict_candidates(4, "demoter")
    assert sorted(chosen) == [("a", 0), ("b", 1)]
    assert engine.evict(4) == []  # held for eviction: not dropped by anyone else
    engine.acquire(Tracker.ACTIVE, ["b"], "reader")  # a request needs b while it is copied down
    assert engine.finish_evict(["a", "b"], "demoter") == ["a"]
    assert "b" in engine and "a" not in engine
    engine.release(["b"], "reader")
    assert_quiet(engine)


# ── copy-on-write ──


def test_writing_a_page_only_the_writer_holds_is_in_place():
    engine = SlotEngine(4)
    (slot,) = engine.allocate(["prefix"])
    engine.acquire(Tracker.ACTIVE, ["prefix"], "w")
    assert engine.write("prefix", "w", new_key="prefix+1") == WriteTarget("prefix+1", slot)
    engine.finish_write("prefix+1", "w")
    engine.release_owner("w")
    assert engine.slot_of("prefix+1") == slot and engine.slot_of("prefix") is None
    assert_quiet(engine)


def test_writing_a_shared_page_copies_it_first():
    engine = SlotEngine(4)
    (slot,) = engine.allocate(["prefix"])
    engine.acquire(Tracker.ACTIVE, ["prefix"], "writer")
    engine.acquire(Tracker.ACTIVE, ["prefix"], "reader")
    with pytest.raises(SlotError, match="new_key"):
        engine.write("prefix", "writer")
    target = engine.write("prefix", "writer", new_key="prefix+w")
    assert target.copy_from == slot and target.slot != slot and target.key == "prefix+w"
    assert engine.trackers("prefix").active_requests == {"reader"}
    assert engine.trackers("prefix+w").active_requests == {"writer"}
    assert engine.trackers("prefix+w").write_tasks == {"writer"}
    engine.finish_write("prefix+w", "writer")
    engine.release_owner("writer")
    engine.release_owner("reader")
    assert engine.statistics()["copies_on_write"] == 1
    assert_quiet(engine)


# ── in-flight deduplication ──


def test_concurrent_misses_make_one_load_and_share_it():
    async def scenario():
        engine = SlotEngine(4)
        gate = asyncio.get_running_loop().create_future()
        loads = []

        async def load(key, slot):
            loads.append((key, slot))
            await gate

        fetches = [asyncio.create_task(engine.fetch("page", load, f"r{index}")) for index in range(5)]
        await asyncio.sleep(0)
        assert engine.lookup("page") is None and engine.loading("page")
        with pytest.raises(SlotError, match="still loading"):
            engine.acquire(Tracker.ACTIVE, ["page"], "impatient")
        gate.set_result(None)
        slots = await asyncio.gather(*fetches)
        assert len(loads) == 1 and set(slots) == {loads[0][1]}
        assert engine.trackers("page").active_requests == {f"r{index}" for index in range(5)}
        assert engine.statistics()["dedup_joins"] == 4
        for index in range(5):
            engine.release(["page"], f"r{index}")
        assert_quiet(engine)

    asyncio.run(scenario())


def test_a_failed_load_reaches_every_waiter_and_leaves_no_slot():
    async def scenario():
        engine = SlotEngine(2)
        gate = asyncio.get_running_loop().create_future()

        async def load(key, slot):
            await gate

        fetches = [asyncio.create_task(engine.fetch("page", load, f"r{index}")) for index in range(3)]
        await asyncio.sleep(0)
        gate.set_exception(OSError("disk gone"))
        results = await asyncio.gather(*fetches, return_exceptions=True)
        assert all(isinstance(result, OSError) and str(result) == "disk gone" for result in results)
        assert "page" not in engine and engine.slot_of("page") is None and engine.free_slots.free == 2
        assert_quiet(engine)

    asyncio.run(scenario())


def test_a_cancelled_loader_gives_its_joiners_an_error_of_their_own():
    async def scenario():
        engine = SlotEngine(2)
        gate = asyncio.get_running_loop().create_future()

        async def load(key, slot):
            await gate

        owner = asyncio.create_task(engine.fetch("page", load, "owner"))
        await asyncio.sleep(0)
        joiner = asyncio.create_task(engine.fetch("page", load, "joiner"))
        await asyncio.sleep(0)
        owner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await owner
        with pytest.raises(PageLoadAbandoned):
            await joiner
        assert engine.slot_of("page") is None
        assert_quiet(engine)

    asyncio.run(scenario())
