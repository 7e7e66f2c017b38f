"""The vision encoder: one embedding per patch for images of any size and either layout, the
projector to an LLM's width, and clear errors for images it cannot take."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install 'flowc[models]'")

from flowstd.models import ModelInputError, VisionEncoder, VisionEncoderConfig  # noqa: E402 - after the skip
from flowstd.models.images import fit_square, image_to_float_chw  # noqa: E402

GRADIENT = (torch.arange(96 * 128 * 3) % 251).to(torch.uint8).reshape(96, 128, 3)


@pytest.fixture(scope="module")
def encoder():
    return VisionEncoder()


def test_one_embedding_per_patch_whatever_the_image_size(encoder):
    for height, width in [(64, 64), (96, 128), (20, 33), (300, 70)]:
        image = torch.full((height, width, 3), 128, dtype=torch.uint8)
        assert encoder.encode(image).shape == (64, 128)  # (64 / 8)**2 patches of width 128


def test_uint8_hwc_numpy_and_float_chw_are_the_same_image(encoder):
    as_float = GRADIENT.permute(2, 0, 1).float() / 255.0
    expected = encoder.encode(GRADIENT)
    assert torch.equal(encoder.encode(GRADIENT.numpy()), expected)
    assert torch.allclose(encoder.encode(as_float), expected, atol=1e-5)
    flipped = GRADIENT.numpy()[::-1]  # a view with negative strides
    assert torch.equal(encoder.encode(flipped), encoder.encode(GRADIENT.flip(0)))
    read_only = GRADIENT.numpy().copy()
    read_only.flags.writeable = False
    assert torch.equal(encoder.encode(read_only), expected)
    with pytest.raises(ModelInputError, match="an image must be .*; got an array of object"):
        encoder.encode(np.empty((2, 2, 3), dtype=object))


def test_resize_keeps_the_shorter_side_and_crops_the_center():
    left_half = torch.zeros(3, 40, 80)
    left_half[:, :, 40:] = 1.0  # a square crop of the center straddles both halves
    square = fit_square(left_half, 20)
    assert square.shape == (3, 20, 20)
    assert square[:, :, :10].max() < 0.5 < square[:, :, 10:].min()
    same = torch.rand(3, 64, 64)
    assert fit_square(same, 64) is same


def test_the_output_depends_on_the_image_and_each_patch_position(encoder):
    dark = encoder.encode(torch.zeros(64, 64, 3, dtype=torch.uint8))
    light = encoder.encode(torch.full((64, 64, 3), 255, dtype=torch.uint8))
    assert not torch.allclose(dark, light)
    assert not torch.allclose(dark[0], dark[1])  # positions make equal patches differ


def test_projector_matches_an_llm_hidden_size():
    encoder = VisionEncoder(VisionEncoderConfig(hidden=64, heads=2, output_hidden=96, image_size=32, patch_size=16))
    assert encoder.encode(GRADIENT).shape == (4, 96)
    assert encoder.describe().outputs == {"embeddings": (4, 96)}


def test_batched_forward_takes_prepared_pixels(encoder):
    pixels = torch.stack([encoder.prepare(GRADIENT), encoder.prepare(torch.zeros(64, 64, 3, dtype=torch.uint8))])
    out = encoder(pixels)
    assert out.shape == (2, 64, 128)
    assert torch.allclose(out[0], encoder.encode(GRADIENT), atol=1e-5)


@pytest.mark.parametrize(
    ("image", "words"),
    [
        (torch.zeros(3, 64, 64, dtype=torch.uint8), "a uint8 image must be (H, W, 3)"),
        (torch.zeros(64, 64, dtype=torch.uint8), "a uint8 image must be (H, W, 3)"),
        (torch.zeros(64, 64, 3), "a float image must be (3, H, W)"),
        (torch.full((3, 8, 8), 2.0), "values in [0, 1]; got [2, 2]"),
        (torch.full((3, 8, 8), float("nan")), "NaN or infinite"),
        (torch.zeros(3, 0, 8), "the image is empty"),
        (torch.zeros(8, 8, 3, dtype=torch.int32), "an image must be a uint8 (H, W, 3) array or a float (3, H, W) tensor"),
        ([[0, 1], [2, 3]], "an image must be a uint8 (H, W, 3) array or a float (3, H, W) tensor in [0, 1]; got list"),
    ],
)
def test_images_it_cannot_take_are_refused_with_the_expected_form(encoder, image, words):
    with pytest.raises(ModelInputError) as error:
        encoder.encode(image)
    assert words in str(error.value)


def test_forward_names_the_pixels_it_takes(encoder):
    with pytest.raises(ModelInputError, match=r"takes float pixels \(batch, 3, 64, 64\); got float32 \(1, 3, 32, 32\)"):
        encoder(torch.zeros(1, 3, 32, 32))
    with pytest.raises(ModelInputError, match="use encode"):
        encoder(torch.zeros(1, 3, 64, 64, dtype=torch.uint8))


def test_float_conversion_keeps_values():
    image = torch.tensor([[[0, 255, 51]]], dtype=torch.uint8)
    assert image_to_float_chw(image, 3).flatten().tolist() == pytest.approx([0.0, 1.0, 0.2])
