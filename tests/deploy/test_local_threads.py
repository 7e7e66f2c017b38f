"""`--deploy local`: each replica process computes with its share of the CPUs ($OMP_NUM_THREADS).

Left to their default, torch (OpenMP, MKL) in every replica process starts one thread per CPU;
replicas computing at once then oversubscribe the machine, and a small model's forward waits a
scheduler time slice for a preempted OpenMP thread at every operation: image_chat_models
reached its image 230-290 ms after the call under `local`, against 9-19 ms in process
(bench/RESULTS.md). These tests count threads, not milliseconds: they fail if a replica process
is again given one thread per CPU (on a machine with 2 or more CPUs).
"""

from __future__ import annotations

import asyncio
import importlib.util

from flowrt.deploy.local import THREADS_ENV, available_cpus, replica_threads
from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed

REPLICAS = 3

FLOW = f"""
placeholder request: Json

role who {{
    impl "roles:Who"
    replicas {REPLICAS}
    lb round_robin
    interface run {{ in request  out threads: Json }}
}}

graph g {{
    entry request
    return threads
}}
"""

WHO = """
import importlib.util
import os

class Who:
    async def run(self, ctx, request):
        torch = None
        if importlib.util.find_spec("torch") is not None:
            import torch
        return {"threads": {
            "pid": os.getpid(),
            "env": os.environ.get("OMP_NUM_THREADS"),
            "torch": torch.get_num_threads() if torch is not None else None,
        }}
"""

TORCH = importlib.util.find_spec("torch") is not None


def replicas_report(bundle) -> list[dict]:
    """What each replica process says of its threads (round robin: one call per replica)."""

    async def main():
        async with deployed(bundle) as deployment:
            seen = []
            for i in range(REPLICAS):
                events = await calls(deployment.runtime, "g", {"request": i})
                assert events[-1]["status"] == "ok", events
                seen.append(events[0]["value"])
            await assert_clean_everywhere(deployment)
            return seen

    seen = asyncio.run(main())
    assert len({each["pid"] for each in seen}) == REPLICAS
    return seen


def test_the_cpus_are_shared_out_among_the_replica_processes():
    assert replica_threads(6, cpus=2) == 1  # image_chat_models on a 2-CPU machine
    assert replica_threads(6, cpus=16) == 2
    assert replica_threads(1, cpus=16) == 16  # one replica: every CPU, as before
    assert replica_threads(3, cpus=1) == 1  # never 0
    assert replica_threads(0, cpus=4) == 4
    assert replica_threads(REPLICAS) == max(1, available_cpus() // REPLICAS)


def test_each_replica_process_computes_with_its_share_of_the_cpus(tmp_path, monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    share = max(1, available_cpus() // REPLICAS)
    for report in replicas_report(bundle_with_roles(FLOW, WHO, tmp_path)):
        assert report["env"] == str(share), report
        if TORCH:  # the pool that oversubscribed: torch's intra-op threads, one per CPU by default
            assert report["torch"] == share, report
    # together they do not run more compute threads than there are CPUs (unless each has only one)
    assert share == 1 or share * REPLICAS <= available_cpus()


def test_a_thread_count_set_by_the_user_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "2")
    for report in replicas_report(bundle_with_roles(FLOW, WHO, tmp_path)):
        assert report["env"] == "2", report  # (torch takes at most one thread per core of the machine)
