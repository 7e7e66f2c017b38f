"""Packaging: a built wheel works without the source tree; flowrt stands alone."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
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

PROBE = """
import sys
sys.path[:0] = [{target!r}, {site!r}]
import flowc
from flowc.check import check_source
assert flowc.__file__.startswith({target!r}), flowc.__file__
result = check_source(open('main.flow').read(), 'main.flow', __import__('pathlib').Path('main.flow'))
assert result.ok, [d.message for d in result.diagnostics]
assert 'tokenizer' in result.program.roles
print('ok', flowc.__file__)
"""


def test_wheel_ships_grammar_and_stdlib_and_works_without_the_source_tree(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = wheels.glob("flowc-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "flowc/grammars/flow.lark" in names
    assert "flowstd/lib/text.flow" in names
    target = tmp_path / "installed"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True, capture_output=True, timeout=300,
    )
    (tmp_path / "main.flow").write_text(PROGRAM)
    probe = PROBE.format(target=str(target), site=sysconfig.get_paths()["purelib"])
    # -S: no site-packages processing, so the editable install of the source tree is invisible
    result = subprocess.run([sys.executable, "-S", "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok " + str(target))


def test_runtime_imports_no_compiler_machinery():
    probe = "import sys, flowrt; bad = {'flowc', 'lark', 'jinja2', 'click'} & set(sys.modules); assert not bad, bad"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
