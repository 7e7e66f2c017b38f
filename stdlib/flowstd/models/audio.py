"""The audio encoder and its features. A mono waveform becomes log-mel features (a Hann-windowed
`torch.stft`, power spectrum, a triangular HTK mel filterbank built here, log10), then a
Whisper-shaped encoder: two 1-D convolutions (the second halves the frame rate), sinusoidal
positions, pre-norm transformer blocks. Output (frames, hidden): an audio prompt segment for an
LLM. The same log-mel features (frames, n_mels) are what `Vocoder` turns back into a waveform."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flowstd.models.blocks import TransformerEncoder, sinusoidal_positions
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

LOG_FLOOR = 1e-10  # mel power below this is silence: log10 floors at -10


def hz_to_mel(hz: float | torch.Tensor) -> float | torch.Tensor:
    """The HTK mel scale: 2595 * log10(1 + hz / 700)."""
    if isinstance(hz, torch.Tensor):
        return 2595.0 * torch.log10(1.0 + hz / 700.0)
    return 2595.0 * math.log10(1.0 + hz / 700.0)


def mel_to_hz(mel: float | torch.Tensor) -> float | torch.Tensor:
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def mel_band_edges(n_mels: int, f_min: float, f_max: float) -> torch.Tensor:
    """(n_mels + 2,) float64 Hz: equally spaced on the mel scale; band i spans edges i..i+2, peak at i+1."""
    return mel_to_hz(torch.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2, dtype=torch.float64))


def mel_filterbank(*, sample_rate: int, n_fft: int, n_mels: int, f_min: float = 0.0, f_max: float | None = None) -> torch.Tensor:
    """(n_fft // 2 + 1, n_mels) float32: triangular filters over the FFT bins' frequencies, each
    rising from 0 at its lower edge to 1 at its center and falling to 0 at its upper edge (no
    area normalisation, so a tone between two centers weighs most in the nearer one's band)."""
    f_max = sample_rate / 2 if f_max is None else f_max
    if not 0.0 <= f_min < f_max <= sample_rate / 2:
        raise ModelConfigError(f"mel bands need 0 <= f_min < f_max <= sample_rate / 2; got {f_min}, {f_max} at {sample_rate} Hz")
    frequencies = torch.linspace(0.0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)[:, None]
    edges = mel_band_edges(n_mels, f_min, f_max)
    lower, center, upper = edges[:-2], edges[1:-1], edges[2:]
    rising = (frequencies - lower) / (center - lower)
    falling = (upper - frequencies) / (upper - center)
    bank = torch.minimum(rising, falling).clamp(min=0.0)
    empty = (bank.sum(dim=0) == 0).nonzero().flatten().tolist()
    if empty:
        raise ModelConfigError(
            f"mel bands {empty} hold no FFT bin ({n_mels} bands over {f_min}-{f_max} Hz with n_fft {n_fft}): "
            "use fewer mel bands or a larger n_fft"
        )
    return bank.to(torch.float32)


@dataclass(frozen=True, kw_only=True)
class AudioEncoderConfig(ModelConfig):
    sample_rate: int = 16000  # waveforms must come at this rate (no resampling here)
    n_fft: int = 400  # 25 ms windows
    hop_length: int = 160  # 10 ms: 100 feature frames a second, 50 encoder frames
    n_mels: int = 80
    f_min: float = 0.0
    f_max: float | None = None  # None: sample_rate / 2
    hidden: int = 128
    depth: int = 2
    heads: int = 4
    mlp_ratio: int = 4
    output_hidden: int | None = None  # a projector to this width (an LLM's hidden size); None: `hidden`

    def __post_init__(self) -> None:
        super().__post_init__()
        self._require_positive("sample_rate", "n_fft", "hop_length", "n_mels", "hidden", "depth", "heads", "mlp_ratio")
        self._require_divisible("hidden", "heads")
        if self.output_hidden is not None:
            self._require_positive("output_hidden")
        mel_filterbank(sample_rate=self.sample_rate, n_fft=self.n_fft, n_mels=self.n_mels, f_min=self.f_min, f_max=self.f_max)

    @property
    def min_samples(self) -> int:
        """The shortest waveform: the STFT's reflect padding needs more than n_fft // 2 samples."""
        return self.n_fft // 2 + 1

    @property
    def output_width(self) -> int:
        return self.hidden if self.output_hidden is None else self.output_hidden

    def mel_frames(self, samples: int) -> int:
        return 1 + samples // self.hop_length

    def frames(self, samples: int) -> int:
        """Encoder frames for a waveform of `samples`."""
        return self.frames_of_mel(self.mel_frames(samples))

    @staticmethod
    def frames_of_mel(mel_frames: int) -> int:
        """The second conv halves the mel frames, rounding up."""
        return (mel_frames + 1) // 2


def waveform_to_tensor(waveform: Any, *, min_samples: int) -> torch.Tensor:
    """float32 (samples,) from a mono float waveform (samples,) or (1, samples)."""
    expected = "a mono float waveform (samples,) or (1, samples)"
    audio = as_tensor(waveform, "a waveform", expected)
    if audio.dim() == 2 and audio.shape[0] == 1:
        audio = audio[0]
    if not audio.is_floating_point() or audio.dim() != 1:
        hint = " (stereo or batched: mix down to one channel first)" if audio.dim() == 2 else ""
        raise ModelInputError(f"the audio encoder takes {expected}; got {shape_text(audio)}{hint}")
    if audio.shape[0] < min_samples:
        raise ModelInputError(f"the waveform is too short: {audio.shape[0]} samples, at least {min_samples} needed")
    require_finite(audio, "the waveform")
    return audio.to(torch.float32)


class LogMel(nn.Module):
    """waveform (samples,) -> log10 mel power (1 + samples // hop_length, n_mels): time-major."""

    def __init__(self, config: AudioEncoderConfig) -> None:
        super().__init__()
        self.n_fft, self.hop_length = config.n_fft, config.hop_length
        self.register_buffer("window", torch.hann_window(config.n_fft, periodic=True), persistent=False)
        bank = mel_filterbank(
            sample_rate=config.sample_rate, n_fft=config.n_fft, n_mels=config.n_mels, f_min=config.f_min, f_max=config.f_max
        )
        self.register_buffer("filterbank", bank, persistent=False)

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        spectrum = torch.stft(
            waveform, self.n_fft, self.hop_length, window=self.window, center=True, pad_mode="reflect", return_complex=True
        )
        power = spectrum.real.square() + spectrum.imag.square()  # (n_fft // 2 + 1, frames)
        return torch.log10((power.transpose(0, 1) @ self.filterbank).clamp(min=LOG_FLOOR))


class AudioEncoder(SeededModel):
    """waveform -> (frames, output_width) float32. `log_mel` gives the features alone."""

    model_name = "audio_encoder"
    config_type = AudioEncoderConfig

    def __init__(self, config: AudioEncoderConfig | None = None) -> None:
        super().__init__(config)
        config = self.config
        with self.seeded_weights():
            self.features = LogMel(config)
            self.conv_in = nn.Conv1d(config.n_mels, config.hidden, 3, padding=1)
            self.conv_down = nn.Conv1d(config.hidden, config.hidden, 3, stride=2, padding=1)
            self.encoder = TransformerEncoder(config.hidden, config.depth, config.heads, config.mlp_ratio)
            self.projector = None if config.output_hidden is None else nn.Linear(config.hidden, config.output_hidden)

    def _waveform(self, waveform: Any, sample_rate: int | None) -> torch.Tensor:
        if sample_rate is not None and sample_rate != self.config.sample_rate:
            raise ModelInputError(
                f"the audio encoder takes {self.config.sample_rate} Hz audio; got {sample_rate} Hz (resample it first)"
            )
        return waveform_to_tensor(waveform, min_samples=self.config.min_samples).to(self.device)

    @torch.inference_mode()
    def log_mel(self, waveform: Any, sample_rate: int | None = None) -> torch.Tensor:
        """(1 + samples // hop_length, n_mels) float32 log10 mel power of a mono waveform."""
        return self.features(self._waveform(waveform, sample_rate))

    @torch.inference_mode()
    def encode(self, waveform: Any, sample_rate: int | None = None) -> torch.Tensor:
        """(frames, output_width) float32, frames = ceil((1 + samples // hop_length) / 2).
        `sample_rate`, when given, must be the config's (there is no resampling)."""
        return self(self.features(self._waveform(waveform, sample_rate))[None])[0]

    @torch.inference_mode()
    def encode_many(self, waveforms: list[Any], sample_rate: int | None = None) -> list[torch.Tensor]:
        """`encode` of each waveform, in one forward. Clips of different lengths are padded to the
        longest and the padding masked (zeroed between the convolutions, left out of attention),
        so each clip's rows are its own: exactly `encode`'s for one clip, equal to within float
        rounding for several (the CPU kernels round differently for other batch sizes)."""
        clips = [self._waveform(waveform, sample_rate) for waveform in waveforms]
        if len(clips) <= 1:
            return [self(self.features(clip)[None])[0] for clip in clips]
        mels = [self.features(clip) for clip in clips]
        lengths = torch.tensor([mel.shape[0] for mel in mels], device=self.device)
        batch = torch.zeros(len(mels), int(lengths.max()), self.config.n_mels, device=self.device)
        for row, mel in enumerate(mels):
            batch[row, : mel.shape[0]] = mel
        encoded = self(batch, lengths)
        return [encoded[row, : self.config.frames_of_mel(mel.shape[0])].clone() for row, mel in enumerate(mels)]

    def forward(self, log_mel: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, mel_frames, n_mels) log-mel features -> (batch, frames, output_width). `lengths`
        (batch,): each row's real mel frames, the rest padding (rows past a row's own
        `frames_of_mel(length)` are not meaningful); None: every frame is real."""
        if not isinstance(log_mel, torch.Tensor) or log_mel.dim() != 3 or log_mel.shape[2] != self.config.n_mels:
            got = shape_text(log_mel) if isinstance(log_mel, torch.Tensor) else type(log_mel).__name__
            raise ModelInputError(f"AudioEncoder.forward takes log-mel features (batch, frames, {self.config.n_mels}); got {got}")
        x = F.gelu(self.conv_in(log_mel.transpose(1, 2)))
        key_mask = None
        if lengths is not None:  # padding must read as the convolution's own zero padding, as for a clip alone
            x = x * (torch.arange(x.shape[2], device=x.device)[None, :] < lengths[:, None])[:, None, :]
            key_mask = torch.arange((x.shape[2] + 1) // 2, device=x.device)[None, :] < ((lengths + 1) // 2)[:, None]
        x = F.gelu(self.conv_down(x)).transpose(1, 2)  # (batch, frames, hidden)
        x = self.encoder(x + sinusoidal_positions(x.shape[1], self.config.hidden, x.device), key_mask)
        return x if self.projector is None else self.projector(x)

    def _shapes(self) -> tuple[dict[str, str], dict[str, Shape], dict[str, str]]:
        config = self.config
        inputs = {"waveform": f"mono float (samples,) at {config.sample_rate} Hz, at least {config.min_samples} samples"}
        outputs: dict[str, Shape] = {"log_mel": ("mel_frames", config.n_mels), "features": ("frames", config.output_width)}
        symbols = {"mel_frames": f"1 + samples // {config.hop_length}", "frames": "(mel_frames + 1) // 2"}
        return inputs, outputs, symbols
