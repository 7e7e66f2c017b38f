"""The vocoder: frames * hop_length samples in [-1, 1], the receptive field its streaming relies
on, streamed pieces that concatenate bit for bit to the whole call, and clear input errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install 'flowc[models]'")

from flowstd.models import AudioEncoder, ModelInputError, Vocoder, VocoderConfig  # noqa: E402 - after the skip

FEATURES = torch.sin(torch.arange(123 * 80, dtype=torch.float32).reshape(123, 80) * 0.37) * 3.0 - 4.0


@pytest.fixture(scope="module")
def vocoder():
    return Vocoder()


def test_a_waveform_of_hop_samples_per_frame_in_range(vocoder):
    waveform = vocoder.synthesize(FEATURES)
    assert waveform.shape == (123 * 160,) == (vocoder.samples_for(123),) and waveform.dtype == torch.float32
    assert waveform.abs().max() <= 1.0 and waveform.std() > 0
    assert vocoder.synthesize(FEATURES[:1]).shape == (160,)


def test_blocks_agree_with_one_pass_up_to_rounding(vocoder):
    assert torch.allclose(vocoder.synthesize(FEATURES), vocoder(FEATURES[None])[0], atol=1e-5)


def test_context_frames_bounds_the_receptive_field(vocoder):
    assert vocoder.context_frames == 7
    base = vocoder(FEATURES[None])[0].view(123, 160)
    nudged = FEATURES.clone()
    nudged[60] += 1.0
    changed = (vocoder(nudged[None])[0].view(123, 160) != base).any(dim=1).nonzero().flatten()
    assert 60 in changed and changed.min() >= 60 - 7 and changed.max() <= 60 + 7


@pytest.mark.parametrize(
    "sizes",
    [[123], [1] * 123, [7, 30, 1, 50, 35], [38, 1, 32, 52], [0, 39, 0, 84, 0], [100, 23], [64, 59]],
    ids=["whole", "frame-by-frame", "uneven", "block-edges", "empty-chunks", "long-then-short", "two"],
)
def test_streamed_pieces_concatenate_to_the_whole_call_bit_for_bit(vocoder, sizes):
    chunks = torch.split(FEATURES, sizes)
    assert torch.equal(torch.cat(list(vocoder.synthesize_chunks(chunks))), vocoder.synthesize(FEATURES))


@pytest.mark.parametrize("frames", [1, 5, 31, 32, 33, 39, 40])
def test_short_sequences_stream_like_whole_ones(vocoder, frames):
    chunks = torch.split(FEATURES[:frames], 3)
    assert torch.equal(torch.cat(list(vocoder.synthesize_chunks(chunks))), vocoder.synthesize(FEATURES[:frames]))


def test_a_block_comes_out_once_its_window_has_arrived(vocoder):
    stream = vocoder.stream()
    assert stream.push(FEATURES[:38]).shape == (0,)  # block 0 needs frames 0..38 (32 + 7 context)
    first = stream.push(FEATURES[38:39])
    assert first.shape == (32 * 160,)
    assert stream.push(FEATURES[39:71]).shape == (32 * 160,)  # block 1: frames up to 32 + 32 + 7
    rest = stream.finish()
    assert rest.shape == ((71 - 64) * 160,)
    assert torch.equal(first, vocoder.synthesize(FEATURES[:71])[: 32 * 160])
    assert stream.buffer.shape[0] <= 32 + 2 * 7  # the stream keeps a window, not the whole sequence
    with pytest.raises(ModelInputError, match="has finished"):
        stream.push(FEATURES[:1])
    with pytest.raises(ModelInputError, match="already finished"):
        stream.finish()


def test_chunks_vocoded_alone_would_not_match(vocoder):
    # what the context windows are for: without them, chunk edges change the samples
    alone = torch.cat([vocoder.synthesize(chunk) for chunk in torch.split(FEATURES, 40)])
    assert not torch.allclose(alone, vocoder.synthesize(FEATURES), atol=1e-3)


def test_an_llm_hidden_state_or_log_mel_input_and_odd_rates():
    hidden = AudioEncoder().encode(torch.sin(torch.arange(3200) * 0.1))
    from_hidden = Vocoder(VocoderConfig(in_channels=128, upsample_rates=(3, 1, 2), initial_channels=64, block_frames=4))
    assert from_hidden.hop_length == 6
    assert from_hidden.synthesize(hidden).shape == (hidden.shape[0] * 6,)
    chunks = torch.split(hidden, 5)
    assert torch.equal(torch.cat(list(from_hidden.synthesize_chunks(chunks))), from_hidden.synthesize(hidden))
    assert Vocoder().synthesize(FEATURES.numpy()).shape == (123 * 160,)


@pytest.mark.parametrize(
    ("features", "words"),
    [
        (torch.zeros(10, 64), "takes float features (frames, 80) (time first); got float32 (10, 64)"),
        (torch.zeros(80, 10), "transposed? it takes time first"),
        (torch.zeros(10, 80, dtype=torch.int64), "got int64 (10, 80)"),
        (torch.zeros(1, 10, 80), "got float32 (1, 10, 80)"),
        (torch.zeros(0, 80), "takes at least one frame"),
        (torch.full((3, 80), float("nan")), "the vocoder's input holds NaN"),
        ({"mel": 1}, "the vocoder's input must be float features (frames, 80) (time first); got dict"),
    ],
)
def test_features_it_cannot_take_are_refused_with_the_expected_form(vocoder, features, words):
    with pytest.raises(ModelInputError) as error:
        vocoder.synthesize(features)
    assert words in str(error.value)
