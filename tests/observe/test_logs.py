"""`--log-format json`: every line on a real server's stderr is a JSON object with `ts`, `level`,
`event`, `msg`, `call_id`, `session`, `role` and `replica`; a failing role's line carries the
call id of the trace the HTTP client got (`?trace=1`), inproc and under local; replica
processes that die or stop answering are logged as events; the text log stays as it was."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.observe import serving as served

KEYS = {"ts", "level", "event", "msg", "call_id", "session", "role", "replica"}


def json_lines(text: str) -> list[dict]:
    """Every whole line of `text` as a JSON object (failing on the first that is not one; a
    last line still being written is left out)."""
    events = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        value = json.loads(line)  # (a line that is not JSON fails the test here)
        assert isinstance(value, dict) and value.keys() >= KEYS, line
        events.append(value)
    return events


def named(events: list[dict], name: str, **fields) -> list[dict]:
    return [e for e in events if e["event"] == name and all(e.get(k) == v for k, v in fields.items())]


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_a_failing_role_is_logged_with_the_call_id_the_client_got(tmp_path: Path, deploy: str):
    bundle = served.bundle(tmp_path / "src")
    with served.serving(bundle, "--deploy", deploy, "--log-format", "json", tmp=tmp_path) as server:
        failed = server.call("g", {"fail": True}, query="?trace=1")
        ok = server.call("g", {"n": 5}, query="?trace=1", session="s-ok")
    events = json_lines(server.stderr())
    done = failed[-1]
    assert done["status"] == "error" and done["errors"][0]["message"] == "ValueError: asked to fail"
    call_id, session = done["trace"]["otherData"]["call_id"], done["trace"]["otherData"]["session"]
    (error,) = named(events, "role_error")
    assert error["call_id"] == call_id and error["session"] == session and error["level"] == "warning"
    assert error["role"] == "worker" and error["replica"] in (0, 1) and done["errors"][0]["message"] in error["msg"]
    assert [e["status"] for e in named(events, "call_ended", call_id=call_id)] == ["error"]
    assert len(named(events, "call_started", call_id=call_id, session=session, graph="g")) == 1
    ok_id = ok[-1]["trace"]["otherData"]["call_id"]
    assert [e["status"] for e in named(events, "call_ended", call_id=ok_id, session="s-ok")] == ["ok"]
    (ran,) = [e for e in events if e["msg"] == "worker ran job 5"]  # the role's own ctx.logger line, in its process
    assert ran["event"] == "log" and ran["call_id"] == ok_id and ran["session"] == "s-ok" and ran["role"] == "worker"
    (started,) = named(events, "server_started")
    assert started["url"] == server.url and started["call_id"] is None and started["role"] is None
    if deploy == "local":
        for role, replica in served.REPLICAS:
            assert len(named(events, "replica_started", role=role, replica=replica)) == 1
            assert len(named(events, "replica_ready", role=role, replica=replica)) == 1


def test_replicas_that_die_or_stop_answering_are_logged_as_events(tmp_path: Path):
    bundle = served.bundle(tmp_path / "src")
    options = ("--deploy", "local", "--log-format", "json", "--heartbeat-ttl", "1")
    with served.serving(bundle, *options, tmp=tmp_path) as server:
        pids = {(e["role"], e["replica"]): e["pid"] for e in named(json_lines(server.stderr()), "replica_ready")}
        os.kill(pids[("worker", 0)], signal.SIGKILL)
        os.kill(pids[("worker", 1)], signal.SIGSTOP)  # alive, silent: its heartbeat lapses
        try:

            def back_up() -> bool:
                events = json_lines(server.stderr())
                return all(len(named(events, "replica_ready", role="worker", replica=r)) == 2 for r in (0, 1))

            served.wait_until(back_up, 90, "both worker replicas restarted and ready again")
        finally:
            with contextlib.suppress(ProcessLookupError):  # (killed by now; in case it was not)
                os.kill(pids[("worker", 1)], signal.SIGCONT)
        assert server.call("g", {"n": 1})[-1]["status"] == "ok"
    events = json_lines(server.stderr())
    (down,) = named(events, "replica_down", role="worker", replica=0)
    assert "SIGKILL" in down["reason"] and down["level"] == "warning"
    (lapse,) = named(events, "heartbeat_lapse", role="worker", replica=1)
    assert "lapsed" in lapse["reason"]
    for replica in (0, 1):
        (restarting,) = named(events, "replica_restarting", role="worker", replica=replica)
        assert restarting["backoff_s"] > 0
        assert len(named(events, "replica_started", role="worker", replica=replica)) == 2


def test_the_text_log_says_what_went_wrong_as_before(tmp_path: Path):
    bundle = served.bundle(tmp_path / "src")
    with served.serving(bundle, tmp=tmp_path) as server:
        assert server.call("g", {"fail": True})[-1]["status"] == "error"
    text = server.stderr()
    assert re.search(r"flowrt: WARNING flowrt: call 1 \(session ~[\w-]{22}\): worker.run on replica", text), text  # (its own)
    assert "ValueError: asked to fail" in text
    assert "call_started" not in text and "started (session" not in text and not text.lstrip().startswith("{")
    assert " INFO " not in text  # (the events that are not warnings, a server started say, are JSON's alone)


def test_one_call_logs_json_with_the_call_id_of_its_trace(tmp_path: Path):
    bundle = served.bundle(tmp_path / "src")
    trace = tmp_path / "call.json"
    once = ["--once", "g", "--input", json.dumps({"request": {"fail": True}}), "--trace", str(trace)]
    result = subprocess.run(
        [sys.executable, "-m", "flowc", "run", str(bundle), *once, "--log-format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    call_id = json.loads(trace.read_text())["otherData"]["call_id"]
    events = json_lines(result.stderr)
    assert named(events, "role_error", call_id=call_id, role="worker")
    assert [e["status"] for e in named(events, "call_ended", call_id=call_id)] == ["error"]


def test_a_bundle_serving_itself_logs_json_too(tmp_path: Path):
    bundle = served.bundle(tmp_path / "src")
    # (-W: a stale compiled core's warning is said as flowrt is imported, before there is a log to say it in)
    quiet_core = ["-W", "ignore::RuntimeWarning:flowrt.control"]
    command = [sys.executable, *quiet_core, "-m", bundle.name, "serve", "--http", "127.0.0.1:0", "--log-format", "json"]
    stderr = tmp_path / "stderr.txt"
    with open(stderr, "w") as sink:
        process = subprocess.Popen(command, cwd=bundle.parent, stdout=subprocess.PIPE, stderr=sink, text=True)
    try:
        banner = process.stdout.readline()
        assert banner.startswith("serving "), banner + stderr.read_text()
        server = served.Server(process, stderr, banner)
        assert server.call("g", {"fail": True})[-1]["status"] == "error"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        process.stdout.close()
    events = json_lines(stderr.read_text())
    assert named(events, "server_started") and named(events, "role_error", role="worker")
    (ended,) = named(events, "call_ended")
    assert ended["status"] == "error" and named(events, "role_error", call_id=ended["call_id"])


def test_requests_aiohttp_cannot_parse_are_logged_once_in_a_thousand_without_debug():
    """A security trial filled the log with one ERROR per malformed request (each already
    answered 400); now the first is logged, then one in a thousand, counting them."""
    import logging as logging_

    from aiohttp.http_exceptions import LineTooLong

    from flowrt.logs import show_log

    server_log = logging_.getLogger("aiohttp.server")

    def record(error: Exception) -> logging_.LogRecord:
        return server_log.makeRecord(
            "aiohttp.server", logging_.ERROR, "x", 1, "Error handling request", (), (type(error), error, None)
        )

    names = ("flowrt", "py.warnings", "aiohttp", "aiohttp.server", "opentelemetry", "urllib3")
    saved = {n: (list(logging_.getLogger(n).handlers), list(logging_.getLogger(n).filters), logging_.getLogger(n).level,
                 logging_.getLogger(n).propagate) for n in names}  # fmt: skip
    show_log(debug=False)
    try:
        (guard,) = [f for f in server_log.filters if type(f).__name__ == "_MalformedRequests"]
        kept = [guard.filter(record(LineTooLong("header", "8190"))) for _ in range(2500)]
        assert [i for i, k in enumerate(kept) if k] == [0, 999, 1999]  # the 1st, 1000th and 2000th
        assert guard.filter(record(RuntimeError("a bug in a handler")))  # anything else is logged every time
        show_log(debug=True)
        assert not [f for f in server_log.filters if type(f).__name__ == "_MalformedRequests"]  # --debug: every one
    finally:  # (this process's loggers as they were: other tests read them)
        logging_.captureWarnings(False)
        for name, (handlers, filters, level, propagate) in saved.items():
            logger = logging_.getLogger(name)
            logger.handlers[:], logger.filters[:], logger.propagate = handlers, filters, propagate
            logger.setLevel(level)
