"""Incremental matching's `step` (flowrt.compute.prefix), case by case, each expected outcome
derived from the Omni-Flow paper's §5.1 (quoted next to the case):

    "Incremental Matching applies when the input references prior modal outputs whose token IDs
    cannot be recovered by re-parsing. The client carries a `step` offset declaring its
    already-acquired data position; the server truncates history to that position and processes
    only the new incremental data. A negative or absent `step` degrades to an append semantic that
    consumes all current history."

Every case starts from the same turn 1, prefilled into a real pool: text 10..14 (positions 0..4),
then an image of 4 positions (5..8): a history of 9 positions, pages 0 and 1 (positions 0..7)
cached, position 8 on a partial page."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the KV pool's tiers are torch tensors (the torch extra)")

from flowrt.compute.hashing import page_hashes  # noqa: E402
from flowrt.compute.prefix import (  # noqa: E402
    Media,
    MediaSegment,
    PrefixError,
    PrefixMatcher,
    RecomputeFrame,
    SegmentFrame,
    Text,
    TextSegment,
)
from flowrt.compute.prefix_segments import sequence_keys  # noqa: E402
from flowrt.errors import BadInput  # noqa: E402
from tests.compute.test_prefix_support import HIDDEN, Model, P, make_pool, page_kv, prefill, session, sync  # noqa: E402

IMAGE = b"\x01 a photo"  # 4 positions (tests.compute.test_prefix_support.image_rows)
OTHER_IMAGE = b"\x02 a drawing"  # 5 positions
TURN_1 = [Text([10, 11, 12, 13, 14]), Media("image", IMAGE)]
NEW = [Text([1, 2, 3])]


class Conversation:
    """Turn 1 prefilled; `turn_2` plans the next request of the same session."""

    def __init__(self):
        self.pool = make_pool()
        self.model = Model()
        self.matcher = self.model.matcher()
        self.turns = 0

    async def start(self):
        self.first = await self.turn(TURN_1)
        assert (self.first.n_tokens, len(self.first.keys)) == (9, 2)
        self.embedded = len(self.model.embedded)
        return self

    async def turn(self, inputs, **step):
        self.turns += 1
        async with session(self.pool, "s", f"turn{self.turns}") as kv:
            plan = await self.matcher.incremental(kv, inputs, **step)
            prefill(kv, plan)
        return plan

    def new_embeddings(self):
        return self.model.embedded[self.embedded :]


@pytest.fixture
def conversation():
    made = Conversation()
    yield made
    made.pool.close()


# "A negative or absent `step` degrades to an append semantic that consumes all current history."
# The whole history (9 positions) stays and the new text follows it; so does a `step` equal to the
# history's length ("truncates history to that position": at its end, nothing is cut).
@pytest.mark.parametrize("step", [{}, {"step": None}, {"step": -1}, {"step": -100}, {"step": 9}], ids=str)
@sync
async def test_absent_negative_or_full_length_step_appends_to_the_whole_history(conversation, step):
    await conversation.start()
    plan = await conversation.turn(NEW, **step)
    assert plan.segments == (
        TextSegment((10, 11, 12, 13, 14)),
        MediaSegment("image", conversation.first.segments[1].content, 4),
        TextSegment((1, 2, 3)),
    )
    assert (plan.step, plan.history_tokens, plan.n_tokens) == (9, 9, 12)
    assert plan.keys[:2] == conversation.first.keys and plan.hit_pages == 2
    # position 8 (the partial page) is history that missed; the new text is one segment frame
    assert [(type(f), f.offset, f.length) for f in plan.frames] == [(RecomputeFrame, 8, 1), (SegmentFrame, 9, 3)]


# "... processes only the new incremental data": the history's image is not encoded again and
# only the new tokens are embedded.
@sync
async def test_only_the_new_data_is_encoded(conversation):
    await conversation.start()
    await conversation.turn([Text([1, 2]), Media("image", OTHER_IMAGE), Text([4])])
    assert conversation.model.encoded == [IMAGE, OTHER_IMAGE]
    assert conversation.new_embeddings() == [[1, 2], [4]]


# "the server truncates history to that position": step 5 keeps positions 0..4 (the text) and
# drops the image; the new text follows position 4. Page 0 (positions 0..3) is unchanged and hits;
# page 1 now holds 14, 1, 2, 3 instead of the image, so it misses.
@sync
async def test_step_before_a_media_segment_drops_it(conversation):
    await conversation.start()
    plan = await conversation.turn(NEW, step=5)
    assert plan.segments == (TextSegment((10, 11, 12, 13, 14)), TextSegment((1, 2, 3)))
    assert (plan.step, plan.history_tokens, plan.n_tokens) == (5, 5, 8)
    assert plan.keys == tuple(page_hashes([10, 11, 12, 13, 14, 1, 2, 3], P))  # text only again: plain keys
    assert plan.keys[0] == conversation.first.keys[0] and plan.keys[1] != conversation.first.keys[1]
    assert plan.hit_pages == 1
    assert [(type(f), f.offset, f.length) for f in plan.frames] == [(RecomputeFrame, 4, 1), (SegmentFrame, 5, 3)]
    assert conversation.model.encoded == [IMAGE] and conversation.new_embeddings() == [[1, 2, 3]]
    assert conversation.matcher.history("s").n_tokens == 8  # the history is now what the client holds, plus the new data


# "truncates history to that position": a position inside a text run cuts the run there.
@sync
async def test_step_inside_text_cuts_the_text(conversation):
    await conversation.start()
    plan = await conversation.turn([Media("image", IMAGE)], step=3)
    assert plan.segments[0] == TextSegment((10, 11, 12)) and plan.segments[1].length == 4 and plan.n_tokens == 7
    assert torch.equal(plan.hidden(0, 3), conversation.first.hidden(0, 3))  # the kept rows are turn 1's emb
    assert plan.hit_pages == 0  # page 0 held 13 at position 3; now the image starts there
    assert conversation.model.encoded == [IMAGE]  # the image is new data again, but the cache has it
    assert conversation.matcher.statistics()["encoders"]["image"]["hits"] == 1


# "the server truncates history to that position": step 0 holds nothing, so nothing of the
# history is kept; the sequence is the new data alone.
@sync
async def test_step_zero_starts_over(conversation):
    await conversation.start()
    plan = await conversation.turn(NEW + [Text([4, 5, 6, 7, 8])], step=0)
    assert plan.segments == (TextSegment((1, 2, 3)), TextSegment((4, 5, 6, 7, 8)))
    assert (plan.history_tokens, plan.hit_pages) == (0, 0)
    assert plan.keys == tuple(page_hashes([1, 2, 3, 4, 5, 6, 7, 8], P))
    assert [f.kind for f in plan.frames] == ["segment", "segment"]


# "its already-acquired data position": the client cannot hold a position the history does not
# have; a step past the end is refused, before any encoder runs, and the history stays.
@sync
async def test_a_step_beyond_the_history_is_refused(conversation):
    await conversation.start()
    async with session(conversation.pool, "s", "bad") as kv:
        with pytest.raises(
            PrefixError, match=r"step 10 is beyond the history of session 's', which holds 9 positions.*0\.\.9"
        ) as raised:
            await conversation.matcher.incremental(kv, [Media("image", OTHER_IMAGE)], step=10)
        assert isinstance(raised.value, BadInput)  # the client's step: a role that lets it through answers 400
        with pytest.raises(PrefixError, match="step must be an int"):
            await conversation.matcher.incremental(kv, NEW, step="5")
    assert conversation.model.encoded == [IMAGE] and conversation.matcher.history("s").n_tokens == 9


# "declaring its already-acquired data position": a media item reaches the client whole, so a
# position inside one is not a position the client can hold; it is refused, naming both ends.
@sync
async def test_a_step_inside_a_media_segment_is_refused(conversation):
    await conversation.start()
    async with session(conversation.pool, "s", "bad") as kv:
        with pytest.raises(PrefixError, match=r"inside the image segment at positions 5\.\.9.*step=5.*step=9"):
            await conversation.matcher.incremental(kv, NEW, step=7)


# "truncates history to that position": with no history there is nothing to truncate at a
# position > 0; a request with no step (append) or step 0 starts the history.
@sync
async def test_a_session_without_history_accepts_only_append_or_zero():
    pool = make_pool()
    try:
        matcher = Model().matcher()
        async with session(pool, "fresh", "a") as kv:
            with pytest.raises(PrefixError, match="no history in this process.*full matching"):
                await matcher.incremental(kv, NEW, step=4)
            for step in (None, -1, 0):
                matcher.forget("fresh")
                plan = await matcher.incremental(kv, NEW, step=step)
                assert (plan.history_tokens, plan.n_tokens) == (0, 3)
    finally:
        pool.close()


# "Incremental Matching applies when the input references prior modal outputs whose token IDs
# cannot be recovered by re-parsing. The client carries a `step` offset declaring its
# already-acquired data position": turn 1's answer was a generated image (hidden states only, no
# payload to re-encode); the client holds it, so turn 2 sends step = the end of that image and
# its new text. The image's positions and pages are kept, matched, not recomputed.
@sync
async def test_a_generated_output_is_kept_up_to_the_step(conversation):
    await conversation.start()
    generated = torch.arange(6 * HIDDEN, dtype=torch.float32).reshape(6, HIDDEN)
    async with session(conversation.pool, "s", "decode") as kv:
        new = conversation.matcher.record_output("s", Media("image", hidden=generated))
        assert (new.first_page, len(new.keys), new.n_tokens) == (2, 1, 15)  # page 2 (positions 8..11) became whole
        history = conversation.matcher.history("s")
        (slot,) = kv.allocate(list(new.keys))
        for view, value in zip(kv.view(None, slot), page_kv(history.rows_between(8, 12)), strict=True):
            view.copy_(value)
        kv.commit(list(new.keys), start=new.first_page)
    plan = await conversation.turn(NEW, step=15)
    assert plan.segments[2].modality == "image" and plan.segments[2].length == 6
    assert torch.equal(plan.hidden(9, 15), generated) and plan.hit_pages == 3
    assert [(type(f), f.offset, f.length) for f in plan.frames] == [(RecomputeFrame, 12, 3), (SegmentFrame, 15, 3)]
    assert conversation.model.encoded == [IMAGE]
    # and a client that dropped the generated image (step at its start) gets it cut off
    again = await conversation.turn(NEW, step=9)
    assert [segment.modality for segment in again.segments] == ["text", "image", "text"] and again.n_tokens == 12


# "truncates history to that position and processes only the new incremental data": cutting
# then appending gives the same sequence, keys and hit as sending that sequence whole.
@sync
async def test_truncate_then_append_equals_the_sequence_sent_whole(conversation):
    await conversation.start()
    rest = [Media("image", OTHER_IMAGE), Text([7, 7, 7])]
    plan = await conversation.turn(rest, step=5)
    direct = [TextSegment((10, 11, 12, 13, 14)), *plan.segments[1:]]
    assert list(plan.segments) == direct and plan.keys == tuple(sequence_keys(direct, P))
    async with session(conversation.pool, "elsewhere", "w") as kv:
        whole = await Model().matcher().full(kv, [Text([10, 11, 12, 13, 14]), *rest])
    assert whole.keys == plan.keys and whole.hit_pages == len(plan.keys)  # the pool has what turn 2 computed
    assert torch.equal(whole.hidden(), plan.hidden())


# Not from the paper: a token embedder giving numpy arrays beside an encoder giving tensors (a
# user's mix) must still cut frames that span both kinds of segment.
@sync
async def test_a_frame_across_numpy_text_rows_and_tensor_image_rows():
    model = Model()
    matcher = PrefixMatcher(embed_tokens=lambda ids: model.embed_tokens(ids).numpy(), encoders={"image": model.encode_image})
    pool = make_pool()
    try:
        async with session(pool, "s", "turn1") as kv:
            first = await matcher.incremental(kv, TURN_1 + [Text([20, 21])])
            prefill(kv, first)
        async with session(pool, "s", "turn2") as kv:
            plan = await matcher.incremental(kv, NEW, step=10)  # cuts inside the last text run
        rows = plan.hidden(0, plan.n_tokens)
        assert isinstance(rows, torch.Tensor) and rows.shape == (13, HIDDEN)
        recompute = [frame for frame in plan.frames if isinstance(frame, RecomputeFrame)]
        assert recompute and torch.equal(torch.as_tensor(recompute[0].hidden), rows[recompute[0].offset : recompute[0].end])
    finally:
        pool.close()
