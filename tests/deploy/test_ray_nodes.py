"""`--deploy ray=ADDRESS` on a real Ray cluster of two nodes (two raylets on this machine, on
loopback): a memory manager actor on each node that runs replicas, each replica talking to its
own node's manager, tensors pickled whole between nodes and handed over as handles within one,
the kv_pool_barrier counted per node (among co-located replicas), and every manager's statistics clean after the calls."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flowrt.transport.sockets import alive
from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed, wait_for

ray = pytest.importorskip("ray", reason="Ray is in the dev extra; `pip install 'flowc[ray]'` brings it")
pytest.importorskip("torch", reason="tensors need torch (pip install 'flowc[torch]')")

FLOW = """
placeholder request: Json

role make {
    impl "node_roles:Make"
    replicas 2
    gpus 1
    lb round_robin
    interface run { in request  out x: Tensor, made: Json }
}

role use {
    impl "node_roles:Use"
    replicas 2
    lb round_robin
    interface run { in x & made  out total: Json }
}

graph g {
    entry request
    return total
}
"""

ROLES = """
import os

import ray


def here():
    return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


class Barrier:
    async def setup(self, ctx):
        self.proposal = 1000 + os.getpid() % 997
        self.pages = await ctx.memory.kv_pool_barrier(lambda: self.proposal)

    def me(self, ctx):
        stats = ctx.memory.statistics()
        return {
            **here(),
            "role": type(self).__name__.lower(),
            "proposal": self.proposal,
            "pages": self.pages,
            "manager": sorted(stats["clients"].values()),
        }


class Make(Barrier):
    async def run(self, ctx, request):
        x = ctx.memory.empty((1 << 18,))  # 1 MiB in this node's pool
        x.fill_(request)
        return {"x": x, "made": self.me(ctx)}


class Use(Barrier):
    async def run(self, ctx, x, made):
        return {"total": {"sum": float(x.sum()), "made": made, "used": self.me(ctx)}}
"""


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 4, "resources": {"flowc_gpu": 1}, "include_dashboard": False},
    )
    try:
        cluster.add_node(num_cpus=4, resources={"flowc_gpu": 1})
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def test_each_node_has_its_manager_and_tensors_cross_nodes_pickled(two_nodes, tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path, module="node_roles")

    async def main():
        async with deployed(bundle, f"ray={two_nodes}", pool_mb=16) as deployment:
            supervisor = deployment.supervisor
            nodes = {supervisor.where[("make", i)]["node"] for i in (0, 1)}
            assert len(nodes) == 2, supervisor.where  # one flowc_gpu per node: one maker on each
            assert set(supervisor.managers) == {w["node"] for w in supervisor.where.values()} | {supervisor.gateway_node}
            pids = {m.pid for m in supervisor.managers.values()}
            assert len(pids) == len(supervisor.managers) and not pids & set(supervisor.pids().values())
            away = {key for key, w in supervisor.where.items() if w["node"] != supervisor.gateway_node}
            assert away and supervisor.remote.foreign == away

            results = []
            for n in range(1, 7):
                events = await calls(deployment.runtime, "g", {"request": n})
                assert events[-1]["status"] == "ok", events
                results.append(events[0]["value"])
            assert [r["sum"] for r in results] == [n * (1 << 18) for n in range(1, 7)]  # intact across nodes

            processes = {}
            for r in results:
                for side in ("made", "used"):
                    processes[r[side]["pid"]] = r[side]
            assert {p["node"] for p in processes.values()} == nodes
            for process in processes.values():
                # each process talks to its own node's manager: the replicas it lists are that node's
                names = {f"{k[0]}/{k[1]}" for k, w in supervisor.where.items() if w["node"] == process["node"]}
                assert names <= set(process["manager"]) and not (set(process["manager"]) - names - {"gateway"}), process
                # the default kv_pool_barrier: the smallest proposal of the co-located processes (one role's
                # replicas here: neither shares GPUs) on that node
                mates = [p for p in processes.values() if p["node"] == process["node"] and p["role"] == process["role"]]
                placed = [k for k, w in supervisor.where.items() if w["node"] == process["node"] and k[0] == process["role"]]
                if len(mates) == len(placed):
                    assert process["pages"] == min(p["proposal"] for p in mates), mates

            stats = deployment.memory_statistics()
            assert set(stats["nodes"]) == set(supervisor.managers) - {supervisor.gateway_node}
            for node, other in stats["nodes"].items():
                assert other["requests"] > 0 and "gateway" not in other["clients"].values(), (node, other)
            await assert_clean_everywhere(deployment)
        # every node is this machine: its PIDs and files are ours to see (a joined cluster's other
        # nodes stop their actors by themselves, so their processes are waited for, with a bound)
        managers = list(supervisor.managers.values())
        await wait_for(lambda: not any(alive(m.pid) for m in managers), 20, "the managers' processes gone")
        assert not [m.slab for m in managers if Path(m.slab).exists()], "a manager's slab was left in shared memory"
        assert not list(Path("/tmp").glob(f"flowrt-mem-{supervisor.deployment}")), "a node's socket directory was left"

    asyncio.run(main())
