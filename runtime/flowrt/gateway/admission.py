"""Which calls the gateway takes, and when it stops taking them (docs/security.md, "Admission").

- `--max-in-flight N`: at most N calls (of /graphs and /v1 together) run at once; the next wait
  in arrival order, at most `--max-queue M` of them; any more is answered at once 429 with
  `Retry-After` (OpenAI's `rate_limit_exceeded` under /v1). `--max-session-queue K`: at most K
  calls of one session run or wait at once (the runtime runs a session's calls one at a time).
- The drain (`drain()`, on SIGTERM): `/ready` answers 503 at once and every new call 503, while
  the calls in flight run on; flowrt.deploy.serving cancels what is left after `--grace`.
- Read timeouts: a connection that has not sent a whole request header within
  `--header-timeout` is closed (`HeaderDeadline`, on the server's connections; an idle
  keep-alive connection likewise, by aiohttp's keep-alive timeout), and a body that has not
  arrived within `--body-timeout` is answered 408 (`read_body`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

from aiohttp import web

from flowrt.frontdoor import FrontDoor

RETRY_AFTER = 1  # seconds a refused caller is told to wait
STOPPING = "the server is stopping and takes no new calls; send the request to another server"


class Refused(Exception):
    """A call the gateway does not take now: the status, the message, its code and Retry-After."""

    def __init__(self, status: int, message: str, code: str, retry_after: int | None = RETRY_AFTER):
        super().__init__(message)
        self.status, self.message, self.code, self.retry_after = status, message, code, retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}


class Admission:
    """The places for calls, their queue, each session's count, and the drain."""

    def __init__(self, door: FrontDoor):
        self.limit = door.max_in_flight
        self.queue_limit = door.max_queue
        self.session_limit = door.max_session_queue
        self.running = 0
        self.waiting: deque[asyncio.Future] = deque()
        self.sessions: dict[str, int] = {}
        self.draining = False
        self.refused = 0  # calls answered 429 (or 503 while draining)
        self.idle_waiters: list[asyncio.Future] = []  # `wait_idle`: woken when no call holds a place

    def drain(self) -> None:
        """Take no new call, and refuse those still waiting for a place; those in flight go on."""
        self.draining = True
        while self.waiting:
            turn = self.waiting.popleft()
            if not turn.done():
                self.refused += 1
                turn.set_exception(Refused(503, STOPPING, "shutdown"))

    @contextlib.asynccontextmanager
    async def place(self, session: str | None):
        """Hold a place for one call (waiting in the queue for it); Refused at once when there is
        none to wait for, or while draining."""
        if self.draining:
            self.refused += 1
            raise Refused(503, STOPPING, "shutdown")
        if session is not None and self.session_limit is not None and self.sessions.get(session, 0) >= self.session_limit:
            self.refused += 1
            raise Refused(
                429,
                f"the session already has {self.session_limit} calls running or waiting (--max-session-queue); "
                "wait for one to end",
                "rate_limit_exceeded",
            )
        if self.limit is not None and self.running >= self.limit:
            if self.queue_limit is not None and len(self.waiting) >= self.queue_limit:
                self.refused += 1
                raise Refused(
                    429,
                    f"the server is busy: {self.running} calls are running and {len(self.waiting)} waiting "
                    "(--max-in-flight, --max-queue); retry after the time Retry-After gives",
                    "rate_limit_exceeded",
                )
            turn = asyncio.get_running_loop().create_future()
            self.waiting.append(turn)
            try:
                await turn  # `_release` counts it as running before waking it
            except BaseException:
                if turn.done() and not turn.cancelled() and turn.exception() is None:  # woken, then cancelled
                    self._release()  # (pass the place on)
                elif turn in self.waiting:
                    self.waiting.remove(turn)
                raise
        else:
            self.running += 1
        if session is not None:
            self.sessions[session] = self.sessions.get(session, 0) + 1
        try:
            yield
        finally:
            if session is not None:
                left = self.sessions[session] - 1
                if left:
                    self.sessions[session] = left
                else:
                    del self.sessions[session]
            self._release()

    def _release(self) -> None:
        self.running -= 1
        while self.waiting:
            turn = self.waiting.popleft()
            if not turn.done():
                self.running += 1
                turn.set_result(None)
                return
        if self.running == 0:
            waiters, self.idle_waiters = self.idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def wait_idle(self) -> None:
        """Return once no call holds or waits for a place: its handler has finished answering
        (which can be a moment after the runtime's call ended)."""
        while self.running or self.waiting:
            waiter = asyncio.get_running_loop().create_future()
            self.idle_waiters.append(waiter)
            await waiter

    def statistics(self) -> dict[str, Any]:
        return {"admitted_running": self.running, "admission_waiting": len(self.waiting), "refused_calls": self.refused}


async def read_body(request: web.Request, seconds: float) -> bytes:
    """The request's body; Refused 408 if it has not all arrived within `seconds`."""
    try:
        return await asyncio.wait_for(request.read(), seconds)
    except TimeoutError:
        raise Refused(
            408, f"the body did not arrive within {seconds:g}s (--body-timeout); send it at once", "request_timeout", None
        ) from None


class HeaderDeadline:
    """Closes each connection that has not sent a whole request header within `seconds` of
    connecting, or of its last answer (a slowloris client, or an idle keep-alive connection).
    `middleware` counts the requests each connection has begun; a connection that began one
    since the deadline was set, or is still writing an answer, is left alone."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.begun: dict[Any, int] = {}  # connection (its protocol) -> requests begun; forgotten when it closes
        self.closed = 0

    def install(self, server: web.Server) -> None:
        """Watch every connection `server` (AppRunner.server) accepts from now on."""
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: Any) -> None:
            made(handler, transport)
            self.begun[handler] = 0
            self._arm(handler)

        def connection_lost(handler: Any, exc: BaseException | None) -> None:
            self.begun.pop(handler, None)
            lost(handler, exc)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        protocol = request.protocol
        if protocol not in self.begun:  # (a server this was not installed on)
            return await handler(request)
        self.begun[protocol] += 1
        try:
            return await handler(request)
        finally:
            if protocol in self.begun:
                self._arm(protocol)

    def _arm(self, protocol: Any) -> None:
        asyncio.get_running_loop().call_later(self.seconds, self._expire, protocol, self.begun[protocol])

    def _expire(self, protocol: Any, begun: int) -> None:
        if self.begun.get(protocol) != begun:  # closed, or a request began since
            return
        transport = protocol.transport
        if transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size():  # still writing its last answer to a slow reader
            self._arm(protocol)
            return
        self.closed += 1
        transport.close()
