"""`ctx.memory`: what a role's code reaches of the data plane (docs/memory.md).

    out = ctx.memory.empty((4096, 4096), torch.float16)   # a tensor in the pool: sent with no copy
    ctx.memory.cache(out, "prompt:1f3a")                   # others may borrow it by key
    hit = ctx.memory.lookup("prompt:1f3a")                 # a tensor over the same block, or None
    model = await ctx.memory.shared_model("vit-b16", build, load)   # in setup(): one copy per machine
    pages = await ctx.memory.kv_pool_barrier(lambda: free_bytes() // 2)

`ProcessMemory` is the one of a replica process (over its MemoryClient); a block it allocates
(or borrows with `lookup`) in an activation is held until the activation ends (or its call, if
that comes first), in setup by the process (until the tensor is garbage, or the process dies).
A frame that carries the tensor holds a ref of its own. `InprocMemory` gives the same calls to an embedded runtime,
where nothing crosses a process: tensors are ordinary ones and a shared model is one object.
"""

from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from typing import Any

from flowrt.memory import protocol as p
from flowrt.memory.client import MemoryClient


def _dtype(torch: Any, dtype: Any) -> Any:
    return torch.float32 if dtype is None else dtype


class ProcessMemory:
    def __init__(self, client: MemoryClient, call: str = ""):
        self.client = client
        self.call = call  # "" in setup: the process holds what it takes
        self.taken: list[Any] = []  # an activation's refs: what frees each, run once when it ends (`release`)

    def for_call(self, call: str) -> ProcessMemory:
        """The `ctx.memory` of one activation of call `call`."""
        return ProcessMemory(self.client, call)

    def release(self) -> None:
        """The activation ended: drop its refs (the frames it sent hold their own)."""
        for free in self.taken:
            free()  # (a weakref.finalize runs once: a block whose tensor died earlier was freed then)
        self.taken = []

    def _holder(self) -> dict:
        return {"call": self.call, "process": "" if self.call else self.client.process}

    def empty(self, shape: tuple | list | int, dtype: Any = None) -> Any:
        """An uninitialised torch tensor in the pool: fill it and send it, with no copy."""
        import torch

        dtype = _dtype(torch, dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = max(1, torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size())
        base = self._block(nbytes)
        return torch.from_numpy(base)[: nbytes if torch.Size(shape).numel() else 0].view(dtype).view(shape)

    def empty_array(self, shape: tuple | list | int, dtype: Any = "float32") -> Any:
        """An uninitialised numpy array in the pool."""
        import numpy

        dtype = numpy.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = max(1, int(numpy.prod(shape)) * dtype.itemsize)
        return self._block(nbytes)[: int(numpy.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)

    def _block(self, nbytes: int) -> Any:
        """A new block's bytes as a numpy array over the shared slab."""
        import numpy

        reply = self.client.alloc(nbytes, **self._holder())
        base = numpy.frombuffer(self.client.mapping.map, dtype=numpy.uint8, count=nbytes, offset=reply.offset)
        # freed when the last view of it goes (a stream's blocks do not pile up), or when the activation ends
        free = weakref.finalize(base, self.client.post, p.Free(p.VERSION, 0, reply.block, **self._holder()))
        if self.call:
            self.taken.append(free)
        return base

    def cache(self, tensor: Any, key: str) -> None:
        """Let other requests borrow `tensor` (made with `empty`) by `key` while it stays idle in the LRU."""
        address, nbytes, meta = _describe(tensor)
        offset = self.client.slab_offset(address, nbytes)
        if offset is None:
            raise ValueError("ctx.memory.cache: only a tensor made with ctx.memory.empty (in the pool) can be cached")
        reply = self.client.request(p.RefAt(p.VERSION, 0, offset, **self._holder()))
        meta["inner"] = offset - reply.offset
        self.client.request(p.Cache(p.VERSION, 0, reply.block, key, meta))
        self.client.post(p.Free(p.VERSION, 0, reply.block, **self._holder()))

    def lookup(self, key: str) -> Any:
        """The tensor cached under `key` (read as received tensors are), or None."""
        client = self.client
        reply = client.request(p.Lookup(p.VERSION, 0, key, **self._holder()))
        if not reply.block:
            return None
        if self.call:
            self.taken.append(functools.partial(self.client.post, p.Free(p.VERSION, 0, reply.block, self.call, "")))
        from flowrt.memory.tensors import Decoder

        meta = reply.data
        return Decoder(client, owned=not self.call).tensor(
            reply.slab,
            reply.epoch,
            reply.block,
            reply.offset,
            reply.size,
            meta["inner"],
            meta["nbytes"],
            meta["kind"],
            meta["dtype"],
            tuple(meta["shape"]),
            self.call,
        )

    def statistics(self) -> dict:
        return self.client.statistics()

    async def shared_model(self, name: str, build: Any, load: Any, *, topology: str = "", timeout: float = 600.0) -> Any:
        from flowrt.memory.weights import shared_model

        return await shared_model(self.client, name, build, load, topology=topology, timeout=timeout)

    async def kv_pool_barrier(
        self, propose: Any, *, group: str = "kv", participants: int | None = None, timeout: float = 600.0
    ) -> int:
        from flowrt.memory.weights import kv_pool_barrier

        return await kv_pool_barrier(self.client, propose, group=group, participants=participants, timeout=timeout)


def _describe(tensor: Any) -> tuple[int, int, dict]:
    kind = type(tensor).__module__.split(".")[0]
    if kind == "torch":
        nbytes = tensor.numel() * tensor.element_size()
        return (
            tensor.data_ptr(),
            nbytes,
            {"kind": "torch", "dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape), "nbytes": nbytes},
        )
    return (
        tensor.ctypes.data,
        tensor.nbytes,
        {"kind": "numpy", "dtype": tensor.dtype.str, "shape": list(tensor.shape), "nbytes": tensor.nbytes},
    )


class InprocMemory:
    """`ctx.memory` of an embedded runtime: the same calls, nothing shared across processes."""

    CACHE_ENTRIES = 1024

    def __init__(self) -> None:
        self.cached: OrderedDict[str, Any] = OrderedDict()
        self.models: dict[str, Any] = {}
        self.hits = 0

    def for_call(self, call: str) -> InprocMemory:
        return self

    def empty(self, shape: Any, dtype: Any = None) -> Any:
        import torch

        return torch.empty(shape, dtype=_dtype(torch, dtype))

    def empty_array(self, shape: Any, dtype: Any = "float32") -> Any:
        import numpy

        return numpy.empty(shape, dtype=dtype)

    def cache(self, tensor: Any, key: str) -> None:
        self.cached[key] = tensor
        self.cached.move_to_end(key)
        while len(self.cached) > self.CACHE_ENTRIES:
            self.cached.popitem(last=False)

    def lookup(self, key: str) -> Any:
        tensor = self.cached.get(key)
        if tensor is not None:
            self.hits += 1
            self.cached.move_to_end(key)
        return tensor

    def statistics(self) -> dict:
        return {"cached": len(self.cached), "lru_hits": self.hits, "models": sorted(self.models)}

    async def shared_model(self, name: str, build: Any, load: Any, *, topology: str = "", timeout: float = 600.0) -> Any:
        key = f"{name}|{topology}"
        model = self.models.get(key)
        if model is None:  # replicas in one process share the very module
            model = build()
            load(model)
            self.models[key] = model
        return model

    async def kv_pool_barrier(
        self, propose: Any, *, group: str = "kv", participants: int | None = None, timeout: float = 600.0
    ) -> int:
        return int(propose() if callable(propose) else propose)
