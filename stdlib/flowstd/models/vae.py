"""The VAE: a tiny convolutional autoencoder shaped like Stable Diffusion's. The encoder maps an
image to a diagonal Gaussian over latents (latent_channels, H/f, W/f) (f = `downsample`, 8 by
default); `encode` returns its mean (deterministic), `encode_distribution` the mean and log
variance to sample from. The decoder maps latents back to a uint8 (H, W, C) image. The `vae`
role of examples/image_chat: images in as latents for a DiT, latents out as images."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
from flowstd.models.images import fit_square, float_chw_to_uint8_hwc, image_forms, image_to_float_chw

GROUPS = 8  # GroupNorm groups: every level's channels must be a multiple
LOGVAR_RANGE = (-30.0, 20.0)  # Stable Diffusion's clamp: exp() of it stays finite in float32


@dataclass(frozen=True, kw_only=True)
class VaeConfig(ModelConfig):
    channels: int = 3
    latent_channels: int = 4
    base_channels: int = 16
    channel_multipliers: tuple[int, ...] = (1, 2, 2, 4)  # one level each; the image halves between levels
    image_size: int | None = None  # None: any H, W that are multiples of `downsample`; else resized and cropped

    def __post_init__(self) -> None:
        super().__post_init__()
        self._require_positive("channels", "latent_channels", "base_channels")
        multipliers = self.channel_multipliers
        if not isinstance(multipliers, tuple) or not multipliers or not all(isinstance(m, int) and m > 0 for m in multipliers):
            raise ModelConfigError(
                f"VaeConfig.channel_multipliers must be a non-empty tuple of positive ints, not {multipliers!r}"
            )
        if any(width % GROUPS for width in self.widths):
            raise ModelConfigError(f"VaeConfig: every level's channels {self.widths} must be a multiple of {GROUPS} (GroupNorm)")
        if self.image_size is not None:
            self._require_positive("image_size")
            if self.image_size % self.downsample:
                raise ModelConfigError(f"VaeConfig.image_size ({self.image_size}) must be a multiple of {self.downsample}")

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(self.base_channels * m for m in self.channel_multipliers)

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.channel_multipliers) - 1)


class ResidualBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.GroupNorm(GROUPS, width),
            nn.SiLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.GroupNorm(GROUPS, width),
            nn.SiLU(),
            nn.Conv2d(width, width, 3, padding=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.layers(x)


class Upsample(nn.Module):
    """Nearest x2 then a 3x3 conv (no checkerboard artifacts of a transposed conv)."""

    def __init__(self, width_in: int, width_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(width_in, width_out, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def _head(width: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.GroupNorm(GROUPS, width), nn.SiLU(), nn.Conv2d(width, out, 3, padding=1))


@dataclass(frozen=True)
class LatentDistribution:
    """The encoder's diagonal Gaussian: mean and log variance, each (latent_channels, h, w)."""

    mean: torch.Tensor
    logvar: torch.Tensor

    @property
    def std(self) -> torch.Tensor:
        return torch.exp(0.5 * self.logvar)

    def sample(self, generator: torch.Generator) -> torch.Tensor:
        """mean + std * noise; the generator (a CPU one, seeded) makes it reproducible."""
        noise = torch.randn(self.mean.shape, generator=generator, dtype=self.mean.dtype)
        return self.mean + self.std * noise.to(self.mean.device)


class Vae(SeededModel):
    """image -> latent (latent_channels, H/downsample, W/downsample) -> uint8 (H, W, channels)."""

    model_name = "vae"
    config_type = VaeConfig

    def __init__(self, config: VaeConfig | None = None) -> None:
        super().__init__(config)
        config = self.config
        widths = config.widths
        with self.seeded_weights():
            down: list[nn.Module] = [nn.Conv2d(config.channels, widths[0], 3, padding=1)]
            for level, width in enumerate(widths):
                down.append(ResidualBlock(width))
                if level + 1 < len(widths):
                    down.append(nn.Conv2d(width, widths[level + 1], 3, stride=2, padding=1))
            down += [ResidualBlock(widths[-1]), _head(widths[-1], 2 * config.latent_channels)]
            self.encoder = nn.Sequential(*down)
            up: list[nn.Module] = [nn.Conv2d(config.latent_channels, widths[-1], 3, padding=1), ResidualBlock(widths[-1])]
            for level in reversed(range(len(widths))):
                up.append(ResidualBlock(widths[level]))
                if level > 0:
                    up.append(Upsample(widths[level], widths[level - 1]))
            up.append(_head(widths[0], config.channels))
            self.decoder = nn.Sequential(*up)

    def prepare(self, image: Any) -> torch.Tensor:
        """(channels, H, W) float32 in [0, 1], H and W multiples of `downsample` (or image_size square)."""
        config = self.config
        pixels = image_to_float_chw(image, config.channels)
        if config.image_size is not None:
            return fit_square(pixels, config.image_size)
        if pixels.shape[1] % config.downsample or pixels.shape[2] % config.downsample:
            raise ModelInputError(
                f"the VAE takes images whose height and width are multiples of {config.downsample}; "
                f"got {pixels.shape[1]}x{pixels.shape[2]} (crop or resize it, or set VaeConfig.image_size)"
            )
        return pixels

    @torch.inference_mode()
    def encode_distribution(self, image: Any) -> LatentDistribution:
        """The latent Gaussian of one image (uint8 (H, W, C) or float (C, H, W) in [0, 1])."""
        moments = self.encoder(self.prepare(image)[None].to(self.device) * 2.0 - 1.0)[0]
        mean, logvar = moments.chunk(2, dim=0)
        return LatentDistribution(mean, logvar.clamp(*LOGVAR_RANGE))

    def encode(self, image: Any) -> torch.Tensor:
        """The latent mean (latent_channels, H/downsample, W/downsample) float32: deterministic."""
        return self.encode_distribution(image).mean

    @torch.inference_mode()
    def decode_to_float(self, latent: Any) -> torch.Tensor:
        """float32 (channels, H, W) in [0, 1] from a latent (latent_channels, h, w)."""
        channels = self.config.latent_channels
        latent = as_tensor(latent, "a latent", f"a float ({channels}, h, w) tensor")
        if not latent.is_floating_point() or latent.dim() != 3 or latent.shape[0] != channels or 0 in latent.shape:
            raise ModelInputError(f"the VAE decodes float latents ({channels}, h, w); got {shape_text(latent)}")
        require_finite(latent, "the latent")
        pixels = torch.tanh(self.decoder(latent[None].to(self.device, torch.float32))[0])
        return (pixels + 1.0) / 2.0

    def decode(self, latent: Any) -> torch.Tensor:
        """uint8 (h*downsample, w*downsample, channels) from a latent (latent_channels, h, w)."""
        return float_chw_to_uint8_hwc(self.decode_to_float(latent))

    def reconstruct(self, image: Any) -> torch.Tensor:
        """decode(encode(image)): uint8 (H, W, channels) of the prepared image's size."""
        return self.decode(self.encode(image))

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        factor = self.config.downsample
        return (self.config.latent_channels, height // factor, width // factor)

    def _shapes(self) -> tuple[dict[str, str], dict[str, Shape], dict[str, str]]:
        config, factor = self.config, self.config.downsample
        size = f"resized and cropped to {config.image_size}" if config.image_size else f"H and W multiples of {factor}"
        inputs = {
            "image": f"{image_forms(config.channels)}; {size}",
            "latent": f"float ({config.latent_channels}, h, w): decoded to (h * {factor}, w * {factor}, {config.channels})",
        }
        if config.image_size is None:
            outputs: dict[str, Shape] = {"latent": (config.latent_channels, "h", "w"), "image": ("H", "W", config.channels)}
            return inputs, outputs, {"h": f"H // {factor}", "w": f"W // {factor}"}
        side = config.image_size // factor
        outputs = {
            "latent": (config.latent_channels, side, side),
            "image": (config.image_size, config.image_size, config.channels),
        }
        return inputs, outputs, {}
