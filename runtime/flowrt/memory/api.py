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

Both check their arguments the same way before anything is allocated or sent (docs/memory.md,
"What the calls accept"): a shape is an int or a sequence of ints, each 0 or more, of fewer
than 2**63 bytes in all; `empty` takes a torch.dtype, `empty_array` a numpy dtype of fixed size
without objects; a kv_pool_barrier proposal is an int from 0 to 2**63 - 1 (a float is refused,
not rounded) and `participants` None (every replica process of the machine) or an int, 1 or
more. Anything else is a TypeError (a wrong type) or a ValueError (a wrong value) naming the
call, the argument and what it accepts.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import weakref
from collections import OrderedDict
from typing import Any

from flowrt.memory import protocol as p
from flowrt.memory.client import MemoryClient

LIMIT = 1 << 63  # bytes of a tensor, and a barrier's proposal: what the manager's protocol carries
MAX_DIMS = 32  # dimensions of a shape (numpy's limit before 2.0)
EMPTY, EMPTY_ARRAY, BARRIER = "ctx.memory.empty", "ctx.memory.empty_array", "ctx.memory.kv_pool_barrier"


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def checked_shape(where: str, shape: Any, itemsize: int) -> tuple[tuple[int, ...], int]:
    """`shape` as a tuple of ints and its size in bytes at `itemsize` bytes an element, or a
    TypeError/ValueError naming `where` (the call)."""
    if _is_int(shape):
        dims: tuple = (shape,)
    elif shape is None or isinstance(shape, (str, bytes, bool, float)):
        raise TypeError(f"{where}(shape={shape!r}): a shape is an int or a sequence of ints, e.g. (4, 1024)")
    else:
        try:
            dims = tuple(shape)
        except TypeError:
            raise TypeError(f"{where}(shape={shape!r}): a shape is an int or a sequence of ints, e.g. (4, 1024)") from None
    for dim in dims:
        if not _is_int(dim):
            raise TypeError(
                f"{where}(shape={shape!r}): every dimension must be an int, 0 or more, not {type(dim).__name__} {dim!r}"
            )
        if dim < 0:
            raise ValueError(f"{where}(shape={shape!r}): a dimension cannot be negative ({dim}); give 0 or more")
    if len(dims) > MAX_DIMS:
        raise ValueError(f"{where}(shape={shape!r}): {len(dims)} dimensions; at most {MAX_DIMS} are allowed")
    dims = tuple(int(dim) for dim in dims)
    nbytes = math.prod(dims) * itemsize
    if nbytes >= LIMIT:
        raise ValueError(
            f"{where}(shape={shape!r}): {nbytes} bytes, more than any tensor can have (under 2**63); give a smaller shape"
        )
    return dims, nbytes


def torch_dtype(torch: Any, dtype: Any) -> tuple[Any, int]:
    """`empty`'s dtype (None: float32) and its element size, or a TypeError naming it."""
    if dtype is None:
        return torch.float32, 4
    if not isinstance(dtype, torch.dtype):
        raise TypeError(
            f"{EMPTY}(dtype={dtype!r}): the dtype must be a torch.dtype, e.g. torch.float16 (for numpy dtypes: {EMPTY_ARRAY})"
        )
    try:
        return dtype, torch.empty((), dtype=dtype).element_size()
    except (RuntimeError, TypeError) as error:
        raise TypeError(f"{EMPTY}(dtype={dtype!r}): torch cannot make a plain tensor of this dtype ({error})") from None


def numpy_dtype(numpy: Any, dtype: Any) -> Any:
    """`empty_array`'s dtype as a numpy.dtype, or a TypeError naming it."""
    if dtype is None:
        raise TypeError(f"{EMPTY_ARRAY}(dtype=None): give a numpy dtype, e.g. 'float32' (the default) or numpy.int64")
    try:
        checked = numpy.dtype(dtype)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{EMPTY_ARRAY}(dtype={dtype!r}): not a numpy dtype ({error}); give one, e.g. 'float32'") from None
    if checked.hasobject:
        raise TypeError(f"{EMPTY_ARRAY}(dtype={dtype!r}): Python objects cannot live in shared memory; give a numeric dtype")
    if checked.itemsize == 0:
        raise TypeError(f"{EMPTY_ARRAY}(dtype={dtype!r}): the dtype has no size; give one with a size, e.g. 'U16' or 'S8'")
    return checked


def checked_barrier(group: Any, participants: Any, timeout: Any) -> None:
    """kv_pool_barrier's arguments other than the proposal, checked before anything is sent."""
    if not isinstance(group, str) or not group:
        raise TypeError(f"{BARRIER}(group={group!r}): the group is a non-empty str, e.g. 'kv' (the default)")
    if participants is not None and not _is_int(participants):
        raise TypeError(
            f"{BARRIER}(participants={participants!r}): give None (every replica process on the machine) "
            f"or an int, 1 or more, not {type(participants).__name__}"
        )
    if participants is not None and not 1 <= participants < LIMIT:
        raise ValueError(
            f"{BARRIER}(participants={participants!r}): give None (every replica process on the machine) "
            "or a number of processes, 1 or more"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise ValueError(f"{BARRIER}(timeout={timeout!r}): give a finite number of seconds greater than 0, e.g. 600")


def checked_proposal(proposal: Any, computed: bool) -> int:
    """A kv_pool_barrier proposal (`computed`: what `propose()` returned): an int, 0 to 2**63 - 1."""
    what = f"propose() returned {proposal!r}" if computed else f"propose={proposal!r}"
    if not _is_int(proposal):
        raise TypeError(
            f"{BARRIER}: {what}, a {type(proposal).__name__}; the proposal must be an int from 0 to 2**63 - 1 "
            "(a size in pages or bytes): round it yourself, e.g. int(x)"
        )
    if not 0 <= proposal < LIMIT:
        raise ValueError(f"{BARRIER}: {what}; the proposal must be an int from 0 to 2**63 - 1 (a size in pages or bytes)")
    return int(proposal)


def checked_propose(propose: Any) -> Any:
    """`propose` as kv_pool_barrier hands it on: a value checked now, or a callable whose
    result (awaited, if it is awaitable) is checked when it is computed."""
    if not callable(propose):
        return checked_proposal(propose, computed=False)

    async def proposal() -> int:
        value = propose()
        if inspect.isawaitable(value):
            value = await value
        return checked_proposal(value, computed=True)

    return proposal


class ProcessMemory:
    def __init__(self, client: MemoryClient, call: str = "", params: Any = None):
        self.client = client
        self.call = call  # "" in setup: the process holds what it takes
        self.taken: list[Any] = []  # an activation's refs: what frees each, run once when it ends (`release`)
        self.params = params  # the process's KV pools (flowrt.params.session.KVPools), for ctx.kv

    def for_call(self, call: str) -> ProcessMemory:
        """The `ctx.memory` of one activation of call `call`."""
        return ProcessMemory(self.client, call, self.params)

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

        dtype, itemsize = torch_dtype(torch, dtype)
        shape, nbytes = checked_shape(EMPTY, shape, itemsize)
        base = self._block(max(1, nbytes))
        return torch.from_numpy(base)[:nbytes].view(dtype).view(shape)

    def empty_array(self, shape: tuple | list | int, dtype: Any = "float32") -> Any:
        """An uninitialised numpy array in the pool."""
        import numpy

        dtype = numpy_dtype(numpy, dtype)
        shape, nbytes = checked_shape(EMPTY_ARRAY, shape, dtype.itemsize)
        return self._block(max(1, nbytes))[:nbytes].view(dtype).reshape(shape)

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

        checked_barrier(group, participants, timeout)
        propose = checked_propose(propose)  # (a value is checked now, a callable's result before it is sent)
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
        self.params: Any = None  # the process's KV pools (flowrt.params.session.KVPools), for ctx.kv
        self.cached: OrderedDict[str, Any] = OrderedDict()
        self.models: dict[str, Any] = {}
        self.hits = 0

    def for_call(self, call: str) -> InprocMemory:
        return self

    def empty(self, shape: Any, dtype: Any = None) -> Any:
        import torch

        dtype, itemsize = torch_dtype(torch, dtype)
        shape, _ = checked_shape(EMPTY, shape, itemsize)
        return torch.empty(shape, dtype=dtype)

    def empty_array(self, shape: Any, dtype: Any = "float32") -> Any:
        import numpy

        dtype = numpy_dtype(numpy, dtype)
        shape, _ = checked_shape(EMPTY_ARRAY, shape, dtype.itemsize)
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
        checked_barrier(group, participants, timeout)
        proposal = checked_propose(propose)
        return await proposal() if callable(proposal) else proposal
