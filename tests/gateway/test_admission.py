"""Admission limits (429 with Retry-After), read timeouts (slowloris connections closed, slow
bodies 408) and the drain on SIGTERM (`/ready` 503, new calls 503, calls in flight finish within
`--grace`, then `cancelled` with reason `shutdown`), against real `flowc run --http` servers on
loopback. Calls are held in flight by a file the test creates, so nothing depends on timing:
every wait is a bounded poll or a socket read with a deadline (docs/security.md)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import openai
import pytest

from tests.gateway import guarded
from tests.gateway.guarded import Held, events, request
from tests.params.test_meta_helpers import wait_until
from tests.runtime.test_serve import serving


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return guarded.bundle(tmp_path_factory.mktemp("admission"))


def test_with_8_in_flight_and_8_queued_100_calls_get_16_places_and_84_refusals_at_once(bundle: Path, tmp_path: Path):
    with serving(bundle, guarded.command(bundle, "--max-in-flight", "8", "--max-queue", "8", "--grace", "0")) as server:
        held = Held(server, tmp_path / "gate", 100)
        try:
            # the refusals come while every accepted call is still held: nobody waited for a place
            def answered() -> list | None:
                got = [a for a in held.answers if a is not None]
                return got if len(got) >= 84 else None

            refused = wait_until(answered, 60, "84 answers")
            assert len(refused) == 84 and {a[0] for a in refused} == {429}
            for _, headers, body in refused:
                assert int(headers["Retry-After"]) >= 1 and json.loads(body)["code"] == "rate_limit_exceeded"
            held.started(8)  # 8 run; 8 wait for a place
            stats = json.loads(request(server, "GET", "/stats")[2])
            assert (stats["admitted_running"], stats["admission_waiting"], stats["refused_calls"]) == (8, 8, 84)
            chat = openai.OpenAI(base_url=f"http://{server.host}:{server.port}/v1", api_key="none", max_retries=0)
            with pytest.raises(openai.RateLimitError) as raised:  # OpenAI's shape: the client honours Retry-After
                chat.chat.completions.create(model="talk", messages=[{"role": "user", "content": "hi"}])
            assert raised.value.code == "rate_limit_exceeded" and raised.value.response.headers["Retry-After"]
        finally:
            answers = held.release()
        accepted = [a for a in answers if a[0] == 200]
        assert len(accepted) == 16 and all(events(a[2])[-1]["status"] == "ok" for a in accepted)


def test_a_session_may_have_at_most_k_calls_running_or_waiting(bundle: Path, tmp_path: Path):
    with serving(bundle, guarded.command(bundle, "--max-session-queue", "2", "--grace", "0")) as server:
        held = Held(server, tmp_path / "gate", 2, session="busy")
        try:
            held.started(1)  # one runs, the other waits for the session's turn
            wait_until(lambda: json.loads(request(server, "GET", "/stats")[2])["queued_calls"] == 1, 60, "the second call queued")
            status, headers, body = request(server, "POST", "/graphs/g", {"request": {}}, headers={"X-Flow-Session": "busy"})
            assert status == 429 and "Retry-After" in headers and "--max-session-queue" in json.loads(body)["error"]
            assert request(server, "POST", "/graphs/g", {"request": {}}, headers={"X-Flow-Session": "other"})[0] == 200
        finally:
            assert all(a[0] == 200 for a in held.release())


def read_until_closed(connection: socket.socket, seconds: float) -> bytes:
    """What the server sends until it closes the connection; fails if it is open after `seconds`."""
    deadline = time.monotonic() + seconds
    received = b""
    while time.monotonic() < deadline:
        connection.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = connection.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"the server kept the connection open for {seconds:g}s")


def test_slowloris_connections_are_closed_after_the_header_timeout(bundle: Path):
    with serving(bundle, guarded.command(bundle, "--header-timeout", "1", "--body-timeout", "1")) as server:
        slow = []
        for n in range(30):
            connection = socket.create_connection((server.host, server.port), timeout=10)
            connection.sendall(b"POST /graphs/g HTTP/1.1\r\nHost: x\r\nX-Part: " + str(n).encode())  # never finished
            slow.append(connection)
        idle = socket.create_connection((server.host, server.port), timeout=10)  # sends nothing at all
        for connection in [*slow, idle]:
            assert read_until_closed(connection, 30) == b""
            connection.close()
        # a body that never arrives whole: 408, and the connection closes
        with socket.create_connection((server.host, server.port), timeout=10) as connection:
            connection.sendall(
                b"POST /graphs/g HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{}"
            )
            answer = read_until_closed(connection, 30)
        assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout" in answer
        stats = json.loads(request(server, "GET", "/stats")[2])
        assert stats["calls"] == 0 and request(server, "POST", "/graphs/g", {"request": {}})[0] == 200  # still serving


def test_sigterm_drains_and_loses_no_call_that_finishes_within_the_grace(bundle: Path, tmp_path: Path):
    with serving(bundle, guarded.command(bundle, "--grace", "120")) as server:
        assert request(server, "GET", "/ready")[0] == 200
        held = Held(server, tmp_path / "gate", 10)
        try:
            held.started()
            os.kill(server.process.pid, signal.SIGTERM)
            wait_until(lambda: request(server, "GET", "/ready")[0] == 503, 60, "/ready turning 503")
            status, headers, body = request(server, "POST", "/graphs/g", {"request": {}})
            assert status == 503 and json.loads(body)["code"] == "shutdown" and "Retry-After" in headers
            chat = openai.OpenAI(base_url=f"http://{server.host}:{server.port}/v1", api_key="none", max_retries=0)
            with pytest.raises(openai.InternalServerError) as raised:
                chat.chat.completions.create(model="talk", messages=[{"role": "user", "content": "hi"}])
            assert raised.value.status_code == 503
            assert server.process.poll() is None  # still draining: the held calls run on
        finally:
            answers = held.release()
        assert [a[0] for a in answers] == [200] * 10
        assert all(events(a[2])[-1]["status"] == "ok" for a in answers)
        assert server.process.wait(timeout=60) == 0


def test_calls_still_running_when_the_grace_ends_are_cancelled_with_reason_shutdown(bundle: Path, tmp_path: Path):
    with serving(bundle, guarded.command(bundle, "--grace", "1")) as server:
        held = Held(server, tmp_path / "gate", 2)
        try:
            held.started()
            os.kill(server.process.pid, signal.SIGTERM)
            assert server.process.wait(timeout=60) == 0  # (the gate is never opened: the grace ends it)
            for thread in held.threads:
                thread.join(60)
        finally:
            held.gate.touch()
        for status, _, body in held.answers:
            done = events(body)[-1]
            assert status == 200 and done["status"] == "cancelled" and done["reason"] == "shutdown", done


def test_the_ready_probe_answers_while_serving(bundle: Path):
    with serving(bundle, guarded.command(bundle)) as server:
        status, _, body = request(server, "GET", "/ready")
        assert status == 200 and json.loads(body) == {"ready": True}
