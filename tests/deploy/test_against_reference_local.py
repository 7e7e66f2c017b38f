"""The runtime's property test under `--deploy local`: random programs whose role replicas are
spread over processes agree with the reference interpreter (activations and their inputs,
frames, errors, status, and ordered streams in key order), and leave nothing behind in any
process. Fewer examples than the embedded run: each starts a process per replica."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.runtime.test_against_reference import FOUND, SESSION_ORDERED, SETTINGS, check, session_chain, specs

LOCAL = settings(SETTINGS, max_examples=6)
SHARDED = settings(SETTINGS, max_examples=3)


@pytest.mark.parametrize("seed", range(2))
def test_a_stream_reordered_by_a_session_node_in_other_processes_matches_the_reference(seed, tmp_path):
    check(copy.deepcopy(SESSION_ORDERED), seed, tmp_path, session_chain, deploy="local")


@pytest.mark.parametrize("name", sorted(FOUND))
def test_cases_the_search_found_match_the_reference_under_local(name, tmp_path):
    check(copy.deepcopy(FOUND[name]), 0, tmp_path, deploy="local")


@LOCAL
@given(spec=specs(back_edges=False), seed=st.integers(0, 2**16))
def test_random_dags_under_local_match_the_reference(spec, seed, tmp_path):
    check(spec, seed, tmp_path, deploy="local")


@LOCAL
@given(spec=specs(back_edges=True), seed=st.integers(0, 2**16))
def test_random_loops_under_local_match_the_reference(spec, seed, tmp_path):
    check(spec, seed, tmp_path, deploy="local")


# ── the same with each replica process hosting its role's part of every call (FLOWRT_CONTROL=shards) ──


@pytest.fixture
def sharded(monkeypatch):
    monkeypatch.setenv("FLOWRT_CONTROL", "shards")


@pytest.mark.parametrize("seed", range(2))
def test_sharded_a_stream_reordered_by_a_session_node_matches_the_reference(sharded, seed, tmp_path):
    check(copy.deepcopy(SESSION_ORDERED), seed, tmp_path, session_chain, deploy="local")


@pytest.mark.parametrize("name", sorted(FOUND))
def test_sharded_cases_the_search_found_match_the_reference_under_local(sharded, name, tmp_path):
    check(copy.deepcopy(FOUND[name]), 0, tmp_path, deploy="local")


@SHARDED
@given(spec=specs(back_edges=False), seed=st.integers(0, 2**16))
def test_sharded_random_dags_under_local_match_the_reference(sharded, spec, seed, tmp_path):
    check(spec, seed, tmp_path, deploy="local")


@SHARDED
@given(spec=specs(back_edges=True), seed=st.integers(0, 2**16))
def test_sharded_random_loops_under_local_match_the_reference(sharded, spec, seed, tmp_path):
    check(spec, seed, tmp_path, deploy="local")
