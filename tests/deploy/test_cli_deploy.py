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
                state = (entry / "stat").read_text().split()[2]
            except OSError:
                continue
            if "flowrt.deploy.worker" in cmdline and str(bundle.resolve()) in cmdline and state != "Z":
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
