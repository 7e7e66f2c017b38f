"""`flowc run DIR --http`: a real server process on loopback, driven with real HTTP connections.

Every server is started on port 0 (it prints the address it bound) and stopped by PID; waits
are on the server's answers (`/stats?idle=` returns when no call is in flight), never sleeps.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from flowrt.control import CORE
from tests.conftest import REPO

IMAGE_CHAT = REPO / "examples" / "image_chat"

TICKS = """\
flow ticks

placeholder start: Json

role ticker {
    impl "ticks_roles:Ticker"
    interface tick { in start  out stream tick: Json }
}

graph ticks {
    entry  start
    stream tick ordered
}
"""

TICKS_ROLES = """\
import asyncio


class Ticker:
    async def tick(self, ctx, start):
        for i in range(int(start.get("count", 5000))):  # bounded: the stream ends by itself
            yield {"tick": i}
            await asyncio.sleep(start.get("pause", 0) if i == 2 else 0.002)
"""


def flowc(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowc", *args], capture_output=True, text=True, timeout=120, **kwargs)


@pytest.fixture(scope="module")
def image_chat_bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serve") / "chat_bundle"  # not `image_chat`: that is the impl's package
    assert flowc("build", str(IMAGE_CHAT / "pipeline.flow"), "-o", str(out)).returncode == 0
    return out


@pytest.fixture(scope="module")
def ticks_bundle(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("ticks")
    (source / "pipeline.flow").write_text(TICKS, encoding="utf-8")
    (source / "ticks_roles.py").write_text(TICKS_ROLES, encoding="utf-8")
    out = source / "bundle"
    result = flowc("build", str(source / "pipeline.flow"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


class Server:
    def __init__(self, process: subprocess.Popen, host: str, port: int):
        self.process, self.host, self.port = process, host, port

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=30)

    def get(self, path: str) -> tuple[int, dict]:
        connection = self.connect()
        connection.request("GET", path)
        response = connection.getresponse()
        body = json.loads(response.read())
        connection.close()
        return response.status, body

    def post(self, path: str, body: bytes, headers: dict | None = None) -> http.client.HTTPResponse:
        connection = self.connect()
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        return connection.getresponse()


@contextmanager
def serving(bundle: Path, command: list[str] | None = None, cwd: Path | None = None) -> Iterator[Server]:
    process = subprocess.Popen(
        command or [sys.executable, "-m", "flowc", "run", str(bundle), "--http", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    try:
        banner = process.stdout.readline()  # ends at the banner, or at EOF if the server failed to start
        assert banner.startswith("serving "), banner + process.stderr.read()
        address = banner.split("://", 1)[1].strip()  # http:// or https:// (--tls-cert)
        host, port = address.rsplit(":", 1)
        yield Server(process, host, int(port))
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        process.stdout.close()
        process.stderr.close()


def lines(response: http.client.HTTPResponse) -> list[dict]:
    return [json.loads(line) for line in response.read().decode().splitlines()]


def test_a_call_streams_the_events_flowc_run_once_prints(image_chat_bundle: Path):
    request = (IMAGE_CHAT / "request.json").read_bytes()
    once = flowc("run", str(image_chat_bundle), "--once", "chat", "--input", f"@{IMAGE_CHAT / 'request.json'}")
    assert once.returncode == 0, once.stderr
    expected = [json.loads(line) for line in once.stdout.splitlines()]
    with serving(image_chat_bundle) as server:
        assert server.get("/health") == (200, {"status": "ok", "bundle": "image_chat", "graphs": ["chat"], "core": CORE})
        status, described = server.get("/graphs")
        assert described["chat"] == {
            "entry": ["request"],
            "types": {"request": "Json"},
            "entry_stream": [],
            "stream": ["token"],
            "return": ["image"],
            "timeout_s": None,
        }
        response = server.post("/graphs/chat", request, {"X-Flow-Session": "s1"})
        assert response.status == 200 and response.getheader("Content-Type") == "application/x-ndjson"
        got = lines(response)
    # the ordered token stream and the done event match exactly; the return may sit anywhere among tokens
    assert [e for e in got if e["event"] == "stream"] == [e for e in expected if e["event"] == "stream"]
    assert [e for e in got if e["event"] == "return"] == [e for e in expected if e["event"] == "return"]
    assert got[-1] == expected[-1] == {"event": "done", "status": "ok", "errors": [], "missing": []}


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/graphs/chat", b"{not json", 400, "not JSON"),
        ("/graphs/chat", b"[1, 2]", 400, "JSON list, not an object"),
        ("/graphs/chat?timeout=soon", b"{}", 400, "`timeout`: expected a number of seconds"),
        ("/graphs/draw", b"{}", 404, "no graph `draw`"),
        ("/graphs/chat", b'{"prompt": "hi"}', 422, "missing request; unexpected prompt"),
    ],
)
def test_bad_requests_get_a_clear_error_and_the_server_keeps_serving(image_chat_bundle, path, body, status, words):
    with serving(image_chat_bundle) as server:
        response = server.post(path, body)
        answer = json.loads(response.read())
        assert response.status == status
        assert words in answer["error"] and answer["hint"]
        good = server.post("/graphs/chat", (IMAGE_CHAT / "request.json").read_bytes())
        assert lines(good)[-1]["status"] == "ok"


def test_a_client_that_disconnects_cancels_its_call(ticks_bundle: Path):
    with serving(ticks_bundle) as server:
        # after 3 ticks the role goes quiet for two minutes: nothing is written that could fail, so
        # only noticing the disconnect itself can cancel the call within the wait below
        response = server.post("/graphs/ticks", b'{"start": {"count": 10, "pause": 120}}')
        assert [json.loads(response.readline()) for _ in range(3)] == [
            {"event": "stream", "field": "tick", "value": i} for i in range(3)
        ]
        response.close()  # the client goes away mid-stream
        status, statistics = server.get("/stats?idle=15")
        assert status == 200
        assert statistics["calls"] == 0 and not any(statistics.values()), statistics


def test_sigterm_without_grace_cancels_calls_in_flight_and_ends_their_streams(ticks_bundle: Path):
    command = [sys.executable, "-m", "flowc", "run", str(ticks_bundle), "--http", "127.0.0.1:0", "--grace", "0"]
    with serving(ticks_bundle, command) as server:
        response = server.post("/graphs/ticks", b'{"start": {"count": 5000}}')
        assert json.loads(response.readline())["event"] == "stream"
        os.kill(server.process.pid, signal.SIGTERM)
        rest = lines(response)
        assert rest[-1]["event"] == "done" and rest[-1]["status"] == "cancelled"
        assert len(rest) < 5000
        assert server.process.wait(timeout=30) == 0


def test_serving_options_that_cannot_work_are_refused_with_the_fix(image_chat_bundle: Path):
    registry = flowc("run", str(image_chat_bundle), "--registry", "redis://127.0.0.1:6379")
    assert registry.returncode == 2 and "--registry is for --deploy local or ray" in registry.stderr
    address = flowc("run", str(image_chat_bundle), "--http", "localhost")
    assert address.returncode == 2 and "--http takes HOST:PORT" in address.stderr
    with serving(image_chat_bundle) as server:
        taken = flowc("run", str(image_chat_bundle), "--http", f"127.0.0.1:{server.port}")
        assert taken.returncode == 2 and f"cannot listen on 127.0.0.1:{server.port}" in taken.stderr
        assert "Traceback" not in taken.stderr


def test_a_bundle_serves_itself_without_the_compiler(image_chat_bundle: Path):
    command = [sys.executable, "-m", image_chat_bundle.name, "serve", "--http", "127.0.0.1:0"]
    with serving(image_chat_bundle, command, cwd=image_chat_bundle.parent) as server:
        assert server.get("/health")[1]["bundle"] == "image_chat"  # the flow's name, whatever the directory
        assert lines(server.post("/graphs/chat", (IMAGE_CHAT / "request.json").read_bytes()))[-1]["status"] == "ok"


def test_a_call_over_before_its_first_write_is_one_plain_answer(image_chat_bundle: Path):
    with serving(image_chat_bundle) as server:
        response = server.post("/graphs/chat", (IMAGE_CHAT / "request.json").read_bytes())
        assert response.status == 200 and response.getheader("Content-Type") == "application/x-ndjson"
        body = response.read()
        assert int(response.getheader("Content-Length")) == len(body)  # not chunked: written at once
        assert json.loads(body.splitlines()[-1])["status"] == "ok"


def test_idle_sessions_are_capped_and_counted_in_stats(image_chat_bundle: Path):
    command = [sys.executable, "-m", "flowc", "run", str(image_chat_bundle), "--http", "127.0.0.1:0", "--max-sessions", "3"]
    with serving(image_chat_bundle, command) as server:
        for i in range(8):  # image_chat's llm keeps each session's history in its `kv` global
            response = server.post("/graphs/chat", (IMAGE_CHAT / "request.json").read_bytes(), {"X-Flow-Session": f"s{i}"})
            assert lines(response)[-1]["status"] == "ok"
        status, statistics = server.get("/stats?idle=10")
        assert status == 200 and statistics["sessions"] == statistics["idle_sessions"] == 3
        assert statistics["calls"] == statistics["queued_calls"] == 0
