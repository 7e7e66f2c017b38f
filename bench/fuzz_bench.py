"""Run many randomly mutated .flow programs through flowc and count crashes (goal: 0).

A crash is any exception out of `check_source`, or flowc misbehaving on a program that checks
(fmt not idempotent, fmt changing the meaning, a diagnostic pointing outside the file). Inputs
come from the same mutation engine as tests/property. Crashing inputs are written to
bench/fuzz_crashes/ so they can be replayed.

    python bench/fuzz_bench.py [--count 100000] [--seed 0] [--workers 2]
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import random
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.property.harness import compile_and_verify  # noqa: E402
from tests.property.mutations import mutate, seeds  # noqa: E402


def run_chunk(args: tuple[int, int, int]) -> tuple[int, int, list[tuple[str, str]]]:
    start, stop, seed = args
    sources = seeds()
    valid = 0
    crashes: list[tuple[str, str]] = []
    for index in range(start, stop):
        rng = random.Random(seed * 1_000_003 + index)
        text = mutate(rng.choice(sources), rng)
        try:
            valid += compile_and_verify(text)
        except Exception:  # noqa: BLE001 - counting every kind of crash is the point
            crashes.append((text, traceback.format_exc(limit=4)))
    return stop - start, valid, crashes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    chunk = 2_000
    jobs = [(s, min(s + chunk, args.count), args.seed) for s in range(0, args.count, chunk)]
    began = time.perf_counter()
    total = valid = 0
    crashes: list[tuple[str, str]] = []
    with multiprocessing.Pool(args.workers) as pool:
        for done, still_valid, found in pool.imap_unordered(run_chunk, jobs):
            total += done
            valid += still_valid
            crashes += found
    elapsed = time.perf_counter() - began
    kinds = collections.Counter(tb.strip().splitlines()[-1] for _, tb in crashes)
    print(f"inputs: {total}")
    print(f"still valid after mutation: {valid}")
    print(f"crashes: {len(crashes)}")
    print(f"time: {elapsed:.1f} s ({total / elapsed:,.0f} inputs/s on {args.workers} workers)")
    for kind, count in kinds.most_common(10):
        print(f"  {count:6d}  {kind[:160]}")
    if crashes:
        out = REPO / "bench" / "fuzz_crashes"
        out.mkdir(exist_ok=True)
        for i, (text, tb) in enumerate(crashes[:50]):
            (out / f"crash_{i:03d}.flow").write_text(text, encoding="utf-8", errors="surrogateescape")
            (out / f"crash_{i:03d}.txt").write_text(tb)
        print(f"first crashing inputs written to {out.relative_to(REPO)}/")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
