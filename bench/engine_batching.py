"""Tokens per second of the reference engine with continuous batching vs the same model run one
request at a time (flowrt.compute.engine: PagedGenerator on a real KVPool, with and without a
ContinuousBatcher), side by side in one run, at 1, 8 and 32 concurrent sessions.

Every session has a prompt of its own (default 64 tokens) and generates a fixed number of tokens
(default 32, greedy). **batched**: all sessions start at once on one event loop and share forward
steps through the batcher (their prefills together, then one decode step for all a token).
**one at a time**: the same sessions, one after the other, each step a forward of its own. Both
start from an empty pool and include prefill; tokens/s = generated tokens / wall time. The two
modes are checked to produce the same tokens. Best of the repetitions.

    .venv/bin/python bench/engine_batching.py [--sessions 1,8,32] [--prompt 64] [--new 32] [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from flowrt.compute.engine import ContinuousBatcher, PagedGenerator, ReferenceConfig, ReferenceEngine  # noqa: E402
from flowrt.compute.hashing import page_hashes  # noqa: E402
from flowrt.params.meta import EmbeddedStore  # noqa: E402
from flowrt.params.pool import KVPool  # noqa: E402
from flowrt.params.session import KVSession  # noqa: E402

PAGE = 16
BENCH_MODEL = ReferenceConfig(
    vocab_size=4096, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32, intermediate_size=768, seed=0
)
QUICK_MODEL = ReferenceConfig(vocab_size=512, seed=0)


async def session(generator: PagedGenerator, pool: KVPool, name: str, prompt: list[int], new: int) -> list[int]:
    async with KVSession(pool, name, name, page_hashes) as kv:
        return (await generator.generate(kv, prompt, max_new_tokens=new)).tokens


def run(config: ReferenceConfig, prompts: list[list[int]], new: int, batched: bool) -> tuple[float, list[list[int]], int]:
    """(seconds, tokens per session, engine forwards) of one run from an empty pool."""
    engine = ReferenceEngine(config)
    pages = len(prompts) * ((max(map(len, prompts)) + new) // PAGE + 4)
    pool = KVPool(engine.describe().kv_layout("kv", PAGE), device_pages=pages, store=EmbeddedStore("b"), deployment="b", node="b")
    batcher = ContinuousBatcher(engine) if batched else None
    generator = PagedGenerator(engine, batcher=batcher)
    forwards = 0

    async def everything() -> list[list[int]]:
        if batched:
            return list(await asyncio.gather(*(session(generator, pool, f"s{i}", p, new) for i, p in enumerate(prompts))))
        return [await session(generator, pool, f"s{i}", p, new) for i, p in enumerate(prompts)]

    try:
        started = time.perf_counter()
        tokens = asyncio.run(everything())
        seconds = time.perf_counter() - started
    finally:
        pool.close()
    forwards = batcher.stats.forwards if batcher is not None else len(prompts) * new
    return seconds, tokens, forwards


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default=None, help="concurrent sessions (default 1,8,32; quick 1,4)")
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens per session (default 64; quick 16)")
    parser.add_argument("--new", type=int, default=None, help="generated tokens per session (default 32; quick 6)")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions, best kept (default 3; quick 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier on a shared machine)")
    parser.add_argument("--quick", action="store_true", help="a tiny model and run: a smoke test")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    counts = [int(n) for n in (args.sessions or ("1,4" if args.quick else "1,8,32")).split(",")]
    prompt_tokens = args.prompt or (16 if args.quick else 64)
    new = args.new or (6 if args.quick else 32)
    repeat = args.repeat or (1 if args.quick else 3)
    config = QUICK_MODEL if args.quick else BENCH_MODEL
    print(
        f"model: reference, {config.num_layers} layers, hidden {config.hidden_size}, {config.num_heads} heads / "
        f"{config.num_kv_heads} KV heads x {config.head_dim}, vocab {config.vocab_size}, float32 on cpu; pages of {PAGE} tokens"
    )
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"each session: {prompt_tokens}-token prompt, {new} tokens generated (greedy); best of {repeat}\n")
    rng = random.Random(0)
    run(config, [[1, 2, 3]], 2, batched=True)  # warm-up
    rows = []
    for count in counts:
        prompts = [[rng.randrange(config.vocab_size) for _ in range(prompt_tokens)] for _ in range(count)]
        best: dict[bool, tuple[float, list[list[int]], int]] = {}
        for _ in range(repeat):
            for batched in (True, False):
                outcome = run(config, prompts, new, batched)
                if batched not in best or outcome[0] < best[batched][0]:
                    best[batched] = outcome
        if best[True][1] != best[False][1]:
            print(f"MISMATCH at {count} sessions: batched and one-at-a-time tokens differ")
            return 1
        rows.append((count, best[True], best[False]))

    print("| sessions | mode | forwards | seconds | tokens/s | batched / one at a time |")
    print("|---:|---|---:|---:|---:|---:|")
    for count, batched, alone in rows:
        generated = count * new
        ratio = alone[0] / batched[0]
        print(f"| {count} | batched | {batched[2]} | {batched[0]:.3f} | {generated / batched[0]:.0f} | {ratio:.1f}x |")
        print(f"| {count} | one at a time | {alone[2]} | {alone[0]:.3f} | {generated / alone[0]:.0f} | 1.0x |")
    print()
    for count, batched, alone in rows:
        print(f"sessions {count}: batched/one-at-a-time tokens/s = {alone[0] / batched[0]:.1f}x; same tokens: yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
