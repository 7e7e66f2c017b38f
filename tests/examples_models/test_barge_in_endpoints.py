"""Barge-in through both front doors for streaming input, on flowstd's `duplex` module and real
tiny models: the WebSocket graph endpoint (`/graphs/GRAPH/ws`, aiohttp's client) and the
Realtime endpoint (`/v1/realtime`, the official `openai` client). A conversation of three turns:
turn 1 is answered whole; turn 2 is talked over after a few audio chunks of its reply; turn 3
then reuses the KV pages of exactly what was delivered: the engine's counters (the thinker's
`turn` report, on the Realtime endpoint `response.done`'s usage) say turn 3's prompt is turn 1's
history, turn 2's question, the ids of turn 2's reply the client heard (two a speech chunk) and
its own question, and that the full pages of all but its own question were reused.

The detector here asks for a long reply in turn 2 (LongTurns), so that it is still speaking when
the client talks over it; everything else is flowstd's."""

from __future__ import annotations

import asyncio
import base64

import pytest

pytest.importorskip("torch", reason="the voice models need torch: pip install 'flowc[models]'")

from flowrt.deploy import open_deployment  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.deploy.helpers import bundle_with_roles  # noqa: E402
from tests.examples_models.test_duplex import SILENCE, silence, tone  # noqa: E402
from tests.examples_models.test_realtime_duplex import TALK  # noqa: E402
from tests.gateway.live import Served, drained, run, served  # noqa: E402
from tests.gateway.test_realtime import client_of, until  # noqa: E402

PAGE_TOKENS = 16  # flowstd's lib/kvcache.flow
HEARD_CHUNKS = 3  # audio chunks of turn 2's reply the client reads before it talks over it
TOKENS_PER_CHUNK = 2  # the talker: 4 vocoder frames a token, 8 a chunk
UTTERANCE = (silence(5), tone(25), silence(SILENCE + 1))

FLOW = (REPO / "stdlib" / "flowstd" / "lib" / "duplex.flow").read_text(encoding="utf-8").replace(
    "flow duplex", "flow bargein"
).replace('"flowstd.roles.duplex:EndOfTurn"', '"bargein_roles:LongTurns"') + TALK

ROLES = """
from flowstd.roles.duplex import EndOfTurn


class LongTurns(EndOfTurn):
    turns = {}  # session -> turns heard

    async def listen(self, ctx, audio_in):
        async for frame in super().listen(ctx, audio_in):
            if self.prompt_field in frame:  # turn 2's reply long enough to be talked over; the others short
                turn = self.turns[ctx.session] = self.turns.get(ctx.session, 0) + 1
                frame[self.prompt_field]["max_tokens"] = 400 if turn == 2 else 24
            yield frame
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return bundle_with_roles(FLOW, ROLES, tmp_path_factory.mktemp("bargein"), module="bargein_roles")


def expected_third(first: dict, heard_chunks: int) -> tuple[int, int]:
    """Turn 3's (prompt_tokens, reused_tokens), from turn 1's report and what was heard of turn 2:
    every turn asks the same question, so each question is turn 1's prompt long (the session was new)."""
    question = first["prompt_tokens"]
    before = first["prompt_tokens"] + first["completion_tokens"] + question + heard_chunks * TOKENS_PER_CHUNK
    return before + question, before // PAGE_TOKENS * PAGE_TOKENS


async def conversation_of(bundle, converse, idle_sessions: int) -> None:
    deployment = await open_deployment(bundle, "inproc")  # (its KV pools: a bare Runtime.open has none)
    runtime = deployment.runtime
    try:
        async with served(runtime) as (app, base, client):
            await converse(base, client)
            await drained(Served(app, base, client), runtime, idle_sessions=idle_sessions)
            assert runtime.programs["talk"].calls_ended == {"ok": 2, "cancelled": 1}
    finally:
        await deployment.close()


def test_over_the_websocket_endpoint_turn_three_reuses_exactly_what_was_delivered(bundle):
    async def converse(base, client):
        async with client.ws_connect(f"{base}/graphs/talk/ws?session=s", protocols=("flowrt.ws.v1",)) as ws:
            assert (await ws.receive_json())["type"] == "hello"

            async def start(name: str, interrupt: bool = False) -> None:
                await ws.send_json({"type": "start", "call": name, "binary": {"sample_rate": 16000}, "interrupt": interrupt})
                for chunk in UTTERANCE:
                    await ws.send_bytes(chunk)
                await ws.send_json({"type": "end", "call": name, "field": "audio_in"})

            async def events_until_done(name: str, seen: dict[str, list]) -> dict:
                while True:
                    message = await asyncio.wait_for(ws.receive_json(), 60)
                    assert message["type"] == "event", message
                    event = message["event"]
                    seen.setdefault(message["call"], []).append(event)
                    if message["call"] == name and event["event"] == "done":
                        return event

            seen: dict[str, list] = {}
            await start("t1")
            assert (await events_until_done("t1", seen))["status"] == "ok"
            (first,) = [e["value"] for e in seen["t1"] if e["event"] == "return"]

            await start("t2")
            while sum(e.get("field") == "speech" for e in seen.get("t2", [])) < HEARD_CHUNKS:
                message = await asyncio.wait_for(ws.receive_json(), 60)
                seen.setdefault(message["call"], []).append(message["event"])
            await start("t3", interrupt=True)
            done_2 = await events_until_done("t2", seen)
            assert (done_2["status"], done_2["reason"]) == ("cancelled", "interrupted")
            heard = sum(e.get("field") == "speech" for e in seen["t2"])  # every chunk the server sent of turn 2
            assert heard >= HEARD_CHUNKS
            assert (await events_until_done("t3", seen))["status"] == "ok"
            (third,) = [e["value"] for e in seen["t3"] if e["event"] == "return"]
            assert (third["prompt_tokens"], third["reused_tokens"]) == expected_third(first, heard)

    run(conversation_of(bundle, converse, idle_sessions=1), 240)  # (session `s` keeps its history)


def test_over_the_realtime_endpoint_turn_three_reuses_exactly_what_was_delivered(bundle):
    async def converse(base, client):
        async with client_of(base).realtime.connect(model="talk") as connection:
            await until(connection, "session.created")
            await connection.session.update(session={"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}})
            await until(connection, "session.updated")

            async def speak() -> None:
                for chunk in UTTERANCE:
                    await connection.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
                await connection.response.create()  # (commits the turn; a barge-in while a response runs)

            async def response_done(response_id: str | None, audio: dict[str, int]) -> object:
                """Events up to the response.done of `response_id` (the next one's, if None), the
                audio deltas of each response counted on the way."""
                while True:
                    event = await asyncio.wait_for(connection.recv(), 60)
                    if event.type == "response.output_audio.delta":
                        audio[event.response_id] = audio.get(event.response_id, 0) + 1
                    if event.type == "response.done" and response_id in (None, event.response.id):
                        return event.response

            audio: dict[str, int] = {}
            await speak()
            first = await response_done(None, audio)
            assert first.status == "completed", first.status_details
            usage_1 = first.usage
            report = {"prompt_tokens": usage_1.input_tokens, "completion_tokens": usage_1.output_tokens}
            assert usage_1.total_tokens == usage_1.input_tokens + usage_1.output_tokens
            assert usage_1.input_token_details.cached_tokens == 0  # a new session: nothing to reuse

            await speak()
            second = await until(connection, "response.created", [])
            while audio.get(second.response.id, 0) < HEARD_CHUNKS:
                event = await asyncio.wait_for(connection.recv(), 60)
                if event.type == "response.output_audio.delta":
                    audio[event.response_id] = audio.get(event.response_id, 0) + 1
            await speak()  # the user talks over turn 2's reply
            interrupted = await response_done(second.response.id, audio)
            assert interrupted.status == "cancelled" and interrupted.usage is None  # (cut before its report)
            third = await response_done(None, audio)
            assert third.status == "completed", third.status_details
            prompt, reused = expected_third(report, audio[second.response.id])
            assert (third.usage.input_tokens, third.usage.input_token_details.cached_tokens) == (prompt, reused)

    run(conversation_of(bundle, converse, idle_sessions=0), 240)  # (the connection's session went with it)
