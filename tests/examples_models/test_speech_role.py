"""flowstd.roles.speech's reader, without a deployment: a text becomes its token ids, one
`spoken` frame each, the last marked; an OpenAI speech body's `input` is read; an empty text,
a text that is not a string and one past MAX_SPEECH_TOKENS are BadInputs naming the fix; and a
lone surrogate is the tokenizer's BadInput (a 400, found by a fault trial as a 500)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("torch", reason="the voice roles run on torch: pip install 'flowc[models]'")
pytest.importorskip("tokenizers", reason="the roles tokenize with flowstd.tokenizer: pip install 'flowc[models]'")

from flowrt import BadInput  # noqa: E402
from flowstd.roles import speech  # noqa: E402
from flowstd.tokenizer import Tokenizer, TokenizerError  # noqa: E402


def read(value) -> list[dict]:
    reader = speech.Reader()

    async def run():
        await reader.setup(None)
        return [frame async for frame in reader.read(None, value)]

    return asyncio.run(run())


def test_a_text_is_its_token_ids_in_order_with_the_last_marked():
    ids = Tokenizer.load().encode("hello there")
    frames = read({"model": "say", "input": "hello there", "voice": "alloy"})
    assert [f["spoken"] for f in frames] == [{"token": t, "index": i, "last": i == len(ids) - 1} for i, t in enumerate(ids)]
    assert read("hello there") == frames


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "the text to speak is empty"),
        ({"input": 5}, "a string (`input`), not int"),
        ("🐱" * 400, f"the reader speaks at most {speech.MAX_SPEECH_TOKENS} at once"),
        ("\ud800 hi", "lone surrogate"),
    ],
)
def test_a_text_the_reader_cannot_speak_is_a_bad_input(value, words):
    with pytest.raises(BadInput) as raised:
        read(value)
    assert words in str(raised.value)
    assert issubclass(TokenizerError, BadInput)
