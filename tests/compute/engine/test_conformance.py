"""The engine conformance suite (docs/engines.md): what every EngineAdapter must do, run once per
engine (conftest.py: the reference engine in two shapes, or `--engine MODULE:FACTORY`).

Paged equals dense whatever the page size and slot order; a prefill split into steps equals one
step; decoding over a reused (and forked) prefix equals decoding after recomputing everything;
K/V land only in the new tokens' slots (every other slot holds a NaN canary that must survive, and
must never reach an output); bidirectional steps and steps that store nothing; a batch of requests
of different kinds equals each run alone; embeddings equal their token ids; pages read out and
written back serve the same context; positions come from the request."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch", reason="the engines run on torch (the torch extra)")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from flowrt.compute.engine import CAPTURE_LOGITS, EngineError, StepRequest  # noqa: E402
from flowrt.compute.engine.adapter import FEATURE_BIDIRECTIONAL, FEATURE_EMBEDDINGS, FEATURE_HIDDEN, FEATURE_NO_WRITE  # noqa: E402
from flowrt.params.layout import KVLayout  # noqa: E402
from tests.compute.engine.support import (  # noqa: E402
    Harness,
    assert_close,
    capture,
    check_result,
    expected,
    same_bits,
    tolerance,
)

EXAMPLES = settings(max_examples=30, deadline=None)


def draw_tokens(rng: random.Random, spec, count: int) -> list[int]:
    return [rng.randrange(spec.vocab_size) for _ in range(count)]


def needs(spec, feature: str) -> None:
    if feature not in spec.features:
        pytest.skip(f"engine `{spec.name}` does not claim `{feature}`")


def greedy(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits.float()))


def changed_slots(harness: Harness, before: list[torch.Tensor]) -> set[int]:
    """The token slots whose K or V differ from `before` in any layer."""
    changed = torch.zeros(harness.slot_count, dtype=torch.bool)
    for old, stack in zip(before, harness.tier.stacks, strict=True):
        rows = ~same_bits(old, stack).view(harness.slot_count, -1).all(dim=1)
        changed |= rows.cpu()
    return set(torch.nonzero(changed).flatten().tolist())


def test_describe_gives_the_layout_the_engine_binds_to(engine_case):
    engine = engine_case.make()
    spec = engine.describe()
    layout = spec.kv_layout("kv", 8)
    assert (layout.sub_names, layout.slice_names) == (tuple(str(i) for i in range(spec.num_layers)), ("k", "v"))
    assert (layout.heads, layout.head_dim, layout.dtype) == (spec.num_kv_heads, spec.head_dim, spec.kv_dtype)
    assert KVLayout.from_global("kv", spec.global_settings(8)) == layout
    spec.check_layout(layout)
    wrong = KVLayout("kv", layout.sub_names, layout.slice_names, 8, layout.heads + 1, layout.head_dim, layout.dtype)
    with pytest.raises(EngineError, match=f"`heads {spec.num_kv_heads}`"):
        spec.check_layout(wrong)
    Harness(engine, page_tokens=8, pages=4)
    assert tuple(engine.read_pages([0, 3]).shape) == (2, 2 * spec.num_layers, 8, spec.num_kv_heads, spec.head_dim)


def test_paged_prefill_equals_dense_whatever_the_page_size_and_slot_order(engine_case):
    engine = engine_case.make()
    spec = engine.describe()

    @EXAMPLES
    @given(
        page_tokens=st.sampled_from([1, 2, 3, 4, 8, 16]),
        length=st.integers(1, 40),
        scattered=st.booleans(),
        seed=st.integers(0, 2**16),
    )
    def check(page_tokens, length, scattered, seed):
        rng = random.Random(seed)
        harness = Harness(engine, page_tokens, pages=-(-length // page_tokens) + 3)
        if scattered:  # any distinct token slots, not even page-aligned
            slots = rng.sample(range(harness.slot_count), length)
        else:  # whole pages in a random order
            slots = harness.slots(rng.sample(range(harness.pages), harness.pages), length)
        tokens = draw_tokens(rng, spec, length)
        (result,) = harness.run(StepRequest(token_ids=tokens, slots=slots, capture=capture(spec)))
        check_result(engine, result, expected(engine, engine_case.make, tokens), slice(None), "one-step prefill")

    check()


def test_prefill_split_into_steps_equals_prefill_in_one_step(engine_case):
    engine = engine_case.make()
    spec = engine.describe()

    @EXAMPLES
    @given(
        page_tokens=st.sampled_from([1, 3, 4, 16]),
        length=st.integers(2, 40),
        cuts=st.lists(st.integers(1, 39), min_size=1, max_size=4),
        seed=st.integers(0, 2**16),
    )
    def check(page_tokens, length, cuts, seed):
        rng = random.Random(seed)
        harness = Harness(engine, page_tokens, pages=-(-length // page_tokens) + 2)
        slots = harness.slots(rng.sample(range(harness.pages), harness.pages), length)
        tokens = draw_tokens(rng, spec, length)
        whole = expected(engine, engine_case.make, tokens)
        ends = sorted({cut for cut in cuts if cut < length} | {length})
        begin = 0
        for end in ends:
            (result,) = harness.run(StepRequest(token_ids=tokens[begin:end], slots=slots[:end], capture=capture(spec)))
            want = expected(engine, engine_case.make, tokens[:end])
            want.hidden = None if whole.hidden is None else whole.hidden[:end]
            check_result(engine, result, want, slice(begin, end), f"segment {begin}..{end}")
            begin = end

    check()


def test_decode_over_a_reused_prefix_equals_decode_after_full_recompute(engine_case):
    engine = engine_case.make()
    spec = engine.describe()
    rng = random.Random(7)
    size, steps = 4, 8
    prefix = draw_tokens(rng, spec, 10)  # two full pages and half of a third
    first, second = prefix + draw_tokens(rng, spec, 5), prefix + draw_tokens(rng, spec, 6)
    harness = Harness(engine, size, pages=48)
    first_pages = [5, 9, 2, 7, 11]
    harness.run(StepRequest(token_ids=first, slots=harness.slots(first_pages, len(first)), capture=capture(spec)))
    before = harness.snapshot()

    # the second request reads the first's two full pages, forks its half page (copy-on-write), then goes on
    pages = [5, 9, 20, 21, 22, 23, 24]
    engine.copy_slots(harness.slots(first_pages, 10)[8:], harness.slots(pages, 10)[8:])
    slots = harness.slots(pages, len(second) + steps)
    (result,) = harness.run(StepRequest(token_ids=second[10:], slots=slots[: len(second)], capture=capture(spec)))
    reused = [result.logits]
    for position in range(len(second), len(second) + steps - 1):
        token = greedy(reused[-1])
        (result,) = harness.run(StepRequest(token_ids=[token], slots=slots[: position + 1], capture=frozenset({CAPTURE_LOGITS})))
        reused.append(result.logits)
    assert changed_slots(harness, before) == set(slots[8:-1]), "the reused pages were written"

    fresh = Harness(engine_case.make(), size, pages=48)
    slots = fresh.slots(range(30, 48), len(second) + steps)
    (result,) = fresh.run(StepRequest(token_ids=second, slots=slots[: len(second)], capture=capture(spec)))
    recomputed = [result.logits]
    for position in range(len(second), len(second) + steps - 1):
        token = greedy(recomputed[-1])
        (result,) = fresh.run(StepRequest(token_ids=[token], slots=slots[: position + 1], capture=frozenset({CAPTURE_LOGITS})))
        recomputed.append(result.logits)
    assert [greedy(logits) for logits in reused] == [greedy(logits) for logits in recomputed]
    for step, (a, b) in enumerate(zip(reused, recomputed, strict=True)):
        assert_close(engine, a, b, f"decode step {step}")


def test_kv_is_written_only_into_the_new_tokens_slots(engine_case):
    engine = engine_case.make()
    spec = engine.describe()
    rng = random.Random(3)
    harness = Harness(engine, 4, pages=32, fill=float("nan"))  # every slot holds a canary
    tokens = draw_tokens(rng, spec, 9)
    slots = rng.sample(range(harness.slot_count), 9)
    before = harness.snapshot()
    (result,) = harness.run(StepRequest(token_ids=tokens, slots=slots, capture=capture(spec)))
    assert changed_slots(harness, before) == set(slots)
    assert torch.isfinite(result.logits).all(), "a canary reached the output: an unlisted slot was read"
    check_result(engine, result, expected(engine, engine_case.make, tokens), slice(None), "prefill among canaries")

    new_slot = next(slot for slot in range(harness.slot_count) if slot not in slots)
    before = harness.snapshot()
    (result,) = harness.run(StepRequest(token_ids=[greedy(result.logits)], slots=[*slots, new_slot], capture=capture(spec)))
    assert changed_slots(harness, before) == {new_slot}
    assert torch.isfinite(result.logits).all()
    if result.hidden_all is not None:
        assert torch.isfinite(result.hidden_all).all()


def test_bidirectional_new_tokens_attend_to_every_token(engine_case):
    engine = engine_case.make()
    spec = engine.describe()
    needs(spec, FEATURE_BIDIRECTIONAL)

    @EXAMPLES
    @given(page_tokens=st.sampled_from([1, 4, 5]), context=st.integers(0, 20), new=st.integers(1, 12), seed=st.integers(0, 2**16))
    def check(page_tokens, context, new, seed):
        rng = random.Random(seed)
        harness = Harness(engine, page_tokens, pages=-(-(context + new) // page_tokens) + 2)
        slots = harness.slots(rng.sample(range(harness.pages), harness.pages), context + new)
        tokens = draw_tokens(rng, spec, context + new)
        if context:
            harness.run(StepRequest(token_ids=tokens[:context], slots=slots[:context], capture=capture(spec)))
        (result,) = harness.run(StepRequest(token_ids=tokens[context:], slots=slots, causal=False, capture=capture(spec)))
        want = expected(engine, engine_case.make, tokens, full_attention_from=context)
        check_result(engine, result, want, slice(context, None), "bidirectional step")

    check()
    if FEATURE_HIDDEN in spec.features:  # the flag is not ignored: the first new token sees the later ones
        tokens = draw_tokens(random.Random(1), spec, 6)
        one, two = Harness(engine_case.make(), 4, 4), Harness(engine_case.make(), 4, 4)
        (causal,) = one.run(StepRequest(token_ids=tokens, slots=list(range(6)), capture=capture(spec)))
        (full,) = two.run(StepRequest(token_ids=tokens, slots=list(range(6)), causal=False, capture=capture(spec)))
        assert not torch.allclose(causal.hidden_all[0], full.hidden_all[0], atol=1e-3)


def test_new_tokens_that_store_nothing_leave_every_slot_untouched(engine_case):
    engine = engine_case.make()
    spec = engine.describe()
    needs(spec, FEATURE_NO_WRITE)
    rng = random.Random(5)
    harness = Harness(engine, 4, pages=16, fill=float("nan"))
    context, new = draw_tokens(rng, spec, 11), draw_tokens(rng, spec, 6)
    slots = rng.sample(range(harness.slot_count), 11)
    harness.run(StepRequest(token_ids=context, slots=slots, capture=capture(spec)))
    before = harness.snapshot()
    modes = [True, False] if FEATURE_BIDIRECTIONAL in spec.features else [True]
    for causal in modes:
        for _ in range(2):  # twice: nothing the first stored changes the second
            (result,) = harness.run(StepRequest(token_ids=new, slots=slots, write_kv=False, causal=causal, capture=capture(spec)))
            assert changed_slots(harness, before) == set()
            want = expected(engine, engine_case.make, context + new, full_attention_from=None if causal else 11)
            check_result(engine, result, want, slice(11, None), f"a step storing nothing (causal={causal})")


def test_a_batch_of_requests_of_different_kinds_equals_each_run_alone(engine_case):
    engine = engine_case.make()
    spec = engine.describe()
    rng = random.Random(11)
    harness = Harness(engine, 4, pages=64, fill=float("nan"))
    free = iter(rng.sample(range(harness.slot_count), harness.slot_count))

    def take(count: int) -> list[int]:
        return [next(free) for _ in range(count)]

    decode_context, chunk_context, bidi_context = take(20), take(9), take(3)
    for slots in (decode_context, chunk_context, bidi_context):  # the cached contexts
        harness.run(StepRequest(token_ids=draw_tokens(rng, spec, len(slots)), slots=slots))
    requests = [
        StepRequest(token_ids=draw_tokens(rng, spec, 13), slots=take(13), capture=capture(spec)),  # a prefill
        StepRequest(token_ids=draw_tokens(rng, spec, 1), slots=decode_context + take(1), capture=capture(spec)),  # a decode
        StepRequest(token_ids=draw_tokens(rng, spec, 7), slots=chunk_context + take(7), capture=capture(spec)),  # a later chunk
    ]
    if FEATURE_BIDIRECTIONAL in spec.features:
        requests.append(
            StepRequest(token_ids=draw_tokens(rng, spec, 5), slots=bidi_context + take(5), causal=False, capture=capture(spec))
        )
    if FEATURE_NO_WRITE in spec.features:
        requests.append(
            StepRequest(token_ids=draw_tokens(rng, spec, 4), slots=decode_context[:6], write_kv=False, capture=capture(spec))
        )
    if FEATURE_EMBEDDINGS in spec.features:
        requests.append(StepRequest(embeddings=engine.embed(draw_tokens(rng, spec, 3)), slots=take(3), capture=capture(spec)))
    start = harness.snapshot()

    alone = [harness.run(request)[0] for request in requests]
    after_alone = harness.snapshot()
    for stack, saved in zip(harness.tier.stacks, start, strict=True):
        stack.copy_(saved)
    together = harness.run(*requests)
    for i, (a, b) in enumerate(zip(together, alone, strict=True)):
        assert_close(engine, a.logits, b.logits, f"request {i}: logits")
        if a.hidden_all is not None:
            assert_close(engine, a.hidden_all, b.hidden_all, f"request {i}: hidden states")
    for stack, saved in zip(harness.tier.stacks, after_alone, strict=True):
        written = ~torch.isnan(saved)
        assert torch.equal(torch.isnan(stack), torch.isnan(saved)), "the batch wrote other slots than the requests alone"
        assert_close(engine, stack[written], saved[written], "the K/V the batch stored")


def test_embeddings_in_place_of_token_ids_give_the_same_step(engine_case):
    engine = engine_case.make()
    spec = engine.describe()
    needs(spec, FEATURE_EMBEDDINGS)
    tokens = draw_tokens(random.Random(2), spec, 10)
    embeddings = engine.embed(tokens)
    assert tuple(embeddings.shape) == (10, spec.hidden_size)
    by_ids, by_rows = Harness(engine, 4, 8), Harness(engine_case.make(), 4, 8)
    (a,) = by_ids.run(StepRequest(token_ids=tokens, slots=list(range(3, 13)), capture=capture(spec)))
    (b,) = by_rows.run(StepRequest(embeddings=embeddings, slots=list(range(3, 13)), capture=capture(spec)))
    assert_close(engine, a.logits, b.logits, "logits")
    for x, y in zip(by_ids.tier.stacks, by_rows.tier.stacks, strict=True):
        assert_close(engine, x, y, "stored K/V")


def test_pages_read_out_and_written_back_serve_the_same_context(engine_case):
    engine = engine_case.make()
    spec = engine.describe()
    rng = random.Random(4)
    harness = Harness(engine, 4, pages=32)
    tokens = draw_tokens(rng, spec, 12)
    harness.run(StepRequest(token_ids=tokens, slots=harness.slots([3, 8, 5], 12)))
    data = engine.read_pages([3, 8, 5])
    assert tuple(data.shape) == (3, 2 * spec.num_layers, 4, spec.num_kv_heads, spec.head_dim)
    for chunk, (sub, slice_) in enumerate(harness.layout.chunks()):  # layer-major, then k, v: the flat page order
        assert torch.equal(data[:, chunk], harness.tier.stack(sub, slice_)[[3, 8, 5]])
    engine.write_pages([10, 11, 12], data)
    forked = rng.sample(range(20 * 4, harness.slot_count), 12)
    engine.copy_slots(harness.slots([3, 8, 5], 12), forked)
    outputs = []
    for context, new_slot in ((harness.slots([3, 8, 5], 12), 60), (harness.slots([10, 11, 12], 12), 61), (forked, 62)):
        (result,) = harness.run(StepRequest(token_ids=[1], slots=[*context, new_slot], capture=capture(spec)))
        outputs.append(result.logits)
    assert torch.equal(outputs[0], outputs[1]) or torch.allclose(outputs[0], outputs[1], atol=1e-6)
    assert_close(engine, outputs[2], outputs[0], "logits over copied slots")


def test_positions_come_from_the_request(engine_case):
    engine = engine_case.make()
    spec = engine.describe()
    tokens = draw_tokens(random.Random(6), spec, 8)

    def run(positions):
        step = StepRequest(token_ids=tokens, slots=list(range(8)), positions=positions, capture=capture(spec))
        return Harness(engine, 4, 4).run(step)[0].logits

    implicit = run(None)
    assert_close(engine, run(list(range(8))), implicit, "explicit default positions")
    # every position shifted: rotary embeddings are relative, so only rounding differs (K is stored after its rotation)
    rounding = max(1e-4 if spec.kv_dtype == "float32" else 5e-2, *tolerance(engine))  # an engine computing in bf16 rounds more
    assert torch.allclose(run(list(range(100, 108))), implicit, rtol=rounding, atol=rounding)
    spread = run([3 * i for i in range(8)])
    assert not torch.allclose(spread, implicit, atol=1e-3), "positions were ignored"
    model = getattr(engine, "model", None)
    if model is not None and hasattr(model, "dense_forward"):
        assert_close(engine, spread, model.dense_forward(tokens, positions=[3 * i for i in range(8)]).logits[-1], "dense")
