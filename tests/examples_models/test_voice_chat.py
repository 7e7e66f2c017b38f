"""examples/voice_chat on real deployments: two turns of one session under `--deploy inproc` and
`local`. Turn 2 reuses every full page of turn 1 (prompt and reply) and computes only its own
positions, counted by the thinker and by the engine's own counters; it answers exactly what a
fresh server answers to the whole conversation with nothing cached; turn 2's clip, turn 1's
again, comes from the audio encoder's cache; the speech is the same bytes under both deployments
and the vocoder's whole-reply synthesis, and it starts before the text ends. Torch runs on one
thread everywhere here (the roles' outputs are bit-identical at a fixed thread count)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os

import pytest

pytest.importorskip("torch", reason="the example's models run on torch: pip install 'flowc[models]'")
pytest.importorskip("tokenizers", reason="the example tokenizes with flowstd.tokenizer: pip install 'flowc[models]'")
pytest.importorskip("soundfile", reason="the voice frontend reads WAV files with soundfile: pip install 'flowc[models]'")

import torch  # noqa: E402

from flowc.check import check_source  # noqa: E402
from flowc.codegen import build_bundle  # noqa: E402
from flowrt.deploy import open_deployment  # noqa: E402
from flowstd.roles import voice  # noqa: E402
from tests.conftest import REPO  # noqa: E402

EXAMPLE = REPO / "examples" / "voice_chat"
PAGE_TOKENS = 16  # lib/kvcache.flow's page_tokens
TURN_1 = json.loads((EXAMPLE / "request.json").read_text())["voice_request"]
CLIP = TURN_1["segments"][0]
QUESTION = "and once more, slowly?"
TURN_2 = {"segments": [CLIP, {"type": "text", "text": QUESTION}], "max_tokens": 16}


async def call(deployment, request: dict, session: str) -> dict:
    """One turn: its events in arrival order, the text, the speech's bytes, the `turn` record."""
    events = [event async for event in deployment.runtime.call("chat", {"voice_request": request}, session=session, timeout=60)]
    assert events[-1]["status"] == "ok", events[-1]
    events = events[:-1]
    return {
        "order": [event["field"] for event in events],
        "reply": [event["value"] for event in events if event["field"] == "reply"],
        "speech": b"".join(event["value"].pcm16 for event in events if event["field"] == "speech"),
        "chunks": [event["value"].summary() for event in events if event["field"] == "speech"],
        "turn": next(event["value"] for event in events if event["field"] == "turn"),
    }


async def two_turns(path, deploy: str) -> dict:
    deployment = await open_deployment(path, deploy)
    try:
        first = await call(deployment, TURN_1, "s1")
        counted = {}
        if deploy == "inproc":  # the engine and the encoder cache are in this process: read their own counters
            engines = voice.VoiceRuntime.shared().pool_engines(deployment.memory.params.pools["kv"])
            (encoder,) = deployment.runtime.instances["audio_encoder"]
            before = (engines.batcher.stats.tokens, engines.matcher.counters.hit_tokens, encoder.cache.statistics())
        second = await call(deployment, TURN_2, "s1")
        if deploy == "inproc":
            cache = encoder.cache.statistics()
            counted = {
                "engine_tokens": engines.batcher.stats.tokens - before[0],
                "pool_hit_tokens": engines.matcher.counters.hit_tokens - before[1],
                "cache_hits": cache["hits"] - before[2]["hits"],
                "cache_forwards": cache["misses"] - before[2]["misses"],
            }
        return {"turns": [first, second], "counted": counted}
    finally:
        await deployment.close()


async def replayed(path, conversation: dict) -> dict:
    """The whole conversation to a new server in one call (step 0): nothing is cached there."""
    deployment = await open_deployment(path, "inproc")
    try:
        return await call(deployment, conversation, "fresh")
    finally:
        await deployment.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    source = EXAMPLE / "pipeline.flow"
    result = check_source(source.read_text(), "pipeline.flow", source)
    assert result.ok, [f"{d.code} {d.message}" for d in result.diagnostics]
    path = tmp_path_factory.mktemp("voice_chat") / "bundle"
    build_bundle(result.program, source, path).write(path)
    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"  # the local deployment's processes inherit it
    try:
        runs = {deploy: asyncio.run(two_turns(path, deploy)) for deploy in ("inproc", "local")}
        first = runs["inproc"]["turns"][0]
        conversation = {
            "segments": [*TURN_1["segments"], {"type": "reply", "tokens": first["turn"]["reply_tokens"]}, *TURN_2["segments"]],
            "max_tokens": TURN_2["max_tokens"],
            "step": 0,
        }
        runs["fresh"] = asyncio.run(replayed(path, conversation))
        yield runs
    finally:
        torch.set_num_threads(threads)
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env


def new_positions() -> int:
    """Turn 2's own positions: <|user|>, the clip's encoder rows, the question, <|eos|><|assistant|>."""
    from flowstd.tokenizer import Tokenizer

    rows = voice.VoiceRuntime.shared().audio_encoder.config.frames(8000)  # the clip: 0.5 s at 16 kHz
    return 1 + rows + len(Tokenizer.load().encode(QUESTION)) + 2


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_turn_two_computes_only_its_new_positions(runs, deploy):
    first, second = (turn["turn"] for turn in runs[deploy]["turns"])
    assert first["reused_tokens"] == 0 and first["computed_tokens"] == first["prompt_tokens"]
    assert first["history_tokens"] == first["prompt_tokens"] + first["generated_tokens"] == 29 + 16
    # every full page of turn 1, its reply's included (recorded as the ids generated), is reused
    held = first["history_tokens"]
    assert second["hit_pages"] == held // PAGE_TOKENS >= 2
    assert second["reused_tokens"] == held // PAGE_TOKENS * PAGE_TOKENS
    # computed: turn 1's trailing partial page (never committed) and turn 2's own positions, nothing else
    assert second["prompt_tokens"] == held + new_positions()
    assert second["computed_tokens"] == held % PAGE_TOKENS + new_positions() == second["prompt_tokens"] - second["reused_tokens"]


def test_the_engines_own_counters_agree(runs):
    counted, second = runs["inproc"]["counted"], runs["inproc"]["turns"][1]["turn"]
    # the forward steps ran the computed positions and one decode step per generated token but the last
    assert counted["engine_tokens"] == second["computed_tokens"] + second["generated_tokens"] - 1
    assert counted["pool_hit_tokens"] == second["reused_tokens"]


def test_turn_two_answers_as_a_fresh_server_without_the_cache(runs):
    fresh = runs["fresh"]
    assert fresh["turn"]["reused_tokens"] == 0 and fresh["turn"]["hit_pages"] == 0
    assert fresh["turn"]["computed_tokens"] == fresh["turn"]["prompt_tokens"]
    for deploy in ("inproc", "local"):
        second = runs[deploy]["turns"][1]
        assert second["turn"]["prompt_tokens"] == fresh["turn"]["prompt_tokens"]  # the same conversation
        assert second["turn"]["reply_tokens"] == fresh["turn"]["reply_tokens"]  # reuse changes no token
        assert second["reply"] == fresh["reply"] and second["speech"] == fresh["speech"]


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_the_same_clip_in_turn_two_comes_from_the_encoder_cache(runs, deploy):
    first, second = (turn["turn"] for turn in runs[deploy]["turns"])
    assert (first["audio_clips"], first["audio_cache_hits"]) == (1, 0)  # a new process: encoded
    assert (second["audio_clips"], second["audio_cache_hits"]) == (1, 1)


def test_the_encoder_caches_own_counters_agree(runs):
    counted = runs["inproc"]["counted"]
    assert (counted["cache_hits"], counted["cache_forwards"]) == (1, 0)


def test_inproc_and_local_give_the_same_text_and_speech(runs):
    for inproc, local in zip(runs["inproc"]["turns"], runs["local"]["turns"], strict=True):
        assert inproc["speech"], "no speech"
        assert hashlib.sha256(inproc["speech"]).digest() == hashlib.sha256(local["speech"]).digest()
        assert inproc["chunks"] == local["chunks"]
        assert inproc["reply"] == local["reply"] and inproc["turn"] == local["turn"]
    assert runs["inproc"]["turns"][0]["speech"] != runs["inproc"]["turns"][1]["speech"]


def test_the_speech_is_the_vocoders_synthesis_of_the_whole_reply(runs):
    runtime = voice.VoiceRuntime.shared()
    for turn in runs["inproc"]["turns"]:
        spoken = [token for token in turn["turn"]["reply_tokens"] if token not in runtime.tokenizer.special_id_set]
        features = runtime.embedder.embed(spoken).to(torch.float32).repeat_interleave(voice.FRAMES_PER_TOKEN, dim=0)
        assert turn["speech"] == voice.to_pcm16(runtime.vocoder.synthesize(features))
        chunks = turn["chunks"]
        assert [chunk["audio"]["chunk"] for chunk in chunks] == list(range(len(chunks))) and len(chunks) >= 3
        assert sum(chunk["audio"]["samples"] for chunk in chunks) == len(spoken) * voice.FRAMES_PER_TOKEN * 160


def test_speech_starts_before_the_text_ends(runs):
    for turn in runs["inproc"]["turns"]:
        order = turn["order"]
        last_text = len(order) - 1 - order[::-1].index("reply")
        assert order.index("speech") < last_text, order
        # the first block (8 frames, final once 8 + 7 have arrived) is complete at the reply's 4th token of 16
        assert order.index("speech") < len(order) // 2, order


def test_the_examples_replay_case_is_turn_two_from_scratch(runs):
    """The README's promise: tests/chat.replay.input.json (turn 1's clip and reply, then turn 2's
    clip and question, step 0, 8 tokens) answers with turn 2's first 8 tokens."""
    import json

    replay = json.loads((EXAMPLE / "tests" / "chat.replay.input.json").read_text())["voice_request"]
    recorded = [json.loads(line) for line in (EXAMPLE / "tests" / "chat.replay.events.jsonl").read_text().splitlines()]
    turn = next(event["value"] for event in recorded if event.get("field") == "turn")
    second = runs["inproc"]["turns"][1]["turn"]
    assert replay["step"] == 0 and turn["reused_tokens"] == 0
    assert turn["prompt_tokens"] == second["prompt_tokens"]
    assert turn["reply_tokens"] == second["reply_tokens"][: replay["max_tokens"]]
