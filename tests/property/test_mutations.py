"""Property: no mutation of a valid program makes flowc do anything but report diagnostics."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.property.harness import compile_and_verify
from tests.property.mutations import MUTATIONS, mutate, seeds

SEEDS = seeds()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(SEEDS), rng=st.randoms(use_true_random=False))
def test_mutated_programs_only_produce_diagnostics(seed, rng):
    compile_and_verify(mutate(seed, rng))


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=300))
def test_arbitrary_text_only_produces_diagnostics(text):
    compile_and_verify(text)


@settings(max_examples=50, deadline=None)
@given(seed=st.sampled_from(SEEDS), rng=st.randoms(use_true_random=False), which=st.sampled_from(MUTATIONS))
def test_each_mutation_alone(seed, rng, which):
    compile_and_verify(which(seed, rng))


def test_the_seeds_include_every_example():
    assert len(SEEDS) > 70
