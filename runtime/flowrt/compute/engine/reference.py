"""The reference engine: `ReferenceModel` behind the adapter contract, with paged attention over
the bound block stacks (DESIGN §7). It runs on any CPU, and on CUDA where asked.

One step runs every request of the batch at once. The new tokens of all requests go through the
projections and the MLP as one (tokens, hidden) matrix; attention pads the requests to a
(requests, new tokens, context) grid under a mask, so a step costs one attention call per layer
whatever the batch. Per layer the new K/V are scattered into the stacks at the new tokens' slots
(`index_copy_`), then each request's context is gathered from the stacks by its listed slots
(`index_select`); nothing else of the stacks is read or written. With `write_kv=False` a request's
new K/V are used where they were computed and stored nowhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flowrt.compute.engine.adapter import (
    ALL_FEATURES,
    CAPTURE_HIDDEN_ALL,
    CAPTURE_HIDDEN_LAST,
    CAPTURE_LOGITS,
    EngineError,
    EngineSpec,
    StepBatch,
    StepResult,
)
from flowrt.compute.engine.kvbinding import BoundKV, StackedKVEngine
from flowrt.compute.engine.reference_model import ReferenceConfig, ReferenceModel, _torch
from flowrt.compute.engine.steps import CheckedRequest, as_index_tensor, check_batch


@dataclass
class _AttentionPlan:
    """Where each token of a step goes in the padded grid, computed once for all layers.

    Rows of the step are the new tokens of all requests, request after request (`tokens`).
    The grid is (requests, new, context): query (b, i) is new token i of request b, key (b, j)
    is token j of its context."""

    requests: int
    new: int  # the longest request's new tokens
    context: int  # the longest context
    query_cells: Any  # (tokens,) cell b*new + i of each row
    stack_cells: Any  # cells b*context + j read from the stacks ...
    stack_slots: Any  # ... at these token slots
    fresh_cells: Any  # cells of new tokens that store nothing (write_kv=False) ...
    fresh_rows: Any  # ... taken from these rows of the step
    write_rows: Any  # rows whose K/V are stored ...
    write_slots: Any  # ... at these slots
    mask: Any  # (requests, 1, new, context) bool: True where a query attends to a key
    unpadded: bool  # every cell is read from the stacks (same context lengths, nothing fresh)


def plan_attention(checked: Sequence[CheckedRequest], device: Any) -> _AttentionPlan:
    torch = _torch()
    news = [request.new_tokens for request in checked]
    contexts = [request.context_length for request in checked]
    width_new, width_context = max(news), max(contexts)
    query_cells, stack_cells, stack_slots, fresh_cells, fresh_rows, write_rows, write_slots = ([] for _ in range(7))
    row = 0
    for b, request in enumerate(checked):
        n, listed = request.new_tokens, len(request.slots)
        query_cells.append(torch.arange(n) + b * width_new)
        stack_cells.append(torch.arange(listed) + b * width_context)
        stack_slots.append(request.slots)
        rows = torch.arange(row, row + n)
        if request.write_kv:
            write_rows.append(rows)
            write_slots.append(request.slots[listed - n :])
        else:
            fresh_cells.append(torch.arange(listed, listed + n) + b * width_context)
            fresh_rows.append(rows)
        row += n
    key = torch.arange(width_context)[None, None, :]
    query = torch.arange(width_new)[None, :, None]
    context = torch.tensor(contexts)[:, None, None]
    new = torch.tensor(news)[:, None, None]
    causal = torch.tensor([request.causal for request in checked])[:, None, None]
    valid = key < context
    allowed = valid & (~causal | (key <= context - new + query))
    mask = torch.where(query < new, allowed, valid)  # padding queries see any valid key: no empty softmax row

    def joined(parts: list[Any]) -> Any:
        return (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)).to(device)

    return _AttentionPlan(
        len(checked),
        width_new,
        width_context,
        joined(query_cells),
        joined(stack_cells),
        joined(stack_slots),
        joined(fresh_cells),
        joined(fresh_rows),
        joined(write_rows),
        joined(write_slots),
        mask[:, None].to(device),
        unpadded=not fresh_rows and len(set(contexts)) == 1,
    )


class ReferenceEngine(StackedKVEngine):
    """The reference model behind the adapter contract (see the module docstring)."""

    def __init__(self, config: ReferenceConfig | None = None, **settings: Any):
        if config is not None and settings:
            raise EngineError("ReferenceEngine: give a ReferenceConfig or settings (vocab_size=..., ...), not both")
        self.config = config if config is not None else ReferenceConfig(**settings)
        self.model = ReferenceModel(self.config)
        self._spec = EngineSpec(
            name="reference",
            vocab_size=self.config.vocab_size,
            hidden_size=self.config.hidden_size,
            num_layers=self.config.num_layers,
            num_kv_heads=self.config.num_kv_heads,
            head_dim=self.config.head_dim,
            kv_dtype=self.config.kv_dtype,
            device=self.config.device,
            features=ALL_FEATURES,
        )
        self._kv: BoundKV | None = None

    def embed(self, token_ids: Sequence[int] | Any) -> Any:
        ids = as_index_tensor(token_ids, "token_ids", "embed()")
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise EngineError(f"embed(): token ids must lie in 0..{self.config.vocab_size - 1}")
        return self.model.embed(ids)

    def forward(self, batch: StepBatch) -> list[StepResult]:
        torch = _torch()
        kv = self._kv
        checked = check_batch(batch, self._spec, None if kv is None else kv.slot_count)
        assert kv is not None
        model, config, device = self.model, self.config, self.model.device
        with torch.no_grad():
            x = torch.cat(
                [
                    model.embed(request.token_ids)
                    if request.token_ids is not None
                    else request.embeddings.to(device, torch.float32)
                    for request in checked
                ]
            )
            cos, sin = model.rope_tables(torch.cat([request.positions for request in checked]))
            plan = plan_attention(checked, device)
            for layer in range(config.num_layers):
                q, k, v = model.qkv(layer, x, cos, sin)
                attention = self._attend(plan, q, k, v, kv.keys[layer], kv.values[layer])
                x = model.finish_layer(layer, x, attention)
            hidden = model.final_hidden(x)
            return self._results(checked, hidden)

    def _attend(self, plan: _AttentionPlan, q: Any, k: Any, v: Any, key_slots: Any, value_slots: Any) -> Any:
        """Store the new K/V, gather every request's context, attend: (tokens, heads, d)."""
        if len(plan.write_rows):
            key_slots.index_copy_(0, plan.write_slots, k.index_select(0, plan.write_rows).to(key_slots.dtype))
            value_slots.index_copy_(0, plan.write_slots, v.index_select(0, plan.write_rows).to(value_slots.dtype))
        c = self.config
        return gather_and_attend(plan, q, k, v, key_slots, value_slots, c.num_heads, c.num_kv_heads, c.head_dim)

    def _results(self, checked: list[CheckedRequest], hidden: Any) -> list[StepResult]:
        torch = _torch()
        ends = torch.tensor([request.new_tokens for request in checked]).cumsum(0)
        wants_logits = [i for i, request in enumerate(checked) if CAPTURE_LOGITS in request.capture]
        logits = {}
        if wants_logits:
            rows = (ends[wants_logits] - 1).to(hidden.device)
            logits = dict(zip(wants_logits, self.model.logits(hidden.index_select(0, rows)), strict=True))
        results = []
        for i, request in enumerate(checked):
            end = int(ends[i])
            start = end - request.new_tokens
            results.append(
                StepResult(
                    logits=logits.get(i),
                    hidden_last=hidden[end - 1].clone() if CAPTURE_HIDDEN_LAST in request.capture else None,
                    hidden_all=hidden[start:end].clone() if CAPTURE_HIDDEN_ALL in request.capture else None,
                )
            )
        return results


def gather_and_attend(
    plan: _AttentionPlan, q: Any, k: Any, v: Any, key_slots: Any, value_slots: Any, heads: int, kv_heads: int, head_dim: int
) -> Any:
    """Every request's context gathered from the stacks by its listed slots, with its fresh K/V
    where the plan places them (tokens that store nothing), then attention under the plan's
    mask: (tokens, heads, head_dim). Writes nothing; the reference engine and the DiT share it."""
    torch = _torch()
    cells = plan.requests * plan.context
    grids = []
    for slots, fresh in ((key_slots, k), (value_slots, v)):
        if plan.unpadded:  # the cells are the listed slots in order
            grid = slots.index_select(0, plan.stack_slots).to(fresh.dtype)
        else:
            grid = torch.zeros(cells, kv_heads, head_dim, dtype=fresh.dtype, device=fresh.device)
            if len(plan.stack_slots):
                grid.index_copy_(0, plan.stack_cells, slots.index_select(0, plan.stack_slots).to(fresh.dtype))
            if len(plan.fresh_rows):
                grid.index_copy_(0, plan.fresh_cells, fresh.index_select(0, plan.fresh_rows))
        grids.append(grid.view(plan.requests, plan.context, kv_heads, head_dim).transpose(1, 2))
    queries = torch.zeros(plan.requests * plan.new, heads, head_dim, dtype=q.dtype, device=q.device)
    queries.index_copy_(0, plan.query_cells, q)
    out = torch.nn.functional.scaled_dot_product_attention(
        queries.view(plan.requests, plan.new, heads, head_dim).transpose(1, 2),
        grids[0],
        grids[1],
        attn_mask=plan.mask,
        scale=1.0 / math.sqrt(head_dim),
        enable_gqa=True,
    )
    return out.transpose(1, 2).reshape(-1, heads, head_dim).index_select(0, plan.query_cells)
