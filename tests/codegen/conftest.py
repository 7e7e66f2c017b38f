"""Bundles of every example, built once per test session under build/test-bundles/."""

from __future__ import annotations

import shutil
from pathlib import Path

from flowc.check import check_file
from flowc.codegen import build_bundle
from tests.conftest import EXAMPLES, REPO

OUT = REPO / "build" / "test-bundles"


def built(path: Path):
    """The bundle of one example, written to disk (same relative place on every machine)."""
    out = OUT / path.parent.name
    result = check_file(path)
    assert result.ok, [d.message for d in result.diagnostics]
    bundle = build_bundle(result.program, path, out)
    if out.exists():
        shutil.rmtree(out)
    bundle.write(out)
    return bundle, out


BUNDLES = {p.parent.name: built(p) for p in EXAMPLES}
