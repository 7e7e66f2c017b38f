"""The TinyLFU frequency sketch: count-min estimates within their bound, saturation, periodic
decay (halving), and hashing that is the same in every process."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from flowrt.params.sketch import COUNTER_MAX, FrequencySketch, stable_hash
from tests.conftest import REPO


def test_width_is_a_power_of_two_at_least_the_capacity():
    assert FrequencySketch(1).width == 16
    assert FrequencySketch(1000).width == 1024
    assert FrequencySketch(1024).width == 1024
    assert FrequencySketch(1025).width == 2048
    with pytest.raises(ValueError):
        FrequencySketch(0)


def test_an_unseen_key_is_zero_and_a_few_keys_count_exactly():
    sketch = FrequencySketch(256)
    assert sketch.frequency("never") == 0
    for count, key in enumerate(("a", "b", "c"), start=1):
        for _ in range(count):
            sketch.increment(key)
    assert [sketch.frequency(key) for key in ("a", "b", "c")] == [1, 2, 3]


def test_estimates_stay_within_the_count_min_bound():
    rng = random.Random(3)
    sketch = FrequencySketch(1024, sample_size=10**9)  # no decay in this test
    truth: dict[str, int] = {}
    keys = [f"page-{index}" for index in range(2000)]
    for _ in range(6000):
        key = keys[min(int(rng.paretovariate(1.2)), len(keys)) - 1]
        truth[key] = truth.get(key, 0) + 1
        sketch.increment(key)
    total = sum(truth.values())
    over = []
    for key in keys:
        estimate, true = sketch.frequency(key), min(truth.get(key, 0), COUNTER_MAX)
        assert estimate >= true, key  # never below the (capped) truth
        over.append(estimate - true)
    # count-min: each row overestimates by total/width on average; the minimum of 4 rows, and
    # conservative updates, do better still
    assert sum(over) / len(keys) <= total / sketch.width


def test_counters_saturate_at_fifteen():
    sketch = FrequencySketch(64, sample_size=10**6)
    for _ in range(40):
        sketch.increment("hot")
    assert sketch.frequency("hot") == COUNTER_MAX == 15


def test_decay_halves_every_count():
    sketch = FrequencySketch(64, sample_size=10**6)
    for key, count in (("ten", 10), ("three", 3), ("one", 1)):
        for _ in range(count):
            sketch.increment(key)
    sketch.decay()
    assert (sketch.frequency("ten"), sketch.frequency("three"), sketch.frequency("one")) == (5, 1, 0)
    assert sketch.resets == 1


def test_decay_comes_by_itself_after_the_sample_size():
    sketch = FrequencySketch(64, sample_size=20)
    for _ in range(12):
        sketch.increment("old")
    assert sketch.resets == 0 and sketch.frequency("old") == 12
    for index in range(8):  # the 20th increment triggers the halving
        sketch.increment(f"new-{index}")
    assert sketch.resets == 1
    assert sketch.frequency("old") == 6
    assert sketch.additions == 10  # the period's count halves too


def test_hashing_is_the_same_in_another_process_with_another_hash_seed():
    sketch = FrequencySketch(512)
    code = "from flowrt.params.sketch import FrequencySketch, stable_hash; print(stable_hash('p/1'), FrequencySketch(512)._columns('p/1'))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=True)
    assert out.stdout.split(" ", 1) == [str(stable_hash("p/1")), f"{sketch._columns('p/1')}\n"]
