"""The streaming detokenizer: its deltas add up to `decode`, are whole characters, hold back only
an unfinished character, and go on across detokenizers through `pending`."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("tokenizers", reason="the flowstd tokenizer needs `tokenizers`: pip install 'flowc[models]'")

from flowstd.tokenizer import StreamDetokenizer, Tokenizer, TokenizerError  # noqa: E402

TOKENIZER = Tokenizer.load()
# ids anywhere in the vocabulary (special and byte tokens included: malformed UTF-8 is allowed),
# and ids weighted to the 256 byte tokens, where characters split across ids most
ANY_IDS = st.lists(st.integers(0, TOKENIZER.vocab_size - 1), max_size=30)
BYTE_IDS = st.lists(st.integers(8, 263), max_size=30)
IDS = st.one_of(ANY_IDS, BYTE_IDS)
# text far from the corpus (emoji, CJK, accents): its characters span several byte tokens
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


@settings(max_examples=300, deadline=None)
@given(IDS, st.booleans())
def test_the_deltas_and_finish_add_up_to_decode_of_all_ids(ids, skip):
    stream = TOKENIZER.stream_detokenizer(skip_special_tokens=skip)
    deltas = [stream.push(token_id) for token_id in ids]
    assert "".join(deltas) + stream.finish() == TOKENIZER.decode(ids, skip_special_tokens=skip)
    assert stream.pending == b""


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_deltas_of_encoded_text_are_whole_characters_in_order(text):
    ids = TOKENIZER.encode(text)
    stream = TOKENIZER.stream_detokenizer()
    shown = ""
    for token_id in ids:
        delta = stream.push(token_id)
        delta.encode("utf-8")  # whole characters only: no lone surrogate, nothing half-decoded
        assert "\ufffd" not in delta or "\ufffd" in text
        shown += delta
        assert text.startswith(shown)
        assert len(stream.pending) <= 3
    assert shown == text  # nothing is left held once the last character is complete
    assert stream.finish() == ""


@settings(max_examples=200, deadline=None)
@given(IDS, st.data())
def test_a_detokenizer_built_from_pending_goes_on_where_another_stopped(ids, data):
    cut = data.draw(st.integers(0, len(ids)))
    first = TOKENIZER.stream_detokenizer()
    head = first.extend(ids[:cut])
    second = StreamDetokenizer(TOKENIZER, pending=first.pending)
    assert head + second.extend(ids[cut:]) + second.finish() == TOKENIZER.decode(ids)


def test_a_character_split_across_tokens_is_held_until_complete():
    ids = TOKENIZER.encode("🎉")  # four bytes, none of them merged with another
    assert len(ids) == 4
    stream = TOKENIZER.stream_detokenizer()
    assert [stream.push(token_id) for token_id in ids[:3]] == ["", "", ""]
    assert stream.pending == "🎉".encode()[:3]
    assert stream.push(ids[3]) == "🎉"
    assert stream.tokens == 4


def test_finish_marks_an_unfinished_character_and_starts_a_new_stream():
    ids = TOKENIZER.encode("a🎉")
    stream = TOKENIZER.stream_detokenizer()
    assert stream.extend(ids[:-1]) == "a"
    assert stream.finish() == "\ufffd" == TOKENIZER.decode(ids[-4:-1])
    assert (stream.pending, stream.tokens) == (b"", 0)
    assert stream.extend(TOKENIZER.encode("ok")) == "ok"


def test_a_byte_that_can_never_start_a_character_is_not_held():
    invalid = TOKENIZER.token_bytes_table.index(b"\xff")
    stream = TOKENIZER.stream_detokenizer()
    assert stream.push(invalid) == "\ufffd" and stream.pending == b""


def test_special_tokens_are_skipped_or_spelled_as_decode_does():
    ids = [TOKENIZER.bos_id, *TOKENIZER.encode("hi"), TOKENIZER.eos_id]
    assert TOKENIZER.stream_detokenizer().extend(ids) == "hi"
    assert TOKENIZER.stream_detokenizer(skip_special_tokens=False).extend(ids) == "<|bos|>hi<|eos|>"


@pytest.mark.parametrize(
    ("pending", "message"),
    [
        (b"a", "is not the start of a UTF-8 character"),
        (b"\xff", "is not the start of a UTF-8 character"),
        (b"\xf0\x9f\x8e\x89", "at most 3"),
        ("\xf0", "must be the bytes of an incomplete character"),
    ],
)
def test_a_bad_pending_is_refused(pending, message):
    with pytest.raises(TokenizerError, match=message):
        StreamDetokenizer(TOKENIZER, pending=pending)


def test_bad_ids_are_refused_by_name():
    stream = TOKENIZER.stream_detokenizer()
    with pytest.raises(TokenizerError, match="token id is 5000, outside the vocabulary"):
        stream.push(5000)
    with pytest.raises(TokenizerError, match=r"token ids\[1\] must be an integer, not str"):
        stream.extend([1, "2"])
