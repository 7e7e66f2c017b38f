"""examples/image_chat_models on real deployments: two turns of one session under `--deploy inproc`
and `local` give the same events, and turn 2 reuses turn 1's KV pages and hits the ViT's encoder
cache (the counts the llm role streams as `usage`)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("torch", reason="the example's models run on torch")
pytest.importorskip("tokenizers", reason="the example tokenizes with flowstd.tokenizer")

from flowc.check import check_source  # noqa: E402
from flowc.codegen import build_bundle  # noqa: E402
from flowrt.deploy import open_deployment  # noqa: E402
from flowrt.values import summarize  # noqa: E402
from tests.conftest import REPO  # noqa: E402

EXAMPLE = REPO / "examples" / "image_chat_models"
TURN_1 = json.loads((EXAMPLE / "request.json").read_text())
IMAGE = TURN_1["request"]["segments"][1]
TURN_2 = {"request": {"segments": [{"type": "text", "text": "and the square?"}, IMAGE]}}


def bundle(directory):
    source = EXAMPLE / "pipeline.flow"
    result = check_source(source.read_text(), "pipeline.flow", source)
    assert result.ok, [f"{d.code} {d.message}" for d in result.diagnostics]
    build_bundle(result.program, source, directory).write(directory)
    return directory


async def two_turns(path, deploy: str) -> list[dict]:
    """Each turn's events as `flowc run` prints them, grouped by field in order (the return's
    place among the streams may vary)."""
    deployment = await open_deployment(path, deploy)
    try:
        turns = []
        for inputs in (TURN_1, TURN_2):
            events = [event async for event in deployment.runtime.call("chat", inputs, session="s1", timeout=60)]
            assert events[-1]["status"] == "ok", events[-1]
            fields: dict[str, list] = {}
            for event in events[:-1]:
                fields.setdefault(event["field"], []).append(summarize(event["value"]))
            turns.append(fields)
        return turns
    finally:
        await deployment.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = bundle(tmp_path_factory.mktemp("image_chat_models") / "bundle")
    return {deploy: asyncio.run(two_turns(path, deploy)) for deploy in ("inproc", "local")}


def test_turn_two_reuses_turn_one_pages_and_the_encoder_cache(runs):
    first, second = runs["inproc"]
    text_1, image_1 = first["usage"]
    assert (text_1["segment"], image_1["segment"], image_1["encoder_cache_hit"]) == ("text", "image", False)
    assert text_1["reused_tokens"] == image_1["reused_tokens"] == 0
    text_2, image_2 = second["usage"]
    # turn 1 left 4+4 generated tokens, 7 text and 16 image positions: one full page (16) committed
    assert text_2["prompt_tokens"] > image_1["prompt_tokens"] and text_2["hit_pages"] >= 1
    assert text_2["reused_tokens"] == 16 * text_2["hit_pages"]
    assert image_2["encoder_cache_hit"] is True and image_2["reused_tokens"] >= text_2["reused_tokens"]
    # 4 tokens a segment; the text frames are whole characters, so a split one is one frame fewer
    assert image_1["completion_tokens"] == image_2["completion_tokens"] == 8
    assert 1 <= len(first["token"]) <= 8 and 1 <= len(second["token"]) <= 8
    assert [image["image"]["width"] for image in first["image"] + second["image"]] == [32, 32]


def test_inproc_and_local_give_the_same_events(runs):
    assert runs["inproc"] == runs["local"]


def test_a_global_of_another_shape_is_refused_naming_the_setting():
    from flowrt.compute.engine import EngineError
    from flowrt.params.layout import KVLayout
    from flowrt.params.meta import EmbeddedStore
    from flowrt.params.pool import KVPool
    from flowrt.params.session import KVSession
    from flowstd.roles.multimodal import MultimodalRuntime, llm_global_settings

    settings = llm_global_settings()
    assert (settings["layers"], settings["heads"], settings["head_dim"], settings["dtype"]) == (2, 2, 16, "float32")
    layout = KVLayout("kv", ("0", "1"), ("k", "v"), 16, 4, 16, "float32")  # heads 4: not the LLM's 2
    pool = KVPool(layout, device_pages=4, store=EmbeddedStore("w"), deployment="w", node="w")
    try:

        async def bind():
            async with KVSession(pool, "s", "c") as kv:
                MultimodalRuntime.shared().for_pool(kv)

        with pytest.raises(EngineError, match=r"global `kv` cannot hold .*`heads 2` \(it has 4\)"):
            asyncio.run(bind())
    finally:
        pool.close()
