"""The OpenAI Realtime-compatible endpoint `GET /v1/realtime?model=MODEL` (docs/openai.md, "Realtime"):
a WebSocket speaking a subset of OpenAI's Realtime events, over a graph that `serves realtime`
(its streaming `Audio` entry takes the client's audio; its Text and Audio outputs are the answer).

A connection is a `Connection` with a session of its own (the `X-Flow-Session` header or
`?session=`, else a new one, dropped when the connection closes). Its audio is cut into turns:
the first `input_audio_buffer.append` of a turn starts a call of the graph (a `Turn`) and each
append is one frame of the graph's streaming entry, sent while the client still speaks;
`input_audio_buffer.commit` ends the entry (`response.create` commits what is open);
`input_audio_buffer.clear` cancels the turn. A response is one turn's call: `response.create`
answers the oldest committed turn without a response (or, with nothing appended, a call whose
input is empty) and sends the events the call has made so far and makes from then on, as text
(or transcript) and audio deltas, then `response.done`. `response.cancel`, and a
`response.create` while a response runs (barge-in), stop the running response at once (no
delta of it is sent after the event is read) and cancel its call (`interrupt=True` where the
runtime and the graph allow it, so its roles learn what was delivered), and its `response.done`
says `cancelled`. With server VAD (`turn_detection: {"type": "server_vad"}`,
flowrt.gateway.realtime_vad) the server finds the turns itself: audio before the speech is kept
as padding; at the speech's start a turn opens with that padding (`speech_started`; a running
response is barged in on, as by `response.create`), and at its end the turn is committed and
answered (`speech_stopped`, then as `response.create`).

A turn's call waits for the turn before it to be retired (calls of a session run one at a time),
unless a barge-in starts it. The connection's calls share one admission place
(flowrt.gateway.admission) while any runs, and its session's claim (flowrt.gateway.access) for the
connection's life. Bounds: a turn's audio not yet taken by its call (`MAX_PENDING_BYTES`), the
events a call makes before its response is asked for (`HELD_MAX`), the turns open at once
(`MAX_TURNS`), and a message (the server's --max-body-mb): past any, an `error` event (or, for
a message, the close code 1009). A client that does not read holds its call's events in the
runtime's bounded outbox and the socket's writes wait for it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from typing import Any

from aiohttp import WSMsgType, web

from flowrt.errors import FlowrtError, InputClosed
from flowrt.gateway import realtime_events as wire
from flowrt.gateway.admission import Refused
from flowrt.gateway.exposure import client_events, hide_paths
from flowrt.gateway.openai import call_error
from flowrt.gateway.openai_request import TokenCounts
from flowrt.gateway.realtime_turns import Response, Turn
from flowrt.gateway.realtime_vad import ServerVad

MAX_PENDING_BYTES = 16 * 2**20  # a turn's audio appended and not yet taken by its call
HELD_MAX = 1024  # events a call may make before a response.create asks for them
MAX_TURNS = 4  # turns open at once on a connection (calls running, or waiting for the one before)
log = logging.getLogger("flowrt.gateway")


class Connection:
    """One client's Realtime WebSocket (the module docstring)."""

    def __init__(
        self,
        endpoint: Any,  # its RealtimeEndpoint (flowrt.gateway.realtime_endpoint, which imports this module)
        ws: web.WebSocketResponse,
        model: str,
        fields: dict,
        session: str,
        owned: bool,
        beta: bool,
    ):
        self.endpoint, self.ws, self.model, self.fields = endpoint, ws, model, fields
        self.runtime = endpoint.runtime
        self.session, self.owned = session, owned
        self.names = wire.Names(beta)
        speaks = fields.get("audio") is not None
        self.settings = wire.Settings(model, speaks=speaks, audio_out=speaks)
        self.session_id = wire.new_id("sess")
        self.turns: list[Turn] = []  # open turns, oldest first
        self.input: Turn | None = None  # the turn the appends go to
        self.vad: ServerVad | None = None  # server VAD, when the session asks for it
        self.appended_ms = 0.0  # the audio appended so far (server VAD's times count from its start)
        self.later: set[asyncio.Task] = set()  # (server VAD) answers to give once the running reply is done
        self.creating = asyncio.Lock()  # one response.create at a time (the client's, or server VAD's)
        self.last_item: str | None = None  # the last committed audio's item id
        plan = self.runtime.bundle.plan["graphs"][model]
        self.interruptible = endpoint.interrupts and plan.get("interruptible") is True
        self.place_lock = asyncio.Lock()
        self.place_users = 0
        self.place: contextlib.AsyncExitStack | None = None

    # ── the connection ──

    async def serve(self) -> None:
        try:
            await self.say(wire.event("session.created", session=self.names.session(self.settings, self.session_id)))
            async for message in self.ws:  # (ends at the client's close, or a message over the limit)
                if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    await self.take(message.data)
        finally:  # (in a task of its own: the server cancels this handler when the client closes mid-reply)
            await asyncio.shield(asyncio.ensure_future(self.closed()))

    async def closed(self) -> None:
        for task in list(self.later):
            task.cancel()
        tasks = await self.stop_all("client gone")
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.owned and self.session not in self.runtime.scheduler.queues:
            self.runtime.sessions.drop(self.session)  # (the conversation ends with the connection)

    async def stop_all(self, reason: str) -> list[asyncio.Task]:
        """Stop every turn (its call cancelled with `reason`); the tasks that end once each is retired."""
        tasks = []
        for turn in list(self.turns):
            await self.stop(turn, reason)
            if turn.task is not None:
                tasks.append(turn.task)
        return tasks

    async def say(self, text: str) -> None:
        """Send one event; a client gone meanwhile is not an error here (the reader ends)."""
        with contextlib.suppress(ConnectionError):
            await self.ws.send_str(text)

    async def fail(self, error: wire.RealtimeError) -> None:
        await self.say(wire.error_event(error))

    async def take(self, data: str | bytes) -> None:
        """One client event, decoded at the edge; what is wrong with it is an error event."""
        await self.answered(self.act(data))

    async def act(self, data: str | bytes) -> None:
        event = wire.decode(data)
        if isinstance(event, wire.Append):
            await self.append(event)
        elif isinstance(event, wire.Commit):
            await self.commit(event.event_id)
        elif isinstance(event, wire.Clear):
            await self.clear()
        elif isinstance(event, wire.ResponseCreate):
            await self.create(event)
        elif isinstance(event, wire.ResponseCancel):
            await self.cancel(event)
        else:
            await self.update(event)

    async def answered(self, work: Any) -> None:
        """Await `work`; what is wrong is an error event, and the connection goes on."""
        try:
            await work
        except wire.RealtimeError as error:
            await self.fail(error)
        except Exception as error:  # noqa: BLE001 - a bug in flowrt: logged with its traceback, told, and the connection goes on
            log.exception("internal error answering a /v1/realtime event")
            await self.fail(wire.internal(error))

    # ── the client's events ──

    async def update(self, event: wire.SessionUpdate) -> None:
        settings = self.settings.updated(event.session, event.event_id)
        if self.input is not None and settings.changed_input(self.settings):
            error = wire.refusal("rate_change", event.event_id)
            if settings.input_rate != self.settings.input_rate:
                field = "input_audio_format" if self.names.beta else "audio.input.format"
            else:
                field = "turn_detection" if self.names.beta else "audio.input.turn_detection"
            error.param = f"session.{field}"
            raise error
        if settings.turn_detection != self.settings.turn_detection or settings.input_rate != self.settings.input_rate:
            detection, offset = settings.turn_detection, round(self.appended_ms)
            self.vad = None if detection is None else ServerVad(self, detection, settings.input_rate, offset)
        self.settings = settings
        await self.say(wire.event("session.updated", session=self.names.session(settings, self.session_id)))

    async def append(self, event: wire.Append) -> None:
        data = wire.audio_bytes(event)
        self.appended_ms += len(data) / 2 / self.settings.input_rate * 1000
        if self.vad is not None:
            await self.vad.append(event.event_id, data)
            return
        frame = {"format": "pcm16", "data": event.audio, "sample_rate": self.settings.input_rate}
        self.feed_input(event.event_id, frame, len(data))

    def feed_input(self, event_id: str | None, frame: dict, size: int) -> None:
        turn = self.input or self.new_input(event_id)
        self.check_room(turn, event_id, size)
        turn.pending += size
        turn.clock.input(time.perf_counter())
        turn.inbox.put_nowait(("frame", frame, size))

    @staticmethod
    def check_room(turn: Turn, event_id: str | None, size: int) -> None:
        if turn.pending + size > MAX_PENDING_BYTES:
            raise wire.refusal("input_audio_buffer_full", event_id, mib=MAX_PENDING_BYTES // 2**20)

    async def tell(self, kind: str, **fields: Any) -> None:
        await self.say(wire.event(kind, **fields))

    async def respond(self, event_id: str | None) -> None:
        await self.create(wire.ResponseCreate(event_id=event_id))

    def respond_after(self, running: Turn, turn: Turn) -> None:
        """(server VAD) Answer `turn` once `running`'s response is done, unless it is answered by then."""

        async def later() -> None:
            await running.response.finished.wait()
            if turn.response is None and not turn.dropped:
                await self.answered(self.respond(None))

        task = asyncio.ensure_future(later())
        self.later.add(task)
        task.add_done_callback(self.later.discard)

    async def barge_in(self, running: Turn, turn: Turn) -> None:
        """(server VAD) Speech while a response runs: it stops, and on an interruptible graph the
        speech's turn starts now and interrupts its call, while the user still speaks."""
        self.stopping(running)
        if self.interruptible and running.admitted and turn.ahead is running:
            turn.interrupt = True
            turn.go.set()
        else:
            await self.stop(running, "interrupted")

    def new_input(self, event_id: str | None) -> Turn:
        if len(self.turns) >= MAX_TURNS:
            raise wire.refusal("too_many_turns", event_id, most=MAX_TURNS)
        self.input = self.open_turn()
        return self.input

    def open_turn(self) -> Turn:
        turn = Turn(self.turns[-1] if self.turns else None, self.settings, self.model)
        self.turns.append(turn)
        turn.work = asyncio.ensure_future(self.work(turn))
        turn.task = asyncio.ensure_future(self.run(turn))
        return turn

    async def commit(self, event_id: str | None) -> Turn:
        turn = self.input
        if turn is None:
            raise wire.refusal("input_audio_buffer_commit_empty", event_id)
        self.input = None
        turn.committed = True
        turn.inbox.put_nowait(("end", None, 0))
        turn.clock.ended(time.perf_counter())
        previous, self.last_item = self.last_item, turn.item_id
        await self.say(wire.event("input_audio_buffer.committed", item_id=turn.item_id, previous_item_id=previous))
        return turn

    async def clear(self) -> None:
        turn, self.input = self.input, None
        if turn is not None:
            turn.dropped = True
            await self.stop(turn, "input cleared")
        await self.say(wire.event("input_audio_buffer.cleared"))

    async def create(self, event: wire.ResponseCreate) -> None:
        async with self.creating:
            await self.creating_response(event)

    async def creating_response(self, event: wire.ResponseCreate) -> None:
        if event.response:
            raise wire.refusal("response_settings", event.event_id, name=next(iter(event.response)))
        answered = self.input or next((t for t in self.turns if t.committed and not t.dropped and t.response is None), None)
        if answered is None and len(self.turns) >= MAX_TURNS:
            raise wire.refusal("too_many_turns", event.event_id, most=MAX_TURNS)
        running = self.responding()
        if running is not None:  # barge-in
            self.stopping(running)
        if self.input is not None:
            await self.commit(event.event_id)
        target = next((t for t in self.turns if t.committed and not t.dropped and t.response is None), None)
        if target is None:  # nothing appended: a call whose input is empty
            target = self.open_turn()
            target.committed = True
            target.inbox.put_nowait(("end", None, 0))
        if running is not None:  # ... and its call is cancelled
            if self.interruptible and running.admitted and target.ahead is running:
                target.interrupt = True  # the runtime cancels the running call when this one comes
            else:
                await self.stop(running, "interrupted")
            target.go.set()
            await running.response.finished.wait()
        response = Response(self.settings)
        async with target.out:
            target.response = response
            await self.say(
                wire.event("response.created", response=self.names.response(response.id, response.settings, "in_progress"))
            )
            while target.held:
                await self.forward(target, target.held.popleft())
            if target.retired.is_set() and not response.finished.is_set():  # its call is over, or never ran
                await self.finish(target)

    async def cancel(self, event: wire.ResponseCancel) -> None:
        running = self.responding()
        if running is None or (event.response_id is not None and event.response_id != running.response.id):
            which = f"response `{event.response_id}` is not running" if event.response_id else "no response is running"
            raise wire.RealtimeError(f"nothing to cancel: {which}", "response_cancel_not_active", "response_id", event.event_id)
        running.response.stopped = "client_cancelled"
        await self.stop(running, "cancelled by the client")

    def stopping(self, running: Turn) -> None:
        """A barge-in: nothing more of the running response reaches the client, nor is taken from
        its call once it has started (its roles learn that what was taken was delivered)."""
        running.response.stopped = "turn_detected"
        if self.interruptible and running.admitted:
            running.taking.clear()
            running.handle.stop_taking()  # (an event its reader waits for now is not counted as delivered)

    def responding(self) -> Turn | None:
        return next((t for t in self.turns if t.response is not None and not t.response.finished.is_set()), None)

    async def stop(self, turn: Turn, reason: str) -> None:
        """Cancel `turn`'s call (one not started never starts); its task retires it (`run`)."""
        turn.dropped = turn.dropped or turn.response is None
        turn.taking.set()
        if turn.handle is not None:
            await turn.handle.cancel(reason)
        elif turn.work is not None and not turn.work.done():  # waiting for the turn before, or for a place
            turn.work.cancel()

    # ── a turn's life ──

    @contextlib.asynccontextmanager
    async def placed(self):
        """An admission place while one of the connection's calls runs: its calls run one at a
        time in its session, so one place serves them all, and a barge-in never waits for one."""
        async with self.place_lock:
            if self.place_users == 0:
                stack = contextlib.AsyncExitStack()
                await stack.enter_async_context(self.endpoint.admission.place(self.session))
                self.place = stack
            self.place_users += 1
        try:
            yield
        finally:
            self.place_users -= 1
            if self.place_users == 0:
                stack, self.place = self.place, None
                if stack is not None:
                    await stack.aclose()

    async def work(self, turn: Turn) -> None:
        """Wait for the turn before (or a barge-in), start the call, feed it and take its events."""
        if turn.ahead is not None and not turn.ahead.retired.is_set():
            ahead, go = asyncio.ensure_future(turn.ahead.retired.wait()), asyncio.ensure_future(turn.go.wait())
            try:
                await asyncio.wait((ahead, go), return_when=asyncio.FIRST_COMPLETED)
            finally:
                ahead.cancel(), go.cancel()
        if turn.dropped:
            return
        async with self.placed():
            if turn.dropped:
                return
            await self.answer(turn)

    async def run(self, turn: Turn) -> None:
        """The turn's `work`, then the turn retired and its response's response.done sent, however
        the work ended: `stop` cancels the work, and a task cancelled before its first step runs
        none of its coroutine (not even a `finally`), so the retiring is here, in a task of its own."""
        try:
            await asyncio.wait((turn.work,))
            if not turn.work.cancelled() and turn.work.exception() is not None:
                raise turn.work.exception()
        except Refused as refused:
            turn.failure = wire.RealtimeError(refused.message, refused.code, kind="server_error" if refused.status >= 500 else "")
            if turn.response is None:
                await self.fail(turn.failure)
        except FlowrtError as error:  # the runtime refused the call (its own words)
            turn.failure = wire.RealtimeError(hide_paths(str(error)), "call_failed", kind="server_error")
            if turn.response is None:
                await self.fail(turn.failure)
        except Exception as error:  # noqa: BLE001 - a bug in flowrt: logged, and told in the response (or an error)
            log.exception("internal error running a /v1/realtime turn")
            turn.failure = wire.internal(error)
            if turn.response is None:
                await self.fail(turn.failure)
        finally:
            if turn.handle is not None:
                await turn.handle.aclose()  # (cancels it unless it has ended; it is retired)
            if turn.interrupt and not turn.admitted:  # a barge-in whose call never started: stop the one it would have cut
                await self.stop(turn.ahead, "interrupted")
            turn.retired.set()
            if not turn.committed and not turn.dropped:  # its call ended while the client still appended
                turn.dropped = True
                self.input = None if self.input is turn else self.input
                if turn.failure is None:
                    await self.fail(self.ended_early(turn))
            async with turn.out:
                if turn.response is not None and not turn.response.finished.is_set():
                    await self.finish(turn)
            if turn.dropped or (turn.response is not None and turn.response.finished.is_set()):
                self.forget(turn)

    def ended_early(self, turn: Turn) -> wire.RealtimeError:
        done = turn.done or next((e for e in turn.held if e["event"] == "done"), None)
        how = f"{done['status']}, {done.get('reason') or 'no reason given'}" if done else "it did not start"
        return wire.refusal("call_ended", None, model=self.model, how=how)

    def forget(self, turn: Turn) -> None:
        if turn in self.turns:
            self.turns.remove(turn)
            self.endpoint.audio.record(turn.clock)

    async def answer(self, turn: Turn) -> None:
        """Start the call, feed its inbox to it, and hold or forward its events up to its `done`."""
        inputs = {}
        session_field = self.fields.get("session")
        if session_field is not None:
            settings = turn.settings
            entry_type = self.runtime.entry_types.get(self.model, {}).get(session_field, "Json")
            inputs[session_field] = (
                settings.instructions
                if entry_type == "Text"
                else {"instructions": settings.instructions, "voice": settings.voice, "audio": settings.audio_out}
            )
        options = {"interrupt": True} if turn.interrupt else {}
        turn.handle = self.runtime.start(self.model, inputs, session=self.session, **options)
        feeder = asyncio.ensure_future(self.feed(turn))
        try:
            async with turn.handle:  # admitted: a barge-in's call has interrupted the one before
                turn.admitted = True
                if turn.interrupt:
                    turn.ahead.taking.set()
                while True:
                    await turn.taking.wait()
                    try:
                        event = await turn.handle.__anext__()
                    except StopAsyncIteration:
                        return
                    if await self.took(turn, event):
                        return
        except InputClosed:
            return  # closed before it started (cleared, cancelled, the client gone)
        finally:
            if turn.interrupt:
                turn.ahead.taking.set()
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)

    async def took(self, turn: Turn, event: dict) -> bool:
        """Hold or forward one event of the call; whether the turn is over. An event taken before
        its response was stopped is delivered (at most one: events are taken one at a time)."""
        late = turn.response is not None and turn.response.stopped is not None
        async with turn.out:
            if turn.response is None:
                turn.held.append(event)
                if len(turn.held) > HELD_MAX:
                    await self.overflow(turn)
                    return True
            else:
                await self.forward(turn, event, late)
        return event["event"] == "done"

    async def overflow(self, turn: Turn) -> None:
        turn.dropped = True
        turn.held.clear()
        await turn.handle.cancel("no response asked for")
        await self.fail(wire.refusal("response_not_requested", None, model=self.model, most=HELD_MAX, item=turn.item_id))

    async def feed(self, turn: Turn) -> None:
        handle, field = turn.handle, self.fields["input"]
        while True:
            kind, value, size = await turn.inbox.get()
            turn.pending -= size
            try:
                if kind == "frame":
                    await handle.send(field, value)
                else:
                    await handle.end(field)
                    return
            except InputClosed:
                return  # the call is over (cancelled, timed out): its response.done says how

    # ── the answer ──

    async def forward(self, turn: Turn, event: dict, late: bool = False) -> None:
        """One event of the call as the response's deltas (called under `turn.out`)."""
        response = turn.response
        assert response is not None
        if event["event"] == "done":
            turn.done = client_events([event], self.runtime.bundle.python_path)[0]
            await self.finish(turn)
            return
        if late or response.failure is not None or response.finished.is_set():
            return  # stopped: nothing taken since reaches the client
        field, value = event["field"], event["value"]
        if field == self.fields.get("text"):
            if not isinstance(value, str):
                response.failure = wire.refusal("not_text", None, model=self.model, field=field, kind=type(value).__name__)
                await turn.handle.cancel("not text")
                return
            response.text.append(value)
            kind = self.names.transcript_delta if response.settings.audio_out else self.names.text_delta
            await self.say(wire.event(kind, **self.delta(turn), delta=value))
        elif field == self.fields.get("audio") and response.settings.audio_out:
            try:
                pcm = wire.pcm16_at(value, response.settings.output_rate, f"a frame of `{field}`")
            except ValueError as error:
                response.failure = wire.refusal("not_audio", None, model=self.model, error=error)
                await turn.handle.cancel("not audio")
                return
            data = base64.b64encode(pcm).decode("ascii")
            await self.say(wire.event(self.names.audio_delta, **self.delta(turn), delta=data))
            turn.clock.saw(event, time.perf_counter())
        else:
            response.usage = TokenCounts.reported(value) or response.usage

    def delta(self, turn: Turn) -> dict[str, Any]:
        response = turn.response
        return {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}

    async def finish(self, turn: Turn) -> None:
        """The response's `response.done` (once; called under `turn.out`)."""
        response = turn.response
        if response is None or response.finished.is_set():
            return
        error = response.failure or turn.failure
        if error is None and response.stopped is None:
            told = call_error(turn.done, self.model)  # (None: it ended well)
            if told is not None:
                kind = "server_error" if told.status >= 500 else "invalid_request_error"
                error = wire.RealtimeError(told.message, told.code or "call_failed", kind=kind)
        status, details = wire.ending(response.stopped, error, (turn.done or {}).get("reason", ""))
        item = self.names.item(response.item_id, "".join(response.text), response.settings.audio_out, status == "completed")
        body = self.names.response(response.id, response.settings, status, item, details, response.usage)
        response.finished.set()
        await self.say(wire.event("response.done", response=body))
        if turn.retired.is_set():
            self.forget(turn)
