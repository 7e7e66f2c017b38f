"""Images as the image models take and give them: decoded pixels as a uint8 (H, W, C) array
(what an image decoder gives) or a float (C, H, W) tensor in [0, 1] (what torch pipelines use),
converted to float (C, H, W); resized (shorter side) and center-cropped to a square; and turned
back into uint8 (H, W, C). Decoding PNG/JPEG bytes is the role's job, not the models'."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from flowstd.models.common import ModelInputError, as_tensor, require_finite, shape_text


def image_forms(channels: int) -> str:
    """The image forms the models take, in words (for errors and `describe()`)."""
    return f"a uint8 (H, W, {channels}) array or a float ({channels}, H, W) tensor in [0, 1]"


def image_to_float_chw(image: Any, channels: int) -> torch.Tensor:
    """float32 (channels, H, W) in [0, 1] from a uint8 (H, W, channels) or float (channels, H, W) image."""
    expected = image_forms(channels)
    pixels = as_tensor(image, "an image", expected)
    if pixels.dtype == torch.uint8:
        if pixels.dim() != 3 or pixels.shape[2] != channels:
            raise ModelInputError(f"a uint8 image must be (H, W, {channels}) (height, width, channels); got {shape_text(pixels)}")
        pixels = pixels.permute(2, 0, 1).to(torch.float32) / 255.0
    elif pixels.is_floating_point():
        if pixels.dim() != 3 or pixels.shape[0] != channels:
            raise ModelInputError(f"a float image must be ({channels}, H, W) (channels first); got {shape_text(pixels)}")
        require_finite(pixels, "the image")
        if pixels.numel() and (float(pixels.min()) < 0.0 or float(pixels.max()) > 1.0):
            raise ModelInputError(
                f"a float image must hold values in [0, 1]; got [{float(pixels.min()):.4g}, {float(pixels.max()):.4g}]"
            )
        pixels = pixels.to(torch.float32)
    else:
        raise ModelInputError(f"an image must be {expected}; got {shape_text(pixels)}")
    if pixels.shape[1] == 0 or pixels.shape[2] == 0:
        raise ModelInputError(f"the image is empty: {tuple(pixels.shape)}")
    return pixels


def fit_square(pixels: torch.Tensor, size: int) -> torch.Tensor:
    """(C, size, size): the shorter side resized to `size` (bilinear, antialiased), then the
    center cropped. An image already size x size is returned as it is."""
    _, height, width = pixels.shape
    if (height, width) == (size, size):
        return pixels
    scale = size / min(height, width)
    new_height, new_width = max(size, round(height * scale)), max(size, round(width * scale))
    if (new_height, new_width) != (height, width):
        pixels = F.interpolate(pixels[None], size=(new_height, new_width), mode="bilinear", antialias=True, align_corners=False)[
            0
        ].clamp(0.0, 1.0)
    top, left = (new_height - size) // 2, (new_width - size) // 2
    return pixels[:, top : top + size, left : left + size]


def float_chw_to_uint8_hwc(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 (H, W, C) from float (C, H, W) in [0, 1] (clamped), rounded to the nearest level."""
    return (pixels.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).permute(1, 2, 0).contiguous()
