"""`flowc top URL`: the arithmetic on hand-made Prometheus text (bucket percentiles as
histogram_quantile estimates them, rates between two scrapes, "–" for what a server does not
export), one frame of a real server (inproc and local) with calls made and one held in flight,
and the one-line errors for an address that is not a flowrt server's."""

from __future__ import annotations

import http.server
import json
import math
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flowc.top import DASH, Scrape, TopError, base_url, buckets, build_frame, parse_exposition, quantile, rate, render
from tests.deploy.helpers import free_port
from tests.observe import serving as served

EXPOSITION = """\
# HELP flowrt_calls_total Graph calls that ended.
# TYPE flowrt_calls_total counter
flowrt_calls_total{graph="chat",status="ok"} 30.0
flowrt_calls_total{graph="chat",status="error"} 2.0
# TYPE flowrt_calls_in_flight gauge
flowrt_calls_in_flight{graph="chat"} 3.0
# TYPE flowrt_call_duration_seconds histogram
flowrt_call_duration_seconds_bucket{graph="chat",le="0.1"} 10.0
flowrt_call_duration_seconds_bucket{graph="chat",le="0.5"} 30.0
flowrt_call_duration_seconds_bucket{graph="chat",le="1.0"} 32.0
flowrt_call_duration_seconds_bucket{graph="chat",le="+Inf"} 32.0
flowrt_call_duration_seconds_count{graph="chat"} 32.0
flowrt_call_duration_seconds_sum{graph="chat"} 9.0
# TYPE flowrt_activations_total counter
flowrt_activations_total{interface="encode",outcome="ok",role="vit"} 40.0
flowrt_activations_total{interface="encode",outcome="error",role="vit"} 2.0
flowrt_activations_total{interface="decode",outcome="ok",role="vit"} 8.0
# TYPE flowrt_activations_in_flight gauge
flowrt_activations_in_flight{interface="encode",role="vit"} 1.0
flowrt_activations_in_flight{interface="decode",role="vit"} 1.0
# TYPE flowrt_activation_duration_seconds histogram
flowrt_activation_duration_seconds_bucket{interface="encode",le="0.01",role="vit"} 20.0
flowrt_activation_duration_seconds_bucket{interface="encode",le="0.1",role="vit"} 42.0
flowrt_activation_duration_seconds_bucket{interface="encode",le="+Inf",role="vit"} 42.0
flowrt_activation_duration_seconds_bucket{interface="decode",le="0.01",role="vit"} 0.0
flowrt_activation_duration_seconds_bucket{interface="decode",le="0.1",role="vit"} 0.0
flowrt_activation_duration_seconds_bucket{interface="decode",le="+Inf",role="vit"} 8.0
"""

REPLICA_FAMILIES = """\
# TYPE flowrt_replica_up gauge
flowrt_replica_up{replica="0",role="vit"} 1.0
flowrt_replica_up{replica="1",role="vit"} 0.0
# TYPE flowrt_replica_queue_depth gauge
flowrt_replica_queue_depth{replica="0",role="vit"} 4.0
# TYPE flowrt_replica_restarts_total counter
flowrt_replica_restarts_total{replica="1",role="vit"} 2.0
# TYPE flowrt_kv_pages gauge
flowrt_kv_pages{process="llm/0",state="used",tier="gpu"} 12.0
flowrt_kv_pages{process="llm/1",state="used",tier="gpu"} 4.0
flowrt_kv_pages{process="llm/0",state="free",tier="gpu"} 100.0
# TYPE flowrt_tmp_buffer_bytes gauge
flowrt_tmp_buffer_bytes{process="memory",state="used"} 2097152.0
"""

HEALTH = {"status": "ok", "bundle": "image_chat", "graphs": ["chat"]}


def table_rows(text: str, first: str) -> list[list[str]]:
    """The rows of a rendered table whose first cell is `first`, as cells (split on runs of spaces)."""
    return [line.split() for line in text.splitlines() if line.split()[:1] == [first]]


def test_percentiles_are_estimated_from_buckets_as_prometheus_does():
    cumulative = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (math.inf, 40.0)]
    assert quantile(0.5, cumulative) == pytest.approx(0.3)  # rank 20: halfway through (0.1, 0.5]
    assert quantile(0.99, cumulative) == pytest.approx(0.98)  # rank 39.6: 96% through (0.5, 1]
    assert quantile(0.05, cumulative) == pytest.approx(0.02)  # rank 2 of the first bucket's 10, from 0
    assert quantile(0.99, [(0.1, 1.0), (math.inf, 10.0)]) == 0.1  # in +Inf's: the highest finite bound
    assert quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None and quantile(0.5, []) is None
    samples = parse_exposition(EXPOSITION)  # two interfaces' buckets add up for their role
    assert buckets(samples, "flowrt_activation_duration_seconds", role="vit") == [(0.01, 20.0), (0.1, 42.0), (math.inf, 50.0)]


def test_rates_come_from_two_scrapes_and_survive_a_reset():
    assert rate(30.0, 10.0, 2.0) == 10.0
    assert rate(4.0, 10.0, 2.0) == 2.0  # the counter restarted from 0 (a restarted server)
    assert rate(30.0, None, 2.0) is None and rate(30.0, 10.0, 0.0) is None


def test_a_frame_of_hand_made_metrics_shows_each_figure_and_dashes_what_is_not_exported():
    before = parse_exposition(EXPOSITION.replace('status="ok"} 30.0', 'status="ok"} 10.0'))
    now = Scrape(parse_exposition(EXPOSITION), {"calls": 3, "queued_calls": 0, "in_flight": []}, at=12.0)
    frame = build_frame(HEALTH, now, Scrape(before, {}, at=10.0), "http://h:1")
    (vit,) = frame.roles
    # role, up, queue, in flight, done, act/s, p50, p99, errors, restarts, lapses
    assert vit == ("vit", DASH, DASH, "2", "50", "0.0/s", "30.5ms", "100.0ms", "2", DASH, DASH)
    (chat,) = frame.graphs
    # graph, calls, ok, error, cancelled, calls/s, in flight, p50, p99, first frame p50, TTFA p50
    assert chat == ("chat", "32", "30", "2", "0", "10.0/s", "3", "220.0ms", "920.0ms", DASH, DASH)
    assert dict(frame.pools) == {"KV pages": DASH, "Tmp Buffer": DASH, "prefix tokens": DASH}
    once = build_frame(HEALTH, now, None, "http://h:1")  # one scrape: no rate yet
    assert once.roles[0][5] == DASH and once.graphs[0][5] == DASH
    with_replicas = build_frame(HEALTH, Scrape(parse_exposition(EXPOSITION + REPLICA_FAMILIES), {}, 1.0), None, "u")
    assert with_replicas.roles[0][1:4] == ("1", "4", "2") and with_replicas.roles[0][9] == "2"
    assert dict(with_replicas.pools)["KV pages (gpu)"] == "free 100 · used 16"
    assert dict(with_replicas.pools)["Tmp Buffer"] == "used 2.0 MiB"
    assert "does not list its calls in flight" in with_replicas.note  # a /stats without `in_flight`


AUDIO_FAMILY = """# HELP flowrt_time_to_first_audio_seconds From a call's input being complete to its first audio frame sent.
# TYPE flowrt_time_to_first_audio_seconds histogram
flowrt_time_to_first_audio_seconds_bucket{graph="chat",le="0.1"} 2.0
flowrt_time_to_first_audio_seconds_bucket{graph="chat",le="0.2"} 4.0
flowrt_time_to_first_audio_seconds_bucket{graph="chat",le="+Inf"} 4.0
flowrt_time_to_first_audio_seconds_count{graph="chat"} 4.0
flowrt_time_to_first_audio_seconds_sum{graph="chat"} 0.5
"""


def test_a_graph_whose_calls_stream_audio_shows_its_time_to_first_audio():
    frame = build_frame(HEALTH, Scrape(parse_exposition(EXPOSITION + AUDIO_FAMILY), {}, 1.0), None, "u")
    (chat,) = frame.graphs
    assert chat[-1] == "100.0ms"  # the median of 4 calls: 2 within 100 ms, 2 within 200 ms


def test_a_frame_renders_as_plain_tables():
    from rich.console import Console

    stats = {"calls": 1, "queued_calls": 0, "in_flight": [{"graph": "chat", "call_id": 7, "session": "s1", "age_s": 2.5}]}
    with open(os.devnull, "w") as nowhere:
        console = Console(width=160, force_terminal=False, color_system=None, record=True, file=nowhere)
        console.print(render(build_frame(HEALTH, Scrape(parse_exposition(EXPOSITION), stats, 0.0), None, "http://h:1")))
    text = console.export_text()
    assert "image_chat at http://h:1" in text and "1 call running" in text
    assert table_rows(text, "vit")[0][:5] == ["vit", DASH, DASH, "2", "50"]
    assert table_rows(text, "chat") == [
        ["chat", "32", "30", "2", "0", DASH, "3", "220.0ms", "920.0ms", DASH, DASH],
        ["chat", "7", "s1", "2.50s"],
    ]


def test_a_narrow_terminal_folds_names_and_keeps_every_figure_whole():
    from rich.console import Console

    stats = {"calls": 1, "queued_calls": 0, "in_flight": []}
    with open(os.devnull, "w") as nowhere:
        console = Console(width=80, force_terminal=False, color_system=None, record=True, file=nowhere)
        console.print(render(build_frame(HEALTH, Scrape(parse_exposition(EXPOSITION), stats, 0.0), None, "http://h:1")))
    text = console.export_text()
    assert "…" not in text  # rich's mark of a cut cell
    assert "220.0ms" in text and "920.0ms" in text


def test_live_top_into_a_pipe_writes_plain_frames_as_it_goes(tmp_path: Path):
    bundle = served.bundle(tmp_path / "src")
    with served.serving(bundle, tmp=tmp_path) as server:
        assert server.call("g", {"n": 1})[-1]["status"] == "ok"
        watcher = subprocess.Popen(
            [sys.executable, "-m", "flowc", "top", server.url, "--interval", "0.2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            frames = 0
            for line in watcher.stdout:  # each frame arrives as it is printed, not at exit
                frames += line.startswith("flowc top")
                if frames == 2:
                    break
        finally:
            watcher.terminate()
            watcher.wait(30)
            watcher.stdout.close()
            watcher.stderr.close()
    assert frames == 2


def flowc_top(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowc", "top", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_one_frame_of_a_real_server_shows_its_roles_counts_and_the_call_in_flight(tmp_path: Path, deploy: str):
    bundle = served.bundle(tmp_path / "src")
    release = tmp_path / "release"
    with served.serving(bundle, "--deploy", deploy, tmp=tmp_path) as server:
        for n in range(3):
            assert server.call("g", {"n": n})[-1]["status"] == "ok"
        assert server.call("g", {"fail": True})[-1]["status"] == "error"
        for _ in range(2):
            assert server.call("echo", {"n": 0})[-1]["status"] == "ok"
        held: list = []
        caller = threading.Thread(target=lambda: held.append(server.call("g", {"wait_for": str(release)}, session="held")))
        caller.start()
        try:
            served.wait_until(Path(f"{release}.started").exists, 60, "the held call reaching the worker")
            (listed,) = server.stats()["in_flight"]
            top = flowc_top(server.url, "--once")
        finally:
            release.touch()
            caller.join(60)
        metrics = server.request("GET", "/metrics")[1].decode()
    assert held and held[0][-1]["status"] == "ok"
    assert top.returncode == 0, top.stderr
    text = top.stdout
    assert "\x1b[" not in text and f"at {server.url}" in text and "1 call running" in text
    # graph, calls, ok, error, cancelled, calls/s, in flight, ...
    assert table_rows(text, "g")[0][:7] == ["g", "4", "3", "1", "0", DASH, "1"]
    assert table_rows(text, "echo")[0][:7] == ["echo", "2", "2", "0", "0", DASH, "0"]
    # role, up, queue, in flight, done, act/s, p50, p99, errors
    exported = "flowrt_replica_up{" in metrics  # (the replica families, where the server has them)
    front, worker = table_rows(text, "front")[0], table_rows(text, "worker")[0]
    assert front[3:5] == ["0", "7"] and front[8] == "0"
    assert worker[3:5] == ["1", "4"] and worker[8] == "1"
    assert worker[1] == ("2" if exported else DASH) and front[1] == ("1" if exported else DASH)
    assert listed["graph"] == "g" and "session" not in listed  # sessions only to an admin key (docs/security.md)
    assert ["g", str(listed["call_id"]), "?"] == table_rows(text, "g")[1][:3]  # the calls in flight


def test_addresses_that_are_not_a_flowrt_server_are_one_line_naming_the_fix(tmp_path: Path):
    class NotFlowrt(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json.dumps({"hello": "world"}).encode() if self.path == "/health" else b"nope"
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFlowrt)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    garbage = socket.create_server(("127.0.0.1", 0))  # answers every connection with an SSH banner

    def banner() -> None:
        while True:
            try:
                connection, _ = garbage.accept()
            except OSError:
                return
            with connection:
                connection.sendall(b"SSH-2.0-OpenSSH_8.9\r\n")

    threading.Thread(target=banner, daemon=True).start()
    try:
        cases = [
            ((f"127.0.0.1:{free_port()}", "--once"), "cannot reach", "flowc run DIR --http HOST:PORT"),
            ((f"http://127.0.0.1:{other.server_port}", "--once"), "is not a flowrt server", "give the URL `flowc run"),
            ((f"http://127.0.0.1:{other.server_port}/x", "--once"), "has a path", "give the server's root URL"),
            ((f"127.0.0.1:{garbage.getsockname()[1]}", "--once"), "did not answer GET /health in HTTP", "give the URL"),
            (("ftp://example", "--once"), "is not a server's address", "http://127.0.0.1:8000"),
            (("127.0.0.1:8000", "--interval", "0"), "--interval", "from 0.05 to 3600"),
        ]
        for args, words, fix in cases:
            result = flowc_top(*args)
            assert result.returncode == 2, (args, result.stdout, result.stderr)
            assert words in result.stderr and fix in result.stderr, result.stderr
            assert "Traceback" not in result.stderr and result.stdout == ""
    finally:
        other.shutdown()
        garbage.close()


def test_addresses_are_read_as_the_server_prints_them():
    assert base_url("127.0.0.1:8000") == base_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert base_url("https://flow.example:443") == "https://flow.example:443"
    # a page of the server's own is read as its root; any other path, or credentials, is refused
    assert base_url("http://127.0.0.1:8000/health") == base_url("127.0.0.1:8000/metrics/") == "http://127.0.0.1:8000"
    for text, words in (("http://h:1/api/v2", "has a path"), ("http://user:pw@h:1", "without a user")):
        with pytest.raises(TopError, match=words) as raised:
            base_url(text)
        assert "pw" not in raised.value.message


def test_a_keyed_server_is_read_with_the_key_from_the_option_or_the_environment(tmp_path: Path):
    key, admin = "top-key-0123456789abcdef", "top-admin-0123456789abcd"
    bundle = served.bundle(tmp_path / "src")
    with served.serving(bundle, "--api-key", key, "--admin-key", admin, "--grace", "0", tmp=tmp_path) as server:
        assert server.call_keyed("g", {"n": 1}, key)[-1]["status"] == "ok"
        keyless = subprocess.run(
            [sys.executable, "-m", "flowc", "top", server.url, "--once"],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if k not in ("FLOWC_API_KEYS", "FLOWC_ADMIN_KEYS")},
        )
        assert keyless.returncode == 2 and "asks for an API key" in keyless.stderr and "--api-key KEY" in keyless.stderr
        wrong = flowc_top(server.url, "--once", "--api-key", "not-the-key-0123456789")
        assert wrong.returncode == 2 and "refused the API key top sent" in wrong.stderr, wrong.stderr
        assert "not-the-key" not in wrong.stderr + wrong.stdout  # never printed
        given = flowc_top(server.url, "--once", "--api-key", key)
        assert given.returncode == 0, given.stderr
        assert table_rows(given.stdout, "g")[0][:3] == ["g", "1", "1"]
        for variable, value in (("FLOWC_API_KEYS", f" {key} ,other-key-0123456789"), ("FLOWC_ADMIN_KEYS", admin)):
            environ = {**os.environ, variable: value}
            read = subprocess.run(
                [sys.executable, "-m", "flowc", "top", server.url, "--once"],
                capture_output=True,
                text=True,
                timeout=60,
                env=environ,
            )
            assert read.returncode == 0 and f"at {server.url}" in read.stdout, (variable, read.stderr)
