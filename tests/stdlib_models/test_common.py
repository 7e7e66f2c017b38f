"""What every flowstd model promises: weights drawn from the config's seed (equal seeds give
bit-identical weights and outputs, different seeds differ, the global RNG is left alone), small
sizes, `describe()` matching what the model really returns, clear config errors, the content hash
of decoded payloads, and flowstd importable without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install 'flowc[models]'")

from flowstd.models import (  # noqa: E402 - after the skip: these import torch
    AudioEncoder,
    AudioEncoderConfig,
    ModelConfigError,
    TextEmbedder,
    TextEmbedderConfig,
    Vae,
    VaeConfig,
    VisionEncoder,
    VisionEncoderConfig,
    Vocoder,
    VocoderConfig,
    tensor_content_hash,
)

IMAGE = torch.arange(48 * 40 * 3, dtype=torch.int64).reshape(48, 40, 3).mul(7).remainder(256).to(torch.uint8)
WAVEFORM = torch.sin(torch.arange(8000) * 0.05) * 0.3
FEATURES = torch.linspace(-3.0, 1.0, 50 * 80).reshape(50, 80)
IDS = [5, 17, 300, 2, 8191]

# name -> (build from a seed, run on the shared input)
MODELS = {
    "vision": (lambda seed: VisionEncoder(VisionEncoderConfig(seed=seed)), lambda m: m.encode(IMAGE)),
    "vae": (lambda seed: Vae(VaeConfig(seed=seed)), lambda m: m.encode(IMAGE)),
    "vae_decode": (lambda seed: Vae(VaeConfig(seed=seed)), lambda m: m.decode(torch.ones(4, 3, 2))),
    "audio": (lambda seed: AudioEncoder(AudioEncoderConfig(seed=seed)), lambda m: m.encode(WAVEFORM)),
    "vocoder": (lambda seed: Vocoder(VocoderConfig(seed=seed)), lambda m: m.synthesize(FEATURES)),
    "text": (lambda seed: TextEmbedder(TextEmbedderConfig(seed=seed)), lambda m: m.embed(IDS)),
}


@pytest.mark.parametrize("name", MODELS)
def test_equal_seeds_give_bit_identical_outputs_and_different_seeds_differ(name):
    build, run = MODELS[name]
    first, second, other = build(3), build(3), build(4)
    for (key, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), key
    out = run(first)
    assert torch.equal(out, run(second))
    assert torch.equal(out, run(first))  # and the same instance twice
    assert torch.isfinite(out.float()).all()
    assert not torch.equal(out, run(other))


def test_building_a_model_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    VisionEncoder()
    Vocoder()
    assert torch.equal(torch.rand(4), expected)


def test_models_are_small_and_describe_their_real_outputs():
    vision = VisionEncoder()
    assert vision.describe().outputs == {"embeddings": tuple(vision.encode(IMAGE).shape)}
    vae = Vae(VaeConfig(image_size=32))
    latent = vae.encode(IMAGE)
    assert vae.describe().outputs == {"latent": tuple(latent.shape), "image": tuple(vae.decode(latent).shape)}
    audio = AudioEncoder()
    described = audio.describe()
    assert described.outputs == {"log_mel": ("mel_frames", 80), "features": ("frames", 128)}
    assert tuple(audio.encode(WAVEFORM).shape) == (audio.config.frames(8000), 128) == (26, 128)
    text = TextEmbedder(TextEmbedderConfig(output_dim=32))
    assert text.describe().outputs == {"embedding": tuple(text.embed(IDS).shape)} == {"embedding": (32,)}
    for model in (vision, vae, audio, Vocoder(), text):
        description = model.describe()
        assert description.parameters == sum(p.numel() for p in model.parameters()) < 10_000_000
        assert description.summary()["config"]["seed"] == 0


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: VisionEncoderConfig(hidden=130, heads=4), "hidden (130) must be a multiple of heads (4)"),
        (lambda: VisionEncoderConfig(image_size=60, patch_size=8), "image_size (60) must be a multiple of patch_size (8)"),
        (lambda: VisionEncoderConfig(depth=0), "depth must be a positive int"),
        (lambda: VaeConfig(base_channels=12), "must be a multiple of 8 (GroupNorm)"),
        (lambda: VaeConfig(image_size=36), "image_size (36) must be a multiple of 8"),
        (lambda: AudioEncoderConfig(n_mels=200), "hold no FFT bin"),
        (lambda: AudioEncoderConfig(f_max=9000.0), "f_max <= sample_rate / 2"),
        (lambda: VocoderConfig(upsample_rates=()), "non-empty tuple of positive ints"),
        (lambda: VocoderConfig(initial_channels=100), "must be a multiple of 16"),
        (lambda: TextEmbedderConfig(seed=-1), "seed must be an int"),
    ],
)
def test_inconsistent_configs_are_refused_by_name(make, words):
    with pytest.raises(ModelConfigError) as error:
        make()
    assert words in str(error.value)


def test_a_model_refuses_another_models_config():
    with pytest.raises(ModelConfigError, match="Vae takes a VaeConfig, not VocoderConfig"):
        Vae(VocoderConfig())


def test_tensor_content_hash_covers_bytes_dtype_and_shape():
    image = IMAGE.clone()
    assert tensor_content_hash(image) == tensor_content_hash(IMAGE) and len(tensor_content_hash(image)) == 16
    assert tensor_content_hash(image.reshape(40, 48, 3)) != tensor_content_hash(image)
    assert tensor_content_hash(image.to(torch.int8)) != tensor_content_hash(image)
    image[0, 0, 0] ^= 1
    assert tensor_content_hash(image) != tensor_content_hash(IMAGE)
    assert tensor_content_hash(IMAGE.permute(2, 0, 1)) == tensor_content_hash(IMAGE.permute(2, 0, 1).contiguous())


def test_flowstd_imports_without_torch():
    program = (
        "import sys; sys.modules['torch'] = None\n"  # `import torch` now fails, as where torch is not installed
        "import flowstd\n"
        "try:\n"
        "    import flowstd.models\n"
        "except ImportError:\n"
        "    print('models need torch')\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "models need torch"
