"""Which implementation of the control core runs: compiled, or the Python sources.

The core's modules (`MODULES`) are compiled by Cython from their own `.py` files, typed by the
`.pxd` beside each (setup.py; docs/runtime.md, "The compiled core"). The extension modules
shadow the sources when both sit in the package. The sources are the specification and always
work, so flowrt runs them instead when:
- `FLOWRT_PURE=1` is set (the test suite runs the runtime suites both ways);
- the core was not compiled (no C compiler when it was installed);
- an extension was built from other sources than the ones beside it (an editable install
  whose `.py` or `.pxd` changed since; `make install` or `pip install -e .` rebuilds it).
  Each build records the SHA-256 of the sources of every extension it wrote (`MANIFEST`).
It is all or nothing: compiled modules read each other's objects at C level.

This module must stand alone (setup.py loads it by path, before flowrt is installed).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

PACKAGE = "flowrt.control"
MODULES = ("program", "bucket", "sequencer", "roles", "activation", "delivery", "call")
MANIFEST = "_native_build.json"
HERE = Path(__file__).resolve().parent


def source_digest(module: str, directory: Path = HERE) -> str:
    """The SHA-256 of what a module's extension is compiled from: its .py, then its .pxd."""
    digest = hashlib.sha256()
    for suffix in (".py", ".pxd"):
        path = directory / f"{module}{suffix}"
        digest.update(path.read_bytes() if path.is_file() else b"missing")
    return digest.hexdigest()


def _extension(module: str, directory: Path) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = directory / f"{module}{suffix}"
        if path.is_file():
            return path
    return None


def choose(directory: Path = HERE) -> tuple[bool, str]:
    """(whether the compiled core in `directory` can run, the reason in words)."""
    if os.environ.get("FLOWRT_PURE") == "1":
        return False, "Python sources (FLOWRT_PURE=1)"
    extensions = {module: _extension(module, directory) for module in MODULES}
    if None in extensions.values():
        return False, "Python sources (the core was not compiled when flowrt was installed)"
    try:
        built = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        built = {}
    for module, path in extensions.items():
        assert path is not None
        if not (directory / f"{module}.py").is_file():
            continue  # no sources to fall back on: the extension is all there is
        if built.get(path.name) != source_digest(module, directory):
            warnings.warn(
                f"flowrt: the compiled control core is older than its sources ({module}.py or {module}.pxd changed "
                "since it was built); running the Python sources, which are slower. Rebuild it with `make install` "
                "or `pip install -e .`",
                RuntimeWarning,
                stacklevel=3,
            )
            return False, f"Python sources (the compiled {module} is stale)"
    return True, "compiled (Cython)"


class _Sources(importlib.abc.MetaPathFinder):
    """Imports the core's modules from their .py files even where extensions sit beside them."""

    def find_spec(self, fullname, path, target=None):
        package, _, name = fullname.rpartition(".")
        if package == PACKAGE and name in MODULES:
            return importlib.util.spec_from_file_location(fullname, HERE / f"{name}.py")
        return None


def select() -> tuple[bool, str]:
    """Decide once per process, before the core is imported; returns what `choose` said."""
    compiled, reason = choose()
    if not compiled and not any(isinstance(f, _Sources) for f in sys.meta_path):
        sys.meta_path.insert(0, _Sources())
    return compiled, reason
