"""VocoderBatcher: concurrent streams' blocks in shared forwards give each stream what it would
get alone (bit for bit when a window is alone in its forward, to within rounding in a batch), in
order, whatever the chunkings (a property); callers cancelled before their round are dropped; a
window the model cannot take fails only its caller."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="needs torch: pip install 'flowc[models]'")

from flowstd.models import Vocoder, VocoderConfig  # noqa: E402 - after the skip
from flowstd.models.vocoder import BlockWindow  # noqa: E402
from flowstd.models.vocoder_batch import VocoderBatcher  # noqa: E402

FEATURES = torch.sin(torch.arange(90 * 80, dtype=torch.float32).reshape(90, 80) * 0.37) * 3.0 - 4.0
VOCODER = Vocoder(VocoderConfig(block_frames=8))  # (as the voice talker's: a block once 15 frames arrived)


def features(seed: int, frames: int) -> torch.Tensor:
    return torch.roll(FEATURES, seed, dims=0)[:frames]


async def streamed(batcher: VocoderBatcher, rows: torch.Tensor, cuts: list[int], gate: asyncio.Event) -> torch.Tensor:
    """A stream fed `rows` cut at `cuts`, its blocks through `batcher`; every caller starts at once."""
    await gate.wait()
    stream, pieces = VOCODER.stream(), []
    edges = [0, *sorted({c for c in cuts if 0 < c < len(rows)}), len(rows)]
    for start, end in zip(edges, edges[1:], strict=False):
        pieces.append(await batcher.synthesize(stream.windows(rows[start:end])))
    pieces.append(await batcher.synthesize(stream.final_windows()))
    return torch.cat(pieces)


@settings(max_examples=25, deadline=None)
@given(
    streams=st.lists(
        st.tuples(st.integers(0, 89), st.integers(1, 90), st.lists(st.integers(1, 89), max_size=6)), min_size=1, max_size=6
    )
)
def test_concurrent_streams_get_what_each_would_alone(streams):
    async def main():
        batcher, gate = VocoderBatcher(VOCODER), asyncio.Event()
        tasks = [asyncio.ensure_future(streamed(batcher, features(seed, n), cuts, gate)) for seed, n, cuts in streams]
        gate.set()
        return await asyncio.gather(*tasks), batcher.statistics()

    results, stats = asyncio.run(main())
    for (seed, n, _), samples in zip(streams, results, strict=True):
        alone = VOCODER.synthesize(features(seed, n))
        assert samples.shape == alone.shape
        assert torch.allclose(samples, alone, atol=1e-5)
    assert stats["waiting"] == 0 and stats["blocks"] >= len(streams)


def test_blocks_asked_for_together_share_one_forward_per_window_length():
    async def main():
        batcher = VocoderBatcher(VOCODER)
        streams = [VOCODER.stream() for _ in range(5)]
        first = [stream.windows(features(i, 15)) for i, stream in enumerate(streams)]  # block 0's window: 15 frames
        pieces = await asyncio.gather(*(batcher.synthesize(windows) for windows in first))
        return pieces, batcher.statistics()

    pieces, stats = asyncio.run(main())
    assert (stats["rounds"], stats["forwards"], stats["blocks"], stats["largest_forward"]) == (1, 1, 5, 5)
    for i, piece in enumerate(pieces):
        assert torch.allclose(piece, VOCODER.synthesize(features(i, 15))[: VOCODER.samples_for(8)], atol=1e-5)


def test_a_caller_cancelled_before_its_round_is_dropped_and_a_bad_window_fails_alone():
    async def main():
        batcher = VocoderBatcher(VOCODER)
        good = VOCODER.stream().windows(features(0, 15))
        bad = [BlockWindow(torch.zeros(15, 3), 0, 160)]  # 3 channels: the model takes 80
        cancelled = asyncio.ensure_future(batcher.synthesize(VOCODER.stream().windows(features(1, 15))))
        kept = asyncio.ensure_future(batcher.synthesize(good))
        failing = asyncio.ensure_future(batcher.synthesize(bad))
        await asyncio.sleep(0)
        cancelled.cancel()
        results = await asyncio.gather(kept, failing, return_exceptions=True)
        return results, batcher.statistics()

    (samples, error), stats = asyncio.run(main())
    assert torch.equal(samples, VOCODER.synthesize(features(0, 15))[: VOCODER.samples_for(8)])  # alone in its forward
    assert isinstance(error, RuntimeError) and stats["dropped"] == 1 and stats["waiting"] == 0


def test_no_windows_is_no_samples_and_no_round():
    async def main():
        batcher = VocoderBatcher(VOCODER)
        return await batcher.synthesize([]), batcher.statistics()

    samples, stats = asyncio.run(main())
    assert samples.numel() == 0 and stats["rounds"] == 0


def test_a_round_that_fails_past_its_forwards_fails_its_callers_and_the_next_round_runs():
    class Odd(torch.nn.Module):  # a batched output of another shape: the pieces cannot be joined
        device = VOCODER.device

        def forward(self, frames):
            return VOCODER(frames)[:, None, :] if frames.shape[0] > 1 else VOCODER(frames)

    async def main():
        batcher = VocoderBatcher(Odd())
        streams = [VOCODER.stream() for _ in range(2)]
        windows = [s.windows(features(i, 40)) + s.final_windows() for i, s in enumerate(streams)]
        failed = await asyncio.wait_for(asyncio.gather(*(batcher.synthesize(w) for w in windows), return_exceptions=True), 5)
        alone = await asyncio.wait_for(batcher.synthesize(VOCODER.stream().windows(features(0, 15))), 5)
        return failed, alone, batcher.statistics()

    failed, alone, stats = asyncio.run(main())
    assert all(isinstance(error, RuntimeError) and "could not synthesize" in str(error) for error in failed)
    assert alone.numel() == VOCODER.samples_for(8) and stats["waiting"] == 0
