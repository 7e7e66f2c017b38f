"""The roles of lib/tokenizer.flow called directly: what each yields, the detokenizer's state
across frames and calls, and clear errors."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

pytest.importorskip("tokenizers", reason="the flowstd tokenizer needs `tokenizers`: pip install 'flowc[models]'")

from flowstd.roles.tokenizer import STATE, ChatTokenizer, StreamDetokenizer, TextTokenizer  # noqa: E402
from flowstd.tokenizer import Tokenizer, TokenizerError  # noqa: E402

TOKENIZER = Tokenizer.load()


def context(call_id: int, state: dict) -> SimpleNamespace:
    return SimpleNamespace(call_id=call_id, globals={STATE: state})


def frames(role: StreamDetokenizer, ctx, values: list) -> list:
    async def run():
        return [await role.detokenize(ctx, generated_tokens=value) for value in values]

    return asyncio.run(run())


def test_the_tokenizers_yield_the_template_ids_media_and_plain_ids():
    messages = [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}]}]
    out = asyncio.run(ChatTokenizer().tokenize(None, messages=messages))
    prompt = TOKENIZER.apply_chat_template(messages)
    assert out == {"chat_tokens": prompt.ids, "chat_media": [m.as_json() for m in prompt.media]}
    position = 2 + len(TOKENIZER.encode("look"))  # after <|bos|> <|user|> look
    assert out["chat_media"] == [{"kind": "image", "position": position, "message": 0, "part": 1, "source": {"url": "u"}}]
    assert asyncio.run(TextTokenizer().tokenize(None, text="a red cat")) == {"text_tokens": TOKENIZER.encode("a red cat")}


def test_the_detokenizer_holds_a_split_character_across_frames_in_the_session_state():
    ids = TOKENIZER.encode("ok 🎉!")
    state: dict = {}
    out = frames(StreamDetokenizer(), context(1, state), [[i] for i in ids])
    deltas = [o["text_delta"] for o in out if o is not None]
    assert "".join(deltas) == "ok 🎉!"
    assert "🎉" in deltas  # whole, in one delta
    assert sum(o is None for o in out) == 3  # the emoji's first three byte tokens complete nothing
    assert state == {"call": 1, "pending": b""}


def test_a_frame_may_carry_one_id_a_list_or_an_array_and_eos_flushes():
    ids = TOKENIZER.encode("é")  # two byte tokens
    state: dict = {}
    role, ctx = StreamDetokenizer(), context(7, state)
    assert frames(role, ctx, [ids[0]]) == [None]
    assert state["pending"] == "é".encode()[:1]
    assert frames(role, ctx, [(ids[1], TOKENIZER.eos_id)]) == [{"text_delta": "é"}]
    # the stream stopped mid-character: eos makes it U+FFFD, as decode does, and clears the state
    assert frames(role, ctx, [[ids[0], TOKENIZER.eos_id, *TOKENIZER.encode("x")]]) == [{"text_delta": "\ufffdx"}]
    assert state["pending"] == b""


def test_a_new_call_starts_a_new_stream():
    ids = TOKENIZER.encode("é")
    state: dict = {}
    role = StreamDetokenizer()
    frames(role, context(1, state), [ids[0]])  # call 1 ended mid-character (cancelled, say)
    assert frames(role, context(2, state), [TOKENIZER.encode("ok")]) == [{"text_delta": "ok"}]
    assert state == {"call": 2, "pending": b""}


def test_array_frames_are_read_as_lists():
    np = pytest.importorskip("numpy")
    out = frames(StreamDetokenizer(), context(1, {}), [np.array(TOKENIZER.encode("hi")), np.int64(TOKENIZER.encode("!")[0])])
    assert out == [{"text_delta": "hi"}, {"text_delta": "!"}]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("hi", "generated_tokens must be a token id or a list of them, not str"),
        (None, "generated_tokens must be a token id or a list of them, not NoneType"),
        ([1, 9999], r"generated_tokens\[1\] is 9999, outside the vocabulary"),
        (True, "generated_tokens must be a token id or a list of them, not bool"),
    ],
)
def test_bad_frames_get_a_clear_error(value, message):
    with pytest.raises(TokenizerError, match=message):
        frames(StreamDetokenizer(), context(1, {}), [value])


def test_without_its_global_the_detokenizer_says_which_to_declare():
    ctx = SimpleNamespace(call_id=1, globals={})
    with pytest.raises(TokenizerError, match=f"must declare `uses {STATE}`"):
        frames(StreamDetokenizer(), ctx, [[1]])
