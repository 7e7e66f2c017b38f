"""The messages between a gateway (where calls run) and a replica process, and the registry's.

Every message is a msgspec struct in a tagged union with a protocol version, encoded as
MessagePack; its payload (role inputs, frames, session globals) travels beside it as pickled
ZMQ frames (flowrt.transport.codec). `decode` validates a message at the edge: anything that is
not a known message of this version is `Garbage`, which the receiver logs and drops.

Gateway → replica: `Start` an activation, `Credit` (the gateway took frames of a stream),
`Cancel` one, `Probe` (statistics), `Stop` the process.
Replica → gateway: `Frame` (one yielded frame), `Return` (the activation's end, with its
returned frame if any, and its session-globals changes), `Failed` (the role raised or broke
its contract: the message and the place as the embedded runtime words them, and whether it
was the caller's to fix), `Cancelled`
(where the role was when cancelled), `Stats` (the answer to `Probe`).
Replica → registry: `Register` then `Heartbeat` every interval (its load).
Either way: `Batch`, the messages one event-loop turn sent to one peer, in one ZMQ message.
Process to process, for calls spread over them (flowrt.control.shards): `Shard`, one message
of one call; its body (signal arguments, frames) and credit are pickled beside it.
"""

from __future__ import annotations

from typing import Any

import msgspec

VERSION = 1


class Message(msgspec.Struct, tag_field="t", array_like=True, omit_defaults=False):
    """Base of every message: the protocol version rides on each one."""

    v: int


# ── gateway → replica ──


class Start(Message, tag="start"):
    act: int  # the activation's id, unique in the gateway
    call_id: int
    session: str
    graph: str
    interface: str
    uses: bool  # the payload carries the role's session globals after the inputs


class Credit(Message, tag="credit"):
    act: int
    frames: int  # how many more frames the replica may send before waiting


class Cancel(Message, tag="cancel"):
    act: int


class Probe(Message, tag="probe"):
    token: int


class Stop(Message, tag="stop"):
    pass


# ── replica → gateway ──


class Frame(Message, tag="frame"):
    act: int


class Return(Message, tag="return"):
    act: int
    has_frame: bool  # the payload carries the returned frame (then the globals' changes, if any)
    globals_changed: bool


class Failed(Message, tag="failed"):
    act: int
    message: str
    where: str
    cancelled: bool  # the role was cancelled (a timeout) and this says where it waited
    globals_changed: bool
    bad_input: bool = False  # the role raised flowrt.BadInput: the caller's to fix (HTTP 400)


class Cancelled(Message, tag="cancelled"):
    act: int
    where: str


class Stats(Message, tag="stats"):
    token: int
    running: int
    tracked: int  # per-activation entries kept (credits, waiters, cancels): 0 once none runs
    kv: dict[str, Any] = msgspec.field(default_factory=dict)  # the process's KV pools (docs/kv.md), if any
    refused: dict[str, int] = msgspec.field(default_factory=dict)  # peers, cancels, stops it refused (flowrt.transport.keys)


# ── replica → registry ──


class Register(Message, tag="register"):
    role: str
    replica: int
    incarnation: str  # unique per process start: a restarted replica is a new incarnation
    address: str
    pid: int
    generators: list[str]  # the interfaces implemented as async generators


class Heartbeat(Message, tag="heartbeat"):
    role: str
    replica: int
    incarnation: str
    running: int  # activations running now
    queued: int  # activations received, not started yet (0 today: each starts as it arrives)
    tokens: int  # tokens in flight, as engine roles will report them (0 until engines do)


# ── process to process: calls spread over them ──


class Shard(Message, tag="shard"):
    call_id: int
    graph: str
    session: str
    sender: int  # the sending process's number in the deployment's placement
    kind: int  # what it asks (flowrt.control.envelopes)
    credit: tuple[int | bytes, int] | None = None  # the share of the call's credit it carries (flowrt.control.credit)
    down: list[int] = []  # the processes the call routes around (flowrt.control.shard_faults)


# ── either way ──


class Batch(Message, tag="batch"):
    """Several messages sent in one event-loop turn to the same peer, as one ZMQ message: this
    envelope, then each message's ZMQ frames (`sizes` says how many each has)."""

    sizes: list[int]


GatewayMessage = Start | Credit | Cancel | Probe | Stop | Batch
ReplicaMessage = Frame | Return | Failed | Cancelled | Stats | Batch
RegistryMessage = Register | Heartbeat
PeerMessage = Shard | Batch


class Garbage(Exception):
    """Bytes that are not a message of this protocol version."""


_encoder = msgspec.msgpack.Encoder()
_decoders = {
    "gateway": msgspec.msgpack.Decoder(GatewayMessage),
    "replica": msgspec.msgpack.Decoder(ReplicaMessage),
    "registry": msgspec.msgpack.Decoder(RegistryMessage),
    "peer": msgspec.msgpack.Decoder(PeerMessage),
}


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(kind: str, data: bytes | memoryview) -> Message:
    """A message of `kind` ("gateway": what a replica receives, "replica": what a gateway
    receives, "registry"), or Garbage saying why not."""
    try:
        message = _decoders[kind].decode(data)
    except Exception as error:  # noqa: BLE001 - msgspec's errors, and what bad bytes raise on the way (UnicodeDecodeError)
        raise Garbage(f"not a {kind} message ({type(error).__name__}: {error})") from None
    if message.v != VERSION:
        raise Garbage(f"protocol version {message.v}, this flowrt speaks {VERSION}")
    return message
