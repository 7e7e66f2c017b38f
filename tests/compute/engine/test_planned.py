"""Multimodal generation from prefix-matching plans (flowrt.compute.engine.planned): turn 2 of a
session with the same image reuses turn 1's pages (counted) and hits the encoder cache, and gives
the tokens a run with no cache gives; still so after the pages were evicted (recomputed from the
kept hidden states); the result's context slots and hidden state drive a DiT."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch", reason="the engines run on torch (the torch extra)")

from flowrt.compute.engine import ContinuousBatcher, EngineError, ReferenceEngine  # noqa: E402
from flowrt.compute.engine.dit import DitConfig, DitEngine, DitSampler  # noqa: E402
from flowrt.compute.engine.planned import PlannedGenerator  # noqa: E402
from flowrt.compute.hashing import page_hashes  # noqa: E402
from flowrt.compute.prefix import Media, PrefixMatcher, Text  # noqa: E402
from flowrt.params.meta import EmbeddedStore  # noqa: E402
from flowrt.params.pool import KVPool  # noqa: E402
from flowrt.params.session import KVSession  # noqa: E402

SIZE = 4
NEW = 6
IMAGE = b"\x89 pixels of a cat"
PROMPT = [Text([10, 11, 12, 13, 14]), Media("image", IMAGE), Text([20, 21, 22])]  # 5 + 6 + 3 = 14 positions


class Model:
    """A reference LLM, an image encoder giving 6 rows (counted), a matcher, a generator, a pool."""

    def __init__(self, device_pages: int = 64, batcher: bool = False):
        self.engine = ReferenceEngine()
        self.encoded = 0
        self.matcher = PrefixMatcher(embed_tokens=self.engine.embed, encoders={"image": self.encode})
        batch = ContinuousBatcher(self.engine) if batcher else None
        self.generator = PlannedGenerator(self.engine, self.matcher, batcher=batch)
        layout = self.engine.describe().kv_layout("kv", SIZE)
        self.pool = KVPool(layout, device_pages=device_pages, store=EmbeddedStore("t"), deployment="t", node="n")
        self.calls = 0

    def encode(self, payload: bytes):
        self.encoded += 1
        generator = torch.Generator().manual_seed(int.from_bytes(payload[:4], "little"))
        return torch.randn(6, 64, generator=generator)

    async def turn(self, session, inputs, mode="incremental", dit=None, **options):
        self.calls += 1
        async with KVSession(self.pool, session, f"call-{self.calls}", page_hashes) as kv:
            plan = await (self.matcher.full(kv, inputs) if mode == "full" else self.matcher.incremental(kv, inputs))
            result = await self.generator.generate(kv, plan, max_new_tokens=NEW, **options)
            latent = None
            if dit is not None:
                latent = await dit.sample(result.context_slots, result.hidden, steps=2)
        return plan, result, latent

    def close(self):
        self.pool.close()


def cold(inputs) -> list[int]:
    """The tokens a fresh model on a fresh pool gives for the whole conversation."""
    model = Model()
    try:
        plan, result, _ = asyncio.run(model.turn("cold", inputs, mode="full"))
    finally:
        model.close()
    assert result.reused_tokens == 0 and plan.hit_pages == 0
    return result.tokens


def test_turn_two_with_the_same_image_reuses_pages_and_the_encoder_cache():
    model = Model()
    try:
        plan1, first, _ = asyncio.run(model.turn("s", PROMPT))
        assert (first.prompt_tokens, first.reused_tokens, first.computed_tokens) == (14, 0, 14)
        # 14 + 5 positions ran (the last generated token never does): 4 full pages committed
        assert first.committed_pages == 4 and model.encoded == 1
        assert first.tokens == cold(PROMPT)
        assert first.hidden.shape == (64,) and len(first.context_slots) == 14 + NEW - 1

        # turn 2 sends the whole conversation again (full matching): the image hits the encoder cache
        conversation = [*PROMPT, Text(first.tokens), Text([7, 8, 9])]
        plan2, second, _ = asyncio.run(model.turn("s", conversation, mode="full"))
        assert plan2.encoder_hits == 1 and plan2.encoded == 0 and model.encoded == 1
        assert model.matcher.statistics()["encoders"]["image"]["hits"] == 1
        assert plan2.hit_pages == 4 and second.reused_tokens == 16
        assert second.computed_tokens == 14 + NEW + 3 - 16
        assert second.tokens == cold(conversation)

        # turn 3 appends only new text (incremental): the same tokens as sending it all
        plan3, third, _ = asyncio.run(model.turn("s", [Text([3, 4])]))
        assert plan3.hit_pages >= 5 and third.reused_tokens == plan3.hit_tokens
        assert third.tokens == cold([*conversation, Text(second.tokens), Text([3, 4])])
    finally:
        model.close()


def test_evicted_pages_are_recomputed_from_the_kept_hidden_states():
    model = Model(device_pages=10)  # L1 only: another session's long prompt evicts every page
    try:
        _, first, _ = asyncio.run(model.turn("s", PROMPT))
        asyncio.run(model.turn("other", [Text(list(range(30, 58)))]))
        plan2, second, _ = asyncio.run(model.turn("s", [Text([7, 8, 9])]))
        assert plan2.hit_pages == 0 and second.reused_tokens == 0
        assert plan2.frames[0].kind == "recompute" and model.encoded == 1  # from emb, no encoder run
        assert second.tokens == cold([*PROMPT, Text(first.tokens), Text([7, 8, 9])])
    finally:
        model.close()


def test_a_fully_cached_prompt_runs_its_last_page_again_for_logits():
    model = Model()
    try:
        prompt = [Text([1, 2, 3, 4]), Media("image", IMAGE), Text([5, 6])]  # 12 positions: 3 whole pages
        asyncio.run(model.turn("a", prompt, mode="full"))
        plan, again, _ = asyncio.run(model.turn("b", prompt, mode="full"))
        assert plan.hit_pages == 3 and not plan.frames
        assert (again.reused_tokens, again.computed_tokens) == (8, 4)
        assert again.tokens == cold(prompt)
    finally:
        model.close()


def test_through_the_batcher_the_hidden_state_and_slots_drive_a_dit():
    model = Model(batcher=True)
    try:
        dit = DitEngine(DitConfig.matching(model.engine.describe()))
        dit.bind_kv({key: value for key, value in zip(model.pool.layout.chunks(), model.pool.device.stacks, strict=True)})
        sampler = DitSampler(dit)
        _, first, latent = asyncio.run(model.turn("s", PROMPT, dit=sampler))
        _, other, other_latent = asyncio.run(model.turn("t", [Text([10, 11, 12, 13, 99])], dit=sampler))
        assert latent.shape == (4, 8, 8) and torch.isfinite(latent).all()
        assert (latent - other_latent).abs().max() > 1e-3
        assert first.tokens == cold(PROMPT)
    finally:
        model.close()


def test_a_plan_of_another_session_is_refused():
    model = Model()
    try:

        async def mixed():
            async with KVSession(model.pool, "s", "c1", page_hashes) as kv:
                plan = await model.matcher.incremental(kv, [Text([1, 2])])
            async with KVSession(model.pool, "t", "c2", page_hashes) as kv:
                await model.generator.generate(kv, plan)

        with pytest.raises(EngineError, match="plan on the same `kv`"):
            asyncio.run(mixed())
        with pytest.raises(EngineError, match="PrefixMatcher"):
            PlannedGenerator(model.engine, object())
    finally:
        model.close()


def test_place_context_reuses_the_llms_pages_or_recomputes_them_to_the_same_latent():
    """A DiT in the LLM's process finds the context's pages; in another (a fresh pool) they are
    recomputed from the rows: the same latent either way."""
    from flowrt.compute.engine import kv_stacks
    from flowrt.compute.engine.planned import place_context

    model = Model()
    elsewhere = Model()  # another process: its own pool, engine and DiT
    try:

        def sampler_for(owner):
            dit = DitEngine(DitConfig.matching(owner.engine.describe()))
            dit.bind_kv(kv_stacks(owner.pool.device))
            return DitSampler(dit)

        _, first, own_latent = asyncio.run(model.turn("s", PROMPT, dit=sampler_for(model)))
        history = model.matcher.history("s")
        ran = len(first.context_slots)
        rows, keys = history.rows_between(0, ran), list(history.keys[: ran // SIZE])
        results = {}
        for name, owner in (("same", model), ("other", elsewhere)):

            async def place(owner=owner, name=name):
                async with KVSession(owner.pool, "s", f"dit-{name}", page_hashes) as kv:
                    owner.generator.bind(kv)
                    placed = await place_context(kv, owner.engine, rows, keys)
                    latent = await sampler_for(owner).sample(placed.slots, first.hidden, steps=2)
                return placed, latent

            results[name] = asyncio.run(place())
        same, other = results["same"], results["other"]
        assert (same[0].reused_tokens, same[0].computed_tokens) == (len(keys) * SIZE, ran - len(keys) * SIZE)
        assert (other[0].reused_tokens, other[0].computed_tokens) == (0, ran)
        assert torch.allclose(same[1], own_latent, atol=1e-5)
        assert torch.allclose(other[1], own_latent, atol=1e-4)
    finally:
        model.close()
        elsewhere.close()


def test_a_turn_that_fails_leaves_the_history_as_it_was():
    from flowrt.params.session import KVError

    def conversation(with_failure: bool):
        model = Model(device_pages=16)  # 64 positions: a 200-token turn cannot be placed
        try:

            async def turns():
                await model.turn("s", PROMPT)
                before = model.matcher.history("s").n_tokens
                if with_failure:
                    with pytest.raises(KVError):
                        await model.turn("s", [Text(list(range(200)))])
                    assert model.matcher.history("s").n_tokens == before  # the failed turn left nothing behind
                    assert model.matcher.counters.rollbacks == 1
                return await model.turn("s", [Text([30, 31, 32])])

            plan, result, _ = asyncio.run(turns())
            return plan.n_tokens, result.tokens
        finally:
            model.close()

    assert conversation(with_failure=True) == conversation(with_failure=False)
