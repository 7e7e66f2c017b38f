"""A graph call spread over processes: each process hosts the nodes of some roles and holds a
shard of every call that reaches them (docs/design/decentralised.md).

A shard is an ordinary `Call` over the process's own program (built from the same tables, so
node, edge and consumer indices agree everywhere) whose `router` is a `ShardRouter`. A signal
whose consumer is hosted elsewhere (ARRIVED, SLOT_EOS, UNREACHABLE, a frame firing a one-slot
group, a join's frame, a frame for the caller) is sent to the process that hosts it, where the
same local method runs (`Delivery.remote_*`). Where each goes (`ShardRouter._host`):
- a node without a role (the entry, a graph-level node): the gateway;
- an `lb session` node: the replica its session is pinned to (its sequencer and counters live there);
- a bucket, named by (call, node, group, key): one replica of the role, by hashing that name,
  so every frame of one bucket meets in one process; a join: by hashing (call, node); an
  UNREACHABLE for a one-slot group: by hashing (call, node, group) (loops drop repeats there);
- a frame that fires a one-slot group: the role's replicas in turn.
A replica process that was down when the call was admitted is passed over: the work goes to
another replica of the role (flowrt.control.shard_faults, which also finds the calls a process
that goes down takes with it).
Two processes' messages arrive in the order sent (one ZMQ connection; the tests' FIFO
channels): a SLOT_EOS never overtakes its stream's frames, nor a caller's frame its sender's
returned credit.

Completion is credit recovery (flowrt.control.credit): the gateway's shard starts with the
whole credit; every message that can start work carries a share of its sender's; a shard with
nothing running returns what it holds, with a `Summary` of its state (RETURN). When all of it
is back, nothing runs anywhere and nothing is in transit, and the gateway's `Coordinator`
takes the decisions that need the whole call, as the in-process core does at quiescence: it
resolves the first join nothing can feed any more (RESOLVE, to the join's host), ends the call
if nothing is left in flight, or else tells each order consumer holding work the smallest key
that can still reach it (RELEASE). Until told, a shard lets through only what has the empty
key; a bound, once told, stays true (later work descends from work it counted), so a session
node releases one held activation after another under it without asking again.

Aborts: the gateway's shard, cancelled (timeout, client gone, a shard's timeout asking with
CANCEL), sends ABORT to every process; a process remembers aborted calls, so work that reaches
it late returns its credit untouched; once all credit is back the gateway sends CLOSE and every
shard and mark of the call goes. Imports only flowrt.control's own modules.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import zlib
from collections import OrderedDict
from types import MappingProxyType
from typing import Any

from flowrt.control import bounds
from flowrt.control.call import Call
from flowrt.control.contract import RemoteFailure, failure
from flowrt.control.credit import ONE, Holding
from flowrt.control.envelopes import (
    ABORT,
    ARRIVE,
    CALLER_FRAME,
    CANCEL,
    CLOSE,
    CREDIT,
    END,
    ERRORED,
    EXTRA,
    EXTRA_DONE,
    FIRE,
    GLOBALS,
    GLOBALS_GET,
    GLOBALS_PUT,
    JOIN_FRAME,
    LOAD_DONE,
    RELEASE,
    RESOLVE,
    RETURN,
    TOUCHED_ASK,
    UNREACHABLE,
    Envelope,
    Placement,
)
from flowrt.control.program import CALLER, DIRECT, JOIN, NodeProgram
from flowrt.control.quiescence import Coordinator, Summary, floors, trivial
from flowrt.control.sessions import apply_globals_changes, globals_changes, snapshot_globals
from flowrt.control.shard_faults import Faults
from flowrt.control.shard_loads import Loads
from flowrt.control.signals import Reason

log = logging.getLogger("flowrt")

BROADCAST = -2  # as flowrt.control.roles.BROADCAST (a C constant in the compiled core)
NO_GLOBALS: Any = MappingProxyType({})  # as flowrt.control.roles.NO_GLOBALS: `ctx.globals` of a role that uses none
AID_STRIDE = 1 << 16  # a process's aids are its number plus multiples of this: unique across processes and calls
CLOSED = 65_536  # calls a process remembers it closed (messages of a failed call may still come)
FORWARDS = 4096  # calls whose forgotten shard's last peer a process remembers (credit that comes late follows it)
MAX_HOPS = 8  # credit handed on this many times goes to the gateway (two forgotten shards may point at each other)


pick = Faults.pick


def _hash(text: str) -> int:
    return zlib.crc32(text.encode())  # (the same in every process, whatever its hash seed)


class ShardRouter:
    """One process's part in one call: where its signals go, the credit it holds, and the order
    bounds the gateway told it."""

    __slots__ = ("shards", "me", "gateway", "call_id", "graph", "session", "pin", "holding", "depth", "bounds")
    __slots__ += ("sent_errors", "aborting", "coordinator", "reported", "last_peer", "told_gateway", "peers", "down")

    def __init__(self, shards: Shards, call: Call):
        self.shards = shards
        self.me = shards.me
        self.gateway = shards.placement.gateway
        self.call_id, self.graph, self.session = call.call_id, call.graph, call.session
        self.pin = _hash(call.session)
        self.holding = Holding()
        self.depth = 0  # > 0 while a message is applied: idleness is looked at once it is
        self.bounds: dict[int, tuple | None] = {}
        self.sent_errors = 0  # the call's errors already sent to the gateway
        self.aborting = False  # the cancellation came from the gateway: nothing to tell it
        self.coordinator = Coordinator(self) if self.me == self.gateway else None
        self.reported = False  # a summary went to the gateway: later ones must too (it keeps the latest)
        self.last_peer = self.gateway  # where work last went from here
        self.peers: set[int] = set()  # every process work went to from here (one that dies may have held credit)
        # it sent the gateway something that carries no credit (a caller's frame): its credit
        # must follow on the same channel, or the gateway could see the call complete first
        self.told_gateway = False
        self.down = shards.faults.down  # the processes this call routes around (the gateway's, as it was admitted)

    def _host(self, node: NodeProgram, identity: tuple | None) -> int:
        if not node.interface:
            return self.gateway
        hosts = self.shards.placement.hosts[node.role]
        if len(hosts) == 1:
            return hosts[0]
        if node.session:
            return pick(hosts, self.pin, self.down)
        if identity is None:  # a one-slot group fires: in turn (`lb broadcast`: the first replica up runs it, the others too)
            lb = self.shards.runtime.roles[node.role].lb
            if lb == "broadcast":
                return pick(hosts, 0, self.down)
            if lb == "load_aware":
                return self.shards.loads.pick(hosts, self.shards.turn(node.index), self.down)
            return pick(hosts, self.shards.turn(node.index), self.down)
        return pick(hosts, _hash(repr((self.call_id, identity))), self.down)

    def send(self, dst: int, kind: int, body: tuple, work: bool = True) -> None:
        envelope = Envelope(self.call_id, self.graph, self.session, self.me, kind, body, None, self.down)
        self.shards.encode(dst, envelope)  # (a value that cannot cross processes raises here, before credit moves)
        if work:
            envelope.credit = self.holding.give()
            if dst != self.me:
                self.last_peer = dst
                self.peers.add(dst)
        elif dst == self.gateway:
            self.told_gateway = True
        self.shards.send(dst, envelope)

    # ── the hooks of the core (flowrt.control.delivery, .call): True when the signal went elsewhere ──

    def arrive(self, call: Call, edge: Any, key: tuple, value: Any, roots: tuple, order: tuple) -> bool:
        host = self._host(edge.node, (edge.node.index, edge.group.index, key))
        if host == self.me:
            return False
        self.send(host, ARRIVE, (edge.index, key, value, roots, order))
        return True

    def end(self, call: Call, edge: Any, key: tuple) -> bool:
        host = self._host(edge.node, (edge.node.index, edge.group.index, key))
        if host == self.me:
            return False
        self.send(host, END, (edge.index, key))
        return True

    def unreachable(self, call: Call, edge: Any, key: tuple, roots: tuple, reason: Reason, origin: tuple | None) -> bool:
        kind = edge.kind
        if kind == CALLER:
            if self.me == self.gateway:
                return False
            if reason is Reason.ERROR or reason is Reason.CANCEL:
                self.send(self.gateway, ERRORED, (edge.index, reason), work=False)
            return True
        if kind == JOIN:
            return False  # a join counts arrivals only
        node = edge.node
        identity = (node.index, edge.group.index) if kind == DIRECT else (node.index, edge.group.index, key)
        host = self._host(node, identity)
        if host == self.me:
            return False
        self.send(host, UNREACHABLE, (edge.index, key, roots, reason, origin))
        return True

    def direct(self, call: Call, edge: Any, value: Any, roots: tuple, order: tuple) -> bool:
        node = edge.node
        host = self._host(node, None)
        if self.shards.load_aware(node):
            self.shards.loads.sending(host)
            if host == self.me:
                self.shards.loads.given_by(self.call_id, node.index, self.me)
        if host == self.me:
            return False
        self.send(host, FIRE, (edge.index, value, roots, order))
        return True

    def join(self, call: Call, node: NodeProgram, name: str, value: Any) -> bool:
        host = self._host(node, (node.index,))
        if host == self.me:
            return False
        self.send(host, JOIN_FRAME, (node.index, name, value))
        return True

    def caller(self, call: Call, edge: Any, value: Any, order: tuple) -> bool:
        if self.me == self.gateway:
            return False
        self.send(self.gateway, CALLER_FRAME, (edge.index, value, order), work=False)
        return True

    def bound(self, consumer: Any) -> tuple | None:
        """The smallest key that can still reach `consumer`, as the gateway last worked it out
        (the empty key until it has: only what has it may go). A consumer fed only by one
        session node needs no telling: that node runs one activation at a time, numbering its
        outputs by a counter it advances as each starts, in one process for the whole call (its
        session's pin), and one channel carries them in order; so what reaches the consumer
        comes in key order, and in one process too its bound, the node's next count, lets every
        frame through (Delivery._lower_bound)."""
        if not consumer.heap_nodes and not consumer.join_resets and len(consumer.session_resets) == 1:
            return None
        told = self.bounds.get(consumer.index, ())
        if told is None:
            return None
        floor = self.shards.floor(self.graph, consumer)
        return floor if floor > told else told

    def idle(self, call: Call) -> None:
        """Nothing of the call runs here: hand back the credit (the gateway: see if the call is quiet)."""
        if self.depth or call.running or call.phantoms:
            return
        if self.coordinator is not None:
            self.coordinator.quiet(call)
            return
        share = self.holding.release()
        if not share:
            return
        errors = call.errors[self.sent_errors :]
        self.sent_errors = len(call.errors)
        summary = Summary(call)
        if self.reported or errors or not trivial(call, summary):
            self.reported = True
            self.told_gateway = False
            envelope = Envelope(self.call_id, self.graph, self.session, self.me, RETURN, (summary, errors), share)
            self.shards.send(self.gateway, envelope)
            return
        # nothing of the call is left here: forget it, and hand the credit on with the work
        # this turn sent (a chain of stages returns it once, from its end, not once per stage)
        shards = self.shards
        shards.forget(self.call_id, self.last_peer, self.peers)
        if self.told_gateway:
            self.told_gateway = False
            shards.send(self.gateway, Envelope(self.call_id, self.graph, self.session, self.me, CREDIT, (0,), share))
        elif not shards.top_up(self.call_id, share):
            shards.send(self.last_peer, Envelope(self.call_id, self.graph, self.session, self.me, CREDIT, (0,), share))

    def cancelled(self, call: Call, reason: str) -> None:
        if self.coordinator is not None:
            self.coordinator.abort(call)
        elif not self.aborting:  # (a role's timeout here: the gateway cancels the whole call)
            self.send(self.gateway, CANCEL, (reason,), work=False)


class Shards:
    """One process's shards of the calls spread over the deployment, and the messages between
    them. `send(dst, envelope)` is the transport (each pair of processes in order)."""

    def __init__(self, runtime: Any, me: int, placement: Placement, send: Any, encode: Any = None):
        self.runtime = runtime
        self.me = me
        self.placement = placement
        self.transport = send
        self.encoder = encode  # the transport's: encodes a message's body as it is sent (None: bodies stay objects)
        self.calls: dict[int, Call] = {}
        self.aborted: set[int] = set()  # calls the gateway aborted, until it closes them
        self.late = 0  # messages of calls that had ended or were aborted here (their credit went back)
        self.turns: dict[int, int] = {}
        self.aids = itertools.count(1)
        # call -> where its forgotten shard's work last went, and every process it went to
        self.forwards: OrderedDict[int, tuple[int, set[int]]] = OrderedDict()
        self.faults = Faults(self)  # processes that go down: the calls they take with them, routing around them
        self.loads = Loads(self)  # `lb load_aware`: what this process sent where, and who sent what here
        self.outbox: list[tuple[int, Envelope]] = []
        self.flushing = False
        self.closed: OrderedDict[int, None] = OrderedDict()
        self.fetches: dict[int, asyncio.Future] = {}  # copies of session globals asked of the gateway; broadcasts' ends
        self.extras: set[asyncio.Task] = set()  # broadcast activations run here for another replica
        self.fetch_ids = itertools.count(1)
        # call -> a copy of its session's globals that came with a decision of the gateway's,
        # for the first activation here to ask before anything here changes them
        self.prefetched: dict[int, dict] = {}
        self.floors: dict[str, tuple[tuple, ...]] = {}  # graph -> its order consumers' floors

    def load_aware(self, node: NodeProgram) -> bool:
        """Whether `node`'s work is balanced by load (shard_loads): `lb load_aware` over several replicas."""
        return (
            bool(node.interface) and len(self.placement.hosts[node.role]) > 1 and self.runtime.roles[node.role].lb == "load_aware"
        )

    def forget(self, call_id: int, peer: int, peers: set[int]) -> None:
        self.calls.pop(call_id, None)
        self.prefetched.pop(call_id, None)
        self.forwards[call_id] = (peer, peers)
        self.forwards.move_to_end(call_id)
        if len(self.forwards) > FORWARDS:
            self.forwards.popitem(last=False)

    def floor(self, graph: str, consumer: Any) -> tuple:
        """quiescence.floors of `graph`, for `consumer` (worked out once per graph)."""
        known = self.floors.get(graph)
        if known is None:
            known = self.floors[graph] = floors(self.runtime.programs[graph])
        return known[consumer.index]

    def next_aid(self) -> int:
        return next(self.aids) * AID_STRIDE + self.me

    def turn(self, node: int) -> int:
        turn = self.turns.get(node, self.me)
        self.turns[node] = turn + 1
        return turn

    def attach(self, call: Call) -> None:
        """Make `call` a shard of this process (the gateway's, as its runtime admits it, with the whole credit)."""
        router = call.router = ShardRouter(self, call)
        call.aid_source = self.next_aid
        if router.coordinator is not None:
            router.holding.take(ONE)
        self.calls[call.call_id] = call

    def encode(self, dst: int, envelope: Envelope) -> None:
        if self.encoder is not None and dst != self.me:
            self.encoder(envelope)

    def send(self, dst: int, envelope: Envelope) -> None:
        """Queue `envelope` for `dst`: what one turn of the loop sends goes at its end, in order."""
        self.outbox.append((dst, envelope))
        if not self.flushing:
            self.flushing = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flushing = False
        outbox, self.outbox = self.outbox, []
        for dst, envelope in outbox:
            try:
                self.transport(dst, envelope)
            except Exception:  # noqa: BLE001 - one message that cannot go must not strand the others (its credit is lost: that call ends by its timeout or an abort)
                log.exception("call %s: a message to process %d could not be sent", envelope.call_id, dst)

    def top_up(self, call_id: int, share: Any) -> bool:
        """Add `share` to the last message of the call this turn queued that carries credit, if any."""
        for _, envelope in reversed(self.outbox):
            if envelope.call_id == call_id and envelope.credit is not None:
                envelope.credit = envelope.credit + share
                return True
        return False

    async def fetch(self, call_id: int, names: tuple[str, ...], where: Envelope | None = None) -> dict:
        """A copy of the call's session's globals `names`, from the gateway, which keeps them
        (for a broadcast's other replica, which holds no shard: `where` is what asked it)."""
        if where is None:
            copy = self.prefetched.pop(call_id, None)
            if copy is not None and copy.keys() >= set(names):
                return {name: copy[name] for name in names}
        number = next(self.fetch_ids)
        waiter = self.fetches[number] = asyncio.get_running_loop().create_future()
        if where is None:
            router = self.calls[call_id].router
            router.send(router.gateway, GLOBALS_GET, (number, names), work=False)
        else:
            ask = Envelope(call_id, where.graph, where.session, self.me, GLOBALS_GET, (number, names), None)
            self.send(self.placement.gateway, ask)
        try:
            return await waiter
        finally:
            self.fetches.pop(number, None)

    def globals_for(self, call: Call, node: NodeProgram, host: int) -> dict | None:
        """The gateway's: a copy of the session globals `node`'s role uses, to send with the
        decision that lets it run on `host` (RELEASE, RESOLVE). The decision is taken with
        nothing running anywhere, so nothing can change them before it starts: its activation
        need not ask for them (GLOBALS_GET), a round trip on the call's critical path."""
        if host == self.me or not node.interface:
            return None
        uses = self.runtime.roles[node.role].uses
        return self._copy(call.session, uses) if uses else None

    def _copy(self, session: str, names: tuple[str, ...]) -> dict:
        store = self.runtime.globals
        return {name: store[(session, name)] for name in names}

    def _prefetched(self, call: Call, copy: dict | None) -> None:
        if copy is not None:
            self.prefetched[call.call_id] = copy

    def commit(self, call_id: int, changes: dict | None) -> None:
        """Send the gateway what an activation set, changed or deleted in its session's globals."""
        self.prefetched.pop(call_id, None)  # (a later activation here must see what this one changed)
        call = self.calls.get(call_id)
        if changes and call is not None:
            call.router.send(call.router.gateway, GLOBALS_PUT, (changes,), work=False)

    async def extra(self, call: Call, node: NodeProgram, dst: int, inputs: dict) -> None:
        """Run an `lb broadcast` activation on process `dst` too, and wait for its end (its
        frames are not used; a failure there fails the activation here; what it changed in the
        session's globals goes to the gateway from here, before this activation's end)."""
        number = next(self.fetch_ids)
        waiter = self.fetches[number] = asyncio.get_running_loop().create_future()
        call.router.send(dst, EXTRA, (number, node.index, inputs), work=False)
        try:
            failed, changes = await waiter
        finally:
            self.fetches.pop(number, None)
        self.commit(call.call_id, changes)
        if failed is not None:
            raise RemoteFailure(*failed)

    def _extra(self, envelope: Envelope) -> None:
        number, index, inputs = envelope.body
        node = self.runtime.programs[envelope.graph].nodes[index]
        binding = node.binding

        async def run() -> None:
            failed = before = None
            uses: Any = NO_GLOBALS
            try:
                # (its own copy of the session's globals; what it changes goes back with its end)
                uses = await self.fetch(envelope.call_id, binding.uses, envelope) if binding.uses else NO_GLOBALS
                before = snapshot_globals(uses)
                ctx = binding.context(node, envelope.session, envelope.call_id, envelope.graph, uses)
                await bounds.drain(node.methods[0](ctx, **inputs))
            except Exception as error:  # noqa: BLE001 - told to the replica that asked, as its own role's failure
                failed = failure(error, None, self.runtime.bundle.python_path)
            ended = (number, (failed, globals_changes(before, uses)))
            done = Envelope(envelope.call_id, envelope.graph, envelope.session, self.me, EXTRA_DONE, ended, None)
            self.send(envelope.sender, done)

        task = asyncio.ensure_future(run())
        self.extras.add(task)
        task.add_done_callback(self.extras.discard)

    def _globals(self, call: Call | None, envelope: Envelope) -> None:
        kind, body = envelope.kind, envelope.body
        if kind == EXTRA:
            self._extra(envelope)
            return
        if kind == LOAD_DONE:
            self.loads.done(envelope.sender)
            return
        if kind >= TOUCHED_ASK:
            self.faults.receive(envelope)
            return
        if kind in (GLOBALS, EXTRA_DONE):
            waiter = self.fetches.get(body[0])
            if waiter is not None and not waiter.done():
                waiter.set_result(body[1])
            return
        if call is None or self.me != self.placement.gateway:
            return  # (a call the gateway ended: the activation asking is cancelled)
        store = self.runtime.globals
        if kind == GLOBALS_GET:
            back = Envelope(
                call.call_id, call.graph, call.session, self.me, GLOBALS, (body[0], self._copy(call.session, body[1])), None
            )
            self.send(envelope.sender, back)
        else:
            apply_globals_changes({name: store[(call.session, name)] for name in body[0]}, body[0])

    def receive(self, envelope: Envelope) -> None:
        kind = envelope.kind
        call = self.calls.get(envelope.call_id)
        if kind >= GLOBALS_GET:
            self._globals(call, envelope)
            return
        if kind == CLOSE:
            self.calls.pop(envelope.call_id, None)
            self.prefetched.pop(envelope.call_id, None)
            self.forwards.pop(envelope.call_id, None)
            self.aborted.discard(envelope.call_id)
            self.loads.closed(envelope.call_id)
            self.closed[envelope.call_id] = None
            if len(self.closed) > CLOSED:
                self.closed.popitem(last=False)
            return
        if call is None and envelope.call_id in self.closed:
            self.late += 1  # (a call the gateway ended without its credit: a process it needed went down)
            return
        if kind == ABORT:
            self.aborted.add(envelope.call_id)
            if call is not None:
                call.router.aborting = True
                call.cancel("aborted")
            return
        if call is None and kind == CREDIT and self.me != self.placement.gateway:
            # credit for a shard forgotten here: on to where its work went (or to the gateway)
            hops = envelope.body[0] + 1
            note = self.forwards.get(envelope.call_id)
            peer = note[0] if note is not None and hops < MAX_HOPS else self.placement.gateway
            envelope.sender, envelope.body = self.me, (hops,)
            self.send(peer, envelope)
            return
        if call is None:
            if self.me == self.placement.gateway or envelope.call_id in self.aborted:
                self.late += 1
                if envelope.credit is not None:  # (the gateway holds every aborted call until its credit is back)
                    back = Envelope(
                        envelope.call_id, envelope.graph, envelope.session, self.me, RETURN, (Summary(), []), envelope.credit
                    )
                    self.send(self.placement.gateway, back)
                return
            program = self.runtime.programs[envelope.graph]
            call = Call(self.runtime, program, {}, envelope.session, envelope.call_id)
            self.attach(call)
            call.router.down = envelope.down
            for process in envelope.down:
                self.loads.forget(process)
        router = call.router
        router.depth += 1
        try:
            if envelope.credit is not None:
                router.holding.take(envelope.credit)
            self._apply(call, envelope)
        finally:
            router.depth -= 1
        if not call.ended:
            call.launch_ready()
            if call.running == 0 and call.phantoms == 0:
                router.idle(call)
            elif router.coordinator is not None and call.entries and call.running == len(call.entries):
                router.coordinator.quiet(call)  # only the caller's open inputs run: decide what may go meanwhile

    def _apply(self, call: Call, envelope: Envelope) -> None:
        kind, body = envelope.kind, envelope.body
        program = call.program
        if kind == ARRIVE:
            call.remote_arrive(program.edges[body[0]], *body[1:])
        elif kind == END:
            call.remote_end(program.edges[body[0]], body[1])
        elif kind == UNREACHABLE:
            call.remote_unreachable(program.edges[body[0]], *body[1:])
        elif kind == FIRE:
            edge = program.edges[body[0]]
            if self.load_aware(edge.node):
                self.loads.given_by(call.call_id, edge.node.index, envelope.sender)
            call.remote_direct(edge, *body[1:])
        elif kind == JOIN_FRAME:
            call.remote_join(program.nodes[body[0]], body[1], body[2])
        elif kind == CALLER_FRAME:
            if call.cancelled:  # (a role that went on after its call was cancelled: nothing more reaches the caller)
                self.late += 1
                return
            call.remote_caller(program.edges[body[0]], body[1], body[2])
        elif kind == ERRORED:
            call.remote_unreachable(program.edges[body[0]], (), (), body[1], None)
        elif kind == RESOLVE:
            self._prefetched(call, body[1])
            call.remote_resolve(program.nodes[body[0]])
        elif kind == RELEASE:
            self._prefetched(call, body[2])
            call.router.bounds[body[0]] = body[1]
            call.remote_release(program.consumers[body[0]])
        elif kind == RETURN:
            call.router.coordinator.returned(call, envelope.sender, *body)
        # (CREDIT: only its credit, taken above; RETURN's too)
        elif kind == CANCEL:
            call.cancel(body[0])

    def statistics(self) -> dict[str, int]:
        """Shards and abort marks held now (0 once every call has closed), and what they hold."""
        totals = {
            "shards": len(self.calls),
            "aborted_marks": len(self.aborted),
            "fetches": len(self.fetches),
            "broadcasts": len(self.extras),
            "prefetched_globals": len(self.prefetched),
            **self.loads.statistics(),
        }
        for call in self.calls.values():
            for key, value in call.statistics().items():
                totals[key] = totals.get(key, 0) + value
        return totals
