"""flowstd.models: tiny real models for the standard library's media roles, in pure PyTorch.

A vision encoder (ViT), a VAE, an audio encoder (log-mel + transformer), a vocoder (HiFi-GAN
shaped, streaming) and a text embedder. Each is small (well under 10 M parameters), runs on a CPU
in milliseconds, takes a config dataclass, and draws its weights from the config's seed: real
architectures, untrained, so their outputs are deterministic but not meaningful (docs/models.md).

Importing this package imports torch (`pip install 'flowc[models]'`); `flowstd` itself does not.
"""

from __future__ import annotations

from flowstd.models.audio import AudioEncoder, AudioEncoderConfig, mel_band_edges, mel_filterbank
from flowstd.models.common import (
    ModelConfig,
    ModelConfigError,
    ModelDescription,
    ModelInputError,
    SeededModel,
    seeded_init_,
    tensor_content_hash,
)
from flowstd.models.text_embedding import TextEmbedder, TextEmbedderConfig
from flowstd.models.vae import LatentDistribution, Vae, VaeConfig
from flowstd.models.vision import VisionEncoder, VisionEncoderConfig
from flowstd.models.vocoder import Vocoder, VocoderConfig, VocoderStream

__all__ = [
    "AudioEncoder",
    "AudioEncoderConfig",
    "LatentDistribution",
    "ModelConfig",
    "ModelConfigError",
    "ModelDescription",
    "ModelInputError",
    "SeededModel",
    "TextEmbedder",
    "TextEmbedderConfig",
    "Vae",
    "VaeConfig",
    "VisionEncoder",
    "VisionEncoderConfig",
    "Vocoder",
    "VocoderConfig",
    "VocoderStream",
    "mel_band_edges",
    "mel_filterbank",
    "seeded_init_",
    "tensor_content_hash",
]
