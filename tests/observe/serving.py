"""A real `flowc run DIR --http` server for the tests of flowc top, start-up progress and
structured logs: stdout read up to the banner, stderr written to a file the test reads as it
grows, stopped by PID. A pipeline whose roles the test controls through files: `worker` fails
when asked, or waits until a file exists (a call held in flight); a role's `setup()` can be
held the same way."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.deploy.helpers import bundle_with_roles
from tests.params.test_meta_helpers import wait_until  # noqa: F401 - the observe tests' deadline poll

FLOW = """
placeholder request: Json

role front {
    impl "roles:Front"
    interface run { in request  out job: Json }
}

role worker {
    impl "roles:Worker"
    replicas 2
    interface run { in job  out result: Json }
}

graph g {
    entry request
    return result
}

graph echo {
    entry request
    return job
}
"""

ROLES = """
import asyncio, os

async def until(path):
    while not os.path.exists(path):
        await asyncio.sleep(0.01)

class Front:
    async def setup(self, ctx):
        gate = os.environ.get("FLOW_TEST_SETUP_GATE")
        if gate:
            open(gate + ".started", "w").close()
            await until(gate)

    async def run(self, ctx, request):
        return {"job": request}

class Worker:
    async def run(self, ctx, job):
        if job.get("fail"):
            raise ValueError("asked to fail")
        if job.get("wait_for"):
            open(job["wait_for"] + ".started", "w").close()
            await until(job["wait_for"])
        ctx.logger.warning("worker ran job %s", job.get("n"))
        return {"result": {"n": job.get("n")}}
"""

REPLICAS = {("front", 0), ("worker", 0), ("worker", 1)}


def bundle(directory: Path) -> Path:
    return bundle_with_roles(FLOW, ROLES, directory)


class Server:
    def __init__(self, process: subprocess.Popen, stderr: Path, banner: str):
        self.process = process
        self.stderr_path = stderr
        self.banner = banner
        self.url = banner.split(" on ", 1)[1].strip() if " on " in banner else ""
        host, _, port = self.url.removeprefix("http://").rpartition(":")
        self.host, self.port = host, int(port or 0)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def request(self, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            connection.request(method, path, None if body is None else json.dumps(body).encode(), headers or {})
            answer = connection.getresponse()
            return answer.status, answer.read()
        finally:
            connection.close()

    def call(self, graph: str, request: dict, query: str = "", session: str | None = None) -> list[dict]:
        headers = {"X-Flow-Session": session} if session else {}
        status, body = self.request("POST", f"/graphs/{graph}{query}", {"request": request}, headers)
        assert status == 200, body
        return [json.loads(line) for line in body.decode().splitlines()]

    def call_keyed(self, graph: str, request: dict, key: str) -> list[dict]:
        status, body = self.request("POST", f"/graphs/{graph}", {"request": request}, {"Authorization": f"Bearer {key}"})
        assert status == 200, body
        return [json.loads(line) for line in body.decode().splitlines()]

    def stats(self) -> dict:
        status, body = self.request("GET", "/stats")
        assert status == 200, body
        return json.loads(body)


@contextlib.contextmanager
def serving(bundle_dir: Path, *options: str, tmp: Path, env: dict | None = None, banner: bool = True) -> Iterator[Server]:
    """`flowc run BUNDLE --http 127.0.0.1:0 OPTIONS`; with `banner`, waits for it (failing with
    stderr if the server exits first). Stopped with SIGTERM on leaving."""
    stderr = tmp / f"stderr-{len(list(tmp.glob('stderr-*')))}.txt"
    with open(stderr, "w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "flowc", "run", str(bundle_dir), "--http", "127.0.0.1:0", *options],
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
            env={**os.environ, **(env or {})},
        )
    try:
        line = process.stdout.readline() if banner else ""
        if banner:
            assert line.startswith("serving "), line + stderr.read_text()
        yield Server(process, stderr, line)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
        process.stdout.close()
