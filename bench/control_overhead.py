"""Control-flow overhead: the image_chat topology with no-op roles and 32 streamed tokens.

In ONE run it measures three implementations of the same graph on the same request (one text
segment and one image segment; the LLM streams 16 tokens per segment):
- flowrt: the built examples/image_chat bundle on the embedded runtime, roles replaced by no-ops;
- floor: a minimal hand-written asyncio version (queues, gather, one session lock);
- LangGraph: a StateGraph of the same stages, tokens streamed with its stream writer
  (only when langgraph is importable; `make bench-overhead` installs it in .venv-bench).
For 1 and 64 concurrent clients: requests/s, p50/p99 latency, CPU µs per request, and the
ratios flowrt/floor and flowrt/LangGraph. `--profile` adds where flowrt's time goes.

    python bench/control_overhead.py [--requests 10000] [--rounds 20] [--profile] [--no-freeze]

Method: interleaved, same-process measurement. This machine's speed drifts by tens of percent
within minutes, so one long run per system compares each system with a different machine.
Instead, for each client count, `--rounds` rounds each run one batch of every system back to
back (`--requests / --rounds` requests per batch; LangGraph, ~50x slower, a batch 1/8 that
size but at least one request per client; the order of the systems reversed every other
round). A round's ratio is flowrt's requests/s over the other system's in that round, so
drift slower than a round cancels out. Reported: per system the median over rounds of
requests/s and CPU per request, p50/p99 over every request; per ratio the median over rounds,
its interquartile range (the spread of the middle half of the rounds) and min–max. Each
system is warmed up before the first round.

flowrt runs its compiled control core where it was built (docs/runtime.md, "The compiled
core"); `FLOWRT_PURE=1` measures the Python sources instead. The first line printed says
which. The compiled core's functions are invisible to cProfile: `--profile` with
`FLOWRT_PURE=1` shows the same code function by function.

After set-up, the objects alive so far are frozen (`gc.freeze()`), as a server does after
loading, so the cyclic collector does not rescan the compiler and langgraph on every pass;
`--no-freeze` measures without that.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import cProfile
import gc
import io
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKENS_PER_SEGMENT = 16
LANGGRAPH_BATCH_DIVISOR = 8
REQUEST = {"segments": [{"type": "text", "text": "draw a red cat"}, {"type": "image", "width": 64, "height": 48}]}


# ── no-op roles for flowrt ──


class Frontend:
    async def parse(self, ctx, request):
        for segment in request["segments"]:
            yield {"text_seg": segment} if segment["type"] == "text" else {"image_seg": segment}


class Embed:
    async def encode(self, ctx, text_seg):
        return {"txt_emb": 1}


class Vit:
    async def encode(self, ctx, image_seg):
        return {"vit_emb": 1}


class Vae:
    async def encode(self, ctx, image_seg):
        return {"vae_lat": 1}

    async def decode(self, ctx, latent):
        return {"image": "png"}


class Llm:
    async def generate(self, ctx, txt_emb=None, vit_emb=None, vae_lat=None):
        for i in range(TOKENS_PER_SEGMENT):
            yield {"token": i}
        yield {"hidden": 1}


class Dit:
    async def denoise(self, ctx, hidden, vit_emb, vae_lat):
        return {"latent": 1}


async def flowrt_system():
    from flowc.check import check_file
    from flowc.codegen import build_bundle
    from flowrt.control import Runtime

    source = REPO / "examples/image_chat/pipeline.flow"
    out = Path(tempfile.mkdtemp(prefix="flowrt-bench-")) / "bundle"
    atexit.register(shutil.rmtree, out.parent, True)  # (the runtime reads it until the run ends)
    build_bundle(check_file(source).program, source, out).write(out)
    roles = {
        "frontend": [Frontend(), Frontend()],
        "embed": [Embed()],
        "vit": [Vit()],
        "vae": [Vae()],
        "llm": [Llm()],
        "dit": [Dit()],
    }
    runtime = await Runtime.open(out, instances=roles)

    async def one(session: str) -> int:
        tokens = 0
        async for event in runtime.call("chat", {"request": REQUEST}, session=session):
            tokens += event["event"] == "stream"
            if event["event"] == "done":
                assert event["status"] == "ok", event
        return tokens

    return one


# ── the floor: the same graph written by hand ──


def floor_system():
    locks: dict[str, asyncio.Lock] = {}

    async def llm(segment_kind: str, out: asyncio.Queue) -> None:
        for i in range(TOKENS_PER_SEGMENT):
            await out.put(i)

    async def one(session: str) -> int:
        lock = locks.setdefault(session, asyncio.Lock())
        out: asyncio.Queue = asyncio.Queue()
        hidden, vit, vae = [], [], []

        async def segment(seg):
            if seg["type"] == "text":
                await Embed().encode(None, seg)
                kind = "text"
            else:
                v, a = await asyncio.gather(Vit().encode(None, seg), Vae().encode(None, seg))
                vit.append(v)
                vae.append(a)
                kind = "image"
            return kind

        kinds = [await segment(seg) for seg in REQUEST["segments"]]
        async with lock:  # the session node: in order, one at a time
            for kind in kinds:
                await llm(kind, out)
                hidden.append(1)
        await Dit().denoise(None, hidden, vit, vae)
        await Vae().decode(None, 1)
        tokens = 0
        while not out.empty():
            out.get_nowait()
            tokens += 1
        if not lock.locked() and locks.get(session) is lock:
            del locks[session]
        return tokens

    return one


# ── LangGraph ──


def langgraph_system():
    try:
        from typing import TypedDict

        from langgraph.config import get_stream_writer
        from langgraph.graph import END, START, StateGraph
    except ImportError:
        return None

    class State(TypedDict, total=False):
        request: dict
        segments: list
        hidden: list
        image: str

    def frontend(state):
        return {"segments": [{"kind": s["type"], "seg": s} for s in state["request"]["segments"]]}

    def encode(state):
        return {"segments": [dict(s, emb=1) for s in state["segments"]]}

    def llm(state):
        write = get_stream_writer()
        hidden = []
        for _ in state["segments"]:
            for i in range(TOKENS_PER_SEGMENT):
                write({"token": i})
            hidden.append(1)
        return {"hidden": hidden}

    def dit(state):
        return {"image": "latent"}

    def decode(state):
        return {"image": "png"}

    builder = StateGraph(State)
    for name, fn in (("frontend", frontend), ("encode", encode), ("llm", llm), ("dit", dit), ("decode", decode)):
        builder.add_node(name, fn)
    builder.add_edge(START, "frontend")
    builder.add_edge("frontend", "encode")
    builder.add_edge("encode", "llm")
    builder.add_edge("llm", "dit")
    builder.add_edge("dit", "decode")
    builder.add_edge("decode", END)
    graph = builder.compile()

    async def one(session: str) -> int:
        tokens = 0
        async for chunk in graph.astream({"request": REQUEST}, stream_mode="custom"):
            tokens += "token" in chunk
        return tokens

    return one


# ── measurement ──


async def batch(one, requests: int, clients: int, latencies: list[float]) -> tuple[float, float]:
    """`requests` calls by `clients` concurrent clients; (wall seconds, CPU seconds); latencies appended."""
    counter = iter(range(requests))

    async def client(c: int) -> None:
        for _ in counter:
            began = time.perf_counter()
            tokens = await one(f"client-{c}")
            latencies.append(time.perf_counter() - began)
            assert tokens == 2 * TOKENS_PER_SEGMENT, tokens

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return time.perf_counter() - wall, time.process_time() - cpu


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of two values or more."""
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


async def interleaved(systems: dict, clients: int, rounds: int, batch_size: int) -> tuple[dict, dict]:
    """Every round runs one batch of each system, back to back (order reversed every other round).

    Returns per system: the per-round req/s and CPU per request and all latencies; and per
    system other than flowrt: the per-round ratios flowrt req/s / its req/s.
    """
    per_round = {name: {"rps": [], "cpu_us": [], "latencies": []} for name in systems}
    ratios: dict[str, list[float]] = {name: [] for name in systems if name != "flowrt"}
    names = list(systems)
    for round_ in range(rounds):
        rps: dict[str, float] = {}
        for name in names if round_ % 2 == 0 else reversed(names):
            # LangGraph is ~50x slower: smaller batches (at least one request per client) keep rounds short
            size = batch_size if name != "langgraph" else max(batch_size // LANGGRAPH_BATCH_DIVISOR, clients, 1)
            wall, cpu = await batch(systems[name], size, clients, per_round[name]["latencies"])
            rps[name] = size / wall
            per_round[name]["rps"].append(rps[name])
            per_round[name]["cpu_us"].append(cpu / size * 1e6)
        for name in ratios:
            ratios[name].append(rps["flowrt"] / rps[name])
    return per_round, ratios


async def main_async(args) -> None:
    systems = {"flowrt": await flowrt_system(), "floor": floor_system()}
    graph = langgraph_system()
    if graph is not None:
        systems["langgraph"] = graph
    else:
        print("langgraph is not installed here: `make bench-overhead` runs this in .venv-bench with it", file=sys.stderr)
    for name, one in systems.items():  # warm up: imports, caches, the first calls' allocations
        await batch(one, 20 if name == "langgraph" else 200, 1, [])
    if not args.no_freeze:
        # what a server does once it has loaded: move the objects of set-up (the compiler that built
        # the bundle, langgraph's modules) out of the collector's view; all three systems share this
        gc.collect()
        gc.freeze()
    batch_size = max(1, args.requests // args.rounds)
    results: dict[int, tuple[dict, dict]] = {}
    for clients in (1, 64):
        results[clients] = await interleaved(systems, clients, args.rounds, batch_size)
    from flowrt.control import CORE

    print(f"Python {sys.version.split()[0]}; flowrt control core: {CORE}")
    print(
        f"interleaved: {args.rounds} rounds, each one batch per system back to back; batch: {batch_size} requests "
        f"(LangGraph: 1/{LANGGRAPH_BATCH_DIVISOR}, at least one per client); tokens per request: {2 * TOKENS_PER_SEGMENT}"
    )
    print("| system | clients | req/s | p50 | p99 | CPU per request |")
    print("|---|---:|---:|---:|---:|---:|")
    for clients, (per_round, _) in results.items():
        for name, r in per_round.items():
            latencies = sorted(r["latencies"])
            p50 = statistics.median(latencies) * 1e3
            p99 = latencies[int(0.99 * (len(latencies) - 1))] * 1e3
            rps, cpu_us = statistics.median(r["rps"]), statistics.median(r["cpu_us"])
            print(f"| {name} | {clients} | {rps:,.0f} | {p50:.2f} ms | {p99:.2f} ms | {cpu_us:,.0f} µs |")
    print("(req/s and CPU: medians of the rounds; p50 and p99 over every request of the rounds)")
    print()
    print("flowrt's throughput over each system's in the same round: median (interquartile range; min–max)")
    for clients, (_, ratios) in results.items():
        parts = []
        for name, label in (("floor", "floor"), ("langgraph", "LangGraph")):
            if name in ratios and len(ratios[name]) == 1:
                parts.append(f"flowrt/{label} = {ratios[name][0]:.2f}x (one round)")
            elif name in ratios:
                q1, median, q3 = quartiles(ratios[name])
                low, high = min(ratios[name]), max(ratios[name])
                parts.append(f"flowrt/{label} = {median:.2f}x (IQR {q1:.2f}–{q3:.2f}; {low:.2f}–{high:.2f})")
        print(f"clients {clients}: " + ", ".join(parts))
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        await batch(systems["flowrt"], args.requests, 64, [])
        profiler.disable()
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(15)
        print("\nflowrt profile, 64 clients (top functions by own time):")
        print("\n".join(line for line in stream.getvalue().splitlines() if line.strip())[:6000])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests", type=int, default=10_000, help="Requests of flowrt and of the floor per client count, over all rounds."
    )
    parser.add_argument("--rounds", type=int, default=20, help="Rounds of interleaved batches (the ratios' sample).")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--no-freeze", action="store_true", help="Leave set-up objects in the garbage collector's view.")
    args = parser.parse_args()
    if args.requests < 1 or args.rounds < 1:
        parser.error("--requests and --rounds must be at least 1")
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
