"""`--deploy local`: a supervisor, one OS process per role replica, the gateway in this process.

The supervisor starts `python -m flowrt.deploy.worker` once per replica, relays their stderr,
and waits until every replica has registered (or one failed to start: its last line says why).
It watches each process: one that exits is dropped from the registry at once (its calls end
with an error naming it) and started again after a backoff (0.25 s doubling to 5 s), at most
MAX_RESTARTS times in RESTART_WINDOW seconds; one whose heartbeat lapsed is killed and
restarted the same way. While none of a role's replicas is up, its activations wait for one
(flowrt.deploy.remote.REPLICA_WAIT); `explain` tells those that waited in vain why. Each
replica process computes with its share of the machine's CPUs ($OMP_NUM_THREADS, set by
`replica_threads` unless the supervisor's environment sets it). Closing
stops every process it started (Stop, then SIGTERM, then SIGKILL), by PID, and removes the
socket directory.

Every socket between these processes authenticates with the deployment's keys, made here at
start (flowrt.transport.keys): replicas get theirs (all but the gateway's secret) in their
configuration, in their environment like the rest of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from flowrt.bundle import Bundle
from flowrt.deploy.remote import WAIT_ENV, Remote, RemoteBinding, replica_wait
from flowrt.deploy.shard_gateway import ShardGateway
from flowrt.errors import FlowrtError
from flowrt.logs import event, log_format
from flowrt.registry import Directory, Record, open_source
from flowrt.transport import keys as transport_keys
from flowrt.transport.sockets import ipc_endpoint, private_dir, remove_dir

MAX_RESTARTS = 5
RESTART_WINDOW = 60.0
FIRST_BACKOFF = 0.25
MAX_BACKOFF = 5.0
START_TIMEOUT = 120.0  # seconds for every replica to import, construct, set up and register
STOP_GRACE = 3.0
RELAY_LINE = 1 << 20  # stderr lines longer than this are relayed in pieces
CONFIG_ENV = "FLOWRT_REPLICA_CONFIG"
CONTROL_ENV = "FLOWRT_CONTROL"  # "shards": calls spread over the replicas (docs/design/decentralised.md)
THREADS_ENV = "OMP_NUM_THREADS"  # sizes torch's intra-op pool, OpenMP, MKL and OpenBLAS in a replica process
log = logging.getLogger("flowrt.deploy")


class DeployError(FlowrtError):
    """A deployment could not start (a replica that cannot start, a registry that cannot be used)."""


@dataclass
class Process:
    role: str
    replica: int
    proc: asyncio.subprocess.Process | None = None
    watcher: asyncio.Task | None = None
    relay: asyncio.Task | None = None
    last_error: str = ""
    restarts: list[float] = field(default_factory=list)
    started: int = 0
    last_exit: str = ""  # how its last process ended, and why if it said (for `explain`)
    paused_until: float = 0.0  # after MAX_RESTARTS failures: when it is tried again


def exit_text(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            return f"its process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"its process was killed by signal {-code}"
    return f"its process exited with status {code}"


def shards_wanted(bundle: Bundle) -> bool:
    """Whether FLOWRT_CONTROL asks for calls spread over the replicas ("shards"; "" or "gateway":
    the gateway runs every call's control); DeployError for another value."""
    mode = os.environ.get(CONTROL_ENV, "").strip()
    if mode in ("", "gateway"):
        return False
    if mode != "shards":
        raise DeployError(f"{CONTROL_ENV}={mode!r}: say `shards` (each replica runs its role's part of a call) or `gateway`")
    return True


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, where the system has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def replica_threads(replicas: int, cpus: int | None = None) -> int:
    """The compute threads each of `replicas` replica processes gets ($OMP_NUM_THREADS): the CPUs
    shared out among them, at least 1. Left to their default, torch (OpenMP, MKL) in every process
    starts one thread per CPU, so replicas computing at once run several times as many threads as
    there are CPUs; OpenMP's threads meet at the end of every operation, and one whose partner
    was preempted waits for it, so a small model's forward took a scheduler time slice or more
    instead of a millisecond: image_chat_models reached its image 100-500 ms after the call on
    2 CPUs, not 30-50 (docs/deploy.md, "CPU threads"). Under Ray, each actor gets its `num_cpus`
    the same way, by Ray."""
    return max(1, (available_cpus() if cpus is None else cpus) // max(1, replicas))


class LocalSupervisor:
    def __init__(self, bundle: Bundle, registry: str | None, ttl: float, debug: bool = False, pool_mb: float | None = None):
        self.bundle = bundle
        self.pool_mb = pool_mb  # the Tmp Buffer Pool's size (flowrt.memory.keeper.pool_bytes); 0: no data plane
        self.manager: Any = None  # the machine's MemoryManager process (flowrt.memory.keeper)
        self.memory: Any = None  # the gateway's MemoryClient
        self.memory_down: Any = lambda reason: None  # set by open_deployment: ends the calls in flight
        self.progress: Any = lambda event, role, replica: None  # set by open_deployment (flowrt.deploy.launch)
        self.pool_nbytes = 0
        self.registry = registry
        self.ttl = ttl
        self.debug = debug
        self.deployment = uuid.uuid4().hex[:12]
        if not transport_keys.available():
            raise DeployError(
                "this pyzmq has no CURVE (libsodium), which a deployment's processes authenticate each other with; "
                "install a pyzmq wheel (pip install --force-reinstall pyzmq)"
            )
        self.keys = transport_keys.Keys.generate()  # this deployment's alone, for as long as it runs
        self.directory_path: Path | None = None
        self.context = zmq.asyncio.Context()
        try:
            wait = replica_wait()
        except ValueError as error:
            raise DeployError(f"{WAIT_ENV}: {error}") from None
        self.remote = Remote({name: spec.replicas for name, spec in bundle.roles.items()}, wait, keys=self.keys)
        self.remote.explain = self.explain
        self.directory = Directory(ttl, self._up, self._down)
        self.processes: dict[tuple[str, int], Process] = {}
        self.source = None
        self.ticker: asyncio.Task | None = None
        self.stopping = False
        self.restarted = 0
        self.failed_start: asyncio.Future | None = None
        # FLOWRT_CONTROL=shards: each replica hosts its role's part of every call (flowrt.control.shards)
        self.spread: ShardGateway | None = ShardGateway(self) if shards_wanted(bundle) else None
        self.remote.spread = self.spread is not None

    # ── what the runtime asks of a binder ──

    def binding(self, spec, globals_: dict, log_: logging.Logger) -> RemoteBinding:
        return RemoteBinding(spec, self.remote, globals_, log_)

    def generator(self, role: str, interface: str) -> bool:
        return interface in self.remote.generators.get(role, frozenset())

    def retired(self, call_id: Any) -> None:
        self.remote.retired(call_id)

    def explain(self, role: str) -> str:
        """Why no replica of `role` is up, as far as its processes tell: restarts, last exit."""
        now, parts = time.monotonic(), []
        for (name, replica), process in sorted(self.processes.items()):
            if name != role or not process.last_exit:
                continue
            n = process.started - 1
            text = (
                f"replica {replica}: " if n == 0 else f"replica {replica} was restarted {n} time{'s'[: n != 1]}; the last time, "
            )
            text += process.last_exit
            if process.paused_until > now:
                text += f"; it failed {MAX_RESTARTS} times in {RESTART_WINDOW:g}s and is tried again in {process.paused_until - now:.0f}s"
            elif process.proc is not None and process.proc.returncode is None:
                text += "; a new process is starting"
            parts.append(text)
        return "; ".join(parts)

    # ── start and stop ──

    def endpoint(self, name: str) -> str:
        """Where a socket of this deployment listens: ipc in the private directory."""
        assert self.directory_path is not None
        return ipc_endpoint(self.directory_path, name)

    def colocation(self, role: str) -> str:
        """The role whose GPUs `role` shares (`share gpus with`), or `role` itself."""
        return self.bundle.roles[role].share_gpus_with or role

    def colocated_with(self, role: str) -> list[tuple[str, int]]:
        """The replicas co-located with `role`'s (its GPU-sharing group): by default, the processes
        a kv_pool_barrier of one of them waits for (docs/memory.md)."""
        owner = self.colocation(role)
        return [key for key in self.expected() if self.colocation(key[0]) == owner]

    def expected(self) -> list[tuple[str, int]]:
        """Every replica, in the order they start (roles that share an owner's GPUs after it)."""
        roles = sorted(self.bundle.roles.items(), key=lambda item: (item[1].share_gpus_with is not None, item[0]))
        return [(name, i) for name, spec in roles for i in range(spec.replicas)]

    async def start(self) -> None:
        try:
            self.directory_path = private_dir()
        except OSError as error:
            raise DeployError(
                f"cannot make the deployment's socket directory ({error.strerror or error}: {error.filename}); "
                "set FLOWRT_SOCKET_DIR to a writable directory"
            ) from None
        expected = self.expected()
        for role, replica in expected:
            self.progress("planned", role, replica)
        self.failed_start = asyncio.get_running_loop().create_future()
        try:
            self.source = await open_source(
                self.registry, self.context, self.endpoint("registry"), self.deployment, expected, self.directory, self.keys
            )
            self.registry_endpoint = getattr(self.source, "endpoint", "")  # (tcp: the port chosen)
            self.source.start()
            await self._prepare(expected)
            await self._start_memory()
            self.ticker = asyncio.ensure_future(self._tick())
            for role, replica in expected:
                self.processes[(role, replica)] = process = Process(role, replica)
                await self._spawn(process)
            await self._wait_all_up(expected)
            self.failed_start = None  # from now on an exit is a restart, not a failed start
        except ValueError as error:  # a socket path too long for ipc
            await self.close()
            raise DeployError(str(error)) from None
        except BaseException:
            await self.close()
            raise
        for path in self.bundle.python_path:  # frames may hold instances of the roles' own classes
            if str(path) not in sys.path:
                sys.path.insert(0, str(path))

    async def _prepare(self, expected: list[tuple[str, int]]) -> None:
        """Before the memory managers start: where the replicas will run (under Ray, the actors
        are placed first, so that each node they land on gets a manager)."""

    async def _start_memory(self) -> None:
        """Start the memory managers and connect the gateway to its machine's (the data plane
        needs numpy; without it, or with a pool of 0 MiB, frames are pickled whole)."""
        from flowrt.memory.keeper import MemoryStartError, pool_bytes

        if self.pool_mb == 0 or importlib.util.find_spec("numpy") is None:
            return
        try:
            self.pool_nbytes = pool_bytes(self.pool_mb)
        except MemoryStartError as error:
            raise DeployError(str(error)) from None  # (it names the value and its own fix)
        if self.pool_nbytes == 0:
            return  # FLOWRT_POOL_MB=0: no data plane, as --pool-mb 0
        try:
            self.manager = await self._start_managers()
        except MemoryStartError as error:
            raise DeployError(f"{error}; give a smaller pool (--pool-mb) or free /dev/shm") from None
        from flowrt.memory.client import MemoryClient, MemoryError_

        try:
            self.memory = MemoryClient(self.manager.endpoint, "gateway", "gateway", keys=self.keys, as_="gateway")
        except MemoryError_ as error:
            raise DeployError(str(error)) from None
        self.remote.use_memory(self.memory)

    async def _start_managers(self) -> Any:
        """The machine's manager, started: a process of ours (under Ray, an actor per node);
        returns the one on the gateway's machine."""
        from flowrt.memory.keeper import ManagerProcess

        self.manager = ManagerProcess(
            self.endpoint("memory"), self.pool_nbytes, debug=self.debug, on_down=self._memory_down, keys=self.keys
        )
        await self.manager.start()
        return self.manager

    def _memory_down(self, reason: str) -> None:
        self.memory_down(f"{reason}: the shared tensors of the calls in flight are lost")

    async def _wait_all_up(self, expected: list[tuple[str, int]]) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not all(key in self.remote.links for key in expected):
            self.remote.up_event.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [f"replica {r} of role `{role}`" for role, r in expected if (role, r) not in self.remote.links]
                raise DeployError(
                    f"{', '.join(missing)} did not register within {START_TIMEOUT:g}s; "
                    "check their setup() (is it waiting on something?) and the log above"
                )
            up = asyncio.ensure_future(self.remote.up_event.wait())
            done, _ = await asyncio.wait({up, self.failed_start}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            up.cancel()
            if self.failed_start in done:
                raise DeployError(self.failed_start.result())

    def environment(self, process: Process) -> dict[str, str]:
        """A replica process's environment: ours, its configuration (not on its command line,
        which `ps` shows everyone), and its share of the CPUs unless ours says how many threads."""
        env = {**os.environ, CONFIG_ENV: json.dumps(self.config(process))}
        if not os.environ.get(THREADS_ENV, "").strip():
            env[THREADS_ENV] = str(replica_threads(len(self.expected())))
        return env

    def config(self, process: Process) -> dict:
        return {
            "bundle": str(self.bundle.path.resolve()),
            "role": process.role,
            "replica": process.replica,
            "address": self.endpoint(f"{process.role}-{process.replica}"),
            "registry": self.registry,
            "registry_endpoint": self.registry_endpoint,
            "deployment": self.deployment,
            "ttl": self.ttl,
            "parent": os.getpid(),
            "gateway_pid": os.getpid(),  # (the memory manager's call keys are GATEWAY_PID:CALL_ID)
            "debug": self.debug,
            "keys": self.keys.for_replica(),  # (flowrt.transport.keys: all but the gateway's secret)
            "log_format": log_format(),
            "shards": self.spread.config(process.role, process.replica) if self.spread is not None else None,
            "sys_path": [p for p in sys.path if p],
            "memory": None
            if self.manager is None
            else {
                "endpoint": self.manager.endpoint,
                "participants": len(self.colocated_with(process.role)),
                "colocated": self.colocation(process.role),
            },
        }

    @property
    def shards(self) -> Any:
        """The gateway's shards of the calls spread over the replicas (None: the gateway runs every call)."""
        return self.spread.shards if self.spread is not None else None

    @property
    def peers(self) -> Any:
        return self.spread.peers if self.spread is not None else None

    async def _spawn(self, process: Process) -> None:
        process.last_error = ""
        process.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "flowrt.deploy.worker",
            f"{process.role}/{process.replica}",  # (what `ps` shows; the configuration, a Redis password in it, is in the environment)
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=self.environment(process),
            start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor, which stops its replicas itself
            limit=RELAY_LINE,
        )
        process.started += 1
        log.info(
            "replica %d of role `%s` started (pid %d)",
            process.replica,
            process.role,
            process.proc.pid,
            extra=event("replica_started", role=process.role, replica=process.replica, pid=process.proc.pid),
        )
        self.progress("starting", process.role, process.replica)
        process.relay = asyncio.ensure_future(self._relay(process, process.proc))
        process.watcher = asyncio.ensure_future(self._watch(process, process.proc))

    async def _relay(self, process: Process, proc: asyncio.subprocess.Process) -> None:
        """The replica's stderr on ours, line by line, but for the line saying why it could not
        start, which is kept (the supervisor reports it once), and those saying how its start
        goes (`progress`). Where the log is JSON, a line that is not (a print) becomes one."""
        from flowrt.deploy.worker import FAILED_LINE, PROGRESS_LINE

        assert proc.stderr is not None
        json_log = log_format() == "json"
        while True:
            try:
                line = await proc.stderr.readline()
            except (ValueError, asyncio.LimitOverrunError):  # a line longer than RELAY_LINE: pass it on in pieces
                line = await proc.stderr.read(RELAY_LINE)
            if not line:
                return
            text = line.decode(errors="replace")
            if text.startswith(FAILED_LINE):
                process.last_error = text[len(FAILED_LINE) :].strip()
                continue
            if text.startswith(PROGRESS_LINE):
                self.progress(text[len(PROGRESS_LINE) :].strip(), process.role, process.replica)
                continue
            if json_log and not text.startswith("{"):  # (not its log's: a print, a warning) a JSON line too
                where = event("replica_output", role=process.role, replica=process.replica)
                log.warning("%s", text.rstrip("\n"), extra=where)
                continue
            sys.stderr.write(text)
            sys.stderr.flush()

    async def _watch(self, process: Process, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if process.relay is not None:
            try:
                await process.relay
            except asyncio.CancelledError:
                pass
            except Exception:  # noqa: BLE001 - the relay's trouble must not stop the restart
                log.warning(
                    "the stderr of replica %d of role `%s` could not be relayed", process.replica, process.role, exc_info=True
                )
        if self.stopping:
            return
        from flowrt.deploy.worker import STARTUP_FAILED

        process.last_exit = exit_text(code) + (f": {process.last_error}" if process.last_error else "")
        record = self.directory.drop(process.role, process.replica, None, exit_text(code))
        starting = self.failed_start is not None and not self.failed_start.done()
        if code == STARTUP_FAILED and process.last_error:
            if starting:
                self.failed_start.set_result(process.last_error)
                return
            log.error("replica %d of role `%s` could not start again: %s", process.replica, process.role, process.last_error)
        if record is None and self.failed_start is not None and not self.failed_start.done():
            self.failed_start.set_result(
                f"replica {process.replica} of role `{process.role}` exited while starting ({exit_text(code)}); "
                "what it wrote to stderr, if anything, is above"
            )
            return
        await self._restart(process)

    async def _restart(self, process: Process) -> None:
        now = time.monotonic()
        process.restarts = [t for t in process.restarts if t > now - RESTART_WINDOW]
        if len(process.restarts) >= MAX_RESTARTS:
            log.error(
                "replica %d of role `%s` failed %d times in %gs; trying again in %gs",
                process.replica,
                process.role,
                MAX_RESTARTS,
                RESTART_WINDOW,
                RESTART_WINDOW,
            )
            process.paused_until = now + RESTART_WINDOW
            await asyncio.sleep(RESTART_WINDOW)  # (a cool-down: what it needs, Redis say, may be back by then)
            process.restarts.clear()
            if self.stopping:
                return
        backoff = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** len(process.restarts))
        process.restarts.append(now)
        log.warning(
            "restarting replica %d of role `%s` in %gs",
            process.replica,
            process.role,
            backoff,
            extra=event("replica_restarting", role=process.role, replica=process.replica, backoff_s=backoff),
        )
        await asyncio.sleep(backoff)
        if not self.stopping:
            self.restarted += 1
            await self._spawn(process)

    def _up(self, record: Record) -> None:
        """The registry has a replica up: calls may use it now."""
        self.remote.on_up(record)
        if self.remote.links.get((record.role, record.replica)) is None:
            return  # (not one of this bundle's: the remote said so)
        log.info(
            "replica %d of role `%s` is ready (pid %d)",
            record.replica,
            record.role,
            record.pid,
            extra=event("replica_ready", role=record.role, replica=record.replica, pid=record.pid),
        )
        self.progress("ready", record.role, record.replica)

    def shards_lost(self, record: Record, reason: str) -> None:
        if self.spread is not None:
            self.spread.lost(record.role, record.replica, reason)

    def _down(self, record: Record, reason: str) -> None:
        """The registry dropped a replica: its calls fail now; a process that lapsed is killed
        (its watcher restarts it), but only the process that record is of: one this supervisor
        started, whose PID the record carries (a record comes only from a holder of the
        deployment's keys; even so, one naming another process never gets this one killed)."""
        self.remote.on_down(record, reason)
        self.shards_lost(record, reason)
        process = self.processes.get((record.role, record.replica))
        if (
            process is not None
            and process.proc is not None
            and process.proc.returncode is None
            and "lapsed" in reason
            and record.pid == process.proc.pid
        ):
            with contextlib.suppress(ProcessLookupError):
                process.proc.kill()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.source.poll()
            except Exception:  # noqa: BLE001 - the registry's trouble is logged by it; keep ticking
                log.debug("registry poll failed", exc_info=True)

    async def close(self) -> None:
        self.stopping = True
        if self.ticker is not None:
            self.ticker.cancel()
        procs = [p for p in self.processes.values() if p.proc is not None and p.proc.returncode is None]
        from flowrt.transport import messages as m

        for link in list(self.remote.links.values()):
            with contextlib.suppress(zmq.ZMQError):
                link.send(m.Stop(m.VERSION))
        await self._reap(procs, None)
        await self._reap(procs, signal.SIGTERM)
        await self._reap(procs, signal.SIGKILL)
        for process in self.processes.values():
            for task in (process.watcher, process.relay):
                if task is not None and not task.done():
                    task.cancel()
        self.remote.close()
        if self.spread is not None:
            self.spread.close()
        if self.manager is not None:
            await self.manager.close()
        if self.memory is not None:
            self.memory.close()
        if self.source is not None:
            with contextlib.suppress(Exception):
                await self.source.close()
        self.context.destroy(linger=0)
        if self.directory_path is not None:
            remove_dir(self.directory_path)

    async def _reap(self, procs: list[Process], signum: int | None) -> None:
        alive = [p.proc for p in procs if p.proc is not None and p.proc.returncode is None]
        if not alive:
            return
        if signum is not None:
            for proc in alive:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_GRACE):
                await asyncio.gather(*(proc.wait() for proc in alive))

    def security(self) -> dict[str, int]:
        """What was refused between processes (flowrt.transport.keys, flowrt.registry.stores):
        registry records and messages that did not verify, peers the registry's socket refused."""
        source = self.source
        return {
            "forged_records": getattr(source, "forged", 0),
            "refused_peers": source.refused() if source is not None else 0,
        }

    def pids(self) -> dict[str, int]:
        return {
            f"{p.role}/{p.replica}": p.proc.pid
            for p in self.processes.values()
            if p.proc is not None and p.proc.returncode is None
        }
