"""OpenTelemetry export (flowrt.observe.otlp) from a real server to a real OTLP/HTTP receiver on
loopback: the server, started with OTEL_EXPORTER_OTLP_ENDPOINT, sends every call as spans
through the standard SDK's exporter; the receiver decodes the protobuf requests with
opentelemetry-proto. The spans must tell what the Chrome trace of the same call tells."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="needs the OpenTelemetry SDK: pip install 'flowc[otlp]'")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from flowrt.observe import otlp  # noqa: E402
from tests.observe.helpers import BROKEN_IMAGE, IMAGE_CHAT, REQUEST, RUNS, activations, build_image_chat  # noqa: E402
from tests.runtime.test_serve import lines, serving  # noqa: E402


class Receiver:
    """An OTLP/HTTP traces endpoint: keeps every span it is sent, as plain dicts (and answers
    `status`: 500 plays a collector that is failing)."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.posts = 0
        self.spans: list[dict] = []
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                receiver.add(request, self.path)
                self.send_response(receiver.status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, request: ExportTraceServiceRequest, path: str) -> None:
        with self.changed:
            self.posts += 1
            for resource in request.resource_spans:
                service = {a.key: a.value.string_value for a in resource.resource.attributes}.get("service.name")
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        self.spans.append(
                            {
                                "path": path,
                                "service": service,
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "error": span.status.code == 2,
                                "attributes": {a.key: _value(a.value) for a in span.attributes},
                            }
                        )
            self.changed.notify_all()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[dict]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.spans) >= count, timeout), f"{len(self.spans)} of {count} spans"
            return list(self.spans)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value):
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return build_image_chat(tmp_path_factory.mktemp("otlp"))


@pytest.fixture
def receiver(monkeypatch):
    receiver = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "image-chat-test")
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    yield receiver
    receiver.close()


def test_every_call_reaches_the_collector_as_the_spans_its_trace_tells(bundle, receiver, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # ms: the SDK sends while the server runs
    request = (IMAGE_CHAT / "request.json").read_bytes()
    with serving(bundle) as server:
        traced = lines(server.post("/graphs/chat?trace=1", request, {"X-Flow-Session": "alice"}))
        broken = lines(server.post("/graphs/chat", json.dumps(BROKEN_IMAGE).encode()))
        expected = sum(RUNS["request"].values()) + sum(RUNS["broken_image"].values()) + 2
        spans = receiver.wait_for(expected)
    assert len(spans) == expected and {s["path"] for s in spans} == {"/v1/traces"}
    assert {s["service"] for s in spans} == {"image-chat-test"}
    trace = traced[-1]["trace"]
    assert broken[-1]["status"] == "error"
    roots = {s["attributes"]["flowrt.call_id"]: s for s in spans if not s["parent"]}
    assert set(roots) == {trace["otherData"]["call_id"], trace["otherData"]["call_id"] + 1}  # integers, as in traces
    good, bad = roots[trace["otherData"]["call_id"]], roots[trace["otherData"]["call_id"] + 1]
    assert good["name"] == "call chat" and not good["error"] and good["attributes"]["flowrt.session"] == "alice"
    assert bad["error"] and bad["attributes"]["flowrt.status"] == "error"
    for root, runs in ((good, RUNS["request"]), (bad, RUNS["broken_image"])):
        children = [s for s in spans if s["parent"] == root["span_id"]]
        assert all(s["trace_id"] == root["trace_id"] for s in children)
        got = Counter(
            (s["attributes"]["flowrt.role"], s["attributes"]["flowrt.interface"], s["attributes"]["flowrt.outcome"])
            for s in children
        )
        assert got == runs
        assert all(root["start"] <= s["start"] <= s["end"] <= root["end"] for s in children)
        assert all(s["error"] == (s["attributes"]["flowrt.outcome"] != "ok") for s in children)
    # the activations' facts are the Chrome trace's: the same aids, consumed frames and frames out
    by_aid = {s["attributes"]["flowrt.aid"]: s["attributes"] for s in spans if s["parent"] == good["span_id"]}
    for event in activations(trace):
        span = by_aid[event["args"]["aid"]]
        assert (span["flowrt.role"], span["flowrt.interface"]) == (event["args"]["role"], event["args"]["interface"])
        assert span["flowrt.inputs"] == event["args"]["inputs"] and span["flowrt.frames"] == event["args"]["frames"]


def test_spans_still_queued_are_sent_when_the_server_stops(bundle, receiver, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # ten minutes: only the shutdown sends them
    with serving(bundle) as server:
        assert lines(server.post("/graphs/chat", json.dumps(REQUEST).encode()))[-1]["status"] == "ok"
        assert receiver.spans == []
        os.kill(server.process.pid, signal.SIGTERM)
        assert server.process.wait(timeout=30) == 0
    assert len(receiver.wait_for(sum(RUNS["request"].values()) + 1)) == sum(RUNS["request"].values()) + 1


def test_a_server_asked_to_export_without_the_sdk_is_refused_before_it_starts(bundle, tmp_path):
    # the SDK made unimportable the way Python itself marks a module missing (None in sys.modules)
    script = "import sys; sys.modules['opentelemetry.sdk'] = None; from flowc.cli import main; main()"
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    result = subprocess.run(
        [sys.executable, "-c", script, "run", str(bundle), "--http", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "OTEL_EXPORTER_OTLP_ENDPOINT is set" in result.stderr and "pip install 'flowc[otlp]'" in result.stderr
    assert "Traceback" not in result.stderr and "serving" not in result.stdout


def test_the_sdk_switch_and_an_unset_endpoint_leave_export_off(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert otlp.from_environment() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    assert otlp.wanted()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "TRUE")
    assert otlp.from_environment() is None


def test_a_failing_collector_is_logged_as_json_lines_and_loses_no_call(bundle, monkeypatch, tmp_path):
    failing = Receiver(status=500)
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", failing.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
        command = [sys.executable, "-m", "flowc", "run", str(bundle), "--http", "127.0.0.1:0", "--log-format", "json"]
        with serving(bundle, command, cwd=tmp_path) as server:
            for _ in range(2):
                assert lines(server.post("/graphs/chat", json.dumps(REQUEST).encode()))[-1]["status"] == "ok"
            with failing.changed:
                assert failing.changed.wait_for(lambda: failing.posts >= 1, 30), "the exporter never sent"
            os.kill(server.process.pid, signal.SIGTERM)
            assert server.process.wait(timeout=30) == 0
            logged = [json.loads(line) for line in server.process.stderr.read().splitlines()]  # every line JSON
    finally:
        failing.close()
    refused = [line for line in logged if line["logger"].startswith("opentelemetry")]
    assert refused and all("500" in line["msg"] or "export" in line["msg"].lower() for line in refused)


def test_a_collector_that_never_answers_delays_a_stop_by_a_bounded_wait_and_is_named(bundle, monkeypatch, tmp_path):
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, reads nothing, answers nothing
    held: list = []

    def hold() -> None:
        while True:
            try:
                held.append(silent.accept()[0])
            except OSError:
                return

    threading.Thread(target=hold, daemon=True).start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # only the stop sends: into the silence
        with serving(bundle, cwd=tmp_path) as server:
            assert lines(server.post("/graphs/chat", json.dumps(REQUEST).encode()))[-1]["status"] == "ok"
            os.kill(server.process.pid, signal.SIGTERM)
            assert server.process.wait(timeout=30) == 0  # (the SDK alone would wait out its 10 s timeout, and again at exit)
            stderr = server.process.stderr.read()
    finally:
        silent.close()
        for connection in held:
            connection.close()
    assert "did not take the last spans" in stderr and "OTEL_EXPORTER_OTLP_ENDPOINT" in stderr


@pytest.mark.parametrize("endpoint", ["127.0.0.1:4318", "not a url", "ftp://127.0.0.1:1", "http://[::1"])
def test_an_endpoint_that_is_not_an_http_url_is_refused_before_the_server_starts(bundle, tmp_path, endpoint):
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    result = subprocess.run(
        [sys.executable, "-m", "flowc", "run", str(bundle), "--http", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "is not an http(s) URL" in result.stderr and "OTEL_EXPORTER_OTLP_ENDPOINT" in result.stderr
    assert "Traceback" not in result.stderr and "serving" not in result.stdout
