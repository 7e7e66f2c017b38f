"""What serving costs on top of the call: the image_chat example called embedded and over HTTP.

In ONE run, alternating batches (so machine drift hits both alike), it measures:
- embedded: `Runtime.call` on the built examples/image_chat bundle in this process, events
  consumed and dropped (CPU µs per call of this process);
- served: the same bundle served by `flowc run DIR --http` in a subprocess, called over one
  keep-alive loopback connection, one request at a time (CPU µs per request of the server
  process, from /proc/PID/stat, so the client's own work is not counted), and how many
  HTTP chunks (one per server write after the headers) each answer came in; 0 is a plain
  answer with a Content-Length, written at once;
- served with a key: the same, by a second server started with `--api-key` (and
  `--prefix-scope key`, its default with keys), each request sending `Authorization: Bearer
  KEY` (issue 32: API-key checking costs at most 3%). The two servers share one CPU (this
  process takes the others) and take turns going first in each batch.
It prints the medians over batches, served/embedded, the ratio the goal is about (≤ 2), and
keyed/served.

    python bench/serve_overhead.py [--requests 2000] [--batches 7] [--profile]

`--profile` runs the server under cProfile instead and prints where its time goes (set
FLOWRT_PURE=1 to see the control core's functions too; compiled, they are invisible).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REQUEST = json.loads((REPO / "examples" / "image_chat" / "request.json").read_text())
TICK = os.sysconf("SC_CLK_TCK")
API_KEY = "bench-key-0123456789abcdef0123456789"


def build(out: Path) -> Path:
    bundle = out / "chat_bundle"
    command = [sys.executable, "-m", "flowc", "build", str(REPO / "examples/image_chat/pipeline.flow"), "-o", str(bundle)]
    subprocess.run(command, check=True, capture_output=True, cwd=REPO)
    return bundle


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


class Client:
    """One keep-alive HTTP/1.1 connection; reads chunked answers and counts their chunks."""

    def __init__(self, host: str, port: int, key: str | None = None):
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")
        body = json.dumps(REQUEST).encode()
        auth = f"Authorization: Bearer {key}\r\n" if key is not None else ""
        self.request = (
            f"POST /graphs/chat HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    def call(self) -> tuple[int, bytes]:
        """(chunks the answer came in, 0 for a plain answer with a Content-Length; its last line)."""
        self.sock.sendall(self.request)
        status = self.file.readline()
        assert status.startswith(b"HTTP/1.1 200"), status
        length = None
        while (header := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = header.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length is not None:
            return 0, self.file.read(length).rstrip(b"\n").rsplit(b"\n", 1)[-1]
        chunks, last = 0, b""
        while True:
            size = int(self.file.readline().strip(), 16)
            if size == 0:
                self.file.readline()
                return chunks, last
            data = self.file.read(size)
            self.file.readline()
            chunks += 1
            last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def start_server(bundle: Path, profile: Path | None = None, *options: str) -> tuple[subprocess.Popen, str, int]:
    command = [sys.executable]
    if profile is not None:
        command += ["-m", "cProfile", "-o", str(profile)]
    command += ["-m", "flowc", "run", str(bundle), "--http", "127.0.0.1:0", *options]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    banner = process.stdout.readline()
    assert banner.startswith("serving "), banner + process.stderr.read()
    host, port = banner.split("http://", 1)[1].strip().rsplit(":", 1)
    return process, host, int(port)


def stop_server(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)


def served_batch(process: subprocess.Popen, client: Client, requests: int) -> tuple[float, float]:
    """(server CPU µs per request, chunks per answer)."""
    before = cpu_seconds(process.pid)
    chunks = 0
    for _ in range(requests):
        count, last = client.call()
        chunks += count
        assert json.loads(last)["status"] == "ok", last
    return (cpu_seconds(process.pid) - before) / requests * 1e6, chunks / requests


async def embedded_batch(runtime, requests: int) -> float:
    """CPU µs per embedded call (events consumed, not serialised)."""
    before = time.process_time()
    for _ in range(requests):
        async for _event in runtime.call("chat", REQUEST):
            pass
    return (time.process_time() - before) / requests * 1e6


def measure(requests: int, batches: int) -> None:
    from flowrt.control import CORE, Runtime

    print(f"flowrt control core: {CORE}")
    with tempfile.TemporaryDirectory() as scratch:
        bundle = build(Path(scratch))
        process, host, port = start_server(bundle)
        keyed_process, keyed_host, keyed_port = start_server(bundle, None, "--api-key", API_KEY)
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) >= 2:  # both servers on one CPU, this process on the others: they meet the same neighbours
            for server in (process, keyed_process):
                os.sched_setaffinity(server.pid, {cpus[-1]})
            os.sched_setaffinity(0, set(cpus[:-1]))
        client = Client(host, port)
        keyed_client = Client(keyed_host, keyed_port, API_KEY)
        loop = asyncio.new_event_loop()
        try:
            runtime = loop.run_until_complete(Runtime.open(bundle))
            served_batch(process, client, 50)  # warm them up
            served_batch(keyed_process, keyed_client, 50)
            loop.run_until_complete(embedded_batch(runtime, 50))
            embedded, served, keyed, chunks = [], [], [], []
            for batch in range(batches):
                embedded.append(loop.run_until_complete(embedded_batch(runtime, requests)))
                if batch % 2:  # the two servers take turns going first (ABBA): drift within a batch hits both
                    keyed.append(served_batch(keyed_process, keyed_client, requests)[0])
                cpu, per_answer = served_batch(process, client, requests)
                served.append(cpu)
                chunks.append(per_answer)
                if not batch % 2:
                    keyed.append(served_batch(keyed_process, keyed_client, requests)[0])
            loop.run_until_complete(runtime.close())
        finally:
            client.close()
            keyed_client.close()
            stop_server(process)
            stop_server(keyed_process)
            loop.close()
    e, s, k = statistics.median(embedded), statistics.median(served), statistics.median(keyed)
    print(
        f"requests per batch: {requests}, batches: {batches} (alternating), 8 events per call (6 streamed tokens, 1 return, done)"
    )
    print("| path | CPU µs per call (median) | min | max | HTTP chunks per answer |")
    print("|---|---:|---:|---:|---:|")
    print(f"| embedded `Runtime.call` | {e:.0f} | {min(embedded):.0f} | {max(embedded):.0f} | - |")
    print(f"| served (server process) | {s:.0f} | {min(served):.0f} | {max(served):.0f} | {statistics.median(chunks):.1f} |")
    print(f"| served with --api-key (server process) | {k:.0f} | {min(keyed):.0f} | {max(keyed):.0f} | - |")
    if not (e and s and all(served)):  # a batch too short for the clock's tick (10 ms) measures 0: say so
        print("a batch took less CPU than the clock measures: give more --requests for ratios")
        return
    print(f"served/embedded = {s / e:.2f}x (goal: ≤ 2x)")
    check = key_check_us()
    print(f"the key check alone, in this process: {check:.2f} µs per request ({check / s:.2%} of a served call)")
    ratios = [b / a for a, b in zip(served, keyed, strict=True)]  # (per batch pair: the same moment's drift)
    print(
        f"served with --api-key/served = {k / s:.3f}x of the medians; per batch pair median {statistics.median(ratios):.3f}x "
        f"(goal: ≤ 1.03x)"
    )


def key_check_us(rounds: int = 200_000) -> float:
    """CPU µs of what a keyed server adds per request, in this process: the Bearer key's
    principal (flowrt.gateway.access.Keys) and the call's prefix scope set and reset."""
    from flowrt.control.sessions import PREFIX_SCOPE
    from flowrt.frontdoor import FrontDoor
    from flowrt.gateway.access import Keys

    keys, header = Keys(FrontDoor(api_keys=(API_KEY,))), f"Bearer {API_KEY}"
    before = time.process_time()
    for _ in range(rounds):
        principal, _admin = keys.principal(header)
        PREFIX_SCOPE.reset(PREFIX_SCOPE.set(principal))
    return (time.process_time() - before) / rounds * 1e6


def profile(requests: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        bundle = build(Path(scratch))
        stats_file = Path(scratch) / "server.prof"
        process, host, port = start_server(bundle, stats_file)
        client = Client(host, port)
        try:
            for _ in range(requests):
                client.call()
        finally:
            client.close()
            stop_server(process)
        stats = pstats.Stats(str(stats_file))
        stats.sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="calls per batch")
    parser.add_argument("--batches", type=int, default=7, help="batches of each path, alternating")
    parser.add_argument("--profile", action="store_true", help="profile the server instead")
    args = parser.parse_args()
    if args.profile:
        profile(args.requests * args.batches)
    else:
        measure(args.requests, args.batches)


if __name__ == "__main__":
    main()
