"""Continuous batching (flowrt.compute.engine.batcher) and sampling (sampling): concurrent requests
share forward steps and get what they get one at a time; greedy is deterministic; seeded sampling
is reproducible batched or alone; a bad request fails alone; a cancelled step never runs."""

from __future__ import annotations

import asyncio
import random

import pytest

torch = pytest.importorskip("torch", reason="the engines run on torch (the torch extra)")

from flowrt.compute.engine import (  # noqa: E402
    ContinuousBatcher,
    EngineError,
    SamplingParams,
    StepBatch,
    StepRequest,
    TokenSampler,
)
from tests.compute.engine.support import Harness, assert_close, same_bits  # noqa: E402

SESSIONS, STEPS = 6, 8


def prompts(spec, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(spec.vocab_size) for _ in range(rng.randrange(3, 21))] for _ in range(SESSIONS)]


async def decode(step, prompt: list[int], slots: list[int], sampler: TokenSampler) -> tuple[list[int], list[torch.Tensor]]:
    """One request: prefill its prompt, then decode one token a step, through `step`."""
    result = await step(StepRequest(token_ids=prompt, slots=slots[: len(prompt)]), sampler)
    tokens, logits = [result.token], [result.logits]
    for position in range(len(prompt), len(prompt) + STEPS - 1):
        result = await step(StepRequest(token_ids=tokens[-1:], slots=slots[: position + 1]), sampler)
        tokens.append(result.token)
        logits.append(result.logits)
    return tokens, logits


def one_at_a_time(engine):
    async def step(request, sampler):
        (result,) = engine.forward(StepBatch([request]))
        result.token = engine.sample([result.logits], [sampler])[0]
        return result

    return step


def session_slots(harness: Harness, session: int) -> list[int]:
    width = 32  # a prompt of at most 20 tokens and 8 decoded
    return list(range(session * width, (session + 1) * width))


def run_alone(engine_case, params: list[SamplingParams]):
    engine = engine_case.make()
    harness = Harness(engine, 4, pages=SESSIONS * 8)
    step = one_at_a_time(engine)
    texts = prompts(engine.describe())

    async def sequential():
        return [await decode(step, texts[i], session_slots(harness, i), TokenSampler(params[i])) for i in range(SESSIONS)]

    return asyncio.run(sequential())


def run_batched(engine_case, params: list[SamplingParams]):
    engine = engine_case.make()
    harness = Harness(engine, 4, pages=SESSIONS * 8)
    batcher = ContinuousBatcher(engine)
    texts = prompts(engine.describe())

    async def concurrent():
        return await asyncio.gather(
            *(decode(batcher.step, texts[i], session_slots(harness, i), TokenSampler(params[i])) for i in range(SESSIONS))
        )

    return asyncio.run(concurrent()), batcher


def test_concurrent_requests_share_forwards_and_get_what_they_get_alone(engine_case):
    params = [SamplingParams()] * SESSIONS
    alone = run_alone(engine_case, params)
    batched, batcher = run_batched(engine_case, params)
    assert batcher.stats.forwards < SESSIONS * STEPS
    assert batcher.stats.forwards == STEPS  # every step of every session ran in the same forward
    assert batcher.stats.largest_batch == SESSIONS and batcher.stats.steps == SESSIONS * STEPS
    engine = batcher.engine
    for (tokens_a, logits_a), (tokens_b, logits_b) in zip(alone, batched, strict=True):
        assert tokens_a == tokens_b
        for a, b in zip(logits_a, logits_b, strict=True):
            assert_close(engine, b, a, "logits batched vs alone")


def test_greedy_decoding_is_deterministic(engine_case):
    params = [SamplingParams()] * SESSIONS
    first, _ = run_batched(engine_case, params)
    second, _ = run_batched(engine_case, params)
    assert [tokens for tokens, _ in first] == [tokens for tokens, _ in second]


def test_seeded_sampling_is_reproducible_batched_or_alone(engine_case):
    params = [SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=100 + i) for i in range(SESSIONS)]
    alone = [tokens for tokens, _ in run_alone(engine_case, params)]
    batched = [tokens for tokens, _ in run_batched(engine_case, params)[0]]
    again = [tokens for tokens, _ in run_batched(engine_case, params)[0]]
    assert alone == batched == again
    greedy = [tokens for tokens, _ in run_alone(engine_case, [SamplingParams()] * SESSIONS)]
    assert alone != greedy  # the sampler did sample
    reseeded = [SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=200 + i) for i in range(SESSIONS)]
    assert [tokens for tokens, _ in run_alone(engine_case, reseeded)] != alone


def test_a_bad_request_fails_alone_and_the_others_are_served(engine_case):
    engine = engine_case.make()
    harness = Harness(engine, 4, pages=8)
    batcher = ContinuousBatcher(engine)

    async def scenario():
        good = [batcher.step(StepRequest(token_ids=[1, 2], slots=[2 * i, 2 * i + 1]), TokenSampler()) for i in range(3)]
        bad = batcher.step(StepRequest(token_ids=[1], slots=[harness.slot_count]), TokenSampler())
        return await asyncio.gather(*good, bad, return_exceptions=True)

    *served, failed = asyncio.run(scenario())
    assert isinstance(failed, EngineError) and "outside the bound KV stacks" in str(failed)
    assert all(result.token is not None for result in served)
    assert batcher.stats.split_batches == 1 and batcher.stats.steps == 3


def test_a_step_whose_caller_was_cancelled_never_runs(engine_case):
    engine = engine_case.make()
    harness = Harness(engine, 4, pages=8, fill=float("nan"))
    batcher = ContinuousBatcher(engine)

    async def scenario():
        doomed = asyncio.create_task(batcher.step(StepRequest(token_ids=[5], slots=[9])))
        kept = asyncio.create_task(batcher.step(StepRequest(token_ids=[6], slots=[10])))
        await asyncio.sleep(0)  # both submitted, the batch not run yet
        doomed.cancel()
        result = await kept
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return result

    before = harness.snapshot()
    result = asyncio.run(scenario())
    assert result.logits is not None
    changed = torch.zeros(harness.slot_count, dtype=torch.bool)
    for old, stack in zip(before, harness.tier.stacks, strict=True):
        changed |= ~same_bits(old, stack).view(harness.slot_count, -1).all(dim=1).cpu()
    assert torch.nonzero(changed).flatten().tolist() == [10]
    assert batcher.stats.dropped_steps == 1 and batcher.stats.forwards == 1


def test_a_batch_never_exceeds_its_limits(engine_case):
    engine = engine_case.make()
    Harness(engine, 4, pages=16)
    batcher = ContinuousBatcher(engine, max_requests=3, max_tokens=10)

    async def scenario():
        steps = [batcher.step(StepRequest(token_ids=[1] * 4, slots=list(range(4 * i, 4 * i + 4)))) for i in range(7)]
        return await asyncio.gather(*steps)

    assert len(asyncio.run(scenario())) == 7
    assert batcher.stats.largest_batch == 2  # 3 requests of 4 tokens would exceed 10 tokens
    assert batcher.stats.forwards == 4


def test_a_sampler_needs_the_logits():
    with pytest.raises(EngineError, match="must capture 'logits'"):
        from flowrt.compute.engine import ReferenceEngine

        batcher = ContinuousBatcher(ReferenceEngine())
        asyncio.run(batcher.step(StepRequest(token_ids=[1], slots=[0], capture=frozenset()), TokenSampler()))


# ── the sampler itself ──


def test_greedy_takes_the_first_largest_logit_and_cuts_that_keep_one_token_are_greedy():
    logits = torch.tensor([0.5, 3.0, -1.0, 3.0, 2.9])
    assert TokenSampler()(logits) == 1
    assert TokenSampler(SamplingParams(temperature=1.0, top_k=1, seed=1))(logits) == 1
    assert TokenSampler(SamplingParams(temperature=1.0, top_p=1e-6, seed=1))(logits) == 1


def test_sampling_follows_the_distribution_within_the_cuts():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    sampler = TokenSampler(SamplingParams(temperature=1.0, top_k=3, top_p=0.79, seed=0))  # keeps tokens 0 and 1
    draws = [sampler(logits) for _ in range(4000)]
    assert set(draws) == {0, 1}
    assert abs(draws.count(0) / len(draws) - 0.5 / 0.8) < 0.03


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"temperature": -1}, "temperature must be a finite number >= 0"),
        ({"top_k": -2}, "top_k must be a whole number >= 0"),
        ({"top_p": 0}, r"top_p must lie in \(0, 1\]"),
        ({"seed": "x"}, "seed must be a whole number"),
    ],
)
def test_bad_sampling_settings_are_refused(settings, match):
    with pytest.raises(EngineError, match=match):
        SamplingParams(**settings)


@pytest.mark.parametrize("split", [0, 1, 5, 17])
def test_a_stream_resumed_elsewhere_after_skipping_its_draws_samples_the_same_tokens(split):
    generator = torch.Generator().manual_seed(3)
    steps = [torch.randn(64, generator=generator) for _ in range(17)]
    params = SamplingParams(temperature=0.8, top_p=0.9)  # no seed: the sampler draws one and says which
    whole = TokenSampler(params)
    tokens = [whole(logits) for logits in steps]
    assert whole.draws == len(steps) and whole.seed is not None
    first = TokenSampler(SamplingParams(temperature=0.8, top_p=0.9, seed=whole.seed))
    head = [first(logits) for logits in steps[:split]]
    rest = TokenSampler(SamplingParams(temperature=0.8, top_p=0.9, seed=whole.seed)).skip(first.draws)
    assert head + [rest(logits) for logits in steps[split:]] == tokens
    assert TokenSampler().skip(3).draws == 0  # greedy has no stream
    with pytest.raises(EngineError, match="draws to skip"):
        TokenSampler(params).skip(-1)


def test_extreme_but_valid_settings_sample_sanely():
    logits = torch.tensor([0.5, 3.0, -1.0, 2.9, 1.0])
    for temperature in (1e-20, 1e-40, 1e-300):  # overflowed to inf and NaN once: the last-ranked token came out
        assert TokenSampler(SamplingParams(temperature=temperature, seed=1))(logits) == 1  # as greedy
    for top_p in (1e-30, 1e-300):  # rounded to 0 in float32 once: no token was kept, an IndexError
        assert TokenSampler(SamplingParams(temperature=1.0, top_p=top_p, seed=3))(logits) == 1
    with pytest.raises(EngineError, match="2\\*\\*63"):
        SamplingParams(temperature=1.0, seed=2**64)
