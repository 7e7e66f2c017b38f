"""Chained page hashing (flowrt.compute.hashing): pages per second of the C path, the hashlib
path (the specification, what runs without the extension) and a naive per-page Python loop,
side by side in one run; 16-token pages.

    python bench/page_hash.py [--pages 20000] [--repeat 50] [--quick]

Each row times one call over a whole sequence (best and median of the repeats), output
included: a list of hex page keys (`page_hashes`), or one bytes of 16-byte digests
(`page_digests`). The result is freed outside the timed window. The C path runs its SSSE3
compression that flowrt.compute chose at import (it times SSSE3 against the portable one
and keeps the faster), and is timed with the other one too. The last rows time a 4,096-token
prompt (256 pages) a call, where the per-call overhead shows. Every path is checked to give the
same keys. The default, 20,000 pages a call, is a 320,000-token sequence; 200,000-page calls
producing hex keys measured about 5% slower per page (more memory for the str objects).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from flowrt.compute import hashing  # noqa: E402

PAGE = 16


def naive(tokens: list[int], page_tokens: int = PAGE) -> list[str]:
    """The per-page loop one would write first: bytes built token by token, one hashlib call a page."""
    keys, parent = [], hashing.ROOT
    for start in range(0, len(tokens) - page_tokens + 1, page_tokens):
        page = b"".join(t.to_bytes(4, "little") for t in tokens[start : start + page_tokens])
        parent = hashlib.blake2b(hashing.PAGE_TAG + parent + page, digest_size=16).digest()
        keys.append(parent.hex())
    return keys


def timed(call, repeat: int) -> list[float]:
    """Seconds of each of `repeat` calls (after one warm-up); results freed outside the timing."""
    call()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = call()
        samples.append(time.perf_counter() - start)
        del result
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=20_000, help="pages a call on the C path (the slow paths get 1/10)")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="5,000 pages, 3 repeats (a smoke run)")
    args = parser.parse_args()
    pages, repeat = (5_000, 3) if args.quick else (args.pages, args.repeat)
    slow_pages = max(pages // 10, 1)
    rng = np.random.default_rng(0)
    u32 = rng.integers(0, 150_000, pages * PAGE, dtype=np.uint32)
    i64, as_list = u32.astype(np.int64), u32.astype(np.int64).tolist()
    slow = as_list[: slow_pages * PAGE]
    prompt = as_list[:4096]
    fast = hashing._native
    expected = naive(slow)
    assert hashing.spec_page_digests(slow).hex() == "".join(expected)
    assert fast is None or hashing.page_hashes(slow) == expected

    def spec_hex(tokens):
        text = hashing.spec_page_digests(tokens).hex()
        return [text[i : i + 32] for i in range(0, len(text), 32)]

    rows = []  # (path, input, output, pages a call, samples)
    gc.disable()  # no collection pauses inside the timed calls
    try:
        if fast is not None:
            c = f"C ({fast.compression()})"
            for name, tokens in (("numpy uint32", u32), ("numpy int64", i64), ("list[int]", as_list)):
                rows.append((c, name, "hex keys", pages, timed(lambda t=tokens: hashing.page_hashes(t), repeat)))
                rows.append((c, name, "bytes", pages, timed(lambda t=tokens: hashing.page_digests(t), repeat)))
            if fast.SIMD_AVAILABLE:  # the compression calibration did not choose, for comparison
                fast.use_simd(not fast.DEFAULT_SIMD)
                other = f"C ({fast.compression()}, not chosen)"
                rows.append((other, "numpy uint32", "hex keys", pages, timed(lambda: hashing.page_hashes(u32), repeat)))
                rows.append((other, "numpy uint32", "bytes", pages, timed(lambda: hashing.page_digests(u32), repeat)))
            fast.use_default()
        rows.append(("hashlib (spec)", "list[int]", "hex keys", slow_pages, timed(lambda: spec_hex(slow), repeat)))
        rows.append(("hashlib (spec)", "list[int]", "bytes", slow_pages, timed(lambda: hashing.spec_page_digests(slow), repeat)))
        rows.append(("naive loop", "list[int]", "hex keys", slow_pages, timed(lambda: naive(slow), repeat)))
        calls = max(repeat * 50, 100)
        if fast is not None:
            rows.append(
                (
                    f"C ({fast.compression()}), 4,096-token prompt",
                    "list[int]",
                    "hex keys",
                    256,
                    timed(lambda: hashing.page_hashes(prompt), calls),
                )
            )
        rows.append(("hashlib, 4,096-token prompt", "list[int]", "hex keys", 256, timed(lambda: spec_hex(prompt), calls)))
    finally:
        gc.enable()

    naive_rate = slow_pages / min(next(r[4] for r in rows if r[0] == "naive loop"))
    print(f"page hashing, {PAGE}-token pages, BLAKE2b-128 chain; backend: {hashing.BACKEND}; best and median of {repeat} calls")
    print()
    print("| path | tokens | output | pages a call | M pages/s (best) | M pages/s (median) | ns/page (best) | vs naive |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for path, name, output, n, samples in rows:
        best, median = n / min(samples), n / statistics.median(samples)
        print(
            f"| {path} | {name} | {output} | {n:,} | {best / 1e6:.2f} | {median / 1e6:.2f} | "
            f"{1e9 / best:.0f} | {best / naive_rate:.1f}x |"
        )
    if fast is None:
        print()
        print("the C extension is not in use: build it with `make install` or `pip install -e .`")


if __name__ == "__main__":
    main()
