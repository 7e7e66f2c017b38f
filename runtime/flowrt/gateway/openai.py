"""The OpenAI-compatible chat endpoint (DESIGN §8): graphs served as chat models to OpenAI clients.

    GET  /v1/models                 every graph this endpoint can drive, as OpenAI model objects
    GET  /v1/models/{model}         one of them
    POST /v1/chat/completions       `model` = graph name; `stream: true` → `text/event-stream` of
                                    `chat.completion.chunk`s ending with `data: [DONE]`, else one
                                    `chat.completion`; session: header `X-Flow-Session`, else `user`

A graph can be driven when it has one entry placeholder, `Text` (it gets the last user
message's text) or `Json` (it gets the whole request body, messages and all), and a text
output: its first ordered stream declared `Text`, else its first other `Text` stream, else its
first `Text` return. Each frame of that field is one `delta.content` chunk (gathered into one
message without `stream`); the graph's other outputs go under an extra `flow` key of the final
chunk (or of the completion): a return's value, a stream's frames as a list. A bundle that
records no output types (`graphs.G.output_types` in bundle.json) lets every output count, in
the same order, and the field's values are checked instead: a graph whose text field sends
something that is not a string is refused (400) before anything is written.

`usage` counts what the gateway can count honestly: the counts the graph reported in a Json output
(`TokenCounts`: prompt, completion and cached tokens), else `completion_tokens` is the number of content
chunks (text frames), `prompt_tokens` is 0 (the roles tokenize, not the gateway).
`max_tokens` / `max_completion_tokens` cap that count: the call is cancelled there, finish
reason `length`. Every error is OpenAI's object `{"error": {"message", "type", "param",
"code"}}`: an HTTP error before the first byte, an SSE `data:` line (then `data: [DONE]`) after
it. A role that raises flowrt.BadInput is 400 `invalid_request_error` (code `bad_input`), which
OpenAI clients do not retry; a full server 429 `rate_limit_exceeded` with `Retry-After`; a
draining one 503. A client that disconnects cancels its call. Registered by flowrt.gateway.http,
whose middleware checks API keys first (flowrt.gateway.access).
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from flowrt import media
from flowrt.control import BadInputs, Runtime, UnknownGraph
from flowrt.control.sessions import reserved
from flowrt.gateway.access import PRINCIPAL, SessionOwners, refused_session
from flowrt.gateway.admission import Admission, Refused, read_body
from flowrt.gateway.exposure import client_events, hide_paths
from flowrt.gateway.openai_request import (
    ChatError,
    ChatRequest,
    ChatShape,
    TokenCounts,
    chat_shape,
    kind_of,
    parse_body,
    parse_request,
    served,
)
from flowrt.values import json_text, summarize

log = logging.getLogger("flowrt.gateway")
SSE = "text/event-stream"
OWNER = "flowc"
# a call that did not end `ok`: the HTTP status before the first byte, and the error's code
FINISH_REASONS = ("stop", "length")  # what a graph may report of its own end
ENDINGS = {"timeout": (504, "timeout"), "shutdown": (503, "shutdown"), "client gone": (499, "cancelled")}
# what such an ending means, and the fix (`{graph}`: the graph's name)
ENDING_MESSAGES = {
    "timeout": "graph `{graph}` ran past its `timeout` and its call was cancelled; raise the graph's `timeout` in its .flow, "
    "or ask for less",
    "shutdown": "graph `{graph}`'s call was cancelled: the server is stopping; send the request again once a server is running",
    "client gone": "graph `{graph}`'s call was cancelled: the client went away",
}


# ── the answer ──


@dataclass
class Answer:
    """What a call has produced so far, as the chat endpoint shapes it."""

    shape: ChatShape
    limit: int | None
    chunks: int = 0  # content chunks taken (what `usage` counts)
    flow: dict[str, Any] = field(default_factory=dict)
    done: dict[str, Any] | None = None
    finish: str | None = None  # "length" once the limit is reached; otherwise `done` decides
    failure: ChatError | None = None  # the text field sent something that is not text
    reported_finish: str | None = None  # what the graph said of its own end (`_report`)
    reported_usage: TokenCounts | None = None  # the tokens the graph counted
    roots: tuple = ()  # the impl's directories: errors' `where` is told relative to them (exposure)
    audio: bool = False  # the request asked for audio: the audio field's frames are the answer's too
    sample_rate: int | None = None  # the audio's (every frame's must agree)

    def take(self, batch: list[dict[str, Any]]) -> list[str | bytes]:
        """The text pieces (str) and, with `audio`, the PCM16 audio pieces (bytes) among `batch`'s
        events (the other fields are kept for `flow`); stops at the limit or at a value that is not
        text or audio (`over` says so)."""
        pieces: list[str | bytes] = []
        text_field = self.shape.text_field
        audio_field = self.shape.audio_field if self.audio else None
        for event in batch:
            kind = event["event"]
            if kind == "done":
                self.done = client_events([event], self.roots)[0]
            elif event["field"] == audio_field:
                pcm = self._pcm16(event["value"])
                if pcm is None:
                    break
                pieces.append(pcm)
            elif event["field"] == text_field:
                if self.finish is not None:  # past the cap, waiting for the call's other outputs
                    continue
                value = event["value"]
                if not isinstance(value, str):
                    self.failure = self._not_text(value)
                    break
                pieces.append(value)
                self.chunks += 1
                if self.limit is not None and self.chunks >= self.limit:
                    self.finish = "length"
                    if not self.shape.whole_body:
                        break
            else:
                self._report(event["value"])
                if kind == "stream":
                    self.flow.setdefault(event["field"], []).append(summarize(event["value"]))
                else:
                    self.flow[event["field"]] = summarize(event["value"])
        return pieces

    def _pcm16(self, value: Any) -> bytes | None:
        """An audio frame's samples as PCM16 bytes, or None with `failure` set (the role's to fix)."""
        try:
            pcm, rate = media.carried_pcm16(summarize(value, media=True), f"a frame of `{self.shape.audio_field}`")
            if self.sample_rate not in (None, rate):
                raise ValueError(
                    f"a frame of `{self.shape.audio_field}` is at {rate} Hz, the ones before at {self.sample_rate} Hz"
                )
        except ValueError as error:
            told = f"graph `{self.shape.graph}` cannot answer with audio: {error}; its role must send mono PCM16 audio"
            self.failure = ChatError(500, told, None, "not_audio")
            return None
        self.sample_rate = rate
        return pcm

    def _report(self, value: Any) -> None:
        """A Json output that reports on the generation (flowstd's `llm` sends one): its
        `finish_reason` (`stop` or `length`) and its token counts are the answer's."""
        if not isinstance(value, dict):
            return
        if value.get("finish_reason") in FINISH_REASONS:
            self.reported_finish = value["finish_reason"]
        self.reported_usage = TokenCounts.reported(value) or self.reported_usage

    @property
    def over(self) -> bool:
        """Whether to stop reading the call (which cancels it). At the cap a Text entry's call is
        cancelled; a Json entry's graph was given `max_tokens` with the body and honours it, so
        its call runs to its end and its other outputs still reach `flow`."""
        return self.failure is not None or (self.finish is not None and not self.shape.whole_body)

    def _not_text(self, value: Any) -> ChatError:
        shape = self.shape
        said = f"graph `{shape.graph}`'s `{shape.text_field}` sent {kind_of(value)}, not text"
        if shape.declared:  # declared Text: the role broke its interface
            return ChatError(500, f"{said}, though it is declared Text; fix the role that produces it", None, "not_text")
        return ChatError(
            400,
            f"{said}, so the model `{shape.graph}` cannot be served as a chat model (the chat endpoint sends a Text "
            "stream or return; a bundle built by a flowc that records output types is checked up front)",
            "model",
            "model_not_supported",
        )

    def ending(self) -> tuple[str, ChatError | None]:
        """The finish reason and, where the call did not end well, its error."""
        if self.failure is not None:
            return "error", self.failure
        if self.finish is not None:
            return self.finish, None
        error = call_error(self.done, self.shape.graph)
        return ("error", error) if error is not None else (self.reported_finish or "stop", None)


def call_error(done: dict[str, Any] | None, graph: str) -> ChatError | None:
    """What a call's `done` event (as clients see it; None: the call never ended) means for an
    OpenAI client: None when it ended well, else OpenAI's error."""
    done = done or {"status": "cancelled", "errors": [], "reason": "client gone"}
    errors = done.get("errors") or []
    if done["status"] == "ok" and not errors:
        return None
    if errors and done["status"] != "ok" and all(e.get("bad_input") for e in errors):  # the caller's to fix
        told = "; ".join((f"role `{e['role']}`: " if e["role"] else "") + e["message"] for e in errors)
        return ChatError(400, f"the request cannot be served: {told}", None, "bad_input")
    if errors:  # a role failed, even one whose frames had reached the caller already
        told = "; ".join(
            (f"role `{e['role']}` (interface `{e['interface']}`): " if e["role"] else "")  # (else the deployment's)
            + e["message"]
            + (f" at {e['where']}" if e["where"] else "")
            for e in errors
        )
        return ChatError(500, f"graph `{graph}` failed: {told}", None, "role_error")
    reason = done.get("reason", "")
    status, code = ENDINGS.get(reason, (500, "call_failed"))
    if reason in ENDING_MESSAGES:
        return ChatError(status, ENDING_MESSAGES[reason].format(graph=graph), None, code)
    return ChatError(status, f"graph `{graph}`'s call ended {done['status']} ({reason or 'no reason given'})", None, code)


class Reply:
    """One call's answer in OpenAI's shapes: a `chat.completion`, or SSE chunks."""

    def __init__(self, chat: ChatRequest, roots: tuple = ()):
        self.chat = chat
        self.answer = Answer(chat.shape, chat.limit, roots=roots, audio=chat.audio_format is not None)
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.audio_id = f"audio_{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _object(self, kind: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.chat.shape.graph,
            "choices": choices,
            **extra,
        }

    def usage(self) -> dict[str, Any]:
        counts = self.answer.reported_usage or TokenCounts(0, self.answer.chunks)
        usage: dict[str, Any] = {
            "prompt_tokens": counts.prompt,
            "completion_tokens": counts.completion,
            "total_tokens": counts.prompt + counts.completion,
        }
        if counts.cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": counts.cached}
        return usage

    async def gathered(self, events: AsyncIterator[list[dict]]) -> web.Response:
        """The whole call as one `chat.completion` (or the HTTP error it ended with)."""
        pieces: list[str | bytes] = []
        async for batch in events:
            pieces += self.answer.take(batch)
            if self.answer.over:
                break
        finish, error = self.answer.ending()
        if error is not None:
            return error.response()
        text = "".join(p for p in pieces if isinstance(p, str))
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.answer.audio:  # as OpenAI's: the text is the audio's transcript
            pcm = b"".join(p for p in pieces if isinstance(p, bytes))
            if self.chat.audio_format == "wav":
                pcm = media.encode_wav(pcm, self.answer.sample_rate or AUDIO_RATE)
            data = base64.b64encode(pcm).decode("ascii")
            expires = int(time.time()) + AUDIO_EXPIRES_S
            message = {"role": "assistant", "content": None}
            message["audio"] = {"id": self.audio_id, "data": data, "expires_at": expires, "transcript": text}
            message["audio"]["sample_rate"] = self.answer.sample_rate or AUDIO_RATE  # (not OpenAI's: its rate is fixed)
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        body = self._object("chat.completion", [choice], usage=self.usage(), flow=self.answer.flow)
        return web.json_response(body, dumps=json_text)

    async def streamed(self, request: web.Request, events: AsyncIterator[list[dict]]) -> web.StreamResponse:
        """The call as SSE chunks, started by its first text piece: a call that fails before
        any is a plain HTTP error. A bug after the start ends the stream with an error object."""
        answer = self.answer
        response = None
        try:
            async for batch in events:
                pieces = answer.take(batch)
                if pieces:
                    data = b"".join([self._chunk(self._delta(piece)) for piece in pieces])
                    if response is None:
                        response = web.StreamResponse(headers=STREAM_HEADERS)
                        await response.prepare(request)
                        data = self._chunk({"role": "assistant", "content": ""}) + data
                    await response.write(data)
                if answer.over:
                    break
            if response is None:
                error = answer.ending()[1]
                if error is not None:
                    return error.response()
                body = self._chunk({"role": "assistant", "content": ""}) + self._ending()
                return web.Response(body=body, headers=STREAM_HEADERS)
            await response.write_eof(self._ending())
            return response
        except ConnectionError:  # the client went away: the caller closes the events, which cancels the call
            return response if response is not None else web.Response(status=499)  # (nobody reads it)
        except Exception as error:
            if response is None:
                raise
            log.exception("internal error streaming %s %s", request.method, request.path)
            told = hide_paths(f"internal error: {type(error).__name__}: {error}; see the server's log")
            bug = ChatError(500, told, None, "internal_error")
            await response.write_eof(_sse(bug.body()) + DONE)
            return response

    def _delta(self, piece: str | bytes) -> dict[str, Any]:
        """One piece as a chunk's `delta`: text as `content` (or, answering with audio, as the
        audio's `transcript`, as OpenAI's), audio as base64 PCM16 `data`."""
        if isinstance(piece, bytes):
            data = base64.b64encode(piece).decode("ascii")
            return {"audio": {"id": self.audio_id, "data": data, "sample_rate": self.answer.sample_rate}}
        if self.answer.audio:
            return {"audio": {"id": self.audio_id, "transcript": piece}}
        return {"content": piece}

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        if self.chat.include_usage:
            extra.setdefault("usage", None)  # as OpenAI's: null on every chunk but the usage chunk
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _sse(self._object("chat.completion.chunk", [choice], **extra))

    def _ending(self) -> bytes:
        """The final chunk (finish reason and `flow`), the usage chunk if asked, the error, [DONE]."""
        finish, error = self.answer.ending()
        data = self._chunk({}, finish, flow=self.answer.flow)
        if self.chat.include_usage:
            data += _sse(self._object("chat.completion.chunk", [], usage=self.usage()))
        if error is not None:
            data += _sse(error.body())
        return data + DONE


STREAM_HEADERS = {"Content-Type": SSE, "Cache-Control": "no-cache"}
AUDIO_EXPIRES_S = 3600  # `message.audio.expires_at`: OpenAI's; nothing here is kept, the value is informative
AUDIO_RATE = 24000  # the WAV header's rate when the answer holds no audio frame at all
DONE = b"data: [DONE]\n\n"


def _sse(body: dict[str, Any]) -> bytes:
    try:
        return b"data: " + json_text(body).encode() + b"\n\n"
    except UnicodeEncodeError:  # a lone surrogate (JSON allows "\ud800"; UTF-8 does not): sent escaped, as JSON allows
        return b"data: " + json_text(body, ascii=True).encode() + b"\n\n"


# ── the routes ──

POSTS = ("/v1/chat/completions", "/v1/images/generations", "/v1/audio/speech", "/v1/embeddings")
PATHS = ", ".join(f"POST {path}" for path in POSTS) + ", GET /v1/models, GET /v1/models/MODEL, GET /v1/realtime (WebSocket)"


class ChatEndpoint:
    """The /v1 handlers over one runtime; each graph's ChatShape is worked out once."""

    def __init__(self, runtime: Runtime, admission: Admission, owners: SessionOwners, body_timeout: float):
        self.runtime = runtime
        self.admission, self.owners, self.body_timeout = admission, owners, body_timeout
        self.roots = tuple(runtime.bundle.python_path)
        self.shapes = {graph: chat_shape(runtime, graph) for graph in sorted(runtime.bundle.plan["graphs"])}
        self.fields: dict[str, dict[str, dict[str, str]]] = {}  # graph -> endpoint -> the fields it reads
        for graph, shape in self.shapes.items():
            recorded = served(runtime, graph)
            if recorded is not None:
                self.fields[graph] = dict(recorded)
            elif isinstance(shape, ChatShape):  # (a bundle from a flowc that recorded no endpoints)
                self.fields[graph] = {"chat": {"text": shape.text_field}}
        self.created = int(time.time())

    def known(self, endpoint: str = "chat") -> str:
        return ", ".join(graph for graph, fields in self.fields.items() if endpoint in fields) or "none"

    def _model(self, graph: str) -> dict[str, Any]:
        endpoints = sorted(self.fields.get(graph, ()))
        return {"id": graph, "object": "model", "created": self.created, "owned_by": OWNER, "endpoints": endpoints}

    async def models(self, request: web.Request) -> web.Response:
        data = [self._model(graph) for graph, fields in self.fields.items() if fields]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: web.Request) -> web.Response:
        graph = request.match_info["model"]
        if not self.fields.get(graph):
            shape = self.shapes.get(graph)
            why = shape if isinstance(shape, str) else "no such graph"
            models = ", ".join(g for g, fields in self.fields.items() if fields) or "none"
            raise ChatError(404, f"the model `{graph}` does not exist: {why} (models: {models})", "model", "model_not_found")
        return web.json_response(self._model(graph))

    async def elsewhere(self, request: web.Request) -> web.Response:
        """Any other path under /v1, or a method these paths do not answer."""
        path = request.path
        allowed = {"/v1/models": "GET", **dict.fromkeys(POSTS, "POST")}.get(path)
        if allowed is None and path.startswith("/v1/models/") and path.count("/") == 3:
            allowed = "GET"  # (`/v1/models/` itself names no model)
        if allowed is None or allowed == request.method:
            raise ChatError(404, f"no such path: {path}; under /v1 the server answers {PATHS}", None, "unknown_url")
        error = ChatError(405, f"{path} does not answer {request.method}; it answers {allowed}", None, "method_not_allowed")
        return web.json_response(error.body(), status=405, headers={"Allow": allowed})

    async def body(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The request's JSON object, or the front door's refusal (a slow body, a draining server)."""
        try:
            return parse_body(await read_body(request, self.body_timeout))
        except Refused as refused:
            return _refusal(refused)

    async def admitted(
        self, request: web.Request, session: str | None, answer: Callable[[], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """`answer()` once the call has a place and, where it names one, its session is the
        caller's; 400, 403 or OpenAI's 429/503 otherwise."""
        if session is not None and reserved(session):
            raise ChatError(400, f"the session (`X-Flow-Session` or `user`): {reserved(session)}", "user", "invalid_session")
        try:
            async with self.admission.place(session):
                if session is not None and not self.owners.claim(session, request[PRINCIPAL]):
                    raise ChatError(403, refused_session(session), "user", "session_not_yours", "permission_error")
                try:
                    return await answer()
                finally:
                    if session is not None:
                        self.owners.release(session)
        except Refused as refused:
            return _refusal(refused)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self.body(request)
        if isinstance(body, web.Response):
            return body
        chat = parse_request(body, self.shapes, request.headers)
        return await self.admitted(request, chat.session, lambda: self._answer(request, chat))

    async def _answer(self, request: web.Request, chat: ChatRequest) -> web.StreamResponse:
        try:
            events = self.runtime.call_batches(chat.shape.graph, {chat.shape.entry: chat.entry_value}, session=chat.session)
        except (UnknownGraph, BadInputs) as error:  # (the shapes know every graph and its entry: not expected)
            raise ChatError(400, str(error), "messages") from None
        reply = Reply(chat, self.roots)
        try:
            if chat.stream:
                return await reply.streamed(request, events)
            return await reply.gathered(events)
        finally:
            await events.aclose()  # cancels the call if it has not ended; it is retired even if this is cancelled


def _refusal(refused: Refused) -> web.Response:
    """A call the front door does not take, as OpenAI words it (429 `rate_limit_exceeded` and
    `Retry-After`, which OpenAI clients honour; 503 while draining; 408 for a slow body)."""
    kind = "rate_limit_exceeded" if refused.status == 429 else "invalid_request_error" if refused.status < 500 else "server_error"
    error = ChatError(refused.status, refused.message, None, refused.code, kind)
    return web.json_response(error.body(), status=refused.status, headers=refused.headers())
