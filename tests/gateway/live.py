"""A gateway served on 127.0.0.1 inside a test's event loop (as flowrt.deploy.serving runs it),
with a client, for the WebSocket and Realtime tests: `served`, `opened`, `run`, and `drained`
(nothing left in flight, the runtime's statistics all zero)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import NamedTuple

import aiohttp
from aiohttp import web

from flowrt.control import Runtime
from flowrt.frontdoor import FrontDoor
from flowrt.gateway.http import application
from tests.runtime.harness import assert_clean


def run(coroutine, seconds: float = 60):
    return asyncio.run(asyncio.wait_for(coroutine, seconds))


class Served(NamedTuple):
    app: web.Application
    base: str  # http://HOST:PORT
    client: aiohttp.ClientSession


@contextlib.asynccontextmanager
async def served(runtime: Runtime, front: FrontDoor | None = None, max_body_mb: float = 1.0, deployment=None):
    """The gateway over `runtime` on 127.0.0.1, and a client."""
    app = application(runtime, max_body_mb, deployment, front=front)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession() as client:
            yield Served(app, f"http://{host}:{port}", client)
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def opened(bundle: Path):
    runtime = await Runtime.open(bundle)
    try:
        yield runtime
    finally:
        await runtime.close()


async def drained(server: Served, runtime: Runtime, headers: dict | None = None, idle_sessions: int = 0) -> None:
    """/stats?idle=5: no call in flight and no place held; the runtime's statistics all zero but
    `idle_sessions` sessions whose state is kept (a client's named session outlives its calls)."""
    async with server.client.get(f"{server.base}/stats?idle=5", headers=headers) as answer:
        stats = await answer.json()
    assert stats["calls"] == 0 and stats["in_flight"] == [] and stats["admitted_running"] == 0, stats
    assert stats["admission_waiting"] == 0 and stats["queued_calls"] == 0, stats
    if idle_sessions:
        held = runtime.statistics()
        assert held["sessions"] == held["idle_sessions"] == idle_sessions, held
        assert all(v == 0 for k, v in held.items() if k not in ("sessions", "idle_sessions")), held
    else:
        assert_clean(runtime)


def masked_text(message: dict) -> bytes:
    """One client text frame (masked, as RFC 6455 asks of a client)."""
    payload, mask = json.dumps(message).encode(), b"\x01\x02\x03\x04"
    assert len(payload) < 126
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x81, 0x80 | len(payload)]) + mask + body
