"""Observability overhead: the image_chat no-op bench (bench/control_overhead.py's roles and
request: 8 activations and 32 streamed tokens per call) with metrics on, with tracing on, and
with both off, in ONE run.

- off: no observer (the control core's hooks cost one `is None` check each);
- metrics: the Metrics observer the HTTP gateway installs (flowrt.observe.metrics);
- tracing: a CallTrace per call and its Chrome trace's JSON text made at the end, as
  `?trace=1` does (the bytes the server writes into the done event).

Method as control_overhead's: for each client count, `--rounds` rounds each run one batch of
every configuration back to back (the order reversed every other round), and a round's ratio is
a configuration's requests/s over `off`'s in that same round, so the machine's drift cancels.
Reported: per configuration the median requests/s and CPU µs per request over rounds; per
ratio the median over rounds, its interquartile range and min-max. Goals (issue 17): metrics
cost at most 5%, tracing at most 25% (a ratio of 0.95 and 0.75 or more).

    python bench/observe_overhead.py [--requests 60000] [--rounds 30]

A batch must run long enough that a scheduler hiccup is a small part of it: at 300 requests
(6,000 over 20 rounds) a batch lasted 15 ms on a fast day and single rounds ranged 0.41-1.16;
at 2,000 (the default) it lasts about 100 ms and the interquartile range is a few hundredths.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import control_overhead as base  # noqa: E402 - the same no-op roles, request and bundle

CONFIGS = ("off", "metrics", "tracing")


async def open_runtime():
    """A runtime of the image_chat bundle with the no-op roles (control_overhead's)."""
    from flowc.check import check_file
    from flowc.codegen import build_bundle
    from flowrt.control import Runtime

    source = base.REPO / "examples/image_chat/pipeline.flow"
    out = Path(base.tempfile.mkdtemp(prefix="flowrt-observe-bench-")) / "bundle"
    base.atexit.register(base.shutil.rmtree, out.parent, True)
    build_bundle(check_file(source).program, source, out).write(out)
    roles = {
        "frontend": [base.Frontend(), base.Frontend()],
        "embed": [base.Embed()],
        "vit": [base.Vit()],
        "vae": [base.Vae()],
        "llm": [base.Llm()],
        "dit": [base.Dit()],
    }
    return await Runtime.open(out, instances=roles)


async def systems() -> dict:
    """One call function per configuration, each on a runtime of its own."""
    from flowrt.observe import CallTrace, Metrics

    runtimes = {config: await open_runtime() for config in CONFIGS}
    runtimes["metrics"].observer = Metrics()

    def caller(runtime, tracing: bool):
        async def one(session: str) -> None:
            trace = CallTrace() if tracing else None
            async for event in runtime.call("chat", {"request": base.REQUEST}, session=session, observer=trace):
                if event["event"] == "done":
                    assert event["status"] == "ok", event
            if trace is not None:
                trace.chrome_trace_json()

        return one

    return {config: caller(runtimes[config], config == "tracing") for config in CONFIGS}


async def batch(one, clients: int, requests: int) -> tuple[float, float]:
    """(requests/s, CPU µs per request) of `requests` calls from `clients` concurrent clients."""
    per_client = max(1, requests // clients)

    async def client(index: int) -> None:
        for _ in range(per_client):
            await one(f"s{index}")

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(client(i) for i in range(clients)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = per_client * clients
    return done / wall, cpu / done * 1e6


def spread(values: list[float]) -> str:
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{statistics.median(values):.3f} (IQR {quartiles[0]:.3f}-{quartiles[2]:.3f}, min-max {min(values):.3f}-{max(values):.3f})"


async def main(requests: int, rounds: int) -> None:
    from flowrt.control import CORE

    print(f"flowrt control core: {CORE}; Python {sys.version.split()[0]}")
    calls = await systems()
    for one in calls.values():  # warm up
        await batch(one, 1, 200)
    gc.freeze()
    per_batch = max(1, requests // rounds)
    for clients in (1, 64):
        rates: dict[str, list[float]] = {c: [] for c in CONFIGS}
        cpus: dict[str, list[float]] = {c: [] for c in CONFIGS}
        ratios: dict[str, list[float]] = {c: [] for c in CONFIGS[1:]}
        for index in range(rounds):
            order = CONFIGS if index % 2 == 0 else CONFIGS[::-1]
            measured = {}
            for config in order:
                measured[config] = await batch(calls[config], clients, per_batch)
            for config, (rate, cpu) in measured.items():
                rates[config].append(rate)
                cpus[config].append(cpu)
            for config in ratios:
                ratios[config].append(measured[config][0] / measured["off"][0])
        print("\n| configuration | clients | req/s | CPU per request |\n|---|---:|---:|---:|")
        for config in CONFIGS:
            print(
                f"| {config} | {clients} | {statistics.median(rates[config]):,.0f} | {statistics.median(cpus[config]):.0f} µs |"
            )
        for config, values in ratios.items():
            print(f"clients {clients}: {config}/off requests/s = {spread(values)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60000, help="requests per configuration and client count")
    parser.add_argument("--rounds", type=int, default=30)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.requests, arguments.rounds))
