"""The wire of the OpenAI Realtime-compatible endpoint (`/v1/realtime`, docs/openai.md "Realtime"):
the client events it takes, decoded and checked at the edge into typed structs (`decode`), a
session's settings and `session.update` checked against what the endpoint supports
(`Settings.updated`), and the server events it sends, in the beta names (a client that sends
`OpenAI-Beta: realtime=v1`) or the GA ones (`Names`), with a response's ending (`ending`) and
its audio at the session's rate (`pcm16_at`).

Everything a client gets wrong is a `RealtimeError`: OpenAI's error object (`type`, `code`,
`message`, `param`, and the `event_id` of the client event that caused it), sent as an `error`
event; the event is dropped and the connection goes on.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass, replace
from typing import Annotated, Any

import msgspec

from flowrt import media
from flowrt.gateway.exposure import hide_paths
from flowrt.gateway.openai_request import TokenCounts
from flowrt.gateway.realtime_vad import TurnDetection
from flowrt.values import json_text, summarize

EventId = Annotated[str, msgspec.Meta(max_length=512)]
RATES = (24_000, 16_000)  # the PCM16 rates a session's audio may have (OpenAI's is 24 kHz; 16 kHz is this endpoint's own)
AUDIO_TYPE = "audio/pcm"  # the GA format's `type`: little-endian PCM16, mono
BETA_FORMAT = "pcm16"  # the beta format's name: PCM16 at 24 kHz
VOICE = "alloy"  # the voice a session names until it asks for another (the graph's roles decide what it means)


class RealtimeError(Exception):
    """A client event the endpoint answers with an `error` event."""

    def __init__(self, message: str, code: str, param: str | None = None, event_id: str | None = None, kind: str = ""):
        super().__init__(message)
        self.message, self.code, self.param, self.event_id = message, code, param, event_id
        self.kind = kind or "invalid_request_error"

    def body(self) -> dict[str, Any]:
        return {"type": self.kind, "code": self.code, "message": self.message, "param": self.param, "event_id": self.event_id}


# what the endpoint refuses beyond an event's shape: code -> (param, message, whether it is the server's)
REFUSALS = {
    "rate_change": (
        "session.audio.input.format",
        "`session.audio.input`: the input's rate and turn detection cannot change while audio of a turn is appended "
        "and not committed; commit (or clear) it first",
        False,
    ),
    "too_many_turns": (
        None,
        "this connection has {most} turns open (audio whose response has not ended), the most it may; send "
        "response.create for them, or wait for their responses to end",
        False,
    ),
    "input_audio_buffer_full": (
        "audio",
        "the turn's audio waiting for its call is over {mib} MiB (the call before it is still running); commit and "
        "send response.create, or append more slowly",
        False,
    ),
    "input_audio_buffer_commit_empty": (
        None,
        "the input audio buffer is empty: append audio before input_audio_buffer.commit",
        False,
    ),
    "response_settings": (
        "response.{name}",
        "`response.{name}`: per-response settings are not supported; set them with session.update",
        False,
    ),
    "call_ended": (
        None,
        "the model `{model}`'s call for the audio being appended ended before input_audio_buffer.commit ({how}); "
        "that audio is dropped: append the turn again",
        True,
    ),
    "response_not_requested": (
        None,
        "the model `{model}` made more than {most} events for the audio of item `{item}` before a response.create "
        "asked for them; its call was cancelled: send response.create after input_audio_buffer.commit",
        False,
    ),
    "not_text": (None, "the model `{model}`'s `{field}` sent a {kind}, not text; fix the role that produces it", True),
    "not_audio": (None, "the model `{model}` cannot answer with audio: {error}; its role must send mono PCM16 audio", True),
}


def refusal(code: str, event_id: str | None, **told: Any) -> RealtimeError:
    """The error of REFUSALS[code], its message and param filled with `told`."""
    param, message, servers = REFUSALS[code]
    code_shown = "unsupported_field" if code == "response_settings" else "invalid_value" if code == "rate_change" else code
    return RealtimeError(
        message.format(**told),
        code_shown,
        param.format(**told) if param else None,
        event_id,
        "server_error" if servers else "",
    )


def internal(error: Exception) -> RealtimeError:
    """A bug in flowrt, as the client is told of it (the server's log has the traceback)."""
    told = hide_paths(
        f"internal error: {type(error).__name__}: {error}; this is a bug in flowrt, the server's log has the traceback"
    )
    return RealtimeError(told, "internal_error", kind="server_error")


# ── the client's events ──


class SessionUpdate(msgspec.Struct, tag="session.update", tag_field="type", forbid_unknown_fields=True, frozen=True):
    session: dict[str, Any]
    event_id: EventId | None = None


class Append(msgspec.Struct, tag="input_audio_buffer.append", tag_field="type", forbid_unknown_fields=True, frozen=True):
    audio: str  # base64 PCM16
    event_id: EventId | None = None


class Commit(msgspec.Struct, tag="input_audio_buffer.commit", tag_field="type", forbid_unknown_fields=True, frozen=True):
    event_id: EventId | None = None


class Clear(msgspec.Struct, tag="input_audio_buffer.clear", tag_field="type", forbid_unknown_fields=True, frozen=True):
    event_id: EventId | None = None


class ResponseCreate(msgspec.Struct, tag="response.create", tag_field="type", forbid_unknown_fields=True, frozen=True):
    response: dict[str, Any] | None = None  # per-response settings: none supported (an empty object is fine)
    event_id: EventId | None = None


class ResponseCancel(msgspec.Struct, tag="response.cancel", tag_field="type", forbid_unknown_fields=True, frozen=True):
    response_id: str | None = None
    event_id: EventId | None = None


ClientEvent = SessionUpdate | Append | Commit | Clear | ResponseCreate | ResponseCancel
_DECODER = msgspec.json.Decoder(ClientEvent)
TYPES = (
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "response.create",
    "response.cancel",
)


def decode(text: str | bytes) -> ClientEvent:
    """One client event as its struct; RealtimeError saying what is wrong (with the event's
    `event_id` where it could be read)."""
    try:
        return _DECODER.decode(text)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise _explained(text, error) from None
    except RecursionError:
        raise RealtimeError(
            "the event nests too deeply to read; send an event as OpenAI's Realtime API defines it", "invalid_event"
        ) from None


def _explained(text: str | bytes, error: Exception) -> RealtimeError:
    try:
        value = json.loads(text)
    except RecursionError:
        return RealtimeError(
            "the event nests too deeply to read; send an event as OpenAI's Realtime API defines it", "invalid_event"
        )
    except ValueError as bad:
        return RealtimeError(
            f"the event is not JSON ({str(bad)[:120]}); send one JSON object per text message, "
            'e.g. {"type": "input_audio_buffer.commit"}',
            "invalid_json",
        )
    if not isinstance(value, dict):
        kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
        shown = kinds.get(type(value), "a number")
        return RealtimeError(f"an event is a JSON object with a `type`, not {shown}", "invalid_event", "type")
    event_id = value.get("event_id") if isinstance(value.get("event_id"), str) else None
    kind = value.get("type")
    if kind not in TYPES:
        told = "has no `type`" if kind is None else f"has the type {_shown(kind)}, which this server does not take"
        return RealtimeError(
            f"the event {told}; the client events it takes are {', '.join(TYPES)}", "invalid_value", "type", event_id
        )
    told = str(error)
    param = None
    if "`$." in told:  # msgspec's path of the offending field: `$.audio`
        param = told.split("`$.", 1)[1].split("`", 1)[0]
    elif "field `" in told:  # an unknown field, or a required one missing
        param = told.split("field `", 1)[1].split("`", 1)[0]
    return RealtimeError(f"`{kind}`: {told}", "invalid_value", param, event_id)


def _shown(value: Any) -> str:
    """A client's value as an error message quotes it (at most 80 characters)."""
    try:
        return json.dumps(value)[:80]
    except (RecursionError, ValueError):
        return f"a {type(value).__name__} too deep to show"


def audio_bytes(event: Append) -> bytes:
    """An append's audio as PCM16 bytes; RealtimeError for base64 that is not, or a part sample."""
    try:
        data = base64.b64decode(event.audio, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError(
            "`audio` is not base64; send the PCM16 samples (little-endian int16, mono) base64-encoded",
            "invalid_base64",
            "audio",
            event.event_id,
        ) from None
    if not data:
        raise RealtimeError("`audio` is empty; append at least one sample", "invalid_value", "audio", event.event_id)
    if len(data) % 2:
        raise RealtimeError(
            f"`audio` holds {len(data)} bytes: PCM16 samples are 2 bytes each, so a whole number of samples is an even "
            "number of bytes",
            "invalid_value",
            "audio",
            event.event_id,
        )
    return data


# ── the session's settings ──


@dataclass(frozen=True)
class Settings:
    """What a connection's session.update has set (and session.created told)."""

    model: str
    speaks: bool  # the graph has an audio output
    audio_out: bool  # the session's output modalities include audio
    instructions: str = ""
    voice: str = VOICE
    input_rate: int = RATES[0]
    output_rate: int = RATES[0]
    turn_detection: TurnDetection | None = None  # server VAD (flowrt.gateway.realtime_vad); None: the client commits

    def updated(self, session: dict[str, Any], event_id: str | None) -> Settings:
        """These settings with `session`'s applied (all or none); RealtimeError naming the first
        field the endpoint does not support, as `session.FIELD`."""
        changes: dict[str, Any] = {}

        def refuse(place: str, message: str, code: str = "invalid_value") -> RealtimeError:
            return RealtimeError(f"`session.{place}`: {message}", code, f"session.{place}", event_id)

        for key, value in session.items():
            if key == "type":
                if value != "realtime":
                    raise refuse(key, f'this endpoint serves "realtime" sessions, not {_shown(value)}')
            elif key == "model":
                if value != self.model:
                    raise refuse(
                        key, f"a connection serves the model it connected for (`{self.model}`); connect again for another"
                    )
            elif key == "instructions":
                if not isinstance(value, str):
                    raise refuse(key, "must be a string")
                changes["instructions"] = value
            elif key == "voice":
                changes["voice"] = self._voice(value, refuse, key)
            elif key in ("modalities", "output_modalities"):
                changes["audio_out"] = self._modalities(key, value, refuse)
            elif key == "turn_detection":
                changes["turn_detection"] = TurnDetection.parse(value, refuse, key)
            elif key in ("input_audio_format", "output_audio_format"):
                if value != BETA_FORMAT:
                    raise refuse(key, f'this endpoint takes and sends "{BETA_FORMAT}" (PCM16 at 24 kHz), not {_shown(value)}')
                changes["input_rate" if key.startswith("input") else "output_rate"] = RATES[0]
            elif key == "audio":
                changes.update(self._audio(value, refuse))
            elif value is None or value == [] or value == {}:
                continue  # nothing asked
            else:
                raise refuse(key, f"is not supported by this endpoint (it supports {SUPPORTED})", "unsupported_field")
        return replace(self, **changes)

    def _voice(self, value: Any, refuse: Any, place: str) -> str:
        if isinstance(value, dict) and isinstance(value.get("id"), str):
            value = value["id"]
        if not isinstance(value, str) or not value:
            raise refuse(place, "must be a voice's name")
        return value

    def _modalities(self, key: str, value: Any, refuse: Any) -> bool:
        allowed = [["text"], ["text", "audio"], ["audio", "text"]] if key == "modalities" else [["text"], ["audio"]]
        if value not in allowed:
            shown = " or ".join(json.dumps(a) for a in allowed)
            raise refuse(key, f"must be {shown}, not {_shown(value)}")
        if "audio" in value and not self.speaks:
            raise refuse(
                key, f'the model `{self.model}` answers with text only (its graph has no Audio output): ask for ["text"]'
            )
        return "audio" in value

    def _audio(self, value: Any, refuse: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise refuse("audio", 'must be an object such as {"input": {"format": ...}, "output": {...}}')
        changes: dict[str, Any] = {}
        for side, fields in value.items():
            if side not in ("input", "output"):
                raise refuse(f"audio.{side}", "is not supported (`audio` has `input` and `output`)", "unsupported_field")
            if fields is None:
                continue
            if not isinstance(fields, dict):
                raise refuse(f"audio.{side}", "must be an object")
            for key, setting in fields.items():
                place = f"audio.{side}.{key}"
                if key == "format":
                    changes[f"{side}_rate"] = self._format(setting, refuse, place)
                elif side == "input" and key == "turn_detection":
                    changes["turn_detection"] = TurnDetection.parse(setting, refuse, place)
                elif side == "output" and key == "voice":
                    changes["voice"] = self._voice(setting, refuse, place)
                elif setting is None or (side == "output" and key == "speed" and setting in (1, 1.0)):
                    continue  # nothing asked, or what the graph does anyway
                else:
                    raise refuse(place, f"is not supported by this endpoint (it supports {SUPPORTED})", "unsupported_field")
        return changes

    @staticmethod
    def _format(value: Any, refuse: Any, place: str) -> int:
        rate = value.get("rate", RATES[0]) if isinstance(value, dict) else None
        if not isinstance(value, dict) or value.get("type", AUDIO_TYPE) != AUDIO_TYPE or rate not in RATES:
            raise refuse(
                place,
                f'must be {{"type": "{AUDIO_TYPE}", "rate": 24000}} (or 16000): PCM16, mono; not {_shown(value)}',
            )
        return rate

    def changed_input(self, other: Settings) -> bool:
        return self.input_rate != other.input_rate or self.turn_detection != other.turn_detection


SUPPORTED = (
    "type, model, instructions, output_modalities, audio.input.format, audio.input.turn_detection (null or server_vad), "
    "audio.output.format, audio.output.voice; beta: modalities, voice, input_audio_format, output_audio_format (pcm16), "
    "turn_detection"
)


# ── the server's events ──


def usage(counts: TokenCounts) -> dict[str, Any]:
    """OpenAI's Realtime usage object: input tokens are the prompt's (`cached_tokens` of them had
    their KV reused), output tokens the generated ones."""
    details = {"cached_tokens": counts.cached} if counts.cached is not None else {}
    return {
        "total_tokens": counts.prompt + counts.completion,
        "input_tokens": counts.prompt,
        "output_tokens": counts.completion,
        "input_token_details": details,
    }


@dataclass(frozen=True)
class Names:
    """The event names and shapes of one protocol version: beta (`OpenAI-Beta: realtime=v1`) or GA."""

    beta: bool

    @property
    def text_delta(self) -> str:
        return "response.text.delta" if self.beta else "response.output_text.delta"

    @property
    def transcript_delta(self) -> str:
        return "response.audio_transcript.delta" if self.beta else "response.output_audio_transcript.delta"

    @property
    def audio_delta(self) -> str:
        return "response.audio.delta" if self.beta else "response.output_audio.delta"

    def session(self, settings: Settings, session_id: str) -> dict[str, Any]:
        """The session object of session.created and session.updated."""
        detection = settings.turn_detection.shown() if settings.turn_detection is not None else None
        if self.beta:
            return {
                "id": session_id,
                "object": "realtime.session",
                "model": settings.model,
                "modalities": ["text", "audio"] if settings.audio_out else ["text"],
                "instructions": settings.instructions,
                "voice": settings.voice,
                "input_audio_format": BETA_FORMAT,
                "output_audio_format": BETA_FORMAT,
                "turn_detection": detection,
                "sample_rates": {"input": settings.input_rate, "output": settings.output_rate},  # (not OpenAI's: 16 kHz is ours)
            }
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": settings.model,
            "output_modalities": ["audio"] if settings.audio_out else ["text"],
            "instructions": settings.instructions,
            "audio": {
                "input": {"format": {"type": AUDIO_TYPE, "rate": settings.input_rate}, "turn_detection": detection},
                "output": {"format": {"type": AUDIO_TYPE, "rate": settings.output_rate}, "voice": settings.voice},
            },
        }

    def response(
        self,
        response_id: str,
        settings: Settings,
        status: str,
        item: dict[str, Any] | None = None,
        details: dict | None = None,
        counts: TokenCounts | None = None,
    ) -> dict[str, Any]:
        """The response object of response.created (`in_progress`, no output) and response.done;
        its `usage` is what the graph reported (null where it reported nothing, as a call that was
        cancelled before its report)."""
        body: dict[str, Any] = {
            "id": response_id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": [item] if item is not None else [],
            "usage": usage(counts) if counts is not None else None,
        }
        if self.beta:
            body["modalities"] = ["text", "audio"] if settings.audio_out else ["text"]
            body["voice"] = settings.voice
            body["output_audio_format"] = BETA_FORMAT
        else:
            body["output_modalities"] = ["audio"] if settings.audio_out else ["text"]
            body["audio"] = {"output": {"format": {"type": AUDIO_TYPE, "rate": settings.output_rate}, "voice": settings.voice}}
        return body

    def item(self, item_id: str, text: str, audio: bool, complete: bool) -> dict[str, Any]:
        """The assistant message a response made: its text (or, answering with audio, the audio's
        transcript; the audio itself went in the deltas)."""
        if audio:
            part = {"type": "audio" if self.beta else "output_audio", "transcript": text}
        else:
            part = {"type": "text" if self.beta else "output_text", "text": text}
        return {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": "completed" if complete else "incomplete",
            "content": [part],
        }


def ending(stopped: str | None, error: RealtimeError | None, reason: str) -> tuple[str, dict[str, Any] | None]:
    """A response's `status` and `status_details`: `cancelled` when the client stopped it (`stopped`:
    `client_cancelled` or `turn_detected`), `incomplete` when its call timed out, `failed` on any
    other error, else `completed`."""
    if stopped is not None:
        return "cancelled", {"type": "cancelled", "reason": stopped}
    if error is None:
        return "completed", None
    status = "incomplete" if reason == "timeout" else "failed"
    return status, {"type": status, "error": {"type": error.kind, "code": error.code, "message": error.message}}


def pcm16_at(value: Any, rate: int, name: str) -> bytes:
    """An audio frame's samples (a value whose `media()` is a mono PCM16 WAV, flowrt.media) as
    PCM16 at `rate`, resampled from the graph's rate; ValueError naming `name` for anything else."""
    pcm, source = media.carried_pcm16(summarize(value, media=True), name)
    if source == rate or not pcm:
        return pcm
    import numpy  # (flowrt.media resamples with it)

    samples = numpy.frombuffer(pcm, dtype="<i2").astype(numpy.float32) / 32768.0
    return media.pcm16(media.resample(samples, source, rate))


def event(kind: str, **fields: Any) -> str:
    """One server event as the text of a message, with an `event_id` of its own."""
    return json_text({"type": kind, "event_id": new_id("event"), **fields}, ascii=True)  # (a lone surrogate is escaped)


def error_event(error: RealtimeError) -> str:
    return event("error", error=error.body())


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"
