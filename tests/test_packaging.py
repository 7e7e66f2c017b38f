"""Packaging: a built wheel works without the source tree; flowrt stands alone."""

from __future__ import annotations

import importlib.machinery
import json
import subprocess
import sys
import zipfile

from tests.conftest import REPO

PROGRAM = """import text

role upper {
    impl "m:Upper"
    interface run { in prompt_tokens  out shouted: Tokens }
}

graph g {
    entry  prompt
    return shouted
}
"""

DOUBLING = """placeholder x: Json

role twice {
    impl "m:Twice"
    interface run { in x  out y: Json }
}

graph g {
    entry  x
    return y
}
"""

TWICE = """
class Twice:
    async def run(self, ctx, x):
        return {"y": 2 * x}
"""


def test_wheel_ships_grammar_and_stdlib_and_works_without_the_source_tree(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("flowc-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "flowc/grammars/flow.lark" in names
    assert "flowstd/lib/text.flow" in names
    assert "flowstd/lib/tokenizer.flow" in names and "flowstd/tokenizer/tokenizer.json" in names
    assert "flowc/codegen/templates/node.py.j2" in names
    # the compiled control core, its Python sources (the fallback) and what it was built from
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for module in ("program", "bucket", "sequencer", "roles", "call"):
        assert f"flowrt/control/{module}{suffix}" in names and f"flowrt/control/{module}.py" in names
    assert "flowrt/control/_native_build.json" in names
    # a fresh environment with only the wheel and the dependencies it declares: a runtime
    # dependency missing from pyproject.toml fails here (interegular once did)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    (tmp_path / "main.flow").write_text(PROGRAM)
    result = subprocess.run(
        [str(venv / "bin" / "flowc"), "check", "main.flow"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "checked 1 file: no problems"
    build = subprocess.run(
        [str(venv / "bin" / "flowc"), "build", "main.flow", "-o", "out"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert build.returncode == 0, build.stderr
    # a call on the installed runtime, which runs its compiled core (a stale or missing one warns: an error here)
    (tmp_path / "doubling.flow").write_text(DOUBLING)
    (tmp_path / "m.py").write_text(TWICE)
    core = subprocess.run(
        [str(venv / "bin" / "python"), "-W", "error", "-c", "import flowrt.control as c; print(c.COMPILED, c.CORE)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert core.stdout.strip() == "True compiled (Cython)", core.stdout + core.stderr
    run = subprocess.run(
        [str(venv / "bin" / "flowc"), "run", "doubling.flow", "--once", "g", "--input", '{"x": 21}'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert [json.loads(line) for line in run.stdout.splitlines()] == [
        {"event": "return", "field": "y", "value": 42},
        {"event": "done", "status": "ok", "errors": [], "missing": []},
    ]
    # the language server's dependencies come with the wheel too: it answers initialize and shutdown
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}},
        {"jsonrpc": "2.0", "id": 2, "method": "shutdown", "params": None},
        {"jsonrpc": "2.0", "method": "exit", "params": None},
    ]
    frames = b"".join(b"Content-Length: %d\r\n\r\n%s" % (len(body), body) for body in (json.dumps(m).encode() for m in messages))
    lsp = subprocess.run([str(venv / "bin" / "flowc"), "lsp"], input=frames, capture_output=True, timeout=60)
    assert b'"name": "flowc"' in lsp.stdout and b'"hoverProvider": true' in lsp.stdout, lsp.stdout + lsp.stderr


def test_runtime_imports_no_compiler_machinery():
    probe = "import sys, flowrt; bad = {'flowc', 'lark', 'jinja2', 'click'} & set(sys.modules); assert not bad, bad"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
