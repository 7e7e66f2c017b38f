"""flowstd's `duplex` module and examples/voice_duplex: the energy end-of-turn detector finds the
same utterance however the audio is chunked (a property), ignores clicks, waits for silence,
reads the chunk shapes it documents and refuses the rest in one line; and in a running call the
thinker starts on the end of the first utterance while the input is still open."""

from __future__ import annotations

import asyncio
import base64
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch", reason="the voice models need torch: pip install 'flowc[models]'")

from flowrt.errors import BadInput  # noqa: E402
from flowstd.roles.duplex import (  # noqa: E402
    FRAME,
    MIN_SPEECH_MS,
    PAD_MS,
    SILENCE_MS,
    TurnDetector,
    chunk_pcm16,
    closing_silence,
)

PAD, MIN_SPEECH, SILENCE = PAD_MS // 20, MIN_SPEECH_MS // 20, SILENCE_MS // 20  # in frames


def tone(frames: int, amplitude: float = 0.3) -> bytes:
    n = frames * FRAME
    return struct.pack(f"<{n}h", *(int(amplitude * 32767 * math.sin(2 * math.pi * 180 * i / 16000)) for i in range(n)))


def silence(frames: int) -> bytes:
    return bytes(2 * FRAME * frames)


def fed(audio: bytes, cuts: list[int]) -> tuple[bytes | None, int]:
    """The detector fed `audio` cut at `cuts` (sample indices): its utterance and the number of
    samples it had been given when the utterance came."""
    detector, found, given_samples = TurnDetector(), None, 0
    edges = [0, *sorted({2 * c for c in cuts if 0 < 2 * c < len(audio)}), len(audio)]
    for start, end in zip(edges, edges[1:], strict=False):
        given_samples += (end - start) // 2
        utterance = detector.feed(audio[start:end])
        if utterance is not None:
            assert found is None
            found, when = utterance, given_samples
    return found, when if found is not None else -1


@settings(max_examples=60, deadline=None)
@given(
    before=st.integers(0, 12),
    speech=st.integers(MIN_SPEECH, 30),
    after=st.integers(SILENCE, SILENCE + 10),
    cuts=st.lists(st.integers(1, 20_000), max_size=12),
)
def test_the_utterance_is_the_speech_with_its_pads_however_the_audio_is_chunked(before, speech, after, cuts):
    audio = silence(before) + tone(speech) + silence(after)
    utterance, when = fed(audio, cuts)
    whole, _ = fed(audio, [])
    assert utterance == whole
    expected = audio[2 * FRAME * (before - min(PAD, before)) : 2 * FRAME * (before + speech + PAD)]
    assert utterance == expected
    # decided on the frame that completes the silence: within one chunk of it
    decided = (before + speech + SILENCE) * FRAME
    assert when >= decided and all(not decided <= c < when for c in cuts)


def test_a_click_starts_no_utterance_and_speech_without_silence_ends_none():
    assert fed(silence(5) + tone(MIN_SPEECH - 1) + silence(40), [])[0] is None
    assert fed(silence(5) + tone(40) + silence(SILENCE - 1), [])[0] is None


def test_an_utterance_ends_at_its_longest_even_without_silence():
    detector = TurnDetector(max_frames=50)
    utterance = detector.feed(tone(80))
    assert utterance is not None and len(utterance) == 2 * FRAME * 50
    assert detector.done and detector.feed(tone(80)) is None  # one turn per call


def test_closing_silence_ends_an_utterance_in_progress():
    detector = TurnDetector()
    assert detector.feed(tone(20)) is None
    assert detector.feed(closing_silence()) is not None


def test_chunks_in_every_documented_shape_and_bad_ones_refused_in_one_line():
    pcm = tone(2)
    assert chunk_pcm16(pcm) == pcm
    assert chunk_pcm16({"format": "pcm16", "data": base64.b64encode(pcm).decode()}) == pcm
    assert chunk_pcm16({"format": "pcm16", "data": pcm}) == pcm
    assert len(chunk_pcm16({"samples": [0.0, 0.5, -0.5]})) == 6
    assert len(chunk_pcm16({"format": "pcm16", "data": pcm, "sample_rate": 8000})) == 2 * len(pcm)  # resampled
    for bad, said in (
        (b"\x00\x01\x02", "not whole int16 samples"),
        ({"format": "pcm16", "data": "not base64!"}, "not base64"),
        ("hello", "not str"),
        ({"format": "wav", "data": "UklGRg=="}, 'raw PCM16 bytes, {"format": "pcm16"'),
        ({"samples": ["x"]}, "list of numbers"),
        ({"data": pcm, "sample_rate": 0}, "whole number of Hz"),
    ):
        with pytest.raises(BadInput, match=said):
            chunk_pcm16(bad)


def test_the_thinker_starts_on_the_first_utterance_while_the_input_is_still_open(tmp_path):
    from flowrt.deploy import open_deployment
    from tests.examples_models.test_media_roles import bundle

    built = bundle("voice_duplex", tmp_path / "bundle")

    async def main():
        deployment = await open_deployment(built, "inproc")
        try:
            call = deployment.runtime.start("turn", {}, session="s1")
            events: list[dict] = []
            replied = asyncio.Event()

            async def read():
                async for event in call:
                    events.append(event)
                    if event.get("field") == "reply":
                        replied.set()

            reading = asyncio.ensure_future(read())
            for chunk in (silence(5), tone(25), silence(SILENCE + 1)):
                await call.send("audio_in", chunk)
            # the input is still open: the reply must come anyway (else this waits for ever)
            await asyncio.wait_for(replied.wait(), 60)
            await call.send("audio_in", tone(25))  # heard and dropped: one turn per call
            await call.end("audio_in")
            await asyncio.wait_for(reading, 60)
            return events
        finally:
            await deployment.close()

    events = asyncio.run(main())
    assert events[-1]["status"] == "ok"
    (turn,) = [e["value"] for e in events if e["event"] == "return"]
    assert turn["audio_clips"] == 1 and turn["generated_tokens"] == 24
    assert any(e.get("field") == "speech" for e in events)


def test_a_bundle_may_serve_voice_and_duplex_graphs_side_by_side():
    from flowc.check import check_source
    from flowc.plan import build_plan

    text = """flow both
import voice
import duplex
graph chat {
    entry  voice_request
    stream speech ordered
    return turn
}
graph talk {
    entry  audio_in
    stream speech ordered
    return turn
    interruptible
}
"""
    result = check_source(text, "both.flow")
    assert result.ok, [f"{d.code} {d.message}" for d in result.diagnostics]
    graphs = build_plan(result.program).as_json()["graphs"]

    def roles(graph: dict) -> set[str]:
        return {node["role"] for node in graph["nodes"].values() if node.get("role")}

    assert {"turn_detector", "heard_encoder", "duplex_thinker"}.isdisjoint(roles(graphs["chat"]))
    assert {"voice_frontend", "audio_encoder", "thinker"}.isdisjoint(roles(graphs["talk"]))
    assert "talker" in roles(graphs["chat"]) & roles(graphs["talk"])


def test_a_turn_talked_over_stays_in_the_history_as_far_as_it_was_heard(tmp_path):
    # turn 1 is interrupted after its caller took 2 speech chunks (2 tokens each: 4 vocoder
    # frames a token, 8 a chunk); turn 2 (interrupt=True) continues from turn 1's prompt and
    # those 4 ids: its prompt is turn 1's, the 4 ids and its own, and it reuses the full pages
    # of the first two
    from flowrt.deploy import open_deployment
    from tests.examples_models.test_media_roles import bundle

    built = bundle("voice_duplex", tmp_path / "bundle")
    utterance = (silence(5), tone(25), silence(SILENCE + 1))

    async def turn(runtime, session: str, interrupt: bool = False, speech_wanted: int | None = None) -> list[dict]:
        call = runtime.start("turn", {}, session=session, interrupt=interrupt)
        events: list[dict] = []
        for chunk in utterance:
            await call.send("audio_in", chunk)
        if speech_wanted is None:
            await call.end("audio_in")
            return [event async for event in call]
        async for event in call:  # then stop reading: the rest is never taken
            events.append(event)
            if sum(e.get("field") == "speech" for e in events) == speech_wanted:
                return events
        raise AssertionError(f"fewer than {speech_wanted} speech chunks: {events[-1]}")

    async def main():
        deployment = await open_deployment(built, "inproc")
        try:
            runtime = deployment.runtime
            alone = await asyncio.wait_for(turn(runtime, "fresh"), 60)
            await asyncio.wait_for(turn(runtime, "s", speech_wanted=2), 60)
            second = await asyncio.wait_for(turn(runtime, "s", interrupt=True), 60)
            await deployment.runtime.wait_idle()
            return alone, second
        finally:
            await deployment.close()

    alone, second = asyncio.run(main())
    (own,) = [e["value"] for e in alone if e["event"] == "return"]
    (after,) = [e["value"] for e in second if e["event"] == "return"]
    heard = own["prompt_tokens"] + 2 * 2  # turn 1's prompt (its session was new) and the 4 ids heard
    assert after["prompt_tokens"] == heard + own["prompt_tokens"]
    assert after["reused_tokens"] == heard // 16 * 16


def test_what_was_heard_counts_speech_chunks_else_text_pieces():
    from flowrt.control.interrupts import Interrupted
    from flowstd.roles.delivered import SpokenTurns

    turns = SpokenTurns(tokens_per_chunk=2)
    turn = turns.start("s", 7)
    turn["history"], turn["texts"] = 40, [True, False, True, True, False, True]
    assert turns.step("s", Interrupted(7, "g", {"speech": 2, "reply": 1})) == 44  # speech heard: 2 ids a chunk
    assert turns.step("s", Interrupted(7, "g", {"reply": 2})) == 43  # no speech: up to the id of the 2nd text piece
    assert turns.step("s", Interrupted(7, "g", {"speech": 9})) == 46  # never beyond what was generated
    assert turns.step("s", Interrupted(7, "g", {})) == 40  # nothing taken: the prompt alone
    assert turns.step("s", Interrupted(8, "g", {"speech": 1})) is None  # another call's interruption
    assert turns.step("s", None) is None and turns.step("other", Interrupted(7, "g", {})) is None
