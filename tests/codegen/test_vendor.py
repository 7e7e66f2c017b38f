"""`flowc build --vendor`: the impl modules and the local modules they import are copied into
the bundle, which then runs (embedded and `--deploy local`) after the source tree is gone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO

FLOW = """
flow vend
placeholder request: Json
role shout {
    impl "app.roles:Shout"
    interface run { in request  out loud: Json }
}
graph g {
    entry request
    return loud
}
"""

SOURCES = {
    "app/__init__.py": "",
    "app/roles.py": """
        from .words import upper
        import app.util.suffix as suffix

        class Shout:
            async def run(self, ctx, request):
                return {"loud": suffix.add(upper(request))}
    """,
    "app/words.py": "def upper(text):\n    return text.upper()\n",
    "app/util/__init__.py": "",
    "app/util/suffix.py": "import json\n\ndef add(text):\n    return text + '!'\n",
    "app/unused.py": "raise RuntimeError('never imported, never vendored')\n",
}


def flowc(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowc", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def source_tree(root: Path) -> Path:
    for name, text in SOURCES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (root / "app" / "pipeline.flow").write_text(FLOW)
    return root / "app" / "pipeline.flow"


def test_a_vendored_bundle_runs_without_its_source_tree(tmp_path):
    source = source_tree(tmp_path / "src")
    bundle = tmp_path / "out" / "vend"
    result = flowc("build", str(source), "-o", str(bundle), "--vendor")
    assert result.returncode == 0, result.stderr
    vendored = sorted(p.relative_to(bundle / "vendor").as_posix() for p in (bundle / "vendor").rglob("*.py"))
    assert vendored == ["app/__init__.py", "app/roles.py", "app/util/__init__.py", "app/util/suffix.py", "app/words.py"]
    assert json.loads((bundle / "bundle.json").read_text())["python_path"] == ["vendor"]
    shutil.rmtree(tmp_path / "src")
    check = subprocess.run([sys.executable, "-m", "vend", "check"], capture_output=True, text=True, cwd=bundle.parent, timeout=60)
    assert check.returncode == 0, check.stderr
    for deploy in ("inproc", "local"):
        run = flowc("run", str(bundle), "--deploy", deploy, "--once", "g", "--input", '{"request": "hi"}')
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout.splitlines()[0]) == {"event": "return", "field": "loud", "value": "HI!"}


def test_vendoring_is_deterministic(tmp_path):
    source = source_tree(tmp_path / "src")
    first, second = tmp_path / "a", tmp_path / "b"
    assert flowc("build", str(source), "-o", str(first), "--vendor").returncode == 0
    assert flowc("build", str(source), "-o", str(second), "--vendor").returncode == 0
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    for path in files:
        assert (first / path).read_bytes() == (second / path).read_bytes(), path


def test_an_impl_that_cannot_be_found_is_named_with_the_fix(tmp_path):
    source = source_tree(tmp_path / "src")
    source.write_text(FLOW.replace("app.roles:Shout", "app.missing:Shout"))
    result = flowc("build", str(source), "-o", str(tmp_path / "out"), "--vendor")
    assert result.returncode == 2
    assert "cannot vendor `app.missing`" in result.stderr and "build without --vendor" in result.stderr
