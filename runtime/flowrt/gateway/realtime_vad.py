"""Server voice activity detection for /v1/realtime (docs/openai.md, "Realtime"): a session that
sets `turn_detection: {"type": "server_vad", ...}` lets the server find where the user's turns
begin and end in the audio it appends, as OpenAI's server VAD does.

`TurnDetection` is the setting, checked at the edge: `threshold` (0 to 1, default 0.5),
`prefix_padding_ms` (0 to 5000, default 300), `silence_duration_ms` (20 to 10000, default 500),
`create_response` and `interrupt_response` (default true). `semantic_vad` is refused by name.

`EnergyDetector` is the detector: PCM16 cut into 20 ms frames; a frame is speech when its RMS
reaches `threshold` x 0.04 of full scale (0.5: 0.02, about -34 dBFS, the level flowstd's
end-of-turn detector uses); speech starts at the first speech frame and stops once
`silence_duration_ms` of frames in a row are not speech. It says when, in milliseconds of all the
audio the session appended (`audio_start_ms`, `audio_end_ms`). An energy detector, not a model:
loud noise counts as speech.

`ServerVad` is a connection's use of it: the audio before the speech is kept as padding (its
last `prefix_padding_ms`, to the sample); at the start of the speech the turn opens with that
padding and a running reply is barged in on (`interrupt_response`); the audio then goes to the
turn up to the moment the silence decided the stop, and the turn is committed and answered
(`create_response`; with `interrupt_response` false and a reply still running, answered once
that reply is done). Times are of all the audio the connection appended, across changes of the
setting.

Imports nothing of the gateway: the connection (flowrt.gateway.realtime) feeds it, and it acts
through the connection's methods.
"""

from __future__ import annotations

import array
import base64
import json
import math
import sys
from dataclasses import asdict, dataclass
from typing import Any

FRAME_MS = 20
FULL_SCALE_LEVEL = 0.04  # the RMS (full scale 1.0) a threshold of 1.0 asks for
FIELDS = ("type", "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response", "interrupt_response")


@dataclass(frozen=True)
class TurnDetection:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True

    @classmethod
    def parse(cls, value: Any, refuse: Any, place: str) -> TurnDetection | None:
        """The setting `value` asks for (None: the client ends each turn); `refuse(place, message,
        code)` makes the error naming the first field that does not fit."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise refuse(place, f'must be null or an object such as {{"type": "server_vad"}}, not {_shown(value)}')
        kind = value.get("type", "server_vad")
        if kind == "semantic_vad":
            told = 'must be "server_vad" (an energy detector): semantic_vad needs a model of speech this endpoint does not have'
            raise refuse(f"{place}.type", told, "unsupported_field")
        if kind != "server_vad":
            raise refuse(f"{place}.type", f'must be "server_vad", not {_shown(kind)}')
        fields: dict[str, Any] = {}
        for key, setting in value.items():
            where = f"{place}.{key}"
            if key == "type" or setting is None:
                continue
            if key == "threshold":
                if isinstance(setting, bool) or not isinstance(setting, int | float) or not 0 < setting <= 1:
                    raise refuse(where, f"is a number above 0 and at most 1, not {_shown(setting)}")
            elif key in ("prefix_padding_ms", "silence_duration_ms"):
                low, high = (0, 5000) if key == "prefix_padding_ms" else (FRAME_MS, 10000)
                if isinstance(setting, bool) or not isinstance(setting, int) or not low <= setting <= high:
                    raise refuse(where, f"is a whole number of milliseconds from {low} to {high}, not {_shown(setting)}")
            elif key in ("create_response", "interrupt_response"):
                if not isinstance(setting, bool):
                    raise refuse(where, f"is true or false, not {_shown(setting)}")
            else:
                raise refuse(where, f"is not supported (server_vad takes {', '.join(FIELDS[1:])})", "unsupported_field")
            fields[key] = setting
        return cls(**fields)

    def shown(self) -> dict[str, Any]:
        return {"type": "server_vad", **asdict(self)}


class EnergyDetector:
    """Where speech starts and stops in a stream of PCM16 at `rate` Hz (see the module docstring)."""

    def __init__(self, detection: TurnDetection, rate: int):
        self.detection = detection
        self.frame_bytes = 2 * rate * FRAME_MS // 1000
        self.level = detection.threshold * FULL_SCALE_LEVEL
        self.rest = b""  # a part frame, until the next append completes it
        self.fed = 0  # bytes fed
        self.frames = 0  # whole frames heard
        self.speaking = False
        self.silent = 0  # frames without speech since the last speech frame
        self.last_speech = 0  # the frame after the last speech frame

    def feed(self, pcm: bytes) -> list[tuple[str, int]]:
        """("started", audio_start_ms) and ("stopped", audio_end_ms) found in `pcm`, in order."""
        self.fed += len(pcm)
        data = self.rest + pcm
        whole = len(data) - len(data) % self.frame_bytes
        self.rest = data[whole:]
        found: list[tuple[str, int]] = []
        silence = self.detection.silence_duration_ms // FRAME_MS
        for start in range(0, whole, self.frame_bytes):
            loud = _rms(data[start : start + self.frame_bytes]) >= self.level
            self.frames += 1
            if loud:
                if not self.speaking:
                    self.speaking = True
                    found.append(("started", (self.frames - 1) * FRAME_MS))
                self.silent, self.last_speech = 0, self.frames
            elif self.speaking:
                self.silent += 1
                if self.silent >= silence:
                    self.speaking = False
                    found.append(("stopped", self.last_speech * FRAME_MS))
        return found


class ServerVad:
    """A connection's server VAD (see the module docstring); `connection` is its
    flowrt.gateway.realtime `Connection`."""

    def __init__(self, connection: Any, detection: TurnDetection, rate: int, offset_ms: int):
        self.connection, self.detection, self.rate = connection, detection, rate
        self.detector = EnergyDetector(detection, rate)
        self.offset_ms = offset_ms  # the audio the connection appended before this setting
        self.padding = bytearray()  # the audio before the speech, its last prefix_padding_ms
        self.padding_most = 2 * (rate * detection.prefix_padding_ms // 1000)

    async def append(self, event_id: str | None, data: bytes) -> None:
        connection = self.connection
        if connection.input is not None:
            connection.check_room(connection.input, event_id, len(data))  # (before the detector hears it)
        base = self.detector.fed
        placed = 0  # bytes of `data` that went to the turn or the padding
        for kind, ms in self.detector.feed(data):
            if kind == "started":
                upto = min(len(data), max(placed, self._bytes(ms) - base))
                self._keep(data[placed:upto])
                placed = upto
                await self._started(event_id, ms)
            elif connection.input is not None:  # the audio up to the frame that decided the stop is the turn's
                upto = min(len(data), max(placed, self._bytes(ms + self.detection.silence_duration_ms) - base))
                self._feed(event_id, data[placed:upto])
                placed = upto
                await self._stopped(event_id, ms)
        if connection.input is not None:
            self._feed(event_id, data[placed:])
        else:
            self._keep(data[placed:])

    def _bytes(self, ms: int) -> int:
        return 2 * (self.rate * ms // 1000)

    def _keep(self, pcm: bytes) -> None:
        self.padding += pcm
        if len(self.padding) > self.padding_most:
            del self.padding[: len(self.padding) - self.padding_most]

    def _feed(self, event_id: str | None, pcm: bytes) -> None:
        if pcm:
            frame = {"format": "pcm16", "data": base64.b64encode(pcm).decode("ascii"), "sample_rate": self.rate}
            self.connection.feed_input(event_id, frame, len(pcm))

    async def _started(self, event_id: str | None, ms: int) -> None:
        connection = self.connection
        turn = connection.input or connection.new_input(event_id)
        self._feed(event_id, bytes(self.padding))
        self.padding.clear()
        await connection.tell("input_audio_buffer.speech_started", audio_start_ms=self.offset_ms + ms, item_id=turn.item_id)
        running = connection.responding()
        if running is not None and self.detection.interrupt_response:
            await connection.barge_in(running, turn)

    async def _stopped(self, event_id: str | None, ms: int) -> None:
        connection = self.connection
        item = connection.input.item_id
        await connection.tell("input_audio_buffer.speech_stopped", audio_end_ms=self.offset_ms + ms, item_id=item)
        running = connection.responding()
        if not self.detection.create_response:
            await connection.commit(event_id)
        elif running is None or self.detection.interrupt_response:
            await connection.respond(event_id)
        else:  # a reply still plays and is not to be interrupted: this turn is answered after it
            connection.respond_after(running, await connection.commit(event_id))


def _shown(value: Any) -> str:
    try:
        return json.dumps(value)[:60]
    except (TypeError, ValueError):
        return type(value).__name__


def _rms(frame: bytes) -> float:
    samples = array.array("h", frame)
    if sys.byteorder != "little":
        samples.byteswap()
    return math.sqrt(sum(v * v for v in samples) / len(samples)) / 32768.0
