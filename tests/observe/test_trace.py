"""Traces of real calls: `flowc run --once --trace FILE` and `?trace=1` on a real server, both
of examples/image_chat, checked against the trace schema and its promises (helpers.check_trace).

Perfetto's own TraceProcessor needs a binary it downloads on first use, which this machine
cannot fetch; the JSON schema in data/ (Chrome's trace event format, with flowrt's args) is
the check instead.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.observe.helpers import BROKEN_IMAGE, IMAGE_CHAT, REQUEST, RUNS, build_image_chat, check_trace
from tests.runtime.test_serve import lines, serving


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return build_image_chat(tmp_path_factory.mktemp("trace"))


def run_once(bundle, tmp_path, request: dict, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flowc", "run", str(bundle), "--once", "chat", "--input", json.dumps(request), *extra],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip


def test_flowc_run_trace_writes_every_activation_and_its_arrows(bundle, tmp_path):
    plain = run_once(bundle, tmp_path, REQUEST)
    traced = run_once(bundle, tmp_path, REQUEST, "--trace", "call.json")
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout  # tracing changes no event
    trace = json.loads((tmp_path / "call.json").read_text())
    check_trace(trace, RUNS["request"])
    assert trace["otherData"]["status"] == "ok"


def test_a_failed_call_is_traced_with_its_errors(bundle, tmp_path):
    traced = run_once(bundle, tmp_path, BROKEN_IMAGE, "--trace", "broken.json")
    assert traced.returncode == 1
    trace = json.loads((tmp_path / "broken.json").read_text())
    check_trace(trace, RUNS["broken_image"])
    assert trace["otherData"]["status"] == "error"


def test_run_trace_refuses_a_path_it_cannot_write(bundle, tmp_path):
    result = run_once(bundle, tmp_path, REQUEST, "--trace", str(tmp_path / "missing" / "call.json"))
    assert result.returncode == 2 and "--trace: cannot write" in result.stderr and "Traceback" not in result.stderr
    served = subprocess.run([sys.executable, "-m", "flowc", "run", str(bundle), "--trace", "x.json"], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert served.returncode == 2 and "add --once GRAPH" in served.stderr


def test_trace_1_adds_the_trace_to_the_done_event_of_a_served_call(bundle):
    request = (IMAGE_CHAT / "request.json").read_bytes()
    with serving(bundle) as server:
        plain = lines(server.post("/graphs/chat", request))
        traced = lines(server.post("/graphs/chat?trace=1", request))
        bad = server.post("/graphs/chat?trace=maybe", request)
        assert bad.status == 400 and "`trace`" in json.loads(bad.read())["error"]
        # a session header whose bytes are not UTF-8: a 400 at the door (no process could be told
        # it), not a 500 and not a trace
        odd = server.post("/graphs/chat?trace=1", request, {"X-Flow-Session": b"a\xff\xfeb"})
        assert odd.status == 400 and "not UTF-8" in json.loads(odd.read())["error"]
    done = traced[-1]
    trace = done.pop("trace")
    assert traced == plain and "trace" not in plain[-1]
    check_trace(trace, RUNS["request"])
    assert trace["otherData"]["call_id"] == 2


def test_input_bytes_count_tensors_and_bytes_in_lists_and_dataclass_fields():
    from dataclasses import dataclass

    import numpy

    from flowrt.observe.trace import payload_bytes

    @dataclass
    class Clip:  # as flowstd's audio clips carry their samples
        pcm: bytes
        sample_rate: int

    inputs = {"clip": Clip(b"\0" * 100, 16000), "parts": [numpy.zeros(10), b"ab"], "text": "hi", "json": {"n": 1}}
    assert payload_bytes(inputs) == 100 + 80 + 2
    assert payload_bytes({"flag": True, "none": None, "kind": Clip}) == 0
