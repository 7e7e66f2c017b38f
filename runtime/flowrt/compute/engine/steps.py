"""Checking a forward step against the adapter contract, before any K/V is touched.

`check_batch` turns a `StepBatch` into `CheckedRequest`s (CPU int64 tensors for slots and
positions) or raises an `EngineError` naming the request, what is wrong and the fix: inputs given
twice or not at all, token ids outside the vocabulary, embeddings of the wrong width, a slot list
shorter than the new tokens, slots outside the bound stacks or repeated, positions of the wrong
length, two requests writing one slot, or a request reading a slot another one writes in the same
step (its value would depend on the order the engine happens to run them in).

Every engine can use it: the reference engine does, and an SGLang adapter gets from it exactly
what it hands SGLang (the new slots are `out_cache_loc`, the slot lists the `req_to_token` rows).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flowrt.compute.engine.adapter import (
    CAPTURE_LOGITS,
    CAPTURES,
    FEATURE_BIDIRECTIONAL,
    FEATURE_EMBEDDINGS,
    FEATURE_HIDDEN,
    FEATURE_NO_WRITE,
    EngineError,
    EngineSpec,
    StepBatch,
    StepRequest,
)


def _torch() -> Any:
    import torch

    return torch


@dataclass(frozen=True)
class CheckedRequest:
    """One request of a step, checked: CPU int64 tensors, counts worked out."""

    token_ids: Any  # (n,) int64, or None
    embeddings: Any  # (n, hidden), or None
    slots: Any  # (len(request.slots),) int64
    positions: Any  # (n,) int64
    new_tokens: int
    causal: bool
    write_kv: bool
    capture: frozenset[str]

    @property
    def context_length(self) -> int:
        return len(self.slots) + (0 if self.write_kv else self.new_tokens)

    @property
    def written_slots(self) -> Any:
        """The slots this request's new tokens are stored in (none with write_kv=False)."""
        return self.slots[len(self.slots) - self.new_tokens :] if self.write_kv else self.slots[:0]

    @property
    def read_only_slots(self) -> Any:
        """The cached context's slots: read, never written."""
        return self.slots[: len(self.slots) - self.new_tokens] if self.write_kv else self.slots


def as_index_tensor(values: Sequence[int] | Any, what: str, where: str) -> Any:
    torch = _torch()
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.dtype.is_floating_point or values.dtype == torch.bool:
            raise EngineError(
                f"{where}: {what} must be a 1-d tensor of integers, not {values.dtype} of shape {tuple(values.shape)}"
            )
        return values.detach().to("cpu", torch.int64)
    if isinstance(values, str | bytes) or not hasattr(values, "__len__"):
        raise EngineError(f"{where}: {what} must be a list of ints, not {type(values).__name__}")
    try:
        items = [operator.index(value) for value in values]
    except TypeError:
        bad = next(value for value in values if not isinstance(value, int))
        raise EngineError(f"{where}: {what} must hold ints, not {bad!r}") from None
    return torch.tensor(items, dtype=torch.int64)


def check_request(request: StepRequest, spec: EngineSpec, slot_count: int, where: str) -> CheckedRequest:
    """One request, alone (see `check_batch` for what spans requests)."""
    torch = _torch()
    if not isinstance(request, StepRequest):
        raise EngineError(f"{where}: a step's requests are StepRequest values, not {type(request).__name__}")
    if (request.token_ids is None) == (request.embeddings is None):
        raise EngineError(f"{where}: give the new inputs as token_ids or as embeddings, exactly one of the two")
    token_ids = embeddings = None
    if request.token_ids is not None:
        token_ids = as_index_tensor(request.token_ids, "token_ids", where)
        new = len(token_ids)
        if new and (int(token_ids.min()) < 0 or int(token_ids.max()) >= spec.vocab_size):
            bad = next(int(t) for t in token_ids if not 0 <= int(t) < spec.vocab_size)
            raise EngineError(f"{where}: token id {bad} is outside the vocabulary 0..{spec.vocab_size - 1} of `{spec.name}`")
    else:
        if FEATURE_EMBEDDINGS not in spec.features:
            raise EngineError(f"{where}: engine `{spec.name}` takes token ids only; embed inputs in front of it or pass ids")
        embeddings = request.embeddings
        if not isinstance(embeddings, torch.Tensor) or embeddings.dim() != 2 or embeddings.shape[1] != spec.hidden_size:
            shape = tuple(embeddings.shape) if isinstance(embeddings, torch.Tensor) else type(embeddings).__name__
            raise EngineError(f"{where}: embeddings must be a tensor (new_tokens, {spec.hidden_size}), not {shape}")
        if not embeddings.dtype.is_floating_point:
            raise EngineError(f"{where}: embeddings must be floating point, not {embeddings.dtype}")
        new = embeddings.shape[0]
    if new < 1:
        raise EngineError(f"{where}: a step needs at least one new token for each request; drop the request from the step")
    if not request.write_kv and FEATURE_NO_WRITE not in spec.features:
        raise EngineError(
            f"{where}: engine `{spec.name}` stores every new token's K/V; give the new tokens slots (write_kv=True)"
        )
    if not request.causal and FEATURE_BIDIRECTIONAL not in spec.features:
        raise EngineError(f"{where}: engine `{spec.name}` runs causal attention only (causal=True)")
    slots = as_index_tensor(request.slots, "slots", where)
    if request.write_kv and len(slots) < new:
        raise EngineError(
            f"{where}: the slot list has {len(slots)} entries but the step has {new} new tokens: list the slot of every "
            f"context token in order, the new tokens' slots last"
        )
    if len(slots):
        low, high = int(slots.min()), int(slots.max())
        if low < 0 or high >= slot_count:
            bad = low if low < 0 else high
            raise EngineError(
                f"{where}: slot {bad} is outside the bound KV stacks (token slots 0..{slot_count - 1}); a slot id is "
                f"page_slot * page_tokens + offset"
            )
        if len(torch.unique(slots)) != len(slots):
            values, counts = torch.unique(slots, return_counts=True)
            raise EngineError(
                f"{where}: slot {int(values[counts > 1][0])} appears twice in one context; each token has its own slot"
            )
    context = len(slots) + (0 if request.write_kv else new)
    if request.positions is None:
        positions = torch.arange(context - new, context, dtype=torch.int64)
    else:
        positions = as_index_tensor(request.positions, "positions", where)
        if len(positions) != new:
            raise EngineError(f"{where}: {len(positions)} positions for {new} new tokens; give one position per new token")
        if new and int(positions.min()) < 0:
            raise EngineError(f"{where}: positions must be >= 0, not {int(positions.min())}")
    if spec.max_positions is not None and int(positions.max()) >= spec.max_positions:
        raise EngineError(f"{where}: position {int(positions.max())} is beyond `{spec.name}`'s {spec.max_positions} positions")
    capture = frozenset(request.capture)
    unknown = sorted(capture - CAPTURES)
    if unknown:
        raise EngineError(f"{where}: unknown capture {unknown}; choose from {sorted(CAPTURES)}")
    if capture - {CAPTURE_LOGITS} and FEATURE_HIDDEN not in spec.features:
        raise EngineError(f"{where}: engine `{spec.name}` returns logits only; capture {{'logits'}}")
    return CheckedRequest(token_ids, embeddings, slots, positions, new, bool(request.causal), bool(request.write_kv), capture)


def check_batch(batch: StepBatch, spec: EngineSpec, slot_count: int | None) -> list[CheckedRequest]:
    """Every request of `batch`, checked, and what spans requests (see the module docstring)."""
    torch = _torch()
    if slot_count is None:
        raise EngineError(f"engine `{spec.name}` has no KV stacks: call bind_kv(stacks) before forward()")
    if not isinstance(batch, StepBatch):
        raise EngineError(f"forward() takes a StepBatch, not {type(batch).__name__}")
    if not batch.requests:
        raise EngineError("forward(): the step has no requests")
    checked = [check_request(request, spec, slot_count, f"request {i} of the step") for i, request in enumerate(batch.requests)]
    written = torch.cat([request.written_slots for request in checked])
    if len(torch.unique(written)) != len(written):
        values, counts = torch.unique(written, return_counts=True)
        slot = int(values[counts > 1][0])
        writers = [i for i, request in enumerate(checked) if bool((request.written_slots == slot).any())]
        raise EngineError(f"requests {writers} of the step all write slot {slot}; give each new token a slot of its own")
    if len(written):
        marked = torch.zeros(slot_count, dtype=torch.bool)
        marked[written] = True
        for i, request in enumerate(checked):
            clash = request.read_only_slots[marked[request.read_only_slots]]
            if len(clash):
                raise EngineError(
                    f"request {i} of the step reads slot {int(clash[0])}, which another request of the same step writes; "
                    f"run them in separate steps"
                )
    return checked
