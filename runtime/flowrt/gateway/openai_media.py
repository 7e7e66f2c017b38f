"""The OpenAI media endpoints (docs/openai.md): a graph that declares `serves images`, `speech`
or `embeddings` in its .flow answers OpenAI's images, speech and embeddings APIs.

    POST /v1/images/generations  {"model", "prompt", ...} -> {"created", "data": [{"b64_json": PNG}]}
    POST /v1/audio/speech        {"model", "input", "voice", "response_format": "wav" | "pcm"} -> the audio file
    POST /v1/embeddings          {"model", "input": text or [texts], "encoding_format"} -> one vector per text

The compiler recorded which field each endpoint reads (bundle.json `graphs.G.endpoints`,
flowc.check.endpoints). A `Text` entry gets the prompt, the input text or each text to embed;
a `Json` entry the whole body (for embeddings, with `input` set to the one text of its call).
A call's failure is answered as on the chat endpoint (flowrt.gateway.openai.call_error).
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from flowrt import media
from flowrt.control import BadInputs, UnknownGraph
from flowrt.gateway.exposure import client_events
from flowrt.gateway.openai import ChatEndpoint, call_error
from flowrt.gateway.openai_request import ChatError, check_depth, kind_of, session_of
from flowrt.values import json_text, summarize

MAX_SPEECH_INPUT = 4096  # characters of `input`, as OpenAI's
MAX_EMBEDDING_INPUTS = 2048  # texts in one embeddings request, as OpenAI's
EMBEDDING_CALLS = 16  # of one request's texts, calls running at once (the request holds one admission place)
SPEECH_FORMATS = {"wav": "audio/wav", "pcm": "audio/pcm"}
ENCODINGS = ("float", "base64")


@dataclass(frozen=True)
class Target:
    """One request's graph: its entry, whether that entry takes the whole body, and the field read."""

    graph: str
    entry: str
    whole_body: bool
    field: str


@dataclass
class Outcome:
    """What one call gave: the read field's values, the token counts a role reported, the error."""

    values: list[Any]
    prompt_tokens: int = 0
    error: ChatError | None = None


class MediaEndpoints:
    """The images, speech and embeddings handlers, over the chat endpoint's runtime, admission
    and session owners."""

    def __init__(self, v1: ChatEndpoint):
        self.v1 = v1

    # ── the handlers ──

    async def images(self, request: web.Request) -> web.StreamResponse:
        opened = await self._open(request, "images", "image")
        if isinstance(opened, web.Response):
            return opened
        body, target = opened
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise ChatError(400, f"`prompt` must be a non-empty string describing the image, not {_shown(prompt)}", "prompt")
        n = body.get("n")
        if n is not None and (isinstance(n, bool) or n != 1):
            raise ChatError(400, f"`n` must be 1: a graph gives one image per call, not {json.dumps(n)}", "n")
        response_format = body.get("response_format")
        if response_format not in (None, "b64_json"):
            raise ChatError(
                400,
                f'`response_format` must be "b64_json", not {json.dumps(response_format)}: the server keeps no files to link to',
                "response_format",
            )

        async def answer() -> web.Response:
            outcome = await self._run(target, body if target.whole_body else prompt, session_of(body, request.headers))
            if outcome.error is not None:
                return outcome.error.response()
            if not outcome.values:
                raise ChatError(500, f"graph `{target.graph}` ended without sending `{target.field}`", None, "no_output")
            png = self._png(target, outcome.values[-1])
            return web.json_response({"created": int(time.time()), "data": [{"b64_json": png}]})

        return await self.v1.admitted(request, session_of(body, request.headers), answer)

    async def speech(self, request: web.Request) -> web.StreamResponse:
        opened = await self._open(request, "speech", "audio")
        if isinstance(opened, web.Response):
            return opened
        body, target = opened
        text = body.get("input")
        if not isinstance(text, str) or not text:
            raise ChatError(400, f"`input` must be the non-empty text to speak, not {_shown(text)}", "input")
        if len(text) > MAX_SPEECH_INPUT:
            raise ChatError(400, f"`input` is {len(text)} characters; the limit is {MAX_SPEECH_INPUT}: send it in parts", "input")
        voice = body.get("voice")
        if voice is not None and not isinstance(voice, (str, dict)):
            raise ChatError(400, f"`voice` must be a voice's name, not {kind_of(voice)}", "voice")
        response_format = body.get("response_format", "wav")
        if response_format not in SPEECH_FORMATS:
            raise ChatError(
                400,
                f"`response_format` must be one of {', '.join(SPEECH_FORMATS)}, not {json.dumps(response_format)}",
                "response_format",
            )
        speed = body.get("speed")
        if speed is not None and (isinstance(speed, bool) or speed != 1):
            raise ChatError(400, f"`speed` must be 1: the graph's voice speaks at its own pace, not {json.dumps(speed)}", "speed")

        async def answer() -> web.Response:
            outcome = await self._run(target, body if target.whole_body else text, session_of(body, request.headers))
            if outcome.error is not None:
                return outcome.error.response()
            pcm, rate = self._pcm16(target, outcome.values)
            data = media.encode_wav(pcm, rate) if response_format == "wav" else pcm
            return web.Response(body=data, content_type=SPEECH_FORMATS[response_format], headers={"X-Sample-Rate": str(rate)})

        return await self.v1.admitted(request, session_of(body, request.headers), answer)

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        opened = await self._open(request, "embeddings", "vector")
        if isinstance(opened, web.Response):
            return opened
        body, target = opened
        texts = _texts(body.get("input"))
        encoding = body.get("encoding_format", "float")
        if encoding not in ENCODINGS:
            raise ChatError(
                400, f"`encoding_format` must be one of {', '.join(ENCODINGS)}, not {json.dumps(encoding)}", "encoding_format"
            )
        if body.get("dimensions") is not None:
            raise ChatError(400, "`dimensions` is not supported: a graph's vectors have the width its model gives", "dimensions")
        session = session_of(body, request.headers)

        async def answer() -> web.Response:
            entries = [{**body, "input": text} if target.whole_body else text for text in texts]
            running = asyncio.Semaphore(EMBEDDING_CALLS)

            async def one(entry: Any) -> Outcome:
                async with running:
                    return await self._run(target, entry, session)

            outcomes = await asyncio.gather(*(one(entry) for entry in entries))
            data, prompt_tokens = [], 0
            for index, outcome in enumerate(outcomes):
                if outcome.error is not None:
                    return outcome.error.response()
                if not outcome.values:
                    raise ChatError(500, f"graph `{target.graph}` ended without sending `{target.field}`", None, "no_output")
                vector = self._vector(target, outcome.values[-1])
                shown: Any = vector
                if encoding == "base64":  # little-endian float32, as OpenAI's (its client asks for this)
                    shown = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
                data.append({"object": "embedding", "index": index, "embedding": shown})
                prompt_tokens += outcome.prompt_tokens
            usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
            return web.json_response({"object": "list", "data": data, "model": target.graph, "usage": usage}, dumps=json_text)

        # one place for the request: its texts' calls run under it, EMBEDDING_CALLS at a time
        return await self.v1.admitted(request, session, answer)

    # ── the pieces ──

    async def _open(self, request: web.Request, endpoint: str, key: str) -> tuple[dict[str, Any], Target] | web.Response:
        """The request's body and the graph it asks of `endpoint`, or the front door's refusal."""
        body = await self.v1.body(request)
        return body if isinstance(body, web.Response) else (body, self._target(body, endpoint, key))

    def _target(self, body: dict[str, Any], endpoint: str, key: str) -> Target:
        """The graph `model` names, if it serves `endpoint`; ChatError naming the models that do."""
        model = body.get("model")
        if not isinstance(model, str):
            raise ChatError(400, f"`model` must be a graph's name (GET /v1/models lists them), not {kind_of(model)}", "model")
        fields = self.v1.fields.get(model)
        known = self.v1.known(endpoint)
        if fields is None and model not in self.v1.shapes:
            raise ChatError(
                404, f"the model `{model}` does not exist: no such graph (models: {known})", "model", "model_not_found"
            )
        if not fields or endpoint not in fields:
            says = ", ".join(sorted(fields or ())) or "no endpoint"
            raise ChatError(
                400,
                f"the model `{model}` does not serve {endpoint} (it serves {says}); models that do: {known}. "
                f"A graph serves {endpoint} when its .flow says `serves {endpoint}`",
                "model",
                "model_not_supported",
            )
        runtime = self.v1.runtime
        entry = runtime.bundle.plan["graphs"][model]["entry"][0]
        whole_body = runtime.entry_types.get(model, {}).get(entry, "Json") != "Text"
        if whole_body:
            check_depth(body, model)
        return Target(model, entry, whole_body, fields[endpoint][key])

    async def _run(self, target: Target, entry_value: Any, session: str | None) -> Outcome:
        """One call of the target's graph, read to its end."""
        try:
            events = self.v1.runtime.call_batches(target.graph, {target.entry: entry_value}, session=session)
        except (UnknownGraph, BadInputs) as error:  # (the compiler checked the entry: not expected)
            raise ChatError(400, str(error), None) from None
        outcome, done = Outcome([]), None
        try:
            async for batch in events:
                for event in batch:
                    if event["event"] == "done":
                        done = client_events([event], self.v1.roots)[0]
                    elif event["field"] == target.field:
                        outcome.values.append(event["value"])
                    elif isinstance(event["value"], dict) and _count(event["value"].get("prompt_tokens")):
                        outcome.prompt_tokens = event["value"]["prompt_tokens"]  # a role's report (flowstd's)
        finally:
            await events.aclose()  # cancels the call if it has not ended (the client went away)
        outcome.error = call_error(done, target.graph)
        return outcome

    def _png(self, target: Target, value: Any) -> str:
        carried = summarize(value, media=True)
        if not isinstance(carried, dict) or carried.get("format") != "png" or not isinstance(carried.get("base64"), str):
            raise _not_media(target, value, "a PNG image (a value whose `media()` gives format png, as flowstd's images)")
        return carried["base64"]

    def _pcm16(self, target: Target, values: list[Any]) -> tuple[bytes, int]:
        pieces, rate = [], None
        for index, value in enumerate(values):
            try:
                pcm, piece_rate = media.carried_pcm16(summarize(value, media=True), f"frame {index}")
            except ValueError as error:
                raise _not_media(target, value, f"mono PCM16 audio ({error})") from None
            if rate not in (None, piece_rate):
                raise _not_media(target, value, f"audio at one rate (frame {index} is at {piece_rate} Hz, the first at {rate})")
            pieces.append(pcm)
            rate = piece_rate
        if rate is None:
            raise ChatError(500, f"graph `{target.graph}` ended without sending `{target.field}`", None, "no_output")
        return b"".join(pieces), rate

    def _vector(self, target: Target, value: Any) -> list[float]:
        flat = value.tolist() if hasattr(value, "tolist") else value  # a tensor or an array
        if isinstance(flat, dict) and "embedding" in flat:
            flat = flat["embedding"]
        if isinstance(flat, list) and len(flat) == 1 and isinstance(flat[0], list):
            flat = flat[0]  # one row: a batch of one
        if not isinstance(flat, list) or not flat or not all(_number(x) for x in flat):
            raise _not_media(target, value, "a vector: a non-empty list of numbers or a 1-D tensor")
        return [float(x) for x in flat]


def _texts(value: Any) -> list[str]:
    """`input` as a list of texts; ChatError naming what it must be."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        shown = "an empty list" if value == [] else _shown(value)
        if isinstance(texts, list) and texts and all(isinstance(t, (int, list)) for t in texts):
            shown = "token ids"
        elif isinstance(texts, list) and "" in texts:
            shown = f"an empty string at {texts.index('')}"
        raise ChatError(400, f"`input` must be a non-empty string or a list of non-empty strings, not {shown}", "input")
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise ChatError(
            400, f"`input` holds {len(texts)} texts; the limit is {MAX_EMBEDDING_INPUTS}: send them in parts", "input"
        )
    return texts


def _shown(value: Any) -> str:
    """A wrong value as a message names it: an empty string as such, anything else by its kind."""
    return "an empty string" if value == "" else kind_of(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _not_media(target: Target, value: Any, wanted: str) -> ChatError:
    said = f"graph `{target.graph}`'s `{target.field}` sent {type(value).__name__}, not {wanted}"
    return ChatError(500, f"{said}; fix the role that produces it", None, "bad_output")


__all__ = ["MediaEndpoints"]
