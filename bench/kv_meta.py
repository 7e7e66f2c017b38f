"""KV metadata: a 1,000-page session prefix match on Redis, side by side with the floor, one
EVALSHA of a no-op script, in one run; round trips counted on the wire (each is one send).

    python bench/kv_meta.py [--url redis://127.0.0.1:6379/0] [--pages 1000] [--repeat 200] [--quick]

The pages are provided by a k node and two v nodes with overlapping ranges (a candidate
combination of two partial layouts), each publishing where it keeps every page (its slots), so
the match checks providers, chooses them page by page and answers the chosen providers' slots,
all in its one round trip. The bench uses a deployment namespace of its own and deletes its
keys after.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from flowrt.params.layout import KVLayout  # noqa: E402
from flowrt.params.meta.redis_store import RedisStore  # noqa: E402


class Counting(redis.connection.Connection):
    sends = 0

    def send_packed_command(self, command, check_health=True):
        Counting.sends += 1
        return super().send_packed_command(command, check_health)


def timed(call, repeat: int) -> tuple[list[float], int]:
    """Latencies (µs) of `repeat` calls, and the round trips one call took."""
    call()  # warm
    before = Counting.sends
    call()
    trips = Counting.sends - before
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e6)
    return samples, trips


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="20 repeats (a smoke run)")
    args = parser.parse_args()
    repeat = 20 if args.quick else args.repeat
    store = RedisStore.connect(args.url, f"bench-{uuid.uuid4().hex[:8]}", connection_class=Counting)
    try:
        full = KVLayout("kv", tuple(str(i) for i in range(4)), ("k", "v"), 16, 8, 128)
        k, v = full.part(slice_names=["k"]), full.part(slice_names=["v"])
        fid = store.register_layout(full)
        store.register_node("A", [k], 600)
        store.register_node("B", [v], 600)
        store.register_node("C", [v], 600)
        pages = [f"{i:016x}" for i in range(args.pages)]
        half = args.pages // 2
        store.publish("A", "s", k.layout_id(), pages, 600, slots=range(args.pages))
        store.publish("B", "s", v.layout_id(), pages[: half + 10], 600, start=0, slots=range(half + 10))
        store.publish("C", "s", v.layout_id(), pages[half:], 600, start=half, slots=range(args.pages - half))
        found = store.match("s", fid, pages)
        assert found.length == args.pages, found
        located = sum(slot is not None for segment in found.segments for slots in segment.slots for slot in slots)
        assert located == 2 * args.pages, (located, found.segments)  # a k slot and a v slot per page
        rows = [
            ("no-op EVALSHA", *timed(lambda: store._run("noop"), repeat)),
            (f"prefix match, {args.pages} pages", *timed(lambda: store.match("s", fid, pages), repeat)),
        ]
    finally:
        store.forget()
        store.close()
    print(
        f"KV metadata on {args.url}: {repeat} calls each; {found.length} pages matched in {found.sources} segments, "
        f"{located} provider slots returned"
    )
    print()
    print("| call | round trips | p50 µs | p90 µs | mean µs |")
    print("|---|---|---|---|---|")
    for name, samples, trips in rows:
        cut = statistics.quantiles(samples, n=10)
        print(f"| {name} | {trips} | {statistics.median(samples):.0f} | {cut[8]:.0f} | {statistics.fmean(samples):.0f} |")
    print()
    print(f"match/no-op (p50) = {statistics.median(rows[1][1]) / statistics.median(rows[0][1]):.1f}x")


if __name__ == "__main__":
    main()
