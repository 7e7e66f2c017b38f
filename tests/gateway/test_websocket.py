"""The WebSocket graph endpoint `GET /graphs/GRAPH/ws` (protocol flowrt.ws.v1, docs/websocket.md)
and POST /graphs/GRAPH on a graph with a streaming entry: real servers on loopback (the
gateway's application on an aiohttp runner, as flowrt.deploy.serving runs it, over an
in-process runtime, or a `--deploy local` deployment), real WebSocket clients (aiohttp's, and a
raw socket for a client that never reads). Every wait is on a message, an event or a condition
with a deadline; the server's and runtime's tables are checked empty after each scenario."""

from __future__ import annotations

import array
import asyncio
import base64
import inspect
import io
import json
import os
import signal
import socket
import sys
import wave
from pathlib import Path

import aiohttp
import pytest
from aiohttp import WSMsgType, web

from flowrt.control import Runtime, bounds
from flowrt.frontdoor import FrontDoor
from flowrt.gateway import application
from flowrt.gateway.http import ADMISSION
from flowrt.gateway.websocket import MAX_CALLS
from flowrt.gateway.ws_wire import PROTOCOL
from flowrt.values import event_json
from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, deployed, wait_for
from tests.gateway.live import Served, drained, masked_text, opened, run, served
from tests.runtime.harness import assert_clean
from tests.runtime.test_serve import serving

FLOW = """
flow wsflow

placeholder stream audio_in: Audio
placeholder stream words: Text
placeholder stream blob: Bytes
placeholder voice: Text
placeholder order: Json

role listener {
    impl "ws_roles:Listener"
    interface hear { in audio_in  out stream heard: Json }
}

role counter {
    impl "ws_roles:Counter"
    interface count { join { heard: all }  out total: Json }
}

role greeter {
    impl "ws_roles:Greeter"
    interface greet { in voice  out greeting: Text }
}

role echo {
    impl "ws_roles:Echo"
    interface say { in words  out stream echoed: Text }
}

role store {
    impl "ws_roles:Store"
    interface keep { join { blob: all }  out size: Json }
}

role flood {
    impl "ws_roles:Flood"
    interface pour { in order  out stream item: Json }
}

graph listen {
    entry  audio_in, voice
    stream heard ordered
    return total, greeting
}

graph chat {
    entry  words
    stream echoed ordered
    interruptible
}

graph store {
    entry  blob
    return size
}

graph flood {
    entry  order
    stream item ordered
}

role speaker {
    impl "ws_roles:Speaker"
    interface speak { in words  out stream speech: Audio }
}

graph speak {
    entry  words
    stream speech ordered
}
"""

ROLES = """
import array
import base64

PRODUCED = [0]  # items the flood role has yielded


class Listener:
    async def hear(self, ctx, audio_in):
        samples = array.array("h", base64.b64decode(audio_in["data"]))
        yield {"heard": {"samples": len(samples), "sum": sum(samples), "format": audio_in["format"], "rate": audio_in["sample_rate"]}}


class Counter:
    async def count(self, ctx, heard):
        return {"total": sum(h["samples"] for h in heard)}


class Greeter:
    async def greet(self, ctx, voice):
        return {"greeting": f"hello, {voice}"}


class Echo:
    async def say(self, ctx, words):
        for word in words.split():
            yield {"echoed": word}


class Store:
    async def keep(self, ctx, blob):
        return {"size": {"frames": len(blob), "bytes": sum(len(b) for b in blob), "first": bytes(blob[0][:4]).hex() if blob else ""}}


class Speech:
    def __init__(self, samples):
        self.samples = samples

    def summary(self):
        return {"audio": {"samples": self.samples, "sample_rate": 16000}}

    def media(self):  # a PCM16 WAV of `samples` samples counting up, as flowstd's speech chunks carry theirs
        from flowrt import media

        pcm = array.array("h", range(self.samples)).tobytes()
        return media.carried("wav", media.encode_wav(pcm, 16000), sample_rate=16000, samples=self.samples)


class Speaker:
    async def speak(self, ctx, words):
        for word in words.split():
            yield {"speech": Speech(1600 * len(word))}


class Flood:
    async def pour(self, ctx, order):
        for i in range(order["count"]):
            PRODUCED[0] += 1
            yield {"item": {"i": i, "pad": "x" * order["pad"]}}
"""

CHUNKS = [[0, 1, -1, 32767, -32768], [5, -5, 1600], [7] * 40, [-3, 3]]


def pcm(samples: list[int]) -> bytes:
    return array.array("h", samples).tobytes()  # (little-endian on the machines the tests run on)


def audio_frame(samples: list[int], rate: int = 16000) -> dict:
    """What a binary message of `samples` becomes with `"binary": {"sample_rate": rate}`."""
    return {"format": "pcm16", "data": base64.b64encode(pcm(samples)).decode(), "sample_rate": rate}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return bundle_with_roles(FLOW, ROLES, tmp_path_factory.mktemp("wsflow"), module="ws_roles")


async def receive(ws: aiohttp.ClientWebSocketResponse, seconds: float = 10) -> dict:
    message = await ws.receive(timeout=seconds)
    assert message.type is WSMsgType.TEXT, (message.type, message.data, message.extra)
    return json.loads(message.data)


async def until_done(ws, call: str, seen: list[dict] | None = None, others: dict | None = None) -> list[dict]:
    """The events of `call` up to its `done`; other messages (other calls', errors) kept in
    `others` by call."""
    events = seen if seen is not None else []
    while True:
        message = await receive(ws)
        if message.get("call") != call or message["type"] != "event":
            assert others is not None, message
            others.setdefault(message.get("call"), []).append(message)
            continue
        assert message["type"] == "event", message
        events.append(message["event"])
        if message["event"]["event"] == "done":
            return events


async def expect_error(ws, events: list | None = None, **fields) -> dict:
    """The next error, checked; a call's events before it are kept in `events` if given."""
    message = await receive(ws)
    while events is not None and message["type"] == "event":
        events.append(message["event"])
        message = await receive(ws)
    assert message["type"] == "error", message
    for key, value in fields.items():
        if key == "words":
            for word in value:
                assert word in message["error"] + " " + message["hint"], message
        else:
            assert message.get(key) == value, (key, message)
    return message


async def expected_events(runtime: Runtime, graph: str, inputs: dict) -> list[dict]:
    """`runtime.call`'s events with the frames as a list, as the gateway renders them."""
    return [json.loads(event_json(e, media=True)) async for e in runtime.call(graph, inputs)]


def same_events(got: list[dict], want: list[dict]) -> None:
    """The same streams in order, returns and done (returns in any order, anywhere among the streams)."""
    assert [e for e in got if e["event"] == "stream"] == [e for e in want if e["event"] == "stream"]
    returns = sorted((e["field"], json.dumps(e["value"])) for e in got if e["event"] == "return")
    assert returns == sorted((e["field"], json.dumps(e["value"])) for e in want if e["event"] == "return")
    assert got[-1] == want[-1] and got[-1]["event"] == "done"
    assert len(got) == len(want)


# ── the protocol ──


def test_hello_names_the_protocol_and_the_graphs_entries_and_get_graphs_says_which_stream(bundle):
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client.ws_connect(f"{base}/graphs/listen/ws", protocols=(PROTOCOL,)) as ws:
                assert ws.protocol == PROTOCOL
                hello = await receive(ws)
                assert hello == {
                    "type": "hello",
                    "protocol": "flowrt.ws.v1",
                    "version": 1,
                    "graph": "listen",
                    "entries": {"audio_in": {"type": "Audio", "stream": True}, "voice": {"type": "Text", "stream": False}},
                    "stream": ["heard"],
                    "return": ["total", "greeting"],
                    "limits": {"max_message_bytes": 2**20, "max_calls": 16, "inbox": 64},
                }
            async with client.ws_connect(f"{base}/graphs/chat/ws") as ws:  # no subprotocol offered: still served
                assert ws.protocol is None and (await receive(ws))["graph"] == "chat"
            async with client.get(f"{base}/graphs") as answer:
                described = await answer.json()
            assert described["listen"]["entry_stream"] == ["audio_in"] and described["flood"]["entry_stream"] == []
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect(f"{base}/graphs/listen/ws", protocols=("flowrt.ws.v9",))
            assert refused.value.status == 400
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect(f"{base}/graphs/nope/ws")
            assert refused.value.status == 404
            async with client.get(f"{base}/graphs/listen/ws") as answer:  # no upgrade asked
                assert answer.status == 400
                assert "is a WebSocket endpoint" in (await answer.json())["error"]
            await drained(Served(app, base, client), runtime)

    run(main())


def test_two_calls_on_one_connection_the_second_while_the_first_still_streams(bundle):
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client.ws_connect(f"{base}/graphs/chat/ws") as ws:
                await receive(ws)  # hello
                await ws.send_json({"type": "start", "call": "one", "inputs": {}})
                await ws.send_json({"type": "frame", "call": "one", "field": "words", "value": "good morning"})
                first = [await receive(ws), await receive(ws)]  # call one streams, its input still open
                assert [m["event"]["value"] for m in first] == ["good", "morning"] and {m["call"] for m in first} == {"one"}
                await ws.send_json({"type": "start", "call": "two", "inputs": {}})
                await ws.send_json({"type": "frame", "call": "two", "field": "words", "value": "how are"})
                await ws.send_json({"type": "frame", "call": "two", "field": "words", "value": "you"})
                await ws.send_json({"type": "end", "call": "two", "field": "words"})
                two = await until_done(ws, "two")
                assert [e["value"] for e in two if e["event"] == "stream"] == ["how", "are", "you"]
                assert two[-1] == {"event": "done", "status": "ok", "errors": [], "missing": []}
                await ws.send_json({"type": "frame", "call": "one", "field": "words", "value": "world"})
                await ws.send_json({"type": "end", "call": "one", "field": "words"})
                one = await until_done(ws, "one", [m["event"] for m in first])
                same_events(one, await expected_events(runtime, "chat", {"words": ["good morning", "world"]}))
                same_events(two, await expected_events(runtime, "chat", {"words": ["how are", "you"]}))
                # an id is free again once its call is done
                await ws.send_json({"type": "start", "call": "one", "inputs": {}})
                await ws.send_json({"type": "end", "call": "one", "field": "words"})
                assert (await until_done(ws, "one"))[-1]["status"] == "ok"
            await drained(Served(app, base, client), runtime)

    run(main())


def test_audio_chunks_as_binary_messages_equal_runtime_call_with_the_frames_as_a_list(bundle):
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client.ws_connect(f"{base}/graphs/listen/ws", protocols=(PROTOCOL,)) as ws:
                await receive(ws)
                start = {"type": "start", "call": "a", "inputs": {"voice": "ada"}, "binary": {"sample_rate": 24000}}
                await ws.send_json(start)
                for chunk in CHUNKS:
                    await ws.send_bytes(pcm(chunk))
                await ws.send_json({"type": "end", "call": "a", "field": "audio_in"})
                got = await until_done(ws, "a")
                frames = [audio_frame(chunk, 24000) for chunk in CHUNKS]
                same_events(got, await expected_events(runtime, "listen", {"audio_in": frames, "voice": "ada"}))
                heard = [e["value"] for e in got if e["event"] == "stream"]
                assert heard == [{"samples": len(c), "sum": sum(c), "format": "pcm16", "rate": 24000} for c in CHUNKS]
                assert {e["field"]: e["value"] for e in got if e["event"] == "return"} == {
                    "total": sum(map(len, CHUNKS)),
                    "greeting": "hello, ada",
                }
                # once the entry has ended, binary messages go nowhere: an error, and the connection goes on
                await ws.send_json({**start, "call": "b", "binary": {"field": "audio_in"}})
                await ws.send_bytes(pcm([1, 2, 3]))  # (the default rate: 16 kHz)
                await ws.send_json({"type": "end", "call": "b", "field": "audio_in"})
                await ws.send_bytes(pcm([4]))
                others: dict = {}
                b = await until_done(ws, "b", others=others)
                (error,) = others.pop(None, None) or [await receive(ws)]
                assert error["type"] == "error" and error["about"] == "binary" and not others, (error, others)
                assert "no open call takes binary messages" in error["error"] and '"binary"' in error["hint"]
                assert [e["value"]["rate"] for e in b if e["event"] == "stream"] == [16000]
            async with client.ws_connect(f"{base}/graphs/store/ws") as ws:  # a Bytes entry gets the bytes
                await receive(ws)
                await ws.send_json({"type": "start", "call": "s", "binary": {}})
                await ws.send_bytes(b"\x00\x01\x02\x03\x04")
                await ws.send_json({"type": "frame", "call": "s", "field": "blob", "value": base64.b64encode(b"zz").decode()})
                await ws.send_json({"type": "end", "call": "s", "field": "blob"})
                got = await until_done(ws, "s")
                assert got[0]["value"] == {"frames": 2, "bytes": 7, "first": "00010203"}
            await drained(Served(app, base, client), runtime)

    run(main())


def test_a_calls_time_to_first_audio_is_on_metrics(bundle):
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client.ws_connect(f"{base}/graphs/speak/ws") as ws:
                await receive(ws)
                await ws.send_json({"type": "start", "call": "s", "inputs": {}})
                await ws.send_json({"type": "frame", "call": "s", "field": "words", "value": "one three"})
                await ws.send_json({"type": "end", "call": "s", "field": "words"})
                got = await until_done(ws, "s")
                speech = [e["value"] for e in got if e["event"] == "stream"]
                assert [(v["format"], v["samples"]) for v in speech] == [("wav", 4800), ("wav", 8000)]
            async with client.get(f"{base}/metrics") as answer:
                text = await answer.text()
            assert 'flowrt_time_to_first_audio_seconds_count{graph="speak"} 1.0' in text, text
            assert 'flowrt_audio_real_time_factor_count{graph="speak"} 1.0' in text
            await drained(Served(app, base, client), runtime)

    run(main())


def test_binary_out_sends_each_audio_value_as_the_event_then_its_bytes(bundle):
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client.ws_connect(f"{base}/graphs/speak/ws") as ws:
                await receive(ws)
                for call, binary_out in (("j", False), ("b", True)):  # two calls at once, one of each
                    await ws.send_json({"type": "start", "call": call, "inputs": {}, "binary_out": binary_out})
                    await ws.send_json({"type": "frame", "call": call, "field": "words", "value": "hi there"})
                    await ws.send_json({"type": "end", "call": call, "field": "words"})
                files: dict[str, list[bytes]] = {"j": [], "b": []}
                done: set[str] = set()
                while done != {"j", "b"}:
                    message = await receive(ws)
                    event = message["event"]
                    if event["event"] == "done":
                        assert event["status"] == "ok"
                        done.add(message["call"])
                    elif message["call"] == "j":
                        assert "binary" not in event["value"]
                        files["j"].append(base64.b64decode(event["value"]["base64"]))
                    else:  # the event says how many bytes; the very next message holds them
                        assert "base64" not in event["value"] and event["value"]["format"] == "wav"
                        data = await ws.receive(timeout=10)
                        assert data.type is WSMsgType.BINARY and len(data.data) == event["value"]["binary"]
                        files["b"].append(data.data)
                assert files["b"] == files["j"] and len(files["b"]) == 2
                with wave.open(io.BytesIO(files["b"][1])) as speech:
                    assert speech.getframerate() == 16000 and speech.getnframes() == 1600 * 5
                    assert array.array("h", speech.readframes(5)).tolist() == [0, 1, 2, 3, 4]
            await drained(Served(app, base, client), runtime)

    run(main())


def test_post_takes_a_streaming_entrys_frames_as_a_list(bundle):
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            inputs = {"audio_in": [audio_frame(c) for c in CHUNKS], "voice": "bo"}
            async with client.post(f"{base}/graphs/listen", json=inputs) as answer:
                assert answer.status == 200 and answer.content_type == "application/x-ndjson"
                got = [json.loads(line) for line in (await answer.text()).splitlines()]
            same_events(got, await expected_events(runtime, "listen", inputs))
            async with client.post(f"{base}/graphs/listen", json={"audio_in": "not a list", "voice": "bo"}) as answer:
                assert answer.status == 422
                assert "entry `audio_in` streams, so a call takes the list of its frames" in (await answer.json())["error"]
            async with client.post(f"{base}/graphs/listen", json={"audio_in": [1], "voice": "bo"}) as answer:
                assert answer.status == 422 and "takes frames of type `Audio`" in (await answer.json())["error"]
            await drained(Served(app, base, client), runtime)

    run(main())


# ── bad input ──


def test_bad_messages_are_errors_naming_the_place_and_the_fix_and_the_call_goes_on(bundle):
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client.ws_connect(f"{base}/graphs/listen/ws") as ws:
                await receive(ws)
                await ws.send_str("this is not json")
                await expect_error(ws, about=None, words=["must be a JSON object, and this is not JSON"])
                await ws.send_str("[1, 2]")
                await expect_error(ws, words=["not a JSON list", '"type": "start"'])
                await ws.send_json({"type": "shout", "call": "x"})
                await expect_error(ws, call="x", words=['unknown type "shout"', "start, frame, end, cancel"])
                await ws.send_json({"type": "frame", "call": "x", "feild": "audio_in", "value": 1})
                await expect_error(ws, about="frame", words=["unknown field `feild`", '"field": "audio_in"'])
                await ws.send_bytes(b"\x00\x00")  # no call takes binary messages
                await expect_error(ws, about="binary", words=["no open call takes binary messages"])
                await ws.send_json({"type": "frame", "call": "ghost", "field": "audio_in", "value": {}})
                await expect_error(ws, call="ghost", about="frame", words=["no call `ghost` is open"])
                # a start that cannot run: an error with `over`, nothing else follows for it
                await ws.send_json({"type": "start", "call": "bad", "inputs": {}})
                await expect_error(ws, call="bad", about="start", over=True, words=["missing voice"])
                await ws.send_json({"type": "start", "call": "bad", "inputs": {"voice": "v"}, "binary": {"field": "voice"}})
                await expect_error(ws, call="bad", over=True, words=["`voice` is not a streaming entry"])
                await ws.send_json({"type": "start", "call": "bad", "inputs": {"voice": "v"}, "timeout": -1})
                await expect_error(ws, call="bad", over=True, words=["timeout"])
                await ws.send_json({"type": "start", "call": "bad", "inputs": {"voice": "v"}, "binary": {"format": "mp3"}})
                await expect_error(ws, call="bad", over=True, words=["`format` is one of pcm16, wav, flac, ogg"])
                if "interrupt" not in inspect.signature(Runtime.start).parameters:
                    await ws.send_json({"type": "start", "call": "bad", "inputs": {"voice": "v"}, "interrupt": True})
                    await expect_error(ws, call="bad", over=True, words=["cannot interrupt", "leave `interrupt` out"])
                # a call, and what is wrong with its frames: each an error, the call goes on
                seen: list[dict] = []  # call c's events, which may come among the errors
                await ws.send_json({"type": "start", "call": "c", "inputs": {"voice": "v"}, "binary": {}})
                await ws.send_json({"type": "start", "call": "c", "inputs": {"voice": "v"}})
                await expect_error(ws, seen, call="c", over=True, words=["a call `c` is open on this connection already"])
                await ws.send_json({"type": "start", "call": "d", "inputs": {"voice": "v"}, "binary": {}})
                await expect_error(
                    ws, seen, call="d", over=True, words=["call `c` takes the connection's binary messages", "end it first"]
                )
                await ws.send_json({"type": "frame", "call": "c", "field": "voice", "value": "v"})
                await expect_error(
                    ws,
                    seen,
                    call="c",
                    about="frame",
                    words=["`voice` is an entry given when the call starts", "`audio_in` (Audio)"],
                )
                await ws.send_json({"type": "frame", "call": "c", "field": "audio_in", "value": 12})
                await expect_error(ws, seen, call="c", about="frame", words=["takes frames of type `Audio`", "not a number (12)"])
                await ws.send_bytes(pcm([9, 9]))
                await ws.send_json({"type": "end", "call": "c", "field": "voice"})
                await expect_error(ws, seen, call="c", about="end", words=["so it takes no frames"])
                await ws.send_json({"type": "end", "call": "c", "field": "audio_in"})
                await ws.send_json({"type": "frame", "call": "c", "field": "audio_in", "value": audio_frame([1])})
                await ws.send_json({"type": "end", "call": "c", "field": "audio_in"})
                others: dict = {}
                got = await until_done(ws, "c", seen, others=others)  # (errors about `c` may come among its events)
                assert [e["value"]["sum"] for e in got if e["event"] == "stream"] == [18]  # the one good frame
                assert got[-1]["status"] == "ok"
                late = others.pop("c", [])
                while len(late) < 2:
                    late.append(await receive(ws))
                assert not others and [m["type"] for m in late] == ["error", "error"], (others, late)
                assert "has ended (`end` came)" in late[0]["error"] and late[0]["about"] == "frame"
                assert "has ended already" in late[1]["error"] and late[1]["about"] == "end"
            await drained(Served(app, base, client), runtime)

    run(main())


def test_too_deep_json_a_start_refused_as_read_and_pcm16_frames_a_role_cannot_read_are_errors_and_all_goes_on(bundle):
    """JSON nested deeper than the server reads is an `error` (the connection stays open); every
    `start` refused as it is read (whatever field) says `over`; a pcm16 frame its role could not
    read (not base64, a part sample, a bad rate) is refused at the edge, and its call goes on."""

    def nested(depth: int) -> str:
        return "[" * depth + "]" * depth

    def pcm16(data: str, **more) -> dict:
        return {"format": "pcm16", "data": data} | more

    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client.ws_connect(f"{base}/graphs/listen/ws") as ws:
                await receive(ws)
                await ws.send_str(nested(100_000))
                await expect_error(ws, about=None, call=None, words=["nests too deeply", '"type": "frame"'])
                await ws.send_str('{"type": "shout", "call": "x", "deep": ' + nested(3000) + "}")  # (read again, plainly)
                await expect_error(ws, about=None, call=None, words=["nests too deeply"])
                for rate in (0, 10**9, 384_001, -5, 1.5, "x"):  # the call never existed: `over`
                    await ws.send_json(
                        {"type": "start", "call": "sr0", "inputs": {"voice": "v"}, "binary": {"sample_rate": rate}}
                    )
                    await expect_error(ws, call="sr0", about="start", over=True, words=["at `$.binary.sample_rate`"])
                await ws.send_json({"type": "start", "call": "s1", "inputs": {"voice": "v"}, "sesion": "x"})
                await expect_error(ws, call="s1", about="start", over=True, words=["unknown field `sesion`"])
                await ws.send_json({"type": "start", "call": "s2", "inputs": "v"})
                await expect_error(ws, call="s2", about="start", over=True, words=["at `$.inputs`"])
                await ws.send_json({"type": "start", "inputs": {"voice": "v"}})
                await expect_error(ws, call=None, about="start", over=True, words=["missing required field `call`"])
                await ws.send_json({"type": "frame", "call": "x", "field": 3, "value": 1})  # not a start: not `over`
                assert "over" not in await expect_error(ws, call="x", about="frame", words=["at `$.field`"])
                # a call at the highest rate, and frames its role could not read: each refused, the call goes on
                seen: list[dict] = []
                await ws.send_json({"type": "start", "call": "c", "inputs": {"voice": "v"}, "binary": {"sample_rate": 384_000}})
                await ws.send_str('{"type": "frame", "call": "c", "field": "audio_in", "value": ' + nested(3000) + "}")
                await expect_error(ws, seen, about=None, call=None, words=["nests too deeply"])
                odd = base64.b64encode(b"\x01\x02\x03").decode()
                for value, words in [
                    (pcm16("!!!not b64"), ["`audio_in`", "not valid base64", '"format": "pcm16"']),
                    (pcm16("https://example.com/a.pcm"), ["remote URL"]),
                    (pcm16(17), ["base64 text, not"]),
                    (pcm16(odd), ["holds 3 bytes", "2 bytes each"]),
                    (pcm16(audio_frame([1])["data"], sample_rate=0), ["`sample_rate`", "not 0"]),
                    (pcm16(audio_frame([1])["data"], sample_rate=10**9), ["from 1 to 384000"]),
                    (pcm16(audio_frame([1])["data"], sample_rate="16000"), ["`sample_rate`"]),
                ]:
                    await ws.send_json({"type": "frame", "call": "c", "field": "audio_in", "value": value})
                    refused = await expect_error(ws, seen, call="c", about="frame", words=words)
                    assert "over" not in refused, refused
                await ws.send_bytes(b"\x01\x02\x03")  # a part sample as a binary message
                await expect_error(ws, seen, call="c", about="binary", words=["3 bytes", "2 bytes each"])
                await ws.send_bytes(pcm([1, 2]))
                await ws.send_json({"type": "frame", "call": "c", "field": "audio_in", "value": audio_frame([4], 8000)})
                await ws.send_json({"type": "end", "call": "c", "field": "audio_in"})
                got = await until_done(ws, "c", seen)
                heard = [(e["value"]["sum"], e["value"]["rate"]) for e in got if e["event"] == "stream"]
                assert heard == [(3, 384_000), (4, 8000)] and got[-1]["status"] == "ok", got
            await drained(Served(app, base, client), runtime)

    run(main())


def test_a_start_with_interrupt_cuts_the_sessions_running_call_short(bundle):
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            async with client.ws_connect(f"{base}/graphs/chat/ws", headers={"X-Flow-Session": "conv"}) as ws:
                await receive(ws)
                await ws.send_json({"type": "start", "call": "t1", "inputs": {}})
                await ws.send_json({"type": "frame", "call": "t1", "field": "words", "value": "a long reply"})
                seen = [(await receive(ws))["event"] for _ in range(3)]  # t1 streams, its input still open
                await ws.send_json({"type": "start", "call": "t2", "inputs": {}, "interrupt": True})
                await ws.send_json({"type": "frame", "call": "t2", "field": "words", "value": "stop"})
                await ws.send_json({"type": "end", "call": "t2", "field": "words"})
                others: dict = {}
                one = await until_done(ws, "t1", seen, others)
                assert one[-1]["status"] == "cancelled" and one[-1]["reason"] == "interrupted"
                assert [e["value"] for e in one if e["event"] == "stream"] == ["a", "long", "reply"]  # what was delivered
                two = await until_done(ws, "t2", [m["event"] for m in others.pop("t2", [])])
                assert [e["value"] for e in two if e["event"] == "stream"] == ["stop"] and two[-1]["status"] == "ok"
            async with client.ws_connect(f"{base}/graphs/chat/ws") as ws:  # no session: nothing to interrupt
                await receive(ws)
                await ws.send_json({"type": "start", "call": "t3", "inputs": {}, "interrupt": True})
                await expect_error(
                    ws, call="t3", about="start", over=True, words=["`interrupt`", '"session" in `start`', "?session="]
                )
            await drained(Served(app, base, client), runtime)

    run(main())


def test_a_message_over_the_limit_closes_the_connection_1009_and_the_server_goes_on(bundle):
    async def main():
        async with opened(bundle) as runtime, served(runtime, max_body_mb=0.25) as (app, base, client):
            async with client.ws_connect(f"{base}/graphs/chat/ws") as ws:
                hello = await receive(ws)
                assert hello["limits"]["max_message_bytes"] == 2**18
                await ws.send_json({"type": "start", "call": "c", "inputs": {}})
                await ws.send_json({"type": "frame", "call": "c", "field": "words", "value": "first"})
                assert (await receive(ws))["event"]["value"] == "first"
                await ws.send_json({"type": "frame", "call": "c", "field": "words", "value": "x" * 2**18})
                closing = await ws.receive(timeout=10)
                assert closing.type is WSMsgType.CLOSE and closing.data == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
            await drained(Served(app, base, client), runtime)  # its call was cancelled
            assert runtime.programs["chat"].calls_ended == {"cancelled": 1}
            async with client.ws_connect(f"{base}/graphs/chat/ws") as ws:  # the server goes on
                await receive(ws)
                await ws.send_json({"type": "start", "call": "c", "inputs": {}})
                await ws.send_json({"type": "frame", "call": "c", "field": "words", "value": "x" * 1000})
                await ws.send_json({"type": "end", "call": "c", "field": "words"})
                assert (await until_done(ws, "c"))[-1]["status"] == "ok"
            await drained(Served(app, base, client), runtime)

    run(main())


def test_a_client_that_disconnects_cancels_its_calls_and_cancel_ends_one(bundle):
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            ws = await client.ws_connect(f"{base}/graphs/chat/ws")
            await receive(ws)
            for call in ("p", "q"):
                await ws.send_json({"type": "start", "call": call, "inputs": {}})
                await ws.send_json({"type": "frame", "call": call, "field": "words", "value": "hi"})
                assert (await receive(ws))["call"] == call
            await ws.send_json({"type": "cancel", "call": "p"})
            done = await until_done(ws, "p")
            assert done[-1]["status"] == "cancelled" and done[-1]["reason"] == "cancelled by the client"
            await ws.send_json({"type": "frame", "call": "p", "field": "words", "value": "late"})
            await expect_error(ws, call="p", words=["no call `p` is open"])
            assert len(runtime.calls) == 1  # q: its input is open
            await ws.close()  # q is left running: the server cancels it
            await drained(Served(app, base, client), runtime)
            assert runtime.programs["chat"].calls_ended == {"cancelled": 2}

    run(main())


def test_a_cancel_right_after_its_start_ends_the_call_with_over_and_frees_its_id(bundle):
    # the cancel is read before the call's task has taken a step: still one error with `over`
    # (code `cancelled`) per call, and the id is free again; more than MAX_CALLS such calls in a row
    # leave the connection taking calls
    async def main():
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            ws = await client.ws_connect(f"{base}/graphs/chat/ws")
            await receive(ws)
            for _ in range(MAX_CALLS + 2):
                await ws.send_json({"type": "start", "call": "p", "inputs": {}})
                await ws.send_json({"type": "cancel", "call": "p"})
                await expect_error(ws, call="p", about="start", code="cancelled", over=True)
            await ws.send_json({"type": "start", "call": "p", "inputs": {}})
            await ws.send_json({"type": "frame", "call": "p", "field": "words", "value": "hi there"})
            await ws.send_json({"type": "end", "call": "p", "field": "words"})
            assert (await until_done(ws, "p"))[-1]["status"] == "ok"
            await ws.close()
            await drained(Served(app, base, client), runtime)

    run(main())


def test_a_client_that_never_reads_holds_a_bounded_amount_and_others_are_served(bundle):
    async def main():
        sys.modules.pop("ws_roles", None)
        async with opened(bundle) as runtime, served(runtime) as (app, base, client):
            produced = sys.modules["ws_roles"].PRODUCED
            produced[0] = 0
            host, port = base.removeprefix("http://").rsplit(":", 1)
            reader, writer = await raw_websocket(host, int(port), "/graphs/flood/ws")
            count, pad = 20_000, 4096  # 80 MB of events, if nothing held the role back
            writer.write(masked_text({"type": "start", "call": "f", "inputs": {"order": {"count": count, "pad": pad}}}))
            await writer.drain()

            def held_back() -> bool:
                calls = [c for c in runtime.calls if c.program.name == "flood"]
                return bool(calls) and len(calls[0].outbox) >= bounds.OUTBOX_HIGH

            await wait_for(held_back, 20, "the flood call's events wait in its bounded outbox")
            async with client.ws_connect(f"{base}/graphs/chat/ws") as ws:  # another client is served meanwhile
                await receive(ws)
                await ws.send_json({"type": "start", "call": "c", "inputs": {}})
                await ws.send_json({"type": "frame", "call": "c", "field": "words", "value": "still here"})
                await ws.send_json({"type": "end", "call": "c", "field": "words"})
                assert [e["value"] for e in await until_done(ws, "c") if e["event"] == "stream"] == ["still", "here"]
            (flood,) = [c for c in runtime.calls if c.program.name == "flood"]
            assert len(flood.outbox) <= bounds.OUTBOX_HIGH + 1 and produced[0] < count // 2, (len(flood.outbox), produced)
            (stuck,) = app[_connections()]  # (the other client has gone)
            assert stuck._writer.transport.get_write_buffer_size() <= 2**20
            writer.transport.abort()  # the client goes: its call is cancelled, the server lets everything go
            await drained(Served(app, base, client), runtime)
            assert runtime.programs["flood"].calls_ended == {"cancelled": 1}

    run(main(), 90)


def _connections():
    from flowrt.gateway.websocket import CONNECTIONS

    return CONNECTIONS


async def raw_websocket(host: str, port: int, path: str):
    """A WebSocket client on a plain socket with a small receive buffer, which reads the
    handshake's answer and the hello, and never anything after."""
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
    first = await asyncio.wait_for(reader.readexactly(2), 10)  # the hello: a text frame under 64 KiB
    length = first[1] & 0x7F
    if length == 126:
        length = int.from_bytes(await reader.readexactly(2), "big")
    assert json.loads(await reader.readexactly(length))["type"] == "hello"
    return reader, writer


# ── the front door ──


def test_keys_sessions_admission_and_the_drain_apply_to_each_call(bundle):
    async def main():
        front = FrontDoor(api_keys=("alice-key-123456", "bob-key-12345678"), max_in_flight=2, max_queue=0)
        async with opened(bundle) as runtime, served(runtime, front) as (app, base, client):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect(f"{base}/graphs/chat/ws")
            assert refused.value.status == 401
            alice = {"Authorization": "Bearer alice-key-123456"}
            bob = {"Authorization": "Bearer bob-key-12345678"}
            async with client.ws_connect(f"{base}/graphs/chat/ws?session=s1", headers=alice) as ws:
                await receive(ws)
                await ws.send_json({"type": "start", "call": "a", "inputs": {}})  # (the connection's session, s1)
                await ws.send_json({"type": "frame", "call": "a", "field": "words", "value": "mine"})
                assert (await receive(ws))["event"]["value"] == "mine"  # a runs, in session s1: one place of two
                async with client.ws_connect(f"{base}/graphs/chat/ws", headers=bob) as other:
                    await receive(other)
                    await other.send_json({"type": "start", "call": "x", "inputs": {}, "session": "s1"})
                    await expect_error(other, call="x", over=True, code="session_not_yours", words=["belongs to another API key"])
                await ws.send_json({"type": "start", "call": "b", "inputs": {}, "session": "s2"})
                await ws.send_json({"type": "frame", "call": "b", "field": "words", "value": "too"})
                assert (await receive(ws))["event"]["value"] == "too"  # the second place
                await ws.send_json({"type": "start", "call": "c", "inputs": {}, "session": "s3"})
                await expect_error(ws, call="c", about="start", over=True, code="rate_limit_exceeded", words=["--max-in-flight"])
                for call in ("a", "b"):
                    await ws.send_json({"type": "end", "call": call, "field": "words"})
                    assert (await until_done(ws, call))[-1]["status"] == "ok"
                app[ADMISSION].drain()
                await ws.send_json({"type": "start", "call": "y", "inputs": {}})
                await expect_error(ws, call="y", over=True, code="shutdown")
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect(f"{base}/graphs/chat/ws", headers=alice)
            assert refused.value.status == 503
            await drained(Served(app, base, client), runtime, alice)

    run(main())


def test_shutdown_closes_open_connections_going_away(bundle):
    async def main():
        runtime = await Runtime.open(bundle)
        app = application(runtime)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        try:
            async with aiohttp.ClientSession() as client:
                ws = await client.ws_connect(f"http://{host}:{port}/graphs/chat/ws")
                await receive(ws)
                await ws.send_json({"type": "start", "call": "c", "inputs": {}})
                await ws.send_json({"type": "frame", "call": "c", "field": "words", "value": "hi"})
                await receive(ws)
                cleanup = asyncio.ensure_future(runner.cleanup())  # (before the runtime closes: its calls are open)
                got = await until_done(ws, "c")
                assert got[-1]["status"] == "cancelled" and got[-1]["reason"] == "shutdown"
                closing = await ws.receive(timeout=10)
                assert closing.type is WSMsgType.CLOSE and closing.data == aiohttp.WSCloseCode.GOING_AWAY
                await asyncio.wait_for(cleanup, 10)
            assert_clean(runtime)
        finally:
            await runtime.close()

    run(main())


# ── under --deploy local ──


def test_a_conversation_under_deploy_local(bundle):
    async def main():
        async with deployed(bundle, "local") as deployment:
            runtime = deployment.runtime
            async with served(runtime, deployment=deployment) as (app, base, client):
                async with client.ws_connect(f"{base}/graphs/listen/ws", protocols=(PROTOCOL,)) as ws:
                    await receive(ws)
                    await ws.send_json({"type": "start", "call": "t1", "inputs": {"voice": "ann"}, "binary": {}})
                    await ws.send_bytes(pcm(CHUNKS[0]))
                    seen = [(await receive(ws))["event"]]
                    while seen[-1]["event"] != "stream":  # (the greeting may come first)
                        seen.append((await receive(ws))["event"])
                    assert seen[-1]["value"]["sum"] == sum(CHUNKS[0])  # the call runs while its input is open
                    await ws.send_bytes(pcm(CHUNKS[1]))
                    await ws.send_json({"type": "end", "call": "t1", "field": "audio_in"})
                    await ws.send_json({"type": "start", "call": "t2", "inputs": {"voice": "bo"}, "binary": {}})
                    await ws.send_bytes(pcm(CHUNKS[2]))
                    await ws.send_json({"type": "end", "call": "t2", "field": "audio_in"})
                    others: dict = {}
                    one = await until_done(ws, "t1", seen, others)
                    two = await until_done(ws, "t2", [m["event"] for m in others.pop("t2", [])])
                    assert not others
                    frames = [audio_frame(c) for c in CHUNKS[:2]]
                    same_events(one, await expected_events(runtime, "listen", {"audio_in": frames, "voice": "ann"}))
                    same_events(
                        two, await expected_events(runtime, "listen", {"audio_in": [audio_frame(CHUNKS[2])], "voice": "bo"})
                    )
                await drained_deployment(app, base, client, deployment)

    run(main(), 120)


async def drained_deployment(app, base, client, deployment) -> None:
    async with client.get(f"{base}/stats?idle=5") as answer:
        stats = await answer.json()
    assert stats["calls"] == 0 and stats["in_flight"] == [] and stats["admitted_running"] == 0, stats
    await assert_clean_everywhere(deployment)


def test_flowc_run_serves_it_under_local_and_sigterm_ends_open_calls_then_closes_going_away(bundle):
    """The real server process (`flowc run --http --deploy local --grace 0`): a call over the
    WebSocket, and SIGTERM while one is open: its `done` says `shutdown`, then close 1001, exit 0."""
    command = [sys.executable, "-m", "flowc", "run", str(bundle), "--http", "127.0.0.1:0", "--deploy", "local", "--grace", "0"]

    async def main(server):
        base = f"http://{server.host}:{server.port}"
        async with aiohttp.ClientSession() as client, client.ws_connect(f"{base}/graphs/listen/ws") as ws:
            assert (await receive(ws))["protocol"] == PROTOCOL
            await ws.send_json({"type": "start", "call": "a", "inputs": {"voice": "cy"}, "binary": {}})
            await ws.send_bytes(pcm(CHUNKS[1]))
            await ws.send_json({"type": "end", "call": "a", "field": "audio_in"})
            got = await until_done(ws, "a")
            assert [e["value"]["sum"] for e in got if e["event"] == "stream"] == [sum(CHUNKS[1])]
            await ws.send_json({"type": "start", "call": "b", "inputs": {"voice": "cy"}, "binary": {}})
            await ws.send_bytes(pcm(CHUNKS[0]))
            seen = [(await receive(ws))["event"]]
            while seen[-1]["event"] != "stream":  # b runs, its input open
                seen.append((await receive(ws))["event"])
            os.kill(server.process.pid, signal.SIGTERM)
            done = (await until_done(ws, "b", seen))[-1]
            assert done["status"] == "cancelled" and done["reason"] == "shutdown", done
            closing = await ws.receive(timeout=30)
            assert closing.type is WSMsgType.CLOSE and closing.data == aiohttp.WSCloseCode.GOING_AWAY

    with serving(bundle, command) as server:
        run(main(server), 120)
        assert server.process.wait(timeout=60) == 0
