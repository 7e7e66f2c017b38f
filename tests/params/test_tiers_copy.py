"""Copies between tiers (flowrt.params.tiers.copy_slots): every pair of tiers moves exact bytes
for random slot lists, data and dtypes, with and without coalescing; a copy within one tier
whose slots overlap reads every page before writing any; and coalescing counts one segment per
run of slots consecutive on both sides (FlowKV), one per page without it."""

from __future__ import annotations

import itertools
import random
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="the tiers hold torch tensors (the torch extra)")

from flowrt.params.layout import ITEM_BYTES, KVLayout  # noqa: E402
from flowrt.params.tiers import DeviceTier, DiskTier, HostTier, Tier, copy_slots, runs  # noqa: E402

KINDS = ("device", "host", "disk")
SLOTS = 12


def make(kind: str, layout: KVLayout, slots: int, directory: str) -> Tier:
    if kind == "device":
        return DeviceTier(layout, slots)
    if kind == "host":
        return HostTier.create(layout, slots)
    return DiskTier(f"{directory}/{random.getrandbits(32):08x}", layout, slots)


def close(*tiers: Tier) -> None:
    for tier in tiers:
        tier.close()


def page_bytes(tier: Tier, slot: int) -> bytes:
    """The page as the flat layout serialises it: its chunks' bytes in `layout.chunks()` order
    (for a device tier, read chunk by chunk from the block stacks: the obviously right way)."""
    if isinstance(tier, DeviceTier):
        return b"".join(bytes(stack[slot].contiguous().view(torch.uint8).reshape(-1).tolist()) for stack in tier.stacks)
    return bytes(tier.page(slot).tolist())


def fill_random(tier: Tier, rng: random.Random) -> None:
    """Random bytes in every page (any bit pattern: NaNs, infinities, subnormals...)."""
    generator = torch.Generator().manual_seed(rng.getrandbits(31))
    if isinstance(tier, DeviceTier):
        for stack in tier.stacks:
            raw = stack.view(torch.uint8)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))
    else:
        tier.bytes.copy_(torch.randint(0, 256, tier.bytes.shape, dtype=torch.uint8, generator=generator))


layouts = st.builds(
    lambda subs, slices, tokens, heads, dim, dtype: KVLayout(
        "p", tuple(f"l{i}" for i in range(subs)), tuple(f"s{i}" for i in range(slices)), tokens, heads, dim, dtype
    ),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 5),
    st.integers(1, 3),
    st.integers(1, 9),
    st.sampled_from(sorted(ITEM_BYTES)),  # float16, bfloat16, float32, float8_e4m3, int8
)


@st.composite
def slot_lists(draw) -> tuple[list[int], list[int]]:
    """Sources (may repeat: one page to many slots) and distinct destinations, often in runs."""
    count = draw(st.integers(0, SLOTS))
    if draw(st.booleans()):  # runs: a shifted window on each side, some of it scrambled
        src_start, dst_start = draw(st.integers(0, SLOTS - count)), draw(st.integers(0, SLOTS - count))
        sources, targets = list(range(src_start, src_start + count)), list(range(dst_start, dst_start + count))
        cut = draw(st.integers(0, count))
        targets = targets[:cut] + draw(st.permutations(targets[cut:]))
    else:
        sources = draw(st.lists(st.integers(0, SLOTS - 1), min_size=count, max_size=count))
        targets = draw(st.permutations(range(SLOTS)))[:count]
    return sources, targets


@pytest.mark.parametrize(("src_kind", "dst_kind"), list(itertools.product(KINDS, KINDS)))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts, slots=slot_lists(), coalesce=st.booleans(), seed=st.integers(0, 2**32))
def test_copies_between_any_two_tiers_move_exact_bytes(src_kind, dst_kind, layout, slots, coalesce, seed):
    sources, targets = slots
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as directory:
        src, dst = make(src_kind, layout, SLOTS, directory), make(dst_kind, layout, SLOTS, directory)
        try:
            fill_random(src, rng)
            fill_random(dst, rng)
            before_src = [page_bytes(src, s) for s in range(SLOTS)]
            before_dst = [page_bytes(dst, s) for s in range(SLOTS)]
            stats = copy_slots(src, sources, dst, targets, coalesce=coalesce)
            expected = list(before_dst)
            for s, d in zip(sources, targets, strict=True):
                expected[d] = before_src[s]
            assert [page_bytes(dst, s) for s in range(SLOTS)] == expected
            assert [page_bytes(src, s) for s in range(SLOTS)] == before_src  # the source is only read
            assert stats.bytes == len(sources) * layout.page_bytes
            assert stats.segments == (naive_runs(sources, targets) if coalesce else len(sources))
            if len(set(sources)) == len(sources):  # and back, into a third tier: the very same bytes
                back = make(src_kind, layout, SLOTS, directory)
                try:
                    copy_slots(dst, targets, back, sources, coalesce=not coalesce)
                    assert [page_bytes(back, s) for s in sources] == [before_src[s] for s in sources]
                finally:
                    close(back)
        finally:
            close(src, dst)


def naive_runs(sources: list[int], targets: list[int]) -> int:
    """How many maximal runs of pages are consecutive on both sides (0 for no pages)."""
    return sum(1 for i in range(len(sources)) if i == 0 or (sources[i] - sources[i - 1], targets[i] - targets[i - 1]) != (1, 1))


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=30, deadline=None)
@given(slots=slot_lists(), seed=st.integers(0, 2**32))
def test_a_copy_within_one_tier_reads_every_page_before_writing_any(kind, slots, seed):
    sources, targets = slots
    layout = KVLayout("p", ("a", "b"), ("k", "v"), 2, 1, 3, "bfloat16")
    with tempfile.TemporaryDirectory() as directory:
        tier = make(kind, layout, SLOTS, directory)
        try:
            fill_random(tier, random.Random(seed))
            before = [page_bytes(tier, s) for s in range(SLOTS)]
            copy_slots(tier, sources, tier, targets)
            expected = list(before)
            for s, d in zip(sources, targets, strict=True):
                expected[d] = before[s]
            assert [page_bytes(tier, s) for s in range(SLOTS)] == expected
        finally:
            close(tier)


TINY = KVLayout("t", ("0", "1"), ("k", "v"), 1, 1, 4, "float16")  # 32-byte pages: 1,000 of them are small


@pytest.mark.parametrize(("src_kind", "dst_kind"), [("device", "host"), ("host", "disk"), ("disk", "device"), ("host", "host")])
def test_coalescing_moves_a_run_as_one_segment_and_fragments_as_one_per_run(src_kind, dst_kind):
    with tempfile.TemporaryDirectory() as directory:
        src, dst = make(src_kind, TINY, 2000, directory), make(dst_kind, TINY, 2000, directory)
        try:
            fill_random(src, random.Random(7))
            consecutive = copy_slots(src, range(1000), dst, range(500, 1500))
            assert (consecutive.segments, consecutive.bytes) == (1, 1000 * TINY.page_bytes)
            assert copy_slots(src, range(1000), dst, range(500, 1500), coalesce=False).segments == 1000
            # runs of 10 on both sides, each run somewhere else: 100 segments
            sources = [s for run in range(100) for s in range(run * 20, run * 20 + 10)]
            targets = [d for run in reversed(range(100)) for d in range(run * 10, run * 10 + 10)]
            assert copy_slots(src, sources, dst, targets).segments == 100
            assert copy_slots(src, sources, dst, targets, coalesce=False).segments == 1000
            assert [page_bytes(dst, d) for d in targets[:30]] == [page_bytes(src, s) for s in sources[:30]]
            # consecutive on one side only is no run: every page its own segment
            scattered = copy_slots(src, range(1000), dst, range(0, 2000, 2))
            assert scattered.segments == 1000
            assert page_bytes(dst, 1998) == page_bytes(src, 999)
        finally:
            close(src, dst)


def test_runs_are_the_maximal_runs_consecutive_on_both_sides():
    assert runs([], []) == []
    assert runs([3, 4, 5, 9, 10, 2], [0, 1, 2, 3, 4, 9]) == [(3, 0, 3), (9, 3, 2), (2, 9, 1)]
    assert runs([0, 1, 2], [5, 7, 8]) == [(0, 5, 1), (1, 7, 2)]
