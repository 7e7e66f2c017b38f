"""Faults of the data plane found by a fault trial: shared-weight segments left in /dev/shm when
the manager stops (normally or killed with -9); `kv_pool_barrier`, `empty` and `empty_array`
refusing bad arguments clearly, before anything is sent, under `local` and `inproc` alike; no
file descriptor per `shared_model` call; and bad pool sizes (`--pool-mb`, $FLOWRT_POOL_MB)
refused in one line naming the value and the fix, exit 2."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="the data plane's tensors need torch (pip install 'flowc[torch]')")
numpy = pytest.importorskip("numpy")


from flowrt.memory import keeper, slab  # noqa: E402
from flowrt.memory.api import InprocMemory, ProcessMemory  # noqa: E402
from flowrt.memory.client import MemoryClient  # noqa: E402
from flowrt.transport.sockets import alive, ipc_endpoint, private_dir, remove_dir  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.deploy.helpers import bundle_with_roles, calls, deployed, wait_for  # noqa: E402
from tests.deploy.test_faults import FLOW as PLAIN_FLOW  # noqa: E402
from tests.deploy.test_faults import ROLES as PLAIN_ROLES  # noqa: E402
from tests.memory.threaded import threaded_manager  # noqa: E402

MODEL_FLOW = """
placeholder request: Json

role enc {
    impl "roles:Encoder"
    replicas 2
    interface run { in request  out y: Json }
}

graph g {
    entry request
    return y
}
"""

MODEL_ROLES = """
import os
import torch


def build():
    return torch.nn.Linear(256, 256)


def load(model):
    with torch.no_grad():
        model.weight.fill_(0.5)
        model.bias.fill_(0.25)


class Encoder:
    async def setup(self, ctx):
        self.model = await ctx.memory.shared_model("faults-linear", build, load)

    async def run(self, ctx, request):
        if request.get("again"):  # claim the weights again (a restarted manager makes a new segment)
            self.model = await ctx.memory.shared_model("faults-linear", build, load)
        return {"y": {"pid": os.getpid(), "bias": float(self.model.bias[0])}}
"""


def files_of(pid: int) -> list[str]:
    """The shared-memory files manager process `pid` made (its slab, its weight segments)."""
    return sorted(entry.name for entry in slab.shm_dir().glob(f"{slab.PREFIX}{pid}-*"))


def segments_of(pid: int) -> list[str]:
    return [name for name in files_of(pid) if name.startswith(f"{slab.PREFIX}{pid}-w-")]


# ── A: no segment is left in shared memory when the manager stops ──


def test_a_normal_stop_leaves_no_weight_segment_in_shared_memory(tmp_path):
    bundle = bundle_with_roles(MODEL_FLOW, MODEL_ROLES, tmp_path)

    async def main():
        async with deployed(bundle, pool_mb=16) as deployment:
            pid = deployment.supervisor.manager.pid
            events = await calls(deployment.runtime, "g", {"request": {}})
            assert events[-1]["status"] == "ok" and events[0]["value"]["bias"] == 0.25, events
            assert len(segments_of(pid)) == 1, files_of(pid)  # the replicas' one shared copy
        return pid

    pid = asyncio.run(main())
    assert files_of(pid) == []


def test_a_manager_killed_with_9_leaves_nothing_and_its_successor_neither(tmp_path):
    bundle = bundle_with_roles(MODEL_FLOW, MODEL_ROLES, tmp_path)

    async def main():
        async with deployed(bundle, pool_mb=16) as deployment:
            manager = deployment.supervisor.manager
            first = manager.pid
            assert len(segments_of(first)) == 1, files_of(first)
            os.kill(first, signal.SIGKILL)
            await wait_for(lambda: manager.pid not in (None, first), 30, "a new memory manager")
            assert files_of(first) == []  # the dead one's slab and segment went with it
            second = manager.pid
            for _ in range(2):  # both replicas (round robin) claim the weights again from the new manager
                events = await calls(deployment.runtime, "g", {"request": {"again": True}})
                assert events[-1]["status"] == "ok" and events[0]["value"]["bias"] == 0.25, events
            assert len(segments_of(second)) == 1, files_of(second)
        return first, second

    first, second = asyncio.run(main())
    assert files_of(first) == [] and files_of(second) == []


def test_a_manager_that_does_not_stop_on_sigterm_is_killed_and_its_files_removed():
    """However the manager ends (here SIGKILL after SIGTERM went unanswered: it is stopped, so
    its own handler never runs), the keeper removes every file it made."""

    async def main():
        directory = private_dir()
        process = keeper.ManagerProcess(ipc_endpoint(directory, "memory"), 1 << 20)
        await process.start()
        pid = process.pid
        client = MemoryClient(process.endpoint, "replica", "enc/0")
        try:
            await ProcessMemory(client).shared_model("stuck", lambda: torch.nn.Linear(8, 8), lambda model: None)
            assert len(segments_of(pid)) == 1, files_of(pid)
            os.kill(pid, signal.SIGSTOP)
            await process.close()
        finally:
            client.close()
            await process.close()  # (again, if the test failed before: it kills the manager by its pid)
            remove_dir(directory)
        return pid

    pid = asyncio.run(main())
    assert not alive(pid) and files_of(pid) == []


# ── a manager in a thread of the test, and a client of it (as tests/memory/test_manager.py) ──


@pytest.fixture
def manager():
    with threaded_manager() as state:
        yield state


@pytest.fixture
def client(manager):
    client = MemoryClient(manager.endpoint, "replica", "enc/0", participants=1)
    yield client
    client.close()


@pytest.fixture(params=["local", "inproc"])
def memory(request, manager):
    """`ctx.memory` of a replica process (over a manager) and of an embedded runtime."""
    if request.param == "inproc":
        yield InprocMemory()
        return
    client = MemoryClient(manager.endpoint, "replica", "enc/0", participants=1)
    yield ProcessMemory(client)
    client.close()


# ── B: kv_pool_barrier ──


@pytest.mark.parametrize(
    ("propose", "participants", "error", "words"),
    [
        (-5, None, ValueError, "propose=-5"),
        (2**63, None, ValueError, "2**63 - 1"),
        (3.7, None, TypeError, "propose=3.7, a float"),
        (4.0, None, TypeError, "propose=4.0, a float"),
        (True, None, TypeError, "propose=True, a bool"),
        (None, None, TypeError, "propose=None"),
        ("abc", None, TypeError, "propose='abc', a str"),
        (1e30, None, TypeError, "a float"),
        (10, 0, ValueError, "participants=0"),
        (10, -3, ValueError, "participants=-3"),
        (10, "x", TypeError, "participants='x'"),
        (10, 2.0, TypeError, "participants=2.0"),
        (10, True, TypeError, "participants=True"),
    ],
)
def test_a_bad_barrier_argument_is_refused_before_anything_is_sent(memory, manager, propose, participants, error, words):
    with pytest.raises(error, match="ctx.memory.kv_pool_barrier") as raised:
        asyncio.run(memory.kv_pool_barrier(propose, participants=participants, timeout=5))
    assert words in str(raised.value) and "\n" not in str(raised.value)
    assert manager.barriers == {}  # nothing reached the manager


@pytest.mark.parametrize("bad", [-5, 3.7, "abc", None])
def test_a_bad_computed_proposal_is_refused_before_it_is_sent(memory, manager, bad):
    async def propose():
        return bad

    with pytest.raises((TypeError, ValueError), match=f"propose\\(\\) returned {bad!r}"):
        asyncio.run(memory.kv_pool_barrier(propose, participants=1, timeout=5))
    if isinstance(memory, ProcessMemory):
        assert manager.barriers["kv"].proposals == {}  # it arrived (weights loaded), but proposed nothing


def test_good_proposals_come_back_as_ints(memory):
    assert asyncio.run(memory.kv_pool_barrier(numpy.int64(7), group="a", participants=1, timeout=5)) == 7
    assert asyncio.run(memory.kv_pool_barrier(lambda: 0, group="b", timeout=5)) == 0
    assert asyncio.run(memory.kv_pool_barrier(2**63 - 1, group="c", participants=1, timeout=5)) == 2**63 - 1


# ── C: empty and empty_array ──


@pytest.mark.parametrize(
    ("call", "shape", "dtype", "error", "words"),
    [
        ("empty", (-1,), None, ValueError, "cannot be negative (-1)"),
        ("empty", -1, None, ValueError, "cannot be negative"),
        ("empty", (2**62, 4), None, ValueError, "under 2**63"),
        ("empty", (1e20,), None, TypeError, "not float 1e+20"),
        ("empty", "abc", None, TypeError, "int or a sequence of ints"),
        ("empty", (2, True), None, TypeError, "not bool True"),
        ("empty", (4,), "float32", TypeError, "must be a torch.dtype"),
        ("empty_array", (-3,), "float32", ValueError, "cannot be negative (-3)"),
        ("empty_array", (1e20,), "float32", TypeError, "not float"),
        ("empty_array", (2**62, 4), "float32", ValueError, "under 2**63"),
        ("empty_array", None, "float32", TypeError, "int or a sequence of ints"),
        ("empty_array", (4,), "float33", TypeError, "not a numpy dtype"),
        ("empty_array", (4,), object, TypeError, "Python objects"),
        ("empty_array", (4,), "U", TypeError, "has no size"),
    ],
)
def test_a_bad_shape_or_dtype_is_refused_before_anything_is_allocated(memory, manager, call, shape, dtype, error, words):
    with pytest.raises(error, match=f"ctx.memory.{call}\\(") as raised:
        getattr(memory, call)(shape, dtype) if dtype is not None else getattr(memory, call)(shape)
    assert words in str(raised.value), str(raised.value)
    assert manager.pool.statistics()["blocks"] == 0  # no block was asked for


def test_good_shapes_and_dtypes(memory):
    assert memory.empty(0).shape == (0,)
    assert memory.empty(torch.Size([2, 3]), torch.float16).dtype == torch.float16
    assert memory.empty([numpy.int64(2), 0]).shape == (2, 0)
    array = memory.empty_array(numpy.int64(5), "int16")
    assert array.shape == (5,) and array.dtype == numpy.int16
    assert memory.empty_array((2, 2), numpy.dtype("U4")).dtype == numpy.dtype("U4")


# ── D: one mapping of a segment per process ──


def segment_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += f"{slab.PREFIX}" in target and "-w-" in target
    return count


def test_calling_shared_model_again_opens_no_more_files(client, manager):
    memory = ProcessMemory(client)

    def build():
        return torch.nn.Linear(64, 64)

    def load(model):
        with torch.no_grad():
            model.weight.fill_(1.0)
            model.bias.fill_(2.0)

    async def main():
        models = [await memory.shared_model("fd-linear", build, load)]
        first = segment_fds()
        assert first >= 1
        for _ in range(19):
            models.append(await memory.shared_model("fd-linear", build, load))
        assert segment_fds() == first, f"{segment_fds()} descriptors of the segment after 20 calls, {first} after one"
        assert all(float(model.bias[0]) == 2.0 for model in models)

    asyncio.run(main())


# ── E: pool sizes ──


def test_pool_bytes_checks_every_source(monkeypatch):
    monkeypatch.setattr(keeper, "shm_free_bytes", lambda: 64 << 20)
    monkeypatch.delenv("FLOWRT_POOL_MB", raising=False)
    assert keeper.pool_bytes(16.0) == 16 << 20
    assert keeper.pool_bytes(0) == 0  # no data plane
    assert keeper.pool_bytes(None) == 64 << 20  # the default, no more than /dev/shm has free
    refused = {
        1e9: "--pool-mb 1e+09 is more than",
        0.001: "less than one block",
        -5.0: "--pool-mb -5 is negative",
        float("nan"): "--pool-mb nan is not a finite number",
        float("inf"): "--pool-mb inf is not a finite number",
        "abc": "--pool-mb abc is not a finite number",
        True: "--pool-mb True is not a finite number",
    }
    for value, words in refused.items():
        with pytest.raises(keeper.MemoryStartError) as raised:
            keeper.pool_bytes(value)
        assert words in str(raised.value) and "give a smaller pool" not in str(raised.value), str(raised.value)
    monkeypatch.setenv("FLOWRT_POOL_MB", "0")
    assert keeper.pool_bytes(None) == 0
    monkeypatch.setenv("FLOWRT_POOL_MB", "100")
    with pytest.raises(keeper.MemoryStartError, match=r"FLOWRT_POOL_MB=100 is more than .* \(64.0 MiB\): lower FLOWRT_POOL_MB"):
        keeper.pool_bytes(None)
    monkeypatch.setattr(keeper, "shm_free_bytes", lambda: 100)
    monkeypatch.delenv("FLOWRT_POOL_MB")
    with pytest.raises(keeper.MemoryStartError, match="less than one block .* --pool-mb 0"):
        keeper.pool_bytes(None)


def flowc(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "FLOWRT_POOL_MB"} | (env or {})
    environment["PYTHONWARNINGS"] = "ignore"
    return subprocess.run(
        [sys.executable, "-m", "flowc", *args], capture_output=True, text=True, cwd=REPO, timeout=120, env=environment
    )


def test_bad_pool_sizes_on_the_command_line_are_one_line_and_exit_2(tmp_path):
    bundle = bundle_with_roles(PLAIN_FLOW, PLAIN_ROLES, tmp_path)
    once = ("run", str(bundle), "--deploy", "local", "--once", "g", "--input", json.dumps({"request": {"n": 1}}))
    bad = [
        (["--pool-mb", "1e12"], {}, "--pool-mb 1e+12 is more than", "lower --pool-mb, or enlarge"),
        (["--pool-mb", "0.001"], {}, "--pool-mb", "give at least 0.004, or 0"),
        (["--pool-mb", "nan"], {}, "--pool-mb", "not 'nan'"),
        ([], {"FLOWRT_POOL_MB": "inf"}, "FLOWRT_POOL_MB=inf is not a finite number", "FLOWRT_POOL_MB=0"),
        ([], {"FLOWRT_POOL_MB": "nan"}, "FLOWRT_POOL_MB=nan is not a finite number", "FLOWRT_POOL_MB=2048"),
        ([], {"FLOWRT_POOL_MB": "abc"}, "FLOWRT_POOL_MB=abc", "FLOWRT_POOL_MB=2048"),
        ([], {"FLOWRT_POOL_MB": "-5"}, "FLOWRT_POOL_MB=-5 is negative", "FLOWRT_POOL_MB=0"),
        ([], {"FLOWRT_POOL_MB": "1e12"}, "FLOWRT_POOL_MB=1e12 is more than", "lower FLOWRT_POOL_MB"),
    ]
    for flags, env, what, fix in bad:
        result = flowc(*once, *flags, env=env)
        assert result.returncode == 2, (flags, env, result.stderr)
        (line,) = result.stderr.strip().splitlines()
        assert what in line and fix in line and "smaller pool" not in line, line
        assert "Traceback" not in result.stderr
    for flags, env in ((["--pool-mb", "0"], {}), ([], {"FLOWRT_POOL_MB": "0"})):  # 0 turns the data plane off
        result = flowc(*once, *flags, env=env)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.splitlines()[-1])["status"] == "ok"


def test_a_pool_smaller_than_a_block_is_refused_by_launch_too(tmp_path):
    bundle = bundle_with_roles(PLAIN_FLOW, PLAIN_ROLES, tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", bundle.name, "launch", "--pool-mb", "0.001"],
        capture_output=True,
        text=True,
        cwd=bundle.parent,
        timeout=60,
        env=os.environ | {"PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 2, result.stderr
    assert "less than one block of the pool (4 KiB)" in result.stderr and "Traceback" not in result.stderr
