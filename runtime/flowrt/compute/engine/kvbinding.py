"""The KV block stacks an engine is bound to, checked, with the page and slot copies every engine
whose KV lives in those stacks can share (`BoundKV`), and `kv_stacks`, which takes them from a
pool (`KVPool`, its `DeviceTier`, or a `KVSession`). `StackedKVEngine` is the adapter half every
engine on such stacks shares (binding, page and slot copies, close).

A stack is (slots, page_tokens, heads, head_dim): page slot s holds tokens s*page_tokens ..
s*page_tokens + page_tokens - 1 of the token-granular slot space, so `token_view` (slots *
page_tokens, heads, head_dim) is a zero-copy view attention can index by token slot.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from flowrt.compute.engine.adapter import EngineAdapter, EngineError, EngineSpec, KVStacks
from flowrt.params.layout import TORCH_DTYPES
from flowrt.params.pool import KVPool
from flowrt.params.session import KVSession
from flowrt.params.tiers import DeviceTier


def _torch() -> Any:
    import torch

    return torch


def kv_stacks(source: Any) -> dict[tuple[str, str], Any]:
    """The L1 block stacks of a `KVSession`, a `KVPool` or a `DeviceTier`, by (sub, slice)."""
    tier = source.pool if isinstance(source, KVSession) else source
    tier = tier.device if isinstance(tier, KVPool) else tier
    if not isinstance(tier, DeviceTier):
        raise EngineError(f"kv_stacks() takes a KVSession, a KVPool or a DeviceTier, not {type(source).__name__}")
    return dict(zip(tier.layout.chunks(), tier.stacks, strict=True))


def _index_list(values: Sequence[int] | Any, what: str) -> list[int]:
    if hasattr(values, "tolist"):
        values = values.tolist()
    try:
        return [operator.index(value) for value in values]
    except TypeError:
        raise EngineError(f"{what} must be a list of ints, not {values!r:.80}") from None


class BoundKV:
    """Checked stacks for one engine: per layer its K and V as token-slot views."""

    def __init__(self, spec: EngineSpec, stacks: KVStacks):
        torch = _torch()
        self.spec = spec
        wanted = [(sub, slice_) for sub in spec.sub_names for slice_ in spec.slice_names]
        if not hasattr(stacks, "keys"):
            raise EngineError(
                f"bind_kv() takes a mapping (sub_name, slice_name) -> block stack (see kv_stacks()), not {stacks!r:.60}"
            )
        missing = [pair for pair in wanted if pair not in stacks]
        extra = sorted(set(stacks) - set(wanted))
        if missing or extra:
            raise EngineError(
                f"engine `{spec.name}` needs one block stack for each of layers {list(spec.sub_names)} x {list(spec.slice_names)}; "
                f"missing {missing[:4]}, unexpected {extra[:4]}: size the global with {spec.global_settings()}"
            )
        dtype = getattr(torch, TORCH_DTYPES.get(spec.kv_dtype, spec.kv_dtype))
        first = stacks[wanted[0]]
        for pair in wanted:
            stack = stacks[pair]
            if not isinstance(stack, torch.Tensor) or stack.dim() != 4:
                raise EngineError(f"block stack {pair} must be a tensor (slots, page_tokens, heads, head_dim), not {stack!r:.60}")
            if stack.shape[2:] != (spec.num_kv_heads, spec.head_dim):
                raise EngineError(
                    f"block stack {pair} has items of shape {tuple(stack.shape[2:])}, engine `{spec.name}` writes "
                    f"({spec.num_kv_heads}, {spec.head_dim}): set `heads {spec.num_kv_heads}` and `head_dim {spec.head_dim}` in the global"
                )
            if stack.shape != first.shape:
                raise EngineError(
                    f"block stacks {wanted[0]} and {pair} differ in shape ({tuple(first.shape)}, {tuple(stack.shape)})"
                )
            if stack.dtype != dtype:
                raise EngineError(
                    f"block stack {pair} is {stack.dtype}; engine `{spec.name}` stores {dtype}: set `dtype {spec.kv_dtype}`"
                )
            if stack.device.type != torch.device(spec.device).type:
                raise EngineError(f"block stack {pair} is on {stack.device}; engine `{spec.name}` runs on {spec.device}")
            if not stack.is_contiguous():
                raise EngineError(f"block stack {pair} is not contiguous: pass the pool's own stacks, not a strided view")
        self.pages, self.page_tokens = int(first.shape[0]), int(first.shape[1])
        self.slot_count = self.pages * self.page_tokens
        self.stacks = [stacks[pair] for pair in wanted]  # layout.chunks() order: layer-major, then k, v
        flat = [stack.view(self.slot_count, spec.num_kv_heads, spec.head_dim) for stack in self.stacks]
        self.keys = flat[0::2]  # per layer: (token slots, heads, head_dim), zero-copy
        self.values = flat[1::2]

    def _slot_tensor(self, values: Sequence[int], what: str, limit: int) -> Any:
        torch = _torch()
        items = _index_list(values, what)
        bad = next((value for value in items if not 0 <= value < limit), None)
        if bad is not None:
            unit = "token slots" if limit == self.slot_count else "pages"
            raise EngineError(f"{what}: {bad} is outside the bound KV stacks ({unit} 0..{limit - 1})")
        return torch.tensor(items, dtype=torch.int64, device=self.stacks[0].device)

    def copy_slots(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Token slots src[i] -> dst[i] in every stack, as if all were read before any is written."""
        sources = self._slot_tensor(src, "copy_slots() source slot", self.slot_count)
        targets = self._slot_tensor(dst, "copy_slots() destination slot", self.slot_count)
        if len(sources) != len(targets):
            raise EngineError(f"copy_slots(): {len(sources)} source slots but {len(targets)} destination slots; give one for one")
        if len(_torch().unique(targets)) != len(targets):
            raise EngineError("copy_slots(): a destination slot appears twice; each slot gets one source")
        for flat in (*self.keys, *self.values):
            flat.index_copy_(0, targets, flat.index_select(0, sources))

    def read_pages(self, pages: Sequence[int]) -> Any:
        index = self._slot_tensor(pages, "read_pages() page", self.pages)
        return _torch().stack([stack.index_select(0, index) for stack in self.stacks], dim=1)

    def write_pages(self, pages: Sequence[int], data: Any) -> None:
        torch = _torch()
        index = self._slot_tensor(pages, "write_pages() page", self.pages)
        shape = (len(index), len(self.stacks), *self.stacks[0].shape[1:])
        if not isinstance(data, torch.Tensor) or tuple(data.shape) != shape:
            got = tuple(data.shape) if isinstance(data, torch.Tensor) else type(data).__name__
            raise EngineError(
                f"write_pages(): data must be a tensor {shape} (pages, chunks, page_tokens, heads, head_dim), not {got}"
            )
        if len(torch.unique(index)) != len(index):
            raise EngineError("write_pages(): a page appears twice; write each page once")
        for chunk, stack in enumerate(self.stacks):
            stack.index_copy_(0, index, data[:, chunk].to(stack.device, stack.dtype))


class StackedKVEngine(EngineAdapter):
    """An engine whose K/V live in bound block stacks: the subclass sets `_spec` (its
    EngineSpec) and `unbound_hint` (what to tell a caller who has not bound stacks yet)."""

    _spec: EngineSpec
    unbound_hint = "call bind_kv(stacks) first"
    _kv: BoundKV | None = None

    def describe(self) -> EngineSpec:
        return self._spec

    def bind_kv(self, stacks: KVStacks) -> None:
        self._kv = BoundKV(self._spec, stacks)

    @property
    def bound(self) -> BoundKV:
        if self._kv is None:
            raise EngineError(f"engine `{self._spec.name}` has no KV stacks: {self.unbound_hint}")
        return self._kv

    def copy_slots(self, src: Sequence[int], dst: Sequence[int]) -> None:
        self.bound.copy_slots(src, dst)

    def read_pages(self, pages: Sequence[int]) -> Any:
        return self.bound.read_pages(pages)

    def write_pages(self, pages: Sequence[int], data: Any) -> None:
        self.bound.write_pages(pages, data)

    def close(self) -> None:
        self._kv = None
