"""Throughput of the image_chat topology with no-op roles (32 streamed tokens per request) when
its roles run in other processes, beside the embedded runtime and Ray doing the same graph.

In ONE run, for 1 and 64 concurrent clients, interleaved rounds (one batch of every system back
to back, order reversed every other round; ratios per round, then the median):
- inproc: flowrt's embedded runtime (every role in this process);
- local: `--deploy local`, one process per replica, the gateway here running every call's control;
- local shards: the same with `FLOWRT_CONTROL=shards` (each replica runs its role's part of
  every call, frames go replica to replica; docs/design/decentralised.md);
- ray actors: one Ray actor per replica; a driver coroutine runs the graph with remote calls
  (the LLM streams its tokens as a Ray streaming generator);
- ray compiled: the same actors in a Ray compiled graph (static: the frontend's segments as
  one list, the LLM's tokens as one list), if it compiles here.
Prints requests/s and p50/p99 per system and client count, and the ratios of both `local`
controls to the others.

    python bench/deploy_throughput.py [--requests 400] [--rounds 4] [--no-ray]

`--scale` instead measures calls/s of a one-stage graph as its replicas grow (1, 2, 4, 8, 16)
under `local` (`--control shards` for the decentralised control), 64 clients, each replica running one 5 ms step at a time (as a model on its
device would: 200 calls/s per replica at most), and the
registry's cost per heartbeat (embedded: decode + directory update; Redis: one SET).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKENS_PER_SEGMENT = 16
REQUEST = {"segments": [{"type": "text", "text": "draw a red cat"}, {"type": "image", "width": 64, "height": 48}]}

ROLE_CLASSES = ("Frontend", "Embed", "Vit", "Vae", "Llm", "Dit")


def noop_roles() -> str:
    """The no-op roles of bench/control_overhead.py as a module replica processes can import."""
    import inspect

    sys.path.insert(0, str(REPO / "bench"))
    import control_overhead

    classes = "\n\n".join(inspect.getsource(getattr(control_overhead, name)) for name in ROLE_CLASSES)
    return f"TOKENS_PER_SEGMENT = {control_overhead.TOKENS_PER_SEGMENT}\n\n{classes}"


def build(directory: Path) -> Path:
    from flowc.check import check_file
    from flowc.codegen import build_bundle

    text = (REPO / "examples/image_chat/pipeline.flow").read_text().replace('impl "image_chat.roles:', 'impl "noop_roles:')
    source = directory / "pipeline.flow"
    source.write_text(text)
    (directory / "noop_roles.py").write_text(noop_roles())
    out = directory / "bundle"
    build_bundle(check_file(source).program, source, out).write(out)
    return out


FLOWRT = ("inproc", "local", "local shards")


async def open_local(bundle: Path, control: str):
    """A `--deploy local` deployment of `bundle` with FLOWRT_CONTROL=`control` (read as it opens)."""
    from flowrt.deploy import open_deployment
    from flowrt.deploy.local import CONTROL_ENV

    before = os.environ.get(CONTROL_ENV)
    os.environ[CONTROL_ENV] = control
    try:
        return await open_deployment(bundle, "local")
    finally:
        if before is None:
            del os.environ[CONTROL_ENV]
        else:
            os.environ[CONTROL_ENV] = before


def flowrt_system(runtime):
    async def one(session: str) -> int:
        tokens = 0
        async for event in runtime.call("chat", {"request": REQUEST}, session=session):
            tokens += event["event"] == "stream"
        return tokens

    return one


def ray_systems():
    import ray

    @ray.remote(num_cpus=0)
    class Stage:
        def parse(self, request):
            return request["segments"]

        def encode(self, segment):
            return 1

        def decode(self, latent):
            return 1

        def denoise(self, hidden, vit, vae):
            return 1

        def generate(self, emb):
            for i in range(TOKENS_PER_SEGMENT):  # noqa: UP028 - Ray's streaming generators need a real generator frame
                yield i

        # compiled-graph forms: whole lists per request
        def encode_all(self, segments):
            return [1 for _ in segments]

        def generate_all(self, txt, vit, vae):
            return [i for _ in range(len(txt)) for i in range(TOKENS_PER_SEGMENT)]

        def denoise_all(self, tokens):
            return 1

    names = ["frontend0", "frontend1", "embed", "vit", "vae", "llm", "dit"]
    actors = {name: Stage.remote() for name in names}
    ray.get([a.encode.remote(None) for a in actors.values()])
    counter = iter(range(10**9))

    async def actors_one(session: str) -> int:
        front = actors["frontend0" if next(counter) % 2 else "frontend1"]
        segments = await front.parse.remote(REQUEST)
        tokens = 0
        hidden = vit = vae = None
        for segment in segments:
            if segment["type"] == "text":
                emb = await actors["embed"].encode.remote(segment)
            else:
                vit, vae = await asyncio.gather(actors["vit"].encode.remote(segment), actors["vae"].encode.remote(segment))
                emb = vit
            async for ref in actors["llm"].generate.options(num_returns="streaming").remote(emb):
                await ref
                tokens += 1
            hidden = 1
        latent = await actors["dit"].denoise.remote(hidden, vit, vae)
        await actors["vae"].decode.remote(latent)
        return tokens

    compiled_one = None
    try:
        from ray.dag import InputNode, MultiOutputNode

        with InputNode() as request:
            segments = actors["frontend0"].parse.bind(request)
            txt = actors["embed"].encode_all.bind(segments)
            vit = actors["vit"].encode_all.bind(segments)
            vae = actors["vae"].encode_all.bind(segments)
            tokens = actors["llm"].generate_all.bind(txt, vit, vae)
            image = actors["dit"].denoise_all.bind(tokens)
            dag = MultiOutputNode([tokens, image])
        compiled = dag.experimental_compile(enable_asyncio=True)
        lock = asyncio.Lock()

        async def compiled_one(session: str) -> int:
            async with lock:  # (a compiled graph's executions are submitted one at a time)
                futures = await compiled.execute_async(REQUEST)  # one per output of the MultiOutputNode
            tokens, _ = await asyncio.gather(*futures)
            return len(tokens)

    except Exception as error:  # noqa: BLE001 - report, measure the rest
        print(f"ray compiled graph: not measured ({type(error).__name__}: {error})", file=sys.stderr)
    return actors_one, compiled_one


async def batch(one, requests: int, clients: int, latencies: list[float]) -> float:
    counter = iter(range(requests))

    async def client(c: int) -> None:
        for _ in counter:
            began = time.perf_counter()
            assert await one(f"client-{c}") == 2 * TOKENS_PER_SEGMENT
            latencies.append(time.perf_counter() - began)

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return requests / (time.perf_counter() - started)


async def throughput(args) -> None:
    from flowrt.deploy import open_deployment

    with tempfile.TemporaryDirectory(prefix="flowrt-tput-") as scratch:
        bundle = build(Path(scratch))
        sys.path.insert(0, scratch)
        inproc = await open_deployment(bundle, "inproc")
        local = await open_deployment(bundle, "local")
        sharded = await open_local(bundle, "shards")
        systems = {
            "inproc": flowrt_system(inproc.runtime),
            "local": flowrt_system(local.runtime),
            "local shards": flowrt_system(sharded.runtime),
        }
        if not args.no_ray:
            import ray

            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, configure_logging=False, log_to_driver=False)
            actors_one, compiled_one = ray_systems()
            systems["ray actors"] = actors_one
            if compiled_one is not None:
                systems["ray compiled"] = compiled_one
        try:
            for one in systems.values():
                await batch(one, 20, 1, [])
            print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; {args.rounds} rounds per client count\n")
            print("| system | clients | req/s | p50 | p99 |")
            print("|---|---:|---:|---:|---:|")
            ratios_by_clients = {}
            for clients in (1, 64):
                rps: dict[str, list[float]] = {name: [] for name in systems}
                lat: dict[str, list[float]] = {name: [] for name in systems}
                for round_ in range(args.rounds):
                    names = list(systems) if round_ % 2 == 0 else list(reversed(systems))
                    for name in names:
                        size = args.requests if name in FLOWRT else max(args.requests // 4, clients)
                        rps[name].append(await batch(systems[name], size, clients, lat[name]))
                for name in systems:
                    ordered = sorted(lat[name])
                    print(
                        f"| {name} | {clients} | {statistics.median(rps[name]):,.0f} | {statistics.median(ordered) * 1e3:.2f} ms "
                        f"| {ordered[int(0.99 * (len(ordered) - 1))] * 1e3:.2f} ms |"
                    )
                ratios_by_clients[clients] = {
                    (mine, other): statistics.median(a / b for a, b in zip(rps[mine], rps[other], strict=True))
                    for mine in ("local", "local shards")
                    for other in systems
                    if other != mine
                }
            print()
            for clients, ratios in ratios_by_clients.items():
                print(f"clients {clients}: " + ", ".join(f"{mine}/{other} = {r:.2f}x" for (mine, other), r in ratios.items()))
        finally:
            await sharded.close()
            await local.close()
            await inproc.close()
            if not args.no_ray:
                import ray

                ray.shutdown()


SCALE_FLOW = """
flow scale
placeholder request: Json
role stage {
    impl "scale_roles:Stage"
    replicas N
    interface run { in request  out result: Json }
}
graph g {
    entry request
    return result
}
"""
SCALE_ROLES = """
import asyncio

class Stage:
    def __init__(self):
        self.busy = None

    async def run(self, ctx, request):
        if self.busy is None:
            self.busy = asyncio.Lock()
        async with self.busy:  # one step at a time per replica, as a model on its device
            await asyncio.sleep(0.005)
        return {"result": request}
"""


async def scale(args) -> None:
    from flowc.check import check_file
    from flowc.codegen import build_bundle

    print("| replicas | calls/s (local, 64 clients, one 5 ms step at a time per replica) | of the ideal (200/s per replica) |")
    print("|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="flowrt-scale-") as scratch:
        (Path(scratch) / "scale_roles.py").write_text(textwrap.dedent(SCALE_ROLES))
        for replicas in [n for n in (1, 2, 4, 8, 16) if n <= args.max_replicas]:
            source = Path(scratch) / f"scale{replicas}.flow"
            source.write_text(SCALE_FLOW.replace("N", str(replicas)))
            out = Path(scratch) / f"bundle{replicas}"
            build_bundle(check_file(source).program, source, out).write(out)
            deployment = await open_local(out, args.control)
            try:

                async def one(session: str, runtime=deployment.runtime) -> int:
                    async for _ in runtime.call("g", {"request": 1}):
                        pass
                    return 2 * TOKENS_PER_SEGMENT

                await batch(one, 64, 64, [])
                rates = [await batch(one, args.requests, 64, []) for _ in range(3)]
                rate = statistics.median(rates)
                print(f"| {replicas} | {rate:,.0f} | {rate / (200 * replicas):.0%} |")
            finally:
                await deployment.close()
    registry_cost()


def registry_cost() -> None:
    from flowrt.registry import Directory
    from flowrt.transport import messages as m

    directory = Directory(3.0, lambda record: None, lambda record, reason: None)
    register = m.Register(m.VERSION, "stage", 0, "abc", "ipc:///x", 1, [])
    directory.seen(register)
    beat = m.encode(m.Heartbeat(m.VERSION, "stage", 0, "abc", 1, 0, 0))
    count = 100_000
    started = time.perf_counter()
    for _ in range(count):
        directory.seen(m.decode("registry", beat))
    embedded = (time.perf_counter() - started) / count
    line = f"registry, per heartbeat: embedded {embedded * 1e6:.2f} µs (decode + directory update, in the gateway)"
    try:
        import msgspec
        import redis

        from flowrt.registry.stores import RedisRecord

        client = redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1)
        value = msgspec.msgpack.encode(RedisRecord(register, m.Heartbeat(m.VERSION, "stage", 0, "abc", 1, 0, 0)))
        n = 2000
        started = time.perf_counter()
        for _ in range(n):
            client.set("flowrt:bench:replica:stage:0", value, px=3000)
        line += f"; Redis {(time.perf_counter() - started) / n * 1e6:.0f} µs (one SET with expiry, a replica's side)"
        client.delete("flowrt:bench:replica:stage:0")
    except Exception as error:  # noqa: BLE001 - no Redis here: the embedded figure stands alone
        line += f"; Redis not measured ({type(error).__name__})"
    print()
    print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--scale", action="store_true")
    parser.add_argument("--max-replicas", type=int, default=16, help="--scale: stop at this many replicas")
    parser.add_argument("--control", choices=("gateway", "shards"), default="gateway", help="--scale: whose control")
    args = parser.parse_args()
    asyncio.run(scale(args) if args.scale else throughput(args))
