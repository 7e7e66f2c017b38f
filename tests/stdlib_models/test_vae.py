"""The VAE: latents of (latent_channels, H/8, W/8), a deterministic mean and a reproducible
sample, decode to uint8 images, reconstruct with the right shapes, and clear input errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install 'flowc[models]'")

from flowstd.models import ModelInputError, Vae, VaeConfig  # noqa: E402 - after the skip

IMAGE = (torch.arange(32 * 48 * 3) * 5 % 256).to(torch.uint8).reshape(32, 48, 3)


@pytest.fixture(scope="module")
def vae():
    return Vae()


def test_encode_gives_latent_means_at_an_eighth_of_the_size(vae):
    latent = vae.encode(IMAGE)
    assert latent.shape == (4, 4, 6) == vae.latent_shape(32, 48)
    assert latent.dtype == torch.float32 and torch.isfinite(latent).all()


def test_the_distribution_samples_reproducibly_around_the_mean(vae):
    distribution = vae.encode_distribution(IMAGE)
    assert torch.equal(distribution.mean, vae.encode(IMAGE))
    assert distribution.logvar.shape == distribution.mean.shape
    assert (distribution.std > 0).all() and torch.isfinite(distribution.std).all()
    first = distribution.sample(torch.Generator().manual_seed(1))
    assert torch.equal(first, distribution.sample(torch.Generator().manual_seed(1)))
    assert not torch.equal(first, distribution.sample(torch.Generator().manual_seed(2)))
    assert not torch.equal(first, distribution.mean)


def test_reconstruct_gives_a_uint8_image_of_the_input_size_deterministically(vae):
    image = vae.reconstruct(IMAGE)
    assert image.shape == (32, 48, 3) and image.dtype == torch.uint8
    assert torch.equal(image, vae.reconstruct(IMAGE))
    assert torch.equal(image, Vae().reconstruct(IMAGE))  # a fresh instance, same seed
    assert torch.equal(image, vae.decode(vae.encode(IMAGE)))
    assert image.min() >= 0 and image.max() <= 255 and image.float().std() > 0  # not a constant image


def test_decode_maps_any_latent_to_pixels_in_range(vae):
    latent = torch.linspace(-50.0, 50.0, 4 * 3 * 5).reshape(4, 3, 5)
    as_float = vae.decode_to_float(latent)
    assert as_float.shape == (3, 24, 40) and as_float.min() >= 0.0 and as_float.max() <= 1.0
    assert torch.equal(vae.decode(latent), (as_float * 255).round().to(torch.uint8).permute(1, 2, 0))


def test_float_images_are_taken_too(vae):
    as_float = IMAGE.permute(2, 0, 1).float() / 255.0
    assert torch.allclose(vae.encode(as_float), vae.encode(IMAGE), atol=1e-5)


def test_a_configured_image_size_resizes_any_image():
    vae = Vae(VaeConfig(image_size=16, base_channels=8, channel_multipliers=(1, 1), latent_channels=2))
    assert vae.config.downsample == 2
    assert vae.encode(torch.zeros(50, 30, 3, dtype=torch.uint8)).shape == (2, 8, 8)
    assert vae.reconstruct(torch.zeros(50, 30, 3, dtype=torch.uint8)).shape == (16, 16, 3)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda vae: vae.encode(torch.zeros(30, 32, 3, dtype=torch.uint8)), "multiples of 8; got 30x32"),
        (lambda vae: vae.encode(torch.zeros(32, 32, 4, dtype=torch.uint8)), "must be (H, W, 3)"),
        (lambda vae: vae.decode(torch.zeros(3, 4, 4)), "decodes float latents (4, h, w); got float32 (3, 4, 4)"),
        (lambda vae: vae.decode(torch.zeros(1, 4, 4, 4)), "decodes float latents (4, h, w)"),
        (lambda vae: vae.decode(torch.zeros(4, 4, 4, dtype=torch.int64)), "decodes float latents"),
        (lambda vae: vae.decode(torch.full((4, 2, 2), float("inf"))), "the latent holds NaN or infinite"),
        (lambda vae: vae.decode("latent"), "a latent must be a float (4, h, w) tensor; got str"),
    ],
)
def test_inputs_it_cannot_take_are_refused_with_the_expected_form(vae, call, words):
    with pytest.raises(ModelInputError) as error:
        call(vae)
    assert words in str(error.value)
