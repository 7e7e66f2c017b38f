"""Start-up progress of `flowc run` (serving), from the deployment's own events: one plain line
per replica ready where stderr is not a terminal (inproc and local), none with --quiet, a replica
whose setup() has not returned is not ready (nor is the server), and rich's bars on a terminal
(a pty)."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.observe import serving as served

READY = re.compile(r"^replica (\w+)#(\d+) ready(?: after (\d+\.\d\d)s)?$", re.MULTILINE)


def ready(text: str) -> dict[tuple[str, int], str | None]:
    """Each replica a `ready` line names, and how long it took where the line says; a replica
    named twice fails."""
    found: dict[tuple[str, int], str | None] = {}
    for role, replica, took in READY.findall(text):
        key = (role, int(replica))
        assert key not in found, f"{key} ready twice:\n{text}"
        found[key] = took or None
    return found


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_one_plain_line_per_replica_ready_then_the_url(tmp_path: Path, deploy: str):
    bundle = served.bundle(tmp_path / "src")
    with served.serving(bundle, "--deploy", deploy, tmp=tmp_path) as server:
        lines = ready(server.stderr())  # (written before the banner, which is out)
        assert server.url.startswith("http://127.0.0.1:")
    assert lines.keys() == served.REPLICAS
    assert "\x1b[" not in server.stderr()
    # local: each replica's time from its process's start; inproc: the role with a setup(), from its start
    timed = {key for key, took in lines.items() if took is not None}
    assert timed == (served.REPLICAS if deploy == "local" else {("front", 0)})
    with served.serving(bundle, "--deploy", deploy, "--quiet", tmp=tmp_path) as quiet:
        assert quiet.banner.startswith("serving ")
    assert ready(quiet.stderr()) == {}


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_a_replica_is_ready_only_once_its_setup_returns(tmp_path: Path, deploy: str):
    bundle = served.bundle(tmp_path / "src")
    gate = tmp_path / "gate"
    env = {"FLOW_TEST_SETUP_GATE": str(gate)}
    with served.serving(bundle, "--deploy", deploy, tmp=tmp_path, env=env, banner=False) as server:
        served.wait_until(Path(f"{gate}.started").exists, 90, "front's setup() to start")
        if deploy == "local":  # the workers' processes do not wait for front's
            served.wait_until(lambda: {("worker", 0), ("worker", 1)} <= ready(server.stderr()).keys(), 90, "the workers ready")
        assert ("front", 0) not in ready(server.stderr())
        assert select.select([server.process.stdout], [], [], 0)[0] == []  # no banner: it is not serving yet
        gate.touch()
        banner = server.process.stdout.readline()
        assert banner.startswith("serving "), banner + server.stderr()
        assert ready(server.stderr()).keys() == served.REPLICAS


def test_a_terminal_gets_progress_bars(tmp_path: Path):
    bundle = served.bundle(tmp_path / "src")
    gate = tmp_path / "gate"  # front's setup() waits for it: the test sees it setting up, then lets it go
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "flowc", "run", str(bundle), "--deploy", "local", "--http", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=terminal,
        text=True,
        env={**os.environ, "COLUMNS": "120", "TERM": "xterm-256color", "FLOW_TEST_SETUP_GATE": str(gate)},
    )
    os.close(terminal)
    drawn: list[bytes] = []

    def read() -> None:  # (a terminal's reader: the bars block if nobody reads them)
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:
                return
            if not chunk:
                return
            drawn.append(chunk)

    def screen() -> str:
        return b"".join(drawn).decode(errors="replace")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        served.wait_until(lambda: "1 setting up" in screen(), 90, "front drawn setting up")
        assert select.select([process.stdout], [], [], 0)[0] == []  # not serving yet
        gate.touch()
        served.wait_until(lambda: select.select([process.stdout], [], [], 0)[0], 90, "the URL")
        banner = process.stdout.readline()
    finally:
        gate.touch()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        process.stdout.close()
        reader.join(30)
        os.close(controller)
    assert banner.startswith("serving "), screen()
    drawn_text = screen()
    assert "\x1b[" in drawn_text  # drawn, not written line by line
    assert "front" in drawn_text and "worker" in drawn_text and "replicas ready" in drawn_text
    assert "2/2" in drawn_text and "1/1" in drawn_text and "serving " not in drawn_text
    assert ready(drawn_text.replace("\r", "")) == {}
