"""Audio clips of concurrent requests encoded together: the audio encoder role of several turns at
once (flowstd.roles.voice) runs one forward per round instead of one per clip.

`AudioEncoderBatcher(encoder).encode(waveform)` returns what `encoder.encode(waveform)` would.
The clips of every caller that asked while the event loop was busy elsewhere (flowstd.models.rounds)
go through `AudioEncoder.encode_many` in one forward, padded to the longest and the padding
masked: a clip alone in its round gets exactly `encode`'s rows, one among others gets them to
within float rounding. A round whose batched forward raises runs each clip alone, so a bad clip
(too short, not finite) fails only its caller, with `encode`'s own error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from flowstd.models.audio import AudioEncoder
from flowstd.models.rounds import Asked, LoopRounds


@dataclass
class EncodeCounters:
    forwards: int = 0  # encoder forwards (one per round, or one per clip where a round failed)
    clips: int = 0  # clips encoded
    largest_forward: int = 0  # clips in the largest forward


class AudioEncoderBatcher:
    def __init__(self, encoder: AudioEncoder) -> None:
        self.encoder = encoder
        self.counters = EncodeCounters()
        self.rounds: LoopRounds[Any] = LoopRounds(self._round, name="audio encoder batcher")

    async def encode(self, waveform: Any) -> torch.Tensor:
        """(frames, output_width): the clip's encoder rows."""
        return await self.rounds.ask(waveform)

    def _round(self, batch: list[Asked[Any]]) -> None:
        try:
            rows = self._forward([asked.item for asked in batch])
        except Exception:  # find the clip at fault: each alone
            for asked in batch:
                try:
                    asked.future.set_result(self._forward([asked.item])[0])
                except Exception as error:
                    asked.future.set_exception(error)
            return
        for asked, each in zip(batch, rows, strict=True):
            asked.future.set_result(each)

    def _forward(self, waveforms: list[Any]) -> list[torch.Tensor]:
        rows = self.encoder.encode_many(waveforms)
        self.counters.forwards += 1
        self.counters.clips += len(waveforms)
        self.counters.largest_forward = max(self.counters.largest_forward, len(waveforms))
        return rows

    def statistics(self) -> dict[str, int]:
        return {**self.rounds.statistics(), **vars(self.counters)}
