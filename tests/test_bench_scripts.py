"""The benchmark scripts still run (tiny sizes; no timings are asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_compile_bench_runs_on_small_sizes():
    result = run("bench/compile_bench.py", "--sizes", "10,20", "--repeat", "1")
    assert result.returncode == 0, result.stderr
    assert "| 20 |" in result.stdout


def test_fuzz_bench_reports_zero_crashes_on_a_small_run():
    result = run("bench/fuzz_bench.py", "--count", "300", "--workers", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "inputs: 300" in result.stdout and "crashes: 0" in result.stdout


def test_control_overhead_bench_runs_all_systems_it_has():
    result = run("bench/control_overhead.py", "--requests", "40")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "flowrt control core: " in result.stdout
    for row in ("| flowrt | 1 |", "| floor | 1 |", "| flowrt | 64 |", "| floor | 64 |"):
        assert row in result.stdout
    assert "clients 1: flowrt/floor = " in result.stdout and "clients 64: flowrt/floor = " in result.stdout


def test_lsp_bench_runs_a_small_burst_against_the_new_server():
    result = run("bench/lsp_bench.py", "--roles", "40", "--edits", "3", "--rounds", "1", "--baseline", "none")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "before: skipped, not asked for" in result.stderr
    rows = {
        line.split("|")[1].strip(): line.split("|")[2:-1] for line in result.stdout.splitlines() if line.startswith("| debounce")
    }
    assert set(rows) == {"debounce 0 ms", "debounce 150 ms"}, result.stdout
    # with the default delay a burst publishes once; with none, at most once per edit (each then current)
    assert rows["debounce 150 ms"][1].strip() == "1", result.stdout
    assert 1 <= int(rows["debounce 0 ms"][1]) <= 3, result.stdout


def test_serve_overhead_bench_runs_both_paths():
    result = run("bench/serve_overhead.py", "--requests", "200", "--batches", "1")  # (20 fit in one clock tick: 0 µs)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| embedded `Runtime.call` |" in result.stdout and "| served (server process) |" in result.stdout
    assert "served/embedded = " in result.stdout
    assert "| served with --api-key (server process) |" in result.stdout and "served with --api-key/served = " in result.stdout


def test_serve_stress_bench_leaves_nothing_behind_on_a_small_run():
    result = run(
        "bench/serve_stress.py", "--rounds", "1", "--clients", "8", "--requests", "40", "--max-sessions", "5", "--held", "0"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "calls cancelled by their client going away: 8" in result.stdout
    assert "statuses {'ok': 8}" in result.stdout and "'sessions': 5, 'idle_sessions': 5" in result.stdout


def test_deploy_hop_bench_runs_on_a_small_payload():
    result = run("bench/deploy_hop.py", "--sizes", "64", "--count", "50", "--batches", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| 64 B |" in result.stdout and "x |" in result.stdout


def test_deploy_throughput_bench_runs_without_ray_and_scales_a_little():
    result = run("bench/deploy_throughput.py", "--requests", "20", "--rounds", "1", "--no-ray")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| local | 64 |" in result.stdout and "local/inproc = " in result.stdout
    scale = run("bench/deploy_throughput.py", "--scale", "--requests", "64", "--max-replicas", "2")
    assert scale.returncode == 0, scale.stdout + scale.stderr
    assert "| 2 |" in scale.stdout and "registry, per heartbeat: embedded" in scale.stdout


def test_kv_meta_bench_matches_in_one_round_trip():
    result = run("bench/kv_meta.py", "--quick", "--pages", "50")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| prefix match, 50 pages | 1 |" in result.stdout and "| no-op EVALSHA | 1 |" in result.stdout


def test_kv_tiers_bench_runs_every_transfer_and_counts_copies():
    result = run("bench/kv_tiers.py", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    for row in ("| memcpy (torch copy_) | 64 |", "| file write + fsync | 64 |", "| L1 -> L2 (device -> host shm) | 64 |"):
        assert row in result.stdout
    assert "| L3 (cold) -> L2 | 64 |" in result.stdout and "| L2 -> L1 (host -> device) | 64 |" in result.stdout
    assert "| consecutive (slots 0..999 -> 500..1499) | 1 | 1000 |" in result.stdout
    assert "| scattered (random slots) | 1000 | 1000 |" in result.stdout


def test_kv_hit_ratio_bench_compares_the_three_policies_on_every_trace():
    result = run("bench/kv_hit_ratio.py", "--quick", "--accesses", "4000", "--sizes", "100")
    assert result.returncode == 0, result.stdout + result.stderr
    for trace in ("zipf-0.9", "zipf-1.1", "zipf+scans", "sessions"):
        assert f"| {trace} | 100 |" in result.stdout, result.stdout
    assert "engine beats LRU on " in result.stdout


def test_page_hash_bench_compares_the_c_path_with_the_specification():
    result = run("bench/page_hash.py", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "| hashlib (spec) | list[int] | hex keys |" in result.stdout and "| naive loop | list[int] | hex keys |" in result.stdout
    )


def test_chat_reuse_bench_serves_both_turns_and_reuses_the_history():
    result = run("bench/chat_reuse.py", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    reuse = next(line for line in result.stdout.splitlines() if line.startswith("| reuse |"))
    fresh = next(line for line in result.stdout.splitlines() if line.startswith("| fresh |"))
    assert int(reuse.split("|")[3]) > 0 and int(fresh.split("|")[3]) == 0  # reused tokens: some, then none


def test_plain_overlap_bench_runs_both_kinds_of_method():
    result = run("bench/plain_overlap.py", "--block-ms", "5", "--rounds", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| plain def |" in result.stdout and "| async def |" in result.stdout
    assert "async def / plain def = " in result.stdout


def test_serve_stress_admission_part_holds_and_refuses_as_the_limits_say():
    result = run("bench/serve_stress.py", "--rounds", "0", "--requests", "0", "--held", "20", "--probes", "10")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "20 slow calls sent, 4 answered at once ({429: 4})" in result.stdout
    assert "admitted_running 8, admission_waiting 8, refused_calls 4" in result.stdout
    assert "| --max-in-flight 8 --max-queue 8 | POST /graphs/cheap | {200: 10} | {429: 10} |" in result.stdout
    assert "| no limits | POST /graphs/cheap | {200: 10} | {200: 10} |" in result.stdout


def test_gateway_messages_bench_compares_both_controls():
    """Under `local` the gateway's own control sends each activation and receives its frame (a
    chain of N stages: N messages each way per call); spread over the replicas
    (FLOWRT_CONTROL=shards) it sends the entry value and receives the result: one each way."""
    result = run("bench/gateway_messages.py", "--stages", "1,3", "--calls", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {
        (line.split()[0], line.split()[1]): line.split()[2:4]
        for line in result.stdout.splitlines()
        if line.split()[:1] in (["gateway"], ["shards"])
    }
    assert rows == {
        ("gateway", "1"): ["1.0", "1.0"],
        ("gateway", "3"): ["3.0", "3.0"],
        ("shards", "1"): ["1.0", "1.0"],
        ("shards", "3"): ["1.0", "1.0"],
    }, result.stdout


def test_voice_ttfa_bench_runs_its_quick_levels():
    pytest.importorskip("torch", reason="the voice models need torch: pip install 'flowc[models]'")
    result = run("bench/voice_ttfa.py", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rows) == 2 and all(row.endswith("| 0 |") for row in rows), result.stdout  # no turn failed
    assert "TTFA at 2 / at 1: " in result.stdout


def test_audio_encoder_batch_bench_compares_both_ways():
    pytest.importorskip("torch", reason="the voice models need torch: pip install 'flowc[models]'")
    result = run("bench/audio_encoder_batch.py", "--clips", "1,3", "--rounds", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split("|")[1].strip() for line in result.stdout.splitlines() if line.startswith("| ") and "x |" in line] == [
        "1",
        "3",
    ]
