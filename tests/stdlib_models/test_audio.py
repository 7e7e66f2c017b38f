"""The audio encoder and its log-mel features: the mel filterbank puts a pure tone's energy in
the band whose center is nearest, the features scale with power, the encoder halves the frame
rate, and waveforms it cannot take are refused with the form it expects."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install 'flowc[models]'")

from flowstd.models import AudioEncoder, AudioEncoderConfig, ModelInputError, mel_band_edges, mel_filterbank  # noqa: E402
from flowstd.models.audio import hz_to_mel, mel_to_hz  # noqa: E402

RATE = 16000
CENTERS = mel_band_edges(80, 0.0, 8000.0)[1:-1]


def tone(hz: float, samples: int = 8000, amplitude: float = 0.5) -> torch.Tensor:
    return (amplitude * torch.sin(2 * math.pi * hz * torch.arange(samples, dtype=torch.float64) / RATE)).float()


@pytest.fixture(scope="module")
def encoder():
    return AudioEncoder()


def test_mel_scale_round_trips_and_is_htk():
    assert hz_to_mel(700.0) == pytest.approx(2595 * math.log10(2))
    assert float(mel_to_hz(hz_to_mel(torch.tensor(1234.5, dtype=torch.float64)))) == pytest.approx(1234.5)


def test_the_filterbank_is_triangles_with_rising_centers():
    bank = mel_filterbank(sample_rate=RATE, n_fft=400, n_mels=80)
    assert bank.shape == (201, 80) and bank.dtype == torch.float32
    assert bank.min() == 0.0 and bank.max() <= 1.0
    assert (bank.sum(dim=0) > 0).all()  # every band holds a bin
    assert (CENTERS[1:] > CENTERS[:-1]).all()
    peaks = bank.argmax(dim=0)  # each band peaks at the FFT bin nearest its center (bins are 40 Hz apart)
    assert (peaks[1:] >= peaks[:-1]).all()
    assert (peaks * 40.0 - CENTERS).abs().max() <= 40.0


@pytest.mark.parametrize("band", [12, 25, 40, 55, 70, 78])
def test_a_tone_at_a_bands_center_lands_in_that_band(encoder, band):
    energy = encoder.log_mel(tone(float(CENTERS[band]))).mean(dim=0)
    assert int(energy.argmax()) == band
    assert energy[band] > energy[band - 2] + 0.5 and energy[band] > energy[(band + 2) % 80] + 0.5


@pytest.mark.parametrize("hz", [440.0, 1000.0, 2500.0, 5000.0, 7000.0])
def test_a_tone_lands_in_the_band_with_the_nearest_center(encoder, hz):
    energy = encoder.log_mel(tone(hz)).mean(dim=0)
    assert int(energy.argmax()) == int((CENTERS - hz).abs().argmin())


def test_features_are_log10_power_with_a_floor(encoder):
    quiet, loud = encoder.log_mel(tone(1000.0, amplitude=0.25)), encoder.log_mel(tone(1000.0, amplitude=0.5))
    band = int(CENTERS.sub(1000.0).abs().argmin())
    # twice the amplitude is four times the power: log10(4) more in every band above the floor
    assert (loud[:, band] - quiet[:, band]).sub(math.log10(4)).abs().max() < 1e-3
    assert torch.equal(encoder.log_mel(torch.zeros(4000)), torch.full((26, 80), -10.0))


@pytest.mark.parametrize("samples", [201, 1600, 16000, 16159])
def test_frame_counts_follow_the_hop_and_the_halving_conv(encoder, samples):
    waveform = tone(300.0, samples)
    assert waveform.shape == (samples,)
    assert encoder.log_mel(waveform).shape == (1 + samples // 160, 80)
    assert encoder.encode(waveform).shape == (encoder.config.frames(samples), 128) == ((2 + samples // 160) // 2, 128)


def test_a_batch_of_one_channel_and_numpy_are_taken(encoder):
    waveform = tone(440.0)
    expected = encoder.encode(waveform)
    assert torch.equal(encoder.encode(waveform[None]), expected)
    assert torch.equal(encoder.encode(waveform.numpy()), expected)
    assert torch.equal(encoder.encode(waveform, sample_rate=16000), expected)
    assert not torch.allclose(encoder.encode(tone(3000.0)), expected)


def test_projector_to_an_llm_width():
    encoder = AudioEncoder(AudioEncoderConfig(hidden=64, heads=2, depth=1, n_mels=40, output_hidden=96))
    assert encoder.encode(tone(440.0, 1600)).shape == (6, 96)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda e: e.encode(tone(440.0), sample_rate=22050), "takes 16000 Hz audio; got 22050 Hz (resample it first)"),
        (lambda e: e.encode(torch.zeros(2, 1600)), "mono float waveform (samples,) or (1, samples); got float32 (2, 1600)"),
        (lambda e: e.encode(torch.zeros(2, 1600)), "mix down to one channel first"),
        (lambda e: e.encode(torch.zeros(1600, dtype=torch.int16)), "got int16 (1600,)"),
        (lambda e: e.encode(torch.zeros(200)), "too short: 200 samples, at least 201 needed"),
        (lambda e: e.log_mel(torch.full((1600,), float("nan"))), "the waveform holds NaN or infinite values"),
        (lambda e: e.encode([0.0] * 1600), "a waveform must be a mono float waveform"),
        (lambda e: e(torch.zeros(1, 10, 64)), "takes log-mel features (batch, frames, 80); got float32 (1, 10, 64)"),
    ],
)
def test_waveforms_it_cannot_take_are_refused_with_the_expected_form(encoder, call, words):
    with pytest.raises(ModelInputError) as error:
        call(encoder)
    assert words in str(error.value)
