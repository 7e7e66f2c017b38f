"""Serving a bundle over HTTP: what `flowc run DIR --http HOST:PORT` runs (aiohttp).

    GET  /health                  {"status": "ok", "bundle": NAME, "graphs": [...], "core": how the control core runs}
    GET  /graphs                  every graph: its entry placeholders, streamed and returned fields
    POST /graphs/{graph}          body: a JSON object of entry values (as `--input`);
                                  session: header `X-Flow-Session` or `?session=`; `?timeout=SECONDS`
                                  → 200 `application/x-ndjson`, one event per line, exactly the
                                  lines `flowc run --once` prints, ending with the `done` event
    GET  /stats[?idle=SECONDS]    the runtime's statistics(); with `idle`, first waits (at most
                                  SECONDS) until no call is in flight

A request that cannot start a call gets a JSON `{"error": ..., "hint": ...}`: 400 for a body that
is not a JSON object, 404 for an unknown graph, 422 for inputs that do not match the entry.
A client that disconnects cancels its call. SIGINT or SIGTERM stops accepting, cancels the
calls in flight (their streams end with `done` and status `cancelled`), and exits.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from flowrt.control import CORE, BadInputs, FlowrtError, Runtime, UnknownGraph
from flowrt.values import summarize


class CannotListen(FlowrtError):
    """The address is taken or not ours to bind."""


RUNTIME: web.AppKey[Runtime] = web.AppKey("runtime", Runtime)
NDJSON = "application/x-ndjson"


def _error(status: int, message: str, hint: str) -> web.Response:
    return web.json_response({"error": message, "hint": hint}, status=status)


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 hosts in brackets) → (host, port); ValueError naming the expected form."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, e.g. 127.0.0.1:8000, not {text!r}")
    return host.strip("[]"), int(port)


def event_line(event: dict[str, Any]) -> bytes:
    """One event as `flowc run --once` prints it: summarised values, one JSON object per line."""
    return (json.dumps(summarize(event), ensure_ascii=False) + "\n").encode()


async def health(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    return web.json_response(
        {"status": "ok", "bundle": runtime.bundle.name, "graphs": sorted(runtime.bundle.plan["graphs"]), "core": CORE}
    )


async def graphs(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    described = {
        name: {
            "entry": plan["entry"],
            "stream": [o["field"] for o in plan["outputs"] if o["kind"] == "stream"],
            "return": [o["field"] for o in plan["outputs"] if o["kind"] == "return"],
            "timeout_s": plan.get("timeout_s"),
        }
        for name, plan in sorted(runtime.bundle.plan["graphs"].items())
    }
    return web.json_response(described)


async def stats(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    if "idle" in request.query:
        try:
            await asyncio.wait_for(runtime.wait_idle(), float(request.query["idle"]))
        except ValueError:
            return _error(400, f"`idle` must be a number of seconds, not {request.query['idle']!r}", "e.g. /stats?idle=5")
        except TimeoutError:
            pass  # report what is still in flight
    return web.json_response(runtime.statistics())


async def call_graph(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME]
    graph = request.match_info["graph"]
    try:
        inputs = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        return _error(400, f"the body is not JSON: {error}", 'send a JSON object of entry values, e.g. {"request": {...}}')
    if not isinstance(inputs, dict):
        return _error(400, f"the body is a JSON {type(inputs).__name__}, not an object", "send a JSON object of entry values")
    timeout = None
    if "timeout" in request.query:
        try:
            timeout = float(request.query["timeout"])
        except ValueError:
            return _error(400, f"`timeout` must be a number of seconds, not {request.query['timeout']!r}", "e.g. ?timeout=30")
    try:
        runtime.validate(graph, inputs)
    except UnknownGraph as error:
        return _error(404, str(error), "GET /graphs lists the graphs and their entry fields")
    except BadInputs as error:
        return _error(422, str(error), "GET /graphs lists each graph's entry fields")
    session = request.headers.get("X-Flow-Session") or request.query.get("session")
    response = web.StreamResponse(headers={"Content-Type": NDJSON})
    await response.prepare(request)
    events = runtime.call(graph, inputs, session=session, timeout=timeout)
    try:
        async for event in events:
            await response.write(event_line(event))
    finally:
        await events.aclose()  # a disconnect or an error above cancels the call and waits for it
    await response.write_eof()
    return response


def application(runtime: Runtime) -> web.Application:
    app = web.Application()
    app[RUNTIME] = runtime
    app.router.add_get("/health", health)
    app.router.add_get("/graphs", graphs)
    app.router.add_get("/stats", stats)
    app.router.add_post("/graphs/{graph}", call_graph)
    return app


async def serve(bundle_dir: Path, host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM; prints `serving NAME on http://HOST:PORT` once listening."""
    runtime = await Runtime.open(bundle_dir)
    runner = web.AppRunner(application(runtime), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as error:
            raise CannotListen(
                f"cannot listen on {host}:{port}: {error.strerror or error}; choose another --http HOST:PORT"
            ) from None
        bound_host, bound_port = runner.addresses[0][:2]
        print(f"serving {runtime.bundle.name} on http://{bound_host}:{bound_port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        print("stopping: cancelling the calls in flight", file=sys.stderr, flush=True)
        await runtime.close()  # every stream ends with its `done` event before connections close
    finally:
        await runner.cleanup()
