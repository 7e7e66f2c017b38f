"""Clients that go away: many at once over real loopback HTTP against a real server process, and
the race behind issue 12 item 2 reproduced step by step on the embedded runtime.

The race: a server's handler whose write fails (the client has gone: the transport is closing)
closes the call's event iterator, which cancels the call and waits for its end; the handler is
then cancelled too (aiohttp cancels it once the connection is lost), in the middle of that wait.
The call's retirement (releasing its session's turn, leaving `calls`) used to run in that
wait's `finally` and was skipped: the call stayed in /stats for ever and the session's next call
waited for ever. Retirement now belongs to the call's end.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from flowrt.control import Runtime
from tests.runtime.harness import assert_clean, bundle_of
from tests.runtime.test_serve import flowc, serving

FOREVER = """\
flow forever

placeholder start: Json

role ticker {
    impl "forever_roles:Ticker"
    lb session
    interface tick { in start  out stream tick: Json }
}

graph ticks {
    entry  start
    stream tick ordered
}
"""

FOREVER_ROLES = """\
import asyncio


class Ticker:
    async def tick(self, ctx, start):
        count = start.get("count")  # none: for ever
        i = 0
        try:
            while count is None or i < count:
                yield {"tick": {"i": i, "pad": "x" * 256}}
                i += 1
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            await asyncio.sleep(0.02)  # releasing what it holds takes a moment, as a model's would
            raise
"""

ROUNDS, CLIENTS = 4, 50  # 200 disconnects, 50 at a time


@pytest.fixture(scope="module")
def forever_bundle(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("forever")
    (source / "pipeline.flow").write_text(FOREVER, encoding="utf-8")
    (source / "forever_roles.py").write_text(FOREVER_ROLES, encoding="utf-8")
    out = source / "bundle"
    result = flowc("build", str(source / "pipeline.flow"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


def request(body: dict, session: str | None = None, close: bool = False) -> bytes:
    data = json.dumps(body).encode()
    head = f"POST /graphs/ticks HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    if close:
        head += "Connection: close\r\n"
    if session is not None:
        head += f"X-Flow-Session: {session}\r\n"
    return head.encode() + b"\r\n" + data


async def disconnecting_client(host: str, port: int, session: str, style: int, started: asyncio.Barrier) -> None:
    """Start a call, wait until every client of the round has one running, then go away: without
    reading further (the server's writes back up), after one more line, with a reset, or after
    a half-close."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request({"start": {}}, session))
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    while (await reader.readline()) not in (b"\r\n", b""):
        pass  # headers
    await reader.readline()  # the chunk size of the first event: the call is running
    await started.wait()
    sock = writer.get_extra_info("socket")
    if style == 1:
        await reader.readline()
    elif style == 2:  # an abortive close: the server sees a reset, not an end of stream
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    elif style == 3:  # a half-close: the server sees the end of the request stream first
        sock.shutdown(socket.SHUT_WR)
        await reader.readline()
    writer.close()


async def finite_call(host: str, port: int, session: str) -> dict:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request({"start": {"count": 3}}, session, close=True))
    await writer.drain()
    body = await reader.read()
    writer.close()
    lines = [line for line in body.split(b"\r\n") if line.startswith(b"{")]
    return json.loads(lines[-1])


async def storm(host: str, port: int) -> list[str]:
    sessions = []
    for round_ in range(ROUNDS):
        started = asyncio.Barrier(CLIENTS)
        names = [f"r{round_}-c{i}" for i in range(CLIENTS)]
        sessions += names
        await asyncio.wait_for(
            asyncio.gather(*(disconnecting_client(host, port, s, i % 4, started) for i, s in enumerate(names))), 60
        )
    return sessions


def test_concurrent_disconnects_leave_no_call_and_no_wedged_session(forever_bundle: Path):
    with serving(forever_bundle) as server:
        sessions = asyncio.run(storm(server.host, server.port))
        status, statistics = server.get("/stats?idle=30")
        assert status == 200
        assert not any(statistics.values()), statistics  # calls, tasks, undelivered events, sessions, queues
        # every session still takes a call (a wedged one would wait for ever: bounded by wait_for)

        async def again() -> list[dict]:
            return await asyncio.wait_for(asyncio.gather(*(finite_call(server.host, server.port, s) for s in sessions)), 60)

        assert {d["status"] for d in asyncio.run(again())} == {"ok"}
        assert not any(server.get("/stats?idle=30")[1].values())
        server.process.send_signal(2)
        _, stderr = server.process.communicate(timeout=30)
        assert "Traceback" not in stderr and "Error handling request" not in stderr, stderr


RELUCTANT = """\
flow reluctant

placeholder start: Json

role ticker {
    impl "m:Reluctant"
    interface tick { in start  out stream tick: Json }
}

graph ticks {
    entry  start
    stream tick
}
"""


class Reluctant:
    """Streams until cancelled, then takes until `release` is set to wind down."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def tick(self, ctx, start):
        try:
            while True:
                yield {"tick": 1}
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.cancelled.set()
            await self.release.wait()
            raise


def test_a_caller_cancelled_while_closing_its_call_still_retires_it(tmp_path):
    """The race, step by step: the consumer stops (a failed write), closes the events, which
    cancels the call and waits for its end; the consumer is cancelled during that wait; the call
    ends later. The call must leave `calls` and release its session when it ends."""

    async def main():
        role = Reluctant()
        runtime = await Runtime.open(bundle_of(RELUCTANT, tmp_path), instances={"ticker": [role]})
        events = runtime.call("ticks", {"start": {}}, session="s1")

        async def handler():
            try:
                async for _ in events:
                    raise ConnectionResetError("Cannot write to closing transport")
            except ConnectionResetError:
                pass
            finally:
                await events.aclose()

        task = asyncio.ensure_future(handler())
        await asyncio.wait_for(role.cancelled.wait(), 10)  # the handler is now waiting for the call's end
        task.cancel()  # aiohttp: the connection is lost
        with pytest.raises(asyncio.CancelledError):
            await task
        assert runtime.statistics()["calls"] == 1  # still winding down
        role.release.set()
        await asyncio.wait_for(runtime.wait_idle(), 10)
        assert_clean(runtime)
        role.release = asyncio.Event()
        role.release.set()
        later = runtime.call("ticks", {"start": {}}, session="s1")
        assert (await asyncio.wait_for(later.__anext__(), 10))["event"] == "stream"  # the session takes a call
        await later.aclose()
        assert runtime.last_call.cancel_reason == "client gone"
        assert_clean(runtime)
        await runtime.close()

    asyncio.run(main())
