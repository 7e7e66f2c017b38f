"""Weight sharing under `--deploy local`: four processes of one ~200 MB model hold one physical
copy (measured with /proc/PID/smaps PSS) and compute what an unshared copy computes; the
kv_pool_barrier gives every co-located process the smallest proposal, once all have loaded."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="weight sharing needs torch (pip install 'flowc[torch]')")

from tests.deploy.helpers import bundle_with_roles, calls, deployed  # noqa: E402

MB = 1 << 20

FLOW = """
placeholder request: Json

role enc {
    impl "model_roles:Encoder"
    replicas 4
    lb round_robin
    interface run { in request  out y: Json }
}

graph g {
    entry request
    return y
}
"""

ROLES = """
import os
import torch

WIDTH, DEPTH = 2048, 12  # 12 x 2048 x 2048 float32: about 200 MB


def build():
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])


def load(model):
    generator = torch.Generator().manual_seed(1234)
    scratch = {}  # one buffer per shape: the "checkpoint" costs no memory that outlives the load
    with torch.no_grad():
        for parameter in model.parameters():
            buffer = scratch.setdefault(tuple(parameter.shape), torch.empty(parameter.shape))
            torch.randn(parameter.shape, generator=generator, out=buffer)
            parameter.copy_(buffer.mul_(0.02))


def forward(model, seed):
    x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(x)


class Encoder:
    async def setup(self, ctx):
        self.model = await ctx.memory.shared_model("test-mlp", build, load, topology="tp1")
        self.pool = await ctx.memory.kv_pool_barrier(lambda: 1000 + 10 * ctx.replica)
        load(self.model)  # a follower that loads anyway writes nothing (its copy_ is a no-op)

    async def run(self, ctx, request):
        y = forward(self.model, request["seed"])
        return {"y": {"pid": os.getpid(), "sum": float(y.double().sum()), "bytes": y.numpy().tobytes().hex()[:4096],
                      "pool": self.pool, "segment": sum(p.numel() * p.element_size() for p in self.model.parameters())}}
"""


def smaps(pid: int) -> tuple[int, int, int]:
    """(Rss, Pss of the shared weight segments; Private_Dirty of the whole process), bytes."""
    rss = pss = private = 0
    weights = False
    with open(f"/proc/{pid}/smaps") as lines:
        for line in lines:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
                weights = len(parts) >= 6 and "flowrt-mem-" in parts[5] and "-w-" in parts[5]
            elif parts[0] == "Rss:" and weights:
                rss += int(parts[1]) * 1024
            elif parts[0] == "Pss:" and weights:
                pss += int(parts[1]) * 1024
            elif parts[0] == "Private_Dirty:":
                private += int(parts[1]) * 1024
    return rss, pss, private


def private_dirty_of_a_bare_replica() -> int:
    """Private_Dirty of a process that imported what a replica imports, and no model."""
    code = (
        "import torch, numpy, zmq, flowrt.deploy.worker, flowrt.memory.tensors, flowrt.memory.weights\n"
        "print([int(l.split()[1]) * 1024 for l in open('/proc/self/smaps_rollup') if l.startswith('Private_Dirty')][0])"
    )
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_four_processes_share_one_copy_of_a_200_mb_model(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path, module="model_roles")
    spec = importlib.util.spec_from_file_location("model_roles", tmp_path / "model_roles.py")
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    unshared = reference.build()
    reference.load(unshared)
    want = reference.forward(unshared, 5)
    model_bytes = sum(p.numel() * p.element_size() for p in unshared.parameters())
    assert 190 * MB < model_bytes < 220 * MB

    async def main():
        async with deployed(bundle, pool_mb=64) as deployment:
            outputs = []
            for _ in range(4):
                events = await calls(deployment.runtime, "g", {"request": {"seed": 5}})
                outputs.append(events[0]["value"])
            pids = {o["pid"] for o in outputs}
            assert pids == set(deployment.supervisor.pids().values()) and len(pids) == 4
            for output in outputs:  # the same outputs as an unshared copy
                assert output["sum"] == pytest.approx(float(want.double().sum()), rel=1e-9)
                assert output["bytes"] == want.numpy().tobytes().hex()[:4096]
                assert output["pool"] == 1000  # kv_pool_barrier: the smallest proposal, for all
            measured = {pid: smaps(pid) for pid in pids}
            baseline = private_dirty_of_a_bare_replica()
            for pid, (rss, _pss, private) in measured.items():
                assert rss >= 0.95 * model_bytes, (pid, rss)  # each maps (and has read) the whole model
                # and holds no copy of its own: its private memory is what a replica without a model has,
                # plus the load's scratch buffer and what the heap keeps (well under one model)
                assert private - baseline < 0.5 * model_bytes, (pid, private, baseline)
            total_pss = sum(pss for _, pss, _ in measured.values())
            assert 0.9 * model_bytes < total_pss < 1.1 * model_bytes, total_pss  # one copy between four
            stats = deployment.memory_statistics()
            (entry,) = stats["weights"].values()
            assert entry["users"] == 4 and entry["state"] == "ready"
            assert stats["barriers"]["kv@enc"]["value"] == 1000  # (the default group: the co-located roles, enc)

    asyncio.run(main())


MISMATCH = """
import torch


class Encoder:
    async def setup(self, ctx):
        width = 64 + ctx.replica  # replica 1 builds another architecture under the same name
        await ctx.memory.shared_model("test-mlp", lambda: torch.nn.Linear(width, width), lambda model: None)

    async def run(self, ctx, request):
        return {"y": 0}
"""


def test_shared_weights_refuse_another_architecture_under_the_same_name(tmp_path):
    """The second replica gets an error naming the key, not silently the first's weights."""
    bundle = bundle_with_roles(FLOW.replace("replicas 4", "replicas 2"), MISMATCH, tmp_path, module="model_roles")
    from flowrt.deploy import DeployError

    async def main():
        with pytest.raises(DeployError, match="test-mlp.*another architecture"):
            async with deployed(bundle, pool_mb=16):
                pass

    asyncio.run(main())


BUFFERS = """
import torch


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)
        self.register_buffer("scale", torch.empty(64))  # persistent: in the state dict, shared


def load(model):
    torch.manual_seed(7)
    with torch.no_grad():
        model.linear.weight.copy_(torch.randn(64, 64))
        model.linear.bias.copy_(torch.randn(64))
        model.scale.copy_(torch.arange(64, dtype=torch.float32))


class Encoder:
    async def setup(self, ctx):
        self.model = await ctx.memory.shared_model("test-scaled", Scaled, load)
        self.follower = type(self.model.linear.weight).__name__ == "SkipCopyParameter"
        if self.follower:  # a follower that loads anyway writes nothing, buffers included
            zeros = {name: torch.zeros_like(value) for name, value in self.model.state_dict().items()}
            self.model.load_state_dict(zeros)

    async def run(self, ctx, request):
        with torch.no_grad():
            y = self.model.linear(torch.ones(1, 64)) * self.model.scale
        return {"y": {"sum": float(y.sum()), "scale": float(self.model.scale.sum()), "plain": type(y).__name__,
                      "follower": self.follower}}
"""


def test_a_followers_load_writes_neither_parameters_nor_buffers_of_the_shared_copy(tmp_path):
    bundle = bundle_with_roles(FLOW.replace("replicas 4", "replicas 3"), BUFFERS, tmp_path, module="model_roles")

    async def main():
        async with deployed(bundle, pool_mb=16) as deployment:
            answers = [(await calls(deployment.runtime, "g", {"request": {}}))[0]["value"] for _ in range(3)]
        return answers

    answers = asyncio.run(main())
    # the followers' zeros changed nothing (before, the shared buffer became zeros for every replica)
    assert sorted(a["follower"] for a in answers) == [False, True, True], answers
    assert {a["scale"] for a in answers} == {float(sum(range(64)))}, answers
    assert len({a["sum"] for a in answers}) == 1 and answers[0]["sum"] != 0, answers
    assert all(a["plain"] == "Tensor" for a in answers), answers  # what an operation on a buffer returns


TWO_ROLES = """
placeholder request: Json

role enc {
    impl "model_roles:Sizer"
    replicas 2
    lb round_robin
    interface run { in request  out y: Json }
}

role other {
    impl "model_roles:Other"
    interface run { in request  out z: Json }
}

graph g {
    entry request
    return y, z
}
"""

SIZER = """
class Sizer:
    async def setup(self, ctx):
        self.pages = await ctx.memory.kv_pool_barrier(lambda: 500 + ctx.replica, timeout=60)

    async def run(self, ctx, request):
        return {"y": self.pages}


class Other:  # never calls the barrier: not co-located with enc (it shares no GPUs with it)
    async def run(self, ctx, request):
        return {"z": 0}
"""


def test_the_default_barrier_waits_for_the_co_located_roles_only(tmp_path):
    bundle = bundle_with_roles(TWO_ROLES, SIZER, tmp_path, module="model_roles")

    async def main():
        async with deployed(bundle, pool_mb=16) as deployment:
            answers = set()
            for _ in range(2):
                events = await calls(deployment.runtime, "g", {"request": 0})
                answers |= {e["value"] for e in events if e.get("field") == "y"}
            assert answers == {500}
            assert deployment.memory_statistics()["barriers"]["kv@enc"]["participants"] == 2

    asyncio.run(main())
