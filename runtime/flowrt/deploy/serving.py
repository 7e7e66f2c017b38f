"""Serving a bundle: open its deployment, put the HTTP gateway in front, run until a signal.

What `flowc run DIR [--deploy ...]` (without --once) and `python -m BUNDLE serve|launch` run.
SIGTERM drains: `/ready` answers 503 and new calls 503 at once, the calls in flight run on for
at most `--grace` seconds (the front door's, flowrt.frontdoor), then what is left is
cancelled (its streams end with `done`, status `cancelled`, reason `shutdown`). SIGINT, or a
second signal, cancels the calls in flight at once. Then the deployment's processes stop and
`serve` returns.

The address is tried before the deployment starts, so a taken port is refused before any role
loads its model; `progress` hears how the start goes (flowrt.deploy.launch), and the log has a
`server_started` event once the server listens (flowrt.logs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from flowrt.deploy.launch import Progress, open_deployment
from flowrt.deploy.observed import gatherer
from flowrt.errors import FlowrtError
from flowrt.frontdoor import FrontDoor
from flowrt.gateway import application
from flowrt.gateway.http import ADMISSION, HEADERS
from flowrt.logs import event, log_format
from flowrt.observe import otlp
from flowrt.options import DEFAULT_MAX_BODY_MB, DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL
from flowrt.registry import DEFAULT_HEARTBEAT_TTL

log = logging.getLogger("flowrt.serving")


class CannotListen(FlowrtError):
    """The address is taken or not ours to bind."""


class CannotExport(FlowrtError):
    """OTLP export is asked for (OTEL_EXPORTER_OTLP_ENDPOINT) and the OpenTelemetry SDK is missing."""


class Stopped(FlowrtError):
    """SIGINT or SIGTERM arrived while the deployment was starting: it was stopped and cleaned up."""

    def __init__(self, signum: int):
        super().__init__(f"{signal.Signals(signum).name}: stopped while starting")
        self.signum = signum


async def serve(
    bundle_dir: Path,
    host: str,
    port: int,
    *,
    session_ttl: float = DEFAULT_SESSION_TTL,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    max_body_mb: float = DEFAULT_MAX_BODY_MB,
    deploy: str = "inproc",
    registry: str | None = None,
    heartbeat_ttl: float | None = None,
    pool_mb: float | None = None,
    debug: bool = False,
    progress: Progress | None = None,
    front: FrontDoor | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM; prints `serving NAME on http(s)://HOST:PORT` once listening.
    `deploy`, `registry` and `heartbeat_ttl` pick where the roles run (flowrt.deploy); `front`
    the keys, limits, timeouts and grace (flowrt.frontdoor). A signal while the
    deployment starts stops it there (its processes and sockets cleaned up): Stopped."""
    front = front or FrontDoor()
    stop = asyncio.Event()
    hurry = asyncio.Event()  # cancel the calls in flight now: SIGINT, or a second signal
    received: list[int] = []
    starting = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        received.append(signum)
        if signum != signal.SIGTERM or len(received) > 1:
            hurry.set()
        stop.set()
        if starting is not None:
            starting.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    _try_listen(host, port)
    try:
        otlp.check()  # asked for and not installed: refused before any role loads its model
    except otlp.OtlpUnavailable as error:
        raise CannotExport(str(error)) from None
    try:
        deployment = await open_deployment(
            bundle_dir,
            deploy,
            registry=registry,
            heartbeat_ttl=heartbeat_ttl or DEFAULT_HEARTBEAT_TTL,
            pool_mb=pool_mb,
            session_ttl=session_ttl,
            max_sessions=max_sessions,
            debug=debug,
            progress=progress,
        )
    except asyncio.CancelledError:
        if not received:
            raise
        raise Stopped(received[0]) from None
    starting = None
    runtime = deployment.runtime
    app = application(
        runtime, max_body_mb, deployment if deployment.supervisor is not None else None, gatherer(deployment), front
    )
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, keepalive_timeout=front.header_timeout)
    try:
        await runner.setup()
        app[HEADERS].install(runner.server)
        site = _Site(runner, host, port, ssl_context=front.tls, handshake_timeout=front.header_timeout)
        try:
            await site.start()
        except OSError as error:
            raise CannotListen(
                f"cannot listen on {host}:{port}: {error.strerror or error}; choose another --http HOST:PORT"
            ) from None
        bound_host, bound_port = runner.addresses[0][:2]
        url = f"{'https' if front.tls is not None else 'http'}://{bound_host}:{bound_port}"
        print(f"serving {runtime.bundle.name} on {url}", flush=True)
        log.info(
            "serving %s on %s (--deploy %s)",
            runtime.bundle.name,
            url,
            deploy,
            extra=event("server_started", url=url, deploy=deploy),
        )
        if front.keyed:  # how many keys, from where (never the keys)
            told = ", ".join(f"{count} from {source}" for source, count in front.sources.items())
            log.info("API keys: %s", told, extra=event("api_keys", sources=front.sources))
        await stop.wait()
        app[ADMISSION].drain()  # /ready and new calls: 503 from now on
        if not hurry.is_set() and front.grace > 0 and (runtime.calls or runtime.scheduler.queues):
            _say(
                f"draining: the calls in flight have {front.grace:g}s to finish (a second signal cancels them)", "server_draining"
            )
            await _drained(runtime, hurry, front.grace)
        left = len(runtime.calls)
        _say(f"stopping: cancelling the {left} call(s) still in flight" if left else "stopping", "server_stopping")
        await runtime.close()  # every stream ends with its `done` event before connections close
    finally:
        try:
            await runner.cleanup()
        finally:
            await deployment.close()  # the replica processes stop with the server, however it stops


class _Site(web.TCPSite):
    """aiohttp's TCP site, whose TLS handshake must end within `handshake_timeout` (the header
    timeout: a connection that sends no whole request header in time is closed, TLS or not;
    asyncio's own default holds a silent TLS connection for 60 s)."""

    def __init__(self, *args: Any, handshake_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handshake_timeout = handshake_timeout

    async def start(self) -> None:
        if self._ssl_context is None:
            return await super().start()
        await web.BaseSite.start(self)  # (TCPSite.start, with the handshake's limit)
        self._server = await asyncio.get_running_loop().create_server(
            self._runner.server,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            ssl_handshake_timeout=self._handshake_timeout,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port


def _say(line: str, name: str) -> None:
    if log_format() == "json":  # (stderr holds JSON lines only)
        log.info(line, extra=event(name))
    else:
        print(line, file=sys.stderr, flush=True)


async def _drained(runtime: object, hurry: asyncio.Event, grace: float) -> None:
    """Wait until no call is in flight, `grace` seconds pass, or `hurry` is set."""
    idle = asyncio.ensure_future(runtime.wait_idle())
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait((idle, hurried), timeout=grace, return_when=asyncio.FIRST_COMPLETED)
    finally:
        idle.cancel()
        hurried.cancel()


def _try_listen(host: str, port: int) -> None:
    """CannotListen now if `host:port` is taken or not ours to bind (as the server binds it:
    SO_REUSEADDR), rather than once every role has started; a name that does not resolve is
    left for the server's own bind to report."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return
    family, kind, proto, _, address = infos[0]
    with contextlib.ExitStack() as closing:
        try:
            probe = closing.enter_context(socket.socket(family, kind, proto))
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
        except OSError as error:
            raise CannotListen(
                f"cannot listen on {host}:{port}: {error.strerror or error}; choose another --http HOST:PORT"
            ) from None
