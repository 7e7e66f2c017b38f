"""What one hop between processes costs in flowrt, beside raw pyzmq, in ONE run.

For each payload size, alternating batches (so machine drift hits all alike):
- raw pyzmq: an echo process (a plain blocking ROUTER loop, the fastest pyzmq server) and an
  asyncio DEALER client sending the payload's bytes and awaiting them back;
- flowrt hop: the same payload as a role's input under `--deploy local`: the gateway sends the
  activation (msgspec envelope + pickle-5 payload) to the replica process, the role returns
  its input as its frame, and the frame comes back (RemoteBinding, no graph call around it);
- flowrt call: a whole graph call (entry → echo role → return) under `local`, and under
  `inproc` for reference.
Round trips are sequential (one in flight). It prints µs per round trip (median of batches) and
the ratio hop / raw pyzmq, the figure the goal is about (≤ 1.5).

    python bench/deploy_hop.py [--sizes 64,65536,4194304] [--count 2000] [--batches 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import zmq
import zmq.asyncio

REPO = Path(__file__).resolve().parent.parent

FLOW = """
flow hop
placeholder data: Json
role echo {
    impl "hop_roles:Echo"
    interface run { in data  out back: Json }
}
graph g {
    entry data
    return back
}
"""
ROLES = """
class Echo:
    async def run(self, ctx, data):
        return {"back": data}
"""
ECHO = """
import sys, zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
sock.bind(sys.argv[1])
print("ready", flush=True)
while True:
    frames = sock.recv_multipart(copy=False)
    if frames[-1].bytes == b"stop":
        break
    sock.send_multipart(frames, copy=False)
"""


def build(directory: Path) -> Path:
    (directory / "pipeline.flow").write_text(FLOW)
    (directory / "hop_roles.py").write_text(textwrap.dedent(ROLES))
    bundle = directory / "bundle"
    subprocess.run(
        [sys.executable, "-m", "flowc", "build", str(directory / "pipeline.flow"), "-o", str(bundle)], check=True, cwd=REPO
    )
    return bundle


async def raw_pyzmq(endpoint: str, payload: bytes, count: int) -> float:
    context = zmq.asyncio.Context()
    sock = context.socket(zmq.DEALER)
    sock.connect(endpoint)
    try:
        started = time.perf_counter()
        for _ in range(count):
            await sock.send_multipart([b"x", payload], copy=False)
            await sock.recv_multipart(copy=False)
        return (time.perf_counter() - started) / count
    finally:
        sock.close(0)
        context.term()


async def flowrt_hop(binding, node, payload: bytes, count: int) -> float:
    started = time.perf_counter()
    for i in range(count):
        replica, result, extras = binding.begin(node, "s", i, "g", {"data": payload})
        frame = await result
        binding.finished(replica, extras)
        assert frame["back"] is not None
    return (time.perf_counter() - started) / count


async def flowrt_call(runtime, payload: bytes, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        async for _event in runtime.call("g", {"data": payload}):
            pass
    return (time.perf_counter() - started) / count


async def main(sizes: list[int], count: int, batches: int) -> None:
    from flowrt.deploy import open_deployment

    with tempfile.TemporaryDirectory(prefix="flowrt-hop-") as scratch:
        bundle = build(Path(scratch))
        endpoint = f"ipc://{scratch}/echo"
        echo = subprocess.Popen([sys.executable, "-c", ECHO, endpoint], stdout=subprocess.PIPE, text=True)
        assert echo.stdout.readline().strip() == "ready"
        local = await open_deployment(bundle, "local")
        inproc = await open_deployment(bundle, "inproc")
        try:
            node = next(n for n in local.runtime.programs["g"].nodes if n.interface)
            binding = node.binding
            print(
                f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; {count} round trips per batch, {batches} batches\n"
            )
            print("| payload | raw pyzmq | flowrt hop | hop / raw | call (local) | call (inproc) |")
            print("|---:|---:|---:|---:|---:|---:|")
            for size in sizes:
                payload = os.urandom(size)
                n = max(50, count if size < 2**20 else count // 20)
                runs: dict[str, list[float]] = {"raw": [], "hop": [], "local": [], "inproc": []}
                for _ in range(batches):
                    runs["raw"].append(await raw_pyzmq(endpoint, payload, n))
                    runs["hop"].append(await flowrt_hop(binding, node, payload, n))
                    runs["local"].append(await flowrt_call(local.runtime, payload, n))
                    runs["inproc"].append(await flowrt_call(inproc.runtime, payload, n))
                med = {k: statistics.median(v) * 1e6 for k, v in runs.items()}
                print(
                    f"| {size:,} B | {med['raw']:.1f} µs | {med['hop']:.1f} µs | {med['hop'] / med['raw']:.2f}x "
                    f"| {med['local']:.1f} µs | {med['inproc']:.1f} µs |"
                )
        finally:
            await local.close()
            await inproc.close()
            context = zmq.Context()
            stopper = context.socket(zmq.DEALER)
            stopper.connect(endpoint)
            stopper.send_multipart([b"x", b"stop"])
            echo.wait(10)
            stopper.close(0)
            context.term()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,65536,4194304")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.sizes.split(",")], args.count, args.batches))
