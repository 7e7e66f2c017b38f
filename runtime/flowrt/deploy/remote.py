"""The gateway's side of replicas in other processes: links to them, and role bindings whose
activations run there.

The control core runs every call in the gateway, unchanged; what differs is `RemoteBinding`,
which starts an activation by sending it to a replica chosen among those up (`lb`), and gives
the core a stand-in with the role method's own shape: an async generator whose frames arrive
from the replica, or a coroutine that returns its frame. A failure there (the role raised, its
frame broke the contract, its process went away) raises `RemoteFailure` with the message and
the place as the embedded runtime words them, so a call's events do not depend on where its
roles ran. `Remote` owns one DEALER socket per replica incarnation the registry reported up,
and ends every activation waiting on one that goes down with an error naming it.

An activation of a role none of whose replicas is up (all restarting) waits, in a queue per
role (first come, first started), until one comes up (broadcast: every one up); `begin`
returns a ticket (a negative replica) that `finished` turns into the replica chosen, so load
counts stay exact. It fails only when none comes up within REPLICA_WAIT seconds
($FLOWRT_REPLICA_WAIT), saying how long it waited and why (`explain`). `moved` counts, per
producer and the fields of its frames, the frames from replicas and their bytes as the data
plane moved them: /metrics' bytes per edge (flowrt.deploy.observed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import zlib
from collections import OrderedDict, deque
from typing import Any

import zmq

from flowrt.control.contract import RemoteFailure
from flowrt.control.roles import RoleBinding
from flowrt.control.sessions import apply_globals_changes
from flowrt.errors import FlowrtError
from flowrt.logs import dropped
from flowrt.options import wait_seconds
from flowrt.registry import Record
from flowrt.registry.directory import TOKENS_PER_ACTIVATION
from flowrt.transport import codec
from flowrt.transport import messages as m
from flowrt.transport.messages import VERSION
from flowrt.transport.sockets import Coalescer, Reader, unbatch

BROADCAST = -2  # as flowrt.control.roles.BROADCAST (a C constant in the compiled core)
WINDOW = 64  # as flowrt.deploy.worker: frames a replica may send ahead; credit goes back per half window
ACK_WAIT = 1.0  # seconds a cancelled activation waits for its replica to say where it stood
STICKY_SESSIONS = 65_536  # `lb session`: at most this many sessions remember their replica
REPLICA_WAIT = 10.0  # seconds an activation waits for a replica of its role to come up (the restart backoffs add up to ~8 s)
WAIT_ENV = "FLOWRT_REPLICA_WAIT"  # overrides REPLICA_WAIT (0: fail at once), for roles that take longer to start
log = logging.getLogger("flowrt.deploy")


class Pending:
    """One activation running on a replica, as the gateway sees it."""

    __slots__ = ("act", "link", "frames", "outcome", "waiter", "taken", "uses", "blocks", "call", "source")

    def __init__(self, act: int, link: Link, uses: dict | None):
        self.act = act
        self.link = link
        self.frames: deque = deque()
        # ("return", frame, changes) | ("failed", message, where, changes[, bad_input]) | ("cancelled", where)
        self.outcome: tuple | None = None
        self.waiter: asyncio.Future | None = None
        self.taken = 0
        self.uses = uses
        self.blocks: list[int] = ()  # pool blocks its inputs hold a ref on (freed when it ends)
        self.call = ""
        self.source: tuple[str, str] = ("", "")  # (graph, role.interface): whose frames it receives

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)


class Turn:
    """An activation waiting in its role's queue for a replica to come up."""

    __slots__ = ("future", "expired")

    def __init__(self, future: asyncio.Future):
        self.future = future
        self.expired = False

    def wake(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def expire(self) -> None:
        self.expired = True
        self.wake()


def replica_wait() -> float:
    """How long an activation waits for a replica: $FLOWRT_REPLICA_WAIT, else REPLICA_WAIT
    (ValueError naming the value if it is not a number of seconds, 0 or more)."""
    text = os.environ.get(WAIT_ENV, "").strip()
    return wait_seconds(text) if text else REPLICA_WAIT


class Link:
    """The gateway's socket to one incarnation of one replica."""

    def __init__(self, remote: Remote, record: Record):
        self.record = record
        self.socket = sock = remote.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)  # never refuse a send: what is in flight is bounded by calls and credits
        sock.setsockopt(zmq.RCVHWM, 0)
        remote.keys.dial(sock, "gateway", record.address)  # (only the deployment's replica answers: flowrt.transport.keys)
        sock.connect(record.address)
        self.pending: dict[int, Pending] = {}
        self.up = True
        loop = asyncio.get_running_loop()
        self.reader = Reader(sock, lambda frames: remote.received(self, frames), loop)
        self.out = Coalescer(sock, self.reader, loop)
        self.traffic = remote.traffic

    def send(self, envelope: m.Message, payload: list | None = None, counted: bool = True) -> None:
        self.traffic[0] += counted  # (a statistics probe is not a call's message)
        self.out.send([m.encode(envelope)] if payload is None else [m.encode(envelope), *payload])

    def close(self) -> None:
        self.up = False
        self.reader.close()


class Remote:
    def __init__(self, replicas: dict[str, int], wait: float, keys: Any):
        self.context = zmq.Context()  # plain sockets, read by flowrt.transport.sockets.Reader
        self.keys = keys  # the deployment's (flowrt.transport.keys.Keys): links dial with the gateway's key
        self.replicas = replicas  # role -> how many replicas it declares
        self.links: dict[tuple[str, int], Link] = {}
        self.live: dict[str, list[int]] = {role: [] for role in replicas}
        self.generators: dict[str, frozenset[str]] = {}
        self.acts = itertools.count(1)
        self.probes: dict[int, asyncio.Future] = {}
        self.garbage = 0
        self.traffic = [0, 0]  # calls' messages sent, received (however batched; docs/design/decentralised.md)
        self.up_event = asyncio.Event()  # set whenever a replica comes up (tests and start-up wait on it)
        self.wait = wait  # seconds an activation waits for a replica of its role (REPLICA_WAIT)
        self.spread = False  # calls are spread over the replicas (flowrt.deploy.shard_gateway): none run through here
        self.queues: dict[str, deque[Turn]] = {role: deque() for role in replicas}  # activations waiting for a replica
        self.last_down: dict[str, str] = {}  # role -> the last replica of it that went down, and why
        self.explain: Any = None  # role -> what the supervisor knows of why none of its replicas is up
        self.stopping = False
        self.memory: Any = None  # the gateway's MemoryClient, where the deployment runs a manager
        self.decoder: Any = None
        self.foreign: set[tuple[str, int]] = set()  # replicas on other machines than the gateway's manager: pickled tensors
        self.pid = os.getpid()
        self.moved: dict[tuple, list[int]] = {}  # ((graph, role.interface), fields) -> [frames, bytes] (the docstring)

    def use_memory(self, client: Any) -> None:
        from flowrt.memory.tensors import Decoder

        self.memory = client
        self.decoder = Decoder(client, adopt=True)

    def call_key(self, call_id: Any) -> str:
        return f"{self.pid}:{call_id}"

    def retired(self, call_id: Any) -> None:
        """A call has ended: the manager drops whatever its blocks still hold for it."""
        if self.memory is not None:
            from flowrt.memory import protocol as mp

            self.memory.post(mp.ReleaseCall(mp.VERSION, 0, self.call_key(call_id)))

    # ── the registry's events ──

    def on_up(self, record: Record) -> None:
        key = (record.role, record.replica)
        if record.role not in self.replicas or not 0 <= record.replica < self.replicas[record.role]:
            log.warning("registry: ignored replica %d of role `%s`, which this bundle does not have", record.replica, record.role)
            return
        old = self.links.pop(key, None)
        if old is not None:
            self._fail_link(old, "was replaced by a new process")
        self.links[key] = Link(self, record)
        self.generators[record.role] = record.generators
        self.live[record.role] = sorted(r for (role, r) in self.links if role == record.role)
        self.up_event.set()
        queue = self.queues[record.role]
        if queue:
            queue[0].wake()  # the first waiting activation starts; it wakes the next (`turn`)

    def on_down(self, record: Record, reason: str) -> None:
        key = (record.role, record.replica)
        link = self.links.get(key)
        if link is None or link.record.incarnation != record.incarnation:
            return
        del self.links[key]
        self.live[record.role] = sorted(r for (role, r) in self.links if role == record.role)
        log.warning("replica %d of role `%s` is down: %s", record.replica, record.role, reason, extra=dropped(record, reason))
        self.last_down[record.role] = f"replica {record.replica} went away: {reason}"
        self._fail_link(link, reason)

    def _fail_link(self, link: Link, reason: str) -> None:
        link.close()
        message = f"replica {link.record.replica} of role `{link.record.role}` went away: {reason}"
        for pending in list(link.pending.values()):
            if pending.outcome is None or pending.outcome[0] != "return":
                pending.outcome = ("failed", message, "", None)
            pending.wake()
        link.pending.clear()

    # ── messages from replicas ──

    def received(self, link: Link, frames: list, nested: bool = False) -> None:
        """A message from a replica (called by the link's Reader)."""
        try:
            message = m.decode("replica", frames[0].buffer)
            kind = type(message)
            if kind is m.Batch:
                messages = None if nested else unbatch(message.sizes, frames[1:])
                if messages is None:
                    raise m.Garbage(f"a batch whose sizes {message.sizes} do not add up to its {len(frames) - 1} frames")
                for each in messages:
                    self.received(link, each, nested=True)
                return
            if kind is not m.Stats:
                self.traffic[1] += 1
            if kind is m.Stats:
                probe = self.probes.pop(message.token, None)
                if probe is not None and not probe.done():
                    answer = {"running": message.running, "tracked": message.tracked}  # (kv, refused: if any)
                    probe.set_result(answer | {k: v for k, v in (("kv", message.kv), ("refused", message.refused)) if v})
                return
            pending = link.pending.get(message.act)
            if pending is None:
                return  # an activation already ended here (cancelled, or its replica replaced)
            if kind is m.Frame:
                frame = self._payload(pending, frames, False)
                pending.frames.append(frame)
            elif kind is m.Return:
                frame, changes = self._payload(pending, frames, True)
                pending.outcome = ("return", frame, changes)
            elif kind is m.Failed:
                _, changes = codec.loads(frames[1:], self.decoder)
                pending.outcome = ("failed", message.message, message.where, changes, message.bad_input)
            else:  # Cancelled
                pending.outcome = ("cancelled", message.where)
        except m.Garbage as error:
            self._garbage(link, str(error))
            return
        except Exception as error:  # noqa: BLE001 - a payload that does not unpickle
            why = f"{type(error).__name__}: {error}"
            self._garbage(link, f"a message whose payload cannot be read ({why})")
            pending = link.pending.get(getattr(message, "act", -1))
            if pending is None or pending.outcome is not None:
                return
            # its activation cannot go on without it: end it with an error naming the role
            pending.outcome = (
                "failed",
                f"a frame of replica {link.record.replica} could not be read in the gateway ({why})",
                "",
                None,
            )
            link.send(m.Cancel(VERSION, pending.act))
        pending.wake()

    def _payload(self, pending: Pending, frames: list, returned: bool) -> Any:
        """A Frame's or Return's payload, its frame and bytes counted in `moved`."""
        decoder = self.decoder
        mapped = decoder.nbytes if decoder is not None else 0
        value = codec.loads(frames[1:], decoder)
        frame = value[0] if returned else value
        if type(frame) is dict:
            size = sum(len(part) for part in frames[1:]) + (decoder.nbytes - mapped if decoder is not None else 0)
            key = (pending.source, tuple(frame))
            counts = self.moved.get(key)
            if counts is None:
                counts = self.moved[key] = [0, 0]
            counts[0] += 1
            counts[1] += size
        return value

    def _garbage(self, link: Link, why: str) -> None:
        self.garbage += 1
        log.warning("from replica %d of role `%s`: dropped %s", link.record.replica, link.record.role, why)

    # ── activations ──

    def link(self, role: str, replica: int) -> Link:
        link = self.links.get((role, replica))
        if link is None:
            raise RemoteFailure(f"replica {replica} of role `{role}` is not up")
        return link

    async def turn(self, role: str) -> None:
        """Wait until a replica of `role` is up and every activation that waited for one before
        this one has started; RemoteFailure if none comes up within `wait` seconds."""
        loop = asyncio.get_running_loop()
        queue, live = self.queues[role], self.live
        turn = Turn(loop.create_future())
        queue.append(turn)
        expiry = loop.call_later(self.wait, turn.expire)
        try:
            while True:
                if self.stopping:
                    raise RemoteFailure(f"no replica of role `{role}` is up, and the deployment is stopping")
                if live[role] and queue[0] is turn:
                    return  # (the caller starts the activation before it yields: the order holds)
                if turn.expired and not live[role]:
                    raise RemoteFailure(self.not_up(role))
                if turn.future.done():
                    turn.future = loop.create_future()
                await turn.future  # woken by on_up, by the activation before it, or by its expiry
        finally:
            expiry.cancel()
            queue.remove(turn)
            if queue and live[role]:
                queue[0].wake()

    def not_up(self, role: str) -> str:
        """Why an activation waited for a replica of `role` in vain."""
        why = (self.explain(role) if self.explain is not None else "") or self.last_down.get(role, "")
        return (
            f"no replica of role `{role}` came up within the {self.wait:g}s this call waited for one"
            + (f": {why}" if why else "")
            + f". The log says more; if the role only needs longer to start, set {WAIT_ENV} (seconds)"
        )

    def _start(self, link: Link, start: m.Start, inputs: dict, uses: dict | None) -> Pending:
        pending = Pending(start.act, link, uses)
        pending.source = (start.graph, f"{link.record.role}.{start.interface}")
        encoder = None
        if self.memory is not None and (link.record.role, link.record.replica) not in self.foreign:
            from flowrt.memory.tensors import Encoder

            pending.call = self.call_key(start.call_id)
            encoder = Encoder(self.memory, pending.call, gateway=True)
        try:
            payload = codec.dumps((inputs, uses) if uses is not None else inputs, encoder)
        except codec.Unpicklable as error:
            raise RemoteFailure(f"the inputs of `{start.interface}` cannot cross processes: {error}") from None
        except FlowrtError as error:  # the data plane refused (the pool is full, its manager is gone)
            raise RemoteFailure(f"the inputs of `{start.interface}` could not be put in shared memory: {error}") from None
        if encoder is not None:
            pending.blocks = encoder.take_refs()  # posted before the start: the refs exist when it runs
        link.pending[start.act] = pending
        link.send(start, payload)
        return pending

    async def stream(self, link: Link | None, start: m.Start, inputs: dict, uses: dict | None, choose: Any = None):
        """The stand-in for a streaming role's async generator (without a link: `await choose()`,
        which waits for a replica, gives it)."""
        if link is None:
            link = await choose()
        pending = self._start(link, start, inputs, uses)
        try:
            frames = pending.frames
            while True:
                if frames:
                    frame = frames.popleft()
                    pending.taken += 1
                    if pending.taken >= WINDOW // 2 and link.up:
                        link.send(m.Credit(VERSION, pending.act, pending.taken))
                        pending.taken = 0
                    yield frame
                    continue
                if pending.outcome is not None:
                    _finish(pending)
                    return
                pending.waiter = asyncio.get_running_loop().create_future()
                await pending.waiter
        except asyncio.CancelledError as error:
            await self._cancelled(pending, error)
            raise
        finally:
            self._forget(pending)

    async def once(self, link: Link | None, start: m.Start, inputs: dict, uses: dict | None, choose: Any = None) -> Any:
        """The stand-in for a role's coroutine (without a link: as `stream`)."""
        if link is None:
            link = await choose()
        pending = self._start(link, start, inputs, uses)
        try:
            while pending.outcome is None:
                pending.waiter = asyncio.get_running_loop().create_future()
                await pending.waiter
            return _finish(pending)
        except asyncio.CancelledError as error:
            await self._cancelled(pending, error)
            raise
        finally:
            self._forget(pending)

    async def _cancelled(self, pending: Pending, error: BaseException) -> None:
        """Cancel the activation on its replica and learn where the role stood."""
        link = pending.link
        if pending.outcome is not None or not link.up:
            return
        link.send(m.Cancel(VERSION, pending.act))
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            async with asyncio.timeout(ACK_WAIT):
                while pending.outcome is None:
                    pending.waiter = asyncio.get_running_loop().create_future()
                    await pending.waiter
        if pending.outcome is not None and pending.outcome[0] == "cancelled":
            error.flowrt_where = pending.outcome[1]  # type: ignore[attr-defined] - read by contract.waiting_place

    def _forget(self, pending: Pending) -> None:
        if pending.blocks:
            from flowrt.memory import protocol as mp

            for block in pending.blocks:
                self.memory.post(mp.Free(mp.VERSION, 0, block, pending.call, ""))
            pending.blocks = ()
        link = pending.link
        if link.pending.pop(pending.act, None) is not None and pending.outcome is None and link.up:
            link.send(m.Cancel(VERSION, pending.act))  # closed early (the call ended): stop it there

    # ── statistics ──

    async def probe(self, timeout: float = 2.0) -> dict[str, dict[str, int]]:
        """Each replica process's own statistics (what runs there now), asked of all at once;
        `{"unanswered": 1}` for one that did not answer within `timeout` seconds."""
        asked = {}
        loop = asyncio.get_running_loop()
        for (role, replica), link in sorted(self.links.items()):
            token = next(self.acts)
            asked[f"{role}/{replica}"] = (token, self.probes.setdefault(token, loop.create_future()))
            link.send(m.Probe(VERSION, token), counted=False)
        try:
            if asked:
                await asyncio.wait([future for _, future in asked.values()], timeout=timeout)
        finally:
            for token, _ in asked.values():
                self.probes.pop(token, None)
        done = {name: future for name, (_, future) in asked.items() if future.done() and not future.cancelled()}
        return {name: done[name].result() if name in done else {"unanswered": 1} for name in asked}

    def statistics(self) -> dict[str, int]:
        return {
            "replicas_up": len(self.links),
            "remote_activations": sum(len(link.pending) for link in self.links.values()),
            "waiting_activations": sum(len(queue) for queue in self.queues.values()),
            "garbage_messages": self.garbage,
            "gateway_messages_sent": self.traffic[0],
            "gateway_messages_received": self.traffic[1],
        }

    def close(self) -> None:
        self.stopping = True
        for queue in self.queues.values():
            for turn in queue:
                turn.wake()
        for link in list(self.links.values()):
            self._fail_link(link, "the deployment is stopping")
        self.links.clear()
        self.context.destroy(linger=0)


def _finish(pending: Pending) -> Any:
    """The activation's outcome: its session-globals changes applied, then its frame or its failure."""
    outcome = pending.outcome
    assert outcome is not None
    changes = outcome[2] if outcome[0] == "return" else outcome[3] if outcome[0] == "failed" else None
    if changes and pending.uses is not None:
        apply_globals_changes(pending.uses, changes)
    if outcome[0] == "return":
        return outcome[1]
    if outcome[0] == "failed":
        raise RemoteFailure(outcome[1], outcome[2], len(outcome) > 4 and outcome[4])  # (4: a BadInput there)
    raise asyncio.CancelledError  # cancelled there, though nobody here asked: end as cancelled


class RemoteBinding(RoleBinding):
    """A role whose replicas run in other processes (see the module's docstring)."""

    def __init__(self, spec: Any, remote: Remote, globals_: dict, log_: logging.Logger):
        super().__init__(spec, [None] * spec.replicas, globals_, log_)
        self.remote = remote
        self.sticky: OrderedDict[str, int] = OrderedDict()
        self.tickets = itertools.count(-3, -1)  # the replica `begin` returns for an activation that waits (BROADCAST is -2)
        self.waited: dict[int, int] = {}  # such a ticket -> the replica chosen once one came up

    def busy_replicas(self) -> int:  # (calls spread over the replicas: as their heartbeats last said)
        running = [link.record.running for (name, _), link in self.remote.links.items() if name == self.name]
        return sum(map(bool, running)) if self.remote.spread else super().busy_replicas()

    def replica(self, session: str) -> int:
        """The replica to run an activation, among those up (there is one: see `begin`)."""
        live = self.remote.live[self.name]
        if len(live) == 1:
            return live[0]
        lb = self.lb
        if lb == "session":
            sticky = self.sticky
            chosen = sticky.get(session)
            if chosen is None or chosen not in live:  # new, or its replica died: moves only then
                home = zlib.crc32(session.encode()) % self.count
                chosen = home if home in live else live[zlib.crc32(session.encode()) % len(live)]
                sticky[session] = chosen
                if len(sticky) > STICKY_SESSIONS:
                    sticky.popitem(last=False)
            else:
                sticky.move_to_end(session)
            return chosen
        if lb == "load_aware":
            return min(live, key=self._score)
        index = live[self.rr % len(live)]
        self.rr += 1
        return index

    def _score(self, replica: int) -> float:
        """`load_aware`'s score (docs/deploy.md): what this gateway has running there, or what
        the replica's heartbeat reported queued and running if more (other gateways' work),
        plus its tokens in flight."""
        record = self.remote.links[(self.name, replica)].record
        return max(self.load[replica], record.queued + record.running) + record.tokens / TOKENS_PER_ACTIVATION

    def begin(self, node: Any, session: str, call_id: Any, graph: str, inputs: dict) -> tuple:
        uses = {name: self.globals[(session, name)] for name in self.uses} if self.uses else None
        live = self.remote.live[self.name]
        if not live or self.remote.queues[self.name]:  # none up, or others wait for one: wait after them
            return self._waiting(node, session, call_id, graph, inputs, uses)
        if not self.broadcast:
            replica = self.replica(session)
            result = self._result(replica, node.method, call_id, session, graph, inputs, uses)
            self.load[replica] += 1
            return replica, result, ()
        results = [self._result(r, node.method, call_id, session, graph, inputs, uses) for r in live]
        return BROADCAST, results[0], tuple(results[1:])

    def _waiting(self, node: Any, session: str, call_id: Any, graph: str, inputs: dict, uses: dict | None) -> tuple:
        """`begin` for an activation that must wait for a replica: a stand-in that waits its turn
        (Remote.turn), then starts where the balancer says (or, for broadcast, on every replica up)."""
        if self.broadcast:
            args = (node.method, call_id, session, graph, inputs, uses)
            return BROADCAST, (self._broadcast_stream(args) if node.generator else self._broadcast_once(args)), ()
        ticket = next(self.tickets)
        remote = self.remote
        start = m.Start(VERSION, next(remote.acts), call_id, session, graph, node.method, uses is not None)
        chosen = functools.partial(self._chosen, ticket, session)
        run = remote.stream if node.generator else remote.once
        return ticket, run(None, start, inputs, uses, chosen), ()

    async def _chosen(self, ticket: int, session: str) -> Link:
        await self.remote.turn(self.name)
        replica = self.replica(session)
        self.load[replica] += 1
        self.waited[ticket] = replica  # (`finished` gives it back)
        return self.remote.links[(self.name, replica)]

    async def _broadcast_results(self, args: tuple) -> list:
        await self.remote.turn(self.name)
        return [self._result(r, *args) for r in self.remote.live[self.name]]

    async def _broadcast_once(self, args: tuple) -> Any:
        results = await self._broadcast_results(args)
        try:
            frame = await results[0]
            for extra in results[1:]:  # the others run for their side effects, as the core runs them
                await extra
            return frame
        finally:
            self.finished(BROADCAST, tuple(results))

    async def _broadcast_stream(self, args: tuple):
        results = await self._broadcast_results(args)
        try:
            async for frame in results[0]:
                yield frame
            for extra in results[1:]:
                async for _ in extra:
                    pass
        finally:
            for result in results:
                await result.aclose()

    def _result(self, replica: int, method: str, call_id: Any, session: str, graph: str, inputs: dict, uses: dict | None):
        remote = self.remote
        link = remote.link(self.name, replica)
        start = m.Start(VERSION, next(remote.acts), call_id, session, graph, method, uses is not None)
        if method in link.record.generators:
            return remote.stream(link, start, inputs, uses)
        return remote.once(link, start, inputs, uses)

    def finished(self, replica: int, extras: tuple) -> None:
        if replica >= 0:
            self.load[replica] -= 1
        elif replica != BROADCAST:  # a ticket: the replica it waited for, if it got one
            chosen = self.waited.pop(replica, None)
            if chosen is not None:
                self.load[chosen] -= 1
        for extra in extras:
            if hasattr(extra, "aclose"):
                continue  # an async generator never started holds nothing
            if extra.cr_frame is not None and not extra.cr_running:
                extra.close()
