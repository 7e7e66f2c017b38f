"""`GET /v1/realtime?model=MODEL` (docs/openai.md, "Realtime"): the upgrade and its refusals, and
the open connections, each a flowrt.gateway.realtime `Connection`, which the server's shutdown
ends. Registered by flowrt.gateway.openai_routes."""

from __future__ import annotations

import asyncio
import inspect
import uuid

from aiohttp import WSCloseCode, web

from flowrt.control import Runtime
from flowrt.control.sessions import reserved
from flowrt.gateway.access import PRINCIPAL, SessionOwners, offered_protocols, refused_session
from flowrt.gateway.admission import Admission, Refused
from flowrt.gateway.openai_request import ChatError, served
from flowrt.gateway.realtime import Connection
from flowrt.observe.audio import AudioFigures
from flowrt.observe.metrics import Metrics

SHUTDOWN_WAIT = 5.0  # seconds the server's shutdown waits for the cancelled responses' response.done
CONNECTIONS: web.AppKey[dict] = web.AppKey("realtime_connections", dict)  # ws -> Connection
BETA = "realtime=v1"  # the `OpenAI-Beta` header of a client that speaks the beta events
BETA_PROTOCOL = "openai-beta.realtime-v1"  # ... or, from a browser, a subprotocol it offers


def add_routes(app: web.Application, runtime: Runtime, admission: Admission, owners: SessionOwners) -> None:
    """Register `/v1/realtime` (flowrt.gateway.openai_routes does, before its catch-all)."""
    endpoint = RealtimeEndpoint(runtime, admission, owners)
    app[CONNECTIONS] = endpoint.connections
    app.router.add_route("*", "/v1/realtime", endpoint.connect)
    app.on_shutdown.append(endpoint.shutdown)


class RealtimeEndpoint:
    def __init__(self, runtime: Runtime, admission: Admission, owners: SessionOwners):
        self.runtime, self.admission, self.owners = runtime, admission, owners
        self.connections: dict[web.WebSocketResponse, Connection] = {}
        self.interrupts = "interrupt" in inspect.signature(runtime.start).parameters
        observers = getattr(runtime.observer, "observers", (runtime.observer,))  # (the server's /metrics)
        metrics = next((o for o in observers if isinstance(o, Metrics)), None)
        self.audio = metrics.audio if metrics is not None else AudioFigures()
        self.models: dict[str, dict[str, str]] = {}  # graph -> the fields /v1/realtime reads (bundle.json)
        for graph in runtime.bundle.plan["graphs"]:
            fields = (served(runtime, graph) or {}).get("realtime")
            if fields is not None:
                self.models[graph] = fields

    async def connect(self, request: web.Request) -> web.StreamResponse:
        """The upgrade, or OpenAI's error object (404 unknown model, 400 one that is not a realtime
        model or no upgrade, 403 another key's session, 503 draining) before it happens."""
        if request.method != "GET":
            error = ChatError(
                405, f"/v1/realtime answers GET (a WebSocket upgrade), not {request.method}", None, "method_not_allowed"
            )
            return web.json_response(error.body(), status=405, headers={"Allow": "GET"})
        model = request.query.get("model")
        fields = self.models.get(model or "")
        if fields is None:
            known = ", ".join(sorted(self.models)) or "none (a graph says `serves realtime`)"
            if model is None or model not in self.runtime.programs:
                told = "give the model as `?model=GRAPH`" if model is None else f"the model `{model}` does not exist"
                return ChatError(404, f"{told}; realtime models: {known}", "model", "model_not_found").response()
            return ChatError(
                400,
                f"the model `{model}` is not a realtime model (its graph does not `serves realtime`); realtime models: {known}",
                "model",
                "model_not_supported",
            ).response()
        named = request.headers.get("X-Flow-Session") or request.query.get("session")
        if named is not None and reserved(named):
            return ChatError(400, f"the session (`X-Flow-Session`): {reserved(named)}", "session", "invalid_session").response()
        if self.admission.draining:
            refused = Refused(503, "the server is stopping and takes no new connections", "shutdown")
            body = ChatError(503, refused.message, None, refused.code).body()
            return web.json_response(body, status=503, headers=refused.headers())
        # (a browser offers `realtime`, its key and `openai-beta.realtime-v1` as subprotocols: one must be chosen)
        ws = web.WebSocketResponse(protocols=("realtime",), max_msg_size=request.client_max_size, compress=False)
        if not ws.can_prepare(request).ok:
            return ChatError(
                400,
                "/v1/realtime is a WebSocket endpoint and this request asks for no upgrade; connect with a "
                "Realtime client (e.g. openai's `client.realtime.connect(model=...)`)",
                None,
                "upgrade_required",
            ).response()
        session = named or f"realtime_{uuid.uuid4().hex}"
        principal = request[PRINCIPAL]
        if not self.owners.claim(session, principal):
            return ChatError(403, refused_session(session), "session", "session_not_yours", "permission_error").response()
        try:
            await ws.prepare(request)
            beta = request.headers.get("OpenAI-Beta", "").replace(" ", "") == BETA or BETA_PROTOCOL in offered_protocols(request)
            connection = self.connections[ws] = Connection(self, ws, model, fields, session, named is None, beta)
            try:
                await connection.serve()
            finally:
                self.connections.pop(ws, None)
        finally:
            self.owners.release(session)
        return ws

    async def shutdown(self, app: web.Application) -> None:
        """The server stops: every call is cancelled (reason `shutdown`), its response.done written
        (for at most SHUTDOWN_WAIT seconds), then every connection closes (1001, going away)."""
        tasks = []
        for connection in list(self.connections.values()):
            tasks += await connection.stop_all("shutdown")
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_WAIT)
        for ws in list(self.connections):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"the server is stopping")
