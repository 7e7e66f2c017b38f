"""The Global Params Pool's tiers side by side in one run: GB/s of moving pages L1 -> L2 -> L3
and back (flowrt.params.tiers.copy_slots) against a plain memcpy of the same bytes (torch copy_,
numpy copyto) and a plain file write of them; then the copies per 1,000-page transfer with and
without coalescing (FlowKV), for consecutive, fragmented and scattered slot lists.

L1 is a DeviceTier on this machine's device (the CPU where there is no GPU: then L1 <-> L2 is
the layout conversion in PyTorch, flowrt.params.convert), L2 a HostTier in /dev/shm, L3 a
DiskTier in a temporary directory on local disk (--dir). Each figure is the best of --repeat
runs after one warm-up (which faults the fresh pages in). "L2 -> L3" writes into the page
cache, as a plain file write does; "+ flush" adds msync / fsync, the bytes on the disk. "L3
(cold) -> L2" first evicts the file from the page cache (posix_fadvise DONTNEED), so it reads
the disk.

    .venv/bin/python bench/kv_tiers.py [--quick] [--pages N] [--repeat N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy
import torch

from flowrt.params import convert
from flowrt.params.layout import KVLayout
from flowrt.params.tiers import DeviceTier, DiskTier, HostTier, copy_slots

# a small model's KV cache: 4 layers x (k, v), pages of 16 tokens x 8 heads x 64 dims, float16
LAYOUT = KVLayout("kv", tuple(str(i) for i in range(4)), ("k", "v"), page_tokens=16, heads=8, head_dim=64, dtype="float16")
COUNT_LAYOUT = KVLayout("count", ("0",), ("k", "v"), page_tokens=1, heads=1, head_dim=8, dtype="float16")  # copies only


def best_of(repeat: int, run: Callable[[], object], before: Callable[[], object] | None = None) -> tuple[float, object]:
    """The fastest of `repeat` timed runs after one warm-up; and what the last one returned."""
    result = None
    timings = []
    for attempt in range(repeat + 1):
        if before is not None:
            before()
        start = time.perf_counter()
        result = run()
        elapsed = time.perf_counter() - start
        if attempt:  # the first run is the warm-up
            timings.append(elapsed)
    return min(timings), result


def fragmented(count: int, rng: random.Random, longest: int) -> tuple[list[int], list[int]]:
    """`count` source slots in runs of 1..longest pages, written to destination runs in another order."""
    lengths = []
    while sum(lengths) < count:
        lengths.append(min(rng.randint(1, longest), count - sum(lengths)))
    starts, at = [], 0
    for length in lengths:
        starts.append(at)
        at += length
    order = list(range(len(lengths)))
    rng.shuffle(order)
    sources = [s for i in range(len(lengths)) for s in range(starts[i], starts[i] + lengths[i])]
    targets = [d for i in order for d in range(starts[i], starts[i] + lengths[i])]
    return sources, targets


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1000, help="pages per transfer (default 1000: 125 MiB)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="64 pages, one timed run: a smoke test")
    parser.add_argument("--dir", default=None, help="where L3 and the file baseline write (default: a temporary directory)")
    args = parser.parse_args()
    pages, repeat = (64, 1) if args.quick else (args.pages, args.repeat)
    nbytes = pages * LAYOUT.page_bytes
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(1)  # one copy at a time, as the pool's mover does; memcpy gets the same
    print(
        f"layout: {len(LAYOUT.chunks())} chunks of {LAYOUT.page_tokens}x{LAYOUT.heads}x{LAYOUT.head_dim} {LAYOUT.dtype}, "
        f"page {LAYOUT.page_bytes // 1024} KiB; {pages} pages = {nbytes / 2**20:.0f} MiB per transfer; best of {repeat}"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} thread); "
        f"L1 on {device}; CUDA kernel: {convert.kernel_status()}"
    )
    rows: list[tuple[str, int, int, float]] = []  # (transfer, pages, copies, seconds)

    # ── baselines: the same bytes, no tiers ──
    a = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    b = torch.empty_like(a)
    seconds, _ = best_of(repeat, lambda: b.copy_(a))
    rows.append(("memcpy (torch copy_)", pages, 1, seconds))
    a_np, b_np = a.numpy(), b.numpy()
    seconds, _ = best_of(repeat, lambda: numpy.copyto(b_np, a_np))
    rows.append(("memcpy (numpy copyto)", pages, 1, seconds))

    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        plain = Path(directory) / "plain.bin"

        def write_file(sync: bool) -> None:
            with open(plain, "wb") as file:
                file.write(memoryview(a_np))
                if sync:
                    file.flush()
                    os.fsync(file.fileno())

        seconds, _ = best_of(repeat, lambda: write_file(False), before=lambda: plain.unlink(missing_ok=True))
        rows.append(("file write (page cache)", pages, 1, seconds))
        seconds, _ = best_of(repeat, lambda: write_file(True), before=lambda: plain.unlink(missing_ok=True))
        rows.append(("file write + fsync", pages, 1, seconds))
        plain.unlink(missing_ok=True)

        # ── the tiers ──
        l1 = DeviceTier(LAYOUT, pages, device)
        for stack in l1.stacks:
            stack.view(torch.uint8).copy_(torch.randint(0, 256, stack.view(torch.uint8).shape, dtype=torch.uint8))
        l2 = HostTier.create(LAYOUT, pages)
        l3 = DiskTier(Path(directory) / "l3", LAYOUT, pages)
        back = DeviceTier(LAYOUT, pages, device)
        every = range(pages)

        def reopen_cold() -> None:  # L3 with none of its pages in the page cache
            nonlocal l3
            l3.close()
            evict(l3.path)
            l3 = DiskTier(Path(directory) / "l3", LAYOUT, pages)

        try:

            def timed(name: str, run: Callable[[], object], before: Callable[[], object] | None = None) -> None:
                seconds, stats = best_of(repeat, run, before)
                rows.append((name, pages, stats.segments, seconds))

            timed("L1 -> L2 (device -> host shm)", lambda: copy_slots(l1, every, l2, every))
            timed("L2 -> L3 (host -> disk, page cache)", lambda: copy_slots(l2, every, l3, every))
            timed("L2 -> L3 + flush (msync)", lambda: (copy_slots(l2, every, l3, every), l3.flush())[0])
            timed("L3 -> L2 (disk in page cache -> host)", lambda: copy_slots(l3, every, l2, every))
            timed("L3 (cold) -> L2", lambda: copy_slots(l3, every, l2, every), before=reopen_cold)
            timed("L2 -> L1 (host -> device)", lambda: copy_slots(l2, every, back, every))
            timed("L1 -> L3 (device -> disk, page cache)", lambda: copy_slots(l1, every, l3, every))
            sources, targets = fragmented(pages, random.Random(1), 16)
            timed("L1 -> L2, fragmented, coalesced", lambda: copy_slots(l1, sources, l2, targets))
            timed("L1 -> L2, fragmented, page by page", lambda: copy_slots(l1, sources, l2, targets, coalesce=False))
            timed("L2 -> L3, fragmented, coalesced", lambda: copy_slots(l2, sources, l3, targets))
            timed("L2 -> L3, fragmented, page by page", lambda: copy_slots(l2, sources, l3, targets, coalesce=False))
            for ours, theirs in zip(back.stacks, l1.stacks, strict=True):  # the round trip kept every byte
                assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8))
        finally:
            l2.close()
            l3.close()

    print()
    print("| transfer | pages | MiB | copies | best s | GB/s | vs memcpy |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    memcpy = rows[0][3]
    for name, count, copies, seconds in rows:
        moved = count * LAYOUT.page_bytes
        print(
            f"| {name} | {count} | {moved / 2**20:.0f} | {copies} | {seconds:.4f} | {moved / seconds / 1e9:.2f} | {memcpy / seconds:.2f}x |"
        )

    # ── copies per 1,000-page transfer ──
    print()
    print("| 1,000-page transfer (L1 -> L2) | copies, coalesced | copies, page by page |")
    print("|---|---:|---:|")
    count_l1, count_l2 = DeviceTier(COUNT_LAYOUT, 2000), HostTier.create(COUNT_LAYOUT, 2000)
    rng = random.Random(2)
    try:
        lists = [
            ("consecutive (slots 0..999 -> 500..1499)", list(range(1000)), list(range(500, 1500))),
            ("fragmented (runs of 1..64 pages)", *fragmented(1000, rng, 64)),
            ("fragmented (runs of 1..16 pages)", *fragmented(1000, rng, 16)),
            ("scattered (random slots)", rng.sample(range(2000), 1000), rng.sample(range(2000), 1000)),
        ]
        for name, sources, targets in lists:
            merged = copy_slots(count_l1, sources, count_l2, targets).segments
            single = copy_slots(count_l1, sources, count_l2, targets, coalesce=False).segments
            print(f"| {name} | {merged} | {single} |")
    finally:
        count_l2.close()


if __name__ == "__main__":
    main()
