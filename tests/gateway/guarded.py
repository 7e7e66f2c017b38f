"""A pipeline and a real `flowc run --http` server for the front door's tests (keys, sessions,
exposure, admission, drain, client errors): `g` (a Json entry) runs `worker`, which fails as
asked (flowrt.BadInput, or an error whose message holds socket and /dev/shm paths) or holds
its call until a file exists; `talk` (a Text entry, for the openai client) streams the prompt's
words, refuses the prompt `bad` with flowrt.BadInput, or holds on `wait:PATH`. Servers start on
port 0 and stop by PID (tests.runtime.test_serve.serving); waits are bounded polls, never sleeps.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
from pathlib import Path
from typing import Any

from tests.deploy.helpers import bundle_with_roles
from tests.params.test_meta_helpers import wait_until
from tests.runtime.test_serve import Server

FLOW = """
placeholder request: Json
placeholder prompt: Text

role worker {
    impl "roles:Worker"
    interface run { in request  out result: Json }
}

role talker {
    impl "roles:Talker"
    interface talk { in prompt  out stream word: Text }
}

graph g {
    entry request
    return result
}

graph talk {
    entry prompt
    stream word ordered
}
"""

ROLES = """
import asyncio, os

import flowrt


async def until(path):
    for _ in range(12000):  # bounded: about two minutes at the most
        if os.path.exists(path):
            return
        await asyncio.sleep(0.01)


class Worker:
    async def run(self, ctx, request):
        if request.get("bad"):
            raise flowrt.BadInput("`bad` asks for a bad request: leave it out")
        if request.get("leak"):
            raise ValueError("cannot reach ipc:///tmp/flowrt-x/replica-3.sock nor /dev/shm/flowrt-slab-9")  # LEAK LINE
        if request.get("wait_for"):
            open(f"{request['wait_for']}.{request.get('n', 0)}.started", "w").close()
            await until(request["wait_for"])
        return {"result": {"n": request.get("n"), "session": ctx.session}}


class Talker:
    async def talk(self, ctx, prompt):
        if prompt == "bad":
            raise flowrt.BadInput("the prompt may not be `bad`: say something else")
        if prompt.startswith("wait:"):
            await until(prompt[5:])
        for word in prompt.split():
            yield {"word": word + " "}
"""

LEAK_LINE = next(n for n, line in enumerate(ROLES.splitlines(), 1) if "LEAK LINE" in line)  # its line in roles.py


def bundle(directory: Path) -> Path:
    return bundle_with_roles(FLOW, ROLES, directory)


def command(bundle_dir: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "flowc", "run", str(bundle_dir), "--http", "127.0.0.1:0", *options]


def request(
    server: Server, method: str, path: str, body: Any = None, key: str | None = None, headers: dict | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own: (status, headers, body)."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=60)
    sent = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    try:
        connection.request(method, path, body=None if body is None else json.dumps(body).encode(), headers=sent)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def events(body: bytes) -> list[dict]:
    return [json.loads(line) for line in body.splitlines() if line.strip()]


class Held:
    """Calls of `g` held in flight (on threads) until `release()`; `answers` once they end."""

    def __init__(self, server: Server, gate: Path, count: int, key: str | None = None, session: str | None = None):
        self.gate, self.answers = gate, [None] * count
        headers = {"X-Flow-Session": session} if session is not None else None

        def call(n: int) -> None:
            self.answers[n] = request(server, "POST", "/graphs/g", {"request": {"wait_for": str(gate), "n": n}}, key, headers)

        self.threads = [threading.Thread(target=call, args=(n,), daemon=True) for n in range(count)]
        for thread in self.threads:
            thread.start()

    def started(self, count: int | None = None) -> None:
        """Wait until `count` of them (all by default) reached the role."""
        count = len(self.threads) if count is None else count
        wait_until(lambda: len(list(self.gate.parent.glob(f"{self.gate.name}.*.started"))) >= count, 60, "held calls starting")

    def release(self) -> list:
        self.gate.touch()
        for thread in self.threads:
            thread.join(120)
        return self.answers
