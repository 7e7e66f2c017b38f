"""`--deploy ray[=ADDRESS]`: the replicas as Ray actors, placed by the bundle's launch plan.

`ray` starts a local Ray cluster (and shuts it down at the end: never `ray stop`, which would
stop every cluster on the machine); `ray=ADDRESS` (or `ray=auto`, inside a Ray job) joins one.
The placement follows `deploy/ray/launch.json` (flowc build): one placement group per replica of
a role that declares `gpus`, its bundles holding that replica's GPUs; replicas of a role that
`share gpus with` it join the owner's bundle with no GPUs of their own and see the owner's
devices (CUDA_VISIBLE_DEVICES set to the owner's GPU ids). Where the cluster has no GPUs, the
GPUs are counted as the custom resource `flowc_gpu` if the cluster declares it (the local
cluster started here does, so placement is still real on a CPU machine), else dropped, once,
with a warning. Each actor runs a replica exactly as a `local` process does
(flowrt.deploy.worker) and talks to the gateway over ZMQ: ipc on a local cluster, tcp when
joining one. A dead actor is dropped and restarted as in `local`. The deployment's keys
(flowrt.transport.keys) reach each actor in its method's arguments (its configuration), never
a command line; the gateway's secret stays in the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from flowrt.deploy.local import DeployError, LocalSupervisor, Process
from flowrt.transport.sockets import alive

GPU_STAND_IN = "flowc_gpu"
STOP_WAIT = 10.0  # seconds for killed actors' processes to exit
STATS_WAIT = 1.0  # seconds a node's manager has to answer for /stats
log = logging.getLogger("flowrt.deploy")


def _ray():
    try:
        import ray
    except ImportError:
        raise DeployError("--deploy ray needs Ray; install it with: pip install 'flowc[ray]'") from None
    return ray


class ReplicaActorBody:
    """What each Ray actor runs (wrapped by `ray.remote` when the launcher starts)."""

    def __init__(self) -> None:
        self.replica: Any = None

    async def serve(self, config: dict) -> int:
        from flowrt.deploy.worker import Replica

        if config.get("cuda_visible_devices") is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = config["cuda_visible_devices"]
        for entry in reversed(config.get("sys_path", [])):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        self.replica = Replica(config)
        await self.replica.open()
        await self.replica.serve()
        return 0

    def where(self) -> dict:
        import ray

        context = ray.get_runtime_context()
        group = context.get_placement_group_id()
        return {
            "pid": os.getpid(),
            "node": context.get_node_id(),
            "placement_group": group,
            "resources": {k: v for k, v in context.get_assigned_resources().items()},
            "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
        }

    def stop(self) -> None:
        if self.replica is not None:
            self.replica.stopping.set()


class MemoryActorBody:
    """The MemoryManager of one node as a Ray actor: Ray restarts it if it dies (with the same
    configuration, so the same endpoint; a new slab), and `wait` returns only when it stops, so
    the supervisor learns of a death when that call fails. On the gateway's node it listens in
    the deployment's socket directory; on any other node, in a directory of its own named
    after the deployment (stable across restarts, removed when it stops)."""

    def __init__(self, config: dict):
        import threading

        import zmq

        from flowrt.memory.manager import MemoryManager, serve
        from flowrt.transport.sockets import bind, ipc_endpoint

        self.directory: Path | None = None
        endpoint = config["endpoint"]
        if endpoint is None:
            self.directory = node_socket_dir(config["deployment"])
            endpoint = ipc_endpoint(self.directory, "memory")
        from flowrt.memory.manager import secured
        from flowrt.transport.keys import Keys

        self.keys = Keys.from_config(config.get("keys"))
        self.manager = MemoryManager(config["pool_bytes"])
        self.context = zmq.Context()
        self.guard = self.manager.guard = secured(self.context, config.get("keys"))  # (its refusals: statistics())
        socket = self.context.socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        if self.guard is not None:
            self.guard.keys.serve(socket, endpoint)
        self.endpoint = bind(socket, endpoint)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=serve, args=(self.manager, socket, None, self.stopped.is_set), daemon=True)
        self.thread.start()
        self.client: Any = None  # asks the manager for its statistics (its thread owns its tables)
        self.client_lock = threading.Lock()

    def info(self) -> dict:
        return {"endpoint": self.endpoint, "slab": self.manager.slab, "pid": os.getpid()}

    def statistics(self) -> dict:
        from flowrt.memory.client import MemoryClient

        with self.client_lock:
            if self.client is None:
                self.client = MemoryClient(self.endpoint, "supervisor", "statistics", keys=self.keys, as_="member")
            return self.client.statistics(timeout=STATS_WAIT)

    def wait(self) -> None:
        self.stopped.wait()

    def stop(self) -> None:
        import shutil

        self.stopped.set()
        self.thread.join(timeout=2)
        if self.client is not None:
            self.client.close()
        if self.guard is not None:
            self.guard.stop()
        self.manager.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def node_socket_dir(deployment: str) -> Path:
    """The socket directory of a deployment's manager on a node other than the gateway's: 0700,
    this user's (another's of that name is refused), the same path after a restart."""
    base = Path(os.environ.get("FLOWRT_SOCKET_DIR") or "/tmp")
    path = base / f"flowrt-mem-{deployment}"  # ("mem", not a PID: the sweep of dead gateways' directories leaves it)
    path.mkdir(mode=0o700, exist_ok=True)
    if path.is_symlink() or path.stat().st_uid != os.getuid():
        raise PermissionError(f"{path} is not this user's directory; remove it or set FLOWRT_SOCKET_DIR")
    os.chmod(path, 0o700)
    return path


class RayMemory:
    """The supervisor's handle on one node's manager actor (as flowrt.memory.keeper's
    ManagerProcess for `local`: start, pid, endpoint, slab, restarts, close)."""

    def __init__(
        self, ray: Any, deployment: str, node: str, endpoint: str | None, nbytes: int, on_down: Any, local: bool, keys: Any = None
    ):
        self.ray, self.deployment, self.node, self.nbytes, self.on_down = ray, deployment, node, nbytes, on_down
        self.keys = keys  # the deployment's: the actor gets all but the gateway's secret
        self.endpoint = endpoint  # None: the actor picks one on its node
        self.local = local  # on this machine (its PID means something here)
        self.actor: Any = None
        self.pid: int | None = None
        self.slab = ""
        self.restarts = 0
        self.watcher: asyncio.Task | None = None
        self.stopping = False

    async def start(self) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from flowrt.memory.keeper import MemoryStartError

        body = self.ray.remote(MemoryActorBody).options(
            name=f"{self.deployment}-memory-{self.node[:12]}",
            num_cpus=0,
            max_restarts=-1,
            max_concurrency=4,
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.node, soft=False),
        )
        config = {"pool_bytes": self.nbytes, "endpoint": self.endpoint, "deployment": self.deployment}
        if self.keys is not None:
            config["keys"] = self.keys.for_replica()
        self.actor = body.remote(config)
        try:
            await self._learn()
        except Exception as error:  # noqa: BLE001 - Ray's errors: one line
            raise MemoryStartError(
                f"its Ray actor on node {self.node[:12]} failed: {str(error).strip().splitlines()[-1]}"
            ) from None
        self.watcher = asyncio.ensure_future(self._watch())

    async def _learn(self) -> None:
        info = await self.actor.info.remote()
        self.pid, self.slab, self.endpoint = info["pid"], info["slab"], info["endpoint"]

    async def _watch(self) -> None:
        from flowrt.memory import slab

        while not self.stopping:
            try:
                await self.actor.wait.remote()
                return
            except asyncio.CancelledError:
                return
            except Exception:  # noqa: BLE001 - RayActorError: it died; Ray starts it again
                if self.stopping:
                    return
                if self.local:
                    slab.remove(self.slab)  # (elsewhere the restarted manager sweeps it: slab.sweep)
                self.on_down(f"the memory manager (pid {self.pid}, a Ray actor on node {self.node[:12]}) died")
                with contextlib.suppress(Exception):
                    await self._learn()
                    self.restarts += 1

    def statistics(self) -> dict:
        try:
            return self.ray.get(self.actor.statistics.remote(), timeout=STATS_WAIT + 1)
        except Exception as error:  # noqa: BLE001 - Ray's errors: one line
            return {"unanswered": str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__}

    async def close(self) -> None:
        from flowrt.memory import slab

        self.stopping = True
        if self.actor is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.actor.stop.remote(), 5)
            with contextlib.suppress(Exception):
                self.ray.kill(self.actor, no_restart=True)
        if self.watcher is not None:
            self.watcher.cancel()
        if self.pid is not None and self.local:
            await _gone([self.pid], STOP_WAIT)
        if self.local:
            slab.remove(self.slab)


class RaySupervisor(LocalSupervisor):
    def __init__(self, bundle, registry: str | None, ttl: float, address: str | None, debug: bool = False, pool_mb=None):
        super().__init__(bundle, registry, ttl, debug, pool_mb=pool_mb)
        self.address = address
        if self.spread is not None and address is not None:
            raise DeployError(
                "FLOWRT_CONTROL=shards runs on one machine for now (its replicas dial each other over ipc); "
                "use --deploy ray without an address, or unset FLOWRT_CONTROL"
            )
        self.gateway_node = ""  # the Ray node this process (the gateway) runs on
        self.managers: dict[str, RayMemory] = {}  # node id -> that node's memory manager actor
        self.created: dict[tuple[str, int], Any] = {}  # actors placed by _prepare, not serving yet
        self.ray = _ray()
        self.owns_cluster = False
        self.actor_class: Any = None
        self.groups: dict[str, Any] = {}  # placement group name -> PlacementGroup
        self.placement: dict[
            tuple[str, int], dict
        ] = {}  # (role, replica) -> {"group", "bundle_index", "num_cpus", "num_gpus", "owner"}
        self.actors: dict[tuple[str, int], Any] = {}
        self.where: dict[tuple[str, int], dict] = {}
        self.gpu_key: str | None = "GPU"

    def endpoint(self, name: str) -> str:
        if self.address is None:
            return super().endpoint(name)  # a local cluster: same machine, ipc
        return "tcp://auto:0"

    async def start(self) -> None:
        plan = self._launch_plan()
        self._connect(plan)  # (on the main thread: ray.init installs signal handlers)
        self.actor_class = self.ray.remote(max_restarts=0, max_concurrency=64)(ReplicaActorBody)
        self.gateway_node = self.ray.get_runtime_context().get_node_id()
        await self._place(plan)
        await super().start()

    def _launch_plan(self) -> dict:
        path = self.bundle.path / "deploy" / "ray" / "launch.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise DeployError(f"{path} cannot be read ({error}); rebuild the bundle with `flowc build`") from None

    def _connect(self, plan: dict) -> None:
        ray = self.ray
        if ray.is_initialized():
            pass  # (a test, or an embedding program, connected already)
        elif self.address is None:
            gpus = sum(b.get("GPU", 0) for g in plan.get("placementGroups", []) for b in g["bundles"])
            cpus = sum(b.get("CPU", 0) for g in plan.get("placementGroups", []) for b in g["bundles"])
            cpus += sum(a.get("num_cpus", 1) for a in plan.get("actors", []))
            resources = {GPU_STAND_IN: float(gpus)} if gpus else {}
            ray.init(  # (address="local": a cluster of its own, though another may run on this machine)
                address="local",
                num_cpus=max(int(cpus), os.cpu_count() or 1),
                resources=resources,
                include_dashboard=False,
                log_to_driver=True,
                configure_logging=False,
            )
            self.owns_cluster = True
        else:
            _reachable(self.address)
            try:
                ray.init(address=self.address, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as error:
                raise DeployError(
                    f"cannot join the Ray cluster at {self.address} ({error}); check the address (ray status)"
                ) from None
        cluster = ray.cluster_resources()
        if cluster.get("GPU", 0) >= 1:
            self.gpu_key = "GPU"
        elif cluster.get(GPU_STAND_IN, 0) >= 1:
            self.gpu_key = GPU_STAND_IN
        else:
            self.gpu_key = None
            if plan.get("placementGroups"):
                log.warning("the Ray cluster has no GPUs: roles that declare gpus run on the CPU")

    def _resources(self, cpus: float, gpus: float) -> dict:
        out: dict[str, float] = {"CPU": cpus}
        if gpus and self.gpu_key is not None:
            out[self.gpu_key] = gpus
        return out

    async def _place(self, plan: dict) -> None:
        from ray.util.placement_group import placement_group

        for group in plan.get("placementGroups", []):
            if not any(member["role"] in self.bundle.roles for member in group["members"]):
                continue  # the group of roles no graph runs (flowrt.bundle): nothing to reserve for
            bundles = [self._resources(b.get("CPU", 1), b.get("GPU", 0)) for b in group["bundles"]]
            pg = placement_group(bundles, strategy=group.get("strategy", "PACK"), name=f"{self.deployment}-{group['name']}")
            self.groups[group["name"]] = pg
            for member in group["members"]:
                owner = member.get("inject_cuda_visible_devices_of")
                self.placement[(member["role"], member["replica"])] = {
                    "group": group["name"],
                    "bundle_index": member.get("bundle_index", 0),
                    "num_cpus": member.get("num_cpus", 1),
                    "num_gpus": member.get("num_gpus", 0),
                    "owner": tuple(owner.split("/")) if owner else None,
                }
        for actor in plan.get("actors", []):
            self.placement[(actor["role"], actor["replica"])] = {
                "group": None,
                "bundle_index": None,
                "num_cpus": actor.get("num_cpus", 1),
                "num_gpus": actor.get("num_gpus", 0),
                "owner": None,
            }
        for name, pg in self.groups.items():
            try:
                await asyncio.wait_for(asyncio.wrap_future(pg.ready().future()), 60)
            except TimeoutError:
                raise DeployError(
                    f"placement group {name} could not be placed within 60s: the cluster lacks the resources "
                    f"{pg.bundle_specs}; add nodes or lower the role's gpus"
                ) from None

    def _create(self, key: tuple[str, int]) -> Any:
        """A new actor for replica `key`, placed as the launch plan says (not serving yet)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        place = self.placement.get(key, {"group": None, "bundle_index": None, "num_cpus": 1, "num_gpus": 0, "owner": None})
        options: dict[str, Any] = {"num_cpus": place["num_cpus"], "name": f"{self.deployment}-{key[0]}-{key[1]}"}
        resources = self._resources(0, place["num_gpus"])
        resources.pop("CPU")
        if self.gpu_key == "GPU":
            options["num_gpus"] = place["num_gpus"]
        elif resources:
            options["resources"] = resources
        if place["group"] is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self.groups[place["group"]], placement_group_bundle_index=place["bundle_index"]
            )
        return self.actor_class.options(**options).remote()

    async def _prepare(self, expected: list[tuple[str, int]]) -> None:
        """Every replica's actor placed before the managers start: the nodes they landed on are
        the nodes that get a manager, and each replica counts its node's processes for the
        kv_pool_barrier."""
        actors = {key: self._create(key) for key in expected}
        self.created.update(actors)
        places = await asyncio.gather(*(actor.where.remote() for actor in actors.values()))
        self.where.update(zip(actors, places, strict=True))

    async def _start_managers(self) -> RayMemory:
        for node in sorted({self.gateway_node} | {where["node"] for where in self.where.values()}):
            await self._node_manager(node)
        return self.managers[self.gateway_node]

    async def _node_manager(self, node: str) -> RayMemory:
        """Node `node`'s memory manager, started the first time a replica lands there."""
        manager = self.managers.get(node)
        if manager is None:
            here = node == self.gateway_node
            endpoint = LocalSupervisor.endpoint(self, "memory") if here else None  # (ipc: a manager serves its own node)
            local = here or self.address is None
            manager = RayMemory(self.ray, self.deployment, node, endpoint, self.pool_nbytes, self._memory_down, local, self.keys)
            self.managers[node] = manager  # (before it starts: close() stops a half-started one)
            await manager.start()
        return manager

    def config(self, process: Process) -> dict:
        config = super().config(process)
        where = self.where.get((process.role, process.replica))
        if config["memory"] is not None and where is not None:
            node = where["node"]
            config["memory"] = {
                "endpoint": self.managers[node].endpoint,
                "participants": sum(1 for key in self.colocated_with(process.role) if self.where[key]["node"] == node),
                "colocated": self.colocation(process.role),
                "gateway_shares": node == self.gateway_node,
            }
        return config

    async def _spawn(self, process: Process) -> None:
        key = (process.role, process.replica)
        actor = self.created.pop(key, None)
        if actor is None:  # a restart: placed now, maybe on another node
            actor = self._create(key)
            self.where[key] = await actor.where.remote()
        self.actors[key] = actor
        node = self.where[key]["node"]
        if self.manager is not None:
            await self._node_manager(node)
            if node == self.gateway_node:
                self.remote.foreign.discard(key)
            else:
                self.remote.foreign.add(key)
        config = self.config(process)
        config["parent"] = None  # Ray owns the actor's lifetime
        place = self.placement.get(key)
        if place is not None and place["owner"] is not None:
            owner = self.where.get((place["owner"][0], int(place["owner"][1])))
            config["cuda_visible_devices"] = ",".join(owner["gpu_ids"]) if owner and owner["gpu_ids"] else None
        process.started += 1
        process.proc = None
        serving = actor.serve.remote(config)
        process.watcher = asyncio.ensure_future(self._watch_actor(process, serving))

    def node_statistics(self) -> dict[str, dict]:
        """The statistics of the managers on other nodes than the gateway's, by node id."""
        return {node: manager.statistics() for node, manager in sorted(self.managers.items()) if node != self.gateway_node}

    async def _watch_actor(self, process: Process, serving: Any) -> None:
        ray = self.ray
        reason = "its Ray actor stopped"
        try:
            await serving
        except ray.exceptions.RayTaskError as error:
            cause = error.cause if getattr(error, "cause", None) is not None else error
            process.last_error = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
            reason = f"its Ray actor failed: {process.last_error}"
        except ray.exceptions.RayActorError as error:
            reason = f"its Ray actor died ({type(error).__name__})"
        except asyncio.CancelledError:
            return
        if self.stopping:
            return
        process.last_exit = reason
        record = self.directory.drop(process.role, process.replica, None, reason)
        starting = self.failed_start is not None and not self.failed_start.done()
        if starting and record is None:
            message = process.last_error or f"replica {process.replica} of role `{process.role}`: {reason}"
            self.failed_start.set_result(message)
            return
        await self._restart(process)

    def _down(self, record, reason: str) -> None:
        self.remote.on_down(record, reason)
        self.shards_lost(record, reason)
        actor = self.actors.get((record.role, record.replica))
        where = self.where.get((record.role, record.replica)) or {}
        if actor is not None and "lapsed" in reason and record.pid == where.get("pid"):  # (only the actor the record is of)
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)

    def pids(self) -> dict[str, int]:
        return {f"{role}/{replica}": where["pid"] for (role, replica), where in self.where.items()}

    async def close(self) -> None:
        self.stopping = True
        for actor in self.created.values():  # (placed, never served: the start failed before)
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)
        for actor in self.actors.values():
            with contextlib.suppress(Exception):
                actor.stop.remote()
        await asyncio.sleep(0)
        for actor in self.actors.values():
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)
        if self.address is None:  # a cluster on this machine: wait (bounded) until the actors' processes are gone
            await _gone([where["pid"] for where in self.where.values()], STOP_WAIT)
        from ray.util.placement_group import remove_placement_group

        for pg in self.groups.values():
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        for process in self.processes.values():
            if process.watcher is not None and not process.watcher.done():
                process.watcher.cancel()
        await super().close()
        for manager in self.managers.values():
            if manager is not self.manager:
                await manager.close()
        if self.owns_cluster:
            self.ray.shutdown()


async def _gone(pids: list[int], seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline and any(alive(pid) for pid in pids):
        await asyncio.sleep(0.05)


def _reachable(address: str) -> None:
    """A cluster address of the HOST:PORT form must answer before Ray is asked to join it: Ray
    would retry for ever, printing its own warnings."""
    import socket

    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=3).close()
    except OSError as error:
        raise DeployError(
            f"cannot reach the Ray cluster at {address} ({error.strerror or error}); check the address "
            "(`ray status` on its head node prints it), or use --deploy ray to start a local cluster"
        ) from None
