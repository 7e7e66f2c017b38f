"""The audio encoder's clips one by one against one padded forward (`AudioEncoder.encode_many`,
what `AudioEncoderBatcher` runs for the turns of several conversations heard at once), side by
side in one run: N clips of lengths between 0.5 and 1 s, interleaved rounds, medians.

By default torch gets one thread, as a replica process does in examples/voice_duplex under
`--deploy local` on a 2-CPU machine (docs/deploy.md, "CPU threads"); `--threads` changes it.

    .venv/bin/python bench/audio_encoder_batch.py [--clips 1,2,4,8] [--rounds 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "stdlib"))

import torch  # noqa: E402

from flowstd.roles.voice import VoiceRuntime  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", default="1,2,4,8", help="clips per round, comma-separated")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    encoder = VoiceRuntime.shared().build("audio_encoder").audio_encoder  # the voice module's own
    generator = torch.Generator().manual_seed(0)
    levels = [int(n) for n in args.clips.split(",")]
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds; ms per round")
    print("\n| clips | one by one (ms) | one forward (ms) | one by one / one forward |\n|---|---|---|---|")
    for count in levels:
        clips = [torch.randn(int(16000 * (0.5 + 0.5 * i / max(1, count - 1))), generator=generator) * 0.2 for i in range(count)]
        serial, batched = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for clip in clips:
                encoder.encode(clip)
            serial.append(time.perf_counter() - start)
            start = time.perf_counter()
            encoder.encode_many(clips)
            batched.append(time.perf_counter() - start)
        one, many = statistics.median(serial) * 1e3, statistics.median(batched) * 1e3
        print(f"| {count} | {one:.2f} | {many:.2f} | {one / many:.2f}x |")


if __name__ == "__main__":
    main()
