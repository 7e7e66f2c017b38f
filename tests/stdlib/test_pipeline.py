"""A user's pipeline that imports the standard `tokenizer` module, compiled and run end to end:
chat messages in, the template's ids through the user's model role, an ordered stream of
whole-character text deltas out; on the embedded runtime (`--deploy inproc`) and under
`--deploy local`, where the detokenizer's state crosses processes with the session."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("tokenizers", reason="the flowstd tokenizer needs `tokenizers`: pip install 'flowc[models]'")

from flowc.check import check_source  # noqa: E402
from flowrt.control import Runtime  # noqa: E402
from flowstd.tokenizer import Tokenizer  # noqa: E402
from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, deployed  # noqa: E402
from tests.runtime.harness import collect, done, returned, streamed  # noqa: E402

FLOW = """
flow echo_chat

import tokenizer

role echo {
    impl "MODULE:Echo"
    interface generate {
        in  chat_tokens & chat_media
        out stream generated_tokens: Tokens
    }
}

graph chat {
    entry  messages
    stream text_delta ordered
    return chat_media
}
"""

# a stand-in model: it answers with the last user turn's ids, one id per frame, then <|eos|>
ECHO = """
class Echo:
    async def generate(self, ctx, chat_tokens, chat_media):
        start = len(chat_tokens) - 1 - chat_tokens[::-1].index(4)  # the last <|user|>
        end = chat_tokens.index(2, start)                          # its <|eos|>
        for token_id in chat_tokens[start + 1 : end]:
            yield {"generated_tokens": [token_id]}
        yield {"generated_tokens": [2]}
"""

TEXT = "héllo 🎉, 世界! a red cat"  # the emoji and the CJK characters span several byte tokens
IMAGE = {"url": "https://example.com/cat.png"}
MESSAGES = [
    {"role": "system", "content": "repeat after me"},
    {"role": "user", "content": [{"type": "text", "text": TEXT}, {"type": "image_url", "image_url": IMAGE}]},
]


def build(tmp_path, module: str):
    return bundle_with_roles(FLOW.replace("MODULE", module), ECHO, tmp_path, module=module)


def check_answer(events: list[dict], messages: list = MESSAGES, text: str = TEXT) -> None:
    assert done(events)["status"] == "ok", done(events)
    deltas = streamed(events, "text_delta")
    assert "".join(deltas) == text
    # a byte-wise detokenizer would send U+FFFD for the pieces of a split character
    assert all(delta and "\ufffd" not in delta for delta in deltas)
    ids = Tokenizer.load().encode(text)
    assert len(deltas) < len(ids)  # frames that complete no character send nothing
    prompt = Tokenizer.load().apply_chat_template(messages)
    assert returned(events)["chat_media"] == [m.as_json() for m in prompt.media]


def test_the_standard_tokenizer_module_checks_clean_when_imported():
    result = check_source(FLOW.replace("MODULE", "echo_roles"), "pipeline.flow")
    assert result.diagnostics == [], [f"{d.code} {d.message}" for d in result.diagnostics]
    assert result.program.roles["stream_detokenizer"].module == "tokenizer"
    assert "<stdlib>/tokenizer.flow" in result.sources


def test_chat_messages_stream_back_as_whole_characters_in_order_inproc(tmp_path):
    bundle = build(tmp_path, "echo_chat_inproc")

    async def main():
        runtime = await Runtime.open(bundle)
        try:
            check_answer(await collect(runtime, "chat", {"messages": MESSAGES}, session="s1"))
            # the session's next call starts a stream of its own; an OpenAI request body works too
            body = {"model": "chat", "messages": [{"role": "user", "content": "¿qué tal? 👋"}]}
            check_answer(await collect(runtime, "chat", {"messages": body}, session="s1"), body["messages"], "¿qué tal? 👋")
            # sessions run side by side, each with its own unfinished character
            texts = [f"{n} ✓ ünïcödé {'🙂' * n}" for n in range(1, 6)]
            answers = await asyncio.gather(
                *(collect(runtime, "chat", {"messages": t}, session=f"p{n}") for n, t in enumerate(texts))
            )
            for text, events in zip(texts, answers, strict=True):
                check_answer(events, [{"role": "user", "content": text}], text)
            # nothing left running; each session keeps its (empty) detokenizer state until evicted
            stats = runtime.statistics()
            assert stats.pop("sessions") == stats.pop("idle_sessions") == 6
            assert all(value == 0 for value in stats.values()), stats
        finally:
            await runtime.close()

    asyncio.run(main())


def test_bad_messages_fail_the_call_with_the_tokenizers_message(tmp_path):
    bundle = build(tmp_path, "echo_chat_bad")

    async def main():
        runtime = await Runtime.open(bundle)
        try:
            events = await collect(runtime, "chat", {"messages": [{"role": "tool", "content": "42"}]})
        finally:
            await runtime.close()
        (error,) = done(events)["errors"]
        assert (error["role"], error["interface"]) == ("chat_tokenizer", "tokenize")
        assert "messages[0].role is 'tool'; the chat template knows system, developer, user, assistant" in error["message"]

    asyncio.run(main())


def test_chat_messages_stream_back_under_local_deploy(tmp_path):
    bundle = build(tmp_path, "echo_chat_local")

    async def main():
        async with deployed(bundle) as deployment:
            check_answer(await collect(deployment.runtime, "chat", {"messages": MESSAGES}, session="s1"))
            await assert_clean_everywhere(deployment)

    asyncio.run(main())
