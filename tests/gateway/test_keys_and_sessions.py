"""API keys, session ownership, anonymous sessions and what callers may see (docs/security.md),
against a real `flowc run --http` server on loopback, with the official openai client where a
chat client is the caller. Requests the server saw are counted by the server (/stats `access`,
/metrics); waits are bounded polls (tests.gateway.guarded)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.gateway import guarded
from tests.gateway.guarded import Held, events, request
from tests.runtime.test_serve import Server, serving

KEY_A = "key-a-0123456789abcdef"
KEY_B = "key-b-0123456789abcdef"
ADMIN = "admin-0123456789abcdef"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return guarded.bundle(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def server(bundle: Path) -> Iterator[Server]:
    options = ["--api-key", KEY_A, "--api-key", KEY_B, "--admin-key", ADMIN, "--grace", "0"]
    with serving(bundle, guarded.command(bundle, *options)) as running:
        yield running


def client(server: Server, key: str, retries: int = 2) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.host}:{server.port}/v1", api_key=key, max_retries=retries, timeout=30)


def admin_stats(server: Server) -> dict:
    status, _, body = request(server, "GET", "/stats", key=ADMIN)
    assert status == 200, body
    return json.loads(body)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_the_openai_client_with_a_right_key_is_answered(server: Server):
    for key in (KEY_A, KEY_B, ADMIN):
        answer = client(server, key).chat.completions.create(model="talk", messages=user("hello there"))
        assert answer.choices[0].message.content == "hello there "


@pytest.mark.parametrize("key", ["wrong-key-0123456789", None])
def test_a_wrong_or_missing_key_is_401_and_the_client_does_not_retry(server: Server, key: str | None):
    before = admin_stats(server)["unauthorized_requests"]
    sent = {} if key is not None else {"Authorization": openai.omit}  # None: no Authorization header at all
    with pytest.raises(openai.AuthenticationError) as raised:  # (the client would retry a 5xx or a 429 twice)
        client(server, key or "unsent").chat.completions.create(model="talk", messages=user("hello"), extra_headers=sent)
    assert raised.value.status_code == 401 and raised.value.code == "invalid_api_key"
    assert raised.value.body["type"] == "invalid_request_error"
    assert admin_stats(server)["unauthorized_requests"] == before + 1  # one request reached the server


def test_graphs_and_stats_ask_for_a_key_and_the_probes_do_not(server: Server):
    for method, path, body in (("GET", "/graphs", None), ("POST", "/graphs/g", {"request": {}}), ("GET", "/stats", None)):
        status, headers, answer = request(server, method, path, body)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), (path, answer)
        assert json.loads(answer)["code"] == "invalid_api_key"
        assert request(server, method, path, body, key="not-a-key-at-all")[0] == 401
        assert request(server, method, path, body, key=KEY_A)[0] == 200
    for path in ("/health", "/metrics", "/ready"):
        assert request(server, "GET", path)[0] == 200, path


def test_metrics_and_health_can_be_protected(bundle: Path):
    with serving(bundle, guarded.command(bundle, "--api-key", KEY_A, "--protect-metrics")) as server:
        for path in ("/health", "/metrics"):
            assert request(server, "GET", path)[0] == 401 and request(server, "GET", path, key=KEY_A)[0] == 200
        assert request(server, "GET", "/ready")[0] == 200  # a probe has no key, and /ready tells nothing


def test_a_session_belongs_to_the_key_that_named_it(server: Server, tmp_path: Path):
    held = Held(server, tmp_path / "gate", 1, key=KEY_A, session="owned-by-a")
    try:
        held.started()
        status, _, body = request(server, "POST", "/graphs/g", {"request": {"n": 1}}, KEY_B, {"X-Flow-Session": "owned-by-a"})
        assert status == 403 and json.loads(body)["code"] == "session_not_yours", body
        with pytest.raises(openai.PermissionDeniedError) as raised:
            client(server, KEY_B).chat.completions.create(
                model="talk", messages=user("hi"), extra_headers={"X-Flow-Session": "owned-by-a"}
            )
        assert raised.value.code == "session_not_yours"
        assert admin_stats(server)["forbidden_sessions"] >= 2
    finally:
        (answer,) = held.release()
    assert answer[0] == 200 and events(answer[2])[-1]["status"] == "ok"
    # once the runtime holds nothing of it (no call, no state), the session is anyone's again
    status, _, body = request(server, "POST", "/graphs/g", {"request": {"n": 2}}, KEY_B, {"X-Flow-Session": "owned-by-a"})
    assert status == 200 and events(body)[-1]["status"] == "ok"


def test_an_anonymous_call_cannot_be_joined_by_naming_its_session(server: Server, tmp_path: Path):
    held = Held(server, tmp_path / "gate", 1, key=KEY_A)  # no session: one of its own
    try:
        held.started()
        (listed,) = [c for c in admin_stats(server)["in_flight"] if c["graph"] == "g"]
        anonymous = listed["session"]
        assert anonymous.startswith("~") and len(anonymous) >= 20  # 128 random bits, in the runtime's namespace
        # the old form (`call-N`, sequential): every one is a session of its own, none waits behind the held call
        for n in range(12):
            status, _, body = request(server, "POST", "/graphs/g", {"request": {"n": n}}, KEY_A, {"X-Flow-Session": f"call-{n}"})
            assert status == 200 and events(body)[-1]["status"] == "ok"
            assert events(body)[0]["value"]["session"] == f"call-{n}"
        # and its own id cannot be named at all
        for sent in ({"X-Flow-Session": anonymous}, {"X-Flow-Session": "~guess"}):
            status, _, body = request(server, "POST", "/graphs/g", {"request": {}}, KEY_A, sent)
            assert status == 400 and "runtime's own" in json.loads(body)["error"]
        with pytest.raises(openai.BadRequestError):
            client(server, KEY_A).chat.completions.create(model="talk", messages=user("hi"), user=anonymous)
    finally:
        (answer,) = held.release()
    assert answer[0] == 200 and events(answer[2])[0]["value"]["session"] == anonymous
    # every anonymous call gets another id
    ids = {events(request(server, "POST", "/graphs/g", {"request": {}}, KEY_A)[2])[0]["value"]["session"] for _ in range(5)}
    assert len(ids) == 5 and all(s.startswith("~") for s in ids)


def test_stats_shows_sessions_only_to_an_admin_key(server: Server, tmp_path: Path):
    held = Held(server, tmp_path / "gate", 1, key=KEY_A, session="a-private-session")
    try:
        held.started()
        status, _, body = request(server, "GET", "/stats", key=KEY_A)
        public = json.loads(body)
        assert status == 200 and "a-private-session" not in body.decode()
        assert [set(call) for call in public["in_flight"]] == [{"graph", "call_id", "age_s"}]
        assert "a-private-session" in json.dumps(admin_stats(server)["in_flight"])
    finally:
        held.release()


def test_a_role_error_reaches_the_caller_without_paths(server: Server):
    status, _, body = request(server, "POST", "/graphs/g", {"request": {"leak": True}}, KEY_A)
    (error,) = events(body)[-1]["errors"]
    assert status == 200 and "ipc://" not in body.decode() and "/dev/shm" not in body.decode() and "/tmp" not in body.decode()
    assert error["message"] == "ValueError: cannot reach <hidden> nor <hidden>"
    assert error["where"] == f"roles.py:{guarded.LEAK_LINE}"  # within the impl's directory, nothing above it


def test_under_local_stats_shows_no_paths_or_pids_and_errors_no_socket_paths(bundle: Path, tmp_path: Path):
    options = ["--deploy", "local", "--api-key", KEY_A, "--admin-key", ADMIN, "--grace", "0"]
    with serving(bundle, guarded.command(bundle, *options)) as server:
        held = Held(server, tmp_path / "gate", 1, key=KEY_A, session="a-local-session")
        try:
            held.started()
            full = json.dumps(admin_stats(server))
            public = request(server, "GET", "/stats", key=KEY_A)[2].decode()
        finally:
            held.release()
        status, _, body = request(server, "POST", "/graphs/g", {"request": {"leak": True}}, KEY_A)
    slab = json.loads(full)["memory"]["slab"]
    assert "a-local-session" in full and slab in full  # what an admin sees (so the checks below mean something)
    for secret in ("a-local-session", slab, "/dev/shm", "ipc://", '"session"'):
        assert secret not in public, secret
    pids = json.loads(full)["memory"]["clients"]  # the memory manager's clients, by PID
    assert pids and all(pid.isdigit() for pid in pids) and json.loads(public)["memory"]["clients"] == {}
    assert json.loads(public)["processes"] and json.loads(public)["replicas_up"] == 2  # the counters stay
    (error,) = events(body)[-1]["errors"]
    assert status == 200 and "ipc://" not in body.decode() and "/dev/shm" not in body.decode()
    assert error["where"] == f"roles.py:{guarded.LEAK_LINE}"


def test_a_session_id_that_is_not_utf8_or_too_long_is_refused_at_the_door(server: Server):
    """A lone surrogate in `user`, or a header byte that is not UTF-8, could be told to no replica
    process (found by a fault trial: a 500 under `local`): 400 on both endpoints, before any call."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        connection.putrequest("POST", "/graphs/g")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Authorization", f"Bearer {KEY_A}")
        connection.putheader("X-Flow-Session", b"s\xe9")  # latin-1, not UTF-8
        body = json.dumps({"request": {}}).encode()
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        answer = connection.getresponse()
        assert answer.status == 400 and "not UTF-8" in json.loads(answer.read())["error"]
    finally:
        connection.close()
    sent = {"model": "talk", "messages": user("hi"), "user": "\ud800"}  # (JSON escapes it; openai's client cannot send it)
    status, _, body = request(server, "POST", "/v1/chat/completions", sent, KEY_A)
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "invalid_session" and "lone surrogate" in error["message"]
    # nor a session id of megabytes (it would name Redis keys and every process's tables)
    with pytest.raises(openai.BadRequestError) as raised:
        client(server, KEY_A).chat.completions.create(model="talk", messages=user("hi"), user="u" * 4096)
    assert raised.value.code == "invalid_session" and "at most 256 characters, not 4,096" in raised.value.message
