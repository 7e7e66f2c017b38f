"""Tensor handoff between two processes, side by side in one run: flowrt's data plane against
pickle over pyzmq, torch.multiprocessing queues and a raw shared-memory copy, for 1 KiB, 1 MiB,
64 MiB and 256 MiB float32 tensors. Also pool operations per second against a dict of
bytearrays.

A handoff is a ping-pong: the sender hands the tensor over, the receiver gets a usable tensor
(reads its first and last element) and answers with a few bytes; the figure is the median round
trip. flowrt runs as deployments do: a MemoryManager process, a MemoryClient in each process,
the payload through flowrt.transport.codec with the data plane's encoder and decoder, over ipc.
"flowrt (in pool)" sends a tensor made with ctx.memory.empty (no copy: the handle travels);
"flowrt (copy in)" sends an ordinary tensor (one copy into the pool). The first WARMUP rounds
of each are not counted (the first touch of fresh shared pages).

    .venv/bin/python bench/tensor_handoff.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import multiprocessing as mp
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import zmq

SIZES = [("1 KiB", 1 << 10), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20), ("256 MiB", 256 << 20)]


def rounds(nbytes: int, quick: bool) -> int:
    base = 200 if nbytes <= 1 << 20 else 12 if nbytes <= 64 << 20 else 6
    return max(3, base // (4 if quick else 1))


def touch(tensor: torch.Tensor) -> float:
    flat = tensor.reshape(-1)
    return float(flat[0]) + float(flat[-1])


# ── peers (run in a child process) ──


def pickle_peer(endpoint: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.connect(endpoint)
    while True:
        data = sock.recv(copy=False)
        if len(data) == 4 and data.bytes == b"stop":
            return
        touch(pickle.loads(data.buffer))
        sock.send(b"ok")


def queue_peer(inbox, outbox) -> None:
    while True:
        tensor = inbox.get()
        if tensor is None:
            return
        touch(tensor)
        del tensor
        outbox.put(b"ok")


def shm_peer(endpoint: str, path: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.connect(endpoint)
    fd = os.open(path, os.O_RDWR)
    shared = mmap.mmap(fd, os.fstat(fd).st_size)
    while True:
        message = sock.recv()
        if message == b"stop":
            return
        nbytes = int(message)
        touch(torch.frombuffer(shared, dtype=torch.float32, count=nbytes // 4))
        sock.send(b"ok")


def flowrt_peer(endpoint: str, memory: str) -> None:
    from flowrt.memory.client import MemoryClient
    from flowrt.memory.tensors import Decoder
    from flowrt.transport import codec

    client = MemoryClient(memory, "replica", "bench/receiver")
    decoder = Decoder(client)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.connect(endpoint)
    while True:
        frames = sock.recv_multipart(copy=False)
        if frames[0].bytes == b"stop":
            return
        tensor = codec.loads(frames, decoder)
        touch(tensor)
        del tensor
        sock.send(b"ok")


# ── senders ──


WARMUP = 2  # rounds not counted: the first touch of fresh shared pages is a one-time cost


def ping(sock, frames, n: int) -> list[float]:
    times = []
    for _ in range(n + WARMUP):
        start = time.perf_counter()
        sock.send_multipart(frames() if callable(frames) else frames, copy=False)
        sock.recv()
        times.append(time.perf_counter() - start)
    return times[WARMUP:]


def bench_pickle(tensor: torch.Tensor, n: int) -> list[float]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    peer = mp.get_context("spawn").Process(target=pickle_peer, args=(f"tcp://127.0.0.1:{port}",))
    peer.start()
    times = ping(sock, lambda: [pickle.dumps(tensor, protocol=5)], n)
    sock.send(b"stop")
    peer.join()
    ctx.destroy(linger=0)
    return times


def bench_queue(tensor: torch.Tensor, n: int) -> list[float]:
    import torch.multiprocessing as tmp

    context = tmp.get_context("spawn")
    inbox, outbox = context.Queue(), context.Queue()
    peer = context.Process(target=queue_peer, args=(inbox, outbox))
    peer.start()
    times = []
    for _ in range(n + WARMUP):
        start = time.perf_counter()
        inbox.put(tensor.clone())  # a new tensor each time, as a role makes one per request
        outbox.get()
        times.append(time.perf_counter() - start)
    inbox.put(None)
    peer.join()
    return times[WARMUP:]


def bench_shm(tensor: torch.Tensor, n: int) -> list[float]:
    path = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)) / "raw"
    nbytes = tensor.numel() * 4
    with open(path, "wb") as f:
        f.truncate(max(nbytes, mmap.PAGESIZE))
    fd = os.open(path, os.O_RDWR)
    shared = mmap.mmap(fd, os.fstat(fd).st_size)
    target = torch.frombuffer(shared, dtype=torch.float32, count=tensor.numel())
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    peer = mp.get_context("spawn").Process(target=shm_peer, args=(f"tcp://127.0.0.1:{port}", str(path)))
    peer.start()

    def frames():
        target.copy_(tensor)
        return [str(nbytes).encode()]

    times = ping(sock, frames, n)
    sock.send(b"stop")
    peer.join()
    ctx.destroy(linger=0)
    target = None  # (its view of the map must go before the map closes)
    shared.close()
    os.close(fd)
    path.unlink()
    path.parent.rmdir()
    return times


def bench_flowrt(tensor: torch.Tensor, n: int, memory: str, in_pool: bool) -> list[float]:
    from flowrt.memory import protocol as p
    from flowrt.memory.api import ProcessMemory
    from flowrt.memory.client import MemoryClient
    from flowrt.memory.tensors import Encoder
    from flowrt.transport import codec

    client = MemoryClient(memory, "gateway", "bench/sender")
    source = tensor
    if in_pool:
        source = ProcessMemory(client).empty(tuple(tensor.shape), tensor.dtype)
        source.copy_(tensor)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    peer = mp.get_context("spawn").Process(target=flowrt_peer, args=(f"tcp://127.0.0.1:{port}", memory))
    peer.start()
    calls = iter(range(1, 1 << 30))

    def frames():
        call = f"bench:{next(calls)}"
        encoded = codec.dumps(source, Encoder(client, call))
        client.post(p.ReleaseCall(p.VERSION, 0, f"bench:{int(call.split(':')[1]) - 1}"))  # the previous handoff's call ended
        return encoded

    times = ping(sock, frames, n)
    sock.send(b"stop")
    peer.join()
    ctx.destroy(linger=0)
    client.close()
    return times


def pool_ops(quick: bool) -> dict[str, float]:
    """Operations per second of the pool's bookkeeping against a dict of bytearrays."""
    from flowrt.memory.pool import BufferPool

    n = 20_000 if quick else 100_000
    pool = BufferPool(1 << 30)
    holder = ("c", "")
    start = time.perf_counter()
    for _ in range(n):
        block = pool.alloc(64 << 10, holder)
        pool.add_ref(block.id, holder)
        pool.free(block.id, holder)
        pool.free(block.id, holder)
    ours = 4 * n / (time.perf_counter() - start)
    cached = pool.alloc(1 << 20, holder)
    pool.cache(cached.id, "k")
    start = time.perf_counter()
    for _ in range(n):
        hit = pool.lookup("k", holder)
        pool.free(hit.id, holder)
    hits = 2 * n / (time.perf_counter() - start)
    plain: dict[int, bytearray] = {}
    refs: dict[int, int] = {}
    start = time.perf_counter()
    for i in range(n):
        plain[i] = bytearray(64 << 10)
        refs[i] = 2
        refs[i] -= 1
        refs[i] -= 1
        del plain[i], refs[i]
    baseline = 4 * n / (time.perf_counter() - start)
    return {"pool alloc/add_ref/free per s": ours, "pool cache hits per s": hits, "dict of bytearrays per s": baseline}


async def start_manager(pool_bytes: int):
    from flowrt.memory.keeper import ManagerProcess
    from flowrt.transport.sockets import ipc_endpoint, private_dir

    directory = private_dir()
    manager = ManagerProcess(ipc_endpoint(directory, "memory"), pool_bytes)
    await manager.start()
    return manager


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    loop = asyncio.new_event_loop()
    manager = loop.run_until_complete(start_manager(1 << 30))
    rows = []
    try:
        for label, nbytes in SIZES:
            tensor = torch.rand(nbytes // 4)
            n = rounds(nbytes, args.quick)
            row = {"size": label}
            row["flowrt (in pool)"] = statistics.median(bench_flowrt(tensor, n, manager.endpoint, True))
            row["flowrt (copy in)"] = statistics.median(bench_flowrt(tensor, n, manager.endpoint, False))
            row["pickle over pyzmq"] = statistics.median(bench_pickle(tensor, n))
            row["torch.multiprocessing queue"] = statistics.median(bench_queue(tensor, n))
            row["raw shared-memory copy"] = statistics.median(bench_shm(tensor, n))
            rows.append(row)
            print(label, {k: f"{v * 1e6:.0f} us" for k, v in row.items() if k != "size"}, flush=True)
    finally:
        loop.run_until_complete(manager.close())
    columns = [k for k in rows[0] if k != "size"]
    print("\n| size | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for row in rows:
        print(f"| {row['size']} | " + " | ".join(f"{row[c] * 1e3:.3f} ms" for c in columns) + " |")
    first, last = rows[0], rows[-1]
    print(f"\nflowrt (in pool) 256 MiB / 1 KiB: {last['flowrt (in pool)'] / first['flowrt (in pool)']:.2f}x (goal <= 2x)")
    print(f"pickle / flowrt (in pool) at 256 MiB: {last['pickle over pyzmq'] / last['flowrt (in pool)']:.0f}x (goal >= 100x)")
    print()
    for name, value in pool_ops(args.quick).items():
        print(f"{name}: {value:,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
