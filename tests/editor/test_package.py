"""The VS Code extension packages into a .vsix holding the extension and nothing of its tests."""

from __future__ import annotations

import json
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
