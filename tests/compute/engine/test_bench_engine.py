"""The engine benchmarks still run (--quick: a tiny model; no timings are asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

pytest.importorskip("torch", reason="the engines run on torch (the torch extra)")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_reuse_bench_compares_both_paths_and_they_agree():
    result = run("bench/engine_reuse.py", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| reuse (pages matched in the pool) | 44 |" in result.stdout  # 300 + 16 + 32 tokens; 19 pages reused
    assert "| recompute (empty pool) | 348 |" in result.stdout
    assert "recompute/reuse TTFT (p50) = " in result.stdout and "same first token in both: yes" in result.stdout


def test_batching_bench_runs_both_modes_and_batches_the_steps():
    result = run("bench/engine_batching.py", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| 4 | batched | 6 |" in result.stdout  # 4 sessions x 6 tokens in 6 forwards
    assert "| 4 | one at a time | 24 |" in result.stdout
    assert "sessions 4: batched/one-at-a-time tokens/s = " in result.stdout and "same tokens: yes" in result.stdout
