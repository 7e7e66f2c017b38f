"""Calls that take input while they run: the frames of a graph's streaming entries
(`placeholder stream`; docs/runtime.md, "Streaming input").

`Runtime.start(graph, inputs, ...)` gives a `CallHandle`: an async iterator of the call's events
(those `Runtime.call` yields), through which the caller also sends each streaming entry's frames
(`send`) and ends it (`end`). The call is admitted (its session's turn) when the handle is first
used, and retired when its events have all been read, or when it is cancelled (`cancel`) or
closed (`aclose`, leaving `async with`); the events of a cancelled call stay readable to its
`done`.

A streaming entry's placeholder node runs as one activation of the call that the caller feeds
(flowrt.control.call: `entry_frame`, `entry_end`), so its frames are exactly a streaming role's
yields: frame i has the order key (i,), its consumers fire per frame, and its end is the end of
the stream for stream slots and `all` joins. Until it ends the call cannot end, nor can what it
feeds resolve; a cancelled call (its timeout, `cancel`) ends it at once, as unreachable(cancel).
Its backpressure is a streaming role's (rule 13, flowrt.control.bounds): before a frame, `send`
waits while `CHILDREN_HIGH` (256) activations readied by earlier frames are unfinished (running
or held by an `lb session` node), or while the caller has `OUTBOX_HIGH` (256) events it has not
taken, until they are down to half; every `PAUSE_EVERY` (64) frames it gives the loop a turn.
Sends and ends of one entry are taken in the order they are called (a lock per entry); two
entries are independent, so each can be sent from a task of its own.

`Runtime.call` on a graph with streaming entries takes each one's frames as a list, and sends
them while the call runs, one task per entry (`fed_events`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from flowrt.control.signals import Reason
from flowrt.entry_types import EntryTypeError
from flowrt.errors import BadInputs, InputClosed

if TYPE_CHECKING:
    from flowrt.control.activation import Activation
    from flowrt.control.call import Call
    from flowrt.control.program import GraphProgram
    from flowrt.control.runtime import Runtime

log = logging.getLogger("flowrt")
ADMITTED = object()  # what a handle's event generator yields first: its call has started


class CallHandle:
    """A call started by `Runtime.start` (module docstring): `async for event in handle`,
    `await handle.send(field, value)`, `await handle.end(field)`, `await handle.cancel()`."""

    def __init__(
        self,
        runtime: Runtime,
        program: GraphProgram,
        inputs: dict,
        session: str | None,
        deadline: float | None,
        observer: Any,
        interrupt: bool = False,
    ):
        self.runtime = runtime
        self.program = program
        self.graph = program.name
        self.call: Call | None = None  # the call once admitted and started
        self._events = self._run(inputs, session, deadline, observer, interrupt)
        self._admission: asyncio.Future | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._ended: set[str] = set()
        self._reading = 0  # tasks in __anext__
        self._closed = False
        self._leaving: tuple | None = None  # what retiring the call takes, until it is retired

    # ── the input ──

    async def send(self, field: str, value: Any) -> None:
        """Send one frame of streaming entry `field`, once the call has its session's turn and
        its consumers have room (module docstring). BadInputs for a field that is not a
        streaming entry, or a frame that does not fit its declared type (the call goes on);
        InputClosed once `field` has ended or the call is over."""
        await self._put(field, check_frame(self.runtime, self.program, field, value))

    async def end(self, field: str) -> None:
        """End streaming entry `field`: what waits for the end of its stream (stream slots,
        `all` joins) may now resolve. BadInputs and InputClosed as for `send`."""
        streaming_entry(self.program, field)
        call = await self._admitted()
        async with self._lock(field):
            act = self._open(call, field)
            self._ended.add(field)
            if act is not None:
                call.entry_end(field)

    async def _put(self, field: str, value: Any) -> None:
        call = await self._admitted()
        async with self._lock(field):
            act = self._open(call, field)
            if act is not None and act.pause:
                await call._pause(act)  # (rule 13, as between a streaming role's frames)
                act = self._open(call, field)  # (the call may have been cancelled meanwhile)
            if act is not None:
                call.entry_frame(field, value)

    def _open(self, call: Call, field: str) -> Activation | None:
        """The activation of streaming entry `field` (None where nothing consumes it) while it
        takes frames; else InputClosed saying why not."""
        if field in self._ended:
            raise InputClosed(
                f"graph `{self.graph}`: streaming entry `{field}` has ended (`end` was called); it takes no more frames"
            )
        if call.cancelled or call.ended:
            why = f"cancelled: {call.cancel_reason}" if call.cancelled else "ended"
            raise InputClosed(f"graph `{self.graph}`: the call is over ({why}); streaming entry `{field}` takes no more frames")
        entry = call.entries.get(field) if call.entries else None
        return None if entry is None else entry[0]

    def _lock(self, field: str) -> asyncio.Lock:
        lock = self._locks.get(field)
        if lock is None:
            lock = self._locks[field] = asyncio.Lock()
        return lock

    # ── the events ──

    def __aiter__(self) -> CallHandle:
        return self

    async def __anext__(self) -> dict:
        self._reading += 1
        try:
            if self.call is None:
                try:
                    await self._admitted()
                except InputClosed:
                    raise StopAsyncIteration from None
            return await self._events.__anext__()
        finally:
            self._reading -= 1

    async def _run(
        self, inputs: dict, session: str | None, deadline: float | None, observer: Any, interrupt: bool
    ) -> AsyncIterator[Any]:
        """The call's life, as `Runtime.call` runs it: admitted, started (then ADMITTED), its
        events (those its caller takes, for an interruptible graph: flowrt.control.interrupts),
        and its retirement however the generator ends (unless `cancel` retired it)."""
        runtime = self.runtime
        call, watchdog, anonymous = await runtime._admit(self.program, inputs, session, deadline, observer, interrupt)
        self._leaving = (call, watchdog, anonymous)
        try:
            call.start()
            if call.cancelled:  # interrupted while it waited for its turn: its entries, just opened, end at once
                while call.entries:
                    call.entry_end(next(iter(call.entries)), Reason.CANCEL)
            self.call = call
            yield ADMITTED
            outbox = call.outbox
            taken = runtime.interrupts.taken.get(call)
            while True:
                if not outbox:
                    call.waiter = call.loop.create_future()
                    await call.waiter
                event = outbox.popleft()
                if call.outbox_waiters:
                    call.taken()
                if event is None:
                    break
                if taken is None or taken.take(event):
                    yield event
        finally:
            await self._leave()

    async def _leave(self) -> None:
        """Retire the call, once (as `Runtime.call` does when its caller leaves: cancelled
        first, "client gone", if it has not ended)."""
        leaving, self._leaving = self._leaving, None
        if leaving is not None:
            await self.runtime._leave(*leaving)

    async def _admitted(self) -> Call:
        """The call, started: the handle's first use admits it (in a task of its own, so that
        any number of senders and readers can wait for it)."""
        if self.call is not None:
            return self.call
        admission = self._admission
        if admission is None:
            if self._closed:
                raise InputClosed(f"graph `{self.graph}`: the call was closed before it started")
            admission = self._admission = asyncio.ensure_future(self._events.__anext__())
            admission.add_done_callback(_retrieved)
        try:
            await asyncio.shield(admission)
        except asyncio.CancelledError:
            if admission.cancelled():  # closed while it waited for its session's turn
                raise InputClosed(f"graph `{self.graph}`: the call was closed before it started") from None
            raise
        except StopAsyncIteration:
            raise InputClosed(f"graph `{self.graph}`: the call was closed before it started") from None
        assert self.call is not None
        return self.call

    def stop_taking(self) -> None:
        """The caller delivers nothing more of this call (a barge-in is on its way): of a call of
        an interruptible graph, every event from now on but `done` is dropped, not counted as
        taken, so an interrupting call's roles learn exactly what was delivered, even of an event
        this handle's reader was already waiting for. Other calls are not counted: no-op."""
        taken = self.runtime.interrupts.taken.get(self.call) if self.call is not None else None
        if taken is not None:
            taken.stopped = True

    # ── closing ──

    async def cancel(self, reason: str = "client gone") -> None:
        """Cancel the call unless it has ended (its `done` event says `reason`; its streaming
        entries end as cancelled), wait for its end and retire it: it holds nothing in the
        runtime any more, and its session's next call may run. Its events, `done` included,
        can still be read. A call still waiting for its session's turn never starts."""
        self._closed = True
        admission = self._admission
        if admission is not None and not admission.done():
            admission.cancel()  # still waiting for its session's turn
            await asyncio.wait([admission])
        if self.call is not None:
            self.call.cancel(reason)
            await self._leave()

    async def aclose(self) -> None:
        """Close the iterator: `cancel()` (reason `client gone`, as when a caller stops reading
        `Runtime.call`), and no more events, unless another task is waiting for its next one."""
        await self.cancel()
        if not self._reading:
            await self._events.aclose()

    async def __aenter__(self) -> CallHandle:
        await self._admitted()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _retrieved(admission: asyncio.Future) -> None:
    """(An admission nobody awaits any more must not log "exception never retrieved".)"""
    if not admission.cancelled():
        admission.exception()


# ── the inputs of a call with streaming entries ──


def streaming_entry(program: GraphProgram, field: str) -> None:
    """BadInputs unless `field` is a streaming entry of `program`'s graph."""
    if field in program.entry_stream:
        return
    names = ", ".join(f"`{name}`" for name in program.entry_stream)
    has = f"its streaming entries are {names}" if names else "it has no streaming entry (`placeholder stream`)"
    what = "an entry given when the call starts" if field in program.entry_set else "not one of its entries"
    raise BadInputs(f"graph `{program.name}`: `{field!s:.60}` is {what}, so it takes no frames; {has}")


def check_frame(runtime: Runtime, program: GraphProgram, field: str, value: Any) -> Any:
    """A frame of streaming entry `field` as its consumers get it (checked as an entry value of
    its declared type is); BadInputs if `field` does not stream or the frame does not fit."""
    streaming_entry(program, field)
    check = runtime.entry_checks.get(program.name, {}).get(field)
    if check is None:
        return value
    try:
        return check(value)
    except EntryTypeError as error:
        declared = runtime.entry_types[program.name][field]
        raise BadInputs(
            f"graph `{program.name}`: streaming entry `{field}` takes frames of type `{declared}`, and {error}"
        ) from None
    except RecursionError:
        raise BadInputs(f"graph `{program.name}`: a frame of streaming entry `{field}` is nested too deeply to check") from None


def frames_of(runtime: Runtime, program: GraphProgram, field: str, value: Any) -> list:
    """What `Runtime.call` takes for streaming entry `field`: the list of its frames, each checked."""
    if not isinstance(value, (list, tuple)):
        raise BadInputs(
            f"graph `{program.name}`: entry `{field}` streams, so a call takes the list of its frames, not "
            f"{type(value).__name__}; or send them one at a time: `call = runtime.start(...)`, `await call.send({field!r}, ...)`"
        )
    return [check_frame(runtime, program, field, frame) for frame in value]


async def fed_events(
    runtime: Runtime,
    program: GraphProgram,
    inputs: dict,
    session: str | None,
    deadline: float | None,
    observer: Any,
    interrupt: bool = False,
) -> AsyncIterator[dict]:
    """The events of `Runtime.call` on a graph with streaming entries, whose checked `inputs` give
    each one's frames as a list: every entry's frames are sent by a task of its own (a consumer
    of two of them may hold the frames of one until the other's come), then it is ended."""
    streaming = program.entry_stream
    given = {name: value for name, value in inputs.items() if name not in streaming}
    handle = CallHandle(runtime, program, given, session, deadline, observer, interrupt)
    feeders: list[asyncio.Future] = []
    try:
        await handle._admitted()
        feeders = [asyncio.ensure_future(_feed(handle, name, inputs[name])) for name in streaming]
        async for event in handle:
            yield event
    finally:
        for feeder in feeders:
            feeder.cancel()
        for outcome in await asyncio.gather(*feeders, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.error(
                    "graph `%s`: sending the frames of a streaming entry failed (a flowrt bug)", program.name, exc_info=outcome
                )
        await handle.aclose()


async def _feed(handle: CallHandle, field: str, frames: list) -> None:
    try:
        for value in frames:
            await handle._put(field, value)
        await handle.end(field)
    except InputClosed:
        return  # the call is over (cancelled, timed out): the frames left are not needed
