"""Paged generation on a real KVPool / KVSession (flowrt.compute.engine.driver): turn 2 of a
session computes only what turn 1 did not leave in full pages, counted, and gives exactly the
tokens a run without any cache gives; still so after the pages were evicted (recomputed, or
promoted back from the host tier); chunked prefill, concurrent sessions through the batcher,
seeded sampling, precomputed page keys under a chain root, stop tokens."""

from __future__ import annotations

import asyncio
import random

import pytest

torch = pytest.importorskip("torch", reason="the engines run on torch (the torch extra)")

from flowrt.compute.engine import (  # noqa: E402
    ContinuousBatcher,
    EngineError,
    PagedGenerator,
    SamplingParams,
    StepBatch,
    StepRequest,
    token_slots,
)
from flowrt.compute.hashing import chain_root, page_hashes  # noqa: E402
from flowrt.params.meta import EmbeddedStore  # noqa: E402
from flowrt.params.pool import KVPool  # noqa: E402
from flowrt.params.session import KVSession  # noqa: E402
from tests.compute.engine.support import assert_close, expected  # noqa: E402

SIZE = 4  # tokens per page
NEW = 9  # tokens generated per turn


@pytest.fixture
def pools():
    made = []

    def make(engine, device=64, host=0, node="n1"):
        pool = KVPool(
            engine.describe().kv_layout("kv", SIZE),
            device_pages=device,
            host_pages=host,
            store=EmbeddedStore("t"),
            deployment="t",
            node=node,
            device=engine.describe().device,
        )
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.close()


async def generate(generator, pool, session, tokens, owner, **options):
    async with KVSession(pool, session, owner, page_hashes) as kv:
        return await generator.generate(kv, tokens, **options)


def without_cache(engine_case, tokens: list[int], count: int = NEW, sampling: SamplingParams | None = None) -> list[int]:
    """The tokens a fresh engine gives after `tokens`, on a fresh pool, with nothing to reuse."""
    engine = engine_case.make()
    spec = engine.describe()
    pool = KVPool(
        spec.kv_layout("kv", SIZE), device_pages=64, store=EmbeddedStore("x"), deployment="x", node="x", device=spec.device
    )
    try:
        result = asyncio.run(
            generate(
                PagedGenerator(engine), pool, "cold", tokens, "cold", max_new_tokens=count, sampling=sampling or SamplingParams()
            )
        )
    finally:
        pool.close()
    assert result.reused_tokens == 0
    return result.tokens


def history(engine, length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(engine.describe().vocab_size) for _ in range(length)]


def test_turn_two_computes_only_the_new_tokens_and_gives_the_same_tokens(engine_case, pools):
    engine = engine_case.make()
    pool = pools(engine)
    generator = PagedGenerator(engine)
    turn1 = history(engine, 30, 1)
    first = asyncio.run(generate(generator, pool, "s", turn1, "call-1", max_new_tokens=NEW))
    # 30 + 8 tokens have K/V (the last generated never ran): 9 full pages, 7 of the history
    assert (first.prompt_tokens, first.reused_tokens, first.computed_tokens, first.committed_pages) == (30, 0, 30, 9)
    assert first.tokens == without_cache(engine_case, turn1)

    turn2 = turn1 + first.tokens + history(engine, 5, 2)  # the reply, then the user's next message
    second = asyncio.run(generate(generator, pool, "s", turn2, "call-2", max_new_tokens=NEW))
    assert second.reused_tokens == 9 * SIZE
    assert second.computed_tokens == len(turn2) - 9 * SIZE == 8  # the last page's 2 tokens, the last reply token, 5 new
    assert second.tokens == without_cache(engine_case, turn2)
    assert second.first_token_seconds is not None and second.steps == NEW


def test_evicted_pages_are_recomputed_and_the_tokens_stay_the_same(engine_case, pools):
    engine = engine_case.make()
    pool = pools(engine, device=16)  # L1 only: an evicted page is gone
    generator = PagedGenerator(engine)
    turn1 = history(engine, 26, 3)
    first = asyncio.run(generate(generator, pool, "s", turn1, "call-1", max_new_tokens=NEW))
    asyncio.run(generate(generator, pool, "other", history(engine, 50, 4), "call-x", max_new_tokens=2))  # needs every slot
    turn2 = turn1 + first.tokens + history(engine, 3, 5)
    second = asyncio.run(generate(generator, pool, "s", turn2, "call-2", max_new_tokens=NEW))
    assert second.reused_tokens == 0 and second.computed_tokens == len(turn2)
    assert second.tokens == without_cache(engine_case, turn2)


def test_pages_evicted_to_the_host_tier_come_back_and_the_tokens_stay_the_same(engine_case, pools):
    engine = engine_case.make()
    pool = pools(engine, device=16, host=64)
    generator = PagedGenerator(engine)
    turn1 = history(engine, 26, 3)
    first = asyncio.run(generate(generator, pool, "s", turn1, "call-1", max_new_tokens=NEW))
    asyncio.run(generate(generator, pool, "other", history(engine, 50, 4), "call-x", max_new_tokens=2))
    promoted = pool.counters.promoted_pages
    turn2 = turn1 + first.tokens + history(engine, 3, 5)
    second = asyncio.run(generate(generator, pool, "s", turn2, "call-2", max_new_tokens=NEW))
    assert second.reused_tokens == 8 * SIZE and pool.counters.promoted_pages > promoted
    assert second.tokens == without_cache(engine_case, turn2)


def test_a_history_whose_every_page_is_cached_recomputes_its_last_page_for_logits(engine_case, pools):
    engine = engine_case.make()
    pool = pools(engine)
    generator = PagedGenerator(engine)
    tokens = history(engine, 24, 6)
    asyncio.run(generate(generator, pool, "s", tokens, "call-1", max_new_tokens=0))
    again = asyncio.run(generate(generator, pool, "s", tokens, "call-2", max_new_tokens=NEW))
    assert (again.reused_tokens, again.computed_tokens) == (20, 4)
    assert again.tokens == without_cache(engine_case, tokens)


def test_chunked_prefill_gives_the_same_tokens(engine_case, pools):
    engine = engine_case.make()
    tokens = history(engine, 37, 7)
    result = asyncio.run(generate(PagedGenerator(engine, prefill_chunk=5), pools(engine), "s", tokens, "c", max_new_tokens=NEW))
    assert result.steps == 8 + NEW - 1  # ceil(37 / 5) prefill steps, then one step per further token
    assert result.tokens == without_cache(engine_case, tokens)


def test_concurrent_sessions_share_forwards_through_the_batcher(engine_case, pools):
    engine = engine_case.make()
    pool = pools(engine, device=128)
    batcher = ContinuousBatcher(engine)
    generator = PagedGenerator(engine, batcher=batcher)
    texts = [history(engine, 10 + 7 * i, 20 + i) for i in range(5)]
    sampling = [SamplingParams(temperature=0.8, top_p=0.9, seed=i) if i % 2 else SamplingParams() for i in range(5)]

    async def together():
        return await asyncio.gather(
            *(
                generate(generator, pool, f"s{i}", text, f"c{i}", max_new_tokens=NEW, sampling=sampling[i])
                for i, text in enumerate(texts)
            )
        )

    results = asyncio.run(together())
    assert batcher.stats.forwards < 5 * NEW
    for i, text in enumerate(texts):
        assert results[i].tokens == without_cache(engine_case, text, sampling=sampling[i])


def test_precomputed_keys_under_a_chain_root_are_reused(engine_case, pools):
    engine = engine_case.make()
    pool = pools(engine)
    generator = PagedGenerator(engine)
    root = chain_root("tenant-a")
    turn1 = history(engine, 21, 8)
    keys = page_hashes(turn1, SIZE, parent=root)
    first = asyncio.run(generate(generator, pool, "s", turn1, "c1", max_new_tokens=NEW, keys=keys, parent=root))
    turn2 = turn1 + first.tokens + [1, 2]
    keys = page_hashes(turn2, SIZE, parent=root)
    second = asyncio.run(generate(generator, pool, "s", turn2, "c2", max_new_tokens=NEW, keys=keys, parent=root))
    assert second.reused_tokens == (21 + NEW - 1) // SIZE * SIZE  # the generated pages were keyed under the root too
    # under the default root the keys differ: nothing to reuse
    plain = asyncio.run(generate(generator, pool, "t", turn2, "c3", max_new_tokens=NEW))
    assert plain.reused_tokens == 0 and plain.tokens == second.tokens


def test_a_stop_token_ends_the_generation(engine_case, pools):
    engine = engine_case.make()
    tokens = history(engine, 12, 9)
    expected = without_cache(engine_case, tokens)
    stop = expected[3]
    result = asyncio.run(generate(PagedGenerator(engine), pools(engine), "s", tokens, "c", stop={stop}))
    assert result.tokens == expected[: expected.index(stop) + 1]


def test_the_committed_pages_of_generated_tokens_hold_their_kv(engine_case, pools):
    engine = engine_case.make()
    pool = pools(engine)
    tokens = history(engine, 10, 10)
    result = asyncio.run(generate(PagedGenerator(engine), pool, "s", tokens, "c", max_new_tokens=NEW))
    sequence = (tokens + result.tokens)[: (10 + NEW - 1) // SIZE * SIZE]  # the full pages that have K/V

    async def probe():
        async with KVSession(pool, "s", "probe", page_hashes) as kv:
            hit = await kv.match(page_hashes(sequence, SIZE))
            (spare,) = kv.allocate(["probe-page"])
            step = StepRequest(token_ids=[3], slots=[*token_slots(hit.slots, SIZE), spare * SIZE])
            return hit.pages, engine.forward(StepBatch([step]))[0].logits

    pages, logits = asyncio.run(probe())
    assert pages == len(sequence) // SIZE
    assert_close(engine, logits, expected(engine, engine_case.make, [*sequence, 3]).logits, "logits over the committed pages")


def test_bad_calls_are_refused(engine_case, pools):
    engine = engine_case.make()
    generator = PagedGenerator(engine)
    pool = pools(engine)
    with pytest.raises(EngineError, match="2 page keys for 3 full pages"):
        asyncio.run(generate(generator, pool, "s", list(range(12)), "c", keys=["a", "b"]))
    with pytest.raises(EngineError, match="at least one token of history"):
        asyncio.run(generate(generator, pool, "s", [], "c"))
    with pytest.raises(EngineError, match="max_new_tokens is a whole number"):
        asyncio.run(generate(generator, pool, "s", [1], "c", max_new_tokens=-1))
    with pytest.raises(EngineError, match="make one PagedGenerator"):
        asyncio.run(generate(generator, pools(engine, node="n2"), "s", [1, 2], "c"))
    with pytest.raises(EngineError, match="the batcher drives another engine"):
        PagedGenerator(engine, batcher=ContinuousBatcher(engine_case.make()))
