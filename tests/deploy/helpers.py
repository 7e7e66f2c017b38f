"""Deployments of inline .flow programs whose roles live in a module written beside them
(replica processes import roles by their `impl` path, so they cannot be test-local objects)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import textwrap
from pathlib import Path

from flowrt.deploy import open_deployment
from flowrt.transport.sockets import alive
from tests.runtime.harness import bundle_of


def bundle_with_roles(flow: str, roles: str, directory: Path, module: str = "roles") -> Path:
    """Write `roles` as `module.py` beside the .flow source, and build the bundle."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{module}.py").write_text(textwrap.dedent(roles))
    return bundle_of(textwrap.dedent(flow), directory)


@contextlib.asynccontextmanager
async def deployed(bundle: Path, deploy: str = "local", **options):
    """A running deployment; on exit it is closed and every process it started is gone."""
    deployment = await open_deployment(bundle, deploy, **options)
    pids = deployment.supervisor.pids() if deployment.supervisor is not None else {}
    socket_dir = getattr(deployment.supervisor, "directory_path", None)
    manager = getattr(deployment.supervisor, "manager", None)
    try:
        yield deployment
    finally:
        pids.update(deployment.supervisor.pids() if deployment.supervisor is not None else {})
        if manager is not None and manager.pid is not None:
            pids["memory manager"] = manager.pid
        await deployment.close()
        if manager is not None:
            assert not Path(manager.slab).exists(), "the memory manager's slab was left in shared memory"
        for name, pid in pids.items():
            assert not alive(pid), f"replica process {name} (pid {pid}) outlived its deployment"
        if socket_dir is not None:
            assert not socket_dir.exists(), "the deployment's socket directory was left behind"


async def calls(runtime, graph: str, inputs: dict, **kwargs) -> list[dict]:
    return [event async for event in runtime.call(graph, inputs, **kwargs)]


async def wait_for(condition, seconds: float, what: str) -> None:
    """Poll `condition()` on the event loop until it holds; fail naming `what` after `seconds`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g}s")
        await asyncio.sleep(0.02)


async def assert_clean_everywhere(deployment) -> None:
    """`statistics()` all zero in the gateway and in every replica process."""
    await deployment.runtime.wait_idle()
    stats = await deployment.statistics()
    if getattr(deployment.supervisor, "shards", None) is not None:
        # calls spread over the replicas: their CLOSE travels beside the caller's `done`, on
        # other sockets than the probe's, so a replica may answer before it has closed them
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        # (and `busy_replicas` is what their heartbeats last said)
        while (any(p.get("tracked") for p in stats.get("processes", {}).values()) or stats.get("busy_replicas")) and (
            loop.time() < deadline
        ):
            await asyncio.sleep(0.02)
            stats = await deployment.statistics()
    for key in ("calls", "queued_calls", "busy_replicas", "remote_activations", "waiting_activations"):
        assert stats.get(key, 0) == 0, (key, stats)
    for name, process in stats.get("processes", {}).items():
        process = {key: value for key, value in process.items() if key != "refused"}  # (attacks it counted: test_attacks)
        assert process == {"running": 0, "tracked": 0}, (name, process)
    memory = stats.get("memory")
    if memory is not None:  # no block held for a call or by the gateway (a replica's setup may hold some)
        assert memory["refs_by_call"] == {} and str(os.getpid()) not in memory["refs_by_process"], memory
        for node, other in memory.get("nodes", {}).items():  # (Ray: the managers of the other nodes)
            assert other["refs_by_call"] == {}, (node, other)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
