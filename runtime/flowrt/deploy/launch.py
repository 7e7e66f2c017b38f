"""Opening a bundle under a deployment: `inproc`, `local` or `ray[=ADDRESS]` (DESIGN §5).

    deployment = await open_deployment("build/image_chat", deploy="local")
    async for event in deployment.runtime.call("chat", {...}):
        ...
    await deployment.close()

Whatever the deployment, `runtime` is the same `Runtime` with the same calls and events; only
where the roles run differs. `statistics()` adds, for `local` and `ray`, what every replica
process holds.

`progress(event, role, replica)`, where given, hears how the start goes, from the events
themselves: `planned` for each replica first, then `starting` (its process was started; local
and ray), `setup_started` and `setup_ended` (around its setup: under local, the replica process
says so as it imports, constructs and sets up its role; inproc, around each `setup()`), and
`ready` (it registered; inproc, once every role is set up). Where the log is JSON
(flowrt.logs), the runtime logs its calls (`CallLog`).
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowrt.bundle import load_bundle
from flowrt.control import Runtime
from flowrt.deploy import kvpools
from flowrt.deploy.local import DeployError, LocalSupervisor
from flowrt.logs import CallLog, log_format
from flowrt.observe import combine
from flowrt.options import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL
from flowrt.registry import DEFAULT_HEARTBEAT_TTL, RegistryError, parse_registry

DEPLOYS = ("inproc", "local", "ray")
Progress = Callable[[str, str, int], None]  # (event, role, replica): the module docstring
STATS_TIMEOUT = 1.0  # seconds /stats waits for the memory manager (the gateway's loop waits with it)
MIN_HEARTBEAT_TTL = 0.3  # seconds: a heartbeat every 0.1 s at the most

__all__ = ["DEPLOYS", "DeployError", "Deployment", "open_deployment", "parse_deploy"]

log = logging.getLogger("flowrt.deploy")


def parse_deploy(text: str) -> tuple[str, str | None]:
    """`inproc`, `local`, `ray` or `ray=ADDRESS` → (kind, address); ValueError naming the forms."""
    kind, equals, address = text.partition("=")
    if kind not in DEPLOYS or (equals and kind != "ray") or (kind == "ray" and equals and not address):
        raise ValueError(f"expected inproc, local, ray or ray=ADDRESS, not {text!r}")
    return kind, address or None


class Deployment:
    def __init__(self, kind: str, runtime: Runtime, supervisor: Any = None, memory: Any = None):
        self.kind = kind
        self.runtime = runtime
        self.supervisor = supervisor
        self.memory = memory  # the inproc runtime's ctx.memory (its KV pools are closed with it)

    async def close(self) -> None:
        try:
            await self.runtime.close()
        finally:
            kvpools.detach(self.memory)
            if self.supervisor is not None:
                await self.supervisor.close()

    async def statistics(self) -> dict[str, Any]:
        """The runtime's statistics, and each replica process's own (`processes`)."""
        stats: dict[str, Any] = dict(self.runtime.statistics())
        if self.supervisor is not None:
            stats.update(self.supervisor.remote.statistics())
            stats["restarts"] = self.supervisor.restarted
            stats.update(self.supervisor.security())  # forged_records, refused_peers (flowrt.transport.keys)
            stats["processes"] = await self.supervisor.remote.probe()
            if self.supervisor.memory is not None:
                stats["memory"] = self.memory_statistics()
        pools = getattr(self.memory, "params", None)
        if pools is not None and pools.pools:  # inproc: this process's KV pools (docs/kv.md)
            stats["kv"] = pools.statistics()
        return stats

    def memory_statistics(self) -> dict[str, Any]:
        """The memory manager's statistics (blocks, bytes, refs by call and by process, LRU hits),
        or {"unanswered": why} while it is down; under Ray, those of the other nodes' managers
        under `nodes`, by node id."""
        from flowrt.memory.client import MemoryError_

        try:
            stats = self.supervisor.memory.statistics(timeout=STATS_TIMEOUT)
        except MemoryError_ as error:
            stats = {"unanswered": str(error)}
        others = getattr(self.supervisor, "node_statistics", dict)()
        if others:  # (Ray: a manager on each node with replicas; the gateway's node's is above)
            stats["nodes"] = others
        return stats


async def open_deployment(
    path: str | Path,
    deploy: str = "inproc",
    *,
    registry: str | None = None,
    heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL,
    session_ttl: float = DEFAULT_SESSION_TTL,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    clock: Callable[[], float] = time.monotonic,
    debug: bool = False,
    pool_mb: float | None = None,
    progress: Progress | None = None,
) -> Deployment:
    """Start `path` under `deploy`; DeployError (a FlowrtError) saying why it cannot.
    `progress` hears how the start goes (the module docstring)."""
    deployment = await _open(path, deploy, registry, heartbeat_ttl, session_ttl, max_sessions, clock, debug, pool_mb, progress)
    if log_format() == "json":
        deployment.runtime.observer = combine(deployment.runtime.observer, CallLog())
    return deployment


async def _open(
    path: str | Path,
    deploy: str,
    registry: str | None,
    heartbeat_ttl: float,
    session_ttl: float,
    max_sessions: int,
    clock: Callable[[], float],
    debug: bool,
    pool_mb: float | None,
    progress: Progress | None,
) -> Deployment:
    kind, address = parse_deploy(deploy)
    try:
        registry = parse_registry(registry)
    except RegistryError as error:
        raise DeployError(str(error)) from None
    if heartbeat_ttl < MIN_HEARTBEAT_TTL:
        raise DeployError(
            f"--heartbeat-ttl {heartbeat_ttl:g}: a replica renews its heartbeat every third of it; give at least {MIN_HEARTBEAT_TTL:g}s"
        )
    if kind == "inproc":
        if registry is not None:
            raise DeployError("--registry is for --deploy local or ray (an inproc runtime has no replicas to register)")
        from flowrt.memory.api import InprocMemory

        memory = InprocMemory()
        bundle = load_bundle(Path(path))
        _say_left_out(bundle)
        # the pools before the roles' setup(), as a local replica has them: setup may check the
        # KV globals it will use (flowstd's LLM roles refuse a global of the wrong shape there)
        kvpools.attach(memory, bundle.plan, f"{bundle.name}-{uuid.uuid4().hex[:12]}")
        opening = Runtime if progress is None else _reporting(progress, bundle)
        try:
            runtime = await opening.open(path, session_ttl=session_ttl, max_sessions=max_sessions, clock=clock, memory=memory)
        except BaseException:
            kvpools.detach(memory)
            raise
        for role, replica in _replicas(runtime.bundle) if progress is not None else ():
            progress("ready", role, replica)
        return Deployment(kind, runtime, memory=memory)
    bundle = load_bundle(Path(path))
    _say_left_out(bundle)
    if kind == "ray":
        from flowrt.deploy.ray import RaySupervisor

        supervisor: Any = RaySupervisor(bundle, registry, heartbeat_ttl, address, debug, pool_mb=pool_mb)
    else:
        supervisor = LocalSupervisor(bundle, registry, heartbeat_ttl, debug, pool_mb=pool_mb)
    if progress is not None:
        supervisor.progress = progress
    try:
        await supervisor.start()
    except RegistryError as error:
        raise DeployError(str(error)) from None
    try:
        runtime = await Runtime.open(path, session_ttl=session_ttl, max_sessions=max_sessions, clock=clock, binder=supervisor)
    except BaseException:
        await supervisor.close()
        raise
    supervisor.memory_down = functools.partial(runtime.fail_all, where="memory manager")
    if getattr(supervisor, "spread", None) is not None:
        supervisor.spread.open(runtime)
    return Deployment(kind, runtime, supervisor)


def _say_left_out(bundle: Any) -> None:
    """Log the roles no graph runs, which the deployment neither imports nor starts."""
    if bundle.unreached:
        names = ", ".join(f"`{name}`" for name in bundle.unreached)
        log.info("not started: %s (no graph of %s runs them; `flowc plan` shows which roles each graph runs)", names, bundle.name)


def _replicas(bundle: Any) -> list[tuple[str, int]]:
    return [(name, replica) for name, spec in sorted(bundle.roles.items()) for replica in range(spec.replicas)]


def _reporting(progress: Progress, bundle: Any) -> type[Runtime]:
    """The inproc runtime, telling `progress` of every replica planned and of each `setup()`."""
    for role, replica in _replicas(bundle):
        progress("planned", role, replica)

    class Reporting(Runtime):
        async def _setup(self, role: str, replica: int, setup: Any, thread: Any) -> None:
            progress("setup_started", role, replica)
            await super()._setup(role, replica, setup, thread)
            progress("setup_ended", role, replica)

    return Reporting
