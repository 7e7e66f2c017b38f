"""The OpenAI Realtime-compatible endpoint `GET /v1/realtime?model=MODEL` (docs/openai.md, "Realtime"),
driven by the official `openai` client's realtime connection (GA: `client.realtime.connect`, beta:
`client.beta.realtime.connect`) over a real loopback socket: the gateway's application on an
aiohttp runner over an in-process runtime, as flowrt.deploy.serving runs it.

The graph `talk` hears each audio frame as it arrives (`ear`, per frame) and answers once the
input has ended (`voice`, a join over every frame and the session's settings): a Text stream and
an Audio stream (16 kHz PCM16 chunks, which the endpoint resamples to the session's rate). A
reply whose first sample is GATED takes one permit of a semaphore the test holds per chunk, so
a test decides when each chunk of it is made. Every wait is on an event or a condition with a
deadline; the server's and the runtime's tables are checked empty after each scenario.
"""

from __future__ import annotations

import array
import asyncio
import base64
import contextlib
import json
import socket
import sys
from pathlib import Path

import aiohttp
import openai
import pytest

from flowrt.control import bounds
from flowrt.errors import FlowrtError
from flowrt.frontdoor import FrontDoor
from flowrt.gateway.realtime_endpoint import CONNECTIONS
from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, deployed, wait_for
from tests.gateway.live import Served, drained, masked_text, opened, run, served

FLOW = """
flow rtflow

placeholder stream audio_in: Audio
placeholder settings: Json
placeholder words: Text

role ear {
    impl "rt_roles:Ear"
    interface hear { in audio_in  out stream heard: Json }
}

role voice {
    impl "rt_roles:Voice"
    interface reply {
        join { heard: all, settings: 1 }
        out stream text: Text, speech: Audio
    }
}

role echo {
    impl "rt_roles:Echo"
    interface say { in words  out stream echoed: Text }
}

graph talk {
    entry  audio_in, settings
    stream text ordered
    stream speech ordered
    serves realtime
}

graph chat {
    entry  words
    stream echoed ordered
}
"""

ROLES = """
import array
import asyncio
import base64

from flowrt import media

RATE = 16000  # the graph speaks at 16 kHz
GATED = 777  # a turn whose first sample is this makes a chunk per permit of GATE[0]
FLOOD = 555  # ... and this one, FLOOD_CHUNKS chunks of 64 KiB as fast as it can
FLOOD_CHUNKS = 4000
LONG = 333  # ... and this one, LONG_CHUNKS small chunks, a turn of the event loop between them
LONG_CHUNKS = 100_000
NOT_TEXT, BROKEN = 444, 222  # a reply that sends a number as its text, one whose role raises
GATE = [None]
HEARD = []  # (samples, sample rate) of every frame heard, in order
MADE = {}  # chunks the voice has made, by the first sample of the turn


class Ear:
    async def hear(self, ctx, audio_in):
        samples = array.array("h", base64.b64decode(audio_in["data"]))
        HEARD.append((len(samples), audio_in["sample_rate"]))
        yield {"heard": {"samples": len(samples), "first": samples[0]}}


class Speech:
    def __init__(self, pcm):
        self.pcm = pcm

    def media(self):
        return media.carried("wav", media.encode_wav(self.pcm, RATE), sample_rate=RATE)

    def summary(self):
        return {"audio": {"samples": len(self.pcm) // 2, "sample_rate": RATE}}


class Voice:
    async def reply(self, ctx, heard, settings):
        told = settings[0]
        words = [f"heard {len(heard)} chunks,", f"{sum(h['samples'] for h in heard)} samples,", told["instructions"] or "-"]
        first = heard[0]["first"] if heard else 0
        if first == NOT_TEXT:
            yield {"text": 5}
        if first == BROKEN:
            raise ValueError("the voice broke")
        count = {GATED: 1000, FLOOD: FLOOD_CHUNKS, LONG: LONG_CHUNKS}.get(first, len(words))
        for i in range(count):
            if first == GATED:
                await GATE[0].acquire()
            elif first == LONG:
                await asyncio.sleep(0)
            MADE[first] = MADE.get(first, 0) + 1
            samples = [i] * (32768 if first == FLOOD else 160)
            yield {"text": words[i % len(words)], "speech": Speech(array.array("h", samples).tobytes())}


class Echo:
    async def say(self, ctx, words):
        for word in words.split():
            yield {"echoed": word}
"""

CHUNKS = [[1, 2, 3, 4], [5] * 50, [-7] * 30]  # turn 1 (24 kHz); its reply tells 3 chunks, 84 samples
CHUNKS_2 = [[9] * 10, [10] * 6]  # turn 2


def b64(samples: list[int]) -> str:
    return base64.b64encode(array.array("h", samples).tobytes()).decode()


def samples_of(delta: str) -> list[int]:
    return list(array.array("h", base64.b64decode(delta)))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return bundle_with_roles(FLOW, ROLES, tmp_path_factory.mktemp("rtflow"), module="rt_roles")


def roles():
    return sys.modules["rt_roles"]


def client_of(base: str, key: str = "unused") -> openai.AsyncOpenAI:
    # (the beta connection takes `wss://` unless told the WebSocket address: the server has no TLS here)
    ws_base = base.replace("http://", "ws://") + "/v1"
    return openai.AsyncOpenAI(base_url=f"{base}/v1", websocket_base_url=ws_base, api_key=key, max_retries=0)


async def until(connection, kind: str, seen: list | None = None, seconds: float = 10):
    """The next event of type `kind`; the ones before it kept in `seen` (or none allowed)."""
    while True:
        event = await asyncio.wait_for(connection.recv(), seconds)
        if event.type == kind:
            return event
        assert seen is not None, event
        seen.append(event)


async def response_of(connection, seen: list | None = None):
    """A whole response: (response.created, the events up to response.done, response.done)."""
    created = await until(connection, "response.created", seen)
    events: list = []
    done = await until(connection, "response.done", events)
    assert all(getattr(e, "response_id", created.response.id) == created.response.id for e in events), events
    return created, events, done


def deltas(events: list, kind: str) -> list[str]:
    return [e.delta for e in events if e.type == kind]


# ── a conversation ──


def test_two_turns_audio_streams_in_while_the_user_speaks_and_text_and_audio_stream_out(bundle):
    async def main():
        sys.modules.pop("rt_roles", None)
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            heard = roles().HEARD
            async with client_of(base).realtime.connect(model="talk") as connection:
                created = await until(connection, "session.created")
                assert created.session.model == "talk" and created.session.output_modalities == ["audio"]
                assert created.session.audio.input.format.rate == 24000 and created.session.audio.input.turn_detection is None
                await connection.session.update(session={"type": "realtime", "instructions": "be brief"})
                updated = await until(connection, "session.updated")
                assert updated.session.instructions == "be brief"
                # turn 1: the call starts at the first append and hears each chunk before the commit
                for chunk in CHUNKS:
                    await connection.input_audio_buffer.append(audio=b64(chunk))
                await wait_for(lambda: len(heard) == len(CHUNKS), 10, "the graph hears the chunks before the commit")
                assert heard == [(len(c), 24000) for c in CHUNKS]
                await connection.input_audio_buffer.commit()
                committed = await until(connection, "input_audio_buffer.committed")
                assert committed.previous_item_id is None
                await connection.response.create()
                created, events, done = await response_of(connection)
                assert created.response.status == "in_progress"
                transcript = deltas(events, "response.output_audio_transcript.delta")
                assert transcript == ["heard 3 chunks,", "84 samples,", "be brief"]
                audio = deltas(events, "response.output_audio.delta")
                assert [samples_of(a) for a in audio] == [[i] * 240 for i in range(3)]  # 160 samples at 16 kHz, at 24 kHz
                assert not deltas(events, "response.output_text.delta")
                assert done.response.status == "completed" and done.response.id == created.response.id
                (item,) = done.response.output
                assert item.content[0].transcript == "heard 3 chunks,84 samples,be brief"
                # turn 2: text alone, input at 16 kHz
                await connection.session.update(
                    session={"output_modalities": ["text"], "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}
                )
                await until(connection, "session.updated")
                for chunk in CHUNKS_2:
                    await connection.input_audio_buffer.append(audio=b64(chunk))
                await connection.response.create()  # commits what is open
                second = await until(connection, "input_audio_buffer.committed")
                assert second.previous_item_id == committed.item_id
                created, events, done = await response_of(connection)
                assert deltas(events, "response.output_text.delta") == ["heard 2 chunks,", "16 samples,", "be brief"]
                assert {e.type for e in events} == {"response.output_text.delta"}
                assert done.response.status == "completed" and done.response.output[0].content[0].text.startswith("heard 2")
                assert heard[len(CHUNKS) :] == [(len(c), 16000) for c in CHUNKS_2]
            await drained(Served(app, base, client), runtime)
            assert runtime.programs["talk"].calls_ended == {"ok": 2}
            assert runtime.statistics()["sessions"] == 0  # the connection's session went with it
            async with client.get(f"{base}/metrics") as answer:  # turn 1's time to first audio (turn 2 had none)
                assert 'flowrt_time_to_first_audio_seconds_count{graph="talk"} 1.0' in await answer.text()

    run(main())


def test_models_lists_the_realtime_endpoint_and_refusals_before_the_upgrade(bundle):
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client.get(f"{base}/v1/models/talk") as answer:
                assert (await answer.json())["endpoints"] == ["realtime"]
            for query, status, code in (
                ("model=nope", 404, "model_not_found"),
                ("model=chat", 400, "model_not_supported"),
                ("", 404, "model_not_found"),
            ):
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await client.ws_connect(f"{base}/v1/realtime?{query}")
                assert refused.value.status == status, query
                async with client.get(f"{base}/v1/realtime?{query}") as answer:
                    assert answer.status == status and (await answer.json())["error"]["code"] == code
            async with client.get(f"{base}/v1/realtime?model=talk") as answer:  # no upgrade asked
                assert answer.status == 400 and "WebSocket" in (await answer.json())["error"]["message"]
            async with client.post(f"{base}/v1/realtime?model=talk") as answer:
                assert answer.status == 405 and answer.headers["Allow"] == "GET"
            async with client.get(f"{base}/v1/realtimes") as answer:  # elsewhere under /v1: the paths it answers
                assert answer.status == 404 and "GET /v1/realtime (WebSocket)" in (await answer.json())["error"]["message"]
            await drained(Served(app, base, client), runtime)

    run(main())


# ── barge-in ──


@pytest.mark.parametrize("how", ["response.create", "response.cancel"])
def test_barge_in_stops_the_running_reply_within_one_chunk_and_the_next_turn_completes(bundle, how):
    async def main():
        sys.modules.pop("rt_roles", None)
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            gate = roles().GATE[0] = asyncio.Semaphore(0)
            made = roles().MADE
            async with client_of(base).beta.realtime.connect(model="talk") as connection:  # the beta events
                created = await until(connection, "session.created")
                assert created.session.modalities == ["text", "audio"] and created.session.input_audio_format == "pcm16"
                await connection.input_audio_buffer.append(audio=b64([roles().GATED, 1, 2]))
                await connection.input_audio_buffer.commit()
                await until(connection, "input_audio_buffer.committed")
                await connection.response.create()
                first = await until(connection, "response.created")
                for i in range(3):  # three chunks, one at a time: a transcript and an audio delta each
                    gate.release()
                    pair = [await asyncio.wait_for(connection.recv(), 10) for _ in range(2)]  # (in either order)
                    transcript, audio = sorted(pair, key=lambda e: e.type != "response.audio_transcript.delta")
                    assert (transcript.type, audio.type) == ("response.audio_transcript.delta", "response.audio.delta")
                    assert transcript.response_id == audio.response_id == first.response.id
                    assert samples_of(audio.delta) == [i] * 240
                # the user talks over the reply
                await connection.input_audio_buffer.append(audio=b64(CHUNKS_2[0]))
                if how == "response.create":
                    await connection.response.create()  # commits turn 2 and interrupts turn 1
                else:
                    await connection.response.cancel()
                late: list = []
                others: list = []
                for _ in range(20):  # a chunk at a time: a reply that went on would take every one
                    gate.release()
                    event = await asyncio.wait_for(connection.recv(), 10)
                    if getattr(event, "response_id", None) == first.response.id:
                        late.append(event)
                    elif event.type == "response.done" and event.response.id == first.response.id:
                        done = event
                        break
                    else:
                        others.append(event)
                else:
                    raise AssertionError(f"turn 1 went on after the barge-in: {len(late)} deltas")
                assert len(late) <= 2, late  # at most the one chunk being made when the barge-in came
                stopped_at = made[roles().GATED]  # (chunks released before the server read the barge-in: made, not sent)
                assert done.response.status == "cancelled"
                reason = "turn_detected" if how == "response.create" else "client_cancelled"
                assert done.response.status_details.reason == reason
                assert done.response.output[0].status == "incomplete"
                assert done.response.output[0].content[0].transcript.startswith("heard 1 chunks,3 samples,")
                if how == "response.cancel":
                    await connection.response.create()
                created, events, done2 = await response_of(connection, others)
                assert created.response.id != first.response.id
                assert deltas(events, "response.audio_transcript.delta") == ["heard 1 chunks,", "10 samples,", "-"]
                assert [samples_of(a) for a in deltas(events, "response.audio.delta")] == [[i] * 240 for i in range(3)]
                assert done2.response.status == "completed"
                for _ in range(5):
                    gate.release()
                await drained(Served(app, base, client), runtime)
                assert made[roles().GATED] == stopped_at  # turn 1's role was cancelled
                assert [e.type for e in others] == ["input_audio_buffer.committed"]
                # a cancel with nothing running is an error, and the connection goes on
                await connection.response.cancel()
                error = await until(connection, "error")
                assert error.error.code == "response_cancel_not_active"
            await drained(Served(app, base, client), runtime)
            assert runtime.programs["talk"].calls_ended == {"cancelled": 1, "ok": 1}

    run(main())


def test_a_cancel_straight_after_create_ends_that_response_and_the_connection_goes_on(bundle):
    async def main():
        sys.modules.pop("rt_roles", None)
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client_of(base).realtime.connect(model="talk") as connection:
                await until(connection, "session.created")
                await connection.session.update(session={"output_modalities": ["text"]})
                await until(connection, "session.updated")
                for audio in [b64([1, 2])] * 3 + [None] * 3:  # a turn appended, or nothing appended
                    if audio is not None:
                        await connection.input_audio_buffer.append(audio=audio)
                    await connection.response.create()
                    await connection.response.cancel()  # (read before the turn's call has started)
                    seen: list = []
                    created = await until(connection, "response.created", seen)
                    done = await until(connection, "response.done", seen)
                    assert done.response.id == created.response.id, done
                    assert done.response.status == "cancelled" and done.response.status_details.reason == "client_cancelled"
                    assert [e.type for e in seen] == ["input_audio_buffer.committed"] * (audio is not None), seen
                # the connection goes on: nothing runs, and a turn is answered as usual
                await connection.response.cancel()
                assert (await until(connection, "error")).error.code == "response_cancel_not_active"
                await connection.input_audio_buffer.append(audio=b64([4, 4, 4]))
                await connection.response.create()
                _, events, done = await response_of(connection, [])
                assert deltas(events, "response.output_text.delta") == ["heard 1 chunks,", "3 samples,", "-"]
                assert done.response.status == "completed"
            await drained(Served(app, base, client), runtime)

    run(main())


@pytest.mark.parametrize("graph, count", [("plain", 2), ("plain", 5), ("plain", 20), ("interruptible", 5)])
def test_responses_created_back_to_back_each_end_once_and_the_last_completes(bundle, tmp_path, graph, count):
    if graph == "interruptible":  # (a barge-in there starts the next call with `interrupt`, when it can)
        bundle = bundle_with_roles(INTERRUPTIBLE_FLOW, INTERRUPTIBLE_ROLES, tmp_path, module="rti_roles")

    async def main():
        sys.modules.pop("rt_roles", None), sys.modules.pop("rti_roles", None)
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client_of(base).realtime.connect(model="talk") as connection:
                await until(connection, "session.created")
                await connection.session.update(session={"output_modalities": ["text"]})
                await until(connection, "session.updated")
                await connection.input_audio_buffer.append(audio=b64([1, 2]))
                for _ in range(count):  # each one a barge-in on the one before
                    await connection.response.create()
                created: list[str] = []
                done: dict = {}
                others: list = []
                while len(done) < count:
                    event = await asyncio.wait_for(connection.recv(), 10)
                    if event.type == "response.created":
                        created.append(event.response.id)
                    elif event.type == "response.done":
                        assert event.response.id in created and event.response.id not in done, event
                        done[event.response.id] = event.response
                    elif event.type == "response.output_text.delta":
                        assert event.response_id in created and event.response_id not in done, event
                    else:
                        others.append(event)
                assert len(created) == count and set(done) == set(created), (created, done)
                assert [e.type for e in others] == ["input_audio_buffer.committed"], others
                for response_id in created[:-1]:  # stopped by the next one, unless it had ended by then
                    response = done[response_id]
                    assert response.status == "completed" or (
                        response.status == "cancelled" and response.status_details.reason == "turn_detected"
                    ), response
                last = done[created[-1]]
                assert last.status == "completed" and last.output[0].content[0].text == "heard 0 chunks,0 samples,-"
                # the connection goes on
                await connection.response.cancel()
                assert (await until(connection, "error")).error.code == "response_cancel_not_active"
                await connection.input_audio_buffer.append(audio=b64([4, 4, 4]))
                await connection.response.create()
                _, events, done_again = await response_of(connection, [])
                assert deltas(events, "response.output_text.delta") == ["heard 1 chunks,", "3 samples,", "-"]
                assert done_again.response.status == "completed"
            await drained(Served(app, base, client), runtime)

    run(main())


# ── bad input ──


def test_bad_events_are_openai_error_events_and_the_connection_goes_on(bundle):
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client_of(base).realtime.connect(model="talk") as connection:
                await until(connection, "session.created")

                async def error_for(raw: str | dict):
                    await connection.send_raw(raw if isinstance(raw, str) else json.dumps(raw))
                    return (await until(connection, "error")).error

                error = await error_for({"type": "conversation.item.create", "event_id": "e1", "item": {}})
                assert (error.type, error.code, error.param, error.event_id) == (
                    "invalid_request_error",
                    "invalid_value",
                    "type",
                    "e1",
                )
                assert "input_audio_buffer.append" in error.message
                error = await error_for("{not json")
                assert error.code == "invalid_json" and error.event_id is None
                error = await error_for('["a list"]')
                assert error.code == "invalid_event" and "not an array" in error.message
                error = await error_for('{"type": "session.update", "session": ' + "[" * 10_000 + "]" * 10_000 + "}")
                assert error.code == "invalid_event" and "nests too deeply" in error.message
                error = await error_for({"type": "session.update", "event_id": "e4"})
                assert (error.param, error.event_id) == ("session", "e4") and "required field" in error.message
                error = await error_for({"type": "input_audio_buffer.append", "event_id": "e2", "audio": "%%% not base64"})
                assert (error.code, error.param, error.event_id) == ("invalid_base64", "audio", "e2")
                error = await error_for({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()})
                assert error.code == "invalid_value" and "3 bytes" in error.message
                error = await error_for({"type": "input_audio_buffer.append", "audio": b64([1]), "volume": 3})
                assert error.param == "volume" and "unknown field" in error.message
                error = await error_for({"type": "input_audio_buffer.commit", "event_id": "e3"})
                assert (error.code, error.event_id) == ("input_audio_buffer_commit_empty", "e3")
                for session, param in (
                    ({"turn_detection": {"type": "server_vad", "threshold": 2}}, "session.turn_detection.threshold"),
                    ({"turn_detection": {"silence_duration_ms": 5.5}}, "session.turn_detection.silence_duration_ms"),
                    ({"turn_detection": {"type": "server_vad", "eagerness": "low"}}, "session.turn_detection.eagerness"),
                    (
                        {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
                        "session.audio.input.turn_detection.type",
                    ),
                    ({"audio": {"input": {"turn_detection": "on"}}}, "session.audio.input.turn_detection"),
                    ({"tools": [{"type": "function", "name": "f"}]}, "session.tools"),
                    ({"audio": {"input": {"format": {"type": "audio/pcmu"}}}}, "session.audio.input.format"),
                    ({"output_modalities": ["text", "audio"]}, "session.output_modalities"),
                    ({"model": "chat"}, "session.model"),
                ):
                    error = await error_for({"type": "session.update", "session": session})
                    assert error.param == param, (session, error)
                error = await error_for({"type": "response.create", "response": {"tools": []}})
                assert error.param == "response.tools"
                # audio appended, then a change of the input's rate before the commit
                heard = len(roles().HEARD)
                await connection.input_audio_buffer.append(audio=b64([1, 2]))
                await wait_for(lambda: len(roles().HEARD) == heard + 1, 10, "the turn's call hears its chunk")
                error = await error_for({"type": "session.update", "session": {"audio": {"input": {"format": {"rate": 16000}}}}})
                assert error.param == "session.audio.input.format" and "commit" in error.message
                await connection.input_audio_buffer.clear()  # cancels the turn's call
                await until(connection, "input_audio_buffer.cleared")
                # a graph that answers badly: the response fails, saying why, and the connection goes on
                await connection.session.update(session={"output_modalities": ["text"]})
                await until(connection, "session.updated")
                for first, code, words in ((444, "not_text", "sent a int, not text"), (222, "role_error", "the voice broke")):
                    await connection.input_audio_buffer.append(audio=b64([first]))
                    await connection.response.create()
                    _, events, done = await response_of(connection, [])
                    assert done.response.status == "failed" and done.response.status_details.error.code == code
                    assert words in done.response.status_details.error.message
                # after all that, a turn is answered as usual
                await connection.session.update(session={"output_modalities": ["text"]})
                await until(connection, "session.updated")
                await connection.input_audio_buffer.append(audio=b64([4, 4, 4]))
                await connection.response.create()
                _, events, done = await response_of(connection, [])
                assert deltas(events, "response.output_text.delta") == ["heard 1 chunks,", "3 samples,", "-"]
                assert done.response.status == "completed"
            await drained(Served(app, base, client), runtime)
            ended = runtime.programs["talk"].calls_ended  # (the call that sent a number: cancelled, unless it had ended)
            assert ended["error"] == 1 and ended["ok"] + ended["cancelled"] == 3 and ended["cancelled"] >= 1, ended

    run(main())


def test_api_keys_are_those_of_the_other_v1_endpoints(bundle):
    async def main():
        front = FrontDoor(api_keys=("k1", "k2"))
        async with opened(bundle) as runtime, served(runtime, front) as (app, base, client):
            with pytest.raises(Exception) as refused:  # the handshake is refused: 401
                async with client_of(base, "wrong").realtime.connect(model="talk") as connection:
                    await connection.recv()
            assert "401" in str(refused.value)
            connect = client_of(base, "k1").realtime.connect
            async with connect(model="talk", extra_headers={"X-Flow-Session": "mine"}) as connection:
                await until(connection, "session.created")
                with pytest.raises(Exception) as refused:  # another key's session, while it is in use
                    async with client_of(base, "k2").realtime.connect(
                        model="talk", extra_headers={"X-Flow-Session": "mine"}
                    ) as other:
                        await other.recv()
                assert "403" in str(refused.value)
                await connection.session.update(session={"output_modalities": ["text"]})
                await until(connection, "session.updated")
                await connection.input_audio_buffer.append(audio=b64([3]))
                await connection.response.create()
                _, _, done = await response_of(connection, [])
                assert done.response.status == "completed"
            await drained(Served(app, base, client), runtime, {"Authorization": "Bearer k1"})

    run(main())


def test_a_browser_sends_its_key_as_a_subprotocol_to_both_websocket_endpoints(bundle):
    # a browser's WebSocket cannot set headers: it offers `realtime`, `openai-insecure-api-key.KEY`
    # and, for the beta events, `openai-beta.realtime-v1` (OpenAI's convention); the server
    # chooses `realtime` (a browser drops a connection whose offered protocols were all ignored)
    async def main():
        front = FrontDoor(api_keys=("k1",))
        async with opened(bundle) as runtime, served(runtime, front) as (app, base, client):
            url = f"{base}/v1/realtime?model=talk"
            offered = ("realtime", "openai-insecure-api-key.k1", "openai-beta.realtime-v1")
            async with client.ws_connect(url, protocols=offered) as ws:
                assert ws.protocol == "realtime"
                created = await asyncio.wait_for(ws.receive_json(), 10)
                assert created["type"] == "session.created" and "modalities" in created["session"]  # (the beta shape)
            async with client.ws_connect(url, protocols=("realtime", "openai-insecure-api-key.k1")) as ws:
                created = await asyncio.wait_for(ws.receive_json(), 10)
                assert "output_modalities" in created["session"]  # (GA)
            for wrong in (("realtime", "openai-insecure-api-key.k2"), ("realtime",)):
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    async with client.ws_connect(url, protocols=wrong):
                        pass
                assert refused.value.status == 401
            graph = f"{base}/graphs/chat/ws"
            async with client.ws_connect(graph, protocols=("flowrt.ws.v1", "openai-insecure-api-key.k1")) as ws:
                assert ws.protocol == "flowrt.ws.v1" and (await ws.receive_json())["type"] == "hello"
            async with client.ws_connect(graph, protocols=("openai-insecure-api-key.k1",)) as ws:  # (no protocol chosen)
                assert (await ws.receive_json())["type"] == "hello"
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:  # a key in a subprotocol of a plain GET: none
                async with client.get(graph, headers={"Sec-WebSocket-Protocol": "openai-insecure-api-key.k1"}) as answer:
                    raise aiohttp.WSServerHandshakeError(answer.request_info, (), status=answer.status)
            assert refused.value.status == 401
            await drained(Served(app, base, client), runtime, {"Authorization": "Bearer k1"})

    run(main())


def test_a_client_that_never_reads_holds_a_bounded_amount_and_others_are_served(bundle):
    async def main():
        sys.modules.pop("rt_roles", None)
        async with opened(bundle) as runtime, served(runtime, max_body_mb=1.0) as (app, base, client):
            made = roles().MADE
            host, port = base.removeprefix("http://").rsplit(":", 1)
            reader, writer = await raw_websocket(host, int(port), "/v1/realtime?model=talk")
            for event in (
                {"type": "input_audio_buffer.append", "audio": b64([roles().FLOOD])},
                {"type": "response.create"},
            ):
                writer.write(masked_text(event))
            await writer.drain()

            def held_back() -> bool:
                calls = [c for c in runtime.calls if c.program.name == "talk"]
                return bool(calls) and len(calls[0].outbox) >= bounds.OUTBOX_HIGH

            await wait_for(held_back, 30, "the call's events wait in its bounded outbox")
            async with client_of(base).realtime.connect(model="talk") as connection:  # another client is served meanwhile
                await until(connection, "session.created")
                await connection.session.update(session={"output_modalities": ["text"]})
                await until(connection, "session.updated")
                await connection.input_audio_buffer.append(audio=b64([8, 8]))
                await connection.response.create()
                _, events, done = await response_of(connection, [])
                assert done.response.status == "completed" and deltas(events, "response.output_text.delta")[1] == "2 samples,"
            (stuck,) = [c for c in runtime.calls if c.program.name == "talk"]
            assert len(stuck.outbox) <= bounds.OUTBOX_HIGH + 1 and made[roles().FLOOD] < roles().FLOOD_CHUNKS // 2, (
                len(stuck.outbox),
                made,
            )
            (ws,) = app[CONNECTIONS]  # (the other client has gone)
            assert ws._writer.transport.get_write_buffer_size() <= 2**22
            writer.transport.abort()  # the client goes: its call is cancelled, the server lets everything go
            await drained(Served(app, base, client), runtime)
            assert runtime.programs["talk"].calls_ended == {"cancelled": 1, "ok": 1}

    run(main(), 90)


async def raw_websocket(host: str, port: int, path: str):
    """A WebSocket client on a plain socket with a small receive buffer, which reads the
    handshake's answer and session.created, and never anything after."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    reader, writer = await asyncio.open_connection(sock=sock)
    key = base64.b64encode(b"0123456789abcdef").decode()
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101"), head
    first = await asyncio.wait_for(reader.readexactly(2), 10)  # session.created: a text frame under 64 KiB
    length = first[1] & 0x7F
    if length == 126:
        length = int.from_bytes(await reader.readexactly(2), "big")
    assert json.loads(await reader.readexactly(length))["type"] == "session.created"
    return reader, writer


# ── barge-in through the runtime's `interrupt` ──

INTERRUPTIBLE_FLOW = """
flow rtint

placeholder stream audio_in: Audio

global chat: History {
    max_turns 20
}

role ear {
    impl "rti_roles:Ear"
    interface hear { in audio_in  out stream heard: Json }
}

role voice {
    impl "rti_roles:Voice"
    lb session
    uses chat
    interface reply {
        join { heard: all }
        out stream text: Text, speech: Audio
    }
}

graph talk {
    entry  audio_in
    stream text ordered
    stream speech ordered
    interruptible
    serves realtime
}
"""

INTERRUPTIBLE_ROLES = ROLES.replace(
    """    async def reply(self, ctx, heard, settings):
        told = settings[0]
""",
    """    async def reply(self, ctx, heard):
        SEEN.append(getattr(ctx, "interrupted", None))
        told = {"instructions": ""}
""",
).replace("HEARD = []", "HEARD = []\nSEEN = []  # ctx.interrupted of each reply")


@contextlib.asynccontextmanager
async def interruptible(tmp_path):
    """INTERRUPTIBLE_FLOW served: (its runtime, the server, its roles' module, the reply's gate)."""
    bundle = bundle_with_roles(INTERRUPTIBLE_FLOW, INTERRUPTIBLE_ROLES, tmp_path, module="rti_roles")
    sys.modules.pop("rti_roles", None)
    async with opened(bundle) as runtime, served(runtime) as server:
        module = sys.modules["rti_roles"]
        gate = module.GATE[0] = asyncio.Semaphore(0)
        yield runtime, server, module, gate


def test_barge_in_on_an_interruptible_graph_tells_the_next_turn_exactly_what_was_delivered(tmp_path):
    async def main():
        async with interruptible(tmp_path) as (runtime, (app, base, client), module, gate):
            async with client_of(base).realtime.connect(model="talk") as connection:
                await until(connection, "session.created")
                await connection.input_audio_buffer.append(audio=b64([module.GATED, 1]))
                await connection.response.create()
                first = await until(connection, "response.created", [])
                delivered: dict[str, int] = {"text": 0, "speech": 0}
                kinds = {"response.output_audio_transcript.delta": "text", "response.output_audio.delta": "speech"}
                for _ in range(2):
                    gate.release()
                    for _ in range(2):
                        event = await asyncio.wait_for(connection.recv(), 10)
                        delivered[kinds[event.type]] += 1
                await connection.input_audio_buffer.append(audio=b64(CHUNKS_2[0]))
                await connection.response.create()  # turn 2 interrupts turn 1 through the runtime
                others: list = []
                for _ in range(20):
                    gate.release()
                    event = await asyncio.wait_for(connection.recv(), 10)
                    if getattr(event, "response_id", None) == first.response.id:
                        delivered[kinds[event.type]] += 1
                    elif event.type == "response.done" and event.response.id == first.response.id:
                        assert event.response.status == "cancelled"
                        break
                    else:
                        others.append(event)
                else:
                    raise AssertionError("turn 1 went on after the barge-in")
                _, _, done = await response_of(connection, others)
                assert done.response.status == "completed"
            await drained(Served(app, base, client), runtime)
            assert runtime.programs["talk"].calls_ended == {"cancelled": 1, "ok": 1}
            record = module.SEEN[1]  # turn 2's reply saw what the user received of turn 1
            assert record is not None and record.graph == "talk"
            assert dict(record.frames) == delivered, (dict(record.frames), delivered)

    run(main())


def test_a_barge_in_whose_call_cannot_start_still_stops_the_running_reply(tmp_path):
    # the interrupting call is the one that would cancel the running call; when the runtime
    # refuses it as it starts (a deployment that cannot take it now: the refusal is injected
    # here, wrapping `start`), the endpoint stops the running reply itself, says why the new
    # turn failed, and the connection goes on
    async def main():
        async with interruptible(tmp_path) as (runtime, (app, base, client), module, _):  # (turn 1 runs until stopped)
            start = runtime.start

            def refusing(graph, inputs, session=None, interrupt=False, **options):
                if interrupt:
                    raise FlowrtError("the deployment cannot take this call now")
                return start(graph, inputs, session=session, **options)

            runtime.start = refusing
            async with client_of(base).realtime.connect(model="talk") as connection:
                await until(connection, "session.created")
                await connection.input_audio_buffer.append(audio=b64([module.GATED, 1]))
                await connection.response.create()
                first = await until(connection, "response.created", [])
                await connection.input_audio_buffer.append(audio=b64(CHUNKS_2[0]))
                await connection.response.create()  # the barge-in
                seen: list = []
                stopped = await until(connection, "response.done", seen)
                assert (stopped.response.id, stopped.response.status) == (first.response.id, "cancelled")
                _, _, refused = await response_of(connection, seen)
                assert refused.response.status == "failed"
                assert "cannot take this call now" in refused.response.status_details.error.message
                await connection.input_audio_buffer.append(audio=b64(CHUNKS_2[1]))
                await connection.response.create()
                _, _, done = await response_of(connection, seen)
                assert done.response.status == "completed"
            await drained(Served(app, base, client), runtime)
            assert runtime.programs["talk"].calls_ended == {"cancelled": 1, "ok": 1}

    run(main())


def test_a_client_that_closes_mid_reply_takes_its_session_with_it(tmp_path):
    # the server cancels the handler when the client closes (handler_cancellation, as flowc run
    # serves): the connection's own session, whose state (the `chat` history) the runtime would
    # keep while idle, still goes with it, each time, not a session TTL later
    async def main():
        async with interruptible(tmp_path) as (runtime, (app, base, client), module, _):
            for _ in range(3):
                async with client.ws_connect(f"{base}/v1/realtime?model=talk") as ws:
                    assert (await ws.receive_json())["type"] == "session.created"
                    await ws.send_json({"type": "input_audio_buffer.append", "audio": b64([module.LONG, 1])})
                    await ws.send_json({"type": "response.create"})
                    while (await asyncio.wait_for(ws.receive_json(), 10))["type"] != "response.output_audio.delta":
                        pass
                # (closed mid-reply)
            await wait_for(lambda: runtime.statistics()["sessions"] == 0, 10, "the closed connections' sessions dropped")
            await drained(Served(app, base, client), runtime)

    run(main())


def test_a_conversation_with_a_barge_in_under_deploy_local(bundle):
    speech = ("response.output_audio.delta", "response.output_audio_transcript.delta")

    async def main():
        async with deployed(bundle, "local") as deployment, served(deployment.runtime, deployment=deployment) as served_:
            base, client = served_.base, served_.client
            async with client_of(base).realtime.connect(model="talk") as connection:
                await until(connection, "session.created")
                await connection.input_audio_buffer.append(audio=b64([333, 1]))  # a long reply (LONG)
                await connection.response.create()
                first = await until(connection, "response.created", [])
                await until(connection, "response.output_audio.delta", [])  # it streams ...
                for chunk in CHUNKS_2:
                    await connection.input_audio_buffer.append(audio=b64(chunk))
                await connection.response.create()  # ... and the user talks over it
                events: list = []
                done = await until(connection, "response.done", events, seconds=30)
                assert done.response.id == first.response.id and done.response.status == "cancelled"
                created, events, done = await response_of(connection, [e for e in events if e.type not in speech])
                assert deltas(events, "response.output_audio_transcript.delta") == ["heard 2 chunks,", "16 samples,", "-"]
                assert done.response.status == "completed"
            async with client.get(f"{base}/stats?idle=5") as answer:
                stats = await answer.json()
            assert stats["calls"] == 0 and stats["in_flight"] == [] and stats["admitted_running"] == 0, stats
            await assert_clean_everywhere(deployment)

    run(main(), 120)


def test_shutdown_ends_the_running_response_and_closes_going_away(bundle):
    from websockets.exceptions import ConnectionClosed

    async def main():
        sys.modules.pop("rt_roles", None)
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            roles().GATE[0] = asyncio.Semaphore(0)  # (the reply waits: it is running when the server stops)
            async with client_of(base).realtime.connect(model="talk") as connection:
                await until(connection, "session.created")
                await connection.input_audio_buffer.append(audio=b64([roles().GATED]))
                await connection.response.create()
                await until(connection, "response.created", [])
                stopping = asyncio.ensure_future(app.shutdown())  # (what SIGTERM's drain ends with)
                done = await until(connection, "response.done")
                assert done.response.status == "failed" and done.response.status_details.error.code == "shutdown"
                await asyncio.wait_for(stopping, 10)
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(connection.recv(), 10)
                assert closed.value.rcvd.code == 1001
            await drained(Served(app, base, client), runtime)
            assert runtime.programs["talk"].calls_ended == {"cancelled": 1}

    run(main())


def test_a_message_over_the_limit_closes_the_connection_1009_and_the_server_goes_on(bundle):
    from websockets.exceptions import ConnectionClosed

    async def main():
        sys.modules.pop("rt_roles", None)
        async with opened(bundle) as runtime, served(runtime, max_body_mb=1.0) as (app, base, client):
            async with client_of(base).realtime.connect(model="talk") as connection:
                await until(connection, "session.created")
                await connection.input_audio_buffer.append(audio=b64([1, 2, 3]))  # a turn is open: its call runs
                await wait_for(lambda: len(roles().HEARD) == 1, 10, "the turn's call hears its first chunk")
                big = b64([7] * (2**20 // 2 + 1))  # over --max-body-mb's 1 MiB
                await connection.input_audio_buffer.append(audio=big)
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(connection.recv(), 10)
                assert closed.value.rcvd.code == 1009
            async with client_of(base).realtime.connect(model="talk") as connection:  # the server goes on
                await until(connection, "session.created")
                await connection.session.update(session={"output_modalities": ["text"]})
                await until(connection, "session.updated")
                await connection.input_audio_buffer.append(audio=b64([5, 5]))
                await connection.response.create()
                _, events, done = await response_of(connection, [])
                assert done.response.status == "completed" and deltas(events, "response.output_text.delta")[1] == "2 samples,"
            await drained(Served(app, base, client), runtime)
            assert runtime.programs["talk"].calls_ended == {"cancelled": 1, "ok": 1}

    run(main())


def test_a_turn_without_an_admission_place_is_refused_and_the_next_one_is_answered(bundle):
    async def main():
        sys.modules.pop("rt_roles", None)
        front = FrontDoor(max_in_flight=1, max_queue=0)
        async with opened(bundle) as runtime, served(runtime, front) as (app, base, client):
            roles().GATE[0] = asyncio.Semaphore(0)
            connect = client_of(base).realtime.connect
            async with connect(model="talk") as first, connect(model="talk") as second:
                for connection in (first, second):
                    await until(connection, "session.created")
                await first.input_audio_buffer.append(audio=b64([roles().GATED]))  # holds the server's one place
                await first.response.create()
                await until(first, "response.created", [])
                await second.input_audio_buffer.append(audio=b64([6]))
                error = await until(second, "error")
                assert error.error.code == "rate_limit_exceeded" and "busy" in error.error.message
                await first.response.cancel()
                assert (await until(first, "response.done")).response.status == "cancelled"
                await second.session.update(session={"output_modalities": ["text"]})
                await until(second, "session.updated")
                await second.input_audio_buffer.append(audio=b64([6]))  # a place is free again
                await second.response.create()
                _, events, done = await response_of(second, [])
                assert done.response.status == "completed" and deltas(events, "response.output_text.delta")[1] == "1 samples,"
            await drained(Served(app, base, client), runtime)

    run(main())
