"""`flowc run --deploy local` and `python -m BUNDLE launch` from the command line: a call, a
server, and bad configuration (one line naming the cause and the fix, exit 2, no orphans)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.deploy.helpers import bundle_with_roles, free_port
from tests.deploy.test_faults import FLOW, ROLES
from tests.runtime.test_serve import lines, serving


def flowc(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowc", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def workers_of(bundle: Path) -> list[int]:
    """Replica processes of `bundle` still running anywhere on the machine."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                environ = (entry / "environ").read_bytes().decode(errors="replace") if "flowrt.deploy.worker" in cmdline else ""
            except OSError:
                continue
            # (a replica's configuration, the bundle's path in it, is in its environment, not on its command line)
            if "flowrt.deploy.worker" in cmdline and str(bundle.resolve()) in environ and state != "Z":
                found.append(int(entry.name))
    return found


def test_a_call_with_deploy_local_from_the_command_line(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    result = flowc("run", str(bundle), "--deploy", "local", "--once", "g", "--input", json.dumps({"request": {"n": 3}}))
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events[0]["value"]["n"] == 3 and events[-1]["status"] == "ok"
    assert workers_of(bundle) == []


def test_a_role_that_cannot_be_imported_in_its_process(tmp_path):
    bundle = bundle_with_roles(FLOW.replace("roles:Worker", "roles:Missing"), ROLES, tmp_path)
    result = flowc("run", str(bundle), "--deploy", "local", "--once", "g", "--input", json.dumps({"request": {}}))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "role `worker`" in line and "Missing" in line
    assert workers_of(bundle) == []


def test_a_taken_port_is_one_line_and_leaves_no_processes(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = flowc("run", str(bundle), "--deploy", "local", "--http", f"127.0.0.1:{port}")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert f"cannot listen on 127.0.0.1:{port}" in line and "choose another --http" in line
    assert workers_of(bundle) == []


def test_an_unreachable_registry_from_the_command_line(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    port = free_port()
    result = flowc("run", str(bundle), "--deploy", "local", "--registry", f"redis://127.0.0.1:{port}/0", "--once", "g")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert f"cannot reach the registry at redis://127.0.0.1:{port}/0" in line
    bad = flowc("run", str(bundle), "--deploy", "local", "--registry", "http://x", "--once", "g")
    assert bad.returncode == 2 and "--registry takes redis://" in bad.stderr


def test_launch_serves_the_bundle_with_one_process_per_replica(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    command = [sys.executable, "-m", bundle.name, "launch", "--http", "127.0.0.1:0"]
    with serving(bundle, command, cwd=bundle.parent) as server:
        events = lines(server.post("/graphs/g", json.dumps({"request": {"n": 5}}).encode()))
        assert events[-1]["status"] == "ok" and events[0]["value"]["n"] == 5
        stats = server.get("/stats")[1]
        assert stats["replicas_up"] == 3 and set(stats["processes"]) == {"front/0", "worker/0", "worker/1"}
        assert len(workers_of(bundle)) == 3
    assert workers_of(bundle) == []


def test_a_signal_while_the_deployment_starts_stops_it_cleanly(tmp_path):
    import os
    import signal
    import time

    slow_setup = ROLES.replace(
        "class Worker:", "class Worker:\n    async def setup(self, ctx):\n        await asyncio.sleep(30)\n"
    )
    bundle = bundle_with_roles(FLOW, slow_setup, tmp_path)
    import shutil
    import tempfile

    sockets = Path(tempfile.mkdtemp(prefix="fs", dir="/tmp"))  # short: socket paths have a length limit
    server = subprocess.Popen(
        [sys.executable, "-m", "flowc", "run", str(bundle), "--deploy", "local", "--http", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "FLOWRT_SOCKET_DIR": str(sockets)},
    )
    try:
        deadline = time.monotonic() + 30
        while len(workers_of(bundle)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(workers_of(bundle)) == 3
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
        assert server.returncode == 143
        assert err.strip().splitlines()[-1] == "flowc: SIGTERM: stopped while starting"
        assert workers_of(bundle) == []
        assert list(sockets.iterdir()) == []
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
        shutil.rmtree(sockets, ignore_errors=True)


def test_deploy_options_that_cannot_work_are_refused_in_one_line(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    port = free_port()
    ray = flowc("run", str(bundle), "--deploy", f"ray=127.0.0.1:{port}", "--once", "g", "--input", '{"request": 1}')
    assert ray.returncode == 2
    assert ray.stderr.strip().splitlines()[-1].startswith(f"flowc: cannot reach the Ray cluster at 127.0.0.1:{port}")
    ttl = flowc("run", str(bundle), "--heartbeat-ttl", "5", "--once", "g", "--input", '{"request": 1}')
    assert ttl.returncode == 2 and "--heartbeat-ttl is for --deploy local or ray" in ttl.stderr
    for bad in ("0", "-1", "nan", "abc"):
        result = flowc("run", str(bundle), "--deploy", "local", "--heartbeat-ttl", bad, "--once", "g")
        assert result.returncode == 2 and "--heartbeat-ttl:" in result.stderr, (bad, result.stderr)
