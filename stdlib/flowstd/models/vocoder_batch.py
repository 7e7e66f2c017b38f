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

import asyncio
from dataclasses import dataclass, field
from typing import Any

import torch

from flowstd.models.vocoder import BlockWindow, Vocoder

SETTLE_TURNS = 8  # at most this many turns of the loop for the other callers to ask


@dataclass
class BatcherStats:
    rounds: int = 0  # rounds run
    forwards: int = 0  # vocoder forwards (one per window length in a round)
    blocks: int = 0  # blocks synthesized
    largest_forward: int = 0  # blocks in the largest forward
    dropped: int = 0  # callers cancelled before their round


@dataclass
class _Asked:
    windows: list[BlockWindow]
    future: asyncio.Future
    pieces: list[Any] = field(default_factory=list)


class VocoderBatcher:
    def __init__(self, vocoder: Vocoder) -> None:
        self.vocoder = vocoder
        self.stats = BatcherStats()
        self._asked: list[_Asked] = []
        self._runner: asyncio.Task | None = None

    async def synthesize(self, windows: list[BlockWindow]) -> torch.Tensor:
        """The samples of `windows`' blocks, in order (empty for no windows)."""
        if not windows:
            return torch.zeros(0, device=self.vocoder.device)
        loop = asyncio.get_running_loop()
        asked = _Asked(list(windows), loop.create_future())
        self._asked.append(asked)
        if self._runner is None or self._runner.done():
            self._runner = loop.create_task(self._run(), name="flowstd-vocoder-batcher")
        return await asked.future

    async def _run(self) -> None:
        try:
            while self._asked:
                for _ in range(SETTLE_TURNS):
                    count = len(self._asked)
                    await asyncio.sleep(0)
                    if len(self._asked) == count:
                        break
                batch, self._asked = self._asked, []
                live = [asked for asked in batch if not asked.future.done()]
                self.stats.dropped += len(batch) - len(live)
                try:
                    self._round(live)
                except Exception as error:  # (a model whose output is not (batch, samples)): this round's callers fail
                    _fail(live, RuntimeError(f"the vocoder batcher could not synthesize these blocks ({error!r})"))
        except BaseException as error:  # the loop is closing (or a bug): no caller is left waiting
            _fail(self._asked, RuntimeError(f"the vocoder batcher stopped before these blocks ran ({error!r})"))
            self._asked.clear()
            raise

    def _round(self, batch: list[_Asked]) -> None:
        if not batch:
            return
        self.stats.rounds += 1
        by_length: dict[int, list[tuple[_Asked, int]]] = {}
        for asked in batch:
            asked.pieces = [None] * len(asked.windows)
            for index, window in enumerate(asked.windows):
                by_length.setdefault(window.frames.shape[0], []).append((asked, index))
        failed: dict[int, BaseException] = {}
        for members in by_length.values():
            try:
                self._forward(members)
            except Exception:  # find the window at fault: each alone
                for member in members:
                    try:
                        self._forward([member])
                    except Exception as error:
                        failed[id(member[0])] = error
        for asked in batch:
            if asked.future.done():
                continue
            if id(asked) in failed:
                asked.future.set_exception(failed[id(asked)])
            else:
                asked.future.set_result(torch.cat(asked.pieces))

    @torch.inference_mode()
    def _forward(self, members: list[tuple[_Asked, int]]) -> None:
        windows = [asked.windows[index] for asked, index in members]
        frames = windows[0].frames[None] if len(windows) == 1 else torch.stack([window.frames for window in windows])
        samples = self.vocoder(frames)
        for row, ((asked, index), window) in enumerate(zip(members, windows, strict=True)):
            asked.pieces[index] = samples[row][window.start : window.stop]
        self.stats.forwards += 1
        self.stats.blocks += len(windows)
        self.stats.largest_forward = max(self.stats.largest_forward, len(windows))

    def statistics(self) -> dict[str, int]:
        return {**vars(self.stats), "waiting": len(self._asked)}


def _fail(asked: list[_Asked], error: BaseException) -> None:
    for each in asked:
        if not each.future.done():
            each.future.set_exception(error)
