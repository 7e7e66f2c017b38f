"""Weight sharing and the kv_pool_barrier (Omni-Flow §4.3), for role processes on one machine.

`shared_model(client, name, build, load)`: `build()` runs on torch's meta device (no memory
is touched); the parameters and buffers are laid out in one segment of shared memory keyed by
`name|topology` and the layout's fingerprint; the first process to claim the key (the owner)
binds the model to the segment and runs `load(model)`, which writes the checkpoint there; every
other process (a follower) binds to the same pages, skips loading (its parameters' `copy_` is
a no-op, so a load it runs anyway cannot overwrite the owner's) and polls the manager until
the owner says they are ready. An owner that fails or dies hands the key to the next claimant.

`kv_pool_barrier(client, propose)`: every co-located process first reports its weights
loaded; only then does each compute its proposal for the shared KV pool (free memory is only
meaningful once everybody's weights are in), and all get the minimum.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import time
from typing import Any

from flowrt.memory import protocol as p
from flowrt.memory.client import MemoryClient, MemoryError_
from flowrt.memory.slab import Mapping

ALIGN = 64  # bytes: every tensor starts on a cache line
FIRST_POLL, LAST_POLL = 0.02, 1.0  # seconds between a waiting follower's looks, doubling
log = logging.getLogger("flowrt.memory")
WAIT_NOTICE = 10.0  # seconds a kv_pool_barrier waits before it says in the log what it waits for


def _layout(model: Any) -> tuple[list[tuple], int]:
    """[(module, attribute, is_parameter, shape, dtype, offset)] and the total size; a tensor
    tied to two places (shared embeddings) is laid out once."""
    entries, seen, offset = [], {}, 0
    for module_name, module in model.named_modules(remove_duplicate=False):
        for group, is_parameter in ((module._parameters, True), (module._buffers, False)):
            for attribute, tensor in group.items():
                if tensor is None:
                    continue
                key = id(tensor)
                if key not in seen:
                    nbytes = tensor.numel() * tensor.element_size()
                    seen[key] = offset
                    offset += -(-nbytes // ALIGN) * ALIGN
                entries.append((module_name, module, attribute, is_parameter, tuple(tensor.shape), tensor.dtype, seen[key]))
    return entries, max(offset, ALIGN)


def _fingerprint(entries: list[tuple]) -> str:
    described = [
        [name, attribute, is_parameter, list(shape), str(dtype), offset]
        for name, _, attribute, is_parameter, shape, dtype, offset in entries
    ]
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]


def _bind(entries: list[tuple], mapping: Mapping, follower: bool) -> None:
    import numpy
    import torch

    base = numpy.frombuffer(mapping.map, dtype=numpy.uint8)
    parameter = _SkipCopy if follower else torch.nn.Parameter
    for _, module, attribute, is_parameter, shape, dtype, offset in entries:
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        tensor = torch.from_numpy(base[offset : offset + nbytes]).view(dtype).view(shape)
        if is_parameter:
            module._parameters[attribute] = parameter(tensor, requires_grad=False)
        else:  # (a follower's persistent buffers are the owner's too: load_state_dict writes them)
            module._buffers[attribute] = tensor.as_subclass(_SkipCopyBuffer.get()) if follower else tensor


def _skip_copy_parameter() -> Any:
    import torch

    class SkipCopyParameter(torch.nn.Parameter):
        """A follower's parameter: the owner wrote these pages; copying into them is a no-op."""

        def copy_(self, source: Any, non_blocking: bool = False) -> Any:
            return self

    return SkipCopyParameter


def _skip_copy_buffer() -> Any:
    import torch

    class SkipCopyBuffer(torch.Tensor):
        """A follower's buffer: as a follower's parameter, `copy_` into it is a no-op. Like
        torch's Parameter, it does not pass itself on: what an operation on it returns is a
        plain tensor (else a model's output would ignore copies too)."""

        __torch_function__ = torch._C._disabled_torch_function_impl

        def copy_(self, source: Any, non_blocking: bool = False) -> Any:
            return self

    return SkipCopyBuffer


class _Lazy:
    """A class made on first use (torch is imported only by processes that share weights)."""

    def __init__(self, make: Any) -> None:
        self.make = make
        self.cls: Any = None

    def get(self) -> Any:
        if self.cls is None:
            self.cls = self.make()
        return self.cls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.get()(*args, **kwargs)


_SkipCopy = _Lazy(_skip_copy_parameter)
_SkipCopyBuffer = _Lazy(_skip_copy_buffer)


async def shared_model(
    client: MemoryClient, name: str, build: Any, load: Any, *, topology: str = "", timeout: float = 600.0
) -> Any:
    import torch

    with torch.device("meta"):
        model = build()
    entries, nbytes = _layout(model)
    key = f"{name}|{topology}"
    layout = _fingerprint(entries)
    deadline = time.monotonic() + timeout
    interval = FIRST_POLL
    bound: str | None = None
    while True:
        reply = client.request(p.Claim(p.VERSION, 0, key, nbytes, layout, client.process))
        role, state = reply.data["role"], reply.data["state"]
        if bound != role:
            # one mapping of a segment per process (the client's, closed with it): a process that
            # asks for the same model again maps it no second time (no fd, no mmap per call)
            _bind(entries, client.mapped(reply.data["path"]), follower=role == "follower")
            bound = role
        if role == "owner" and state == "loading":
            try:
                result = load(model)
                if inspect.isawaitable(result):
                    await result
            except BaseException as error:
                client.request(p.Loaded(p.VERSION, 0, key, f"{type(error).__name__}: {error}"))
                raise
            client.request(p.Loaded(p.VERSION, 0, key, ""))
            return model.eval()
        if state == "ready":
            return model.eval()
        if state == "failed" and role == "follower":
            raise MemoryError_(f"shared weights `{key}`: their owner failed to load them: {reply.data['error']}")
        if time.monotonic() >= deadline:
            raise MemoryError_(f"shared weights `{key}`: not loaded by their owner within {timeout:g}s")
        await asyncio.sleep(interval)
        interval = min(LAST_POLL, interval * 2)


async def kv_pool_barrier(
    client: MemoryClient, propose: Any, *, group: str = "kv", participants: int | None = None, timeout: float = 600.0
) -> int:
    shown = group
    if participants is None:  # the co-located processes: this role's and those sharing its GPUs (the deployment says)
        participants = client.participants
        group = f"{group}@{client.colocated}" if client.colocated else group
    deadline = time.monotonic() + timeout
    say_at = time.monotonic() + WAIT_NOTICE

    async def until(phase: int, proposal: int, done: Any) -> dict:
        nonlocal say_at
        interval = FIRST_POLL
        while True:
            data = client.request(p.Arrive(p.VERSION, 0, group, phase, client.name, participants, proposal)).data
            if done(data):
                return data
            if time.monotonic() >= say_at:  # (once: a barrier some process never reaches waits silently else)
                say_at = float("inf")
                log.warning(
                    "%s: kv_pool_barrier `%s` waits for %d co-located processes, %d of which loaded their weights "
                    "so far; every one of them must call it (or pass participants=N)",
                    client.name,
                    shown,
                    data["participants"],
                    data["loaded"],
                )
            if time.monotonic() >= deadline:
                raise MemoryError_(
                    f"kv_pool_barrier `{shown}`: {data['loaded']} of {data['participants']} co-located processes loaded "
                    f"their weights and {data['proposed']} proposed a size within {timeout:g}s"
                )
            await asyncio.sleep(interval)
            interval = min(LAST_POLL, interval * 2)

    data = await until(1, 0, lambda d: "value" in d or d["loaded"] >= d["participants"])
    if "value" in data:
        return int(data["value"])  # sized already (this process restarted): the pool keeps its size
    proposal = propose() if callable(propose) else propose
    if inspect.isawaitable(proposal):
        proposal = await proposal
    data = await until(2, int(proposal), lambda d: "value" in d)
    return int(data["value"])
