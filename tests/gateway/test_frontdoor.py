"""The front door's options (flowrt.frontdoor): parsed and refused the same way wherever they
come from, and declared by both command lines from their one definition; the pieces that need
no server (redaction of /stats and of error events, key comparison, session owners)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from flowrt.frontdoor import API_KEYS_ENV, OPTIONS, FrontDoor, add_to_argparse, front_door
from flowrt.gateway.access import Keys, SessionOwners
from flowrt.gateway.exposure import client_events, public_stats


def test_keys_add_up_from_the_options_the_file_and_the_environment(tmp_path: Path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# ours\nfile-key-123456789\n\n  other-file-key-1234  \n")
    door = front_door(
        {"api_key": ["flag-key-123456789"], "api_key_file": str(keys), "admin_key": ["admin-key-12345678"]},
        {API_KEYS_ENV: "env-key-123456789, env-key-223456789"},
    )
    assert set(door.api_keys) == {
        "flag-key-123456789", "file-key-123456789", "other-file-key-1234", "env-key-123456789", "env-key-223456789",
        "admin-key-12345678",
    }  # fmt: skip
    assert door.admin_keys == ("admin-key-12345678",) and door.keyed
    assert front_door({}, {}) == FrontDoor() and not FrontDoor().keyed


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({"api_key": ["short"]}, "--api-key: an API key must be at least 8"),
        ({"api_key": ["has a space in it"]}, "without spaces"),
        ({"api_key_file": "/no/such/file"}, "--api-key-file: cannot read /no/such/file"),
        ({"protect_metrics": True}, "--protect-metrics asks for a key"),
        ({"max_in_flight": "0"}, "--max-in-flight: expected a whole number, 1 or more"),
        ({"max_queue": "4"}, "give --max-in-flight N too"),
        ({"max_in_flight": "2", "max_queue": "-1"}, "--max-queue: expected a whole number, 0 or more"),
        ({"header_timeout": "nan"}, "--header-timeout: expected a finite number of seconds"),
        ({"grace": "-1"}, "--grace: expected a finite number of seconds, 0 or more"),
    ],
)
def test_what_cannot_work_is_refused_naming_the_option(given: dict, words: str):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        front_door(given, {})


def test_a_queue_needs_no_flag_and_zero_grace_is_allowed():
    door = front_door({"max_in_flight": "8", "grace": "0"}, {})
    assert (door.max_in_flight, door.max_queue, door.grace) == (8, 0, 0.0)


def test_argparse_reads_the_options_as_click_does():
    parser = argparse.ArgumentParser()
    add_to_argparse(parser)
    args = parser.parse_args(["--api-key", "one-key-123456789", "--api-key", "two-key-123456789", "--max-in-flight", "3", "--protect-metrics"])  # fmt: skip
    door = front_door(vars(args), {})
    assert door.api_keys == ("one-key-123456789", "two-key-123456789") and door.max_in_flight == 3 and door.protect_metrics


def test_both_command_lines_declare_every_option(tmp_path: Path):
    from tests.gateway import guarded

    bundle = guarded.bundle(tmp_path)
    flowc = subprocess.run([sys.executable, "-m", "flowc", "run", "--help"], capture_output=True, text=True, timeout=60)
    bundled = subprocess.run(
        [sys.executable, "-m", bundle.name, "--help"], capture_output=True, text=True, timeout=60, cwd=bundle.parent
    )
    for option in OPTIONS:
        assert option.flag in flowc.stdout and option.flag in bundled.stdout, option.flag
    once = subprocess.run(
        [sys.executable, "-m", "flowc", "run", str(bundle), "--once", "g", "--api-key", "a-key-123456789"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert once.returncode == 2 and "--api-key: for serving" in once.stderr


def test_keys_name_their_caller_and_nothing_else_passes():
    keys = Keys(FrontDoor(api_keys=("user-key-123456789", "admin-key-12345678"), admin_keys=("admin-key-12345678",)))
    user, admin = keys.principal("Bearer user-key-123456789"), keys.principal("bearer admin-key-12345678")
    assert user is not None and admin is not None and user[0] != admin[0] and (user[1], admin[1]) == (False, True)
    assert "user-key" not in user[0]
    for header in (None, "", "Bearer", "Bearer ", "Basic user-key-123456789", "Bearer user-key-12345678", "user-key-123456789"):
        assert keys.principal(header) is None, header


def test_a_session_is_refused_to_another_principal_only_while_it_is_held():
    held: set[str] = set()
    owners = SessionOwners(lambda session: session in held)
    assert owners.claim("s", "alice") and not owners.claim("s", "bob")  # alice's call is in flight
    owners.release("s")
    held.add("s")  # ... and the runtime keeps the session's state
    assert not owners.claim("s", "bob") and owners.refused == 2
    held.clear()
    assert owners.claim("s", "bob")  # nothing of it is left: anyone's again


def test_public_stats_keep_counters_and_drop_sessions_paths_and_pids():
    stats = {
        "calls": 1,
        "memory": {"slab": "/dev/shm/flowrt-1", "clients": {"4242": {"blocks": 1}}, "blocks": 3},
        "processes": {"worker/0": {"running": 1}},
        "in_flight": [{"graph": "g", "call_id": 3, "session": "secret", "age_s": 0.5}],
        "unanswered": "ipc:///tmp/x",
    }
    assert public_stats(stats) == {
        "calls": 1,
        "memory": {"clients": {}, "blocks": 3},
        "processes": {"worker/0": {"running": 1}},
        "in_flight": [{"graph": "g", "call_id": 3, "age_s": 0.5}],
    }


def test_error_events_lose_their_paths(tmp_path: Path):
    root = tmp_path / "impl"
    done = {
        "event": "done",
        "status": "error",
        "missing": [],
        "errors": [
            {"role": "r", "interface": "i", "message": "no ipc:///tmp/d/s.sock or /dev/shm/slab here", "where": f"{root}/pkg/roles.py:7"},
            {"role": "r", "interface": "i", "message": "fine", "where": "/usr/lib/python3/site-packages/lib/x.py:9"},
        ],
    }  # fmt: skip
    (told,) = client_events([done], [root])
    assert [e["message"] for e in told["errors"]] == ["no <hidden> or <hidden> here", "fine"]
    assert [e["where"] for e in told["errors"]] == ["pkg/roles.py:7", "x.py:9"]


@pytest.mark.parametrize("value", ["", ",", " , "])
@pytest.mark.parametrize("name", ["FLOWC_API_KEYS", "FLOWC_ADMIN_KEYS"])
def test_a_key_variable_that_is_set_but_empty_is_refused_not_an_open_server(name: str, value: str):
    """A secret that failed to arrive (found by a security trial: the server came up without keys)."""
    with pytest.raises(ValueError, match=rf"\${name} is set but holds no key"):
        front_door({}, {name: value})
    assert not front_door({}, {}).keyed  # unset: a server without keys, as documented
