"""The WebSocket graph endpoint `GET /graphs/{graph}/ws` (protocol `flowrt.ws.v1`; docs/websocket.md):
calls whose streaming entries' frames arrive while they run, several at once on one connection.

A connection is a `Connection`: it sends `hello`, then reads the client's messages in order
(decoded and checked at the edge, flowrt.gateway.ws_wire) and runs each `start` as a `Turn`, a
task that holds an admission place (flowrt.gateway.admission) and its session's claim
(flowrt.gateway.access) for the call's life, feeds the call's frames and ends from its inbox to
`CallHandle.send` / `end` (flowrt.control.inputs) and writes its events, each as an `event`
message tagged with the call. What the client gets wrong is an `error` message naming the
place and the fix; the call and the connection go on. A connection that closes, for whatever
reason, cancels its calls (reason `client gone`) and waits until they are retired.

Bounds: a call's inbox holds `INBOX` messages; while it is full (the call has not started yet,
or its consumers are behind: rule 13's bounds in `send`), the connection is not read, so TCP
holds the client back. A client that does not read its events holds its calls' events in the
runtime's bounded outbox, and the socket's writes wait for it (aiohttp's drain): nothing grows
without bound; a peer that answers no ping (`HEARTBEAT`) is closed. A message over the server's
body limit (--max-body-mb) closes the connection with code 1009; a connection has at most
`MAX_CALLS` calls open at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import logging
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from flowrt import media as media_files
from flowrt.control import BadInputs, BadTimeout, InputClosed, Runtime, UnknownGraph
from flowrt.control.inputs import CallHandle, check_frame, streaming_entry
from flowrt.control.program import GraphProgram
from flowrt.control.sessions import reserved
from flowrt.errors import FlowrtError
from flowrt.gateway import ws_wire as wire
from flowrt.gateway.access import PRINCIPAL, SessionOwners, offered_protocols, refused_session
from flowrt.gateway.admission import Admission, Refused
from flowrt.gateway.exposure import client_events, hide_paths
from flowrt.observe.audio import AudioClock, AudioFigures
from flowrt.values import event_json

MAX_CALLS = 16  # calls open at once on one connection
INBOX = 64  # a call's frames and ends read from the connection and not yet taken by the runtime
HEARTBEAT = 30.0  # seconds of silence after which the server pings; no pong within half of it closes the connection
BINARY_TYPES = ("Audio", "Bytes")  # the types of streaming entry a binary message can be a frame of
CONNECTIONS: web.AppKey[dict] = web.AppKey("websockets", dict)  # the open connections (ws -> Connection)
SHUTDOWN_WAIT = 5.0  # seconds the server's shutdown waits for a connection's cancelled calls to write their `done`
log = logging.getLogger("flowrt.gateway")
_UNLIMITED = media_files.MediaLimits(max_media_bytes=2**62)


def add_routes(
    app: web.Application,
    runtime: Runtime,
    admission: Admission,
    owners: SessionOwners,
    max_bytes: int,
    audio: AudioFigures | None = None,
) -> None:
    """Register `GET /graphs/{graph}/ws` on the gateway's application (flowrt.gateway.http does),
    sharing its admission and session owners; messages are limited to `max_bytes`; each call's
    time to first audio and real-time factor go to `audio` (flowrt.observe.audio)."""
    endpoint = WebSocketEndpoint(runtime, admission, owners, max_bytes, audio)
    app[CONNECTIONS] = endpoint.connections
    app.router.add_get("/graphs/{graph}/ws", endpoint.connect)
    app.on_shutdown.append(endpoint.shutdown)


def _error(status: int, message: str, hint: str, code: str | None = None, headers: dict | None = None) -> web.Response:
    body = {"error": message, "hint": hint} | ({"code": code} if code is not None else {})
    return web.json_response(body, status=status, headers=headers)


class WebSocketEndpoint:
    def __init__(self, runtime: Runtime, admission: Admission, owners: SessionOwners, max_bytes: int, audio: AudioFigures | None):
        self.runtime, self.admission, self.owners, self.max_bytes, self.audio = runtime, admission, owners, max_bytes, audio
        self.connections: dict[web.WebSocketResponse, Connection] = {}

    async def connect(self, request: web.Request) -> web.StreamResponse:
        """The upgrade, refused as the gateway refuses a call (404, 400, 503) before it happens."""
        runtime, graph = self.runtime, request.match_info["graph"]
        program = runtime.programs.get(graph)
        if program is None:
            known = ", ".join(sorted(runtime.programs))
            return _error(
                404, f"no graph `{graph}` in bundle `{runtime.bundle.name}`", f"connect to /graphs/GRAPH/ws, GRAPH one of {known}"
            )
        session = request.headers.get("X-Flow-Session") or request.query.get("session")
        if session is not None and reserved(session):
            return _error(400, f"`X-Flow-Session`: {reserved(session)}", "leave the session out for calls of their own")
        offered = offered_protocols(request)
        if offered and wire.PROTOCOL not in offered:
            return _error(
                400,
                f"the client offers the subprotocols {', '.join(offered)}; this server speaks {wire.PROTOCOL}",
                f"offer `{wire.PROTOCOL}` (or no subprotocol)",
            )
        if self.admission.draining:
            refused = Refused(503, "the server is stopping and takes no new connections", "shutdown")
            return _error(503, refused.message, "connect to another server", refused.code, refused.headers())
        ws = web.WebSocketResponse(protocols=(wire.PROTOCOL,), max_msg_size=self.max_bytes, compress=False, heartbeat=HEARTBEAT)
        if not ws.can_prepare(request).ok:
            return _error(
                400,
                f"{request.path} is a WebSocket endpoint and this request asks for no upgrade",
                f"connect with a WebSocket client (protocol {wire.PROTOCOL}; docs/websocket.md), "
                f"or POST /graphs/{graph} for a call whose input is known when it starts",
            )
        await ws.prepare(request)
        connection = self.connections[ws] = Connection(self, request, ws, program, session)
        try:
            await connection.serve()
        except Exception:  # noqa: BLE001 - a bug in flowrt: logged, and the connection closed as WebSocket says (1011)
            log.exception("internal error on the WebSocket %s", request.path)  # (not an HTTP answer: it is upgraded)
            with contextlib.suppress(Exception):
                await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"internal error; the server's log tells it")
        finally:
            self.connections.pop(ws, None)
        return ws

    async def shutdown(self, app: web.Application) -> None:
        """The server stops: every call still open is cancelled (reason `shutdown`) and writes its
        `done` (for at most SHUTDOWN_WAIT seconds), then every connection closes (1001, going away)."""
        tasks = []
        for connection in list(self.connections.values()):
            tasks += await connection.cancel_calls("shutdown")
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_WAIT)
        for ws in list(self.connections):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"the server is stopping")


class Turn:
    """One call of a connection: its handle, its inbox of frames and ends, what the client ended."""

    def __init__(self, name: str, start: wire.Start, handle: CallHandle, session: str | None, binary: tuple | None):
        self.name, self.start, self.handle, self.session, self.binary = name, start, handle, session, binary
        self.inbox: asyncio.Queue[tuple[str, str, Any]] = asyncio.Queue(INBOX)
        self.ended: set[str] = set()  # streaming entries the client has ended
        self.fed_ends = 0  # ... and the runtime has taken the end of
        loop = asyncio.get_running_loop()
        self.now = loop.time
        self.clock = AudioClock(handle.graph, loop.time(), streaming=bool(handle.program.entry_stream))
        self.task: asyncio.Task | None = None
        self.running = False  # its task has taken its first step (a task cancelled before that runs no `finally`)
        self.cancelled = False  # by the client's `cancel`
        self.closed_told = False  # an InputClosed was reported (once per call)


class Connection:
    """One client's WebSocket: its messages in, its calls' events out (the module docstring)."""

    def __init__(
        self,
        endpoint: WebSocketEndpoint,
        request: web.Request,
        ws: web.WebSocketResponse,
        program: GraphProgram,
        session: str | None,
    ):
        self.endpoint, self.request, self.ws, self.program, self.session = endpoint, request, ws, program, session
        self.runtime = endpoint.runtime
        self.types: dict[str, str] = self.runtime.entry_types.get(program.name, {})
        self.turns: dict[str, Turn] = {}
        self.binary_turn: Turn | None = None  # the call binary messages go to
        self.interrupts = "interrupt" in inspect.signature(self.runtime.start).parameters
        self.sending = asyncio.Lock()  # (an event and the binary message of its media go out together)

    async def serve(self) -> None:
        limits = {"max_message_bytes": self.endpoint.max_bytes, "max_calls": MAX_CALLS, "inbox": INBOX}
        try:
            await self.ws.send_str(wire.hello(self.program, self.types, limits))
            async for message in self.ws:  # (ends at the client's close, or a message over the limit)
                if message.type is WSMsgType.TEXT:
                    await self.text(message.data)
                elif message.type is WSMsgType.BINARY:
                    await self.binary(message.data)
        except ConnectionError:
            pass  # the client is gone
        finally:
            await self.close_calls()

    async def close_calls(self) -> None:
        """Cancel every call (`client gone`) and wait until each is retired."""
        turns = [turn.task for turn in self.turns.values() if turn.task is not None]
        for task in turns:
            task.cancel()
        if turns:
            await asyncio.gather(*turns, return_exceptions=True)

    async def cancel_calls(self, reason: str) -> list[asyncio.Task]:
        """Cancel every call (those not started yet never start); their tasks, which end once
        each has written its `done`."""
        tasks = []
        for turn in list(self.turns.values()):
            if turn.task is not None:
                tasks.append(turn.task)
                await self.cancel(turn, reason)
        return tasks

    async def say(self, text: str, data: bytes | None = None) -> None:
        """Send one message (and a binary one right after it); a client gone meanwhile is not an
        error here (its reader ends)."""
        with contextlib.suppress(ConnectionError):
            await self.send(text, data)

    async def send(self, text: str, data: bytes | None = None) -> None:
        async with self.sending:
            await self.ws.send_str(text)
            if data is not None:
                await self.ws.send_bytes(data)

    async def fail(self, message: str, hint: str, **fields: Any) -> None:
        await self.say(wire.error(message, hint, **fields))

    # ── the client's messages ──

    async def text(self, data: str) -> None:
        try:
            message = wire.decode(data)
        except wire.WireError as error:
            await self.fail(error.message, error.hint, call=error.call, about=error.about, over=error.over)
            return
        if isinstance(message, wire.Start):
            await self.started(message)
            return
        turn = self.turns.get(message.call)
        about = type(message).__name__.lower()
        if turn is None:
            open_calls = ", ".join(f"`{name}`" for name in self.turns) or "none"
            await self.fail(
                f"`{about}`: no call `{message.call}` is open on this connection (open: {open_calls})",
                "start it first; a call's id is free again once its `done` event (or an error with `over`) came",
                call=message.call,
                about=about,
            )
        elif isinstance(message, wire.Cancel):
            await self.cancel(turn)
        elif isinstance(message, wire.Frame):
            await self.frame(turn, message.field, message.value, about)
        else:
            await self.end(turn, message.field)

    async def frame(self, turn: Turn, field: str, value: Any, about: str) -> None:
        """A frame checked at the edge (BadInputs, or a pcm16 chunk its role cannot read: an error
        message, the frame dropped), then queued."""
        try:
            checked = check_frame(self.runtime, self.program, field, value)
        except BadInputs as error:
            await self.fail(str(error), _frame_hint(self.program, self.types, field), call=turn.name, about=about)
            return
        unreadable = _pcm16_problem(checked) if self.types.get(field) == "Audio" and about != "binary" else None
        if unreadable is not None:
            await self.fail(
                f"call `{turn.name}`: a frame of streaming entry `{field}`: {unreadable}",
                'send a pcm16 chunk as {"format": "pcm16", "data": BASE64 OF LITTLE-ENDIAN INT16 SAMPLES, "sample_rate": 16000}',
                call=turn.name,
                about=about,
            )
            return
        if field in turn.ended:
            await self.fail(
                f"call `{turn.name}`: streaming entry `{field}` has ended (`end` came); it takes no more frames",
                "start another call for more input",
                call=turn.name,
                about=about,
            )
            return
        await turn.inbox.put(("frame", field, checked))  # (full: the connection waits, rule 13's bounds)

    async def end(self, turn: Turn, field: str) -> None:
        try:
            streaming_entry(self.program, field)
        except BadInputs as error:
            await self.fail(str(error), _frame_hint(self.program, self.types, field), call=turn.name, about="end")
            return
        if field in turn.ended:
            await self.fail(
                f"call `{turn.name}`: streaming entry `{field}` has ended already",
                "end each entry once",
                call=turn.name,
                about="end",
            )
            return
        turn.ended.add(field)
        if self.binary_turn is turn and turn.binary is not None and turn.binary[0] == field:
            self.binary_turn = None
        await turn.inbox.put(("end", field, None))

    async def binary(self, data: bytes) -> None:
        turn = self.binary_turn
        if turn is None:
            await self.fail(
                "a binary message, and no open call takes binary messages",
                'name the streaming entry they are frames of when starting the call: {"type": "start", "call": ..., '
                '"binary": {"field": NAME}} (an entry of type Audio or Bytes); or send the frame as JSON with `frame`',
                about="binary",
            )
            return
        field, make = turn.binary
        frame = make(data)
        if isinstance(frame, dict) and frame["format"] == "pcm16" and len(data) % 2:
            await self.fail(
                f"call `{turn.name}`: a binary message of {len(data)} bytes, and pcm16 samples are 2 bytes each",
                "send whole samples (an even number of bytes) in each binary message",
                call=turn.name,
                about="binary",
            )
            return
        await self.frame(turn, field, frame, "binary")

    async def cancel(self, turn: Turn, reason: str = "cancelled by the client") -> None:
        turn.cancelled = True
        if turn.task is not None:
            if turn.handle.call is None:  # not started: it never will (a task yet to run sees `cancelled` first)
                if turn.running:
                    turn.task.cancel()
            else:
                await turn.handle.cancel(reason)

    async def started(self, start: wire.Start) -> None:
        """A `start`: the call made (its inputs checked at once) and its task begun, or an error."""

        def refuse(message: str, hint: str, code: str | None = None) -> Any:
            return self.fail(message, hint, call=start.call, about="start", code=code, over=True)

        if start.call in self.turns:
            return await refuse(
                f"a call `{start.call}` is open on this connection already", "give each open call an id of its own"
            )
        if len(self.turns) >= MAX_CALLS:
            return await refuse(
                f"this connection has {MAX_CALLS} calls open, the most it may", "wait for one to end", "too_many_calls"
            )
        if start.interrupt and not self.interrupts:
            return await refuse("this server's runtime cannot interrupt a call yet (`interrupt`)", "leave `interrupt` out")
        session = start.session if start.session is not None else self.session
        if session is not None and reserved(session):
            return await refuse(f"`session`: {reserved(session)}", "leave the session out for a call of its own")
        binary = None
        if start.binary is not None:
            try:
                binary = self.binary_frames(start.binary)
            except ValueError as error:
                return await refuse(str(error), 'e.g. "binary": {"field": "audio_in", "format": "pcm16", "sample_rate": 16000}')
            if self.binary_turn is not None:
                return await refuse(
                    f"call `{self.binary_turn.name}` takes the connection's binary messages until its `{self.binary_turn.binary[0]}` ends",
                    f'end it first ({{"type": "end", "call": "{self.binary_turn.name}", "field": "{self.binary_turn.binary[0]}"}}), '
                    "or send this call's frames as JSON `frame` messages",
                )
        options = {"interrupt": True} if start.interrupt else {}
        if start.interrupt and session is None:  # (the runtime's own words name its Python argument)
            return await refuse(
                "`interrupt` cuts short the running call of a session, and this call has none",
                'give the conversation\'s session: "session" in `start`, ?session= or X-Flow-Session when connecting',
            )
        try:
            handle = self.runtime.start(self.program.name, start.inputs, session=session, timeout=start.timeout, **options)
        except (UnknownGraph, BadInputs, BadTimeout) as error:
            return await refuse(
                str(error), f"the `hello` message lists the entries of graph `{self.program.name}` and their types"
            )
        except FlowrtError as error:  # (any other call the runtime will not start: its own words)
            return await refuse(hide_paths(str(error)), "the message says what to change; other calls go on", "unsupported")
        turn = self.turns[start.call] = Turn(start.call, start, handle, session, binary)
        if binary is not None:
            self.binary_turn = turn
        turn.task = asyncio.ensure_future(self.run(turn))

    def binary_frames(self, told: wire.Binary) -> tuple[str, Any]:
        """The streaming entry a call's binary messages are frames of, and what makes a frame of
        a message's bytes; ValueError saying what does not fit."""
        takes = [name for name in self.program.entry_stream if self.types.get(name) in BINARY_TYPES]
        field = told.field
        if field is None:
            if len(takes) != 1:
                which = f"{', '.join(f'`{n}`' for n in takes)}: name one" if takes else "none"
                raise ValueError(
                    f"`binary`: which streaming entry? Of type Audio or Bytes, graph `{self.program.name}` has {which}"
                )
            field = takes[0]
        if field not in self.program.entry_stream:
            raise ValueError(f"`binary`: `{field}` is not a streaming entry of graph `{self.program.name}`")
        kind = self.types.get(field)
        if kind == "Bytes":
            return field, bytes
        if kind != "Audio":
            raise ValueError(
                f"`binary`: streaming entry `{field}` is declared `{kind}`: binary messages are frames of an entry "
                f"of type Audio or Bytes; send its frames as JSON `frame` messages"
            )
        if told.format not in wire.AUDIO_FORMATS:
            raise ValueError(f"`binary`: `format` is one of {', '.join(wire.AUDIO_FORMATS)}, not {told.format!r}")
        audio_format, rate = told.format, told.sample_rate

        def audio(data: bytes) -> dict[str, Any]:  # flowstd's audio segment (flowstd.roles.voice.audio_clip)
            return {"format": audio_format, "data": base64.b64encode(data).decode("ascii"), "sample_rate": rate}

        return field, audio

    # ── a call's life ──

    async def run(self, turn: Turn) -> None:
        """Hold a place and the session's claim, feed the call's inbox, write its events; tell the
        client how it ended if no `done` did."""
        owners, principal = self.endpoint.owners, self.request[PRINCIPAL]
        over: tuple[str, str, str | None] | None = None
        turn.running = True
        try:
            if turn.cancelled:  # (cancelled before this task's first step)
                raise asyncio.CancelledError
            async with self.endpoint.admission.place(turn.session):
                if turn.session is not None and not owners.claim(turn.session, principal):
                    over = (refused_session(turn.session), "each API key has sessions of its own", "session_not_yours")
                else:
                    try:
                        if not await self.answer(turn):
                            over = ("the call was cancelled before it started", "start it again", "cancelled")
                    finally:
                        if turn.session is not None:
                            owners.release(turn.session)
        except Refused as refused:
            over = (refused.message, "wait and start it again" if refused.status == 429 else "use another server", refused.code)
        except ConnectionError:
            return  # the client is gone: its reader ends, and nobody reads this
        except asyncio.CancelledError:
            if not turn.cancelled:
                raise  # the connection is closing
            over = ("the call was cancelled before it started", "start it again", "cancelled")
        finally:
            await turn.handle.aclose()  # (cancels it unless it has ended; it is retired)
            if self.endpoint.audio is not None:
                self.endpoint.audio.record(turn.clock)
            while not turn.inbox.empty():  # (a reader waiting for room in it goes on)
                turn.inbox.get_nowait()
            if self.turns.get(turn.name) is turn:
                del self.turns[turn.name]
            if self.binary_turn is turn:
                self.binary_turn = None
        if over is not None:
            await self.fail(over[0], over[1], call=turn.name, about="start", code=over[2], over=True)

    async def answer(self, turn: Turn) -> bool:
        """Feed the call and write its events; whether its `done` was written."""
        feeder = asyncio.ensure_future(self.feed(turn))
        roots, media, name = self.runtime.bundle.python_path, not turn.start.summary, turn.name
        binary_out = media and turn.start.binary_out
        try:
            async for event in turn.handle:
                if event["event"] == "done":
                    event = client_events([event], roots)[0]
                carried = _carried(event) if binary_out else None
                if carried is not None:  # the event with `"binary": N` for `"base64"`, then the N bytes
                    await self.send(wire.event(name, event_json({**event, "value": carried[0]})), carried[1])
                else:
                    await self.send(wire.event(name, event_json(event, media=media)))
                turn.clock.saw(event, turn.now())
                if event["event"] == "done":
                    return True
            return False
        finally:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)

    async def feed(self, turn: Turn) -> None:
        """The inbox into the call, in order; what the runtime refuses is told to the client."""
        handle = turn.handle
        while True:
            kind, field, value = await turn.inbox.get()
            try:
                if kind == "frame":
                    await handle.send(field, value)
                    turn.clock.input(turn.now())
                else:
                    await handle.end(field)
                    turn.fed_ends += 1
                    if turn.fed_ends == len(self.program.entry_stream):  # the input is complete
                        turn.clock.ended(turn.now())
            except InputClosed as error:
                if not turn.closed_told:
                    turn.closed_told = True
                    await self.fail(str(error), "its `done` event tells how it ended", call=turn.name, about=kind)
            except BadInputs as error:  # (checked at the edge already)
                await self.fail(str(error), _frame_hint(self.program, self.types, field), call=turn.name, about=kind)


def _carried(event: dict) -> tuple[dict, bytes] | None:
    """A stream event's image or audio (a value with `media()`, flowrt.values) as the fields of
    its JSON with `"binary": N` instead of `"base64"`, and its N bytes; else None."""
    media = getattr(event.get("value"), "media", None) if event["event"] == "stream" else None
    if not callable(media):
        return None
    try:
        told = media()
        data = base64.b64decode(told["base64"], validate=True)
    except Exception:  # noqa: BLE001 - a role's value: a media() that fails is sent as JSON (described there)
        return None
    return {key: value for key, value in told.items() if key != "base64"} | {"binary": len(data)}, data


def _pcm16_problem(value: Any) -> str | None:
    """Why a role cannot read an audio chunk given as {"format": "pcm16", "data": ...} (data that
    is not base64, nor a data URL of it; a part sample; a sample rate that is not 1 to 384000 Hz),
    or None (for any other value too: its role judges it)."""
    if not isinstance(value, dict) or value.get("format") != "pcm16" or "data" not in value:
        return None
    try:  # (no size limit here: the message's is the server's)
        data = media_files.media_bytes(value["data"], part="`data`", kind="audio", limits=_UNLIMITED)
    except media_files.MediaError as error:
        return str(error)
    if len(data) % 2:
        return f"pcm16 `data` holds {len(data)} bytes, and int16 samples are 2 bytes each"
    rate = value.get("sample_rate", 16_000)
    if not isinstance(rate, int) or isinstance(rate, bool) or not 1 <= rate <= wire.MAX_SAMPLE_RATE:
        return f"`sample_rate` is a whole number of Hz from 1 to {wire.MAX_SAMPLE_RATE}, not {str(rate)[:40]}"
    return None


def _frame_hint(program: GraphProgram, types: dict[str, str], field: str) -> str:
    streaming = ", ".join(f"`{name}` ({types.get(name, 'any type')})" for name in program.entry_stream)
    if not streaming:
        return f"graph `{program.name}` has no streaming entry: give every entry in `start`'s `inputs`"
    return f"send frames of graph `{program.name}`'s streaming entries, {streaming}, each as its declared type"
