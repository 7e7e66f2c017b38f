"""The sockets between the processes of a `local` deployment whose calls are spread over them
(flowrt.control.shards; FLOWRT_CONTROL=shards): each process binds one ROUTER, which admits
only holders of the deployment's gateway or member key (flowrt.transport.keys), and dials a
DEALER to each peer it sends to, so every pair of processes has one ordered channel. A
message is a `messages.Shard` envelope, its body and credit pickled beside it; it is decoded
only from an authenticated peer (what one turn sends a peer goes as one ZMQ message, a
`Batch` where there are several), and anything that is not a message of this protocol, names
a sender outside the placement or carries a share that cannot be one is logged and dropped.

`host_process` makes a replica process the host of its role's nodes (its own Runtime over the
bundle, its one instance bound); `Placement` numbers the processes: the gateway 0, then every
replica in the supervisor's order.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import zmq

from flowrt.control.credit import Credit, CreditError
from flowrt.control.envelopes import CREDIT, KINDS, Envelope, Placement
from flowrt.control.runtime import Runtime
from flowrt.control.shard_binding import ShardBinding
from flowrt.control.shards import MAX_HOPS, Shards
from flowrt.transport import codec
from flowrt.transport import messages as m
from flowrt.transport.keys import Guard, Keys
from flowrt.transport.sockets import Reader, bind, unbatch

log = logging.getLogger("flowrt.deploy")


def placement_of(config: dict) -> Placement:
    return Placement(0, {role: tuple(numbers) for role, numbers in config["hosts"].items()})


class Peers:
    """One process's ends of the channels to the other processes of its deployment."""

    def __init__(self, keys: Keys, as_: str, me: int, endpoints: dict[int, str], placement: Placement, what: str):
        self.keys, self.as_, self.me, self.endpoints, self.placement = keys, as_, me, endpoints, placement
        self.deliver: Any = None  # Shards.receive, once the process's shards exist
        self.loop = asyncio.get_running_loop()
        self.context = zmq.Context()
        self.guard = Guard(self.context, keys, ["gateway", "member"], what)
        self.router = self.context.socket(zmq.ROUTER)
        for option in (zmq.LINGER, zmq.SNDHWM, zmq.RCVHWM):
            self.router.setsockopt(option, 0)
        keys.serve(self.router, endpoints[me])
        bind(self.router, endpoints[me])
        self.guard.watch(self.router, self.loop)
        self.reader = Reader(self.router, self._received, self.loop)
        self.dealers: dict[int, zmq.Socket] = {}
        self.queued: dict[int, list[list]] = {}  # per peer, the messages this turn sent it (one Batch at its end)
        self.sent = self.received = self.garbage = 0
        self.what = what
        # the data plane (flowrt.memory.tensors), where the process has a memory manager: a large
        # tensor in a body crosses as a handle to shared memory, its ref the call's (released
        # when the gateway retires the call); `encoder(call_id)` is None where tensors go whole
        self.encoder: Any = lambda call_id: None
        self.decoder: Any = None

    def send(self, dst: int, envelope: Envelope) -> None:
        if dst == self.me:
            self.loop.call_soon(self.deliver, envelope)
            return
        credit = None if envelope.credit is None else envelope.credit.wire()
        header = m.Shard(
            m.VERSION,
            envelope.call_id,
            envelope.graph,
            envelope.session,
            envelope.sender,
            envelope.kind,
            credit,
            sorted(envelope.down),
        )
        if envelope.wire is None:
            self.encode(envelope)
        frames = [m.encode(header), *envelope.wire]
        if not self.queued:
            self.loop.call_soon(self.flush)
        self.queued.setdefault(dst, []).append(frames)

    def encode(self, envelope: Envelope) -> None:
        """Pickle the body now, in the sender's step: a value that cannot cross processes fails
        the role that sent it (codec.Unpicklable, as under the gateway's control)."""
        envelope.wire = codec.dumps(envelope.body, self.encoder(envelope.call_id))

    def flush(self) -> None:
        """Send what this turn queued: one ZMQ message per peer (a Batch where there are several)."""
        queued, self.queued = self.queued, {}
        for dst, messages in queued.items():
            sock = self.dealers.get(dst)
            if sock is None:
                sock = self.dealers[dst] = self.context.socket(zmq.DEALER)
                for option in (zmq.LINGER, zmq.SNDHWM):
                    sock.setsockopt(option, 0)
                self.keys.dial(sock, self.as_, self.endpoints[dst])
                sock.connect(self.endpoints[dst])
            if len(messages) == 1:
                frames = messages[0]
            else:
                frames = [m.encode(m.Batch(m.VERSION, [len(message) for message in messages]))]
                for message in messages:
                    frames += message
            sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
            self.sent += 1

    def _received(self, frames: list) -> None:
        if len(frames) < 3:
            self._garbage("a message without an envelope and a body")
            return
        self.received += 1
        self._message(frames[1:], False)

    def _message(self, frames: list, nested: bool) -> None:
        try:
            header = m.decode("peer", frames[0].buffer)
        except m.Garbage as error:
            self._garbage(str(error))
            return
        if type(header) is m.Batch:
            messages = None if nested else unbatch(header.sizes, frames[1:])
            if messages is None:
                self._garbage(f"a batch whose sizes {header.sizes} do not add up to its {len(frames) - 1} frames")
                return
            for message in messages:
                self._message(message, True)
            return
        if len(frames) < 2:
            self._garbage("a message without a body")
            return
        if header.sender not in self.placement.processes or not 0 <= header.kind < KINDS:
            self._garbage(f"a message from process {header.sender} of kind {header.kind}, which this deployment has not")
            return
        down = frozenset(header.down)
        if not down <= self.placement.processes:
            self._garbage(
                f"a message routing around processes {sorted(down - self.placement.processes)}, which this deployment has not"
            )
            return
        try:
            share = None if header.credit is None else Credit.from_wire(*header.credit)
        except CreditError as error:
            self._garbage(f"a share that cannot be one ({error})")
            return
        try:  # (the peer holds the deployment's key: its pickles are its own processes')
            body = codec.loads(frames[1:], self.decoder)
            if type(body) is not tuple:
                raise TypeError(f"a body is a tuple, not {type(body).__name__}")
        except Exception as error:  # noqa: BLE001 - TypeError, what a bad pickle raises
            self._garbage(f"a body that cannot be read ({type(error).__name__}: {error})")
            if share is None:
                return
            kind, body = CREDIT, (MAX_HOPS,)  # the frame is lost, not its credit: the call still ends
        else:
            kind = header.kind
        self.deliver(Envelope(header.call_id, header.graph, header.session, header.sender, kind, body, share, down))

    def _garbage(self, why: str) -> None:
        self.garbage += 1
        log.warning("%s: dropped %s", self.what, why)

    def close(self) -> None:
        self.reader.close()
        for sock in self.dealers.values():
            sock.close(0)
        self.guard.stop()
        self.context.destroy(linger=0)


def endpoints_of(config: dict) -> dict[int, str]:
    return {int(number): endpoint for number, endpoint in config["endpoints"].items()}


def host_process(config: dict, bundle: Any, keys: Keys, role: str, instance: Any, thread: Any, memory: Any, what: str):
    """(the Shards of a replica process hosting `instance` of `role`, its Peers) for `config`
    (the supervisor's `shards` entry of the replica's configuration). The caller sets the
    Peers' `encoder` and `decoder` where its process has the data plane."""
    runtime = Runtime(bundle)
    runtime.memory = memory
    placement = placement_of(config)
    peers = Peers(keys, "member", config["me"], endpoints_of(config), placement, what)
    shards = Shards(runtime, config["me"], placement, peers.send, peers.encode)
    runtime.host(role, instance, thread, functools.partial(ShardBinding, shards=shards, replica=config["replica"]))
    peers.deliver = shards.receive
    return shards, peers
