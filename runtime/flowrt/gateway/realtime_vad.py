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

Imports nothing of the gateway: the connection (flowrt.gateway.realtime) feeds it and acts on
what it finds.
"""

from __future__ import annotations

import array
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
            raise refuse(place, 'must be null or an object such as {"type": "server_vad"}')
        kind = value.get("type", "server_vad")
        if kind != "server_vad":
            told = "semantic_vad needs a model of speech this endpoint does not have" if kind == "semantic_vad" else ""
            raise refuse(
                f"{place}.type", f'must be "server_vad" (an energy detector), not {kind!r}. {told}'.strip(), "unsupported_field"
            )
        fields: dict[str, Any] = {}
        for key, setting in value.items():
            where = f"{place}.{key}"
            if key == "type" or setting is None:
                continue
            if key == "threshold":
                if isinstance(setting, bool) or not isinstance(setting, int | float) or not 0 <= setting <= 1:
                    raise refuse(where, f"is a number from 0 to 1, not {setting!r}")
            elif key in ("prefix_padding_ms", "silence_duration_ms"):
                low, high = (0, 5000) if key == "prefix_padding_ms" else (FRAME_MS, 10000)
                if isinstance(setting, bool) or not isinstance(setting, int) or not low <= setting <= high:
                    raise refuse(where, f"is a whole number of milliseconds from {low} to {high}, not {setting!r}")
            elif key in ("create_response", "interrupt_response"):
                if not isinstance(setting, bool):
                    raise refuse(where, f"is true or false, not {setting!r}")
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
        self.frames = 0  # whole frames heard
        self.speaking = False
        self.silent = 0  # frames without speech since the last speech frame
        self.last_speech = 0  # the frame after the last speech frame

    def feed(self, pcm: bytes) -> list[tuple[str, int]]:
        """("started", audio_start_ms) and ("stopped", audio_end_ms) found in `pcm`, in order."""
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

    @property
    def heard_ms(self) -> int:
        return self.frames * FRAME_MS


def _rms(frame: bytes) -> float:
    samples = array.array("h", frame)
    if sys.byteorder != "little":
        samples.byteswap()
    return math.sqrt(sum(v * v for v in samples) / len(samples)) / 32768.0
