"""Every error line of the command line starts `flowc: ` (issue 33): the compiler's own, click's
usage errors (once `Error: ...`), `flowc run`'s and `flowc top`'s refusals (once `Error: ...`)
and a bundle's `python -m BUNDLE` (once `flowrt: ...` and argparse's `PROG: error: ...`). Each
runs as a real process; the error is its last line of stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

FLOW = """
flow prefixed

placeholder request: Json

role echo {
    impl "prefix_roles:Echo"
    interface run { in request  out reply: Json }
}

graph g {
    entry  request
    return reply
}
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("prefix")
    (root / "pipeline.flow").write_text(FLOW)
    (root / "prefix_roles.py").write_text(
        "class Echo:\n    async def run(self, ctx, request):\n        return {'reply': request}\n"
    )
    built = run(sys.executable, "-m", "flowc", "build", str(root / "pipeline.flow"), "-o", str(root / "out" / "prefixed_app"))
    assert built.returncode == 0, built.stderr
    return root / "out" / "prefixed_app"


def run(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=60)


def flowc(*args: str) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "flowc", *args)


def assert_one_prefix(result: subprocess.CompletedProcess, words: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("flowc: ") and words in lines[-1], result.stderr
    assert not [line for line in lines if line.startswith(("Error:", "flowrt: ")) or ": error: " in line], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "status", "words"),
    [
        (("check", "no/such/file.flow"), 2, "no such file: no/such/file.flow"),
        (("check", "--bogus", "x.flow"), 2, "No such option '--bogus'"),
        (("frobnicate",), 2, "No such command 'frobnicate'"),
        (("build", "examples/diamond/pipeline.flow", "-o", ""), 2, "-o needs a directory name"),
        (("top", "http://127.0.0.1:1", "--once"), 2, "cannot reach http://127.0.0.1:1"),
    ],
    ids=["io", "click-option", "click-command", "usage", "top"],
)
def test_the_compilers_errors(args, status, words):
    result = flowc(*args)
    assert result.returncode == status
    assert_one_prefix(result, words)


def test_run_time_errors(bundle):
    not_json = flowc("run", str(bundle), "--once", "g", "--input", "{bad")
    assert not_json.returncode == 2
    assert_one_prefix(not_json, "--input is not valid JSON")
    no_graph = flowc("run", str(bundle), "--once", "nosuch", "--input", "{}")
    assert no_graph.returncode == 2
    assert_one_prefix(no_graph, "no graph `nosuch` in bundle `prefixed`")


def test_the_bundles_own_command_line(bundle):
    python_m = (sys.executable, "-m", bundle.name)
    option = run(*python_m, "--bogus", cwd=bundle.parent)
    assert option.returncode == 2
    assert_one_prefix(option, "unrecognized arguments: --bogus")
    address = run(*python_m, "serve", "--http", "nowhere", cwd=bundle.parent)
    assert address.returncode == 2
    assert_one_prefix(address, "--http: ")
    (bundle / "graphs.py").rename(bundle / "graphs.py.moved")
    try:
        broken = run(*python_m, "check", cwd=bundle.parent)
    finally:
        (bundle / "graphs.py.moved").rename(bundle / "graphs.py")
    assert broken.returncode == 1
    assert_one_prefix(broken, "graphs.py is missing")
