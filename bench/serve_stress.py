"""Serving under churn: many clients that go away at once, and a new session per request.

1. disconnects: ROUNDS rounds of CLIENTS concurrent calls to a graph that streams for ever,
   each client with its own `X-Flow-Session` (or none with --anonymous), never reading after
   the first event; once all are streaming they close together (hard close, reset, half-close
   or after one more line). Then /stats must be back to zero and every session must take a
   call again.
2. sessions: REQUESTS sequential calls of examples/image_chat, each with a new session (its llm
   keeps a history per session in the `kv` global), served with a cap on idle sessions.
3. admission (issue 32): two servers alike, one quiet and one while HELD concurrent slow calls
   (each sleeps until the bench lets it go) are held; PROBES calls of a cheap graph (and as
   many `GET /graphs`) go to each in turn, timed by the client. Under `--max-in-flight 8
   --max-queue 8` (16 held, the rest refused 429 at once; the cheap call, finding no place on
   the busy server, is answered 429 at once too) and with no limits (every slow call held, the
   cheap call runs). It prints p50/p99 per server and busy/quiet, side by side (goal: ≤ 2x).

It prints calls, disconnects, /stats and the server's RSS before and after each part.

    python bench/serve_stress.py [--rounds 10] [--clients 100] [--requests 40000] [--max-sessions 1000]
                                 [--held 100] [--probes 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FOREVER = """
flow forever

placeholder start: Json

role ticker {
    impl "forever_roles:Ticker"
    interface tick { in start  out stream tick: Json }
}

graph ticks {
    entry  start
    stream tick ordered
}
"""
FOREVER_ROLES = """
import asyncio


class Ticker:
    async def tick(self, ctx, start):
        count = start.get("count")
        i = 0
        try:
            while count is None or i < count:
                yield {"tick": {"i": i, "pad": "x" * 256}}
                i += 1
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            await asyncio.sleep(0.02)  # releasing what it holds takes a moment
            raise
"""


ADMISSION = """
flow admission

placeholder request: Json

role sleeper {
    impl "admission_roles:Sleeper"
    interface nap { in request  out rested: Json }
}

role quick {
    impl "admission_roles:Quick"
    interface answer { in request  out answer: Json }
}

graph slow {
    entry  request
    return rested
}

graph cheap {
    entry  request
    return answer
}
"""
ADMISSION_ROLES = """
import asyncio


class Sleeper:
    async def nap(self, ctx, request):
        await asyncio.sleep(request.get("seconds", 600))  # cancelled when its client goes away
        return {"rested": True}


class Quick:
    async def answer(self, ctx, request):
        return {"answer": request.get("n", 0)}
"""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(bundle: Path, *options: str) -> tuple[subprocess.Popen, int]:
    command = [sys.executable, "-m", "flowc", "run", str(bundle), "--http", "127.0.0.1:0", *options]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    banner = process.stdout.readline()
    assert banner.startswith("serving "), banner
    return process, int(banner.rsplit(":", 1)[1])


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)


def request(path: str, body: dict, session: str | None, close: bool = False) -> bytes:
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    if session is not None:
        head += f"X-Flow-Session: {session}\r\n"
    if close:
        head += "Connection: close\r\n"
    return head.encode() + b"\r\n" + data


def stats(port: int, idle: bool = True) -> dict:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        path = "/stats?idle=10" if idle else "/stats"
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return json.loads(answer.partition(b"\r\n\r\n")[2])


async def client(port: int, session: str | None, style: int, started: asyncio.Barrier) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request("/graphs/ticks", {"start": {}}, session))
    await writer.drain()
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    await reader.readline()
    await started.wait()
    sock = writer.get_extra_info("socket")
    if style == 1:
        await reader.readline()
    elif style == 2:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    elif style == 3:
        sock.shutdown(socket.SHUT_WR)
    writer.close()


async def finite(port: int, session: str | None) -> str:
    """A call of 3 ticks: its status, or "hung" if it has not ended after 30 s (a wedged session)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request("/graphs/ticks", {"start": {"count": 3}}, session, close=True))
    await writer.drain()
    try:
        body = await asyncio.wait_for(reader.read(), 30)
    except TimeoutError:
        return "hung"
    finally:
        writer.close()
    return json.loads([line for line in body.split(b"\r\n") if line.startswith(b"{")][-1])["status"]


async def storm(port: int, rounds: int, clients: int, anonymous: bool) -> list[str | None]:
    sessions: list[str | None] = []
    for r in range(rounds):
        started = asyncio.Barrier(clients)
        names = [None if anonymous else f"r{r}-c{i}" for i in range(clients)]
        sessions += names
        await asyncio.wait_for(asyncio.gather(*(client(port, s, i % 4, started) for i, s in enumerate(names))), 120)
    return sessions


def disconnects(scratch: Path, rounds: int, clients: int, anonymous: bool) -> None:
    (scratch / "pipeline.flow").write_text(FOREVER)
    (scratch / "forever_roles.py").write_text(FOREVER_ROLES)
    bundle = scratch / "forever_bundle"
    subprocess.run(
        [sys.executable, "-m", "flowc", "build", str(scratch / "pipeline.flow"), "-o", str(bundle)],
        check=True,
        capture_output=True,
    )
    process, port = start(bundle)
    try:
        before = rss_mib(process.pid)
        began = time.perf_counter()
        sessions = asyncio.run(storm(port, rounds, clients, anonymous))
        after_storm = stats(port)
        rss_storm = rss_mib(process.pid)

        async def again() -> list[str]:
            return await asyncio.gather(*(finite(port, s) for s in sessions))

        statuses = asyncio.run(again())
        after = stats(port)
        print(f"disconnects ({'no session' if anonymous else 'a session each'}): {rounds} rounds x {clients} clients")
        print(f"  calls cancelled by their client going away: {len(sessions)}, in {time.perf_counter() - began:.1f} s")
        print(f"  /stats after the disconnects: {after_storm}")
        counts = {status: statuses.count(status) for status in sorted(set(statuses))}
        print(f"  calls again on the same sessions: {len(statuses)}, statuses {counts}; /stats: {after}")
        print(
            f"  server RSS: {before:.1f} MiB before, {rss_storm:.1f} MiB after the disconnects, {rss_mib(process.pid):.1f} MiB at the end"
        )
    finally:
        stop(process)


def session_churn(scratch: Path, requests: int, max_sessions: int | None) -> None:
    bundle = scratch / "chat_bundle"
    subprocess.run(
        [sys.executable, "-m", "flowc", "build", str(REPO / "examples/image_chat/pipeline.flow"), "-o", str(bundle)],
        check=True,
        capture_output=True,
    )
    body = json.loads((REPO / "examples/image_chat/request.json").read_text())
    process, port = start(bundle, *(["--max-sessions", str(max_sessions)] if max_sessions else []))
    try:
        sock = socket.create_connection(("127.0.0.1", port))
        file = sock.makefile("rb")
        before = rss_mib(process.pid)
        marks = []
        for i in range(requests):
            sock.sendall(request("/graphs/chat", body, f"user-{i}"))
            assert file.readline().startswith(b"HTTP/1.1 200")
            length = None
            while (header := file.readline()) != b"\r\n":
                if header.lower().startswith(b"content-length:"):
                    length = int(header.split(b":")[1])
            if length is not None:
                file.read(length)
            else:  # chunked
                while (size := int(file.readline().strip(), 16)) > 0:
                    file.read(size + 2)
                file.readline()
            if (i + 1) % (requests // 4) == 0:
                marks.append(f"{i + 1}: {rss_mib(process.pid):.1f}")
        sock.close()
        print(f"sessions: {requests} calls of image_chat, a new session each, --max-sessions {max_sessions or '(default)'}")
        print(f"  server RSS: {before:.1f} MiB before; after N calls: {', '.join(marks)} MiB")
        print(f"  /stats: {stats(port)}")
    finally:
        stop(process)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def probe(ports: list[int], probes: int) -> list[dict[str, tuple[list[float], dict[int, int]]]]:
    """Client-timed ms of `probes` cheap calls and `probes` GET /graphs to each server of
    `ports`, interleaved (each probe goes to every server in turn, so a moment's noise on the
    machine hits them alike), one keep-alive connection per server: per server, {what: (times,
    statuses counted)}."""
    connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=60) for port in ports]
    body = json.dumps({"request": {"n": 1}}).encode()
    found: list[dict[str, tuple[list[float], dict[int, int]]]] = [
        {"POST /graphs/cheap": ([], {}), "GET /graphs": ([], {})} for _ in ports
    ]
    for _ in range(probes):
        for what in found[0]:
            method, path = what.split()
            for connection, mine in zip(connections, found, strict=True):
                times, statuses = mine[what]
                began = time.perf_counter()
                connection.request(
                    method, path, body=body if method == "POST" else None, headers={"Content-Type": "application/json"}
                )
                answer = connection.getresponse()
                answer.read()
                times.append((time.perf_counter() - began) * 1e3)
                statuses[answer.status] = statuses.get(answer.status, 0) + 1
    for connection in connections:
        connection.close()
    return found


def hold(port: int, count: int) -> tuple[list[socket.socket], list[int]]:
    """`count` slow calls sent at once, each on a connection of its own, once the server has
    taken or refused every one (/stats): (the connections, the statuses of the answered ones,
    the refused; the held ones stay unanswered while they sleep)."""
    body = json.dumps({"request": {"seconds": 600}}).encode()
    head = f"POST /graphs/slow HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    for sock in sockets:
        sock.sendall(head.encode() + body)
    deadline = time.monotonic() + 60
    while True:
        told = stats(port, idle=False)
        if told["admitted_running"] + told["admission_waiting"] + told["refused_calls"] >= count:
            break
        assert time.monotonic() < deadline, f"the slow calls were not all taken or refused: {told}"
        time.sleep(0.05)
    refused, waiting = [], set(sockets)
    while waiting and (readable := select.select(list(waiting), [], [], 0.5)[0]):
        for sock in readable:
            refused.append(int(sock.recv(65536).split(b" ", 2)[1]))
            waiting.discard(sock)
    return sockets, refused


def admission(scratch: Path, held: int, probes: int) -> None:
    (scratch / "admission.flow").write_text(ADMISSION)
    (scratch / "admission_roles.py").write_text(ADMISSION_ROLES)
    bundle = scratch / "admission_bundle"
    subprocess.run(
        [sys.executable, "-m", "flowc", "build", str(scratch / "admission.flow"), "-o", str(bundle)],
        check=True,
        capture_output=True,
    )
    rows = []
    cpus = sorted(os.sched_getaffinity(0))
    for limits in (["--max-in-flight", "8", "--max-queue", "8"], []):
        # two servers alike, one left quiet and one holding the slow calls, probed in turn
        (quiet, quiet_port), (busy, busy_port) = (start(bundle, *limits, "--grace", "0") for _ in range(2))
        try:
            if len(cpus) >= 2:  # both servers on one CPU, the client on the others: the same neighbours
                for server in (quiet, busy):
                    os.sched_setaffinity(server.pid, {cpus[-1]})
                os.sched_setaffinity(0, set(cpus[:-1]))
            probe([quiet_port, busy_port], min(200, probes))  # warm up
            sockets, refused = hold(busy_port, held)
            told = stats(busy_port, idle=False)
            unloaded, loaded = probe([quiet_port, busy_port], probes)
            for sock in sockets:
                sock.close()
        finally:
            os.sched_setaffinity(0, set(cpus))
            stop(quiet)
            stop(busy)
        name = " ".join(limits) or "no limits"
        print(
            f"admission, {name}: {held} slow calls sent, {len(refused)} answered at once "
            f"({ {s: refused.count(s) for s in sorted(set(refused))} }), the rest held; "
            f"/stats while held: admitted_running {told.get('admitted_running')}, "
            f"admission_waiting {told.get('admission_waiting')}, refused_calls {told.get('refused_calls')}"
        )
        for what in unloaded:
            (quiet_times, quiet_statuses), (busy_times, busy_statuses) = unloaded[what], loaded[what]
            rows.append(
                (name, what, quiet_statuses, busy_statuses, statistics.median(quiet_times), percentile(quiet_times, 0.99),
                 statistics.median(busy_times), percentile(busy_times, 0.99))
            )  # fmt: skip
    print(f"probes: {probes} of each to each server, in turn, one keep-alive connection per server, client-timed")
    print(
        "| servers | probe | statuses, quiet server | statuses, server holding them | p50 quiet ms | p99 quiet ms | p50 holding ms | p99 holding ms | p99 holding/quiet |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for name, what, quiet_statuses, busy_statuses, q50, q99, b50, b99 in rows:
        print(
            f"| {name} | {what} | {quiet_statuses} | {busy_statuses} | {q50:.2f} | {q99:.2f} | {b50:.2f} | {b99:.2f} | "
            f"{b99 / q99:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--anonymous", action="store_true", help="disconnecting clients send no session")
    parser.add_argument("--requests", type=int, default=40_000, help="calls of the session part (0: skip it)")
    parser.add_argument("--max-sessions", type=int, default=1000, help="0: the server's default")
    parser.add_argument("--held", type=int, default=100, help="slow calls held in the admission part (0: skip it)")
    parser.add_argument("--probes", type=int, default=2000, help="cheap calls timed per phase of the admission part")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if args.rounds:
            disconnects(Path(scratch), args.rounds, args.clients, args.anonymous)
        if args.requests:
            session_churn(Path(scratch), args.requests, args.max_sessions)
        if args.held:
            admission(Path(scratch), args.held, args.probes)


if __name__ == "__main__":
    main()
