"""GET /metrics of a whole deployment, on real servers (`flowc run DIR --http`) under `inproc`
and `local`: prometheus_client's parser reads it, and it reports the calls made (by graph,
status and role), every replica the bundle declares (up, in flight, queued, restarts, heartbeat
lapses), the frames and bytes of every edge as the graph produced them, the Tmp Buffer Pool,
and the time to the first streamed frame. A replica killed with SIGKILL counts a restart; one
stopped with SIGSTOP counts a heartbeat lapse (waits are on /metrics' answers, with deadlines).
Servers are stopped by PID (tests.runtime.test_serve.serving)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.observe.helpers import by, family
from tests.observe.test_metrics import scrape
from tests.runtime.test_serve import Server, flowc, lines, serving

FLOW = """\
flow edges

placeholder request: Json

role source {
    impl "edges_roles:Source"
    replicas 2
    interface emit {
        in  request
        out stream chunk: Tensor, summary: Json
    }
}

role sink {
    impl "edges_roles:Sink"
    interface take { in chunk  out stream ack: Json }
    interface whoami { in request  out pid: Json }
}

graph edges {
    entry  request
    stream ack
    return summary
}

graph whoami {
    entry  request
    return pid
}
"""

ROLES = """\
import os

import numpy

CHUNK = 32768  # float32s: 128 KiB, over the codec's inline limit, so the data plane carries it


class Source:
    async def emit(self, ctx, request):
        for i in range(request["n"]):
            yield {"chunk": numpy.full(CHUNK, i, dtype=numpy.float32)}
        if request.get("fail"):
            raise ValueError("asked to fail")
        yield {"summary": {"chunks": request["n"]}}


class Sink:
    async def take(self, ctx, chunk):
        yield {"ack": float(chunk[0])}

    async def whoami(self, ctx, request):
        return {"pid": os.getpid()}
"""

CHUNK_BYTES = 32768 * 4
# the calls each test makes: (request, status); n chunks each
CALLS = [({"n": 3}, "ok"), ({"n": 2}, "ok"), ({"n": 4, "fail": True}, "error")]
DECLARED = {("source", "0"), ("source", "1"), ("sink", "0")}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("edges")
    (source / "pipeline.flow").write_text(FLOW)
    (source / "edges_roles.py").write_text(ROLES)
    out = source / "bundle"
    result = flowc("build", str(source / "pipeline.flow"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


def start(bundle: Path, deploy: str, *options: str):
    command = [sys.executable, "-m", "flowc", "run", str(bundle), "--http", "127.0.0.1:0", "--deploy", deploy, *options]
    return serving(bundle, command, cwd=bundle.parent)


def call(server: Server, graph: str, request: dict, session: str = "") -> list[dict]:
    headers = {"X-Flow-Session": session} if session else {}
    return lines(server.post(f"/graphs/{graph}", json.dumps({"request": request}).encode(), headers))


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_metrics_report_the_calls_replicas_and_edges_of_the_deployment(bundle, deploy):
    with start(bundle, deploy) as server:
        _, before = scrape(server)
        statuses = []
        for index, (request, _) in enumerate(CALLS):
            events = call(server, "edges", request, f"s{index}")
            statuses.append(events[-1]["status"])
            assert len([e for e in events if e["event"] == "stream"]) == request["n"]
        _, samples = scrape(server)
    assert statuses == [status for _, status in CALLS]
    # nothing is counted before the first call; every replica the bundle declares is reported from the start
    assert set(family(before, "flowrt_edge_frames_total").values()) == {0}
    assert set(by(before, "flowrt_replica_up", "role", "replica")) == DECLARED

    assert by(samples, "flowrt_calls_total", "graph", "status") == {("edges", "ok"): 2, ("edges", "error"): 1}
    chunks = sum(request["n"] for request, _ in CALLS)
    activations = {k: v for k, v in by(samples, "flowrt_activations_total", "role", "interface", "outcome").items() if v}
    assert activations == {("source", "emit", "ok"): 2, ("source", "emit", "error"): 1, ("sink", "take", "ok"): chunks}
    # every call streamed an ack before its done event
    assert by(samples, "flowrt_first_frame_seconds_count", "graph") == {("edges",): 3}

    up = by(samples, "flowrt_replica_up", "role", "replica")
    assert up == {key: 1 for key in DECLARED}
    for name in ("flowrt_replica_in_flight", "flowrt_replica_queue_depth", "flowrt_replica_restarts_total"):
        assert by(samples, name, "role", "replica") == {key: 0 for key in DECLARED}, name
    assert by(samples, "flowrt_heartbeat_lapses_total", "role", "replica") == {key: 0 for key in DECLARED}

    # the frames of each edge, as the graph produced them: one entry value per call, each chunk to
    # the sink, a summary per call that did not fail, an ack per chunk
    frames = by(samples, "flowrt_edge_frames_total", "graph", "producer", "consumer")
    assert frames == {
        ("edges", "$request", "source.emit"): 3,
        ("edges", "source.emit", "sink.take"): chunks,
        ("edges", "source.emit", "caller"): 2,
        ("edges", "sink.take", "caller"): chunks,
        ("whoami", "$request", "sink.whoami"): 0,
        ("whoami", "sink.whoami", "caller"): 0,
    }
    sizes = by(samples, "flowrt_edge_bytes_total", "graph", "producer", "consumer")
    assert sizes.keys() == frames.keys()
    if deploy == "inproc":  # nothing crosses a process boundary
        assert set(sizes.values()) == {0}
        assert not family(samples, "flowrt_tmp_buffer_bytes")
    else:
        # each chunk crossed as 128 KiB in shared memory and a small handle; entry values start in the server
        assert chunks * CHUNK_BYTES < sizes[("edges", "source.emit", "sink.take")] < chunks * (CHUNK_BYTES + 2048)
        assert 0 < sizes[("edges", "source.emit", "caller")] < 2 * 2048
        assert 0 < sizes[("edges", "sink.take", "caller")] < chunks * 2048
        assert sizes[("edges", "$request", "source.emit")] == 0
        tmp = by(samples, "flowrt_tmp_buffer_bytes", "process", "state")
        capacity = tmp[("memory-manager", "capacity")]
        assert capacity > 0 and tmp[("memory-manager", "used")] + tmp[("memory-manager", "free")] == capacity


def wait_for_metrics(server: Server, condition: Callable[[dict], bool], seconds: float, what: str) -> dict:
    """Scrape until `condition(samples)` holds; fail naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        _, samples = scrape(server)
        if condition(samples):
            return samples
        if time.monotonic() > deadline:
            replicas = {key: value for key, value in samples.items() if key[0].startswith(("flowrt_replica", "flowrt_heart"))}
            raise AssertionError(f"{what}: not within {seconds:g}s; the replicas' last samples: {replicas}")
        time.sleep(0.1)


def sink_pid(server: Server) -> int:
    events = call(server, "whoami", {})
    assert events[-1]["status"] == "ok", events
    return events[0]["value"]


def sink(samples: dict, name: str) -> float:
    return by(samples, name, "role", "replica")[("sink", "0")]


def test_a_killed_replica_counts_a_restart_and_a_stopped_one_a_heartbeat_lapse(bundle):
    with start(bundle, "local", "--heartbeat-ttl", "1.5") as server:
        _, samples = scrape(server)
        assert sink(samples, "flowrt_replica_restarts_total") == 0 and sink(samples, "flowrt_replica_up") == 1
        victim = sink_pid(server)
        os.kill(victim, signal.SIGKILL)
        samples = wait_for_metrics(
            server,
            lambda s: sink(s, "flowrt_replica_restarts_total") >= 1 and sink(s, "flowrt_replica_up") == 1,
            30,
            "the killed sink replica counted as restarted and up again",
        )
        assert sink(samples, "flowrt_replica_restarts_total") == 1
        assert by(samples, "flowrt_replica_restarts_total", "role", "replica")[("source", "0")] == 0
        lapses = sink(samples, "flowrt_heartbeat_lapses_total")
        stopped = sink_pid(server)
        assert stopped != victim
        os.kill(stopped, signal.SIGSTOP)  # alive but silent: its heartbeat lapses, the supervisor kills and restarts it
        try:
            samples = wait_for_metrics(
                server,
                lambda s: sink(s, "flowrt_heartbeat_lapses_total") > lapses and sink(s, "flowrt_replica_up") == 1,
                30,
                "the stopped sink replica's heartbeat lapse counted, and a new one up",
            )
        finally:
            with contextlib.suppress(ProcessLookupError):  # (killed by the supervisor, as it should be)
                os.kill(stopped, signal.SIGCONT)
        assert sink(samples, "flowrt_replica_restarts_total") == 2
        assert call(server, "edges", {"n": 1})[-1]["status"] == "ok"  # the new replica serves
