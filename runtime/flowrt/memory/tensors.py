"""Tensors in frames: a large CPU tensor or numpy array crosses processes as a handle to a
block of the Tmp Buffer Pool, and arrives as a tensor over the same memory.

`Encoder.reduce` is the pickler's hook (flowrt.transport.codec.dumps): a tensor that already
lies in the pool (made with `ctx.memory.empty`, or received and unchanged) is sent as a handle
to its block with one more ref, with no copy; any other large tensor is copied once into a new
block. `rebuild` is what the handle unpickles to: the receiving process maps the block
privately (copy-on-write) and views it. In a replica the frame's ref is the call's; the
gateway adopts each ref it receives as its own while its tensor lives, and takes one per
activation it starts with the tensor (`refs`, freed when that activation ends).

What a role may do with a tensor it received (docs/memory.md): read it; keep it for the
activation; write into it (the pages written become its own copies: nobody else sees the
change, and the runtime copies it if it is sent on). A numpy array received is read-only (a
write raises). Keeping either beyond the activation needs `.clone()`/`.copy()`: its block
may be reused once the call ends. Tensors on a GPU, and those below INLINE_LIMIT, are pickled
as before.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from flowrt.memory import protocol as p
from flowrt.memory.client import MemoryClient, MemoryError_, MemoryRefused
from flowrt.transport import codec

INLINE_LIMIT = codec.INLINE_LIMIT  # smaller tensors are cheaper pickled in the frame
log = logging.getLogger("flowrt.memory")
_warned_full = False  # the pool-full fallback is logged once per process


def _modules() -> tuple[Any, Any]:
    import numpy

    try:
        import torch
    except ImportError:  # numpy arrays travel even where torch is not installed
        torch = None
    return numpy, torch


class Encoder:
    """The data-plane side of pickling one payload (codec.dumps(..., memory=encoder))."""

    def __init__(self, client: MemoryClient, call: str, *, gateway: bool = False):
        self.client = client
        self.call = call
        self.gateway = gateway
        self.refs: list[int] = []  # gateway: blocks this payload needs a ref on (taken by `take_refs`)
        self.numpy, self.torch = _modules()

    def reduce(self, obj: Any) -> Any:
        kind = type(obj)
        torch = self.torch
        if torch is not None and kind is torch.Tensor:
            if (
                obj.device.type != "cpu"
                or obj.layout is not torch.strided  # sparse (COO, CSR...), mkldnn: pickled as they are
                or obj.is_quantized
                or obj.is_nested
                or obj.numel() * obj.element_size() < INLINE_LIMIT
            ):
                return NotImplemented
            if obj.is_conj() or obj.is_neg():  # a lazy conjugate or negation: its bytes alone would lose it
                obj = obj.resolve_conj().resolve_neg()
            return self._handle(obj, "torch", str(obj.dtype).removeprefix("torch."), obj.data_ptr(), obj.is_contiguous())
        if kind is self.numpy.ndarray:
            if obj.dtype.hasobject or obj.dtype.fields is not None or obj.nbytes < INLINE_LIMIT:  # (records: pickled)
                return NotImplemented
            return self._handle(obj, "numpy", obj.dtype.str, obj.ctypes.data, obj.flags.c_contiguous)
        return NotImplemented

    def _handle(self, obj: Any, kind: str, dtype: str, address: int, contiguous: bool) -> Any:
        client = self.client
        nbytes = obj.nbytes if kind == "numpy" else obj.numel() * obj.element_size()
        located = self._located(obj, kind, address, nbytes) if contiguous else None
        if located is None:
            try:
                reply = client.alloc(nbytes, call=self.call)
            except MemoryRefused as error:
                if error.code != p.NO_ROOM:
                    raise
                _pool_full(error)
                return NotImplemented  # the pool is full: this tensor is pickled into the frame instead
            self._copy_into(obj, kind, reply.offset, nbytes)
            located = (client.mapping.path, client.epoch, reply.block, reply.offset, reply.size, 0)
            if self.gateway:
                self.refs.append(-reply.block)  # its alloc ref is the activation's already
        return rebuild, (*located, nbytes, kind, dtype, tuple(obj.shape), self.call)

    def _located(self, obj: Any, kind: str, address: int, nbytes: int) -> tuple | None:
        """(slab, epoch, block, block offset, block size, offset inside) of a tensor already in
        the pool, with a ref taken for this payload; None if it lies elsewhere, or was written
        since it arrived (the change is this process's own and must be copied)."""
        client = self.client
        view = client.find_view(address, nbytes)
        if view is not None:
            if (kind == "torch" and obj._version != 0) or view.epoch != client.epoch:
                return None  # written since it arrived, or its manager is gone: copied
            self._ref(view.block)
            return view.slab, view.epoch, view.block, view.offset, view.end - view.start, address - view.start
        located = client.locate(address, nbytes)
        if located is None:
            return None
        slab_offset, epoch = located
        try:
            reply = client.request(p.RefAt(p.VERSION, 0, slab_offset, self.call, "", epoch))
        except MemoryRefused as error:
            if error.code == p.STALE:
                return None  # made under a manager that died since: its bytes are copied into the new pool
            raise
        if self.gateway:
            self.refs.append(-reply.block)  # the gateway's own tensor (memory.empty): this ref is the activation's
        if slab_offset + nbytes > reply.offset + reply.size:
            return None  # (it straddles blocks: copied; the ref taken goes with the call)
        return client.mapping.path, client.epoch, reply.block, reply.offset, reply.size, slab_offset - reply.offset

    def _ref(self, block: int) -> None:
        if self.gateway:
            self.refs.append(block)  # posted in order before the start (`take_refs`)
            return
        try:
            self.client.request(p.AddRef(p.VERSION, 0, block, self.call, ""))
        except MemoryRefused as error:
            raise MemoryRefused(
                "a received tensor was sent on after the call that brought it had ended, and its block was released "
                "(another call may have its bytes now): keep a .clone() of a tensor you hold past an activation "
                f"({error})"
            ) from None

    def _copy_into(self, obj: Any, kind: str, offset: int, nbytes: int) -> None:
        target = self.client.mapping.map
        if kind == "torch":
            torch = self.torch
            flat = torch.frombuffer(target, dtype=torch.uint8, count=nbytes, offset=offset)
            flat.view(obj.dtype).view(obj.shape).copy_(obj)
        else:
            numpy = self.numpy
            numpy.frombuffer(target, dtype=numpy.uint8, count=nbytes, offset=offset).view(obj.dtype).reshape(obj.shape)[...] = obj

    def take_refs(self) -> list[int]:
        """Gateway: post a ref for each block this payload forwards; the blocks the activation
        holds (to free when it ends)."""
        held = []
        for block in self.refs:
            if block > 0:
                self.client.post(p.AddRef(p.VERSION, 0, block, self.call, ""))
            held.append(abs(block))
        self.refs = []
        return held


class Decoder:
    """The data-plane side of unpickling (codec.loads(..., memory=decoder))."""

    def __init__(self, client: MemoryClient, *, adopt: bool = False, owned: bool = False):
        self.client = client
        self.adopt = adopt  # the gateway: each received tensor's ref becomes its own while it lives
        self.owned = owned  # the process holds a ref already (a cache hit in setup): free it with the tensor
        self.numpy, self.torch = _modules()
        self.nbytes = 0  # bytes of the tensors it has mapped so far (the edges' bytes for /metrics)

    def tensor(
        self,
        slab: str,
        epoch: str,
        block: int,
        offset: int,
        size: int,
        inner: int,
        nbytes: int,
        kind: str,
        dtype: str,
        shape: tuple,
        call: str,
    ) -> Any:
        client = self.client
        if not client.knows(epoch):
            raise MemoryError_(
                f"a frame carries a tensor in {slab}, which no memory manager of this process's machine holds "
                "(another machine's, or one that died): it cannot be mapped here"
            )
        buffer = client.view(slab, epoch, block, offset, size)
        self.nbytes += nbytes
        if self.adopt:
            client.post(p.Adopt(p.VERSION, 0, block, call, client.process))
        if self.adopt or self.owned:
            weakref.finalize(buffer, client.post, p.Free(p.VERSION, 0, block, "", client.process))
        if kind == "torch":
            torch = self.torch
            if torch is None:
                raise MemoryError_("a frame carries a torch tensor, but torch is not installed here (pip install 'flowc[torch]')")
            flat = (
                torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=inner)
                if nbytes
                else torch.empty(0, dtype=torch.uint8)
            )
            return flat.view(getattr(torch, dtype)).view(shape)
        numpy = self.numpy
        array = numpy.frombuffer(buffer, dtype=numpy.dtype(dtype), count=nbytes // numpy.dtype(dtype).itemsize, offset=inner)
        array = array.reshape(shape)
        array.flags.writeable = False
        return array


def _pool_full(error: MemoryRefused) -> None:
    global _warned_full
    if not _warned_full:
        _warned_full = True
        log.warning("memory: %s; until it has room, tensors are pickled into their frames (slower, nothing lost)", error)


def rebuild(*handle: Any) -> Any:
    """What a tensor's handle unpickles to (see the module's docstring)."""
    decoder = codec.current_decoder()
    if decoder is None:
        raise MemoryError_("a frame carries a shared-memory tensor, but this process has no memory manager to map it")
    return decoder.tensor(*handle)
