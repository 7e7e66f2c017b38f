"""Vocoder blocks of concurrent streams synthesized together: the talker of several replies at
once (flowstd.roles.voice) runs one forward per round instead of one per block.

`VocoderBatcher(vocoder).synthesize(windows)` takes the windows a `VocoderStream` handed out
(`stream.windows(chunk)`, `stream.final_windows()`) and returns their samples, one block after
another, as `Vocoder.synthesize_windows` would. The blocks of every caller that asked while the
event loop was busy elsewhere (a few turns of the loop, no timer, as flowrt's ContinuousBatcher)
run in one round: windows of the same length as one batched forward, a window alone as a forward
of its own. A window alone in its forward gives exactly `synthesize`'s samples; one in a batch
gives them to within float rounding (PyTorch's CPU convolutions round differently for different
batch sizes), which PCM16 output all but always hides.

One event loop; the forward runs on it (as the role's code does), so a caller cannot be
cancelled while its blocks are in the model: one cancelled before its round is dropped. A round
whose batched forward raises runs each window alone, so a bad window fails only its caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from flowstd.models.rounds import Asked, LoopRounds
from flowstd.models.vocoder import BlockWindow, Vocoder


@dataclass
class ForwardCounters:
    forwards: int = 0  # vocoder forwards (one per window length in a round)
    blocks: int = 0  # blocks synthesized
    largest_forward: int = 0  # blocks in the largest forward


class VocoderBatcher:
    def __init__(self, vocoder: Vocoder) -> None:
        self.vocoder = vocoder
        self.counters = ForwardCounters()
        self.rounds: LoopRounds[list[BlockWindow]] = LoopRounds(self._round, name="vocoder batcher")

    async def synthesize(self, windows: list[BlockWindow]) -> torch.Tensor:
        """The samples of `windows`' blocks, in order (empty for no windows)."""
        if not windows:
            return torch.zeros(0, device=self.vocoder.device)
        return await self.rounds.ask(list(windows))

    def _round(self, batch: list[Asked[list[BlockWindow]]]) -> None:
        pieces: dict[int, list[Any]] = {id(asked): [None] * len(asked.item) for asked in batch}
        by_length: dict[int, list[tuple[Asked, int]]] = {}
        for asked in batch:
            for index, window in enumerate(asked.item):
                by_length.setdefault(window.frames.shape[0], []).append((asked, index))
        failed: dict[int, BaseException] = {}
        for members in by_length.values():
            try:
                self._forward(members, pieces)
            except Exception:  # find the window at fault: each alone
                for member in members:
                    try:
                        self._forward([member], pieces)
                    except Exception as error:
                        failed[id(member[0])] = error
        for asked in batch:
            if id(asked) in failed:
                asked.future.set_exception(failed[id(asked)])
            else:
                try:
                    asked.future.set_result(torch.cat(pieces[id(asked)]))
                except Exception as error:  # (a model whose output is not (batch, samples))
                    asked.future.set_exception(RuntimeError(f"the vocoder batcher could not synthesize these blocks ({error!r})"))

    @torch.inference_mode()
    def _forward(self, members: list[tuple[Asked, int]], pieces: dict[int, list[Any]]) -> None:
        windows = [asked.item[index] for asked, index in members]
        frames = windows[0].frames[None] if len(windows) == 1 else torch.stack([window.frames for window in windows])
        samples = self.vocoder(frames)
        for row, ((asked, index), window) in enumerate(zip(members, windows, strict=True)):
            pieces[id(asked)][index] = samples[row][window.start : window.stop]
        self.counters.forwards += 1
        self.counters.blocks += len(windows)
        self.counters.largest_forward = max(self.counters.largest_forward, len(windows))

    def statistics(self) -> dict[str, int]:
        return {**self.rounds.statistics(), **vars(self.counters)}
