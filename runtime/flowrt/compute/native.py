"""Which implementation of page hashing runs: the C extension, or hashlib (the specification).

`flowrt.compute._pagehash` is compiled by Cython from `_pagehash.pyx` and the C headers beside it
(setup.py) with the SHA-256 of those sources built in (`SOURCE_DIGEST`), so flowrt can tell a
fresh extension from a stale one. Both implementations give the same digests; hashing.py runs
hashlib instead of the extension when:
- `FLOWRT_PURE=1` is set (as for the control core, flowrt.control.native);
- the extension was not compiled (no Cython or C compiler when flowrt was installed);
- it was built from other sources than the ones beside it (an editable install whose `.pyx`
  or a `.h` changed since; `make install` or `pip install -e .` rebuilds it): a warning says so.

This module must stand alone (setup.py loads it by path, before flowrt is installed).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import warnings
from pathlib import Path
from types import ModuleType

MODULE = "flowrt.compute._pagehash"
SOURCES = ("_pagehash.pyx", "_pagehash.h", "_pagechain.h", "_blake2b.h")  # what the extension is compiled from, in digest order
HERE = Path(__file__).resolve().parent


def source_digest(directory: Path = HERE) -> str:
    """The SHA-256 of the extension's sources in `directory` (each name, then its bytes)."""
    digest = hashlib.sha256()
    for name in SOURCES:
        path = directory / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"missing")
    return digest.hexdigest()


def choose(built_from: str | None, directory: Path = HERE) -> tuple[bool, str]:
    """(whether an extension built from sources of digest `built_from` (None: no extension)
    can run beside the sources in `directory`, the reason in words)."""
    if os.environ.get("FLOWRT_PURE") == "1":
        return False, "hashlib (FLOWRT_PURE=1)"
    if built_from is None:
        return False, "hashlib (the C extension was not compiled when flowrt was installed)"
    if not all((directory / name).is_file() for name in SOURCES):
        return True, "C (Cython)"  # an installed wheel without (all) its sources: the extension is all there is
    if built_from != source_digest(directory):
        warnings.warn(
            "flowrt: the compiled page hashing (flowrt.compute._pagehash) is older than its sources "
            f"({', '.join(SOURCES)}: one changed since it was built); hashing with hashlib, which is slower. "
            "Rebuild it with `make install` or `pip install -e .`",
            RuntimeWarning,
            stacklevel=3,
        )
        return False, "hashlib (the C extension is stale)"
    return True, "C (Cython)"


def load() -> tuple[ModuleType | None, str]:
    """The extension to run (None: hashlib) and the reason in words; decided once per process."""
    if os.environ.get("FLOWRT_PURE") == "1":
        return None, choose(None)[1]
    try:
        module = importlib.import_module(MODULE)
    except ImportError:
        module = None
    compiled, reason = choose(None if module is None else getattr(module, "SOURCE_DIGEST", ""))
    return (module if compiled else None), reason
