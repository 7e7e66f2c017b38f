"""The wire of the WebSocket graph endpoint (protocol `flowrt.ws.v1`, docs/websocket.md): the
messages a client sends, as typed structs decoded and checked at the edge (`decode`), and the
server's messages, encoded here (`hello`, `event`, `error`).

A client's text message is one JSON object whose `type` is `start`, `frame`, `end` or `cancel`;
anything else (not UTF-8 JSON, not an object, an unknown `type`, a missing or misspelt field, a
value of the wrong kind) is `WireError`, whose message says what is wrong and whose hint shows
the message as it should be. Binary messages carry no JSON: flowrt.gateway.websocket routes them.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import msgspec

PROTOCOL = "flowrt.ws.v1"  # the WebSocket subprotocol, and `hello`'s `protocol`
VERSION = 1
CallId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
MAX_SAMPLE_RATE = 384_000  # Hz: the most an Audio frame's `sample_rate` may be (binary, or a pcm16 `frame`)
AUDIO_FORMATS = ("pcm16", "wav", "flac", "ogg")  # what a binary Audio frame may be (flowstd's audio segments)


class Binary(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Which streaming entry a call's binary messages are frames of, and how an Audio frame is told."""

    field: Name | None = None  # default: the graph's one streaming entry of type Audio or Bytes
    format: str = "pcm16"  # Audio: pcm16 (little-endian int16 samples), wav, flac or ogg
    sample_rate: Annotated[int, msgspec.Meta(ge=1, le=MAX_SAMPLE_RATE)] = 16_000  # Audio: Hz


class Start(msgspec.Struct, tag="start", tag_field="type", forbid_unknown_fields=True, frozen=True):
    call: CallId
    inputs: dict[str, Any] = {}
    session: Name | None = None  # default: the connection's (X-Flow-Session or ?session=)
    timeout: float | None = None
    interrupt: bool = False
    binary: Binary | None = None
    summary: bool = False  # images and audio in events as summaries, not in full
    binary_out: bool = False  # images and audio in events as binary messages (their bytes), not base64


class Frame(msgspec.Struct, tag="frame", tag_field="type", forbid_unknown_fields=True, frozen=True):
    call: CallId
    field: Name
    value: Any


class End(msgspec.Struct, tag="end", tag_field="type", forbid_unknown_fields=True, frozen=True):
    call: CallId
    field: Name


class Cancel(msgspec.Struct, tag="cancel", tag_field="type", forbid_unknown_fields=True, frozen=True):
    call: CallId


Message = Start | Frame | End | Cancel
_DECODER = msgspec.json.Decoder(Message)
EXAMPLES = {
    "start": '{"type": "start", "call": "c1", "inputs": {...}}',
    "frame": '{"type": "frame", "call": "c1", "field": "audio_in", "value": ...}',
    "end": '{"type": "end", "call": "c1", "field": "audio_in"}',
    "cancel": '{"type": "cancel", "call": "c1"}',
}
TYPES = ", ".join(EXAMPLES)


class WireError(Exception):
    """A client message that cannot be taken: what is wrong (`message`), the fix (`hint`), and
    the message's `type` and `call` where they could be read."""

    def __init__(self, message: str, hint: str, about: str | None = None, call: str | None = None):
        super().__init__(message)
        self.message, self.hint, self.about, self.call = message, hint, about, call
        self.over = about == "start"  # a `start` refused here: its call never existed (the error says `over`)


def decode(text: str) -> Message:
    """One text message as its struct; WireError saying what is wrong."""
    try:
        return _DECODER.decode(text)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise _explained(text, error) from None
    except RecursionError:  # (JSON nested deeper than the decoder goes: nothing of it can be read)
        raise _too_deep() from None


def _too_deep() -> WireError:
    return WireError(
        "the text message nests too deeply to read (arrays or objects inside one another, deeper than the server reads)",
        f"send a flatter value, e.g. {EXAMPLES['frame']}",
    )


def _explained(text: str, error: Exception) -> WireError:
    """Why `text` is not a message (read again, as plain JSON, only when it failed)."""
    try:
        value = msgspec.json.decode(text)
    except RecursionError:
        return _too_deep()
    except msgspec.DecodeError as bad:
        return WireError(f"a text message must be a JSON object, and this is not JSON ({bad})", f"send e.g. {EXAMPLES['start']}")
    if not isinstance(value, dict):
        return WireError(
            f"a text message must be a JSON object with a `type`, not a JSON {type(value).__name__}",
            f"send e.g. {EXAMPLES['start']}",
        )
    kind, call = value.get("type"), value.get("call")
    call = call if isinstance(call, str) else None
    if kind not in EXAMPLES:
        told = "has no `type`" if "type" not in value else f"has the unknown type {json.dumps(kind)[:60]}"
        return WireError(f"the message {told}", f"the types a client sends are {TYPES}", call=call)
    return WireError(f"`{kind}` message: {error}", f"send it as {EXAMPLES[kind]}", about=kind, call=call)


# ── the server's messages ──


def hello(program: Any, types: dict[str, str], limits: dict[str, int]) -> str:
    """The first message of every connection: the protocol, and the graph's entries and outputs."""
    entries = {name: {"type": types.get(name), "stream": name in program.entry_stream} for name in program.entry}
    return json.dumps(
        {
            "type": "hello",
            "protocol": PROTOCOL,
            "version": VERSION,
            "graph": program.name,
            "entries": entries,
            "stream": [name for name, _ in program.streams],
            "return": list(program.returns),
            "limits": limits,
        }
    )


def event(call: str, event_text: str) -> str:
    """A call's event (the JSON text of one NDJSON line of POST /graphs/GRAPH), tagged with its call."""
    return f'{{"type": "event", "call": {json.dumps(call)}, "event": {event_text}}}'


def error(
    message: str, hint: str, *, call: str | None = None, about: str | None = None, code: str | None = None, over: bool = False
) -> str:
    """An error: `over` says the call it names will send nothing more (it never started, or it is gone)."""
    body: dict[str, Any] = {"type": "error", "call": call, "about": about, "error": message, "hint": hint}
    if code is not None:
        body["code"] = code
    if over:
        body["over"] = True
    return json.dumps(body)
