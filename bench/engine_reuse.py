"""Turn-2 time to first token with prefix reuse vs full recompute (flowrt.compute.engine: the
reference engine driven by PagedGenerator on a real KVPool), side by side in one run.

Turn 1 of a session prefills a long history (default 2,000 tokens) and generates 16 tokens; its
full pages are committed. Turn 2 sends the whole history back with a new 32-token message:

- **reuse**: the same pool; the matched pages are reused and only the tokens after the last full
  page are computed (the history's trailing partial page, the reply, the new message);
- **recompute**: a fresh pool (nothing cached), every token computed.

Time to first token is measured by the driver from the call to the first sampled token (page
hashing, matching, allocation, prefill and sampling included). Each repetition sends a different
new message (so turn 2 of one repetition never reuses another's pages); the two modes are checked
to produce the same token. Median and best of the repetitions; the ratio is recompute / reuse.

    .venv/bin/python bench/engine_reuse.py [--history 2000] [--repeat 7] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from flowrt.compute.engine import PagedGenerator, ReferenceConfig, ReferenceEngine  # noqa: E402
from flowrt.compute.hashing import page_hashes  # noqa: E402
from flowrt.params.meta import EmbeddedStore  # noqa: E402
from flowrt.params.pool import KVPool  # noqa: E402
from flowrt.params.session import KVSession  # noqa: E402

PAGE = 16
BENCH_MODEL = ReferenceConfig(
    vocab_size=4096, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32, intermediate_size=768, seed=0
)
QUICK_MODEL = ReferenceConfig(vocab_size=512, seed=0)


def new_pool(engine: ReferenceEngine, tokens: int, name: str) -> KVPool:
    pages = 4 * (tokens // PAGE + 8)
    return KVPool(
        engine.describe().kv_layout("kv", PAGE), device_pages=pages, store=EmbeddedStore(name), deployment=name, node=name
    )


async def turn(generator: PagedGenerator, pool: KVPool, session: str, tokens: list[int], owner: str, new: int):
    async with KVSession(pool, session, owner, page_hashes) as kv:
        return await generator.generate(kv, tokens, max_new_tokens=new)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=None, help="turn-1 history tokens (default 2000; quick 300)")
    parser.add_argument("--message", type=int, default=32, help="tokens of the new message of turn 2")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions (default 7; quick 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier on a shared machine)")
    parser.add_argument("--quick", action="store_true", help="a tiny model and history: a smoke test")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    history_tokens = args.history or (300 if args.quick else 2000)
    repeat = args.repeat or (2 if args.quick else 7)
    config = QUICK_MODEL if args.quick else BENCH_MODEL
    engine = ReferenceEngine(config)
    rng = random.Random(0)
    history = [rng.randrange(config.vocab_size) for _ in range(history_tokens)]
    print(
        f"model: reference, {config.num_layers} layers, hidden {config.hidden_size}, {config.num_heads} heads / "
        f"{config.num_kv_heads} KV heads x {config.head_dim}, vocab {config.vocab_size}, float32 on cpu; pages of {PAGE} tokens"
    )
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads)")

    warm_pool = new_pool(engine, history_tokens + 64 * repeat, "warm")
    generator = PagedGenerator(engine)
    first = asyncio.run(turn(generator, warm_pool, "s", history, "turn-1", 16))
    history2 = history + first.tokens
    print(f"turn 1: {len(history)} history tokens, {len(first.tokens)} generated, {first.committed_pages} pages committed")

    reuse_times, recompute_times = [], []
    reused = computed = None
    for rep in range(repeat + 1):  # the first repetition warms both paths up and is not counted
        message = [rng.randrange(config.vocab_size) for _ in range(args.message)]
        tokens = history2 + message
        warm = asyncio.run(turn(generator, warm_pool, "s", tokens, f"turn-2-{rep}", 1))
        cold_engine = ReferenceEngine(config)  # same seed, same weights; bound to a fresh, empty pool
        cold_pool = new_pool(cold_engine, len(tokens), f"cold{rep}")
        try:
            cold = asyncio.run(turn(PagedGenerator(cold_engine), cold_pool, "s", tokens, f"cold-{rep}", 1))
        finally:
            cold_pool.close()
        if warm.tokens != cold.tokens:
            print(f"MISMATCH: reuse gave {warm.tokens}, recompute {cold.tokens}")
            return 1
        assert cold.reused_tokens == 0
        reused, computed = warm.reused_tokens, warm.computed_tokens
        if rep:
            reuse_times.append(warm.first_token_seconds)
            recompute_times.append(cold.first_token_seconds)
    warm_pool.close()

    def ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1e3:.2f} | {min(values) * 1e3:.2f}"

    total = len(history2) + args.message
    print(
        f"\nturn 2: {total} tokens; reuse: {reused} reused, {computed} computed; recompute: {total} computed; {repeat} repetitions"
    )
    print("\n| turn 2 | tokens computed | TTFT p50 ms | TTFT best ms |")
    print("|---|---:|---:|---:|")
    print(f"| reuse (pages matched in the pool) | {computed} | {ms(reuse_times)} |")
    print(f"| recompute (empty pool) | {total} | {ms(recompute_times)} |")
    ratio = statistics.median(recompute_times) / statistics.median(reuse_times)
    print(f"\nrecompute/reuse TTFT (p50) = {ratio:.1f}x (goal >= 5x); same first token in both: yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
