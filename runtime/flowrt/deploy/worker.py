"""One replica of one role in a process of its own: `python -m flowrt.deploy.worker CONFIG`.

It opens the bundle, imports and constructs its role's class, runs `setup`, binds a ROUTER
socket, registers, and serves activations the gateway starts: each runs as a task; a streamed
frame goes back as soon as it is yielded (at most WINDOW frames ahead of what the gateway has
taken); the end carries the changes the role made to its session globals. The role's frames
are checked against its interface here, with the embedded runtime's own checks, so a broken
contract is reported with the same message and place. Garbage on the socket is logged and
dropped. The process exits when its parent goes away (so a killed supervisor leaves no
orphans), on `Stop`, or on SIGTERM.

Its ROUTER admits only the gateway's key (flowrt.transport.keys), so nothing from a peer
without it is ever decoded. An activation belongs to the connection that started it: a `Cancel` or `Credit` for it from another is ignored and counted (`foreign`); a
`Stop` is taken only from a peer authenticated with the gateway's (the supervisor's) key.

Exit status 3 means the replica could not start; its stderr line starting FAILED_LINE says why.
Lines starting PROGRESS_LINE tell the supervisor how its start goes (`setup_started` before it
imports its role, `setup_ended` once the role is constructed and set up). Where the log is JSON,
its lines carry the replica's role and index, and those logged while an activation runs its
call id and session (flowrt.logs).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.util
import json
import logging
import os
import signal
import socket
import sys
import uuid
from pathlib import Path
from types import AsyncGeneratorType
from typing import Any

import zmq
import zmq.asyncio

from flowrt.bundle import load_bundle
from flowrt.control import impls
from flowrt.control.contract import bad_input, checked_frame, failure, second_frame, waiting_place
from flowrt.control.program import GraphProgram
from flowrt.control.roles import Context
from flowrt.control.sessions import globals_changes, snapshot_globals
from flowrt.control.threads import ReplicaThread, streams
from flowrt.deploy import kvpools
from flowrt.errors import FlowrtError
from flowrt.logs import SCOPE, Scope, show_log
from flowrt.memory.client import REQUEST_TIMEOUT, MemoryClient, MemoryError_
from flowrt.registry import RegistryError, open_client
from flowrt.tables import node_tables
from flowrt.transport import codec
from flowrt.transport import messages as m
from flowrt.transport.keys import Guard, Keys
from flowrt.transport.sockets import Coalescer, Reader, bind, unbatch

WINDOW = 64  # frames of one stream a replica may send before the gateway takes some
STARTUP_FAILED = 3
FAILED_LINE = "flowrt-replica-failed: "  # the stderr line saying why it could not start (read by the supervisor)
PROGRESS_LINE = "flowrt-replica-progress: "  # a stderr line saying how its start goes (read by the supervisor)
log = logging.getLogger("flowrt.worker")


class Interface:
    """What the replica checks a frame of one (graph, interface) against."""

    __slots__ = ("node_id", "out_fields", "stream")

    def __init__(self, node_id: str, out_fields: frozenset, stream: bool):
        self.node_id, self.out_fields, self.stream = node_id, out_fields, stream


class Replica:
    def __init__(self, config: dict):
        self.config = config
        self.role_name: str = config["role"]
        self.index: int = config["replica"]
        self.incarnation = uuid.uuid4().hex[:12]
        self.bundle = load_bundle(Path(config["bundle"]))
        self.python_path = self.bundle.python_path
        self.spec = self.bundle.roles[self.role_name]
        self.interfaces: dict[tuple[str, str], Interface] = {}
        for graph, plan in self.bundle.plan["graphs"].items():
            program = GraphProgram(graph, plan, {nid: node_tables(node) for nid, node in plan["nodes"].items()})
            for node in program.nodes:
                if node.interface and node.role == self.role_name:
                    self.interfaces[(graph, node.method)] = Interface(node.id, node.out_fields, bool(node.stream))
        self.instance: Any = None
        self.thread: ReplicaThread | None = None
        self.methods: dict[str, Any] = {}
        self.tasks: dict[int, asyncio.Task] = {}
        self.credits: dict[int, int] = {}
        self.credit_waiters: dict[int, asyncio.Future] = {}
        self.cancelled: set[int] = set()
        self.queued = 0
        self.tokens = 0
        self.garbage = 0
        self.foreign = 0  # Cancel, Credit or Stop from a peer that does not own the activation (or the replica)
        self.owners: dict[int, bytes] = {}  # activation -> the connection (routing id) that started it
        self.keys = Keys.from_config(config.get("keys"))  # the deployment's (flowrt.transport.keys)
        self.guard: Guard | None = None
        self.context = zmq.asyncio.Context()  # the registry client's
        self.plain = zmq.Context()  # the activations' socket, read by flowrt.transport.sockets.Reader
        self.socket: zmq.Socket | None = None
        self.reader: Reader | None = None
        self.outboxes: dict[bytes, Coalescer] = {}  # per gateway
        self.stopping = asyncio.Event()
        self.memory: Any = None  # ctx.memory (flowrt.memory.api.ProcessMemory) where the deployment has a manager
        self.decoder: Any = None
        self.gateway_pid = config.get("gateway_pid") or 0
        self.scoped = config.get("log_format") == "json"  # records logged by an activation carry its call id
        self.reports = False  # progress lines on stderr: a process of its own's (`amain`), read by its supervisor
        self.shards: Any = None  # with FLOWRT_CONTROL=shards: its part of every call, and the sockets to its peers
        self.peers: Any = None

    def open_memory(self) -> None:
        """Connect to the machine's memory manager, if the deployment runs one."""
        memory = self.config.get("memory")
        if not memory:
            if importlib.util.find_spec("numpy") is not None:  # no data plane (--pool-mb 0): ctx.memory as under inproc
                from flowrt.memory.api import InprocMemory

                self.memory = InprocMemory()
            return
        from flowrt.memory.api import ProcessMemory
        from flowrt.memory.tensors import Decoder

        # a request may hold this process's loop: never for as long as a heartbeat may lapse
        timeout = min(REQUEST_TIMEOUT, max(0.2, self.config["ttl"] / 3))
        try:
            client = MemoryClient(
                memory["endpoint"],
                "replica",
                f"{self.role_name}/{self.index}",
                participants=memory["participants"],
                colocated=memory.get("colocated", ""),
                timeout=timeout,
                keys=self.keys,
                as_="member",
            )
        except MemoryError_ as error:
            raise FlowrtError(f"replica {self.index} of role `{self.role_name}`: {error}") from None
        self.memory = ProcessMemory(client)
        self.decoder = Decoder(client)

    def encoder(self, call: str) -> Any:
        """The data plane's side of sending a frame: None where the gateway is on another
        machine (its frames' tensors are pickled whole: a handle would mean nothing there)."""
        if self.decoder is None or not self.config["memory"].get("gateway_shares", True):
            return None
        from flowrt.memory.tensors import Encoder

        return Encoder(self.memory.client, call)

    async def open(self) -> None:
        self.progress("setup_started")
        self.open_memory()
        kvpools.attach(
            self.memory,
            self.bundle.plan,
            self.config["deployment"],
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
        )
        cls = impls.import_impl(self.spec, self.python_path, self.bundle.path)
        self.instance = impls.construct(self.spec, cls, self.python_path, count=1)[0]
        impls.check_instance(self.spec, self.instance)
        # plain `def` methods run on this replica's worker thread (flowrt.control.threads)
        self.thread = ReplicaThread(f"{self.role_name}/{self.index}", self.python_path)
        self.methods = {name: self.thread.bind(getattr(self.instance, name)) for name in self.spec.interfaces}
        setup = getattr(self.instance, "setup", None)
        if setup is not None:
            ctx = Context(
                "", 0, "", self.role_name, "setup", {}, logging.getLogger(f"flowrt.{self.bundle.name}"), self.index, self.memory
            )
            try:
                await self.thread.setup(setup, ctx)
            except Exception as error:  # noqa: BLE001 - the user's setup: one clear line
                message, where = failure(error, None, self.python_path)
                raise FlowrtError(
                    f"role `{self.role_name}`: setup() of replica {self.index} raised {message}"
                    + (f" at {where}" if where else "")
                    + "; fix setup (it runs once per replica when the deployment starts)"
                ) from None
        self.progress("setup_ended")
        self.socket = self.plain.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        if self.keys is None:
            raise FlowrtError(f"replica {self.index} of role `{self.role_name}`: its configuration carries no keys")
        self.guard = Guard(self.plain, self.keys, ["gateway"], f"replica {self.index} of role `{self.role_name}`")
        self.keys.serve(self.socket, self.config["address"])
        self.address = bind(self.socket, self.config["address"])
        self.generators = sorted(name for name in self.spec.interfaces if streams(getattr(self.instance, name, None)))
        if self.config.get("shards"):  # this process hosts its role's part of every call (flowrt.control.shards)
            from flowrt.deploy.peers import host_process

            what = f"replica {self.index} of role `{self.role_name}`"
            self.shards, self.peers = host_process(
                self.config["shards"], self.bundle, self.keys, self.role_name, self.instance, self.thread, self.memory, what
            )
            self.peers.encoder = lambda call_id: self.encoder(f"{self.gateway_pid}:{call_id}")
            if self.decoder is not None:  # a tensor received from a peer is held by this process while it lives
                from flowrt.memory.tensors import Decoder

                self.peers.decoder = Decoder(self.memory.client, adopt=True)
        await self.connect_registry()

    def progress(self, step: str) -> None:
        if self.reports:
            print(f"{PROGRESS_LINE}{step}", file=sys.stderr, flush=True)

    def register(self) -> m.Register:
        return m.Register(m.VERSION, self.role_name, self.index, self.incarnation, self.address, os.getpid(), self.generators)

    def heartbeat(self) -> m.Heartbeat:
        running = len(self.tasks)
        if self.shards is not None:  # (its part of calls spread over the replicas: the gateway reads it from here)
            running += self.shards.statistics().get("running", 0)
        return m.Heartbeat(m.VERSION, self.role_name, self.index, self.incarnation, running, self.queued, self.tokens)

    async def connect_registry(self) -> None:
        try:
            self.client = await open_client(
                self.config.get("registry"),
                self.context,
                self.config["registry_endpoint"],
                self.config["deployment"],
                self.config["ttl"],
                self.keys,
            )
        except RegistryError as error:
            raise FlowrtError(f"replica {self.index} of role `{self.role_name}`: {error}") from None

    async def heartbeats(self) -> None:
        client = self.client
        parent = self.config.get("parent")
        try:
            register = self.register()
            interval = self.config["ttl"] / 3
            while not self.stopping.is_set():
                try:
                    await client.beat(register, self.heartbeat())
                except Exception:  # noqa: BLE001 - a heartbeat that failed is retried at the next one
                    log.warning("replica %d of role `%s`: a heartbeat failed", self.index, self.role_name, exc_info=True)
                if self.decoder is not None:  # (a memory manager restarted since learns the barrier sizes agreed)
                    self.memory.client.resettle()
                kvpools.keep_alive(self.memory)
                if parent and os.getppid() != parent:
                    log.warning("replica %d of role `%s`: its supervisor is gone; stopping", self.index, self.role_name)
                    self.stopping.set()
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), interval)
        finally:
            await client.close()

    async def serve(self) -> None:
        assert self.socket is not None
        self.reader = Reader(self.socket, self._received, asyncio.get_running_loop())
        if self.guard is not None:
            self.guard.watch(self.socket, asyncio.get_running_loop())
        beats = asyncio.ensure_future(self.heartbeats())
        await self.stopping.wait()
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(beats, *self.tasks.values(), return_exceptions=True)
        if self.thread is not None:
            self.thread.close()
        kvpools.detach(self.memory)
        if self.guard is not None:
            self.guard.stop()
        if self.peers is not None:
            self.peers.close()
        self.reader.close()
        self.plain.destroy(linger=0)
        self.context.destroy(linger=0)

    def send(self, peer: bytes, envelope: m.Message, payload: Any = None, *, bare: bool = False, call: str = "") -> None:
        """Send `envelope` (and `payload`, pickled; its large tensors put in the pool for `call`)
        to the gateway `peer`; codec.Unpicklable if the payload cannot cross processes."""
        frames = (
            [m.encode(envelope)] if bare else [m.encode(envelope), *codec.dumps(payload, self.encoder(call) if call else None)]
        )
        out = self.outboxes.get(peer)
        if out is None:
            out = self.outboxes[peer] = Coalescer(self.socket, self.reader, asyncio.get_running_loop(), [peer])
        out.send(frames)

    def _received(self, frames: list) -> None:
        if len(frames) < 2:
            self._garbage("a message without an envelope")
            return
        self._handle(frames[0].bytes, frames[1:])

    def _handle(self, peer: bytes, frames: list, nested: bool = False) -> None:
        try:
            message = m.decode("gateway", frames[0].buffer)
        except m.Garbage as error:
            self._garbage(str(error))
            return
        kind = type(message)
        if kind is m.Batch:
            messages = None if nested else unbatch(message.sizes, frames[1:])
            if messages is None:
                self._garbage(f"a batch whose sizes {message.sizes} do not add up to its {len(frames) - 1} frames")
                return
            for each in messages:
                self._handle(peer, each, nested=True)
            return
        if kind is m.Start:
            try:
                payload = codec.loads(frames[1:], self.decoder)
                inputs, uses = payload if message.uses else (payload, None)
                if not isinstance(inputs, dict) or (uses is not None and not isinstance(uses, dict)):
                    raise TypeError("inputs must be a dict")
            except Exception as error:  # noqa: BLE001 - answered: the gateway waits for this activation
                # (a tensor that cannot be mapped here: its manager died, or this process is out of
                # address space or map slots; or a payload that does not unpickle)
                why = str(error) if isinstance(error, MemoryError_) else f"{type(error).__name__}: {error}"
                if not isinstance(error, MemoryError_):
                    self._garbage(f"a start whose payload cannot be read ({why})")
                text = (
                    f"replica {self.index} of role `{self.role_name}` could not read the inputs of `{message.interface}`: {why}"
                )
                self.send(peer, m.Failed(m.VERSION, message.act, text, "", False, False), (None, None))
                return
            self.credits[message.act] = WINDOW
            self.owners[message.act] = peer
            task = self.tasks[message.act] = asyncio.ensure_future(self._activation(peer, message, inputs, uses))
            task.add_done_callback(lambda _, act=message.act, peer=peer: self._ended(act, peer))
        elif kind is m.Credit:
            if self.owners.get(message.act, peer) != peer:
                self._foreign("a credit", message.act)
                return
            self.credits[message.act] = self.credits.get(message.act, 0) + message.frames
            waiter = self.credit_waiters.pop(message.act, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        elif kind is m.Cancel:
            if self.owners.get(message.act, peer) != peer:
                self._foreign("a cancel", message.act)
                return
            task = self.tasks.get(message.act)
            if task is not None:
                self.cancelled.add(message.act)
                task.cancel()
        elif kind is m.Probe:
            tracked = len(self.credits) + len(self.credit_waiters) + len(self.cancelled)
            if self.shards is not None:  # (its shards, and what they hold)
                tracked += sum(self.shards.statistics().values())
            pools = getattr(self.memory, "params", None)
            kv = pools.statistics() if pools is not None and pools.pools else {}
            running = len(self.tasks) + (self.thread.running() if self.thread is not None else 0)
            counts = {"peers": self.guard.refused if self.guard is not None else 0, "foreign_messages": self.foreign}
            refused = {name: count for name, count in counts.items() if count}  # (what it refused: none, mostly)
            self.send(peer, m.Stats(m.VERSION, message.token, running, tracked, kv, refused), bare=True)
        elif kind is m.Stop:
            if _user(frames[0]) not in self.keys.user("gateway"):
                self._foreign("a stop", 0)
                return
            self.stopping.set()

    def _ended(self, act: int, peer: bytes) -> None:
        """An activation's task is done: untrack it. One cancelled before its first step never
        ran its body, so it was not answered either: answer it here."""
        if act in self.cancelled:
            self.cancelled.discard(act)
            with contextlib.suppress(zmq.ZMQError):
                self.send(peer, m.Cancelled(m.VERSION, act, ""), bare=True)
        self.tasks.pop(act, None)
        self.owners.pop(act, None)
        self.credits.pop(act, None)
        self.credit_waiters.pop(act, None)

    def _foreign(self, what: str, act: int) -> None:
        self.foreign += 1
        if self.foreign == 1 or self.foreign % 100 == 0:
            log.warning(
                "replica %d of role `%s`: ignored %s (activation %d) from a peer that does not own it (%d so far)",
                self.index,
                self.role_name,
                what,
                act,
                self.foreign,
            )

    def _garbage(self, why: str) -> None:
        self.garbage += 1
        log.warning("replica %d of role `%s`: dropped %s", self.index, self.role_name, why)

    async def _activation(self, peer: bytes, start: m.Start, inputs: dict, uses: dict | None) -> None:
        act = start.act
        call = f"{self.gateway_pid}:{start.call_id}"  # the manager's key of the call (flowrt.memory.protocol)
        interface = self.interfaces.get((start.graph, start.interface))
        result: Any = None
        before = snapshot_globals(uses)
        memory = None if self.memory is None else self.memory.for_call(call)
        if self.scoped:
            SCOPE.set(Scope(start.call_id, start.session, self.role_name, self.index))
        try:
            if interface is None:
                raise LookupError(f"role `{self.role_name}` has no interface `{start.interface}` in graph `{start.graph}`")
            method = self.methods[start.interface]
            ctx = Context(
                start.session,
                start.call_id,
                start.graph,
                self.role_name,
                start.interface,
                uses or {},
                _role_log(self),
                self.index,
                memory,
            )
            result = method(ctx, **inputs)
            if type(result) is AsyncGeneratorType:
                sent = 0
                async for frame in result:
                    if type(frame) is not dict or not frame.keys() <= interface.out_fields:
                        frame = checked_frame(frame, interface.node_id, interface.out_fields)
                    if sent and not interface.stream:
                        raise second_frame(interface.node_id)
                    while self.credits.get(act, 0) <= 0:
                        waiter = self.credit_waiters[act] = asyncio.get_running_loop().create_future()
                        await waiter
                    self.credits[act] -= 1
                    self.send(peer, m.Frame(m.VERSION, act), frame, call=call)
                    sent += 1
                changes = globals_changes(before, uses)
                self.send(peer, m.Return(m.VERSION, act, False, changes is not None), (None, changes))
            else:
                frame = await result
                if frame is not None and (type(frame) is not dict or not frame.keys() <= interface.out_fields):
                    frame = checked_frame(frame, interface.node_id, interface.out_fields)
                changes = globals_changes(before, uses)
                self.send(peer, m.Return(m.VERSION, act, frame is not None, changes is not None), (frame, changes), call=call)
        except asyncio.CancelledError as error:
            if act in self.cancelled:
                where = waiting_place(error, result, self.python_path)
                with contextlib.suppress(zmq.ZMQError):
                    self.send(peer, m.Cancelled(m.VERSION, act, where), bare=True)
            else:
                self._failed(peer, act, error, result, before, uses)
        except BaseException as error:  # noqa: BLE001 - even SystemExit from a role fails its activation, not the process
            self._failed(peer, act, error, result, before, uses)
        finally:
            self.cancelled.discard(act)  # answered above; `_ended` untracks it
            if self.decoder is not None:  # (the shared pool's: what the activation took goes with it)
                memory.release()

    def _failed(self, peer: bytes, act: int, error: BaseException, result: Any, before, uses) -> None:
        if isinstance(error, codec.Unpicklable):
            message, where = f"a frame cannot cross processes: {error}", ""
        elif isinstance(error, MemoryError_):
            message, where = f"{error}", ""
        else:
            message, where = failure(error, result, self.python_path)
        log.debug("replica %d of role `%s`: activation %d failed", self.index, self.role_name, act, exc_info=error)
        changes = globals_changes(before, uses)
        client = bad_input(error)
        try:
            self.send(peer, m.Failed(m.VERSION, act, message, where, False, changes is not None, client), (None, changes))
        except codec.Unpicklable as unpicklable:  # the globals it changed cannot travel: say so, lose them
            message += f" (and its session globals cannot cross processes: {unpicklable})"
            self.send(peer, m.Failed(m.VERSION, act, message, where, False, False, client), (None, None))


def _user(frame: Any) -> str:
    """The peer's authenticated User-Id (ZAP's: the z85 of its CURVE public key, or the PLAIN
    user name its token proved), or ""."""
    try:
        return frame.get("User-Id") or ""
    except (zmq.ZMQError, AttributeError):
        return ""


def _role_log(replica: Replica) -> logging.Logger:
    return logging.getLogger(f"flowrt.{replica.bundle.name}")


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans even if the
    supervisor is killed with -9); elsewhere the heartbeat loop's parent check does it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


async def amain(config: dict) -> int:
    try:
        replica = Replica(config)
    except FlowrtError as error:
        print(f"{FAILED_LINE}{error}", file=sys.stderr, flush=True)
        return STARTUP_FAILED
    replica.reports = True
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, replica.stopping.set)
    try:
        await replica.open()
    except FlowrtError as error:
        print(f"{FAILED_LINE}{error}", file=sys.stderr, flush=True)
        return STARTUP_FAILED
    except zmq.ZMQError as error:
        where = f"replica {replica.index} of role `{replica.role_name}`"
        print(f"{FAILED_LINE}{where} cannot listen on {config['address']}: {error}", file=sys.stderr, flush=True)
        return STARTUP_FAILED
    await replica.serve()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m flowrt.deploy.worker ROLE/REPLICA`, its configuration in $FLOWRT_REPLICA_CONFIG
    (JSON; the environment, unlike the command line, is not readable by other users)."""
    config = json.loads(os.environ.pop("FLOWRT_REPLICA_CONFIG", "{}") or "{}")
    if not config:
        print("flowrt: this is a replica process of a deployment; `flowc run --deploy local` starts it", file=sys.stderr)
        return 2
    if config.get("parent") and os.getppid() != config["parent"]:
        return STARTUP_FAILED  # the supervisor died before this process started
    _die_with_parent()
    show_log(
        debug=bool(config.get("debug")),
        log_format=config.get("log_format", "text"),
        defaults={"role": config.get("role"), "replica": config.get("replica")},
    )
    for entry in reversed(config.get("sys_path", [])):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        return asyncio.run(amain(config))
    except KeyboardInterrupt:  # (its own session: only a signal sent to it on purpose)
        return 130


if __name__ == "__main__":
    sys.exit(main())
