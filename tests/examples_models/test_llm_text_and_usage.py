"""flowstd's LLM paths stream whole characters and report their token counts (issue 33).

- `mm_llm` (lib/multimodal.flow) streams its text through the streaming detokenizer: ids that
  split a character (`é` is two byte tokens, `🙂` four) arrive as whole characters, never as
  U+FFFD. The ids are flowstd's tokenizer's own; the run is examples/image_chat_models on the
  embedded runtime, whose generator's sampled ids are replaced by those (everything else is the
  real generation).
- Over the OpenAI endpoint of a real `flowc run --http` server, the official openai client gets
  `usage.prompt_tokens` = the request's prompt positions (its text's tokens and 16 rows per
  image) and `usage.completion_tokens` = the tokens generated, streamed or not.
- Every flowstd LLM path (`llm`'s `generation`, `mm_llm`'s `usage`, the voice thinker's `turn`)
  reports both counts.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import sys

import pytest

from tests.conftest import HAVE_MODELS, NO_MODELS, REPO

pytestmark = pytest.mark.skipif(not HAVE_MODELS, reason=NO_MODELS)

if HAVE_MODELS:
    from tests.examples_models.test_media_roles import bundle, image_chat  # noqa: F401 - a fixture

QUESTION = "what is in this picture?"
IMAGE_ROWS = 16  # the multimodal ViT's rows for an image (32x32, flowstd.roles.multimodal.IMAGE_SIZE)
SPLIT_TEXT = "café 🙂"  # é: two byte tokens in flowstd's tokenizer, 🙂: four


def called(path, graph: str, inputs: dict) -> list[dict]:
    from flowrt.deploy import open_deployment

    async def run():
        deployment = await open_deployment(path, "inproc")
        try:
            return [event async for event in deployment.runtime.call(graph, inputs, timeout=60)]
        finally:
            await deployment.close()

    return asyncio.run(run())


def test_mm_llm_streams_a_character_split_over_tokens_whole(image_chat, monkeypatch):
    from flowrt.compute.engine.planned import PlannedGenerator
    from flowstd.tokenizer import Tokenizer

    tokenizer = Tokenizer.load()
    ids = tokenizer.encode(SPLIT_TEXT)
    alone = [tokenizer.decode([token], skip_special_tokens=False) for token in ids]
    assert alone.count("\ufffd") >= 6, alone  # the ids do split é and 🙂: each of their bytes alone is U+FFFD
    real = PlannedGenerator.generate

    async def scripted(self, kv, plan, *, on_token=None, **options):
        result = await real(self, kv, plan, **options)  # the real generation, prefill and decode
        for token in ids:  # ... whose sampled ids are these
            on_token(token)
        return result

    monkeypatch.setattr(PlannedGenerator, "generate", scripted)
    events = called(image_chat, "chat", {"request": {"segments": [{"type": "text", "text": QUESTION}]}})
    assert events[-1]["status"] == "ok", events[-1]
    pieces = [event["value"] for event in events if event.get("field") == "token"]
    assert "".join(pieces) == SPLIT_TEXT
    assert pieces == ["c", "a", "f", "é", " ", "🙂"]  # each as soon as it is whole, none as U+FFFD
    (usage,) = [event["value"] for event in events if event.get("field") == "usage"]
    assert usage["completion_tokens"] == len(ids)  # tokens, not text pieces


def image_file() -> bytes:
    import numpy
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(numpy.random.default_rng(5).integers(0, 256, (24, 40, 3), dtype=numpy.uint8)).save(out, format="PNG")
    return out.getvalue()


def test_the_openai_endpoint_reports_a_multimodal_graphs_prompt_and_completion_tokens(image_chat):
    import openai

    from flowstd.tokenizer import Tokenizer
    from tests.runtime.test_serve import serving

    url = "data:image/png;base64," + base64.b64encode(image_file()).decode()
    messages = [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}],
        }
    ]
    prompt = IMAGE_ROWS + len(Tokenizer.load().encode(QUESTION))  # what the LLM reads: the image's rows, the text's ids
    command = [sys.executable, "-m", "flowc", "run", str(image_chat), "--http", "127.0.0.1:0"]
    with serving(image_chat, command) as server:
        client = openai.OpenAI(base_url=f"http://{server.host}:{server.port}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="chat", messages=messages)
        assert reply.choices[0].finish_reason == "stop"
        usage = reply.usage
        assert usage.prompt_tokens == prompt > 0
        assert usage.completion_tokens == 8  # 4 greedy tokens after each segment
        assert usage.total_tokens == prompt + 8
        flow = reply.model_extra["flow"]
        assert [each["prompt_tokens"] for each in flow["usage"]] == [IMAGE_ROWS, prompt]  # the call so far, segment by segment
        assert [each["completion_tokens"] for each in flow["usage"]] == [4, 8]

        chunks = list(
            client.chat.completions.create(model="chat", messages=messages, stream=True, stream_options={"include_usage": True})
        )
        (counted,) = [chunk.usage for chunk in chunks if chunk.usage is not None]
        assert (counted.prompt_tokens, counted.completion_tokens) == (prompt, 8)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        assert text == reply.choices[0].message.content  # the same answer, streamed
        server.get("/stats?idle=30")


def test_every_flowstd_llm_path_reports_prompt_and_completion_tokens(image_chat, tmp_path):
    # mm_llm: the call's counts in each `usage` (above, over the endpoint); here a text-only call
    events = called(image_chat, "chat", {"request": {"segments": [{"type": "text", "text": QUESTION}]}})
    from flowstd.tokenizer import Tokenizer

    (usage,) = [event["value"] for event in events if event.get("field") == "usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(Tokenizer.load().encode(QUESTION)), 4)

    # the voice thinker: `turn`
    voice = bundle("voice_chat", tmp_path / "voice")
    request = json.loads((REPO / "examples" / "voice_chat" / "request.json").read_text())
    events = called(voice, "chat", request)
    assert events[-1]["status"] == "ok", events[-1]
    (turn,) = [event["value"] for event in events if event.get("field") == "turn"]
    assert turn["completion_tokens"] == turn["generated_tokens"] == len(turn["reply_tokens"]) > 0
    assert turn["prompt_tokens"] == turn["history_tokens"] - turn["completion_tokens"] > 0

    # llm: `generation` (the chat example)
    chat = bundle("chat", tmp_path / "chat")
    request = json.loads((REPO / "examples" / "chat" / "request.json").read_text())
    events = called(chat, "chat", request)
    assert events[-1]["status"] == "ok", events[-1]
    (generation,) = [event["value"] for event in events if event.get("field") == "generation"]
    assert generation["prompt_tokens"] > 0 and generation["completion_tokens"] == generation["generated_tokens"] > 0
