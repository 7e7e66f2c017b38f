"""The VS Code extension packages into a .vsix holding the extension and nothing of its tests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

EDITOR = REPO / "editors" / "vscode"


def test_the_vsix_builds_and_holds_the_extension(tmp_path: Path):
    if not (EDITOR / "node_modules" / "@vscode" / "vsce").is_dir() or shutil.which("npx") is None:
        pytest.fail("the editor's node tools are missing: run `make test` (it runs `npm ci` in editors/vscode)")
    vsix = tmp_path / "flowc.vsix"
    subprocess.run(
        ["npx", "vsce", "package", "--skip-license", "--out", str(vsix)],
        cwd=EDITOR,
        check=True,
        capture_output=True,
        timeout=300,
    )
    with zipfile.ZipFile(vsix) as archive:
        names = set(archive.namelist())
        manifest = json.loads(archive.read("extension/package.json"))
        grammar = json.loads(archive.read("extension/syntaxes/flow.tmLanguage.json"))
    contributed = manifest["contributes"]
    assert f"extension/{contributed['grammars'][0]['path'].removeprefix('./')}" in names
    assert f"extension/{contributed['languages'][0]['configuration'].removeprefix('./')}" in names
    assert f"extension/{manifest['main'].removeprefix('./')}" in names
    assert {"extension/src/serverCommand.js", "extension/images/screenshot.png"} <= names
    assert "extension/node_modules/vscode-languageclient/package.json" in names  # the runtime dependency ships
    assert not any(n.startswith(("extension/tests/", "extension/scripts/")) for n in names)
    assert not any("vscode-tmgrammar-test" in n or "/@vscode/vsce/" in n for n in names)  # dev tools stay out
    assert grammar == json.loads((EDITOR / "syntaxes" / "flow.tmLanguage.json").read_text(encoding="utf-8"))
    assert contributed["languages"][0]["extensions"] == [".flow"]


def _node_version(text: str) -> tuple[int, int, int]:
    return tuple(int(p) for p in (text.split(".") + ["0", "0"])[:3])  # type: ignore[return-value]


def _satisfies(version: tuple[int, int, int], spec: str) -> bool:
    """npm's semver ranges as package-lock `engines` use them: `||` of space-separated
    comparators (`>=`, `>`, `<=`, `<`, `^`, `~`, bare or partial versions, `*`)."""
    for alternative in spec.split("||"):
        comparators = re.findall(r"(>=|<=|>|<|\^|~|=)?\s*(\*|x|\d+(?:\.\d+){0,2})", alternative)
        if all(_compare(version, op, bound) for op, bound in comparators):
            return True
    return False


def _compare(version: tuple[int, int, int], op: str, bound: str) -> bool:
    if bound in ("*", "x"):
        return True
    parts = len(bound.split("."))
    low = _node_version(bound)
    if op in ("", "=") and parts < 3:  # `20` is 20.x.x
        op = "~" if parts == 2 else "^"
    if op == "^":
        return low <= version < ((low[0] + 1, 0, 0) if low[0] else (0, low[1] + 1, 0))
    if op == "~":
        return low <= version < ((low[0] + 1, 0, 0) if parts == 1 else (low[0], low[1] + 1, 0))
    return {
        ">=": version >= low,
        ">": version > low,
        "<=": version <= low,
        "<": version < low,
        "": version == low,
        "=": version == low,
    }[op]


def test_the_semver_reading_of_engines():
    v = _node_version("20.18.1")
    assert _satisfies(v, ">=20") and _satisfies(v, ">= 20.18.1") and _satisfies(v, "18 || 20 || >=22")
    assert _satisfies(v, "^12.20.0 || ^14.13.1 || >=16.0.0") and _satisfies(v, "*")
    assert not _satisfies(v, ">= 22") and not _satisfies(v, ">=20.19.0") and not _satisfies(v, "18 || >=22")
    assert not _satisfies(v, ">=0.6.11 <=0.7.0") and _satisfies(_node_version("0.7.5"), ">=0.6.11 <=0.7.0 || >=0.7.3")


def test_every_locked_node_tool_runs_on_the_readmes_node():
    # README names the oldest Node the set-up needs; `npm ci` warns (EBADENGINE) about every
    # locked package whose `engines` refuses it
    match = re.search(r"Node\s+≥\s*(\d+\.\d+\.\d+)", (REPO / "README.md").read_text(encoding="utf-8"))
    assert match, "README.md must say which Node the set-up needs (`Node ≥ X.Y.Z`)"
    oldest = _node_version(match.group(1))
    lock = json.loads((EDITOR / "package-lock.json").read_text(encoding="utf-8"))
    refused = {
        name: meta["engines"]["node"]
        for name, meta in lock["packages"].items()
        if isinstance(meta.get("engines"), dict) and "node" in meta["engines"] and not _satisfies(oldest, meta["engines"]["node"])
    }
    assert not refused, f"these locked packages refuse Node {match.group(1)}: {refused}"
