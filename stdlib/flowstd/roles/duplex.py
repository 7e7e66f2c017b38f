"""The roles of lib/duplex.flow that lib/voice.flow has not got: the end-of-turn detector that
turns a stream of audio chunks into the user's turn (docs/stdlib.md, "The `duplex` module").

    EndOfTurn.listen       audio_in (one chunk per activation, in order: `lb session`) -> once
                           the call's first utterance has ended, stream heard_audio (the
                           utterance as one clip) then heard_prompt (the turn's layout, as
                           voice's Frontend gives it)
    HeardEncoder.encode    heard_audio -> heard_emb: voice's AudioEncoderRole, under the names
                           of this module's fields
    DuplexThinker.respond  join {heard_prompt: 1, heard_emb: 1} -> stream reply, spoken, turn:
                           voice's Thinker on the first utterance (voice's `talker` speaks
                           `spoken`)

The fields are the module's own (voice's roles do not hear them), so one bundle may serve a
voice graph and a duplex graph side by side.

The detection is by energy, which needs no model and decides within one chunk: the audio is cut
into FRAME_MS frames; a frame whose RMS reaches `threshold` is speech. An utterance starts once
MIN_SPEECH_MS of speech frames have come, and ends after SILENCE_MS of frames without speech (or
once it is MAX_TURN_S long). The clip is the utterance from PAD_MS before its first speech frame
to PAD_MS after its last. A call is one user turn: chunks after its utterance are heard and
dropped, and a call whose input ends in the middle of speech gives no turn, so a client that
stops sending sends `closing_silence()` first (the Realtime endpoint's commit does).

What a call has heard so far lives in the detector's replica, keyed by the session and call (the
`lb session` replica sees all of a session's chunks, in order); at most MAX_CALLS calls are held,
the oldest dropped, so calls cancelled mid-input leave nothing behind for long.
"""

from __future__ import annotations

import base64
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from flowrt.errors import BadInput
from flowstd.roles.voice import SAMPLE_RATE, AudioClip, AudioEncoderRole, Thinker, VoiceRuntime

FRAME_MS = 20  # the detector's unit of decision
THRESHOLD = 0.02  # RMS (full scale 1.0) from which a frame is speech: about -34 dBFS
MIN_SPEECH_MS = 100  # speech shorter than this (a click, a cough) starts no utterance
SILENCE_MS = 300  # this long without speech ends the utterance: the user's turn is over
PAD_MS = 100  # kept on either side of the speech, so its onset and tail are not cut
MAX_TURN_S = 30.0  # an utterance this long ends, silence or not
MAX_CALLS = 256  # calls whose audio a replica holds at once
DEFAULT_MAX_TOKENS = 24  # the reply's budget (voice's default)

FRAME = SAMPLE_RATE * FRAME_MS // 1000  # samples per frame


class DuplexInputError(BadInput):
    """An audio chunk the detector cannot read."""


def chunk_pcm16(chunk: Any) -> bytes:
    """A chunk of `audio_in` as mono PCM16 at SAMPLE_RATE: raw little-endian int16 bytes (what
    a WebSocket binary message carries), or {"format": "pcm16", "data": base64 or bytes,
    "sample_rate": Hz (default 16000)}, or {"samples": [floats in -1..1], "sample_rate": Hz}."""
    if isinstance(chunk, bytes | bytearray | memoryview):
        pcm, rate = bytes(chunk), SAMPLE_RATE
    elif isinstance(chunk, dict):
        rate = chunk.get("sample_rate", SAMPLE_RATE)
        if not isinstance(rate, int) or isinstance(rate, bool) or rate < 1:
            raise DuplexInputError(f"an audio chunk's `sample_rate` is a whole number of Hz, not {rate!r}")
        if "samples" in chunk:
            pcm = _samples_pcm16(chunk["samples"])
        elif chunk.get("format", "pcm16") == "pcm16" and "data" in chunk:
            pcm = _data_bytes(chunk["data"])
        else:
            raise DuplexInputError(
                'an audio chunk is raw PCM16 bytes, {"format": "pcm16", "data": base64} or {"samples": [...]}; '
                f"got an object with {', '.join(sorted(map(str, chunk))) or 'no keys'}"
            )
    else:
        raise DuplexInputError(
            f'an audio chunk is raw PCM16 bytes or an object such as {{"format": "pcm16", "data": base64}}, not {type(chunk).__name__}'
        )
    if len(pcm) % 2:
        raise DuplexInputError(f"an audio chunk of {len(pcm)} bytes is not whole int16 samples (2 bytes each)")
    if rate != SAMPLE_RATE:
        from flowrt import media
        from flowstd.roles.voice import _floats

        pcm = media.pcm16(media.resample(_floats(pcm), rate, SAMPLE_RATE))
    return pcm


def _data_bytes(data: Any) -> bytes:
    if isinstance(data, bytes | bytearray):
        return bytes(data)
    if isinstance(data, str):
        try:
            return base64.b64decode(data, validate=True)
        except ValueError:
            raise DuplexInputError("an audio chunk's `data` is not base64 of PCM16 samples") from None
    raise DuplexInputError(f"an audio chunk's `data` is base64 text or bytes, not {type(data).__name__}")


def _samples_pcm16(values: Any) -> bytes:
    import array

    if not isinstance(values, list) or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise DuplexInputError("an audio chunk's `samples` is a list of numbers in -1..1")
    return array.array("h", (max(-32768, min(32767, round(v * 32767))) for v in values)).tobytes()


def closing_silence(milliseconds: int = SILENCE_MS + FRAME_MS) -> bytes:
    """PCM16 silence long enough to end an utterance: what a client sends before it ends the input."""
    return bytes(2 * (SAMPLE_RATE * milliseconds // 1000))


def frame_rms(pcm: bytes) -> float:
    """The RMS of PCM16 samples, full scale 1.0."""
    import array

    samples = array.array("h")
    samples.frombytes(pcm)
    if not samples:
        return 0.0
    return math.sqrt(sum(s * s for s in samples) / len(samples)) / 32768.0


@dataclass
class TurnDetector:
    """One call's utterance, found frame by frame (the rules are the module's). `feed` returns
    the utterance's PCM16 once it has ended, then None for ever after (`done`)."""

    threshold: float = THRESHOLD
    min_speech_frames: int = MIN_SPEECH_MS // FRAME_MS
    silence_frames: int = SILENCE_MS // FRAME_MS
    pad_frames: int = PAD_MS // FRAME_MS
    max_frames: int = int(MAX_TURN_S * 1000) // FRAME_MS
    frames: list[bytes] = field(default_factory=list)  # since PAD before the first speech frame
    pending: bytes = b""  # less than a frame, waiting for the next chunk
    speech_run: int = 0  # consecutive speech frames (before the utterance started)
    started: int | None = None  # index in `frames` of the utterance's first speech frame
    last_speech: int = -1  # index in `frames` of the latest speech frame
    done: bool = False

    def feed(self, pcm: bytes) -> bytes | None:
        if self.done:
            return None
        data = self.pending + pcm
        whole = len(data) - len(data) % (2 * FRAME)
        self.pending = data[whole:]
        for start in range(0, whole, 2 * FRAME):
            utterance = self._frame(data[start : start + 2 * FRAME])
            if utterance is not None:
                self.done, self.frames, self.pending = True, [], b""
                return utterance
        return None

    def _frame(self, frame: bytes) -> bytes | None:
        speech = frame_rms(frame) >= self.threshold
        self.frames.append(frame)
        here = len(self.frames) - 1
        if self.started is None:
            self.speech_run = self.speech_run + 1 if speech else 0
            if self.speech_run >= self.min_speech_frames:
                self.started, self.last_speech = here - self.speech_run + 1, here
            else:  # (keep only what the pad before a future utterance needs)
                keep = self.pad_frames + self.speech_run
                del self.frames[: max(0, len(self.frames) - keep)]
            return None
        if speech:
            self.last_speech = here
        ended = here - self.last_speech >= self.silence_frames
        if ended or here - self.started + 1 >= self.max_frames:
            first = max(0, self.started - self.pad_frames)
            last = min(len(self.frames), self.last_speech + 1 + self.pad_frames)
            return b"".join(self.frames[first:last])
        return None


class EndOfTurn:
    """`listen`: see the module. `threshold`, `silence_ms` and `max_tokens` may be changed on a
    subclass (a role's `impl` names it)."""

    threshold = THRESHOLD
    silence_ms = SILENCE_MS
    max_tokens = DEFAULT_MAX_TOKENS
    prompt_field, audio_field = "heard_prompt", "heard_audio"

    async def setup(self, ctx) -> None:
        self.tokenizer = VoiceRuntime.shared().tokenizer
        self.calls: OrderedDict[tuple[str, int], TurnDetector] = OrderedDict()

    def statistics(self) -> dict[str, int]:
        return {"calls_held": len(self.calls)}

    async def listen(self, ctx, audio_in):
        key = (ctx.session, ctx.call_id)
        detector = self.calls.get(key)
        if detector is None:
            detector = self.calls[key] = TurnDetector(self.threshold, silence_frames=self.silence_ms // FRAME_MS)
            while len(self.calls) > MAX_CALLS:
                self.calls.popitem(last=False)
        utterance = detector.feed(chunk_pcm16(audio_in))
        if utterance is None:
            return
        yield {self.audio_field: AudioClip(0, utterance)}
        special = self.tokenizer.special_ids
        parts = [
            {"text": [special["<|user|>"]]},
            {"audio": 0},
            {"text": [special["<|eos|>"], special["<|assistant|>"]]},
        ]
        yield {self.prompt_field: {"parts": parts, "clips": 1, "step": None, "max_tokens": self.max_tokens}}


class HeardEncoder(AudioEncoderRole):
    async def encode(self, ctx, heard_audio):
        encoded = await super().encode(ctx, heard_audio)
        return {"heard_emb": encoded["audio_emb"]}


class DuplexThinker(Thinker):
    async def respond(self, ctx, heard_prompt, heard_emb):
        async for frame in self.think(ctx, heard_prompt, heard_emb, ()):
            yield frame
