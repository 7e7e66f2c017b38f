"""A start-up self-test any engine can run against the adapter contract in a second or less, on
its own device: the SGLang adapter runs it when it starts (a mismatched SGLang, or a ModelRunner
that does not honour framework-owned slots, fails here with a clear message instead of serving
wrong tokens); it runs on the reference engine on any CPU.

`self_test(engine)` binds fresh, small block stacks filled with NaN canaries and checks:

1. a prefill writes K/V into exactly its new tokens' slots (every one of them, no other: slot 0,
   SGLang's padding slot, holds a canary too), and no canary reaches its logits;
2. the same tokens prefilled in three steps on other, reordered pages give the same last-token
   logits and the same K/V as the one-step prefill (prefix reads through the listed slots);
3. a decode step after each writes only its new slot, and both give the same logits;
4. with the `embeddings` feature, the decode given as the token's embedding gives the same
   logits as given as its id (SGLang runs one as a decode batch, the other as an extend batch);
5. both decodes in one batch give what each gave alone.

It raises `SelfTestError` naming the failed check and what was seen. It must not import any
engine's framework (SGLang included): only the adapter contract, kvbinding, flowrt.params' tiers
and torch (when it runs).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from flowrt.compute.engine.adapter import (
    CAPTURE_LOGITS,
    FEATURE_EMBEDDINGS,
    EngineAdapter,
    EngineError,
    StepBatch,
    StepRequest,
    token_slots,
)
from flowrt.compute.engine.kvbinding import kv_stacks

# (rtol, atol) by KV dtype: K/V rounded to a narrow dtype move logits by about its precision
TOLERANCE = {"float32": (1e-4, 1e-4), "float16": (5e-3, 5e-3), "bfloat16": (2e-2, 2e-2)}


class SelfTestError(EngineError):
    """An engine failed its start-up self-test."""


@dataclass
class SelfTestReport:
    """What passed: the checks run, in order, and the largest logit difference seen."""

    checks: list[str] = field(default_factory=list)
    largest_difference: float = 0.0


def _torch() -> Any:
    import torch

    return torch


def self_test(engine: EngineAdapter, *, what: str | None = None, page_tokens: int = 4, seed: int = 0) -> SelfTestReport:
    """Run the checks of the module docstring on `engine` (it ends bound to the test's stacks:
    bind it to the pool's afterwards, or use a fresh engine). Raises SelfTestError."""
    torch = _torch()
    from flowrt.params.tiers import DeviceTier

    spec = engine.describe()
    name = what or f"engine `{spec.name}`"
    rtol, atol = getattr(engine, "conformance_tolerance", None) or TOLERANCE.get(spec.kv_dtype, (5e-2, 5e-2))
    report = SelfTestReport()
    pages = 16
    tier = DeviceTier(spec.kv_layout("kv", page_tokens), pages, spec.device)
    for stack in tier.stacks:
        stack.fill_(float("nan"))
    engine.bind_kv(kv_stacks(tier))
    slot_count = pages * page_tokens
    rng = random.Random(seed)
    length = 2 * page_tokens + page_tokens // 2 + 1  # two whole pages and part of a third
    tokens = [rng.randrange(spec.vocab_size) for _ in range(length)]

    def fail(check: str, detail: str) -> SelfTestError:
        return SelfTestError(f"{name} failed its start-up self-test: {check}: {detail}")

    def snapshot() -> list[Any]:
        return [stack.clone() for stack in tier.stacks]

    def changed(before: list[Any]) -> set[int]:
        moved = torch.zeros(slot_count, dtype=torch.bool)
        for old, stack in zip(before, tier.stacks, strict=True):
            same = (old == stack) | (torch.isnan(old) & torch.isnan(stack))
            moved |= ~same.view(slot_count, -1).all(dim=1).cpu()
        return set(torch.nonzero(moved).flatten().tolist())

    def run(*requests: StepRequest) -> list[Any]:
        try:
            results = engine.forward(StepBatch(list(requests)))
        except EngineError:
            raise
        except Exception as error:  # the framework underneath failed: say where
            raise fail("a forward step raised", f"{type(error).__name__}: {error}") from error
        for result in results:
            if result.logits is None or tuple(result.logits.shape) != (spec.vocab_size,):
                got = None if result.logits is None else tuple(result.logits.shape)
                raise fail("logits", f"a step gave logits of shape {got}, not ({spec.vocab_size},)")
            if not bool(torch.isfinite(result.logits).all()):
                raise fail("canaries", "NaN or inf reached the logits: the engine read a slot the step did not list")
        return results

    def close(a: Any, b: Any, check: str) -> None:
        a, b = a.detach().float().cpu(), b.detach().float().cpu()
        difference = float((a - b).abs().max()) if a.numel() else 0.0
        report.largest_difference = max(report.largest_difference, difference)
        if not torch.allclose(a, b, rtol=rtol, atol=atol):
            raise fail(check, f"differs by up to {difference:.3g} (tolerance rtol={rtol}, atol={atol})")

    # 1. one step on pages 3, 1, 6 (slot 0 stays a canary)
    first = token_slots([3, 1, 6], page_tokens, length)
    before = snapshot()
    (one,) = run(StepRequest(token_ids=tokens, slots=first, capture=frozenset({CAPTURE_LOGITS})))
    written = changed(before)
    if written != set(first):
        stray, missing = sorted(written - set(first)), sorted(set(first) - written)
        seen = ([f"K/V changed in slots outside the new tokens' {stray[:8]}"] if stray else []) + (
            [f"new tokens' slots left unwritten {missing[:8]}"] if missing else []
        )
        raise fail("writes only into the given slots", "; ".join(seen))
    report.checks.append("a prefill writes K/V into exactly its new tokens' slots")

    # 2. the same tokens in three steps on other pages, in another order
    second = token_slots([9, 12, 4], page_tokens, length)
    cuts = sorted({0, max(1, page_tokens - 1), length - 2, length})  # a partial page, then across pages
    for begin, end in zip(cuts, cuts[1:], strict=False):
        (split,) = run(StepRequest(token_ids=tokens[begin:end], slots=second[:end], capture=frozenset({CAPTURE_LOGITS})))
    close(split.logits, one.logits, "a prefill split into steps gives the one-step prefill's logits")
    for stack in tier.stacks:
        flat = stack.view(slot_count, -1)
        index = torch.tensor(first, device=flat.device), torch.tensor(second, device=flat.device)
        close(flat[index[1]], flat[index[0]], "a split prefill stores the one-step prefill's K/V")
    report.checks.append("a prefill split into steps equals the prefill in one step")

    # 3. a decode after each
    token = int(torch.argmax(one.logits.float()))
    free = [slot for slot in range(1, slot_count) if slot not in set(first) | set(second)]
    new_a, new_b, new_c, new_d = free[0], free[-1], free[1], free[-2]
    before = snapshot()
    (decode_a,) = run(StepRequest(token_ids=[token], slots=[*first, new_a], capture=frozenset({CAPTURE_LOGITS})))
    (decode_b,) = run(StepRequest(token_ids=[token], slots=[*second, new_b], capture=frozenset({CAPTURE_LOGITS})))
    if changed(before) != {new_a, new_b}:
        raise fail("decode writes only its new slot", f"slots {sorted(changed(before) - {new_a, new_b})[:8]} changed too")
    close(decode_b.logits, decode_a.logits, "decodes over two copies of one context agree")
    report.checks.append("a decode step writes only its new slot and reads its context")

    # 4. the decode given as an embedding
    if FEATURE_EMBEDDINGS in spec.features:
        embedding = engine.embed([token])
        (as_rows,) = run(StepRequest(embeddings=embedding, slots=[*first, new_c], capture=frozenset({CAPTURE_LOGITS})))
        close(as_rows.logits, decode_a.logits, "a decode given as an embedding equals the decode given as an id")
        report.checks.append("a decode given as an embedding equals the decode given as an id")

    # 5. both decodes in one batch
    batched = run(
        StepRequest(token_ids=[token], slots=[*first, new_d], capture=frozenset({CAPTURE_LOGITS})),
        StepRequest(token_ids=[token], slots=[*second, free[2]], capture=frozenset({CAPTURE_LOGITS})),
    )
    close(batched[0].logits, decode_a.logits, "a batch of two decodes equals each alone")
    close(batched[1].logits, decode_b.logits, "a batch of two decodes equals each alone")
    report.checks.append("a batch of decodes equals each alone")

    for stack in tier.stacks:  # slot 0 (SGLang's padding slot) was never listed: still a canary
        if not bool(torch.isnan(stack.view(slot_count, -1)[0]).all()):
            raise fail("canaries", "slot 0 was written though no step listed it (a padding write?)")
    report.checks.append("slot 0 and every unlisted slot keep their canaries")
    return report
