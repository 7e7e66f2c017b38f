"""Bad HTTP requests against a real `flowc run DIR --http` process on loopback.

Each row sends one bad request (raw bytes on a socket, so nothing is tidied on the way) and
asserts the status, a JSON `{"error", "hint"}` answer whose error names what is wrong, that the
server still serves a good call, and that /stats is back to zero. At the end the server's
stderr must hold no traceback. Requests HTTP itself cannot parse are answered by aiohttp in
plain text (there is no route yet to answer in JSON); their rows check the status only.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.runtime.harness import bundle_of

FLOW = """
placeholder request: Json
placeholder text: Text
placeholder tokens: Tokens
placeholder start: Json

role echo {
    impl "http_roles:Echo"
    interface run { in request  out answer: Json }
}

role typed {
    impl "http_roles:Typed"
    interface run { in text & tokens  out size: Json }
}

role ticker {
    impl "http_roles:Ticker"
    interface tick { in start  out stream tick: Json }
}

graph echo {
    entry  request
    return answer
}

graph typed {
    entry  text, tokens
    return size
}

graph ticks {
    entry  start
    stream tick
}
"""

ROLES = """
import asyncio


class Echo:
    async def run(self, ctx, request):
        return {"answer": request}


class Typed:
    async def run(self, ctx, text, tokens):
        return {"size": len(text) + len(tokens)}


class Ticker:
    async def tick(self, ctx, start):
        while True:
            yield {"tick": "x" * 512}
            await asyncio.sleep(0)
"""


class Server:
    def __init__(self, process: subprocess.Popen, port: int, log: Path):
        self.process, self.port, self.log = process, port, log

    def send(self, data: bytes, close_after: int | None = None) -> tuple[int, dict[str, str], bytes]:
        """Send raw bytes; (status, headers, body) of the answer, read to the end of the connection."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
            if close_after is not None:  # a client that goes away mid-request
                sock.sendall(data[:close_after])
                return 0, {}, b""
            sock.sendall(data)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if headers.get("transfer-encoding") == "chunked":
            body = _unchunk(body)
        return int(lines[0].split()[1]), headers, body

    def stats(self) -> dict:
        status, _, body = self.send(request("GET", "/stats?idle=20"))
        assert status == 200
        return json.loads(body)


def _unchunk(body: bytes) -> bytes:
    out = b""
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, body = out + rest[:n], rest[n + 2 :]
    return out


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    fields = {"Host": "test", "Connection": "close", "Content-Length": str(len(body)), **(headers or {})}
    if "Transfer-Encoding" in fields:
        del fields["Content-Length"]
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    return head.encode() + b"\r\n" + body


def post(path: str, body: bytes, content_type: str = "application/json", **headers: str) -> bytes:
    return request("POST", path, body, {"Content-Type": content_type, **headers})


def chunked(body: bytes) -> bytes:
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


@contextmanager
def serving(bundle: Path, log: Path, *options: str, debug: bool = False) -> Iterator[Server]:
    """`flowc run BUNDLE --http 127.0.0.1:0 OPTIONS` as a real process, its stderr in `log`;
    stopped by its PID at the end, and its log must then hold no traceback (unless `debug`)."""
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowc",
                *(["--debug"] if debug else []),
                "run",
                str(bundle),
                "--http",
                "127.0.0.1:0",
                *options,
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        banner = process.stdout.readline()
        assert banner.startswith("serving "), banner + log.read_text()
        yield Server(process, int(banner.rsplit(":", 1)[1]), log)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        process.stdout.close()
    if not debug:
        text = log.read_text()
        assert "Traceback" not in text and "internal error" not in text, text


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("http_inputs")
    (root / "http_roles.py").write_text(ROLES)
    with serving(bundle_of(FLOW, root), root / "server.log", "--max-body-mb", "1") as running:
        yield running


DEEP = b'{"request": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
GOOD = post("/graphs/echo", b'{"request": {"hello": "world"}}')

# (id, raw request, status, words in the error (None: aiohttp's own plain-text answer))
ROWS = [
    ("not-json", post("/graphs/echo", b"{not json"), 400, "the body is not JSON"),
    ("empty-body", post("/graphs/echo", b""), 400, "the body is not JSON"),
    ("json-list", post("/graphs/echo", b"[1, 2]"), 400, "the body is a JSON list, not an object"),
    ("json-null", post("/graphs/echo", b"null"), 400, "the body is a JSON null, not an object"),
    ("json-string", post("/graphs/echo", b'"hi"'), 400, "the body is a JSON string, not an object"),
    ("not-utf8", post("/graphs/echo", b'{"request": "\xff\xfe"}'), 400, "not UTF-8 JSON"),
    ("deep-nesting", post("/graphs/echo", DEEP), 400, "nested too deeply"),
    (
        "too-large",
        post("/graphs/echo", b'{"request": "' + b"x" * (1 << 20) + b'"}'),
        413,
        "larger than the server's limit of 1 MiB",
    ),
    ("unknown-entry", post("/graphs/echo", b'{"prompt": 1}'), 422, "missing request; unexpected prompt"),
    ("extra-entry", post("/graphs/echo", b'{"request": 1, "more": 2}'), 422, "unexpected more"),
    (
        "text-as-number",
        post("/graphs/typed", b'{"text": 42, "tokens": [1]}'),
        422,
        "entry `text` is declared `Text` and takes a string, not a number (42)",
    ),
    (
        "tokens-with-a-string",
        post("/graphs/typed", b'{"text": "a", "tokens": [1, "2"]}'),
        422,
        "entry `tokens` is declared `Tokens` and takes a list of integers; item 1 is a string",
    ),
    ("tokens-with-a-bool", post("/graphs/typed", b'{"text": "a", "tokens": [true]}'), 422, "item 0 is a boolean"),
    ("unknown-graph", post("/graphs/draw", b"{}"), 404, "no graph `draw`"),
    ("unknown-path", request("GET", "/nope"), 404, "no such path: /nope"),
    ("root-path", request("GET", "/"), 404, "no such path: /"),
    ("get-a-graph", request("GET", "/graphs/echo"), 405, "/graphs/echo does not answer GET"),
    ("delete-health", request("DELETE", "/health"), 405, "/health does not answer DELETE"),
    ("post-stats", post("/stats", b"{}"), 405, "/stats does not answer POST"),
    ("timeout-zero", post("/graphs/echo?timeout=0", b'{"request": 1}'), 400, "`timeout`: a timeout must be a finite number"),
    ("timeout-nan", post("/graphs/echo?timeout=nan", b'{"request": 1}'), 400, "not 'nan'"),
    ("timeout-inf", post("/graphs/echo?timeout=inf", b'{"request": 1}'), 400, "not 'inf'"),
    ("timeout-negative", post("/graphs/echo?timeout=-1", b'{"request": 1}'), 400, "not '-1'"),
    ("timeout-word", post("/graphs/echo?timeout=soon", b'{"request": 1}'), 400, "expected a number of seconds"),
    ("idle-nan", request("GET", "/stats?idle=nan"), 400, "`idle`: a wait must be a finite number"),
    ("idle-inf", request("GET", "/stats?idle=inf"), 400, "not 'inf'"),
    ("idle-negative", request("GET", "/stats?idle=-1"), 400, "not '-1'"),
    (
        "multipart-body-without-names",
        post("/graphs/echo", b"--x\r\n\r\nhi\r\n--x--", "multipart/form-data; boundary=x"),
        400,
        "a part has no name (Content-Disposition: form-data; name=...)",
    ),
    (
        "multipart-body-without-input",
        post(
            "/graphs/echo",
            b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\nhi\r\n--x--',
            "multipart/form-data; boundary=x",
        ),
        400,
        "no part named `input` holds the entry values",
    ),
    (
        "multipart-body-that-is-not-multipart",
        post("/graphs/echo", b"garbage without boundaries", "multipart/form-data; boundary=x"),
        400,
        "the multipart body could not be read",
    ),
    (
        "gzip-that-is-not-gzip",
        post("/graphs/echo", b'{"request": 1}', **{"Content-Encoding": "gzip"}),
        400,
        "the body could not be read (Can not decode content-encoding: gzip)",
    ),
    ("header-too-long", request("GET", "/health", headers={"X-Long": "a" * 20_000}), 400, None),
    ("not-http", b"BLAH\r\n\r\n", 400, None),
]


@pytest.mark.parametrize(("data", "status", "words"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_a_bad_request_gets_a_clear_answer_and_the_server_keeps_serving(server, data, status, words):
    got, headers, body = server.send(data)
    assert got == status, body
    if words is not None:
        assert headers["content-type"].startswith("application/json")
        answer = json.loads(body)
        assert words in answer["error"], answer
        assert answer["hint"]
        if status == 405:
            assert headers["allow"]
    ok, _, events = server.send(GOOD)
    assert ok == 200 and json.loads(events.splitlines()[-1])["status"] == "ok"
    assert not any(server.stats().values())


# requests that are fine, though unusual: answered normally
GOOD_ROWS = [
    ("json-as-text-plain", post("/graphs/echo", b'{"request": 1}', "text/plain"), 1),
    ("form-content-type-as-curl-sends", post("/graphs/echo", b'{"request": 2}', "application/x-www-form-urlencoded"), 2),
    ("chunked-body", post("/graphs/echo", chunked(b'{"request": 3}'), **{"Transfer-Encoding": "chunked"}), 3),
    ("gzip-body", post("/graphs/echo", gzip.compress(b'{"request": 5}'), **{"Content-Encoding": "gzip"}), 5),
    ("session-in-query", post("/graphs/echo?session=%C3%A9t%C3%A9", b'{"request": 4}'), 4),
    ("moderately-deep", post("/graphs/echo", b'{"request": ' + b"[" * 500 + b"]" * 500 + b"}"), None),
]


@pytest.mark.parametrize(("data", "value"), [r[1:] for r in GOOD_ROWS], ids=[r[0] for r in GOOD_ROWS])
def test_an_unusual_but_valid_request_is_answered(server, data, value):
    status, _, body = server.send(data)
    assert status == 200, body
    events = [json.loads(line) for line in body.splitlines()]
    assert events[-1]["status"] == "ok"
    if value is not None:
        assert events[0] == {"event": "return", "field": "answer", "value": value}
    assert not any(server.stats().values())


@pytest.mark.parametrize(
    ("data", "sent"),
    [
        (post("/graphs/echo", b'{"request": "' + b"x" * 1000 + b'"}'), 100),  # gone mid-body
        (post("/graphs/echo", b'{"request": 1}'), 20),  # gone mid-headers
        (post("/graphs/ticks", b'{"start": {}}'), None),  # gone mid-stream, never reading
    ],
    ids=["mid-body", "mid-headers", "mid-stream"],
)
def test_a_client_that_goes_away_leaves_nothing_behind(server, data, sent):
    if sent is not None:
        server.send(data, close_after=sent)
    else:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(data)
            assert sock.recv(64).startswith(b"HTTP/1.1 200")  # the call is streaming
    assert not any(server.stats().values())
    status, _, _ = server.send(GOOD)
    assert status == 200
