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
from typing import Any

from flowrt.control.call import Call
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
    FIRE,
    GLOBALS,
    GLOBALS_GET,
    GLOBALS_PUT,
    JOIN_FRAME,
    RELEASE,
    RESOLVE,
    RETURN,
    UNREACHABLE,
    Envelope,
    Placement,
)
from flowrt.control.program import CALLER, DIRECT, JOIN, NodeProgram
from flowrt.control.quiescence import Coordinator, Summary, trivial
from flowrt.control.roles import Context, RoleBinding
from flowrt.control.sessions import apply_globals_changes, globals_changes, snapshot_globals
from flowrt.control.signals import Reason

log = logging.getLogger("flowrt")

AID_STRIDE = 1 << 16  # a process's aids are its number plus multiples of this: unique across processes and calls
CLOSED = 65_536  # calls a process remembers it closed (messages of a failed call may still come)
FORWARDS = 4096  # calls whose forgotten shard's last peer a process remembers (credit that comes late follows it)
MAX_HOPS = 8  # credit handed on this many times goes to the gateway (two forgotten shards may point at each other)


def _hash(text: str) -> int:
    return zlib.crc32(text.encode())  # (the same in every process, whatever its hash seed)


class ShardRouter:
    """One process's part in one call: where its signals go, the credit it holds, and the order
    bounds the gateway told it."""

    __slots__ = ("shards", "me", "gateway", "call_id", "graph", "session", "pin", "holding", "depth", "bounds")
    __slots__ += ("sent_errors", "aborting", "coordinator", "reported", "last_peer", "told_gateway")

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
        # it sent the gateway something that carries no credit (a caller's frame): its credit
        # must follow on the same channel, or the gateway could see the call complete first
        self.told_gateway = False

    def _host(self, node: NodeProgram, identity: tuple | None) -> int:
        if not node.interface:
            return self.gateway
        hosts = self.shards.placement.hosts[node.role]
        if len(hosts) == 1:
            return hosts[0]
        if node.session:
            return hosts[self.pin % len(hosts)]
        if identity is None:  # a one-slot group fires: in turn
            return hosts[self.shards.turn(node.index) % len(hosts)]
        return hosts[_hash(repr((self.call_id, identity))) % len(hosts)]

    def send(self, dst: int, kind: int, body: tuple, work: bool = True) -> None:
        share = None
        if work:
            share = self.holding.give()
            if dst != self.me:
                self.last_peer = dst
        elif dst == self.gateway:
            self.told_gateway = True
        self.shards.send(dst, Envelope(self.call_id, self.graph, self.session, self.me, kind, body, share))

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
        host = self._host(edge.node, None)
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
        (the empty key until it has: only what has it may go)."""
        return self.bounds.get(consumer.index, ())

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
        shards.forget(self.call_id, self.last_peer)
        if self.told_gateway:
            self.told_gateway = False
            shards.send(self.gateway, Envelope(self.call_id, self.graph, self.session, self.me, CREDIT, (0,), share))
        elif not shards.top_up(self.call_id, share):
            shards.send(self.last_peer, Envelope(self.call_id, self.graph, self.session, self.me, CREDIT, (0,), share))

    def cancelled(self, call: Call, reason: str) -> None:
        if self.coordinator is not None:
            self.coordinator.abort()
        elif not self.aborting:  # (a role's timeout here: the gateway cancels the whole call)
            self.send(self.gateway, CANCEL, (reason,), work=False)


class Shards:
    """One process's shards of the calls spread over the deployment, and the messages between
    them. `send(dst, envelope)` is the transport (each pair of processes in order)."""

    def __init__(self, runtime: Any, me: int, placement: Placement, send: Any):
        self.runtime = runtime
        self.me = me
        self.placement = placement
        self.transport = send
        self.calls: dict[int, Call] = {}
        self.aborted: set[int] = set()  # calls the gateway aborted, until it closes them
        self.late = 0  # messages of calls that had ended or were aborted here (their credit went back)
        self.turns: dict[int, int] = {}
        self.aids = itertools.count(1)
        self.forwards: OrderedDict[int, int] = OrderedDict()  # call -> where its forgotten shard's work went
        self.outbox: list[tuple[int, Envelope]] = []
        self.flushing = False
        self.closed: OrderedDict[int, None] = OrderedDict()
        self.fetches: dict[int, asyncio.Future] = {}  # copies of session globals asked of the gateway
        self.fetch_ids = itertools.count(1)

    def forget(self, call_id: int, peer: int) -> None:
        self.calls.pop(call_id, None)
        self.forwards[call_id] = peer
        self.forwards.move_to_end(call_id)
        if len(self.forwards) > FORWARDS:
            self.forwards.popitem(last=False)

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
            self.transport(dst, envelope)

    def top_up(self, call_id: int, share: Any) -> bool:
        """Add `share` to the last message of the call this turn queued that carries credit, if any."""
        for _, envelope in reversed(self.outbox):
            if envelope.call_id == call_id and envelope.credit is not None:
                envelope.credit = envelope.credit + share
                return True
        return False

    async def fetch(self, call_id: int, names: tuple[str, ...]) -> dict:
        """A copy of the call's session's globals `names`, from the gateway, which keeps them."""
        router = self.calls[call_id].router
        number = next(self.fetch_ids)
        waiter = self.fetches[number] = asyncio.get_running_loop().create_future()
        router.send(router.gateway, GLOBALS_GET, (number, names), work=False)
        try:
            return await waiter
        finally:
            self.fetches.pop(number, None)

    def commit(self, call_id: int, changes: dict | None) -> None:
        """Send the gateway what an activation set, changed or deleted in its session's globals."""
        call = self.calls.get(call_id)
        if changes and call is not None:
            call.router.send(call.router.gateway, GLOBALS_PUT, (changes,), work=False)

    def _globals(self, call: Call | None, envelope: Envelope) -> None:
        kind, body = envelope.kind, envelope.body
        if kind == GLOBALS:
            waiter = self.fetches.get(body[0])
            if waiter is not None and not waiter.done():
                waiter.set_result(body[1])
            return
        if call is None or self.me != self.placement.gateway:
            return  # (a call the gateway ended: the activation asking is cancelled)
        store = self.runtime.globals
        if kind == GLOBALS_GET:
            copy = {name: store[(call.session, name)] for name in body[1]}
            back = Envelope(call.call_id, call.graph, call.session, self.me, GLOBALS, (body[0], copy), None)
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
            self.forwards.pop(envelope.call_id, None)
            self.aborted.discard(envelope.call_id)
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
            peer = self.forwards.get(envelope.call_id, self.placement.gateway) if hops < MAX_HOPS else self.placement.gateway
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
            call.remote_direct(program.edges[body[0]], *body[1:])
        elif kind == JOIN_FRAME:
            call.remote_join(program.nodes[body[0]], body[1], body[2])
        elif kind == CALLER_FRAME:
            call.remote_caller(program.edges[body[0]], body[1], body[2])
        elif kind == ERRORED:
            call.remote_unreachable(program.edges[body[0]], (), (), body[1], None)
        elif kind == RESOLVE:
            call.remote_resolve(program.nodes[body[0]])
        elif kind == RELEASE:
            call.router.bounds[body[0]] = body[1]
            call.remote_release(program.consumers[body[0]])
        elif kind == RETURN:
            call.router.coordinator.returned(call, envelope.sender, *body)
        # (CREDIT: only its credit, taken above; RETURN's too)
        elif kind == CANCEL:
            call.cancel(body[0])

    def lost(self, message: str, where: str) -> None:
        """The gateway's: a process went down with whatever credit of its calls it held, so no
        call in flight can be known complete: each ends now with an error saying so."""
        for call in list(self.calls.values()):
            coordinator = call.router.coordinator
            if coordinator is not None and not call.ended:
                call.fail(message, where)
                coordinator.finish(call)

    def statistics(self) -> dict[str, int]:
        """Shards and abort marks held now (0 once every call has closed), and what they hold."""
        totals = {"shards": len(self.calls), "aborted_marks": len(self.aborted), "fetches": len(self.fetches)}
        for call in self.calls.values():
            for key, value in call.statistics().items():
                totals[key] = totals.get(key, 0) + value
        return totals


class ShardBinding(RoleBinding):
    """The binding of a role's one replica in a process hosting its part of calls: a role that
    `uses` session globals gets a copy of the gateway's before it runs, and what it set, changed
    or deleted goes back when it ends (as under --deploy local's gateway control)."""

    def __init__(
        self, spec: Any, instances: list, globals_: dict, log_: logging.Logger, memory: Any, prefer: tuple, shards: Shards
    ):
        super().__init__(spec, instances, globals_, log_, memory, prefer)
        self.shards = shards

    def begin(self, node: NodeProgram, session: str, call_id: Any, graph: str, inputs: dict) -> tuple:
        if not self.uses:
            return RoleBinding.begin(self, node, session, call_id, graph, inputs)
        method = node.methods[0]
        if method is None:
            raise AttributeError(f"{type(self.instances[0]).__name__} has no method `{node.method}`")
        run = self._stream if node.generator else self._once
        self.load[0] += 1
        return 0, run(method, node, session, call_id, graph, inputs), ()

    async def _once(self, method: Any, node: NodeProgram, session: str, call_id: Any, graph: str, inputs: dict) -> Any:
        uses = await self.shards.fetch(call_id, self.uses)
        before = snapshot_globals(uses)
        try:
            return await method(
                Context(session, call_id, graph, self.name, node.method, uses, self.log, 0, self.memory), **inputs
            )
        finally:
            self.shards.commit(call_id, globals_changes(before, uses))

    async def _stream(self, method: Any, node: NodeProgram, session: str, call_id: Any, graph: str, inputs: dict):
        uses = await self.shards.fetch(call_id, self.uses)
        before = snapshot_globals(uses)
        try:
            async for frame in method(
                Context(session, call_id, graph, self.name, node.method, uses, self.log, 0, self.memory), **inputs
            ):
                yield frame
        finally:
            self.shards.commit(call_id, globals_changes(before, uses))
