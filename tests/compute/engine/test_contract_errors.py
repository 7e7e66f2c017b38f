"""Bad use of an engine is refused with an EngineError naming what is wrong and the fix, before
any K/V is touched: steps (slots out of range, too few slots, repeated slots, two requests writing
one slot, a request reading what another writes, inputs given twice or not at all, bad token ids,
embeddings or positions, unknown captures), binding (missing or misshapen stacks), page and slot
copies. Run once per engine (conftest.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the engines run on torch (the torch extra)")

from flowrt.compute.engine import EngineError, StepBatch, StepRequest, kv_stacks  # noqa: E402
from flowrt.params.tiers import DeviceTier  # noqa: E402
from tests.compute.engine.support import Harness, same_bits  # noqa: E402


@pytest.fixture
def bound(engine_case):
    engine = engine_case.make()
    harness = Harness(engine, page_tokens=4, pages=8, fill=float("nan"))
    yield harness
    engine.close()


def refused(harness: Harness, *requests: StepRequest, match: str) -> None:
    before = harness.snapshot()
    with pytest.raises(EngineError, match=match):
        harness.run(*requests)
    for old, stack in zip(before, harness.tier.stacks, strict=True):
        assert same_bits(old, stack).all(), "a refused step touched the stacks"


BAD_STEPS = {
    "a slot outside the stacks": (
        [StepRequest(token_ids=[1, 2], slots=[0, 32])],
        r"slot 32 is outside the bound KV stacks \(token slots 0\.\.31\)",
    ),
    "a negative slot": ([StepRequest(token_ids=[1], slots=[-1])], "slot -1 is outside"),
    "fewer slots than new tokens": ([StepRequest(token_ids=[1, 2, 3], slots=[0, 1])], "list the slot of every context token"),
    "a slot twice in one context": ([StepRequest(token_ids=[1, 2], slots=[4, 5, 4])], "slot 4 appears twice"),
    "two requests writing one slot": (
        [StepRequest(token_ids=[1], slots=[3]), StepRequest(token_ids=[2], slots=[3])],
        r"requests \[0, 1\] of the step all write slot 3",
    ),
    "reading what another request writes": (
        [StepRequest(token_ids=[1], slots=[3]), StepRequest(token_ids=[2], slots=[3, 7])],
        "request 1 of the step reads slot 3, which another request of the same step writes; run them in separate steps",
    ),
    "no inputs": ([StepRequest(slots=[0])], "token_ids or as embeddings, exactly one"),
    "both inputs": ([StepRequest(token_ids=[1], embeddings=torch.zeros(1, 4), slots=[0])], "exactly one"),
    "no new tokens": ([StepRequest(token_ids=[], slots=[0])], "at least one new token"),
    "a token outside the vocabulary": (
        [StepRequest(token_ids=[1, 10**6], slots=[0, 1])],
        "token id 1000000 is outside the vocabulary",
    ),
    "token ids that are not ints": ([StepRequest(token_ids=[1.5], slots=[0])], "token_ids must hold ints"),
    "positions of the wrong length": (
        [StepRequest(token_ids=[1, 2], slots=[0, 1], positions=[0])],
        "1 positions for 2 new tokens",
    ),
    "a negative position": ([StepRequest(token_ids=[1], slots=[0], positions=[-3])], "positions must be >= 0"),
    "an unknown capture": ([StepRequest(token_ids=[1], slots=[0], capture=frozenset({"attention"}))], "unknown capture"),
    "float slots": ([StepRequest(token_ids=[1], slots=torch.tensor([0.0]))], "slots must be a 1-d tensor of integers"),
}


@pytest.mark.parametrize("case", sorted(BAD_STEPS))
def test_a_bad_step_is_refused_before_any_kv_is_touched(bound, case):
    requests, match = BAD_STEPS[case]
    refused(bound, *requests, match=match)


def test_embeddings_of_the_wrong_width_are_refused(bound):
    width = bound.spec.hidden_size
    refused(bound, StepRequest(embeddings=torch.zeros(2, width + 1), slots=[0, 1]), match=rf"\(new_tokens, {width}\)")


def test_an_empty_step_and_a_step_before_binding_are_refused(engine_case, bound):
    with pytest.raises(EngineError, match="the step has no requests"):
        bound.engine.forward(StepBatch([]))
    with pytest.raises(EngineError, match=r"bind_kv\(stacks\)"):
        engine_case.make().forward(StepBatch([StepRequest(token_ids=[1], slots=[0])]))


def test_stacks_that_do_not_fit_the_model_are_refused(engine_case):
    engine = engine_case.make()
    spec = engine.describe()
    stacks = kv_stacks(DeviceTier(spec.kv_layout("kv", 4), 4, spec.device))
    with pytest.raises(EngineError, match=r"missing \[\('0', 'v'\)\]"):
        engine.bind_kv({pair: stack for pair, stack in stacks.items() if pair != ("0", "v")})
    other = spec.kv_layout("kv", 4)
    wide = DeviceTier(
        type(other)("kv", other.sub_names, other.slice_names, 4, spec.num_kv_heads + 1, spec.head_dim, other.dtype), 4
    )
    with pytest.raises(EngineError, match=f"set `heads {spec.num_kv_heads}`"):
        engine.bind_kv(kv_stacks(wide))
    cast = {pair: stack.to(torch.float16 if stack.dtype != torch.float16 else torch.float32) for pair, stack in stacks.items()}
    with pytest.raises(EngineError, match=f"set `dtype {spec.kv_dtype}`"):
        engine.bind_kv(cast)
    strided = {pair: torch.cat([stack, stack], dim=1)[:, ::2] for pair, stack in stacks.items()}  # the right shape, strided
    with pytest.raises(EngineError, match="not contiguous"):
        engine.bind_kv(strided)


def test_bad_copies_and_page_writes_are_refused(bound):
    engine = bound.engine
    with pytest.raises(EngineError, match="2 source slots but 1 destination slots"):
        engine.copy_slots([0, 1], [2])
    with pytest.raises(EngineError, match="a destination slot appears twice"):
        engine.copy_slots([0, 1], [2, 2])
    with pytest.raises(EngineError, match="outside the bound KV stacks"):
        engine.copy_slots([0], [32])
    with pytest.raises(EngineError, match=r"read_pages\(\) page: 8 is outside the bound KV stacks \(pages 0\.\.7\)"):
        engine.read_pages([8])
    with pytest.raises(EngineError, match="write_pages\\(\\): data must be a tensor"):
        engine.write_pages([0], torch.zeros(1, 2))


def test_embed_refuses_what_is_not_a_token_id(bound):
    for bad, match in (([1.5], "token_ids must hold ints"), ([bound.spec.vocab_size], "token ids must lie in")):
        with pytest.raises(EngineError, match=match):
            bound.engine.embed(bad)
