"""Server VAD on /v1/realtime (`turn_detection: {"type": "server_vad"}`; docs/openai.md,
"Realtime"): the energy detector finds the same speech however the audio is cut (a property),
and through the official client a session that only appends audio gets speech_started,
speech_stopped, the commit and the answer, with the padding before the speech in the turn's
call; speech during a reply barges in on it."""

from __future__ import annotations

import array
import asyncio
import base64

from hypothesis import given, settings
from hypothesis import strategies as st

from flowrt.gateway.realtime_vad import FRAME_MS, EnergyDetector, TurnDetection
from tests.gateway.live import Served, drained, opened, run, served
from tests.gateway.test_realtime import bundle, client_of, interruptible, roles, until  # noqa: F401 - `bundle` is a fixture

RATE = 24000
FRAME = RATE * FRAME_MS // 1000  # samples


def voice(frames: int, first: int = 7000) -> bytes:
    """Speech as the detector hears it: loud samples (the first one names the turn to the roles)."""
    values = [first] + [(8000 if i % 2 else -8000) for i in range(frames * FRAME - 1)]
    return array.array("h", values).tobytes()


def quiet(frames: int) -> bytes:
    return bytes(2 * FRAME * frames)


def found(detector: EnergyDetector, audio: bytes, cuts: list[int]) -> list[tuple[str, int]]:
    edges = [0, *sorted({2 * c for c in cuts if 0 < 2 * c < len(audio)}), len(audio)]
    events: list[tuple[str, int]] = []
    for start, end in zip(edges, edges[1:], strict=False):
        events += detector.feed(audio[start:end])
    return events


@settings(max_examples=60, deadline=None)
@given(
    before=st.integers(0, 20),
    speech=st.integers(1, 30),
    after=st.integers(0, 40),
    silence_ms=st.sampled_from([20, 100, 200, 500]),
    cuts=st.lists(st.integers(1, 60 * FRAME), max_size=10),
)
def test_speech_starts_and_stops_where_it_is_however_the_audio_is_cut(before, speech, after, silence_ms, cuts):
    audio = quiet(before) + voice(speech) + quiet(after)
    detection = TurnDetection(silence_duration_ms=silence_ms)
    events = found(EnergyDetector(detection, RATE), audio, cuts)
    assert events == found(EnergyDetector(detection, RATE), audio, [])  # chunking changes nothing
    expected = [("started", before * FRAME_MS)]
    if after * FRAME_MS >= silence_ms:
        expected.append(("stopped", (before + speech) * FRAME_MS))
    assert events == expected


def test_the_threshold_scales_the_level_and_a_quiet_voice_is_silence():
    soft = array.array("h", [600, -600] * (5 * FRAME // 2)).tobytes()  # RMS 0.018 of full scale
    assert EnergyDetector(TurnDetection(), RATE).feed(soft) == []  # 0.5: 0.02
    assert EnergyDetector(TurnDetection(threshold=0.4), RATE).feed(soft) == [("started", 0)]  # 0.016


def events_of(kind: str, seen: list) -> list:
    return [e for e in seen if e.type == kind]


def test_a_session_that_only_appends_audio_gets_its_turns_found_committed_and_answered(bundle):  # noqa: F811
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client_of(base).realtime.connect(model="talk") as connection:
                await until(connection, "session.created")
                detection = {"type": "server_vad", "prefix_padding_ms": 40, "silence_duration_ms": 100}
                await connection.session.update(session={"audio": {"input": {"turn_detection": detection}}})
                updated = await until(connection, "session.updated")
                assert updated.session.audio.input.turn_detection.silence_duration_ms == 100
                heard = len(roles().HEARD)
                # 100 ms of silence (in 20 ms chunks), 60 ms of voice, 120 ms of silence: appends only
                for chunk in [quiet(1)] * 5 + [voice(3)] + [quiet(1)] * 6:
                    await connection.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
                seen: list = []
                started = await until(connection, "input_audio_buffer.speech_started", seen)
                stopped = await until(connection, "input_audio_buffer.speech_stopped", seen)
                committed = await until(connection, "input_audio_buffer.committed", seen)
                assert (started.audio_start_ms, stopped.audio_end_ms) == (100, 160)
                assert started.item_id == stopped.item_id == committed.item_id
                done = await until(connection, "response.done", seen)
                assert done.response.status == "completed"
                transcript = "".join(e.delta for e in events_of("response.output_audio_transcript.delta", seen))
                # the turn's call heard the padding (40 ms, in one frame), the voice, and the silence up
                # to the frame that decided the stop (100 ms); the silence after it is the next padding
                assert transcript.startswith("heard 7 chunks,"), transcript
                assert [samples for samples, _ in roles().HEARD[heard:]] == [2 * FRAME] + [3 * FRAME] + [FRAME] * 5
            await drained(Served(app, base, client), runtime)

    run(main())


def test_speech_during_a_reply_barges_in_on_it(tmp_path):
    async def main():
        async with interruptible(tmp_path) as (runtime, (app, base, client), module, gate):
            async with client_of(base).realtime.connect(model="talk") as connection:
                await until(connection, "session.created")
                await connection.session.update(session={"turn_detection": {"type": "server_vad", "silence_duration_ms": 60}})
                await until(connection, "session.updated")
                await append(connection, voice(2, first=module.GATED) + quiet(3))  # a reply that runs until stopped
                first = await until(connection, "response.created", [])
                gate.release()
                await until(connection, "response.output_audio.delta", [])
                await append(connection, voice(2) + quiet(3))  # the user talks over it
                seen: list = []
                await until(connection, "input_audio_buffer.speech_started", seen)
                stopped = await until(connection, "response.done", seen)
                assert (stopped.response.id, stopped.response.status) == (first.response.id, "cancelled")
                assert stopped.response.status_details.reason == "turn_detected"
                answered = await until(connection, "response.done", seen)
                assert answered.response.status == "completed"
                assert module.SEEN[1] is not None and module.SEEN[1].call_id  # the new turn's call interrupted the reply
            await drained(Served(app, base, client), runtime, idle_sessions=0)
            assert runtime.programs["talk"].calls_ended == {"cancelled": 1, "ok": 1}

    run(asyncio.wait_for(main(), 30))


async def vad_session(connection, **detection) -> None:
    await until(connection, "session.created")
    await connection.session.update(session={"audio": {"input": {"turn_detection": {"type": "server_vad", **detection}}}})
    await until(connection, "session.updated")


async def append(connection, pcm: bytes) -> None:
    await connection.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())


def test_the_padding_is_the_last_prefix_padding_ms_to_the_sample_and_times_run_across_updates(bundle):  # noqa: F811
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client_of(base).realtime.connect(model="talk") as connection:
                await vad_session(connection, prefix_padding_ms=40, silence_duration_ms=100)
                heard = len(roles().HEARD)
                await append(connection, quiet(50) + voice(3) + quiet(6))  # one append: 1 s of silence first
                seen: list = []
                assert (await until(connection, "input_audio_buffer.speech_started", seen)).audio_start_ms == 1000
                await until(connection, "response.done", seen)
                assert [samples for samples, _ in roles().HEARD[heard:]] == [2 * FRAME, 8 * FRAME]  # 40 ms, then the turn
                # no padding at all; the times go on from the audio appended before the change
                await connection.session.update(session={"turn_detection": {"prefix_padding_ms": 0, "silence_duration_ms": 100}})
                await until(connection, "session.updated")
                heard = len(roles().HEARD)
                await append(connection, quiet(10) + voice(2) + quiet(5))
                seen = []
                started = await until(connection, "input_audio_buffer.speech_started", seen)
                stopped = await until(connection, "input_audio_buffer.speech_stopped", seen)
                assert (started.audio_start_ms, stopped.audio_end_ms) == (1180 + 200, 1180 + 240)
                await until(connection, "response.done", seen)
                assert not events_of("error", seen)
                assert [samples for samples, _ in roles().HEARD[heard:]] == [7 * FRAME]  # the voice and 100 ms
            await drained(Served(app, base, client), runtime)

    run(main())


def test_without_interrupt_response_a_turn_spoken_during_a_reply_is_answered_after_it(tmp_path):
    async def main():
        async with interruptible(tmp_path) as (runtime, (app, base, client), module, gate):
            async with client_of(base).realtime.connect(model="talk") as connection:
                await vad_session(connection, silence_duration_ms=60, interrupt_response=False)
                await append(connection, voice(2, first=module.GATED) + quiet(3))
                first = await until(connection, "response.created", [])
                gate.release()
                await until(connection, "response.output_audio.delta", [])
                await append(connection, voice(2) + quiet(3))  # spoken while the reply plays: not a barge-in
                seen: list = []
                await until(connection, "input_audio_buffer.committed", seen)
                assert not events_of("response.created", seen)
                for _ in range(1000):  # the reply goes on to its end ...
                    gate.release()
                done = await until(connection, "response.done", seen)
                assert (done.response.id, done.response.status) == (first.response.id, "completed")
                second = await until(connection, "response.created", seen)  # ... then the turn is answered
                answered = await until(connection, "response.done", seen)
                assert answered.response.id == second.response.id and answered.response.status == "completed"
            await drained(Served(app, base, client), runtime, idle_sessions=0)
            assert runtime.programs["talk"].calls_ended == {"ok": 2}

    run(asyncio.wait_for(main(), 30))
