"""Fragmentation of the Tmp Buffer Pool's buddy allocator (flowrt.memory.pool) under a random
workload: a 1 GiB pool, request sizes log-uniform from 4 KiB to 64 MiB, allocations and frees
keeping it about 70% (then 90%) occupied, a fixed seed.

Prints the internal fragmentation (1 - bytes asked / bytes handed out), the external one (1 -
largest free block / free bytes), both averaged over the steps, and the share of requests
refused although the free bytes in total would have held them.

    .venv/bin/python bench/pool_fragmentation.py [--steps N] [--seed S]
"""

from __future__ import annotations

import argparse
import math
import random
import sys

from flowrt.memory.pool import BufferPool, PoolExhausted

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def run(steps: int, seed: int, target: float = 0.7) -> dict[str, float]:
    rng = random.Random(seed)
    pool = BufferPool(GIB)
    holder = ("bench", "")
    live: list[int] = []
    internal = external = 0.0
    samples = refused = refused_with_room = requests = 0
    for _ in range(steps):
        stats = pool.statistics()
        occupied = stats["bytes_allocated"] / pool.capacity
        if live and (occupied > target or rng.random() < 0.3):
            pool.free(live.pop(rng.randrange(len(live))), holder)
        else:
            nbytes = int(math.exp(rng.uniform(math.log(4 * KIB), math.log(64 * MIB))))
            requests += 1
            try:
                live.append(pool.alloc(nbytes, holder).id)
            except PoolExhausted:
                refused += 1
                if stats["bytes_free"] >= nbytes:
                    refused_with_room += 1
        stats = pool.statistics()
        if stats["bytes_allocated"]:
            internal += 1 - stats["bytes_requested"] / stats["bytes_allocated"]
            external += 1 - stats["largest_free"] / stats["bytes_free"] if stats["bytes_free"] else 0
            samples += 1
    return {
        "internal fragmentation (mean)": internal / samples,
        "external fragmentation (mean)": external / samples,
        "requests refused": refused / requests,
        "refused although the free bytes sufficed": refused_with_room / requests,
        "mean occupancy target": target,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for target in (0.7, 0.9):
        print(f"occupancy target {target:.0%}:")
        for name, value in run(args.steps, args.seed, target).items():
            if name != "mean occupancy target":
                print(f"  {name}: {value:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
