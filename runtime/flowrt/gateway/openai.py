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

`usage` counts what the gateway can count honestly: `completion_tokens` is the number of content
chunks (text frames), `prompt_tokens` is 0 (the roles tokenize, not the gateway).
`max_tokens` / `max_completion_tokens` cap that count: the call is cancelled there, finish
reason `length`. Every error is OpenAI's object `{"error": {"message", "type", "param",
"code"}}`: an HTTP error before the first byte, an SSE `data:` line (then `data: [DONE]`) after
it. A client that disconnects cancels its call. Registered by flowrt.gateway.http.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from flowrt.control import BadInputs, Runtime, UnknownGraph
from flowrt.values import summarize

log = logging.getLogger("flowrt.gateway")
SSE = "text/event-stream"
OWNER = "flowc"
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
PART_FIELDS = {"text": "text", "image_url": "image_url", "input_audio": "input_audio", "file": "file", "refusal": "refusal"}
TEXT_PART = '{"type": "text", "text": "hi"}'
# how deeply a body may nest to reach a Json entry: deeper ones cannot cross to a replica process
# (pickle's recursion fails near 500 levels), so they are refused here under every deployment
MAX_DEPTH = 128
# what a graph's answer cannot carry: refused by name rather than silently ignored
UNSUPPORTED = {
    "logprobs": "graphs report no log probabilities",
    "top_logprobs": "graphs report no log probabilities",
    "tools": "graphs answer with text, never with tool calls",
    "functions": "graphs answer with text, never with function calls",
    "audio": "graphs answer with text, never with audio",
}
# a call that did not end `ok`: the HTTP status before the first byte, and the error's code
ENDINGS = {"timeout": (504, "timeout"), "shutdown": (503, "shutdown"), "client gone": (499, "cancelled")}
# what such an ending means, and the fix (`{graph}`: the graph's name)
ENDING_MESSAGES = {
    "timeout": "graph `{graph}` ran past its `timeout` and its call was cancelled; raise the graph's `timeout` in its .flow, "
    "or ask for less",
    "shutdown": "graph `{graph}`'s call was cancelled: the server is stopping; send the request again once a server is running",
    "client gone": "graph `{graph}`'s call was cancelled: the client went away",
}


class ChatError(Exception):
    """A request the endpoint answers with OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, kind: str = ""):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status)


@dataclass(frozen=True)
class ChatShape:
    """How a graph is driven as a chat model: what its entry gets and which field is the text."""

    graph: str
    entry: str
    whole_body: bool  # a Json entry gets the request body; a Text entry, the last user message
    text_field: str  # a stream's frames are one chunk each; a return is one chunk
    declared: bool  # the bundle records the field's type as Text (else its values are checked)


def chat_shape(runtime: Runtime, graph: str) -> ChatShape | str:
    """The graph's ChatShape, or why the chat endpoint cannot drive it."""
    plan = runtime.bundle.plan["graphs"][graph]
    summary = runtime.bundle.manifest.get("graphs", {}).get(graph, {})
    entry = list(plan["entry"])
    if len(entry) != 1:
        return f"graph `{graph}` takes {len(entry)} entry values ({', '.join(entry)}); the chat endpoint drives graphs with one"
    entry_type = runtime.entry_types.get(graph, {}).get(entry[0], "Json")  # an older bundle records none: any value
    if entry_type not in ("Text", "Json", "Any"):
        return (
            f"graph `{graph}`'s entry `{entry[0]}` is `{entry_type}`; the chat endpoint fills a `Text` entry "
            "(the last user message) or a `Json` one (the whole request)"
        )
    outputs = plan["outputs"]
    ranked = (
        [o for o in outputs if o["kind"] == "stream" and o.get("ordered")]
        + [o for o in outputs if o["kind"] == "stream" and not o.get("ordered")]
        + [o for o in outputs if o["kind"] == "return"]
    )
    types = summary.get("output_types") if isinstance(summary, dict) else None
    declared = isinstance(types, dict)
    if declared:
        ranked = [o for o in ranked if types.get(o["field"]) == "Text"]
        if not ranked:
            described = ", ".join(f"{o['field']}: {types.get(o['field'], '?')}" for o in outputs)
            return f"graph `{graph}` has no Text output ({described}); the chat endpoint sends a Text stream or return"
    return ChatShape(graph, entry[0], entry_type != "Text", ranked[0]["field"], declared)


# ── the request ──


@dataclass
class ChatRequest:
    shape: ChatShape
    entry_value: Any
    stream: bool
    include_usage: bool
    session: str | None
    limit: int | None  # content chunks at most (max_tokens)


def _kind(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")


def _shown(value: Any) -> str:
    """A value as an error message names it: a number by itself (`1.5`), anything else by its kind."""
    return json.dumps(value) if _kind(value) == "a number" else _kind(value)


def _optional(body: dict, name: str, wanted: type, described: str) -> Any:
    """`body[name]` if it is absent, null or a `wanted` (a boolean is not a number here)."""
    value = body.get(name)
    if value is not None and (not isinstance(value, wanted) or isinstance(value, bool) != (wanted is bool)):
        raise ChatError(400, f"`{name}` must be {described}, not {_shown(value)}", name)
    return value


def parse_body(data: bytes) -> dict[str, Any]:
    """The body as a JSON object, or ChatError saying what is wrong with it."""
    hint = 'send a JSON object, e.g. {"model": "GRAPH", "messages": [{"role": "user", "content": "hi"}]}'
    try:
        body = json.loads(data)
    except RecursionError:
        raise ChatError(400, f"the body is nested too deeply to read as JSON; {hint}") from None
    except UnicodeDecodeError as error:
        raise ChatError(400, f"the body is not UTF-8 JSON ({error.reason} at byte {error.start}); {hint}") from None
    except ValueError as error:
        raise ChatError(400, f"the body is not JSON ({error}); {hint}") from None
    if not isinstance(body, dict):
        raise ChatError(400, f"the body is {_kind(body)}, not a JSON object; {hint}")
    return body


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """`messages` as OpenAI defines it: a non-empty list of {role, content}, content a string or
    a list of content parts (an assistant's may be null); ChatError naming the first bad place."""
    if not isinstance(messages, list) or not messages:
        shown = "an empty list" if messages == [] else _kind(messages)
        raise ChatError(400, f"`messages` must be a non-empty list of {{role, content}} objects, not {shown}", "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ChatError(400, f"`{where}` must be an object with `role` and `content`, not {_kind(message)}", where)
        role = message.get("role")
        if role not in ROLES:
            raise ChatError(400, f"`{where}.role` must be one of {', '.join(ROLES)}, not {json.dumps(role)}", f"{where}.role")
        content = message.get("content")
        if content is None and role == "assistant":
            continue  # an assistant turn that called tools carries no content
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise ChatError(
                400, f"`{where}.content` must be a string or a list of content parts, not {_kind(content)}", f"{where}.content"
            )
        for j, part in enumerate(content):
            place = f"{where}.content[{j}]"
            if not isinstance(part, dict):
                raise ChatError(400, f"`{place}` must be a content part such as {TEXT_PART}, not {_kind(part)}", place)
            kind = part.get("type")
            if not isinstance(kind, str) or kind not in PART_FIELDS:  # (a list or an object cannot be looked up)
                shown = json.dumps(kind) if isinstance(kind, str) or kind is None else _kind(kind)
                raise ChatError(400, f"`{place}.type` must be one of {', '.join(PART_FIELDS)}, not {shown}", place)
            if part.get(PART_FIELDS[kind]) is None:
                raise ChatError(400, f"`{place}` is a `{kind}` part without its `{PART_FIELDS[kind]}`", place)
            if kind == "text" and not isinstance(part["text"], str):
                raise ChatError(400, f"`{place}.text` must be a string, not {_kind(part['text'])}", place)
    return messages


def last_user_text(messages: list[dict[str, Any]], graph: str) -> str:
    """The text of the last user message (its text parts joined by newlines)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] != "user":
            continue
        content = messages[i]["content"]
        if isinstance(content, str):
            return content
        for j, part in enumerate(content):
            if part["type"] != "text":
                raise ChatError(
                    400,
                    f"`messages[{i}].content[{j}]` is a `{part['type']}` part, but graph `{graph}` takes Text: "
                    "send text parts only, or serve a graph whose entry is Json",
                    f"messages[{i}].content[{j}]",
                )
        return "\n".join(part["text"] for part in content)
    raise ChatError(400, f"`messages` has no user message; graph `{graph}` takes the last user message's text", "messages")


def check_depth(body: dict[str, Any], graph: str) -> None:
    """ChatError where the body nests deeper than MAX_DEPTH (walked without recursion)."""
    todo: list[tuple[Any, int, str]] = [(value, 2, key) for key, value in body.items() if isinstance(value, (dict, list))]
    while todo:
        value, depth, top = todo.pop()
        if depth > MAX_DEPTH:
            raise ChatError(
                400,
                f"`{top}` nests more than {MAX_DEPTH} levels deep; graph `{graph}` takes the whole request as Json, "
                f"and the endpoint passes on at most {MAX_DEPTH} levels: flatten it",
                top,
            )
        children = value.values() if isinstance(value, dict) else value
        todo.extend((child, depth + 1, top) for child in children if isinstance(child, (dict, list)))


def _limit(body: dict[str, Any], name: str) -> int | None:
    value = _optional(body, name, int, "a whole number greater than 0")
    if value is not None and value < 1:
        raise ChatError(400, f"`{name}` must be a whole number greater than 0, not {value}", name)
    return value


def parse_request(body: dict[str, Any], shapes: dict[str, ChatShape | str], headers: Any) -> ChatRequest:
    """Check a chat request at the edge; ChatError naming the parameter and the fix."""
    model = body.get("model")
    if not isinstance(model, str):
        raise ChatError(400, f"`model` must be a graph's name (GET /v1/models lists them), not {_kind(model)}", "model")
    shape = shapes.get(model)
    if shape is None:
        known = ", ".join(sorted(g for g, s in shapes.items() if isinstance(s, ChatShape))) or "none"
        raise ChatError(404, f"the model `{model}` does not exist: no such graph (models: {known})", "model", "model_not_found")
    if isinstance(shape, str):
        raise ChatError(400, f"the model `{model}` cannot be served as a chat model: {shape}", "model", "model_not_supported")
    messages = check_messages(body.get("messages"))
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise ChatError(400, f"`n` must be 1: a graph gives one answer per call, not {json.dumps(n)}", "n")
    for name, why in UNSUPPORTED.items():
        if body.get(name):  # (absent, null, false or empty: nothing asked)
            raise ChatError(400, f"`{name}` is not supported: {why}", name)
    stream = bool(_optional(body, "stream", bool, "true or false"))
    options = _optional(body, "stream_options", dict, 'an object such as {"include_usage": true}')
    if options is not None and not stream:
        raise ChatError(400, "`stream_options` is only allowed with `stream: true`", "stream_options")
    include_usage = (options or {}).get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise ChatError(
            400,
            f"`stream_options.include_usage` must be true or false, not {_shown(include_usage)}",
            "stream_options.include_usage",
        )
    limits = [_limit(body, name) for name in ("max_completion_tokens", "max_tokens")]  # OpenAI's newer name first
    limit = next((value for value in limits if value is not None), None)
    user = _optional(body, "user", str, "a string")
    session = headers.get("X-Flow-Session") or user or None
    if shape.whole_body:
        check_depth(body, model)
    entry_value = body if shape.whole_body else last_user_text(messages, model)
    return ChatRequest(shape, entry_value, stream, bool(include_usage), session, limit)


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

    def take(self, batch: list[dict[str, Any]]) -> list[str]:
        """The text pieces among `batch`'s events (the other fields are kept for `flow`); stops
        at the limit or at a value that is not text (`over` says so)."""
        pieces = []
        text_field = self.shape.text_field
        for event in batch:
            kind = event["event"]
            if kind == "done":
                self.done = event
            elif event["field"] == text_field:
                value = event["value"]
                if not isinstance(value, str):
                    self.failure = self._not_text(value)
                    break
                pieces.append(value)
                self.chunks += 1
                if self.limit is not None and self.chunks >= self.limit:
                    self.finish = "length"
                    break
            elif kind == "stream":
                self.flow.setdefault(event["field"], []).append(summarize(event["value"]))
            else:
                self.flow[event["field"]] = summarize(event["value"])
        return pieces

    @property
    def over(self) -> bool:
        return self.finish is not None or self.failure is not None

    def _not_text(self, value: Any) -> ChatError:
        shape = self.shape
        said = f"graph `{shape.graph}`'s `{shape.text_field}` sent {_kind(value)}, not text"
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
        done = self.done or {"status": "cancelled", "errors": [], "reason": "client gone"}
        errors = done.get("errors") or []
        if done["status"] == "ok" and not errors:
            return "stop", None
        graph = self.shape.graph
        if errors:  # a role failed, even one whose frames had reached the caller already
            told = "; ".join(
                (f"role `{e['role']}` (interface `{e['interface']}`): " if e["role"] else "")  # (else the deployment's)
                + e["message"]
                + (f" at {e['where']}" if e["where"] else "")
                for e in errors
            )
            return "error", ChatError(500, f"graph `{graph}` failed: {told}", None, "role_error")
        reason = done.get("reason", "")
        status, code = ENDINGS.get(reason, (500, "call_failed"))
        if reason in ENDING_MESSAGES:
            return "error", ChatError(status, ENDING_MESSAGES[reason].format(graph=graph), None, code)
        return "error", ChatError(
            status, f"graph `{graph}`'s call ended {done['status']} ({reason or 'no reason given'})", None, code
        )


class Reply:
    """One call's answer in OpenAI's shapes: a `chat.completion`, or SSE chunks."""

    def __init__(self, chat: ChatRequest):
        self.chat = chat
        self.answer = Answer(chat.shape, chat.limit)
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
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

    def usage(self) -> dict[str, int]:
        chunks = self.answer.chunks
        return {"prompt_tokens": 0, "completion_tokens": chunks, "total_tokens": chunks}

    async def gathered(self, events: AsyncIterator[list[dict]]) -> web.Response:
        """The whole call as one `chat.completion` (or the HTTP error it ended with)."""
        texts = []
        async for batch in events:
            texts += self.answer.take(batch)
            if self.answer.over:
                break
        finish, error = self.answer.ending()
        if error is not None:
            return error.response()
        message = {"role": "assistant", "content": "".join(texts)}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        return web.json_response(self._object("chat.completion", [choice], usage=self.usage(), flow=self.answer.flow))

    async def streamed(self, request: web.Request, events: AsyncIterator[list[dict]]) -> web.StreamResponse:
        """The call as SSE chunks, started by its first text piece: a call that fails before
        any is a plain HTTP error. A bug after the start ends the stream with an error object."""
        answer = self.answer
        response = None
        try:
            async for batch in events:
                pieces = answer.take(batch)
                if pieces:
                    data = b"".join([self._chunk({"content": piece}) for piece in pieces])
                    if response is None:
                        response = web.StreamResponse(headers=STREAM_HEADERS)
                        await response.prepare(request)
                        data = self._chunk({"role": "assistant", "content": ""}) + data
                    await response.write(data)
                if answer.over:
                    break
        except ConnectionError:  # the client went away: the caller closes the events, which cancels the call
            return response if response is not None else web.Response(status=499)  # (nobody reads it)
        except Exception as error:
            if response is None:
                raise
            log.exception("internal error streaming %s %s", request.method, request.path)
            bug = ChatError(500, f"internal error: {type(error).__name__}: {error}; see the server's log", None, "internal_error")
            await response.write_eof(_sse(bug.body()) + DONE)
            return response
        finish, error = answer.ending()
        if response is None:
            if error is not None:
                return error.response()
            return web.Response(body=self._chunk({"role": "assistant", "content": ""}) + self._ending(), headers=STREAM_HEADERS)
        await response.write_eof(self._ending())
        return response

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
DONE = b"data: [DONE]\n\n"


def _sse(body: dict[str, Any]) -> bytes:
    try:
        return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"
    except UnicodeEncodeError:  # a lone surrogate (JSON allows "\ud800"; UTF-8 does not): sent escaped, as JSON allows
        return b"data: " + json.dumps(body).encode() + b"\n\n"


# ── the routes ──

PATHS = "POST /v1/chat/completions, GET /v1/models, GET /v1/models/MODEL"


class ChatEndpoint:
    """The /v1 handlers over one runtime; each graph's ChatShape is worked out once."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.shapes = {graph: chat_shape(runtime, graph) for graph in sorted(runtime.bundle.plan["graphs"])}
        self.created = int(time.time())

    def known(self) -> str:
        return ", ".join(graph for graph, shape in self.shapes.items() if isinstance(shape, ChatShape)) or "none"

    def _model(self, graph: str) -> dict[str, Any]:
        return {"id": graph, "object": "model", "created": self.created, "owned_by": OWNER}

    async def models(self, request: web.Request) -> web.Response:
        data = [self._model(graph) for graph, shape in self.shapes.items() if isinstance(shape, ChatShape)]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: web.Request) -> web.Response:
        graph = request.match_info["model"]
        shape = self.shapes.get(graph)
        if not isinstance(shape, ChatShape):
            why = shape if shape is not None else "no such graph"
            raise ChatError(
                404, f"the model `{graph}` does not exist: {why} (models: {self.known()})", "model", "model_not_found"
            )
        return web.json_response(self._model(graph))

    async def elsewhere(self, request: web.Request) -> web.Response:
        """Any other path under /v1, or a method these paths do not answer."""
        path = request.path
        allowed = {"/v1/chat/completions": "POST", "/v1/models": "GET"}.get(path)
        if allowed is None and path.startswith("/v1/models/") and path.count("/") == 3:
            allowed = "GET"  # (`/v1/models/` itself names no model)
        if allowed is None or allowed == request.method:
            raise ChatError(404, f"no such path: {path}; under /v1 the server answers {PATHS}", None, "unknown_url")
        error = ChatError(405, f"{path} does not answer {request.method}; it answers {allowed}", None, "method_not_allowed")
        return web.json_response(error.body(), status=405, headers={"Allow": allowed})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        chat = parse_request(parse_body(await request.read()), self.shapes, request.headers)
        try:
            events = self.runtime.call_batches(chat.shape.graph, {chat.shape.entry: chat.entry_value}, session=chat.session)
        except (UnknownGraph, BadInputs) as error:  # (the shapes know every graph and its entry: not expected)
            raise ChatError(400, str(error), "messages") from None
        reply = Reply(chat)
        try:
            if chat.stream:
                return await reply.streamed(request, events)
            return await reply.gathered(events)
        finally:
            await events.aclose()  # cancels the call if it has not ended; it is retired even if this is cancelled


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
            message = (
                f"internal error: {type(error).__name__}: {error}; this is a bug in flowrt, the server's log has the traceback"
            )
            return ChatError(500, message, None, "internal_error").response()

    return answering


def add_routes(app: web.Application, runtime: Runtime) -> None:
    """Register the /v1 paths on the gateway's application (flowrt.gateway.http does)."""
    endpoint = ChatEndpoint(runtime)
    app.router.add_post("/v1/chat/completions", openai_errors(endpoint.chat_completions))
    app.router.add_get("/v1/models", openai_errors(endpoint.models))
    app.router.add_get("/v1/models/{model}", openai_errors(endpoint.model))
    app.router.add_route("*", "/v1", openai_errors(endpoint.elsewhere))
    app.router.add_route("*", "/v1/{tail:.*}", openai_errors(endpoint.elsewhere))
