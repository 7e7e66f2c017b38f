"""Requests to the OpenAI-compatible chat endpoint (flowrt.gateway.openai, docs/openai.md): which
graphs can be driven as chat models (`chat_shape`), and a request checked at the edge
(`parse_body`, `parse_request`): every parameter this endpoint reads or refuses is checked for
its type and range, and any error is a `ChatError`, OpenAI's error object naming the parameter
and the fix."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from flowrt.control import Runtime

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
}
MODALITIES = ("text", "audio")
AUDIO_FORMATS = ("wav", "pcm16")  # what `audio.format` may ask for: a streamed answer sends pcm16


@dataclass(frozen=True)
class TokenCounts:
    """What a graph reported of its own generation in a Json output (flowstd's `llm` and voice
    thinkers send one): `prompt_tokens` and `completion_tokens`, and `reused_tokens`, the prompt's
    tokens whose KV came from the cache (OpenAI's `cached_tokens`), where it says; whole numbers
    from 0 to MAX_COUNT, else not read. The chat endpoint's `usage` and the Realtime endpoint's
    `response.done` usage are built from it."""

    prompt: int
    completion: int
    cached: int | None = None

    @classmethod
    def reported(cls, value: Any) -> TokenCounts | None:
        """The counts in `value`, or None where it holds no well-formed pair."""
        if not isinstance(value, dict):
            return None
        counts = [value.get(name) for name in ("prompt_tokens", "completion_tokens", "reused_tokens")]
        if not all(_count(n) for n in counts[:2]):
            return None
        return cls(counts[0], counts[1], counts[2] if _count(counts[2]) and counts[2] <= counts[0] else None)


MAX_COUNT = 2**53 - 1  # a count every JSON reader holds exactly (JavaScript's largest safe integer)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


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
    audio_field: str | None = None  # an Audio output: `message.audio` when the request asks for it


def served(runtime: Runtime, graph: str) -> dict[str, dict[str, str]] | None:
    """The OpenAI endpoints the compiler recorded for `graph` with the fields each reads
    (bundle.json `graphs.G.endpoints`, flowc.check.endpoints), or None from an older flowc."""
    summary = runtime.bundle.manifest.get("graphs", {}).get(graph, {})
    endpoints = summary.get("endpoints") if isinstance(summary, dict) else None
    return endpoints if isinstance(endpoints, dict) else None


def chat_shape(runtime: Runtime, graph: str) -> ChatShape | str:
    """The graph's ChatShape, or why the chat endpoint cannot drive it."""
    endpoints = served(runtime, graph)
    fields = (endpoints or {}).get("chat")
    if fields is not None:
        entry = runtime.bundle.plan["graphs"][graph]["entry"][0]
        entry_type = runtime.entry_types.get(graph, {}).get(entry, "Json")
        return ChatShape(graph, entry, entry_type != "Text", fields["text"], True, fields.get("audio"))
    if endpoints:
        shown = ", ".join(endpoints)
        return f"graph `{graph}` serves {shown}, not chat (its `serves` in the .flow says which endpoints serve it)"
    shape = _undeclared_chat_shape(runtime, graph)
    if isinstance(shape, ChatShape) and endpoints is not None:  # the compiler found no chat shape
        return f"graph `{graph}` cannot be a chat model (`flowc check` says why when it declares `serves chat`)"
    return shape


def _undeclared_chat_shape(runtime: Runtime, graph: str) -> ChatShape | str:
    """A chat shape worked out from the plan: for a bundle from a flowc that recorded no
    endpoints, and the reason a graph cannot be one."""
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
    audio_format: str | None = None  # `wav` or `pcm16` when the answer carries audio (`modalities`)


def kind_of(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")


def _shown(value: Any) -> str:
    """A value as an error message names it: a number by itself (`1.5`), anything else by its kind."""
    return json.dumps(value) if kind_of(value) == "a number" else kind_of(value)


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
        raise ChatError(400, f"the body is {kind_of(body)}, not a JSON object; {hint}")
    return body


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """`messages` as OpenAI defines it: a non-empty list of {role, content}, content a string or
    a list of content parts (an assistant's may be null); ChatError naming the first bad place."""
    if not isinstance(messages, list) or not messages:
        shown = "an empty list" if messages == [] else kind_of(messages)
        raise ChatError(400, f"`messages` must be a non-empty list of {{role, content}} objects, not {shown}", "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ChatError(400, f"`{where}` must be an object with `role` and `content`, not {kind_of(message)}", where)
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
                400, f"`{where}.content` must be a string or a list of content parts, not {kind_of(content)}", f"{where}.content"
            )
        for j, part in enumerate(content):
            place = f"{where}.content[{j}]"
            if not isinstance(part, dict):
                raise ChatError(400, f"`{place}` must be a content part such as {TEXT_PART}, not {kind_of(part)}", place)
            kind = part.get("type")
            if not isinstance(kind, str) or kind not in PART_FIELDS:  # (a list or an object cannot be looked up)
                shown = json.dumps(kind) if isinstance(kind, str) or kind is None else kind_of(kind)
                raise ChatError(400, f"`{place}.type` must be one of {', '.join(PART_FIELDS)}, not {shown}", place)
            if part.get(PART_FIELDS[kind]) is None:
                raise ChatError(400, f"`{place}` is a `{kind}` part without its `{PART_FIELDS[kind]}`", place)
            if kind == "text" and not isinstance(part["text"], str):
                raise ChatError(400, f"`{place}.text` must be a string, not {kind_of(part['text'])}", place)
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


# sampling parameters: passed on with the whole body to a Json entry (its roles may use them),
# ignored by a Text entry; checked either way, so a typo is an error, not a silent default
NUMBER_RANGES = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
ABOVE_LOW = frozenset({"top_p"})  # ranges open at their low end
RESPONSE_FORMATS = ("text",)  # a graph's text is what its roles write: no JSON mode to switch on
MAX_STOPS = 4


def check_sampling(body: dict[str, Any]) -> None:
    """ChatError naming the first sampling parameter of the wrong type or out of its range."""
    for name, (low, high) in NUMBER_RANGES.items():
        value = body.get(name)
        if value is None:
            continue
        if name in ABOVE_LOW:  # top_p 0 would keep no token to draw
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
                raise ChatError(400, f"`{name}` must be a number above {low:g} and at most {high:g}, not {_shown(value)}", name)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ChatError(400, f"`{name}` must be a number from {low:g} to {high:g}, not {_shown(value)}", name)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ChatError(400, f"`seed` must be a whole number, not {_shown(seed)}", "seed")
    stop = body.get("stop")
    stops_ok = isinstance(stop, list) and len(stop) <= MAX_STOPS and all(isinstance(s, str) for s in stop)
    if stop is not None and not isinstance(stop, str) and not stops_ok:
        raise ChatError(400, f"`stop` must be a string or a list of at most {MAX_STOPS} strings, not {_shown(stop)}", "stop")
    response_format = body.get("response_format")
    if response_format is not None:
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        if kind not in RESPONSE_FORMATS:
            shown = json.dumps(kind) if isinstance(kind, str) else kind_of(response_format)
            raise ChatError(
                400,
                f'`response_format` must be {{"type": "text"}}, not {shown}: a graph\'s text is what its roles write',
                "response_format",
            )


def session_of(body: dict[str, Any], headers: Any) -> str | None:
    """The call's session: the `X-Flow-Session` header, else OpenAI's `user`, else none."""
    user = _optional(body, "user", str, "a string")
    return headers.get("X-Flow-Session") or user or None


def check_audio(body: dict[str, Any], shape: ChatShape, stream: bool) -> str | None:
    """The audio format asked for (`modalities: ["text", "audio"]` with `audio: {"voice", "format"}`),
    None when the answer is text alone; ChatError naming the parameter and the fix."""
    modalities = body.get("modalities")
    if modalities is not None and (
        not isinstance(modalities, list) or not modalities or any(m not in MODALITIES for m in modalities)
    ):
        raise ChatError(400, f'`modalities` must be ["text"] or ["text", "audio"], not {json.dumps(modalities)}', "modalities")
    audio = body.get("audio")
    wants_audio = modalities is not None and "audio" in modalities
    if not wants_audio:
        if audio is not None:
            raise ChatError(400, '`audio` needs `modalities: ["text", "audio"]`', "audio")
        return None
    if shape.audio_field is None:
        raise ChatError(
            400,
            f"the model `{shape.graph}` answers with text only: it has no `Audio` output; leave `audio` out of `modalities`",
            "modalities",
            "model_not_supported",
        )
    wanted = f'{{"voice": "alloy", "format": "{"pcm16" if stream else "wav"}"}}'
    if not isinstance(audio, dict):
        raise ChatError(400, f"`modalities` asks for audio: send `audio` as an object such as {wanted}", "audio")
    voice = audio.get("voice")
    if voice is not None and not isinstance(voice, (str, dict)):
        raise ChatError(400, f"`audio.voice` must be a voice's name, not {kind_of(voice)}", "audio.voice")
    audio_format = audio.get("format")
    if audio_format not in AUDIO_FORMATS:
        raise ChatError(
            400, f"`audio.format` must be one of {', '.join(AUDIO_FORMATS)}, not {json.dumps(audio_format)}", "audio.format"
        )
    if stream and audio_format != "pcm16":
        raise ChatError(400, '`stream: true` sends audio as `pcm16` chunks: ask for `audio.format` "pcm16"', "audio.format")
    return audio_format


def _limit(body: dict[str, Any], name: str) -> int | None:
    value = _optional(body, name, int, "a whole number greater than 0")
    if value is not None and value < 1:
        raise ChatError(400, f"`{name}` must be a whole number greater than 0, not {value}", name)
    return value


def parse_request(body: dict[str, Any], shapes: dict[str, ChatShape | str], headers: Any) -> ChatRequest:
    """Check a chat request at the edge; ChatError naming the parameter and the fix."""
    model = body.get("model")
    if not isinstance(model, str):
        raise ChatError(400, f"`model` must be a graph's name (GET /v1/models lists them), not {kind_of(model)}", "model")
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
    check_sampling(body)
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
    session = session_of(body, headers)
    if shape.whole_body:
        check_depth(body, model)
    audio_format = check_audio(body, shape, stream)
    entry_value = body if shape.whole_body else last_user_text(messages, model)
    return ChatRequest(shape, entry_value, stream, bool(include_usage), session, limit, audio_format)
