"""Broken bundles, role implementations that cannot run, and bad `flowc run` inputs.

Each row builds a good bundle (in-process, like the harness), breaks one thing, and runs
`flowc run BUNDLE --once g` (a real subprocess). It asserts the exit status, that stderr names
what is wrong (the file, the role, the line) and the fix, that nothing but events reaches
stdout, and that no traceback or "internal error" is printed. A few rows serve instead, with
`flowc run` and with the bundle's own `python -m BUNDLE serve`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.runtime.harness import bundle_of

FLOW = """
placeholder request: Json
placeholder text: Text

role worker {
    impl "workers:Worker"
    interface run { in request  out result: Json }
}

role shout {
    impl "workers:Shout"
    interface run { in text  out loud: Text }
}

graph g {
    entry  request
    return result
}

graph loud {
    entry  text
    return loud
}
"""

WORKERS = """
class Worker:
    async def run(self, ctx, request):
        return {"result": request}


class Shout:
    async def run(self, ctx, text):
        return {"loud": text.upper()}
"""


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


def workers(source: str) -> Callable[[Path], None]:
    def write(bundle: Path) -> None:
        (bundle.parent / "workers.py").write_text(source)

    return write


def tamper(relative: str, old: str, new: str) -> Callable[[Path], None]:
    return lambda bundle: edit(bundle / relative, old, new)


def delete(relative: str) -> Callable[[Path], None]:
    return lambda bundle: (bundle / relative).unlink()


def nothing(bundle: Path) -> None:
    pass


INIT_ARGS = WORKERS.replace(
    "class Worker:\n", "class Worker:\n    def __init__(self, model_path):\n        self.model = model_path\n\n"
)
INIT_RAISES = WORKERS.replace("class Worker:\n", "class Worker:\n    def __init__(self):\n        raise OSError('no GPU')\n\n")
SETUP_RAISES = WORKERS.replace(
    "class Worker:\n", "class Worker:\n    async def setup(self, ctx):\n        raise FileNotFoundError('weights.bin')\n\n"
)
NOT_A_METHOD = WORKERS.replace("class Worker:\n    async def run", "class Worker:\n    run = 42\n\n    async def other")

# (id, what to break, --input, exit status, words in stderr)
ROWS = [
    (
        "bundle-json-missing",
        delete("bundle.json"),
        '{"request": 1}',
        2,
        r"bundle\.json is missing; is .* a bundle written by `flowc build`",
    ),
    (
        "bundle-json-not-json",
        tamper("bundle.json", '"name"', "name"),
        '{"request": 1}',
        2,
        r"bundle\.json cannot be read .*rebuild the bundle",
    ),
    (
        "bundle-json-roles-malformed",
        tamper("bundle.json", '"module": "nodes/worker.py"', '"modul": 1'),
        '{"request": 1}',
        2,
        r"bundle\.json is malformed .*rebuild the bundle",
    ),
    ("graphs-py-missing", delete("graphs.py"), '{"request": 1}', 2, r"graphs\.py is missing"),
    (
        "graphs-py-malformed",
        tamper("graphs.py", '"nodes": {', '"nodes": [], "x": {'),
        '{"request": 1}',
        2,
        r"graphs\.py, nodes/\) are malformed .*rebuild the bundle",
    ),
    ("node-module-missing", delete("nodes/worker.py"), '{"request": 1}', 2, r"nodes/worker\.py is missing; rebuild the bundle"),
    (
        "node-module-broken",
        tamper("nodes/worker.py", "SPEC = ", "SPEC = ("),
        '{"request": 1}',
        2,
        r"nodes/worker\.py failed to load \(SyntaxError",
    ),
    (
        "impl-module-missing",
        lambda b: (b.parent / "workers.py").unlink(),
        '{"request": 1}',
        2,
        r"role `shout`: cannot import `workers`.*Put `workers\.py` beside the \.flow file",
    ),
    (
        "impl-syntax-error",
        workers(WORKERS + "\ndef broken(:\n"),
        '{"request": 1}',
        2,
        r"importing `workers` failed at .*workers\.py:11: SyntaxError",
    ),
    (
        "impl-raises-on-import",
        workers("raise RuntimeError('no licence')\n" + WORKERS),
        '{"request": 1}',
        2,
        r"importing `workers` failed at .*workers\.py:1: RuntimeError: no licence",
    ),
    (
        "impl-imports-missing-package",
        workers("import nosuchpackage_xyz\n" + WORKERS),
        '{"request": 1}',
        2,
        r"importing `workers` failed at .*workers\.py:1: .*install `nosuchpackage_xyz`",
    ),
    (
        "impl-class-missing",
        workers(WORKERS.replace("class Worker:", "class Other:")),
        '{"request": 1}',
        2,
        r"module `workers` has no `Worker`; check `impl`",
    ),
    ("impl-not-a-class", workers(WORKERS + "\nWorker = 5\n"), '{"request": 1}', 2, r"`workers:Worker` is a int, not a class"),
    (
        "init-needs-arguments",
        workers(INIT_ARGS),
        '{"request": 1}',
        2,
        r"role `worker`: `workers:Worker\(\)` raised TypeError.*without arguments.*async def setup",
    ),
    ("init-raises", workers(INIT_RAISES), '{"request": 1}', 2, r"raised OSError: no GPU at .*workers\.py:4"),
    (
        "setup-raises",
        workers(SETUP_RAISES),
        '{"request": 1}',
        2,
        r"role `worker`: setup\(\) of replica 0 raised FileNotFoundError: weights\.bin at .*workers\.py:4",
    ),
    (
        "method-not-callable",
        workers(NOT_A_METHOD),
        '{"request": 1}',
        2,
        r"`Worker\.run` is not a method but a value of type `int`",
    ),
    (
        "input-deeply-nested",
        lambda b: (b.parent / "deep.json").write_text('{"request": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        "@deep.json",
        2,
        r"deep\.json is nested too deeply",
    ),
    ("input-file-missing", nothing, "@no/such/file.json", 2, r"--input: cannot read no/such/file\.json"),
    (
        "input-file-not-utf8",
        lambda b: (b.parent / "latin1.json").write_bytes(b'{"request": "\xe9"}'),
        "@latin1.json",
        2,
        r"--input: latin1\.json is not UTF-8",
    ),
    (
        "input-misspelled-entry",
        nothing,
        '{"reqest": 1}',
        2,
        r"^flowc: graph `g` takes request; missing request; unexpected reqest \(did you write `reqest` for `request`\?\)$",
    ),
    ("input-not-json", nothing, "{request: 1}", 2, r"^flowc: --input is not valid JSON"),
    ("input-wrong-type", nothing, '{"text": ["a"]}', 2, r"entry `text` is declared `Text` and takes a string, not a list of 1"),
]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowc", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def good_bundle(tmp_path: Path) -> Path:
    (tmp_path / "workers.py").write_text(WORKERS)
    return bundle_of(FLOW, tmp_path)


def assert_clean_failure(result: subprocess.CompletedProcess, status: int, words: str) -> None:
    assert result.returncode == status, (result.stdout, result.stderr)
    assert re.search(words, result.stderr, re.DOTALL), result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    assert "Usage:" not in result.stderr, result.stderr  # one line: the options were fine, what they named was not
    assert all(json.loads(line)["event"] for line in result.stdout.splitlines())  # stdout: events only


@pytest.mark.parametrize(("breakage", "given", "status", "words"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_a_broken_bundle_or_input_fails_with_the_place_and_the_fix(tmp_path, breakage, given, status, words):
    bundle = good_bundle(tmp_path)
    breakage(bundle)
    graph = "loud" if '"text"' in given else "g"
    result = run(["run", "bundle", "--once", graph, "--input", given], cwd=tmp_path)
    assert_clean_failure(result, status, words)


def test_the_good_bundle_runs(tmp_path):
    good_bundle(tmp_path)
    result = run(["run", "bundle", "--once", "loud", "--input", '{"text": "hi"}'], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[0]) == {"event": "return", "field": "loud", "value": "HI"}


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--session-ttl", "0"], r"--session-ttl: a session TTL must be a finite number of seconds greater than 0"),
        (["--session-ttl", "nan"], r"--session-ttl: .*not 'nan'"),
        (["--max-sessions", "0"], r"--max-sessions: expected a whole number of sessions, 1 or more"),
        (["--max-sessions", "many"], r"--max-sessions: expected a whole number"),
        (["--max-body-mb", "-1"], r"--max-body-mb: expected a finite number of MiB greater than 0"),
        (["--http", "localhost"], r"--http takes HOST:PORT"),
    ],
    ids=["ttl-zero", "ttl-nan", "sessions-zero", "sessions-word", "body-negative", "address"],
)
def test_serving_options_that_cannot_work_are_refused(tmp_path, options, words):
    good_bundle(tmp_path)
    assert_clean_failure(run(["run", "bundle", *options], cwd=tmp_path), 2, words)


def test_serving_a_role_whose_setup_raises_fails_at_start_with_the_place(tmp_path):
    bundle = good_bundle(tmp_path)
    workers(SETUP_RAISES)(bundle)
    served = run(["run", "bundle", "--http", "127.0.0.1:0"], cwd=tmp_path)
    assert_clean_failure(
        served, 2, r"role `worker`: setup\(\) of replica 0 raised FileNotFoundError: weights\.bin at .*workers\.py:4"
    )
    assert "serving" not in served.stdout
    itself = subprocess.run(
        [sys.executable, "-m", "bundle", "serve", "--http", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert itself.returncode == 1 and "setup() of replica 0 raised FileNotFoundError" in itself.stderr
    assert "Traceback" not in itself.stderr
    bad_option = subprocess.run(
        [sys.executable, "-m", "bundle", "serve", "--session-ttl", "-1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert bad_option.returncode == 2 and "a session TTL must be a finite number" in bad_option.stderr
