"""What the engine suite needs besides the engines (engines.py): fresh block stacks an engine is
bound to (`Harness`), and what a step must give (`expected`, `check_result`).

The expected outputs of a sequence come from the engine's dense forward when it has one (the
reference engine's `model.dense_forward`); for another engine, from the same engine run the plain
way (a fresh engine and stacks, pages of 16 tokens, consecutive slots, one step), so the suite then
checks that paging, slot order, batching and reuse change nothing. Tolerances follow the KV dtype;
an engine may set `conformance_tolerance = (rtol, atol)` to say its own, and `--engine-tolerance`
overrides both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flowrt.compute.engine import (
    CAPTURE_HIDDEN_ALL,
    CAPTURE_LOGITS,
    EngineAdapter,
    StepBatch,
    StepRequest,
    StepResult,
    kv_stacks,
    token_slots,
)
from flowrt.compute.engine.adapter import FEATURE_HIDDEN
from flowrt.params.tiers import DeviceTier
from tests.compute.engine.engines import tolerance_override

KV_TOLERANCE = {"float32": (1e-4, 1e-4), "float16": (5e-3, 5e-3), "bfloat16": (2e-2, 2e-2)}  # (rtol, atol)

# ── stacks and steps ──


class Harness:
    """One engine bound to fresh block stacks of `pages` pages of `page_tokens` tokens."""

    def __init__(self, engine: EngineAdapter, page_tokens: int = 4, pages: int = 64, fill: float | None = None):
        self.engine = engine
        self.spec = engine.describe()
        self.layout = self.spec.kv_layout("kv", page_tokens)
        self.tier = DeviceTier(self.layout, pages, self.spec.device)
        if fill is not None:
            for stack in self.tier.stacks:
                stack.fill_(fill)
        engine.bind_kv(kv_stacks(self.tier))
        self.page_tokens = page_tokens
        self.pages = pages

    @property
    def slot_count(self) -> int:
        return self.page_tokens * self.pages

    def slots(self, pages: Sequence[int], count: int) -> list[int]:
        return token_slots(pages, self.page_tokens, count)

    def run(self, *requests: StepRequest) -> list[StepResult]:
        return self.engine.forward(StepBatch(list(requests)))

    def snapshot(self) -> list[torch.Tensor]:
        return [stack.clone() for stack in self.tier.stacks]


def capture(spec: Any) -> frozenset[str]:
    """Last-token logits, and every new token's hidden state where the engine gives them."""
    return frozenset({CAPTURE_LOGITS, CAPTURE_HIDDEN_ALL}) if FEATURE_HIDDEN in spec.features else frozenset({CAPTURE_LOGITS})


def tolerance(engine: EngineAdapter) -> tuple[float, float]:
    """--engine-tolerance / FLOWRT_TEST_TOLERANCE, else the engine's own, else by KV dtype."""
    override = tolerance_override()
    if override is not None:
        return override
    own = getattr(engine, "conformance_tolerance", None)
    if own is not None:
        return own
    # K/V stored at a lower precision: a float32 difference of 1e-6 between two runs can round an
    # element of K to the neighbouring value, which moves logits by about that dtype's precision
    return KV_TOLERANCE.get(engine.describe().kv_dtype, (1e-1, 1e-1))


def assert_close(engine: EngineAdapter, actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    rtol, atol = tolerance(engine)
    actual, expected = actual.detach().float().cpu(), expected.detach().float().cpu()
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    difference = (actual - expected).abs().max().item() if actual.numel() else 0.0
    assert torch.allclose(actual, expected, rtol=rtol, atol=atol), f"{what}: differs by up to {difference}"


@dataclass
class Expected:
    logits: torch.Tensor  # the last token's
    hidden: torch.Tensor | None  # every token's (None where the engine gives no hidden states)


def expected(
    engine: EngineAdapter, make: Callable[[], EngineAdapter], tokens: Sequence[int], full_attention_from: int | None = None
) -> Expected:
    """What a correct engine gives for `tokens` (see the module docstring)."""
    model = getattr(engine, "model", None)
    if model is not None and hasattr(model, "dense_forward"):
        dense = model.dense_forward(list(tokens), full_attention_from=full_attention_from)
        return Expected(dense.logits[-1], dense.hidden)
    plain = Harness(make(), page_tokens=16, pages=(len(tokens) + 15) // 16 + 1)
    spec = plain.spec
    split = len(tokens) if full_attention_from is None else full_attention_from
    results = []
    if split:
        results += plain.run(StepRequest(token_ids=list(tokens[:split]), slots=list(range(split)), capture=capture(spec)))
    if split < len(tokens):
        results += plain.run(
            StepRequest(token_ids=list(tokens[split:]), slots=list(range(len(tokens))), causal=False, capture=capture(spec))
        )
    hidden = None
    if FEATURE_HIDDEN in spec.features:
        hidden = torch.cat([result.hidden_all for result in results])
    plain.engine.close()
    return Expected(results[-1].logits, hidden)


def check_result(engine: EngineAdapter, result: StepResult, want: Expected, rows: slice, what: str) -> None:
    """The step's last-token logits, and its new tokens' hidden states (rows `rows` of want)."""
    assert_close(engine, result.logits, want.logits, f"{what}: last-token logits")
    if want.hidden is not None and result.hidden_all is not None:
        assert_close(engine, result.hidden_all, want.hidden[rows], f"{what}: hidden states")


def same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal, or both NaN (a canary)."""
    return (a == b) | (torch.isnan(a) & torch.isnan(b))
