"""Payloads: the Python values a message carries (a role's inputs, a frame, session globals).

A payload is pickled with protocol 5; buffers that support out-of-band pickling (numpy arrays,
torch tensors' storage, bytearrays, PickleBuffers) are not copied into the pickle but travel as
ZMQ frames of their own after it, and are unpickled over the received frames' memory. Why
pickle and not msgpack: frames hold arbitrary Python values (tuples stay tuples, user classes
survive), which is what the embedded runtime passes by reference; msgspec carries the typed
envelope. docs/deploy.md, "Wire format", has the measurements behind the choice.

Pickle runs code when it loads: only peers holding the deployment's keys complete a connection
(flowrt.transport.keys), so nothing from anyone else is ever loaded; ipc sockets also live in a
0700 directory (flowrt.transport.sockets).
"""

from __future__ import annotations

import io
import pickle
import threading
from typing import Any

from flowrt.errors import FlowrtError

INLINE_LIMIT = 64 * 1024  # buffers smaller than this are copied into the pickle (a frame costs more)


class Unpicklable(Exception):
    """A value that cannot cross processes (a lock, an open file, a generator...)."""


class _LargeBytes:
    """A large `bytes` value pickled out of band (pickle keeps `bytes` in band): it loads as
    `bytes` again, copied once from the received frame."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def __reduce_ex__(self, protocol: int):
        return bytes, (pickle.PickleBuffer(self.data),)


def _outer(value: Any) -> Any:
    """`value` with its large `bytes` at the top of its dicts (a frame's fields, a role's
    inputs) marked to travel out of band; one shallow pass, nothing deeper."""
    if type(value) is dict:
        if any(type(v) is bytes and len(v) >= INLINE_LIMIT for v in value.values()):
            return {k: _LargeBytes(v) if type(v) is bytes and len(v) >= INLINE_LIMIT else v for k, v in value.items()}
        return value
    if type(value) is tuple:
        return tuple(_outer(v) for v in value)
    return value


def dumps(value: Any, memory: Any = None) -> list[Any]:
    """`value` as ZMQ frames: the pickle, then its large buffers (not copied). With `memory`
    (a data-plane encoder, flowrt.memory.tensors), its `reduce(obj)` may replace an object
    (a large tensor) by a handle to shared memory; NotImplemented leaves it to pickle."""
    buffers: list[pickle.PickleBuffer] = []
    value = _outer(value)

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < INLINE_LIMIT:
            return True  # pickle it in band
        buffers.append(buffer)
        return False

    try:
        if memory is None:
            data = pickle.dumps(value, protocol=5, buffer_callback=out_of_band)
        else:
            out = io.BytesIO()
            _Pickler(out, memory.reduce, out_of_band).dump(value)
            data = out.getvalue()
    except (Unpicklable, FlowrtError):  # (the data plane's refusals say what they are themselves)
        raise
    except Exception as error:  # noqa: BLE001 - any value's __reduce__ may raise anything
        raise Unpicklable(f"{type(error).__name__}: {error}") from None
    return [data, *(b.raw() for b in buffers)]


class _Pickler(pickle.Pickler):
    """A pickler that asks the data plane first (`reducer_override`, called for every object)."""

    def __init__(self, out: io.BytesIO, reduce: Any, buffer_callback: Any):
        super().__init__(out, protocol=5, buffer_callback=buffer_callback)
        self.reduce = reduce

    def reducer_override(self, obj: Any) -> Any:
        return self.reduce(obj)


_decoding = threading.local()


def current_decoder() -> Any:
    """The data-plane decoder of the `loads` running in this thread (None outside one)."""
    return getattr(_decoding, "decoder", None)


def loads(frames: list[Any], memory: Any = None) -> Any:
    """The value `dumps` made, over the received frames (bytes or zmq.Frame); `memory` turns
    the handles in it back into tensors (current_decoder())."""
    first, rest = frames[0], frames[1:]
    if memory is None:
        return pickle.loads(_view(first), buffers=[_view(f) for f in rest])
    outer = getattr(_decoding, "decoder", None)
    _decoding.decoder = memory
    try:
        return pickle.loads(_view(first), buffers=[_view(f) for f in rest])
    finally:
        _decoding.decoder = outer


def _view(frame: Any) -> Any:
    buffer = getattr(frame, "buffer", None)  # a zmq.Frame received with copy=False
    return buffer if buffer is not None else frame
