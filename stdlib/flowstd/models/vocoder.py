"""The vocoder: a tiny HiFi-GAN-shaped generator. Features (frames, in_channels) (log-mel frames,
or an LLM's hidden states) go through a 1-D conv, then per upsample rate a LeakyReLU, a
transposed conv and a residual block of dilated convs, then a conv to one channel and tanh:
(frames * hop_length,) samples in [-1, 1]. The last role of a speech-out pipeline.

Blocks and streaming. Every layer is a same-padded convolution, so the samples of frame t depend
only on input frames t - C .. t + C, C = `context_frames` (the receptive field, derived from the
config: 7 frames by default). Both `synthesize` and a stream cut the frames into blocks of
B = `block_frames` (32): block k holds frames [kB, (k+1)B) (the last one fewer) and is computed
alone from the window [kB - C, (k+1)B + C), cut at the sequence's ends, where the whole sequence
would be zero-padded the same way; only the block's own samples are kept. A stream computes
block k once frame (k+1)B + C - 1 has arrived (its window is then complete, whatever comes after)
and the rest at `finish`, so a frame's samples come out at most B + C - 1 frames after it. Both
paths run the same windows through the same layers, so the concatenation of a stream's pieces is
bit-identical to `synthesize` (blocks, rather than windows cut where chunks happened to end:
PyTorch's CPU convolutions round differently for inputs of different lengths). A stream's
`windows` and `final_windows` hand out the due blocks' windows without running them, for
flowstd.models.vocoder_batch to run several streams' together.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from flowstd.models.common import (
    ModelConfig,
    ModelConfigError,
    ModelInputError,
    SeededModel,
    Shape,
    as_tensor,
    require_finite,
    shape_text,
)

LEAK = 0.1  # HiFi-GAN's LeakyReLU slope


class BlockWindow(NamedTuple):
    """A block's window of frames (frames, in_channels) and the block's samples in its output."""

    frames: torch.Tensor
    start: int
    stop: int

    @property
    def samples(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, kw_only=True)
class VocoderConfig(ModelConfig):
    in_channels: int = 80  # log-mel bands (AudioEncoderConfig.n_mels), or an LLM's hidden size
    sample_rate: int = 16000  # what the waveform means; with the rates below, 100 frames a second
    upsample_rates: tuple[int, ...] = (5, 4, 4, 2)  # their product is hop_length (AudioEncoderConfig's 160)
    initial_channels: int = 128  # halved after every upsample
    dilations: tuple[int, ...] = (1, 3)  # of each residual block's kernel-3 convs
    block_frames: int = 32  # the unit of synthesis, whole or streamed (see the module's docstring)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._require_positive("in_channels", "sample_rate", "initial_channels", "block_frames")
        for name in ("upsample_rates", "dilations"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not value or not all(isinstance(v, int) and v > 0 for v in value):
                raise ModelConfigError(f"VocoderConfig.{name} must be a non-empty tuple of positive ints, not {value!r}")
        if self.initial_channels % 2 ** len(self.upsample_rates):
            raise ModelConfigError(
                f"VocoderConfig.initial_channels ({self.initial_channels}) must be a multiple of "
                f"{2 ** len(self.upsample_rates)}: it is halved after each of the {len(self.upsample_rates)} upsamples"
            )

    @property
    def hop_length(self) -> int:
        return math.prod(self.upsample_rates)

    @property
    def context_frames(self) -> int:
        """The receptive field in frames, each side. A sample x at a layer with u samples per frame
        sits at time x / u frames; a conv of reach h (samples) moves that time by at most h / u,
        a transposed conv of rate r by 2 / u of its input (|input - output / r| <= 2 samples). The
        sum of these, rounded up, bounds how many frames apart an output and its inputs can be."""
        reach, per_frame = Fraction(3), 1  # conv_pre: kernel 7
        for rate in self.upsample_rates:
            reach += Fraction(2, per_frame)
            per_frame *= rate
            reach += sum(Fraction(dilation, per_frame) for dilation in self.dilations)
        return math.ceil(reach + Fraction(3, per_frame))  # conv_post: kernel 7


class ResidualBlock(nn.Module):
    def __init__(self, width: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(width, width, 3, dilation=d, padding=d) for d in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = x + conv(F.leaky_relu(x, LEAK))
        return x


def _transposed(width_in: int, width_out: int, rate: int) -> nn.ConvTranspose1d:
    # stride r, kernel 2r (2r + 1 for odd r) and padding (r + 1) // 2: T frames give exactly T * r samples
    return nn.ConvTranspose1d(width_in, width_out, 2 * rate + rate % 2, stride=rate, padding=(rate + 1) // 2)


class Vocoder(SeededModel):
    """features (frames, in_channels) -> waveform (frames * hop_length,) float32 in [-1, 1]."""

    model_name = "vocoder"
    config_type = VocoderConfig

    def __init__(self, config: VocoderConfig | None = None) -> None:
        super().__init__(config)
        config = self.config
        width = config.initial_channels
        with self.seeded_weights():
            self.conv_pre = nn.Conv1d(config.in_channels, width, 7, padding=3)
            self.upsamples = nn.ModuleList()
            self.blocks = nn.ModuleList()
            for rate in config.upsample_rates:
                self.upsamples.append(_transposed(width, width // 2, rate))
                width //= 2
                self.blocks.append(ResidualBlock(width, config.dilations))
            self.conv_post = nn.Conv1d(width, 1, 7, padding=3)

    @property
    def hop_length(self) -> int:
        return self.config.hop_length

    @property
    def context_frames(self) -> int:
        return self.config.context_frames

    def samples_for(self, frames: int) -> int:
        return frames * self.config.hop_length

    def features_to_tensor(self, features: Any, *, allow_empty: bool = False) -> torch.Tensor:
        """float32 (frames, in_channels) on the model's device, or a ModelInputError."""
        channels = self.config.in_channels
        expected = f"float features (frames, {channels}) (time first)"
        features = as_tensor(features, "the vocoder's input", expected)
        if not features.is_floating_point() or features.dim() != 2 or features.shape[1] != channels:
            hint = " (transposed? it takes time first)" if features.dim() == 2 and features.shape[0] == channels else ""
            raise ModelInputError(f"the vocoder takes {expected}; got {shape_text(features)}{hint}")
        if features.shape[0] == 0 and not allow_empty:
            raise ModelInputError(f"the vocoder takes at least one frame; got {shape_text(features)}")
        require_finite(features, "the vocoder's input")
        return features.to(self.device, torch.float32)

    @torch.inference_mode()
    def synthesize(self, features: Any) -> torch.Tensor:
        """The whole waveform (frames * hop_length,) float32 in [-1, 1] of features (frames, in_channels)."""
        features = self.features_to_tensor(features)
        total = features.shape[0]
        blocks = range(-(-total // self.config.block_frames))
        return torch.cat([self.synthesize_block(features, 0, block, total) for block in blocks])

    def synthesize_block(self, frames: torch.Tensor, first: int, block: int, total: int) -> torch.Tensor:
        """The samples of block `block` of a sequence of `total` frames; `frames` holds frames
        [first, ...) of it, at least the block's window (see the module's docstring)."""
        return self.synthesize_windows([self.block_window(frames, first, block, total)])

    def block_window(self, frames: torch.Tensor, first: int, block: int, total: int) -> BlockWindow:
        """Block `block`'s window of frames and which of its samples are the block's."""
        size, context, hop = self.config.block_frames, self.config.context_frames, self.config.hop_length
        begin, end = block * size, min((block + 1) * size, total)
        window_begin, window_end = max(0, begin - context), min(total, end + context)
        window = frames[window_begin - first : window_end - first]
        return BlockWindow(window, (begin - window_begin) * hop, (end - window_begin) * hop)

    @torch.inference_mode()
    def synthesize_windows(self, windows: list[BlockWindow]) -> torch.Tensor:
        """The samples of `windows`' blocks, one after another, each window run alone."""
        pieces = [self(window.frames[None])[0][window.start : window.stop] for window in windows]
        return torch.cat(pieces) if pieces else torch.zeros(0, device=self.device)

    def stream(self) -> VocoderStream:
        """A stream: `push` chunks of frames, then `finish`; the pieces concatenate to `synthesize`."""
        return VocoderStream(self)

    def synthesize_chunks(self, chunks: Iterable[Any]) -> Iterator[torch.Tensor]:
        """The waveform pieces of a stream fed `chunks` in order (empty pieces skipped)."""
        stream = self.stream()
        for chunk in chunks:
            piece = stream.push(chunk)
            if piece.numel():
                yield piece
        piece = stream.finish()
        if piece.numel():
            yield piece

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(batch, frames, in_channels) -> (batch, frames * hop_length) in one pass, without
        blocks or input checks: equal to `synthesize` up to float rounding, not bit for bit."""
        x = self.conv_pre(features.transpose(1, 2))
        for upsample, block in zip(self.upsamples, self.blocks, strict=True):
            x = block(upsample(F.leaky_relu(x, LEAK)))
        return torch.tanh(self.conv_post(F.leaky_relu(x, LEAK)))[:, 0]

    def _shapes(self) -> tuple[dict[str, str], dict[str, Shape], dict[str, str]]:
        config = self.config
        inputs = {"features": f"float (frames, {config.in_channels}), frames >= 1"}
        symbols = {"samples": f"frames * {config.hop_length} (at {config.sample_rate} Hz)"}
        return inputs, {"waveform": ("samples",)}, symbols


class VocoderStream:
    """Chunks of frames in, waveform pieces out, block by block (see the module's docstring)."""

    def __init__(self, vocoder: Vocoder) -> None:
        self.vocoder = vocoder
        self.block_frames = vocoder.config.block_frames
        self.context = vocoder.context_frames
        self.buffer = torch.zeros(0, vocoder.config.in_channels, device=vocoder.device)
        self.buffer_start = 0  # the index in the sequence of buffer[0]
        self.next_block = 0  # blocks before it have had their samples returned
        self.finished = False

    @property
    def received(self) -> int:
        return self.buffer_start + self.buffer.shape[0]

    def push(self, chunk: Any) -> torch.Tensor:
        """The samples now final, (k * block_frames * hop_length,) for some k >= 0: every block
        whose window has arrived."""
        return self.vocoder.synthesize_windows(self.windows(chunk))

    def finish(self) -> torch.Tensor:
        """The remaining samples: the sequence ends here."""
        return self.vocoder.synthesize_windows(self.final_windows())

    def windows(self, chunk: Any) -> list[BlockWindow]:
        """`push` without the synthesis: the windows of the blocks `chunk` completes, the stream
        moved past them (run them with `Vocoder.synthesize_windows` or a `VocoderBatcher`)."""
        if self.finished:
            raise ModelInputError("this vocoder stream has finished: start another with Vocoder.stream()")
        self.buffer = torch.cat([self.buffer, self.vocoder.features_to_tensor(chunk, allow_empty=True)])
        ready = 0
        while self.received >= (self.next_block + ready + 1) * self.block_frames + self.context:
            ready += 1
        return self._take(self.next_block + ready)

    def final_windows(self) -> list[BlockWindow]:
        """`finish` without the synthesis (as `windows`)."""
        if self.finished:
            raise ModelInputError("this vocoder stream has already finished")
        self.finished = True
        return self._take(-(-self.received // self.block_frames))

    def _take(self, stop_block: int) -> list[BlockWindow]:
        total = self.received  # the sequence's end if finished; else past every window taken here
        windows = [
            self.vocoder.block_window(self.buffer, self.buffer_start, block, total)
            for block in range(self.next_block, stop_block)
        ]
        if stop_block > self.next_block:
            self.next_block = stop_block
            keep_from = max(0, stop_block * self.block_frames - self.context)  # the next window's left context
            self.buffer = self.buffer[keep_from - self.buffer_start :]
            self.buffer_start = keep_from
        return windows
