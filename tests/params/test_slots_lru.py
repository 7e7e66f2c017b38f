"""The four-level frequency-aware LRU: levels follow the sketch's frequency, eviction takes the
least recent page of the coldest level, caps and decay push pages down; a page idle far past its own
reuse interval is stale and goes first (unless the cache keeps pages much longer than that), and
one-off pages do not age anything."""

from __future__ import annotations

import importlib.util
from collections import OrderedDict

import pytest

from flowrt.params.lru import COLD, HOT, LEVELS, WARM1, WARM2, FrequencyLRU, level_for
from flowrt.params.sketch import FrequencySketch
from flowrt.params.slots import SlotEngine
from tests.conftest import REPO


def accessed(sketch: FrequencySketch, key: str, times: int) -> str:
    for _ in range(times):
        sketch.increment(key)
    return key


def test_thresholds_are_powers_of_two():
    assert [level_for(f) for f in range(16)] == [COLD] * 2 + [WARM1] * 2 + [WARM2] * 4 + [HOT] * 8
    assert LEVELS == ("cold", "warm1", "warm2", "hot")


def test_pages_land_at_the_level_of_their_frequency():
    sketch = FrequencySketch(64, sample_size=10**6)
    lru = FrequencyLRU(sketch, 64, shares=(1.0, 1.0, 1.0, 1.0))
    for key, times in (("once", 1), ("twice", 2), ("five", 5), ("nine", 9)):
        lru.put(accessed(sketch, key, times))
    assert [lru.level_of(key) for key in ("once", "twice", "five", "nine")] == [COLD, WARM1, WARM2, HOT]
    assert lru.counts() == {"cold": 1, "warm1": 1, "warm2": 1, "hot": 1}


def test_eviction_takes_the_coldest_level_first_and_lru_order_within_it():
    sketch = FrequencySketch(64, sample_size=10**6)
    lru = FrequencyLRU(sketch, 64, shares=(1.0, 1.0, 1.0, 1.0))
    lru.put(accessed(sketch, "hot", 9))
    for key in ("c1", "c2", "c3"):
        lru.put(accessed(sketch, key, 1))
    lru.put(accessed(sketch, "warm", 2))
    lru.put("c1")  # touched again at the same frequency: now the most recent cold page
    assert list(lru.coldest()) == ["c2", "c3", "c1", "warm", "hot"]
    assert [lru.pop_coldest() for _ in range(6)] == ["c2", "c3", "c1", "warm", "hot", None]
    assert len(lru) == 0


def test_a_touch_that_raises_the_frequency_promotes():
    sketch = FrequencySketch(64, sample_size=10**6)
    lru = FrequencyLRU(sketch, 64, shares=(1.0, 1.0, 1.0, 1.0))
    lru.put(accessed(sketch, "page", 1))
    assert lru.level_of("page") == COLD
    lru.put(accessed(sketch, "page", 1))
    assert lru.level_of("page") == WARM1


def test_a_level_over_its_cap_pushes_its_least_recent_page_down():
    sketch = FrequencySketch(100, sample_size=10**6)
    lru = FrequencyLRU(sketch, 100, shares=(1.0, 0.02, 1.0, 1.0))  # warm1 holds 2 pages at most
    for key in ("a", "b", "c"):
        lru.put(accessed(sketch, key, 2))
    assert [lru.level_of(key) for key in ("a", "b", "c")] == [COLD, WARM1, WARM1]
    assert lru.pop_coldest() == "a"


def test_decay_moves_pages_that_cooled_down_a_level():
    sketch = FrequencySketch(64, sample_size=10**6)
    lru = FrequencyLRU(sketch, 64, shares=(1.0, 1.0, 1.0, 1.0))
    lru.put(accessed(sketch, "was-hot", 8))
    lru.put(accessed(sketch, "warm", 2))
    sketch.decay()  # 8 -> 4, 2 -> 1
    assert lru.pop_coldest() == "warm"  # warm1 -> cold, so it goes first
    assert lru.level_of("was-hot") == WARM2


def test_remove_is_harmless_for_an_absent_page():
    lru = FrequencyLRU(FrequencySketch(8), 8)
    assert lru.remove("nothing") is False
    lru.put("x")
    assert "x" in lru and lru.remove("x") and "x" not in lru


def used(lru: FrequencyLRU, sketch: FrequencySketch, key: str, times: int = 1) -> str:
    """`times` uses of `key`, each counted by the sketch and recorded by the LRU (as the engine does)."""
    for _ in range(times):
        sketch.increment(key)
        lru.put(key)
    return key


def test_a_page_idle_far_past_its_reuse_interval_is_stale_and_goes_first():
    sketch = FrequencySketch(256, sample_size=10**6)
    lru = FrequencyLRU(sketch, 256, shares=(1.0, 1.0, 1.0, 1.0))
    used(lru, sketch, "quiet")  # seen once: cold
    used(lru, sketch, "chatty", 4)  # used at every tick of the clock: warm2, reuse interval 1
    assert lru.level_of("chatty") == WARM2 and not lru.is_stale("chatty")
    used(lru, sketch, "busy", 20)  # 19 reuses go by: chatty has been idle 19 > 8 x its interval
    assert lru.is_stale("chatty") and lru.level_of("chatty") == COLD
    assert not lru.is_stale("busy") and not lru.is_stale("quiet")  # busy is in use, quiet has no interval yet
    assert list(lru.coldest()) == ["chatty", "quiet", "busy"]  # without stale pages: quiet, chatty, busy
    used(lru, sketch, "chatty")  # used again: back to its level, no longer stale
    assert not lru.is_stale("chatty") and lru.level_of("chatty") == WARM2
    assert [lru.pop_coldest() for _ in range(4)] == ["quiet", "chatty", "busy", None]


def test_without_stale_detection_the_frequency_order_stands():
    sketch = FrequencySketch(256, sample_size=10**6)
    lru = FrequencyLRU(sketch, 256, shares=(1.0, 1.0, 1.0, 1.0), stale_factor=None)
    used(lru, sketch, "quiet")
    used(lru, sketch, "chatty", 4)
    used(lru, sketch, "busy", 20)
    assert not lru.is_stale("chatty")
    assert list(lru.coldest()) == ["quiet", "chatty", "busy"]


def test_a_stale_page_waits_behind_a_page_idle_four_times_longer():
    # the retention guard: the coldest page (quiet) has been idle > 4x as long as the stale one
    sketch = FrequencySketch(256, sample_size=10**6)
    lru = FrequencyLRU(sketch, 256, shares=(1.0, 1.0, 1.0, 1.0))
    used(lru, sketch, "quiet")
    used(lru, sketch, "busy", 100)
    used(lru, sketch, "chatty", 4)
    used(lru, sketch, "busy", 20)
    assert lru.is_stale("chatty")
    assert list(lru.coldest()) == ["quiet", "chatty", "busy"]
    assert lru.pop_coldest() == "quiet"
    assert lru.pop_coldest() == "chatty"  # once quiet is gone, busy (idle 0) is no reason to wait
    unguarded = FrequencyLRU(sketch, 256, shares=(1.0, 1.0, 1.0, 1.0), retention_guard=0.0)
    used(unguarded, sketch, "quiet")
    used(unguarded, sketch, "busy", 100)
    used(unguarded, sketch, "chatty", 4)
    used(unguarded, sketch, "busy", 20)
    assert list(unguarded.coldest()) == ["chatty", "quiet", "busy"]


def test_a_pinned_page_is_never_made_stale_and_keeps_its_history():
    sketch = FrequencySketch(256, sample_size=10**6)
    lru = FrequencyLRU(sketch, 256)
    used(lru, sketch, "held", 4)
    lru.remove("held")  # pinned by a tracker
    used(lru, sketch, "busy", 40)
    assert "held" not in lru and lru.pop_coldest() == "busy" and lru.pop_coldest() is None
    used(lru, sketch, "held")  # released: its use is recorded, its history kept (interval 43/4 ticks now)
    assert "held" in lru and not lru.is_stale("held")


def test_scan_resistance_frequent_pages_survive_a_scan_three_times_the_capacity():
    capacity = 64
    sketch = FrequencySketch(capacity)
    lru = FrequencyLRU(sketch, capacity)
    resident: set[str] = set()

    def access(key: str) -> None:
        if key not in resident:
            if len(resident) >= capacity:
                resident.discard(lru.pop_coldest())
            resident.add(key)
        sketch.increment(key)
        lru.put(key)

    popular = [f"popular/{index}" for index in range(16)]
    for _ in range(10):
        for key in popular:
            access(key)
    for index in range(3 * capacity):  # a document read once
        access(f"scan/{index}")
    # the scan only displaced cold pages, and one-off pages do not move the clock, so the popular
    # pages, idle all along the scan, did not turn stale either
    assert set(popular) <= resident
    assert not any(lru.is_stale(key) for key in popular)


# ── the engine on multi-turn sessions (the trace of bench/kv_hit_ratio.py) ──


def _bench():
    spec = importlib.util.spec_from_file_location("kv_hit_ratio", REPO / "bench" / "kv_hit_ratio.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def engine_hits(trace: list[str], slots: int, **policy) -> int:
    engine = SlotEngine(slots, name="test")
    engine.idle_pages = FrequencyLRU(engine.sketch, slots, **policy)
    for key in trace:
        if engine.lookup(key) is None:
            engine.allocate([key])
        else:
            engine.touch(key)
    return engine.counters.hits


def lru_hits(trace: list[str], slots: int) -> int:
    cache: OrderedDict[str, None] = OrderedDict()
    hits = 0
    for key in trace:
        if key in cache:
            hits += 1
            cache.move_to_end(key)
        else:
            if len(cache) >= slots:
                cache.popitem(last=False)
            cache[key] = None
    return hits


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_recency_wins_for_re_read_prefixes_the_engine_beats_lru_on_sessions(seed):
    # every turn re-reads the session's prefix; sessions end and are never read again. At 1,000
    # slots LRU is within 2 points of the optimum; a frequency policy alone keeps the pages of
    # finished sessions too long and loses to it; evicting stale pages first wins
    trace = _bench().session_trace(20_000, seed)
    lru = lru_hits(trace, 1000)
    assert engine_hits(trace, 1000) > lru
    assert engine_hits(trace, 1000, stale_factor=None) < lru
