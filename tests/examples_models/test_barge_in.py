"""Barge-in on flowstd's `llm` (docs/stdlib.md, "Barge-in"): examples/chat's graph made
`interruptible`; turn 1 streams a long reply, its caller stops reading after a number of text
deltas, and turn 2 (the reply as far as it was heard, and a new question) interrupts it. Turn 2's
prompt reuses exactly the KV pages of turn 1's prompt and the tokens whose deltas were taken:
the engine's counters say `reused_tokens` = the full pages of (turn 1's prompt + delivered ids),
more than turn 1's prompt alone, and the interrupted reply's caller got nothing after what it took."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import HAVE_MODELS, NO_MODELS, REPO
from tests.runtime.harness import bundle_of

pytestmark = pytest.mark.skipif(not HAVE_MODELS, reason=NO_MODELS)

PAGE_TOKENS = 16  # flowstd's lib/kvcache.flow
TAKEN = 20  # text deltas the caller of turn 1 takes before the barge-in: more than a page of ids
BUDGET = 400  # turn 1's reply is still being generated when turn 2 comes
TURN_1 = [
    {"role": "system", "content": "You answer questions about flowc, the workflow compiler."},
    {"role": "user", "content": "How does a role reuse the KV cache of a session across turns?"},
]
# examples/chat, whose calls may be interrupted; `ids` streams the generated ids themselves
FLOW = (REPO / "examples" / "chat" / "pipeline.flow").read_text(encoding="utf-8").replace(
    "    return generation\n}", "    return generation\n    interruptible\n}"
) + (
    """
graph ids {
    entry  messages
    stream generated_tokens ordered
    return generation
    allow W210
}
"""
)


def turn_two(heard: str) -> list[dict]:
    return [*TURN_1, {"role": "assistant", "content": heard}, {"role": "user", "content": "And after that?"}]


async def barge_in(path) -> tuple[list[dict], list[dict]]:
    from flowrt.deploy import open_deployment

    deployment = await open_deployment(path, "inproc")
    try:
        runtime = deployment.runtime
        first: list[dict] = []
        heard = asyncio.Event()
        resume = asyncio.Event()

        async def read():
            async for event in runtime.call("chat", {"messages": {"messages": TURN_1, "max_tokens": BUDGET}}, session="s"):
                first.append(event)
                if sum(e["event"] == "stream" for e in first) == TAKEN:
                    heard.set()
                    await resume.wait()  # the user is still listening to these when they talk over them

        reading = asyncio.ensure_future(read())
        await asyncio.wait_for(heard.wait(), 60)
        text = "".join(e["value"] for e in first if e["event"] == "stream")
        request = {"messages": turn_two(text), "max_tokens": 4}
        second = [e async for e in runtime.call("chat", {"messages": request}, session="s", interrupt=True, timeout=60)]
        resume.set()
        await asyncio.wait_for(reading, 60)
        return first, second
    finally:
        await deployment.close()


async def reply_ids(path) -> list[int]:
    """Turn 1's reply as ids, on a deployment of its own (greedy: the same ids)."""
    from flowrt.deploy import open_deployment

    deployment = await open_deployment(path, "inproc")
    try:
        events = [e async for e in deployment.runtime.call("ids", {"messages": {"messages": TURN_1, "max_tokens": BUDGET}})]
        return [token for e in events if e["event"] == "stream" for token in e["value"]]
    finally:
        await deployment.close()


def test_the_turn_after_a_barge_in_reuses_the_pages_of_what_was_delivered(tmp_path):
    from flowstd.tokenizer import Tokenizer

    path = bundle_of(FLOW, tmp_path)
    first, second = asyncio.run(barge_in(path))
    assert (first[-1]["status"], first[-1]["reason"], first[-1]["missing"]) == ("cancelled", "interrupted", ["generation"])
    deltas = [e["value"] for e in first if e["event"] == "stream"]
    assert len(deltas) == TAKEN  # nothing after what was taken
    assert second[-1]["status"] == "ok", second[-1]
    (generation,) = [e["value"] for e in second if e["event"] == "return"]

    tokenizer = Tokenizer.load()
    ids = asyncio.run(reply_ids(path))
    delivered = next(n for n in range(len(ids) + 1) if tokenizer.decode(ids[:n]) == "".join(deltas))
    prompt = len(tokenizer.apply_chat_template(TURN_1).ids)
    assert generation["reused_tokens"] == (prompt + delivered) // PAGE_TOKENS * PAGE_TOKENS > prompt // PAGE_TOKENS * PAGE_TOKENS
    assert generation["computed_tokens"] == generation["prompt_tokens"] - generation["reused_tokens"]
