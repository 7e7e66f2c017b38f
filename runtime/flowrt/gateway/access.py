"""Who may use the gateway: API keys (Bearer authentication), the admin key, and which key owns
which session (docs/security.md).

With keys (flowrt.frontdoor), `/graphs`, `/v1` and `/stats` answer only a request whose
`Authorization: Bearer KEY` names one: else 401 (OpenAI's error object with code
`invalid_api_key` under /v1, the gateway's `{"error", "hint", "code"}` elsewhere) and a
`WWW-Authenticate: Bearer` header. `/metrics` and `/health` are open unless `--protect-metrics`;
`/ready` is always open (a probe has no key, and it tells nothing). A key is compared with each
configured key in constant time (`hmac.compare_digest` over SHA-256 digests, all of them every
time), and is never logged: a caller is known by its key's `principal`, a short digest.

A browser cannot set headers on a WebSocket, so a WebSocket upgrade (`/v1/realtime`,
`/graphs/GRAPH/ws`) may carry its key as a subprotocol instead, as OpenAI's browser clients do:
`Sec-WebSocket-Protocol: openai-insecure-api-key.KEY` among the protocols it offers (used only
without an `Authorization` header; the endpoints never choose it as the connection's protocol).
Only over TLS, or on loopback, is that as safe as the header: the name says why.

A session belongs to the key whose call named it first (`SessionOwners`): another key's call
of it is refused 403 while the runtime holds the session (a call of it running or queued, or
its state kept while idle); once the runtime has let it go, it is anyone's again, as new.
Without keys every caller is the same nobody, and sessions are shared as before.

With `--prefix-scope key` (the default with keys), the calls a request starts carry its key's
principal as their prefix scope (flowrt.control.sessions.PREFIX_SCOPE), so KV prefix reuse, and
what `reused_tokens` tells, stays within one key's calls.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from flowrt.control.sessions import PREFIX_SCOPE
from flowrt.frontdoor import FrontDoor

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PRINCIPAL = "flowrt.principal"  # request[PRINCIPAL]: the caller's key's digest ("" without keys)
ADMIN = "flowrt.admin"  # request[ADMIN]: whether it may read /stats in full
OPEN_PATHS = ("/ready",)  # answered to anyone, whatever the options
PROBE_PATHS = ("/health", "/metrics")  # open unless --protect-metrics
KEY_PROTOCOL = "openai-insecure-api-key."  # a browser's WebSocket key, as a subprotocol (OpenAI's convention)


def _offered(request: web.Request) -> list[str]:
    return [p for p in (p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")) if p]


def offered_protocols(request: web.Request) -> list[str]:
    """The WebSocket subprotocols a request offers, the key one (`KEY_PROTOCOL`) left out."""
    return [p for p in _offered(request) if not p.startswith(KEY_PROTOCOL)]


def presented_key(request: web.Request) -> str | None:
    """The `Authorization` header, or for a WebSocket upgrade without one, the key its offered
    subprotocols carry, as a Bearer credential."""
    authorization = request.headers.get("Authorization")
    if authorization or request.headers.get("Upgrade", "").lower() != "websocket":
        return authorization
    key = next((p[len(KEY_PROTOCOL) :] for p in _offered(request) if p.startswith(KEY_PROTOCOL)), None)
    return None if key is None else f"Bearer {key}"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class Keys:
    """The configured keys, as digests; `principal(header)` names the caller, or None."""

    def __init__(self, door: FrontDoor):
        self.keys = [_digest(key) for key in door.api_keys]
        self.admin = [_digest(key) for key in door.admin_keys]

    def principal(self, authorization: str | None) -> tuple[str, bool] | None:
        """(the key's principal, whether it is an admin key) for `Authorization: Bearer KEY`;
        None for anything else. Every configured key is compared, in constant time."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        presented = _digest(token.strip())
        matched = admin = False
        for digest in self.keys:
            matched |= hmac.compare_digest(presented, digest)
        for digest in self.admin:
            admin |= hmac.compare_digest(presented, digest)
        if not matched:
            return None
        return hashlib.sha256(b"flowrt principal\0" + presented).hexdigest()[:16], admin


def unauthorized(request: web.Request, message: str) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="flowrt"'}
    if request.path == "/v1" or request.path.startswith("/v1/"):
        error = {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
        return web.json_response({"error": error}, status=401, headers=headers)
    hint = "send the header `Authorization: Bearer KEY` with a key the server was started with (--api-key)"
    return web.json_response({"error": message, "hint": hint, "code": "invalid_api_key"}, status=401, headers=headers)


class Access:
    """The keys' middleware (or, without keys, one that lets everyone in as nobody), and what
    it refused, for /stats (`access`)."""

    def __init__(self, door: FrontDoor):
        self.door = door
        self.keys = Keys(door)
        self.unauthorized = 0  # requests answered 401

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        door, path = self.door, request.path
        if not door.keyed or path in OPEN_PATHS or (path in PROBE_PATHS and not door.protect_metrics):
            request[PRINCIPAL], request[ADMIN] = "", False
            return await handler(request)
        presented = presented_key(request)
        found = self.keys.principal(presented)
        if found is None:
            self.unauthorized += 1
            told = "no API key was sent" if not presented else "the API key is not valid"
            return unauthorized(request, f"{told}: {path} needs `Authorization: Bearer KEY`")
        request[PRINCIPAL], request[ADMIN] = found
        if door.prefix_scope != "key":
            return await handler(request)
        scoped = PREFIX_SCOPE.set(found[0])  # the calls this request starts reuse only this key's pages
        try:
            return await handler(request)
        finally:
            PREFIX_SCOPE.reset(scoped)

    def statistics(self) -> dict[str, Any]:
        return {"unauthorized_requests": self.unauthorized}


class SessionOwners:
    """Which principal's call named each session first; `claim` refuses the others while the
    runtime holds the session (`held(session)`), so nothing is kept that the runtime dropped."""

    def __init__(self, held: Callable[[str], bool]):
        self.held = held
        self.owners: dict[str, str] = {}
        self.calls: dict[str, int] = {}  # session -> this gateway's calls of it in flight
        self.swept_at = 64  # sweep once the table is twice as large as after the last sweep
        self.refused = 0  # calls answered 403

    def claim(self, session: str, principal: str) -> bool:
        """Whether `principal` may call `session`; if so, the call is counted until `release`."""
        owner = self.owners.get(session)
        if owner is not None and owner != principal and (self.calls.get(session) or self.held(session)):
            self.refused += 1
            return False
        self.owners[session] = principal
        self.calls[session] = self.calls.get(session, 0) + 1
        if len(self.owners) > self.swept_at:
            self._sweep()
        return True

    def release(self, session: str) -> None:
        left = self.calls.get(session, 1) - 1
        if left > 0:
            self.calls[session] = left
        else:
            self.calls.pop(session, None)

    def _sweep(self) -> None:
        for session in [s for s in self.owners if s not in self.calls and not self.held(s)]:
            del self.owners[session]
        self.swept_at = max(64, 2 * len(self.owners))


def refused_session(session: str) -> str:
    return f"the session {session!r} belongs to another API key; use a session id of your own (or none)"
