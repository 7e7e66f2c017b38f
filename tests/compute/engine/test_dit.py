"""The DiT on the LLM path (flowrt.compute.engine.dit): its paged forward over the LLM's cached
text K/V equals its dense forward given the same K/V, whatever the page size and slot order, and
batched or alone; it writes no K/V (NaN canaries everywhere else survive); sampling is
deterministic; the latent depends on the cached text; mismatched shapes and bad steps are refused."""

from __future__ import annotations

import asyncio
import random

import pytest

torch = pytest.importorskip("torch", reason="the engines run on torch (the torch extra)")

from flowrt.compute.engine import ReferenceEngine, StepBatch, StepRequest, kv_stacks, token_slots  # noqa: E402
from flowrt.compute.engine.adapter import EngineError  # noqa: E402
from flowrt.compute.engine.dit import DenoiseRequest, DitConfig, DitEngine, DitSampler  # noqa: E402
from flowrt.params.tiers import DeviceTier  # noqa: E402
from tests.compute.engine.support import same_bits  # noqa: E402

LLM = ReferenceEngine()  # the default reference LLM: 2 layers, 2 K/V heads of 16


def bound_pair(page_tokens: int, pages: int = 48, fill: float | None = float("nan")):
    """A fresh LLM and DiT bound to one tier's stacks (NaN-filled: a canary in every slot)."""
    llm = ReferenceEngine()
    dit = DitEngine(DitConfig.matching(llm.describe()))
    tier = DeviceTier(llm.describe().kv_layout("kv", page_tokens), pages, "cpu")
    if fill is not None:
        for stack in tier.stacks:
            stack.fill_(fill)
    llm.bind_kv(kv_stacks(tier))
    dit.bind_kv(kv_stacks(tier))
    return llm, dit, tier


def scattered_text(tier, page_tokens: int, length: int, seed: int):
    """Random text K/V written into a random permutation of pages (and random rows order inside
    them): returns the slots in context order and the K/V per layer in that order."""
    rng = random.Random(seed)
    pages = rng.sample(range(tier.stacks[0].shape[0]), (length + page_tokens - 1) // page_tokens)
    slots = token_slots(pages, page_tokens, length)
    rng.shuffle(slots)  # single token slots in any order: the context order is the list's
    generator = torch.Generator().manual_seed(seed)
    keys, values = [], []
    for layer in range(len(tier.stacks) // 2):
        k = torch.randn(length, *tier.stacks[0].shape[2:], generator=generator)
        v = torch.randn(length, *tier.stacks[0].shape[2:], generator=generator)
        for stack, data in ((tier.stacks[2 * layer], k), (tier.stacks[2 * layer + 1], v)):
            stack.view(-1, *stack.shape[2:])[torch.tensor(slots)] = data
        keys.append(k)
        values.append(v)
    return slots, keys, values


def request_for(dit, latent, t, hidden, slots):
    model = dit.model
    return DenoiseRequest(embeddings=model.patchify(latent), slots=slots, condition=model.condition(t, hidden))


@pytest.mark.parametrize("page_tokens", [1, 4, 16])
def test_paged_forward_equals_dense_forward_whatever_the_page_size_and_slot_order(page_tokens):
    _, dit, tier = bound_pair(page_tokens)
    slots, keys, values = scattered_text(tier, page_tokens, 11, seed=page_tokens)
    latent = torch.randn(4, 8, 6, generator=torch.Generator().manual_seed(1))
    hidden = torch.randn(64, generator=torch.Generator().manual_seed(2))
    before = [stack.clone() for stack in tier.stacks]
    request = request_for(dit, latent, 0.7, hidden, slots)
    (paged,) = dit.forward(StepBatch([request]))
    dense = dit.model.dense_forward(request.embeddings, request.condition, keys, values)
    assert torch.allclose(paged.hidden_all, dense, rtol=1e-4, atol=1e-4)
    assert torch.isfinite(paged.hidden_all).all()
    for old, new in zip(before, tier.stacks, strict=True):  # wrote nothing: every canary survives
        assert same_bits(old, new).all()


def test_a_batch_of_denoise_requests_equals_each_alone():
    _, dit, tier = bound_pair(4)
    first, _, _ = scattered_text(tier, 4, 7, seed=1)
    used = set(first)
    generator = torch.Generator().manual_seed(3)
    second = [slot for slot in range(tier.stacks[0].shape[0] * 4) if slot not in used][:13]
    for stack in tier.stacks:  # give the second context finite K/V too
        stack.view(-1, *stack.shape[2:])[torch.tensor(second)] = torch.randn(13, *stack.shape[2:], generator=generator)
    requests = [
        request_for(dit, torch.randn(4, 4, 4, generator=generator), 0.3, torch.randn(64, generator=generator), first),
        request_for(dit, torch.randn(4, 8, 8, generator=generator), 0.9, torch.randn(64, generator=generator), second),
        request_for(dit, torch.randn(4, 2, 2, generator=generator), 0.5, torch.randn(64, generator=generator), []),
    ]
    together = dit.forward(StepBatch(requests))
    for request, result in zip(requests, together, strict=True):
        (alone,) = dit.forward(StepBatch([request]))
        assert torch.allclose(result.hidden_all, alone.hidden_all, rtol=1e-4, atol=1e-4)


def llm_context(llm, tier, tokens, page_tokens: int, first_page: int):
    """Prefill `tokens` with the LLM into pages first_page..: their slots and final hidden state."""
    pages = list(range(first_page, first_page + (len(tokens) + page_tokens - 1) // page_tokens))
    slots = token_slots(pages, page_tokens, len(tokens))
    (result,) = llm.forward(StepBatch([StepRequest(token_ids=tokens, slots=slots, capture=frozenset({"hidden_last"}))]))
    return slots, result.hidden_last


def test_sampling_is_deterministic_and_depends_on_the_cached_text():
    llm, dit, tier = bound_pair(4, fill=0.0)
    slots_a, hidden_a = llm_context(llm, tier, [5, 9, 33, 2, 71, 8], 4, first_page=0)
    slots_b, _ = llm_context(llm, tier, [5, 9, 33, 2, 71, 200], 4, first_page=10)
    sampler = DitSampler(dit)

    def sample(slots, hidden, seed=0):
        return asyncio.run(sampler.sample(slots, hidden, size=(8, 8), steps=3, seed=seed))

    a = sample(slots_a, hidden_a)
    assert a.shape == (4, 8, 8) and torch.isfinite(a).all()
    assert torch.equal(a, sample(slots_a, hidden_a))  # run after run
    other = DitSampler(DitEngine(DitConfig.matching(llm.describe())))
    other.engine.bind_kv(kv_stacks(tier))
    assert torch.equal(a, asyncio.run(other.sample(slots_a, hidden_a, size=(8, 8), steps=3)))  # engine after engine
    # the same conditioning vector, only the cached text K/V differ (its last token): another latent
    assert (a - sample(slots_b, hidden_a)).abs().max() > 1e-3
    assert (a - sample([], hidden_a)).abs().max() > 1e-3
    assert (a - sample(slots_a, hidden_a, seed=1)).abs().max() > 1e-3


def test_an_image_condition_changes_the_latent_and_sets_its_size():
    llm, dit, tier = bound_pair(4, fill=0.0)
    slots, hidden = llm_context(llm, tier, [1, 2, 3, 4, 5], 4, first_page=0)
    sampler = DitSampler(dit)
    condition = torch.randn(4, 6, 4, generator=torch.Generator().manual_seed(5))
    edited = asyncio.run(sampler.sample(slots, hidden, steps=2, image_condition=condition))
    assert edited.shape == (4, 6, 4)
    plain = asyncio.run(sampler.sample(slots, hidden, size=(6, 4), steps=2))
    assert (edited - plain).abs().max() > 1e-3


def test_the_dit_must_read_the_llms_kv_shape():
    spec = LLM.describe()
    dit = DitEngine(DitConfig.matching(spec, hidden_size=32))
    dit.check_llm(spec)
    assert dit.describe().global_settings(16) == spec.global_settings(16)
    wrong = DitEngine(DitConfig(num_layers=3))
    with pytest.raises(EngineError, match=r"num_layers 3 \(the LLM has 2\).*DitConfig.matching"):
        wrong.check_llm(spec)
    with pytest.raises(EngineError, match="must be the LLM's"):
        DitConfig.matching(spec, head_dim=8)
    tier = DeviceTier(spec.kv_layout("kv", 4), 8, "cpu")
    with pytest.raises(EngineError, match="layers"):
        wrong.bind_kv(kv_stacks(tier))


def test_bad_denoise_steps_are_refused_before_anything_runs():
    _, dit, tier = bound_pair(4, fill=0.0)
    tokens = dit.model.patchify(torch.zeros(4, 4, 4))
    condition = dit.model.condition(0.5, torch.zeros(64))
    with pytest.raises(EngineError, match="DenoiseRequest"):
        dit.forward(StepBatch([StepRequest(embeddings=tokens, slots=[], causal=False, write_kv=False)]))
    with pytest.raises(EngineError, match="stores nothing"):
        dit.forward(StepBatch([DenoiseRequest(embeddings=tokens, slots=list(range(4)), condition=condition, write_kv=True)]))
    with pytest.raises(EngineError, match="hidden states only"):
        dit.forward(StepBatch([DenoiseRequest(embeddings=tokens, condition=condition, capture=frozenset({"logits"}))]))
    with pytest.raises(EngineError, match="multiples of patch_size"):
        dit.model.patchify(torch.zeros(4, 3, 4))
    with pytest.raises(EngineError, match="one LLM hidden state"):
        dit.model.condition(0.5, torch.zeros(32))
    with pytest.raises(EngineError, match="no token ids"):
        dit.embed([1])
