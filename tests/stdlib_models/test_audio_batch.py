"""Audio clips encoded together: `AudioEncoder.encode_many` pads clips of any lengths to one forward
and masks the padding, so each clip's rows equal what `encode` gives it alone (exactly for one
clip, to within rounding for several; any lengths, a property); `AudioEncoderBatcher` gathers the
clips of callers that ask at once into one forward, and a clip the encoder refuses fails only its
caller, with the encoder's own words."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="needs torch: pip install 'flowc[models]'")

from flowstd.models import AudioEncoder, AudioEncoderConfig, ModelInputError  # noqa: E402 - after the skip
from flowstd.models.audio_batch import AudioEncoderBatcher  # noqa: E402

ENCODER = AudioEncoder(AudioEncoderConfig(output_hidden=48, seed=5))


def clip(seed: int, samples: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(samples, generator=generator) * 0.2


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(min_value=ENCODER.config.min_samples, max_value=12000), min_size=1, max_size=6))
def test_each_clip_of_a_padded_batch_gets_the_rows_it_gets_alone(lengths):
    clips = [clip(seed, samples) for seed, samples in enumerate(lengths)]
    together = ENCODER.encode_many(clips)
    for each, rows in zip(clips, together, strict=True):
        alone = ENCODER.encode(each)
        assert rows.shape == alone.shape == (ENCODER.config.frames(each.shape[0]), 48)
        torch.testing.assert_close(rows, alone, rtol=1e-4, atol=1e-4)
        assert rows.untyped_storage().nbytes() == rows.numel() * 4  # its own storage: it crosses processes alone


def test_the_mask_is_what_makes_the_short_clips_right():
    short, long = clip(1, 3000), clip(2, 11000)
    unmasked = ENCODER(torch.stack([torch.nn.functional.pad(ENCODER.log_mel(short), (0, 0, 0, 69 - 19)), ENCODER.log_mel(long)]))
    rows = ENCODER.encode_many([short, long])[0]
    frames = ENCODER.config.frames(3000)
    assert not torch.allclose(unmasked[0, :frames], ENCODER.encode(short), atol=1e-3)  # padding read as input
    torch.testing.assert_close(rows, ENCODER.encode(short), rtol=1e-4, atol=1e-4)


def test_one_clip_is_exactly_encode():
    each = clip(3, 7001)
    assert torch.equal(ENCODER.encode_many([each])[0], ENCODER.encode(each))


def test_callers_that_ask_at_once_share_one_forward():
    clips = [clip(seed, 4000 + 977 * seed) for seed in range(5)]

    async def main():
        batcher = AudioEncoderBatcher(ENCODER)
        rows = await asyncio.gather(*(batcher.encode(each) for each in clips))
        alone = await batcher.encode(clips[0])
        return rows, alone, batcher.statistics()

    rows, alone, stats = asyncio.run(main())
    for each, got in zip(clips, rows, strict=True):
        torch.testing.assert_close(got, ENCODER.encode(each), rtol=1e-4, atol=1e-4)
    assert torch.equal(alone, ENCODER.encode(clips[0]))
    assert stats == {"rounds": 2, "dropped": 0, "waiting": 0, "forwards": 2, "clips": 6, "largest_forward": 5}


def test_a_clip_the_encoder_refuses_fails_only_its_caller():
    async def main():
        batcher = AudioEncoderBatcher(ENCODER)
        asked = [clip(1, 5000), torch.zeros(10), clip(2, 6000), torch.tensor([0.0, float("nan")] * 200)]
        return await asyncio.gather(*(batcher.encode(each) for each in asked), return_exceptions=True), batcher.statistics()

    (first, short, second, nan), stats = asyncio.run(main())
    torch.testing.assert_close(first, ENCODER.encode(clip(1, 5000)))
    torch.testing.assert_close(second, ENCODER.encode(clip(2, 6000)))
    assert isinstance(short, ModelInputError) and "too short: 10 samples" in str(short)
    assert isinstance(nan, ModelInputError) and "finite" in str(nan)
    assert stats["waiting"] == 0 and stats["clips"] == 2


def test_a_caller_cancelled_before_its_round_is_dropped():
    async def main():
        batcher = AudioEncoderBatcher(ENCODER)
        kept = asyncio.ensure_future(batcher.encode(clip(1, 5000)))
        gone = asyncio.ensure_future(batcher.encode(clip(2, 5000)))
        await asyncio.sleep(0)  # both asked; the round has not run
        gone.cancel()
        return await kept, batcher.statistics()

    rows, stats = asyncio.run(main())
    assert rows.shape[0] == ENCODER.config.frames(5000)
    assert stats["dropped"] == 1 and stats["clips"] == 1 and stats["waiting"] == 0
