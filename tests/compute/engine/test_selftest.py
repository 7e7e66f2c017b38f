"""The start-up self-test (flowrt.compute.engine.selftest), the one the SGLang adapter runs when
it starts: a correct engine (the reference engine, both shapes) passes every check; engines
broken the ways a mis-driven SGLang would be (writes a slot it was not given, leaves a new slot
unwritten, reads an unlisted slot, ignores the cached prefix, embeds differently, batches
differently) each fail with the check named."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="the engines run on torch (the torch extra)")

from flowrt.compute.engine import ReferenceConfig, ReferenceEngine, StepBatch, StepRequest  # noqa: E402
from flowrt.compute.engine.selftest import SelfTestError, self_test  # noqa: E402
from tests.compute.engine.engines import REFERENCE_CASES  # noqa: E402


@pytest.mark.parametrize("case", REFERENCE_CASES, ids=str)
def test_the_reference_engine_passes_every_check(case):
    engine = case.make()
    report = self_test(engine)
    assert report.checks == [
        "a prefill writes K/V into exactly its new tokens' slots",
        "a prefill split into steps equals the prefill in one step",
        "a decode step writes only its new slot and reads its context",
        "a decode given as an embedding equals the decode given as an id",
        "a batch of decodes equals each alone",
        "slot 0 and every unlisted slot keep their canaries",
    ]
    assert report.largest_difference < 1e-3
    assert self_test(engine, page_tokens=1, seed=5).checks == report.checks  # any page size, other tokens


class Broken(ReferenceEngine):
    """The reference engine with each request of a step rewritten (`rewrite`) before it runs."""

    def __init__(self):
        super().__init__(ReferenceConfig(vocab_size=97, seed=1))

    def rewrite(self, request: StepRequest) -> StepRequest:
        return request

    def forward(self, batch: StepBatch):
        return super().forward(StepBatch([self.rewrite(request) for request in batch.requests]))


class WritesSlotZero(Broken):  # a padding write into SGLang's reserved slot
    def forward(self, batch):
        results = super().forward(batch)
        self.bound.keys[0][0] = 0.0
        return results


class StoresNothing(Broken):  # new K/V never reach the given slots
    def rewrite(self, request):
        n = request.new_tokens
        return dataclasses.replace(request, slots=list(request.slots)[:-n], write_kv=False)


class ReadsAnUnlistedSlot(Broken):  # attends to a slot the step did not list (a canary)
    def rewrite(self, request):
        return dataclasses.replace(request, slots=[self.bound.slot_count - 1, *request.slots])


class IgnoresThePrefix(Broken):  # a wrong extend_prefix_lens: the cached context is not read
    def rewrite(self, request):
        n, slots = request.new_tokens, list(request.slots)
        return dataclasses.replace(request, slots=slots[-n:], positions=list(range(len(slots) - n, len(slots))))


class EmbedsDifferently(Broken):  # embeddings scaled inside the model but not by embed()
    def embed(self, token_ids):
        return super().embed(token_ids) * 1.5


class BatchesDifferently(Broken):  # a batch of two is not two requests alone
    def forward(self, batch):
        results = super().forward(batch)
        if len(batch) > 1:
            results[1].logits = results[1].logits + 1.0
        return results


@pytest.mark.parametrize(
    ("engine", "check"),
    [
        (WritesSlotZero, r"writes only into the given slots: K/V changed in slots outside the new tokens' \[0\]"),
        (StoresNothing, r"writes only into the given slots: new tokens' slots left unwritten \[4, 5"),
        (ReadsAnUnlistedSlot, "canaries: NaN or inf reached the logits"),
        (IgnoresThePrefix, "a prefill split into steps gives the one-step prefill's logits: differs by up to"),
        (EmbedsDifferently, "a decode given as an embedding equals the decode given as an id"),
        (BatchesDifferently, "a batch of two decodes equals each alone"),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
def test_an_engine_broken_a_way_sglang_could_be_fails_naming_the_check(engine, check):
    with pytest.raises(SelfTestError, match=f"the adapter under test failed its start-up self-test: {check}"):
        self_test(engine(), what="the adapter under test")
