"""Time to first audio (TTFA) and the real-time factor of examples/voice_duplex under `--deploy
local`, with 1, 2, 4 and 8 conversations at once, side by side in one run.

Each conversation is a session of `--turns` calls of `graph turn`. A turn streams the example's
request (0.1 s of silence, a half-second synthetic voice, 0.4 s of silence, in 100 ms chunks), at
a volume of its own (`voiced`: no two turns of the run send the same clip), in
real time: a chunk every 100 ms, as a microphone would. The end-of-turn detector decides on the
chunk that completes 300 ms of silence after the voice; which chunk that is, the bench finds by
running the same detector (flowstd.roles.duplex.TurnDetector) over the audio first.

- **TTFA**: from sending the deciding chunk to receiving the first `speech` chunk: what the user
  waits between falling silent (plus the detector's 300 ms) and hearing the reply.
- **RTF** (real-time factor of the speech): the time from the first `speech` chunk to the last,
  over the duration of the audio before the last chunk (the audio the player had to play while
  waiting for the rest). Below 1, playback never waits for the next chunk.

By default the conversations run in step: every turn's input ends at the same moment, the worst
case (all generations at once); `--stagger` starts conversation n of N after n/N of one turn's
input, as conversations that do not line up would. Each conversation has a session of its own; the first turn of the run is a warm-up (models are
built lazily in each replica process) and is not counted. Medians and 90th percentiles over the
counted turns; the ratio is TTFA at N conversations over TTFA at 1.

    .venv/bin/python bench/voice_ttfa.py [--levels 1,2,4,8] [--turns 5] [--quick]
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "stdlib"))

from flowc.check import check_source  # noqa: E402
from flowc.codegen import build_bundle  # noqa: E402
from flowrt.deploy import open_deployment  # noqa: E402
from flowstd.roles.duplex import TurnDetector, chunk_pcm16  # noqa: E402
from flowstd.roles.voice import SAMPLE_RATE  # noqa: E402

EXAMPLE = ROOT / "examples" / "voice_duplex" / "pipeline.flow"
REQUEST = ROOT / "examples" / "voice_duplex" / "request.json"


def chunks() -> tuple[list[bytes], int, float]:
    """The request's chunks as PCM16, the index of the chunk on which the detector decides, and
    the seconds one chunk lasts."""
    frames = [chunk_pcm16(chunk) for chunk in json.loads(REQUEST.read_text())["audio_in"]]
    detector = TurnDetector()
    deciding = next(i for i, pcm in enumerate(frames) if detector.feed(pcm) is not None)
    return frames, deciding, len(frames[0]) / 2 / SAMPLE_RATE


def voiced(frames: list[bytes], conversation: int, turn: int) -> list[bytes]:
    """The request's audio at a volume of this conversation and turn's own (60-100%): every turn
    of the run is a different clip, so the encoder's cache answers none of them from another's
    (with the same clip everywhere, one forward would serve every conversation at once). The
    detector decides on the same chunk at every volume used."""
    scale = 0.6 + 0.4 * ((conversation * 37 + turn * 11) % 101) / 100
    return [array.array("h", (int(v * scale) for v in array.array("h", pcm))).tobytes() for pcm in frames]


def speech_seconds(value) -> float:
    return len(value.pcm16) / 2 / SAMPLE_RATE


async def turn(runtime, session: str, frames: list[bytes], deciding: int, pace: float) -> dict:
    """One turn, its input in real time: its TTFA and RTF (None where no speech came)."""
    call = runtime.start("turn", {}, session=session)
    speech: list[tuple[float, float]] = []  # (arrival, seconds of audio)
    decided: list[float] = []
    status: list[str] = []

    async def listen():
        async for event in call:
            if event.get("field") == "speech":
                speech.append((time.perf_counter(), speech_seconds(event["value"])))
            elif event["event"] == "done":
                status.append(event["status"])

    listening = asyncio.ensure_future(listen())
    start = time.perf_counter()
    for index, pcm in enumerate(frames):
        await call.send("audio_in", pcm)
        if index == deciding:
            decided.append(time.perf_counter())
        await asyncio.sleep(max(0.0, start + (index + 1) * pace - time.perf_counter()))
    await call.end("audio_in")
    await listening
    if not speech or status != ["ok"]:
        return {"ttfa": None, "rtf": None, "status": status}
    span = speech[-1][0] - speech[0][0]
    played = sum(seconds for _, seconds in speech[:-1])
    return {"ttfa": speech[0][0] - decided[0], "rtf": span / played if played else 0.0, "status": status}


async def conversation(runtime, name: str, turns: int, frames, deciding, pace, delay: float = 0.0, number: int = 0) -> list[dict]:
    await asyncio.sleep(delay)
    return [await turn(runtime, name, voiced(frames, number, t), deciding, pace) for t in range(turns)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(levels: list[int], turns: int, stagger: bool) -> None:
    frames, deciding, pace = chunks()
    source = EXAMPLE.read_text()
    result = check_source(source, "pipeline.flow", EXAMPLE)
    assert result.ok, [d.message for d in result.diagnostics]
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle"
        build_bundle(result.program, EXAMPLE, bundle).write(bundle)
        deployment = await open_deployment(bundle, "local")
        try:
            await conversation(deployment.runtime, "warm-up", 1, frames, deciding, pace)
            rows = []
            for level in levels:
                period = len(frames) * pace  # (staggered: the conversations' turns spread over one turn's input)
                results = await asyncio.gather(
                    *(
                        conversation(
                            deployment.runtime,
                            f"c{level}-{n}",
                            turns,
                            frames,
                            deciding,
                            pace,
                            n * period / level * stagger,
                            number=level * 100 + n,
                        )
                        for n in range(level)
                    )
                )
                counted = [r for conv in results for r in conv]
                ttfa = [r["ttfa"] for r in counted if r["ttfa"] is not None]
                rtf = [r["rtf"] for r in counted if r["rtf"] is not None]
                failed = len(counted) - len(ttfa)
                rows.append((level, ttfa, rtf, failed))
        finally:
            await deployment.close()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"input: {len(frames)} chunks of {pace * 1000:.0f} ms in real time; the detector decides on chunk {deciding}")
    print("conversations: " + ("staggered over one turn's input" if stagger else "in step (every turn ends at once)"))
    print()
    print("| conversations | turns | TTFA median (ms) | TTFA p90 (ms) | RTF median | RTF max | failed |")
    print("|---|---|---|---|---|---|---|")
    for level, ttfa, rtf, failed in rows:
        if not ttfa:
            print(f"| {level} | 0 | - | - | - | - | {failed} |")
            continue
        print(
            f"| {level} | {len(ttfa)} | {statistics.median(ttfa) * 1000:.0f} | {percentile(ttfa, 0.9) * 1000:.0f} "
            f"| {statistics.median(rtf):.2f} | {max(rtf):.2f} | {failed} |"
        )
    base = statistics.median(rows[0][1]) if rows[0][1] else None
    print()
    for level, ttfa, _, _ in rows[1:]:
        if base and ttfa:
            print(f"TTFA at {level} / at {rows[0][0]}: {statistics.median(ttfa) / base:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,2,4,8", help="conversations at once, comma-separated")
    parser.add_argument("--turns", type=int, default=5, help="turns per conversation at each level")
    parser.add_argument("--quick", action="store_true", help="levels 1,2 and one turn each (a smoke run)")
    parser.add_argument(
        "--stagger", action="store_true", help="start the conversations spread over one turn's input, not all at once"
    )
    args = parser.parse_args()
    levels = [1, 2] if args.quick else [int(n) for n in args.levels.split(",")]
    asyncio.run(main(levels, 1 if args.quick else args.turns, args.stagger))
