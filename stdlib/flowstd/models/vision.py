"""The vision encoder: a tiny ViT. An image, resized and center-cropped to `image_size`, is cut
into `patch_size` patches; a strided convolution embeds each, learned positions are added,
pre-norm transformer blocks mix them, and an optional linear projector maps the width to the
LLM's hidden size. One embedding per patch (no class token): what an LLM's prompt takes in the
image's place (the `vit` role of examples/image_chat)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from flowstd.models.blocks import TransformerEncoder
from flowstd.models.common import ModelConfig, ModelInputError, SeededModel, Shape, require_finite, shape_text
from flowstd.models.images import fit_square, image_forms, image_to_float_chw


@dataclass(frozen=True, kw_only=True)
class VisionEncoderConfig(ModelConfig):
    image_size: int = 64  # images are resized (shorter side) and center-cropped to this square
    patch_size: int = 8  # (image_size / patch_size)**2 patches: 64 by default
    channels: int = 3
    hidden: int = 128  # the transformer's width
    depth: int = 2
    heads: int = 4
    mlp_ratio: int = 4
    output_hidden: int | None = None  # a projector to this width (an LLM's hidden size); None: `hidden`

    def __post_init__(self) -> None:
        super().__post_init__()
        self._require_positive("image_size", "patch_size", "channels", "hidden", "depth", "heads", "mlp_ratio")
        self._require_divisible("image_size", "patch_size")
        self._require_divisible("hidden", "heads")
        if self.output_hidden is not None:
            self._require_positive("output_hidden")

    @property
    def patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def output_width(self) -> int:
        return self.hidden if self.output_hidden is None else self.output_hidden


class VisionEncoder(SeededModel):
    """image -> (patches, output_width) float32. `encode` takes one image in any size;
    `forward` takes a batch of prepared pixels (batch, channels, image_size, image_size) in [0, 1]."""

    model_name = "vision_encoder"
    config_type = VisionEncoderConfig

    def __init__(self, config: VisionEncoderConfig | None = None) -> None:
        super().__init__(config)
        config = self.config
        with self.seeded_weights():
            self.patch_embedding = nn.Conv2d(config.channels, config.hidden, config.patch_size, stride=config.patch_size)
            self.positions = nn.Parameter(torch.zeros(config.patches, config.hidden))
            self.encoder = TransformerEncoder(config.hidden, config.depth, config.heads, config.mlp_ratio)
            self.projector = None if config.output_hidden is None else nn.Linear(config.hidden, config.output_hidden)

    def prepare(self, image: Any) -> torch.Tensor:
        """(channels, image_size, image_size) float32 in [0, 1]: converted, resized, cropped."""
        return fit_square(image_to_float_chw(image, self.config.channels), self.config.image_size)

    @torch.inference_mode()
    def encode(self, image: Any) -> torch.Tensor:
        """(patches, output_width) float32 embeddings of one image: uint8 (H, W, C) or float (C, H, W) in [0, 1]."""
        return self(self.prepare(image)[None].to(self.device))[0]

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        config = self.config
        expected = (config.channels, config.image_size, config.image_size)
        if not isinstance(pixels, torch.Tensor) or pixels.dim() != 4 or tuple(pixels.shape[1:]) != expected:
            got = shape_text(pixels) if isinstance(pixels, torch.Tensor) else type(pixels).__name__
            raise ModelInputError(f"VisionEncoder.forward takes float pixels (batch, {', '.join(map(str, expected))}); got {got}")
        if not pixels.is_floating_point():
            raise ModelInputError(f"VisionEncoder.forward takes float pixels in [0, 1]; got {shape_text(pixels)} (use encode)")
        require_finite(pixels, "the pixels")
        x = self.patch_embedding(pixels * 2.0 - 1.0)  # [0, 1] -> [-1, 1]
        x = x.flatten(2).transpose(1, 2) + self.positions  # (batch, patches, hidden), patches in row-major order
        x = self.encoder(x)
        return x if self.projector is None else self.projector(x)

    def _shapes(self) -> tuple[dict[str, str], dict[str, Shape], dict[str, str]]:
        config = self.config
        inputs = {"image": f"{image_forms(config.channels)}; resized and center-cropped to {config.image_size}"}
        return inputs, {"embeddings": (config.patches, config.output_width)}, {}
