"""The /v1 routes (DESIGN §8, docs/openai.md): the chat endpoint (flowrt.gateway.openai), the
media endpoints (flowrt.gateway.openai_media) and the Realtime WebSocket (flowrt.gateway.realtime)
registered on the gateway's application, every handler's errors answered with OpenAI's error
object."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from flowrt.control import Runtime
from flowrt.gateway import realtime_endpoint
from flowrt.gateway.access import SessionOwners
from flowrt.gateway.admission import Admission
from flowrt.gateway.exposure import hide_paths
from flowrt.gateway.openai import ChatEndpoint
from flowrt.gateway.openai_media import MediaEndpoints
from flowrt.gateway.openai_request import ChatError

log = logging.getLogger("flowrt.gateway")


def openai_errors(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Answer a handler's ChatError, a body over the limit and a bug in flowrt with OpenAI's
    error object (a client gone and cancellation pass through to aiohttp)."""

    async def answering(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ChatError as error:
            return error.response()
        except web.RequestPayloadError as error:  # e.g. `Content-Encoding: gzip` on a body that is not gzip
            told = " ".join(str(error).split()).removeprefix("400, message: ")  # (aiohttp's wording)
            message = f"the body could not be read ({told}); send it as its Content-Encoding and Transfer-Encoding say"
            return ChatError(400, message).response()
        except web.HTTPRequestEntityTooLarge as error:
            message = f"the body is larger than the server's limit ({error.text}); send a smaller body or raise --max-body-mb"
            return ChatError(413, message, None, "body_too_large").response()
        except ConnectionError:
            raise
        except Exception as error:  # noqa: BLE001 - a bug in flowrt: logged with its traceback, answered as JSON
            log.exception("internal error answering %s %s", request.method, request.path)
            message = hide_paths(
                f"internal error: {type(error).__name__}: {error}; this is a bug in flowrt, the server's log has the traceback"
            )
            return ChatError(500, message, None, "internal_error").response()

    return answering


def add_routes(app: web.Application, runtime: Runtime, admission: Admission, owners: SessionOwners, body_timeout: float) -> None:
    """Register the /v1 paths on the gateway's application (flowrt.gateway.http does), sharing
    its admission (places for calls) and its session owners."""
    endpoint = ChatEndpoint(runtime, admission, owners, body_timeout)
    media_endpoints = MediaEndpoints(endpoint)
    app.router.add_post("/v1/chat/completions", openai_errors(endpoint.chat_completions))
    app.router.add_post("/v1/images/generations", openai_errors(media_endpoints.images))
    app.router.add_post("/v1/audio/speech", openai_errors(media_endpoints.speech))
    app.router.add_post("/v1/embeddings", openai_errors(media_endpoints.embeddings))
    app.router.add_get("/v1/models", openai_errors(endpoint.models))
    app.router.add_get("/v1/models/{model}", openai_errors(endpoint.model))
    realtime_endpoint.add_routes(app, runtime, admission, owners)  # GET /v1/realtime: a WebSocket (before the catch-all)
    app.router.add_route("*", "/v1", openai_errors(endpoint.elsewhere))
    app.router.add_route("*", "/v1/{tail:.*}", openai_errors(endpoint.elsewhere))
