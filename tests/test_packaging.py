"""Packaging: a built wheel works without the source tree; flowrt stands alone."""

from __future__ import annotations

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
    assert "flowc/codegen/templates/node.py.j2" in names
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
