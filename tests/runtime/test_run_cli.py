"""`flowc run --once`: events as JSON lines, exit status by outcome, user errors without tracebacks."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO

FLOW = """
placeholder request: Json

role worker {
    impl "workers:Worker"
    interface run { in request  out result: Json }
}

graph g {
    entry  request
    return result
}
"""

WORKERS = """
import asyncio


class Worker:
    async def run(self, ctx, request):
        if request == "fail":
            raise ValueError("cannot do that")
        if request == "hang":
            await asyncio.Event().wait()
        return {"result": {"echo": request, "session": ctx.session}}
"""


def flowc(*args, cwd):
    return subprocess.run([sys.executable, "-m", "flowc", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def project(tmp_path):
    (tmp_path / "pipeline.flow").write_text(FLOW)
    (tmp_path / "workers.py").write_text(WORKERS)
    return tmp_path


def events(result):
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_ok_call_prints_events_and_exits_zero(tmp_path):
    result = flowc(
        "run", "pipeline.flow", "--once", "g", "--input", '{"request": "hi"}', "--session", "s9", cwd=project(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    assert events(result) == [
        {"event": "return", "field": "result", "value": {"echo": "hi", "session": "s9"}},
        {"event": "done", "status": "ok", "errors": [], "missing": []},
    ]


def test_a_role_error_exits_one_with_the_error_named(tmp_path):
    result = flowc("run", "pipeline.flow", "--once", "g", "--input", '{"request": "fail"}', cwd=project(tmp_path))
    assert result.returncode == 1
    assert events(result) == [
        {
            "event": "done",
            "status": "error",
            "errors": [{"role": "worker", "interface": "run", "message": "ValueError: cannot do that", "where": "workers.py:8"}],
            "missing": ["result"],
        }
    ]


def test_a_timeout_is_cancelled(tmp_path):
    result = flowc(
        "run", "pipeline.flow", "--once", "g", "--input", '{"request": "hang"}', "--timeout", "0.2", cwd=project(tmp_path)
    )
    assert result.returncode == 1
    assert events(result)[-1]["status"] == "cancelled"


def test_a_built_bundle_runs_too(tmp_path):
    root = project(tmp_path)
    assert flowc("build", "pipeline.flow", "-o", "out", cwd=root).returncode == 0
    result = flowc("run", "out", "--once", "g", "--input", '{"request": 1}', cwd=root)
    assert result.returncode == 0 and events(result)[0]["value"]["echo"] == 1


def test_user_errors_are_clear_and_exit_two(tmp_path):
    root = project(tmp_path)
    cases = {
        ("--once", "g", "--input", "{not json"): "--input is not valid JSON",
        ("--once", "g", "--input", "[1]"): "--input must be a JSON object",
        ("--once", "g", "--input", '{"wrong": 1}'): "graph `g` takes request; missing request; unexpected wrong",
        ("--once", "nope", "--input", '{"request": 1}'): "no graph `nope`",
        ("--input", '{"request": 1}'): "--input, --session and --timeout belong to one call: add --once GRAPH",
    }
    for args, message in cases.items():
        result = flowc("run", "pipeline.flow", *args, cwd=root)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr
    (root / "workers.py").unlink()
    missing = flowc("run", "pipeline.flow", "--once", "g", "--input", '{"request": 1}', cwd=root)
    assert missing.returncode == 2
    assert "cannot import `workers`" in missing.stderr and "Traceback" not in missing.stderr


def test_examples_run_from_the_repository():
    result = flowc("run", "examples/agent_loop/pipeline.flow", "--once", "ask", "--input", '{"question": "5+5"}', cwd=REPO)
    assert result.returncode == 0
    assert {"event": "return", "field": "answer", "value": "the sum is 10"} in events(result)


STREAMING = """
placeholder start: Json
placeholder text: Text
placeholder blob: Bytes

role waiter {
    impl "waiting:Waiter"
    interface wait { in start  out stream tick: Json }
}

role typed {
    impl "waiting:Typed"
    interface run { in text & blob  out size: Json }
}

graph g {
    entry  start
    stream tick
}

graph typed {
    entry  text, blob
    return size
}
"""

WAITING = """
import asyncio


class Waiter:
    async def wait(self, ctx, start):
        yield {"tick": 0}  # the test sends its signal once it has read this line
        await asyncio.Event().wait()


class Typed:
    async def run(self, ctx, text, blob):
        return {"size": [len(text), len(blob), type(blob).__name__]}
"""


def streaming_project(tmp_path):
    (tmp_path / "pipeline.flow").write_text(STREAMING)
    (tmp_path / "waiting.py").write_text(WAITING)
    return tmp_path


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_cancels_the_once_call_prints_done_and_exits_128_plus_its_number(tmp_path, signum, code):
    process = subprocess.Popen(
        [sys.executable, "-m", "flowc", "run", "pipeline.flow", "--once", "g", "--input", '{"start": 1}'],
        cwd=streaming_project(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert json.loads(process.stdout.readline()) == {"event": "stream", "field": "tick", "value": 0}
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert process.returncode == code, err
    assert [json.loads(line) for line in out.splitlines()] == [
        {"event": "done", "status": "cancelled", "errors": [], "missing": [], "reason": "shutdown"}
    ]
    assert "Traceback" not in err


@pytest.mark.parametrize("value", ["0", "nan", "inf", "-5", "-inf", "soon"])
def test_a_timeout_that_would_hang_or_cancel_at_once_is_refused(tmp_path, value):
    result = flowc(
        "run", "pipeline.flow", "--once", "g", "--input", '{"request": 1}', f"--timeout={value}", cwd=project(tmp_path)
    )
    assert result.returncode == 2 and not result.stdout
    assert "--timeout:" in result.stderr and repr(value) in result.stderr and "Traceback" not in result.stderr


def test_entry_values_are_checked_against_their_declared_types(tmp_path):
    root = streaming_project(tmp_path)
    wrong = flowc("run", "pipeline.flow", "--once", "typed", "--input", '{"text": 42, "blob": "aGk="}', cwd=root)
    assert wrong.returncode == 2 and not wrong.stdout
    assert "entry `text` is declared `Text` and takes a string, not a number (42)" in wrong.stderr
    not_base64 = flowc("run", "pipeline.flow", "--once", "typed", "--input", '{"text": "a", "blob": "%%%"}', cwd=root)
    assert not_base64.returncode == 2 and "entry `blob` is declared `Bytes`" in not_base64.stderr
    right = flowc("run", "pipeline.flow", "--once", "typed", "--input", '{"text": "abc", "blob": "aGk="}', cwd=root)
    assert right.returncode == 0, right.stderr
    assert events(right)[0] == {"event": "return", "field": "size", "value": [3, 2, "bytes"]}  # base64 → bytes


def test_role_errors_are_logged_on_stderr_with_the_traceback_under_debug(tmp_path):
    root = project(tmp_path)
    plain = flowc("run", "pipeline.flow", "--once", "g", "--input", '{"request": "fail"}', cwd=root)
    debug = flowc("--debug", "run", "pipeline.flow", "--once", "g", "--input", '{"request": "fail"}', cwd=root)
    after = flowc("run", "pipeline.flow", "--once", "g", "--input", '{"request": "fail"}', "--debug", cwd=root)
    for result in (plain, debug, after):
        assert result.returncode == 1
        assert [e["event"] for e in events(result)] == ["done"]  # stdout: events only
    assert "Traceback" not in plain.stderr and "(--debug shows the traceback)" in plain.stderr
    for traced in (debug, after):  # `--debug` before or after `run`
        assert "Traceback" in traced.stderr and "workers.py" in traced.stderr and "ValueError: cannot do that" in traced.stderr


MEDIA_WORKERS = """
from flowrt import media


class Worker:
    async def run(self, ctx, request):
        found = {}
        for name, value in request.items():
            data = media.media_bytes(value, part=name, kind="audio" if name == "clip" else "image")
            found[name] = {"bytes": len(data), "format": media.sniff(data)}
        return {"result": found}
"""


def test_a_file_url_in_the_input_is_sent_as_the_file(tmp_path):
    """`--input` strings `file:PATH` become the file as a data URL (relative to the input file's
    directory, or the working directory), so a local image or clip reaches a role's media reading;
    a missing file is one line naming it."""
    (tmp_path / "pipeline.flow").write_text(FLOW)
    (tmp_path / "workers.py").write_text(MEDIA_WORKERS)
    media_dir = tmp_path / "media"
    media_dir.mkdir()
    png = b"\x89PNG\r\n\x1a\n" + bytes(40)
    wav = b"RIFF" + (36).to_bytes(4, "little") + b"WAVEfmt " + bytes(28)
    (media_dir / "cat.png").write_bytes(png)
    (media_dir / "hello.wav").write_bytes(wav)
    (media_dir / "request.json").write_text(json.dumps({"request": {"picture": "file:cat.png", "clip": "file:hello.wav"}}))
    result = flowc("run", "pipeline.flow", "--once", "g", "--input", "@media/request.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[0])["value"]
    assert found == {"picture": {"bytes": len(png), "format": "PNG"}, "clip": {"bytes": len(wav), "format": "WAV"}}
    inline = json.dumps({"request": {"picture": f"file://{media_dir / 'cat.png'}"}})
    assert json.loads(flowc("run", "pipeline.flow", "--once", "g", "--input", inline, cwd=tmp_path).stdout.splitlines()[0])[
        "value"
    ] == {"picture": {"bytes": len(png), "format": "PNG"}}
    missing = flowc("run", "pipeline.flow", "--once", "g", "--input", '{"request": {"x": "file:nope.png"}}', cwd=tmp_path)
    assert missing.returncode == 2 and "--input: cannot read file:" in missing.stderr and "Traceback" not in missing.stderr
