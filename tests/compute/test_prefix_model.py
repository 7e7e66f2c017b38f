"""The session history model of prefix matching (flowrt.compute.prefix_segments, prefix_history),
without a pool: page keys are a pure function of the content (text ids, and for media the
payload's hash and its place), cutting then appending equals building the sequence directly,
the histories are bounded, and bad segments are refused with the fix."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrt.compute.hashing import chain_root, content_hash, page_hashes
from flowrt.compute.prefix_history import History, HistoryStore
from flowrt.compute.prefix_segments import (
    MediaSegment,
    PrefixError,
    TextSegment,
    media_segment,
    page_extras,
    place,
    sequence_keys,
    text_segment,
)

np = pytest.importorskip("numpy")

P = 4
PAYLOADS = [content_hash(bytes([i])) for i in range(3)]


def rows_of(segment, width: int = 3):
    """Hidden states that depend only on the segment's content (as an encoder's would)."""
    if isinstance(segment, TextSegment):
        return np.array([[token, token + 0.5, -token] for token in segment.tokens], dtype=np.float32).reshape(-1, width)
    seed = int.from_bytes(segment.content[:4], "little")
    full = np.random.default_rng(seed).standard_normal((16, width)).astype(np.float32)
    return full[: segment.length]


def built(segments, page_tokens: int = P) -> History:
    history = History(page_tokens)
    history.append(segments, [rows_of(segment) for segment in segments])
    return history


segments_st = st.lists(
    st.one_of(
        st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=11).map(lambda ids: TextSegment(tuple(ids))),
        st.builds(MediaSegment, st.sampled_from(["image", "audio"]), st.sampled_from(PAYLOADS), st.integers(1, 9)),
    ),
    max_size=7,
)


def test_text_only_keys_are_the_plain_page_hashes():
    ids = list(range(7, 30))
    segments = [TextSegment(tuple(ids[:5])), TextSegment(tuple(ids[5:]))]
    assert sequence_keys(segments, P) == page_hashes(ids, P) == built(segments).keys


def test_keys_are_rooted_where_the_history_is():
    segments = [TextSegment(tuple(range(8)))]
    history = History(P, root=chain_root("model-a"))
    history.append(segments, [rows_of(segments[0])])
    assert history.keys == page_hashes(list(range(8)), P, parent=chain_root("model-a")) != sequence_keys(segments, P)


@settings(max_examples=60, deadline=None)
@given(segments=segments_st, page_tokens=st.integers(1, 6), chunking=st.randoms(use_true_random=False))
def test_keys_are_a_pure_function_of_the_content(segments, page_tokens, chunking):
    """Appending in any chunks gives the keys computed from scratch; so does another history."""
    whole = sequence_keys(segments, page_tokens)
    history = History(page_tokens)
    rest = list(segments)
    while rest:
        take = chunking.randint(1, len(rest))
        history.append(rest[:take], [rows_of(segment) for segment in rest[:take]])
        rest = rest[take:]
    assert history.keys == whole == built(segments, page_tokens).keys
    assert len(whole) == sum(segment.length for segment in segments) // page_tokens


@settings(max_examples=60, deadline=None)
@given(segments=segments_st, data=st.data())
def test_another_payload_changes_every_key_from_its_first_page_and_none_before(segments, data):
    media = [i for i, segment in enumerate(segments) if isinstance(segment, MediaSegment)]
    if not media:
        return
    index = data.draw(st.sampled_from(media))
    old = segments[index]
    other = data.draw(st.sampled_from([p for p in PAYLOADS if p != old.content]))
    changed = [*segments[:index], MediaSegment(old.modality, other, old.length), *segments[index + 1 :]]
    before, after = sequence_keys(segments, P), sequence_keys(changed, P)
    first_page = sum(segment.length for segment in segments[:index]) // P
    assert before[:first_page] == after[:first_page]
    assert all(a != b for a, b in zip(before[first_page:], after[first_page:], strict=True))


@settings(max_examples=60, deadline=None)
@given(segments=segments_st, data=st.data())
def test_cutting_then_appending_equals_building_the_sequence_directly(segments, data):
    history = built(segments)
    ends = [item.end for item in history.placed if isinstance(item.segment, MediaSegment)]
    starts = [item.offset for item in history.placed if isinstance(item.segment, MediaSegment)]
    media = [(a, b) for a, b in zip(starts, ends, strict=True)]
    positions = [s for s in range(history.n_tokens + 1) if not any(a < s < b for a, b in media)]
    step = data.draw(st.sampled_from(positions))
    rest = data.draw(segments_st)
    cut = history.copy()
    cut.truncate(step)
    cut.append(rest, [rows_of(segment) for segment in rest])
    kept = []
    for item in history.placed:  # the segments up to `step`, a text one cut short
        if item.offset < step:
            segment = item.segment
            kept.append(TextSegment(segment.tokens[: step - item.offset]) if item.end > step else segment)
    direct = built(kept + rest)
    assert cut.segments == direct.segments and cut.keys == direct.keys and cut.ids == direct.ids
    if cut.n_tokens:
        assert np.array_equal(cut.rows_between(0, cut.n_tokens), direct.rows_between(0, direct.n_tokens))
    assert history.n_tokens == sum(segment.length for segment in segments)  # the copy was cut, not the original


def test_media_pages_say_where_their_media_lies():
    # a text token equal to the placeholder (0) is not an image position
    text = [TextSegment((1, 2, 0, 0))]
    media = [TextSegment((1, 2)), MediaSegment("image", PAYLOADS[0], 2)]
    assert sequence_keys(text, P) != sequence_keys(media, P)
    # one image of 4 positions is not the same image's first 2 positions twice
    once = [MediaSegment("image", PAYLOADS[0], 4)]
    twice = [MediaSegment("image", PAYLOADS[0], 2), MediaSegment("image", PAYLOADS[0], 2)]
    assert sequence_keys(once, P) != sequence_keys(twice, P)
    # nor is it the same payload as audio
    assert sequence_keys(once, P) != sequence_keys([MediaSegment("audio", PAYLOADS[0], 4)], P)
    # pages without media have no extra; a page that two payloads share mixes in both
    two = [TextSegment((5, 6, 7, 8)), MediaSegment("image", PAYLOADS[0], 2), MediaSegment("image", PAYLOADS[1], 2)]
    extras = page_extras(place(two), P, 0, 2)
    assert sorted(extras) == [1]
    assert extras[1] != page_extras(place([two[0], two[1], MediaSegment("image", PAYLOADS[2], 2)]), P, 0, 2)[1]


def test_a_history_store_keeps_its_bounds_dropping_the_least_recently_used():
    segment = TextSegment(tuple(range(10)))  # 10 rows x 3 float32 = 120 bytes
    store = HistoryStore(max_bytes=300, max_sessions=3)
    for name in ("a", "b"):
        store.put(name, built([segment]))
    assert store.get("a") is not None  # a is now more recent than b
    store.put("c", built([segment]))  # 360 bytes > 300: b, the least recently used, goes
    assert "b" not in store and "a" in store and "c" in store and store.bytes == 240
    store.put("d", built([TextSegment((1,))]))
    store.put("e", built([TextSegment((2,))]))  # 4 sessions > 3: a goes
    assert "a" not in store and len(store) == 3
    assert store.statistics()["dropped_sessions"] == 2
    with pytest.raises(PrefixError, match="more than this process keeps.*raise the history store's max_bytes"):
        store.put("f", built([TextSegment(tuple(range(30)))]))
    assert store.forget("c") and not store.forget("c") and "c" not in store
    with pytest.raises(PrefixError, match="max_sessions"):
        HistoryStore(max_sessions=0)


def test_bad_segments_are_refused_with_the_fix():
    with pytest.raises(PrefixError, match="tokenize the text first"):
        text_segment("hello")
    with pytest.raises(PrefixError, match="not a token id"):
        text_segment([1, -1])
    with pytest.raises(PrefixError, match="leave it out"):
        text_segment([])
    with pytest.raises(PrefixError, match="has no content hash.*content_hash"):
        media_segment("image", None, 4)
    with pytest.raises(PrefixError, match="must be 16 bytes"):
        media_segment("image", b"short", 4)
    with pytest.raises(PrefixError, match="length is -2.*at least one position"):
        media_segment("image", PAYLOADS[0], -2)
    with pytest.raises(PrefixError, match="modality"):
        media_segment("text", PAYLOADS[0], 1)
    assert media_segment("image", PAYLOADS[0].hex(), 1).content == PAYLOADS[0]
    history = built([TextSegment((1, 2)), MediaSegment("image", PAYLOADS[0], 3)])
    with pytest.raises(PrefixError, match="one row per position"):
        history.append([TextSegment((1, 2))], [np.zeros((3, 3))])
    with pytest.raises(PrefixError, match="model's hidden size"):
        history.append([TextSegment((1, 2))], [np.zeros((2, 4))])
    with pytest.raises(PrefixError, match="beyond"):
        history.check_step(6, "s")
    with pytest.raises(PrefixError, match="inside the image segment at positions 2..5"):
        history.check_step(3, "s")
    assert history.n_tokens == 5 and history.keys == sequence_keys(history.segments, P)


def test_truncating_keeps_the_keys_of_the_pages_before_the_cut():
    rng = random.Random(3)
    segments = [TextSegment(tuple(rng.randrange(100) for _ in range(13)))]
    history = built(segments)
    keys = list(history.keys)
    for step in (13, 12, 9, 8, 3, 0):
        history.truncate(step)
        assert history.keys == keys[: step // P] and history.n_tokens == step
    assert history.placed == [] and history.hidden == []
