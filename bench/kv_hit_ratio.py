"""Hit ratio of the slot engine's eviction policy (flowrt.params: TinyLFU sketch + four-level
frequency-aware LRU, whose pages idle for far longer than their own reuse interval are evicted
first: see flowrt/params/lru.py) against plain LRU and the offline optimum (Belady's MIN) on the
same traces.

Traces (page keys, fixed seeds):

- `zipf-0.9`, `zipf-1.1`: independent accesses over a universe of pages, Zipf-distributed ranks.
- `zipf+scans`: Zipf (s=1.0), interrupted every so often by a scan: a run of one-off sequential
  pages (a long document read once), which plain LRU lets flush the popular pages.
- `sessions`: multi-turn conversations: every turn of a session reads its whole prefix (a shared
  system prompt, then the pages of its earlier turns) and appends a few pages; a fixed number of
  sessions is live at a time, each ends after a random number of turns and a new one takes its
  place; sessions are picked Zipf-like (a few chatty users, many quiet ones).

Each policy sees one access at a time and must keep the page it just served (as the engine must:
the page is in use); Belady's MIN evicts the page whose next use is farthest, the page just served
included (so it is the optimum of any policy, the engine's included). The engine is driven
through its public API (`lookup`, `touch`, `allocate`), eviction included.

Where LRU already equals Belady's MIN (every miss compulsory: the cache holds every page that is
used again), no policy can beat LRU; the summary line counts those pairs apart.

    .venv/bin/python bench/kv_hit_ratio.py [--quick] [--accesses N] [--sizes 256,1024,4096] [--seed S]
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import itertools
import random
import sys
import time
from collections import OrderedDict
from collections.abc import Callable

from flowrt.params.slots import SlotEngine

# ── traces ──


def zipf_sampler(rng: random.Random, universe: int, s: float) -> Callable[[], int]:
    cumulative = list(itertools.accumulate(1.0 / (rank**s) for rank in range(1, universe + 1)))
    total = cumulative[-1]
    return lambda: bisect.bisect_left(cumulative, rng.random() * total)


def zipf_trace(accesses: int, seed: int, s: float, universe: int) -> list[str]:
    rng = random.Random(seed)
    draw = zipf_sampler(rng, universe, s)
    # ranks are shuffled onto page names so that popularity has nothing to do with the name
    names = [f"z{index}" for index in range(universe)]
    rng.shuffle(names)
    return [names[draw()] for _ in range(accesses)]


def zipf_with_scans(accesses: int, seed: int, universe: int, scan_every: int, scan_length: int) -> list[str]:
    rng = random.Random(seed)
    draw = zipf_sampler(rng, universe, 1.0)
    trace: list[str] = []
    scans = 0
    while len(trace) < accesses:
        trace.extend(f"z{draw()}" for _ in range(scan_every))
        trace.extend(f"scan{scans}/{index}" for index in range(scan_length))
        scans += 1
    return trace[:accesses]


def session_trace(accesses: int, seed: int, live: int = 48, system_pages: int = 4) -> list[str]:
    rng = random.Random(seed)
    pick = zipf_sampler(rng, live, 0.8)  # which live seat speaks next: a few chatty ones
    next_id = itertools.count()

    def new_session() -> dict:
        return {"id": next(next_id), "pages": 0, "turns_left": max(1, int(rng.expovariate(1 / 8)))}

    seats = [new_session() for _ in range(live)]
    system = [f"sys/{index}" for index in range(system_pages)]
    trace: list[str] = []
    while len(trace) < accesses:
        seat = pick()
        session = seats[seat]
        added = rng.randint(1, 4)
        trace.extend(system)
        trace.extend(f"s{session['id']}/{page}" for page in range(session["pages"] + added))
        session["pages"] += added
        session["turns_left"] -= 1
        if session["turns_left"] == 0:
            seats[seat] = new_session()
    return trace[:accesses]


def traces(accesses: int, seed: int) -> dict[str, list[str]]:
    return {
        "zipf-0.9": zipf_trace(accesses, seed, 0.9, universe=100_000),
        "zipf-1.1": zipf_trace(accesses, seed + 1, 1.1, universe=100_000),
        "zipf+scans": zipf_with_scans(accesses, seed + 2, universe=100_000, scan_every=20_000, scan_length=6_000),
        "sessions": session_trace(accesses, seed + 3),
    }


# ── policies ──


def engine_hits(trace: list[str], size: int) -> int:
    engine = SlotEngine(size, name="bench")
    for key in trace:
        if engine.lookup(key) is None:
            engine.allocate([key])  # evicts the coldest idle page when full; counts the access
        else:
            engine.touch(key)
    return engine.counters.hits


def lru_hits(trace: list[str], size: int) -> int:
    cache: OrderedDict[str, None] = OrderedDict()
    hits = 0
    for key in trace:
        if key in cache:
            hits += 1
            cache.move_to_end(key)
        else:
            if len(cache) >= size:
                cache.popitem(last=False)
            cache[key] = None
    return hits


def belady_hits(trace: list[str], size: int) -> int:
    never = len(trace)
    next_use = [never] * len(trace)
    seen: dict[str, int] = {}
    for position in range(len(trace) - 1, -1, -1):
        next_use[position] = seen.get(trace[position], never)
        seen[trace[position]] = position
    cached: dict[str, int] = {}  # key -> its next use
    farthest: list[tuple[int, str]] = []  # max-heap of (-next use, key); stale entries skipped
    hits = 0
    for position, key in enumerate(trace):
        if key in cached:
            hits += 1
        cached[key] = next_use[position]
        heapq.heappush(farthest, (-next_use[position], key))
        while len(cached) > size:
            negative, victim = heapq.heappop(farthest)
            if cached.get(victim) == -negative:
                del cached[victim]
    return hits


POLICIES = {"LRU": lru_hits, "engine": engine_hits, "Belady": belady_hits}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run (tests use it)")
    parser.add_argument("--accesses", type=int, default=None, help="accesses per trace (default 300000; quick 20000)")
    parser.add_argument("--sizes", default=None, help="cache sizes in pages (default 500,2000,8000; quick 200,1000)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    accesses = args.accesses or (20_000 if args.quick else 300_000)
    sizes = [int(size) for size in (args.sizes or ("200,1000" if args.quick else "500,2000,8000")).split(",")]
    started = time.perf_counter()
    print(f"{accesses} accesses per trace, seed {args.seed}; hit ratios (higher is better)\n")
    print("| trace | cache pages | LRU | engine | Belady (MIN) | engine/LRU | gap to Belady |")
    print("|---|---|---|---|---|---|---|")
    wins = ties = optimal = rows = 0
    for name, trace in traces(accesses, args.seed).items():
        for size in sizes:
            ratio = {policy: hits(trace, size) / len(trace) for policy, hits in POLICIES.items()}
            versus = ratio["engine"] / ratio["LRU"] if ratio["LRU"] else float("inf")
            rows += 1
            wins += ratio["engine"] > ratio["LRU"]
            ties += ratio["engine"] == ratio["LRU"]
            optimal += ratio["LRU"] == ratio["Belady"]
            print(
                f"| {name} | {size} | {ratio['LRU']:.1%} | {ratio['engine']:.1%} | {ratio['Belady']:.1%} | "
                f"{versus:.2f}x | {100 * (ratio['Belady'] - ratio['engine']):.1f} pts |"
            )
    print(
        f"\nengine beats LRU on {wins} of {rows} (trace, size) pairs, ties it on {ties}; LRU already equals "
        f"Belady's MIN (nothing left to beat) on {optimal}; {time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
