"""Every example runs, and prints exactly what its README says it prints."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES, REPO


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.parent.name for p in EXAMPLES])
def test_example_output_matches_its_readme(path):
    readme = (path.parent / "README.md").read_text()
    (command,) = re.findall(r"```sh\n(flowc run .*?)\n```", readme)
    (expected,) = re.findall(r"```json\n(.*?)\n```", readme, re.DOTALL)
    args = command.split()[1:]
    result = subprocess.run([sys.executable, "-m", "flowc", *args], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip() == expected
    assert '"status": "ok"' in expected.splitlines()[-1]
