"""The messages between a MemoryManager and its clients (role processes and the gateway).

Every request is a msgspec struct in one tagged union with a protocol version; `req` is the
client's request number, echoed in the `Reply` (0: the client wants no answer, for the frees
and references the gateway sends in order on its one socket). A ref is held by a holder:
`call` (the key `GATEWAY_PID:CALL_ID` of the call the block travels in, released with the
call) or `process` (a PID as text, released when that process dies), never both.
"""

from __future__ import annotations

from typing import Any

import msgspec

VERSION = 1


class Request(msgspec.Struct, tag_field="t", array_like=True):
    v: int
    req: int


class Hello(Request, tag="hello"):
    pid: int
    kind: str  # "gateway" | "replica" | "client"
    name: str  # what statistics and errors call it (role/replica)


class Alloc(Request, tag="alloc"):
    nbytes: int
    call: str
    process: str
    cache_key: str = ""


class RefAt(Request, tag="ref_at"):
    """A ref on the block that holds slab byte `offset` (find_alloc_by_ptr, then add_ref)."""

    offset: int
    call: str
    process: str
    epoch: str = ""  # the manager whose slab the sender's address lies in: another one refuses ("stale")


class AddRef(Request, tag="add_ref"):
    block: int
    call: str
    process: str
    n: int = 1


class Free(Request, tag="free"):
    block: int
    call: str
    process: str
    n: int = 1


class Adopt(Request, tag="adopt"):
    """Move one ref of `block` from `call` to `process` (the gateway took a frame's tensor)."""

    block: int
    call: str
    process: str


class ReleaseCall(Request, tag="release_call"):
    call: str


class Lookup(Request, tag="lookup"):
    cache_key: str
    call: str
    process: str


class Cache(Request, tag="cache"):
    block: int
    cache_key: str
    meta: dict[str, Any] = {}  # what a hit needs to view the block again (dtype, shape...)


class Statistics(Request, tag="statistics"):
    pass


class Claim(Request, tag="claim"):
    """Weights `key` of `nbytes` in `layout`: the first claimant owns (loads) them."""

    key: str
    nbytes: int
    layout: str  # a fingerprint of names, shapes and dtypes: one key, one architecture
    process: str


class Loaded(Request, tag="loaded"):
    """The owner of weights `key` finished loading (`error` empty) or failed."""

    key: str
    error: str


class Arrive(Request, tag="arrive"):
    """kv_pool_barrier: `process` reached `phase` of `group` (with a proposal in phase 2)."""

    group: str
    phase: int
    process: str
    participants: int
    proposal: int


class Settled(Request, tag="settled"):
    """kv_pool_barrier `group` was settled at `value` under an earlier manager: a manager that
    started since learns it from the clients that know it, so a replica restarted later
    still gets the size at once."""

    group: str
    participants: int
    value: int


MemoryRequest = (
    Hello | Alloc | RefAt | AddRef | Free | Adopt | ReleaseCall | Lookup | Cache | Statistics | Claim | Loaded | Arrive | Settled
)

NO_ROOM = "no_room"  # Reply.code: the pool (or the shared-memory file system under it) has no room for it
STALE = "stale"  # Reply.code: the address lies in another manager's slab


class Reply(msgspec.Struct, array_like=True):
    v: int
    req: int
    error: str = ""  # a refusal, worded for the user (pool exhausted, unknown block...)
    block: int = 0
    offset: int = 0
    size: int = 0
    slab: str = ""  # the slab's file: a client maps it once per manager incarnation
    epoch: str = ""
    data: dict[str, Any] = {}
    code: str = ""  # what kind of refusal `error` is, for code to act on (NO_ROOM, STALE)


class Garbage(Exception):
    """Bytes that are not a request or reply of this protocol version."""


_encoder = msgspec.msgpack.Encoder()
_requests = msgspec.msgpack.Decoder(MemoryRequest)
_replies = msgspec.msgpack.Decoder(Reply)


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode_request(data: bytes | memoryview) -> Request:
    return _checked(_requests, data, "request")


def decode_reply(data: bytes | memoryview) -> Reply:
    return _checked(_replies, data, "reply")


def _checked(decoder: msgspec.msgpack.Decoder, data: bytes | memoryview, what: str) -> Any:
    try:
        message = decoder.decode(data)
    except Exception as error:  # noqa: BLE001 - msgspec's errors and what bad bytes raise on the way
        raise Garbage(f"not a memory {what} ({type(error).__name__}: {error})") from None
    if message.v != VERSION:
        raise Garbage(f"memory protocol version {message.v}, this flowrt speaks {VERSION}")
    return message
