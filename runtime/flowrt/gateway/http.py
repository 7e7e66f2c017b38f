"""The HTTP gateway: the aiohttp application `flowc run DIR --http HOST:PORT` serves (any `--deploy`).

    GET  /health                  {"status": "ok", "bundle": NAME, "graphs": [...], "core": how the control core runs}
    GET  /ready                   200 {"ready": true} while the server takes calls; 503 once it drains (SIGTERM)
    GET  /graphs                  every graph: its entry placeholders and their types, which of them stream
                                  (`entry_stream`), streamed and returned fields
    POST /graphs/{graph}          body: a JSON object of entry values (as `--input`; a streaming entry's value
                                  is the list of its frames, as `runtime.call` takes it);
                                  session: header `X-Flow-Session` or `?session=`; `?timeout=SECONDS`
                                  → 200 `application/x-ndjson`, one event per line, the lines
                                  `flowc run --once` prints, ending with the `done` event;
                                  `?trace=1`: the `done` event carries the call's Chrome trace
                                  under `trace` (flowrt.observe.trace; docs/observe.md); images
                                  and audio (values with `media()`) go in full, as base64 with
                                  their `format` (png, wav); `?summary=1`: as summaries instead
    GET  /graphs/{graph}/ws       a WebSocket (protocol flowrt.ws.v1, docs/websocket.md): calls whose streaming
                                  entries' frames arrive while they run, several on one connection, each
                                  call's events as POST's, tagged with the call (flowrt.gateway.websocket)
    GET  /stats[?idle=SECONDS]    the runtime's statistics(); with `idle`, first waits (at most
                                  SECONDS) until no call is running or queued; under `local`
                                  and `ray`, also replicas up, restarts and each replica
                                  process's own statistics (`processes`); always `in_flight`:
                                  the calls running, oldest first (graph, call_id, session, age_s);
                                  the front door's counts: admitted_running, admission_waiting,
                                  refused_calls (429/503), unauthorized_requests (401), forbidden_sessions (403);
                                  session ids, paths and PIDs only to an admin key (flowrt.gateway.exposure)
    GET  /metrics                 Prometheus text format: calls, activations, latency (flowrt.observe.metrics),
                                  and the deployment's replicas, edges, pools and prefix reuse,
                                  gathered from its processes as it is asked (flowrt.observe.deployment)
    POST /v1/chat/completions, /v1/images/generations, /v1/audio/speech, /v1/embeddings, GET /v1/models
                                  OpenAI's API, errors too (flowrt.gateway.openai_routes); GET /v1/realtime:
                                  a WebSocket speaking OpenAI's Realtime events (flowrt.gateway.realtime)

Every answer that is not a call's event stream is JSON, and every error is `{"error": ...,
"hint": ...}`: 400 for a body that is not a JSON object (or that cannot be decoded as its
`Content-Encoding` says) or a bad query value, 404 for an unknown graph or path, 405 for a
method a path does not answer, 413 for a body over the limit, 422 for inputs that do not match
the graph's entry (names or declared types), 500 for a bug in flowrt (logged with its
traceback). A role that raises flowrt.BadInput before anything was written makes the answer 400
with its message (`"code": "bad_input"`). A client that disconnects cancels its call. Starting
and stopping a server is flowrt.deploy.serving's.

The front door (flowrt.frontdoor; docs/security.md): API keys and session owners (401,
403: flowrt.gateway.access), admission limits and the drain (429, 503, 408:
flowrt.gateway.admission), and what callers may see (flowrt.gateway.exposure).

A call's events are written as they become ready: all the events ready when the previous write
returns go out in one write, so a burst costs one send, and an event never waits for a later one
(a graph with a streaming entry, its frames given as lists: one write per event, `runtime.call`'s).
The answer starts with the call's first events (a call that is over by then is one plain answer
with a Content-Length; else the events stream in chunks), so a call that waits for its
session's turn sends nothing until it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from flowrt import options
from flowrt.control import CORE, BadInputs, BadTimeout, Runtime, UnknownGraph
from flowrt.control.sessions import reserved
from flowrt.frontdoor import FrontDoor
from flowrt.gateway import openai_routes, websocket
from flowrt.gateway.access import ADMIN, PRINCIPAL, Access, SessionOwners, refused_session
from flowrt.gateway.admission import Admission, HeaderDeadline, Refused, read_body
from flowrt.gateway.exposure import client_events, hide_paths, public_stats
from flowrt.gateway.uploads import UploadError, multipart_inputs
from flowrt.observe import CallTrace, Metrics, combine, otlp
from flowrt.observe.audio import AudioClock, traced
from flowrt.observe.calls import CallsInFlight
from flowrt.observe.deployment import DeploymentMetrics
from flowrt.observe.metrics import CONTENT_TYPE as METRICS_TYPE
from flowrt.options import DEFAULT_MAX_BODY_MB
from flowrt.values import event_json

RUNTIME: web.AppKey[Runtime] = web.AppKey("runtime", Runtime)
DEPLOYMENT: web.AppKey[Any] = web.AppKey("deployment", object)  # flowrt.deploy.Deployment, when serving one
MAX_BODY: web.AppKey[int] = web.AppKey("max_body", int)  # bytes
METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)  # what GET /metrics reads; the runtime's observer
DEPLOYMENT_METRICS: web.AppKey[DeploymentMetrics] = web.AppKey("deployment_metrics", DeploymentMetrics)  # ... and this
IN_FLIGHT: web.AppKey[CallsInFlight] = web.AppKey("in_flight", CallsInFlight)  # GET /stats' `in_flight`; an observer too
FRONT: web.AppKey[FrontDoor] = web.AppKey("front_door", FrontDoor)  # keys, limits, timeouts (flowrt.frontdoor)
ADMISSION: web.AppKey[Admission] = web.AppKey("admission", Admission)  # places for calls, and the drain
ACCESS: web.AppKey[Access] = web.AppKey("access", Access)  # API keys, and what they refused
OWNERS: web.AppKey[SessionOwners] = web.AppKey("owners", SessionOwners)  # which key owns which session
HEADERS: web.AppKey[HeaderDeadline] = web.AppKey("headers", HeaderDeadline)  # the header read timeout
NDJSON = "application/x-ndjson"
log = logging.getLogger("flowrt.gateway")


def _error(status: int, message: str, hint: str, headers: dict[str, str] | None = None, code: str | None = None) -> web.Response:
    body = {"error": message, "hint": hint} | ({"code": code} if code is not None else {})
    return web.json_response(body, status=status, headers=headers)


def refusal(refused: Refused) -> web.Response:
    """A call the front door does not take (429, 503, 408), as the gateway answers errors."""
    hint = {
        429: "wait as long as Retry-After says and send it again",
        503: "send it to another server, or again once this one is back",
        408: "send the whole body at once",
    }.get(refused.status, "send it again")
    return _error(refused.status, refused.message, hint, refused.headers(), refused.code)


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 hosts in brackets) → (host, port); ValueError naming the expected form."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, e.g. 127.0.0.1:8000, not {text!r}")
    return host.strip("[]"), int(port)


def event_lines(events: list[dict[str, Any]], *, media: bool = False) -> bytes:
    """Events as `flowc run --once` prints them: one JSON object per line, values summarised;
    with `media`, images and audio in full (flowrt.values)."""
    return ("\n".join([event_json(event, media=media) for event in events]) + "\n").encode()


ROUTES = (
    "GET /health, GET /ready, GET /graphs, GET /stats, GET /metrics, POST /graphs/GRAPH, GET /graphs/GRAPH/ws (WebSocket), "
    "POST /v1/chat/completions, GET /v1/models"
)


@web.middleware
async def json_errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Every error as `{"error", "hint"}`: aiohttp's own (unknown path or method, body too
    large), a client gone mid-request (quietly), and bugs (logged with their traceback)."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as error:
        allowed = ", ".join(sorted(error.allowed_methods))
        return _error(
            405,
            f"{request.path} does not answer {request.method}",
            f"{request.path} answers {allowed}; the server answers {ROUTES}",
            {"Allow": ",".join(sorted(error.allowed_methods))},
        )
    except web.HTTPNotFound:
        return _error(404, f"no such path: {request.path}", f"the server answers {ROUTES}")
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[MAX_BODY] / 2**20
        return _error(
            413,
            f"the body is larger than the server's limit of {limit:g} MiB",
            "send a smaller body, or start the server with a larger --max-body-mb",
        )
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return _error(error.status, error.reason, f"the server answers {ROUTES}")
    except ConnectionError:
        return web.Response(status=400)  # the client is gone: nobody reads this
    except Exception as error:  # noqa: BLE001 - a bug in flowrt: logged with its traceback, answered as JSON
        log.exception("internal error answering %s %s", request.method, request.path)
        return _error(
            500,
            hide_paths(f"internal error: {type(error).__name__}: {error}"),
            "this is a bug in flowrt; the server's log has the traceback; please report it",
        )


async def health(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    return web.json_response(
        {"status": "ok", "bundle": runtime.bundle.name, "graphs": sorted(runtime.bundle.plan["graphs"]), "core": CORE}
    )


async def ready(request: web.Request) -> web.Response:
    if request.app[ADMISSION].draining:
        return web.json_response({"ready": False, "reason": "draining: the server is stopping"}, status=503)
    return web.json_response({"ready": True})


async def graphs(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    described = {
        name: {
            "entry": plan["entry"],
            "types": runtime.entry_types.get(name, {}),
            "entry_stream": list(plan.get("entry_stream", ())),
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
            idle = options.wait_seconds(request.query["idle"])
        except ValueError as error:
            return _error(400, f"`idle`: {error}", "e.g. /stats?idle=5 waits at most 5 s for no call in flight")
        with contextlib.suppress(TimeoutError):  # report what is still in flight
            await asyncio.wait_for(_idle(runtime, request.app[ADMISSION]), idle)
    deployment = request.app.get(DEPLOYMENT)
    answer = await deployment.statistics() if deployment is not None else runtime.statistics()
    door = {
        **request.app[ADMISSION].statistics(),
        **request.app[ACCESS].statistics(),
        "forbidden_sessions": request.app[OWNERS].refused,
    }
    answer = {**answer, **door, "in_flight": request.app[IN_FLIGHT].listing()}
    return web.json_response(answer if request.get(ADMIN) else public_stats(answer))


async def _idle(runtime: Runtime, admission: Any) -> None:
    """No call in the runtime, and no handler still holding a place (answering a call that ended)."""
    await runtime.wait_idle()
    await admission.wait_idle()


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].exposition()
    deployment = request.app.get(DEPLOYMENT_METRICS)
    if deployment is not None:  # (its processes are asked now: what it reports is as of this request)
        await deployment.refresh()
        body += deployment.exposition()
    return web.Response(body=body, headers={"Content-Type": METRICS_TYPE})


TRACE_FLAGS = {"1": True, "true": True, "0": False, "false": False}


def unreadable_body(error: web.RequestPayloadError) -> str:
    """What is wrong with a body aiohttp could not decode (a bad `Content-Encoding`, a broken chunk)."""
    told = " ".join(str(error).split()).removeprefix("400, message: ")  # (aiohttp's wording)
    return f"the body could not be read ({told})"


_JSON_KINDS = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


async def _read_inputs(request: web.Request, entry: tuple[str, ...]) -> Any:
    """The body as JSON, or an error answer saying what is wrong with it."""
    example = ", ".join(f'"{name}": ...' for name in entry or ("request",))
    hint = f"send a JSON object of entry values, e.g. {{{example}}}"
    try:  # over the limit: HTTPRequestEntityTooLarge, answered by `json_errors`
        body = await read_body(request, request.app[FRONT].body_timeout)
    except Refused as refused:
        return refusal(refused)
    except web.RequestPayloadError as error:  # e.g. `Content-Encoding: gzip` on a body that is not gzip
        return _error(400, unreadable_body(error), f"{hint}, encoded as its Content-Encoding and Transfer-Encoding say")
    if request.content_type == "multipart/form-data":  # media as uploaded files (flowrt.gateway.uploads)
        try:
            return multipart_inputs(request.headers.get("Content-Type", ""), body)
        except UploadError as error:
            return _error(400, str(error), hint)
    try:
        return json.loads(body)
    except RecursionError:
        return _error(400, "the body is nested too deeply to read as JSON", hint)
    except UnicodeDecodeError as error:
        return _error(400, f"the body is not UTF-8 JSON ({error.reason} at byte {error.start})", hint)
    except ValueError as error:
        kind = request.content_type
        told = f" (Content-Type: {kind})" if kind not in ("application/json", "application/octet-stream") else ""
        return _error(400, f"the body is not JSON{told}: {error}", hint)


async def call_graph(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME]
    graph = request.match_info["graph"]
    program = runtime.programs.get(graph)
    inputs = await _read_inputs(request, program.entry if program is not None else ())
    if isinstance(inputs, web.Response):
        return inputs
    if not isinstance(inputs, dict):
        return _error(400, f"the body is a JSON {_JSON_KINDS[type(inputs)]}, not an object", "send a JSON object of entry values")
    timeout = None
    if "timeout" in request.query:
        try:
            timeout = options.timeout_seconds(request.query["timeout"])
        except ValueError as error:
            return _error(400, f"`timeout`: {error}", "e.g. ?timeout=30 cancels the call after 30 s")
    tracing = TRACE_FLAGS.get(request.query.get("trace", "0").lower())
    if tracing is None:
        return _error(
            400,
            f"`trace`: expected 1 (or true) or 0 (or false), not {request.query['trace']!r}",
            "?trace=1 adds the call's trace to its done event",
        )
    summary = TRACE_FLAGS.get(request.query.get("summary", "0").lower())
    if summary is None:
        return _error(
            400,
            f"`summary`: expected 1 (or true) or 0 (or false), not {request.query['summary']!r}",
            "?summary=1 sends images and audio as summaries instead of in full",
        )
    trace = CallTrace("flowrt gateway") if tracing else None
    session = request.headers.get("X-Flow-Session") or request.query.get("session")
    if session is not None and reserved(session):
        return _error(400, f"`X-Flow-Session`: {reserved(session)}", "leave the session out for a call of its own")
    try:
        async with request.app[ADMISSION].place(session):
            owners = request.app[OWNERS]
            if session is not None and not owners.claim(session, request[PRINCIPAL]):
                return _error(403, refused_session(session), "each API key has sessions of its own", code="session_not_yours")
            try:
                return await _answer(request, runtime, graph, inputs, session, timeout, trace, media=not summary)
            finally:
                if session is not None:
                    owners.release(session)
    except Refused as refused:
        return refusal(refused)


async def _answer(
    request: web.Request,
    runtime: Runtime,
    graph: str,
    inputs: dict,
    session: str | None,
    timeout: float | None,
    trace: Any,
    media: bool = True,
) -> web.StreamResponse:
    try:
        observer = combine(runtime.observer, trace) if trace is not None else None
        program = runtime.programs.get(graph)
        if program is not None and program.entry_stream:  # each streaming entry's frames as a list
            runtime.check_inputs(graph, inputs)  # (bad inputs: answered at once, as call_batches raises them)
            events = _one_by_one(runtime.call(graph, inputs, session=session, timeout=timeout, observer=observer))
        else:
            events = runtime.call_batches(graph, inputs, session=session, timeout=timeout, observer=observer)
    except UnknownGraph as error:
        return _error(404, str(error), "GET /graphs lists the graphs and their entry fields")
    except (BadInputs, BadTimeout) as error:
        return _error(422, str(error), "GET /graphs lists each graph's entry fields and their types")
    response: web.StreamResponse | None = None
    roots = runtime.bundle.python_path
    clock = AudioClock(graph, time.perf_counter())  # (the whole input came with the request)
    try:
        async for batch in events:
            now = time.perf_counter()
            for event in batch:
                clock.saw(event, now)
            if batch[-1]["event"] == "done":  # the call's last events, told as callers may see them
                batch = client_events(batch, roots)
                if response is None and _bad_input(batch[-1]):  # nothing written yet: the caller's to fix
                    return _bad_input_answer(batch[-1])
            data = event_lines(batch, media=media)  # images and audio in full, unless ?summary=1
            if batch[-1]["event"] == "done":  # the call's last events
                if trace is not None:  # the trace's JSON text spliced in as the done event's last key
                    traced_json = traced(trace.chrome_trace_json(), clock, trace.started, trace.pid)  # (+ its audio figures)
                    data = data[: -len(b"}\n")] + b', "trace": ' + traced_json + b"}\n"
                if response is None:  # all of them at once: one plain answer, one write
                    return web.Response(body=data, content_type=NDJSON)
                await response.write_eof(data)
                return response
            if response is None:  # the answer starts with the first events
                response = web.StreamResponse(headers={"Content-Type": NDJSON})
                await response.prepare(request)
            await response.write(data)
    except ConnectionError:
        pass  # the client went away: closing the events below cancels its call
    finally:
        await events.aclose()  # cancels the call if it has not ended; it is retired even if this is cancelled
        request.app[METRICS].audio.record(clock)
    return response if response is not None else web.Response(status=499)  # the client is gone: nobody reads it


async def _one_by_one(events: Any) -> Any:
    """`runtime.call`'s events as `call_batches` gives them, each in a list of its own."""
    try:
        async for event in events:
            yield [event]
    finally:
        await events.aclose()


def _bad_input(done: dict[str, Any]) -> bool:
    """A call that failed only because a role found its request bad (flowrt.BadInput)."""
    errors = done.get("errors") or []
    return done.get("status") == "error" and bool(errors) and all(e.get("bad_input") for e in errors)


def _bad_input_answer(done: dict[str, Any]) -> web.Response:
    told = "; ".join(
        (f"role `{e['role']}` (interface `{e['interface']}`): " if e["role"] else "") + e["message"] for e in done["errors"]
    )
    return _error(400, f"the request cannot be served: {told}", "fix the request as the message says", code="bad_input")


def application(
    runtime: Runtime,
    max_body_mb: float = DEFAULT_MAX_BODY_MB,
    deployment: Any = None,
    gather: Any = None,
    front: FrontDoor | None = None,
) -> web.Application:
    """The server's routes over `runtime`, whose calls it counts for /metrics from now on;
    `gather` (flowrt.deploy.observed) adds the deployment's own metrics to /metrics; `front`:
    keys, limits and timeouts (none by default). flowrt.deploy.serving installs `app[HEADERS]`
    on the server's connections and drains `app[ADMISSION]` on SIGTERM."""
    max_body = int(max_body_mb * 2**20)
    front = front or FrontDoor()
    headers = HeaderDeadline(front.header_timeout)
    access = Access(front)
    app = web.Application(middlewares=[json_errors, headers.middleware, access.middleware], client_max_size=max_body)
    app[RUNTIME] = runtime
    app[FRONT] = front
    app[ADMISSION] = Admission(front)
    app[ACCESS] = access
    app[OWNERS] = SessionOwners(lambda session: session in runtime.scheduler.queues or session in runtime.sessions.idle)
    app[HEADERS] = headers
    if deployment is not None:
        app[DEPLOYMENT] = deployment
    app[MAX_BODY] = max_body
    app[METRICS] = _installed(runtime, Metrics)
    if gather is not None:
        app[DEPLOYMENT_METRICS] = DeploymentMetrics(gather)
    app[IN_FLIGHT] = _installed(runtime, CallsInFlight)
    if (
        _installed(runtime, otlp.OtlpExport, install=False) is None
    ):  # (a second server over the runtime shares the first's export)
        export = otlp.from_environment()  # OTEL_EXPORTER_OTLP_ENDPOINT set: every call as spans (flowrt.observe.otlp)
        if export is not None:
            runtime.observer = combine(runtime.observer, export)
            app.on_cleanup.append(lambda _: asyncio.to_thread(export.shutdown))
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/graphs", graphs)
    app.router.add_get("/stats", stats)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/graphs/{graph}", call_graph)
    openai_routes.add_routes(app, runtime, app[ADMISSION], app[OWNERS], front.body_timeout)
    websocket.add_routes(app, runtime, app[ADMISSION], app[OWNERS], max_body, app[METRICS].audio)  # GET /graphs/{graph}/ws
    return app


def _installed(runtime: Runtime, kind: type, install: bool = True) -> Any:
    """The runtime's observer of `kind`, else a new `kind()` installed now (None if not `install`):
    a second server over the same runtime reads the same counts, and no call is counted twice."""
    observers = getattr(runtime.observer, "observers", (runtime.observer,))
    for observer in observers:
        if isinstance(observer, kind):
            return observer
    if not install:
        return None
    observer = kind()
    runtime.observer = combine(runtime.observer, observer)
    return observer
