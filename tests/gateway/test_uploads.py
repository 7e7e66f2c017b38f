"""Multipart requests on POST /graphs/GRAPH (flowrt.gateway.uploads): an `input` part holding the
entry values and file parts a `file:NAME` string in them names reach the role as the files'
bytes (a data URL its media reading takes), on a real `flowc run` server; a body without
`input`, a name no part has and an `input` that is not JSON are 400s naming the fix, and a
`file:` name never reads the server's disk."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest

from tests.deploy.helpers import bundle_with_roles
from tests.gateway import guarded
from tests.runtime.test_run_cli import FLOW, MEDIA_WORKERS
from tests.runtime.test_serve import serving

PNG = b"\x89PNG\r\n\x1a\n" + bytes(40)
WAV = b"RIFF" + (36).to_bytes(4, "little") + b"WAVEfmt " + bytes(28)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    bundle = bundle_with_roles("flow uploads\n" + FLOW, MEDIA_WORKERS, tmp_path_factory.mktemp("uploads"), module="workers")
    with serving(bundle, guarded.command(bundle, "--grace", "0")) as running:
        yield running


def post(server, data: dict, files: dict | None = None) -> tuple[int, bytes]:
    """A multipart/form-data POST, as `curl -F` sends it: text fields, then file parts."""
    boundary = "flowc-test-boundary-7d1f"
    body = b""
    for name, value in data.items():
        body += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + value.encode() + b"\r\n"
    for name, (filename, content, mime) in (files or {}).items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\nContent-Type: {mime}\r\n\r\n'
        body += head.encode() + content + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    connection = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        connection.request("POST", "/graphs/g", body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_uploaded_parts_reach_the_role_as_their_bytes(server):
    inputs = {"request": {"picture": "file:cat", "clip": "file:hello"}}
    files = {"cat": ("cat.png", PNG, "image/png"), "hello": ("a.wav", WAV, "audio/wav")}
    status, body = post(server, {"input": json.dumps(inputs)}, files)
    events = [json.loads(line) for line in body.splitlines()]
    assert status == 200 and events[-1]["status"] == "ok", events
    assert events[0]["value"] == {"picture": {"bytes": len(PNG), "format": "PNG"}, "clip": {"bytes": len(WAV), "format": "WAV"}}


@pytest.mark.parametrize(
    ("data", "files", "words"),
    [
        ({}, {"cat": ("cat.png", PNG, "image/png")}, "no part named `input` holds the entry values"),
        (
            {"input": json.dumps({"request": {"picture": "file:dog"}})},
            {"cat": ("c.png", PNG, "image/png")},
            "`file:dog` names no part",
        ),
        ({"input": "{not json"}, None, "the `input` part is not JSON"),
        ({"input": json.dumps({"request": {"picture": "file:/etc/hostname"}})}, None, "`file:/etc/hostname` names no part"),
    ],
)
def test_a_multipart_body_that_does_not_fit_is_400_naming_the_fix(server, data, files, words):
    status, body = post(server, data, files or {"unused": ("u.bin", b"x", "application/octet-stream")})
    assert status == 400 and words in json.loads(body)["error"], body
    assert Path("/etc/hostname").read_bytes().strip() not in body  # nothing of the server's disk
