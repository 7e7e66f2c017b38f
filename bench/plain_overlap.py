"""Two roles fed by one frame, each blocking 100 ms in work that releases the GIL (time.sleep
stands for a torch forward or a file read), in process (`inproc`): written as plain `def`
(each runs on its replica's worker thread: flowrt.control.threads) against the same work in
`async def` (it blocks the event loop). One run, medians of interleaved rounds; the ratio is
the point: plain methods should take about one block, async ones two.

    .venv/bin/python bench/plain_overlap.py [--block-ms 100] [--rounds 9]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flowrt.control import Runtime  # noqa: E402
from tests.runtime.harness import bundle_of  # noqa: E402

FLOW = """
placeholder request: Json

role left {
    impl "m:Left"
    interface run { in request  out l: Json }
}

role right {
    impl "m:Right"
    interface run { in request  out r: Json }
}

graph g {
    entry  request
    return l, r
}
"""


def roles(block: float, plain: bool) -> dict[str, list]:
    if plain:

        class Left:
            def run(self, ctx, request):
                time.sleep(block)
                return {"l": request}

        class Right:
            def run(self, ctx, request):
                time.sleep(block)
                return {"r": request}

    else:

        class Left:  # type: ignore[no-redef]
            async def run(self, ctx, request):
                time.sleep(block)  # blocking inside async def: what plain methods are for
                return {"l": request}

        class Right:  # type: ignore[no-redef]
            async def run(self, ctx, request):
                time.sleep(block)
                return {"r": request}

    return {"left": [Left()], "right": [Right()]}


async def one_call(runtime: Runtime) -> float:
    started = time.perf_counter()
    events = [event async for event in runtime.call("g", {"request": 1})]
    assert events[-1]["status"] == "ok", events
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-ms", type=float, default=100.0)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    block = args.block_ms / 1000
    with tempfile.TemporaryDirectory() as directory:
        bundle = bundle_of(FLOW, Path(directory))
        runtimes = {
            kind: await Runtime.open(bundle, instances=roles(block, kind == "plain def")) for kind in ("plain def", "async def")
        }
        times: dict[str, list[float]] = {kind: [] for kind in runtimes}
        for _ in range(args.rounds):
            for kind, runtime in runtimes.items():
                times[kind].append(await one_call(runtime))
        for runtime in runtimes.values():
            await runtime.close()
    print(f"two roles, one frame, each blocking {args.block_ms:g} ms; medians of {args.rounds} interleaved rounds\n")
    print("| methods | call (ms) | ÷ one block |")
    print("|---|---:|---:|")
    for kind, values in times.items():
        median = statistics.median(values)
        print(f"| {kind} | {median * 1000:.1f} | {median / block:.2f} |")
    ratio = statistics.median(times["async def"]) / statistics.median(times["plain def"])
    print(f"\nasync def / plain def = {ratio:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
