"""The four-level frequency-aware LRU: levels follow the sketch's frequency, eviction takes the
least recent page of the coldest level, caps and decay push pages down."""

from __future__ import annotations

from flowrt.params.lru import COLD, HOT, LEVELS, WARM1, WARM2, FrequencyLRU, level_for
from flowrt.params.sketch import FrequencySketch


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
