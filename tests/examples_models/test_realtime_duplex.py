"""The Realtime endpoint (`/v1/realtime`, docs/openai.md "Realtime") over flowstd's `duplex` module
on real tiny models, through the official `openai` client: the user's audio (a tone between
silences, 16 kHz PCM16) streams into the end-of-turn detector while it is appended, the thinker's
text comes back as transcript deltas and the talker's speech as audio deltas at the session's
24 kHz, two turns in one session."""

from __future__ import annotations

import array
import base64

import pytest

pytest.importorskip("torch", reason="the voice models need torch: pip install 'flowc[models]'")

from flowrt.deploy import open_deployment  # noqa: E402
from tests.examples_models.test_duplex import SILENCE, silence, tone  # noqa: E402
from tests.gateway.live import Served, drained, run, served  # noqa: E402
from tests.gateway.test_realtime import client_of, deltas, response_of, until  # noqa: E402
from tests.runtime.harness import bundle_of  # noqa: E402

TALK = """
graph talk {
    entry  audio_in
    stream reply ordered
    stream speech ordered
    return turn
    interruptible
    serves realtime
}
"""  # a duplex turn served as a Realtime model
FLOW = "flow rtduplex\n\nimport duplex\n" + TALK


def test_two_spoken_turns_through_the_realtime_endpoint_on_tiny_models(tmp_path):
    bundle = bundle_of(FLOW, tmp_path)

    async def main():
        deployment = await open_deployment(bundle, "inproc")  # (its KV pools: a bare Runtime.open has none)
        runtime = deployment.runtime
        try:
            await answered(runtime)
        finally:
            await deployment.close()

    async def answered(runtime):
        async with served(runtime) as (app, base, client):
            async with client_of(base).realtime.connect(model="talk") as connection:
                created = await until(connection, "session.created")
                assert created.session.output_modalities == ["audio"]
                await connection.session.update(session={"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}})
                await until(connection, "session.updated")
                for _ in range(2):
                    for chunk in (silence(5), tone(25), silence(SILENCE + 1)):
                        await connection.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
                    await connection.response.create()  # (commits the turn)
                    _, events, done = await response_of(connection, [])  # (after input_audio_buffer.committed)
                    assert done.response.status == "completed", done.response.status_details
                    transcript = "".join(deltas(events, "response.output_audio_transcript.delta"))
                    speech = [array.array("h", base64.b64decode(d)) for d in deltas(events, "response.output_audio.delta")]
                    assert transcript and done.response.output[0].content[0].transcript == transcript
                    assert speech and sum(len(s) for s in speech) > 0
            await drained(Served(app, base, client), runtime)
            assert runtime.programs["talk"].calls_ended == {"ok": 2}

    run(main(), 240)
