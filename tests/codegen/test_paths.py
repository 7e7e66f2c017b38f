"""`flowc build` gives the same bundle whatever way the .flow file and the output are spelled
(issue 12, item 16): relative to any working directory, absolute, `./x`, `../x`, through a
symlinked directory; and the bundle imports its roles wherever it is run from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PIPELINE = """flow demo

placeholder text: Text

role shout {
    impl "demo.roles:Shout"
    interface run { in text  out loud: Text }
}

graph yell {
    entry  text
    return loud
}
"""

ROLES = """
class Shout:
    async def run(self, ctx, text):
        return {"loud": text.upper()}
"""


def flowc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # PWD as a shell would set it, so a symlinked working directory is seen as the user sees it
    env = {**os.environ, "PWD": str(cwd)}
    return subprocess.run([sys.executable, "-m", "flowc", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def files_of(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture
def project(tmp_path):
    """tmp/work/demo/{pipeline.flow, roles.py}, and tmp/link -> tmp/work/demo."""
    demo = tmp_path / "work" / "demo"
    demo.mkdir(parents=True)
    (demo / "pipeline.flow").write_text(PIPELINE)
    (demo / "roles.py").write_text(ROLES)
    (tmp_path / "link").symlink_to(demo, target_is_directory=True)
    return tmp_path


def spellings(tmp: Path) -> list[tuple[str, Path, list[str]]]:
    demo, link = tmp / "work" / "demo", tmp / "link"
    return [
        ("in the file's folder", demo, ["pipeline.flow", "-o", "out"]),
        ("dot-slash", demo, ["./pipeline.flow", "-o", "./out"]),
        ("dot-dot", demo, ["../demo/pipeline.flow", "-o", "../demo/out"]),
        ("from the parent", tmp / "work", ["demo/pipeline.flow", "-o", "demo/out"]),
        ("absolute", tmp, [str(demo / "pipeline.flow"), "-o", str(demo / "out")]),
        ("symlinked working directory", link, ["pipeline.flow", "-o", "out"]),
        ("through the symlink", tmp, [str(link / "pipeline.flow"), "-o", str(link / "out")]),
        ("mixed", link, [str(demo / "pipeline.flow"), "-o", "out"]),
    ]


def test_every_spelling_builds_the_same_bytes(project):
    out = project / "work" / "demo" / "out"
    built = {}
    for name, cwd, args in spellings(project):
        result = flowc("build", *args, cwd=cwd)
        assert result.returncode == 0, (name, result.stderr)
        built[name] = files_of(out)
    first = built["in the file's folder"]
    assert json.loads(first["bundle.json"])["python_path"] == ["..", "../.."]
    for name, files in built.items():
        assert files == first, f"{name} built different bytes"


def test_a_bundle_built_in_the_files_folder_imports_its_roles(project):
    demo = project / "work" / "demo"
    assert flowc("build", "pipeline.flow", "-o", "out", cwd=demo).returncode == 0
    # run it from elsewhere: only bundle.json's python_path can find `demo.roles`
    elsewhere = project / "elsewhere"
    elsewhere.mkdir()
    result = flowc("run", str(demo / "out"), "--once", "yell", "--input", '{"text": "hi"}', cwd=elsewhere)
    assert result.returncode == 0, result.stdout + result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events[0] == {"event": "return", "field": "loud", "value": "HI"}
    assert events[-1]["status"] == "ok"
