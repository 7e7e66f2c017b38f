"""The hooks of .pre-commit-hooks.yaml, run by the real `pre-commit` on the examples in a
temporary git repository: clean examples with fresh bundles pass; a badly formatted file and
a hand-edited bundle fail their hooks.

pre-commit would install flowc from this repository into a hook environment (`language:
python`), which needs the network; so the test declares the same hooks (id, entry, files,
pass_filenames, always_run: everything but the language) as `repo: local` hooks with
`language: system`, calling the flowc installed here. That is also the recipe docs/ci.md gives
for projects that install flowc themselves.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES, REPO

HOOKS = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())


def local_config(bundles: dict[str, str]) -> str:
    hooks = []
    for hook in HOOKS:
        local = {k: v for k, v in hook.items() if k != "description"} | {"language": "system"}
        if hook["id"] == "flowc-build-check":
            hooks += [
                local | {"name": f"{hook['name']} {name}", "args": [flow, "-o", out]} for name, (flow, out) in bundles.items()
            ]
        else:
            hooks.append(local)
    return yaml.safe_dump({"repos": [{"repo": "local", "hooks": hooks}]}, sort_keys=False)


@pytest.fixture
def repository(tmp_path):
    bundles = {}
    for example in EXAMPLES:
        name = example.parent.name
        shutil.copytree(example.parent, tmp_path / "examples" / name, ignore=shutil.ignore_patterns("build", "__pycache__"))
        flow, out = f"examples/{name}/pipeline.flow", f"bundles/{name}"
        built = subprocess.run(
            [sys.executable, "-m", "flowc", "build", flow, "-o", out], cwd=tmp_path, capture_output=True, timeout=60
        )
        assert built.returncode == 0, built.stderr
        bundles[name] = (flow, out)
    (tmp_path / ".pre-commit-config.yaml").write_text(local_config(bundles))
    for args in (("init", "-q"), ("add", "-A")):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, timeout=60)
    return tmp_path


def pre_commit(repository: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # the flowc installed here
        "PRE_COMMIT_HOME": str(repository.parent / "pre-commit-home"),
        "PRE_COMMIT_COLOR": "never",
    }
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--all-files"],
        cwd=repository,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def verdicts(output: str) -> dict[str, str]:
    """Each hook's name and its verdict (Passed, Failed, ...) from pre-commit's report."""
    found = {}
    for line in output.splitlines():
        name, dots, verdict = line.rpartition("..")
        if dots and verdict in ("Passed", "Failed", "(no files to check)Skipped"):
            found[name.rstrip(".")] = verdict
    return found


def test_the_manifest_is_valid_for_pre_commit():
    result = subprocess.run(
        [sys.executable, "-m", "pre_commit", "validate-manifest", str(REPO / ".pre-commit-hooks.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(hook["language"] == "python" for hook in HOOKS)  # installable from this repository


@pytest.mark.skipif(shutil.which("git") is None, reason="pre-commit needs git")
def test_the_hooks_pass_on_the_examples_and_catch_what_they_are_for(repository):
    assert {h["id"] for h in HOOKS} == {"flowc-check", "flowc-fmt", "flowc-build-check"}
    clean = pre_commit(repository)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    passed = verdicts(clean.stdout)
    assert passed["flowc check"] == passed["flowc fmt --check"] == "Passed"
    assert [v for k, v in passed.items() if k.startswith("flowc build --check ")] == ["Passed"] * len(EXAMPLES)

    node = repository / "bundles" / "diamond" / "nodes" / "fuse.py"
    node.write_text(node.read_text() + "# edited by hand\n")
    pipeline = repository / "examples" / "ordered_stream" / "pipeline.flow"
    pipeline.write_text(pipeline.read_text().replace("replicas 4", "replicas    4"))
    subprocess.run(["git", "add", "-A"], cwd=repository, check=True, timeout=60)
    broken = pre_commit(repository)
    assert broken.returncode == 1
    failed = verdicts(broken.stdout)
    assert failed["flowc check"] == "Passed"
    assert failed["flowc fmt --check"] == "Failed"
    assert failed["flowc build --check diamond"] == "Failed"
    assert failed["flowc build --check ordered_stream"] == "Failed"  # bundle.json records the source's hash
    assert failed["flowc build --check image_chat"] == "Passed"
    assert "would reformat examples/ordered_stream/pipeline.flow" in broken.stdout
    assert "-# edited by hand" in broken.stdout
