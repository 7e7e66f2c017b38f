"""`flowc run --once`: events as JSON lines, exit status by outcome, user errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

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
            "errors": [{"role": "worker", "interface": "run", "message": "ValueError: cannot do that"}],
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
