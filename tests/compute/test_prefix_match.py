"""Full matching and the two layers of reuse against a real KV pool (flowrt.compute.prefix):
the encoder cache skips forwards across turns and sessions, pages of turn 1 are matched in
turn 2, another image with the same text stops the match at the image, evicted KV is rebuilt
from the kept emb, and the frames cover the sequence exactly once, in order."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch", reason="the KV pool's tiers are torch tensors (the torch extra)")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from flowrt.compute.hashing import content_hash  # noqa: E402
from flowrt.compute.prefix import Media, PrefixError, RecomputeFrame, SegmentFrame, Text  # noqa: E402
from tests.compute.test_prefix_support import (  # noqa: E402
    HIDDEN,
    Model,
    P,
    expected_kv,
    make_pool,
    prefill,
    read_page,
    same_pages,
    session,
    sync,
)

IMAGE_A = b"\x01image A bytes"
IMAGE_B = b"\x01image B bytes, same length as A"  # same first byte: the same number of rows
TURN_1 = [Text(list(range(100, 106))), Media("image", IMAGE_A), Text(list(range(200, 205)))]  # 6 + 4 + 5 = 15


@pytest.fixture
def pool():
    made = make_pool()
    yield made
    made.close()


@sync
async def test_turn_two_with_the_same_image_hits_the_encoder_cache_and_the_pages_of_turn_one(pool):
    model = Model()
    matcher = model.matcher()
    async with session(pool, "s1", "turn1") as kv:
        first = await matcher.full(kv, TURN_1)
        written = prefill(kv, first)
    assert (first.n_tokens, first.hit_pages, first.encoded, first.encoder_hits) == (15, 0, 1, 0)
    async with session(pool, "s1", "turn2") as kv:
        second = await matcher.full(kv, [*TURN_1, Text([7, 8, 9, 10, 11])])
        assert model.encoded == [IMAGE_A]  # the second turn's image came from the cache
        assert (second.encoded, second.encoder_hits) == (0, 1)
        stats = matcher.statistics()["encoders"]["image"]
        assert (stats["hits"], stats["misses"], stats["entries"]) == (1, 1, 1)
        assert second.hit_pages == len(first.keys) == 3 and second.keys[:3] == first.keys
        for page, slot in enumerate(second.hit.slots):  # the slots hold turn 1's K/V of these very positions
            assert same_pages(read_page(kv, slot), written[page])
            assert same_pages(written[page], expected_kv(second, page))
        # turn 1's last partial page had no key: it is history that missed, recomputed first
        recompute, new = second.frames
        assert isinstance(recompute, RecomputeFrame) and (recompute.offset, recompute.end) == (12, 15)
        assert isinstance(new, SegmentFrame) and (new.offset, new.length, new.segment, new.modality) == (15, 5, 3, "text")
        assert recompute.keys == () and new.keys == second.keys[3:] == second.new_keys
        prefill(kv, second)


@sync
async def test_the_same_image_in_another_session_skips_the_encoder_and_matches_its_pages(pool):
    model = Model()
    matcher = model.matcher()
    async with session(pool, "s1", "a") as kv:
        prefill(kv, await matcher.full(kv, TURN_1))
    async with session(pool, "s2", "b") as kv:
        plan = await matcher.full(kv, TURN_1)
    assert model.encoded == [IMAGE_A] and plan.encoder_hits == 1
    assert plan.hit_pages == 3 and plan.history_tokens == 0  # session s2 had no history: the hit is the pool's
    assert [type(frame) for frame in plan.frames] == [SegmentFrame] and plan.frames[0].offset == 12


@sync
async def test_another_image_with_the_same_text_does_not_match_past_the_image(pool):
    model = Model()
    matcher = model.matcher()
    async with session(pool, "s1", "a") as kv:
        first = await matcher.full(kv, TURN_1)
        prefill(kv, first)
    other = [TURN_1[0], Media("image", IMAGE_B), TURN_1[2]]
    async with session(pool, "s1", "b") as kv:
        second = await matcher.full(kv, other)
    # the ids are the same everywhere (the placeholder at media positions): only the image differs
    assert second.n_tokens == first.n_tokens and second.hidden().shape == first.hidden().shape
    assert first.history.ids == second.history.ids
    assert second.hit_pages == 1  # page 0 is text; page 1 (positions 4..7) holds the image from position 6
    assert second.keys[0] == first.keys[0] and all(a != b for a, b in zip(first.keys[1:], second.keys[1:], strict=True))
    assert second.history_tokens == 6  # the text before the image repeats the session's history
    assert [(frame.kind, frame.offset, frame.length) for frame in second.frames] == [
        ("recompute", 4, 2),  # its positions on the page the image changed: history that missed
        ("segment", 6, 4),
        ("segment", 10, 5),
    ]


@sync
async def test_an_image_starting_a_page_keeps_every_page_before_it(pool):
    model = Model()
    matcher = model.matcher()
    text = Text(list(range(50, 58)))  # two full pages
    async with session(pool, "s1", "a") as kv:
        prefill(kv, await matcher.full(kv, [text, Media("image", IMAGE_A), Text([1, 2, 3, 4])]))
    async with session(pool, "s2", "b") as kv:
        plan = await matcher.full(kv, [text, Media("image", IMAGE_B), Text([1, 2, 3, 4])])
    assert plan.hit_pages == 2 and plan.frames[0].offset == 8


@sync
async def test_evicted_kv_is_recomputed_from_emb_and_gives_the_same_embeddings_and_keys():
    pool = make_pool(device=8, host=0)  # no lower tier: a page L1 drops is gone
    try:
        model = Model()
        matcher = model.matcher()
        async with session(pool, "s1", "turn1") as kv:
            first = await matcher.incremental(kv, TURN_1)
            written = prefill(kv, first)
        async with session(pool, "s2", "other") as kv:  # another session fills L1: s1's idle pages go
            prefill(kv, await matcher.full(kv, [Text(list(range(1000, 1032)))]))
        assert all(pool.l1.slot_of(key) is None for key in first.keys)
        calls = len(model.embedded)
        async with session(pool, "s1", "turn2") as kv:
            second = await matcher.incremental(kv, [Text([5, 6, 7])])
            assert model.encoded == [IMAGE_A]  # layer 1 (emb) was kept: nothing of the history is encoded again
            assert model.embedded[calls:] == [[5, 6, 7]]
            assert second.hit_pages == 0 and second.keys[:3] == first.keys
            recompute = second.frames[0]
            assert isinstance(recompute, RecomputeFrame) and (recompute.offset, recompute.length) == (0, 15)
            assert torch.equal(recompute.hidden, first.hidden())
            rewritten = prefill(kv, second)
        for page in range(3):  # the K/V rebuilt from emb is what turn 1 computed
            assert same_pages(rewritten[page], written[page])
        assert matcher.statistics()["recomputed_tokens"] == 15
    finally:
        pool.close()


@sync
async def test_two_sessions_sending_one_image_at_once_run_its_encoder_once(pool):
    started, gate = asyncio.Event(), asyncio.Event()
    runs = []

    async def slow_encoder(payload):
        runs.append(payload)
        started.set()
        await gate.wait()  # both requests are waiting on this forward now
        return torch.ones(4, HIDDEN)

    model = Model()
    matcher = model.matcher()
    matcher.encoders["image"] = slow_encoder

    async def request(name):
        async with session(pool, name, f"{name}-r") as kv:
            return await matcher.full(kv, [Text([1, 2]), Media("image", b"one picture")])

    both = asyncio.gather(request("s1"), request("s2"))
    await started.wait()
    gate.set()
    first, second = await both
    assert len(runs) == 1
    assert sorted([first.encoded, second.encoded]) == [0, 1]
    stats = matcher.statistics()["encoders"]["image"]
    assert (stats["misses"], stats["joins"], stats["hits"]) == (1, 1, 0)
    assert first.keys == second.keys


@sync
async def test_media_with_its_hidden_states_from_upstream_needs_no_encoder(pool):
    model = Model()
    matcher = model.matcher()
    rows = torch.arange(5 * HIDDEN, dtype=torch.float32).reshape(5, HIDDEN)
    async with session(pool, "s1", "a") as kv:
        plan = await matcher.full(kv, [Media("audio", content=content_hash(b"clip"), hidden=rows), Text([3, 4, 5])])
    assert model.encoded == [] and plan.segments[0].length == 5 and torch.equal(plan.hidden(0, 5), rows)
    async with session(pool, "s1", "b") as kv:
        with pytest.raises(PrefixError, match="no encoder for modality 'audio'"):
            await matcher.full(kv, [Media("audio", payload=b"clip")])
        with pytest.raises(PrefixError, match="neither a payload to encode nor hidden states"):
            await matcher.full(kv, [Media("image")])
        with pytest.raises(PrefixError, match="audio segment has no content hash.*content_hash"):
            await matcher.full(kv, [Media("audio", hidden=rows)])
        with pytest.raises(PrefixError, match="3 positions came with 2 rows"):
            await matcher.full(kv, [Text([1, 2, 3], hidden=torch.zeros(2, HIDDEN))])
        with pytest.raises(PrefixError, match="hidden size"):
            await matcher.full(kv, [Text([1, 2]), Media("audio", content=content_hash(b"x"), hidden=torch.zeros(2, 4))])
        with pytest.raises(PrefixError, match="holds no segment"):
            await matcher.full(kv, [])
    assert matcher.history("s1").n_tokens == 8  # a refused request leaves the history as it was


segment_lists = st.lists(
    st.one_of(
        st.lists(st.integers(0, 50), min_size=1, max_size=9).map(Text),
        st.sampled_from([b"\x00p", b"\x01q", b"\x02r", b"\x03s"]).map(lambda payload: Media("image", payload)),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turn_1=segment_lists, turn_2=segment_lists, cut=st.floats(0, 1), evict=st.booleans())
def test_frames_cover_the_sequence_exactly_once_in_order(turn_1, turn_2, cut, evict):
    asyncio.run(_cover(turn_1, turn_2, cut, evict))


async def _cover(turn_1, turn_2, cut, evict):
    pool = make_pool(device=64)
    try:
        model = Model()
        matcher = model.matcher()
        async with session(pool, "s", "t1") as kv:
            prefill(kv, await matcher.incremental(kv, turn_1))
        if evict:
            pool.release("t1")
            pool.l1.remove([key for key in matcher.history("s").keys if pool.l1.slot_of(key) is not None])
        history = matcher.history("s")
        boundaries = sorted({0, history.n_tokens} | {item.offset for item in history.placed})
        step = boundaries[int(cut * (len(boundaries) - 1))]
        async with session(pool, "s", "t2") as kv:
            plan = await matcher.incremental(kv, turn_2, step=step)
            position = plan.hit_tokens
            for index, frame in enumerate(plan.frames):
                assert frame.offset == position and frame.length > 0
                assert isinstance(frame, RecomputeFrame) == (index == 0 and plan.hit_tokens < plan.history_tokens)
                assert torch.equal(frame.hidden, plan.hidden(frame.offset, frame.end))
                assert frame.tokens == tuple(plan.history.ids[frame.offset : frame.end])
                position = frame.end
            assert position == plan.n_tokens
            segment_frames = [frame for frame in plan.frames if isinstance(frame, SegmentFrame)]
            assert [frame.segment for frame in segment_frames] == sorted({frame.segment for frame in segment_frames})
            assert sum((frame.keys for frame in plan.frames), ()) == plan.new_keys
            if evict:
                assert plan.hit_pages == 0
            else:  # the pages wholly before the cut keep their keys, so turn 1's K/V serves them
                assert plan.hit_pages >= step // P
    finally:
        pool.close()
