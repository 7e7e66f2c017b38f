"""flowrt's hand-written C extensions besides the control core, and which of them may run.

Each extension (`EXTENSIONS`) is compiled by Cython from a `.pyx` and the headers beside it
(setup.py) with the SHA-256 of those sources built in (`SOURCE_DIGEST`), and each has a Python
implementation that is its specification and gives the same results. The Python one runs
instead when:
- `FLOWRT_PURE=1` is set (as for the control core, flowrt.control.native);
- the extension was not compiled (no Cython or C compiler when flowrt was installed);
- it was built from other sources than the ones beside it (an editable install whose sources
  changed since; `make install` or `pip install -e .` rebuilds it): a warning says so.

This module must stand alone (setup.py loads it by path, before flowrt is installed).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

RUNTIME = Path(__file__).resolve().parent  # the flowrt package


@dataclass(frozen=True)
class Extension:
    """One C extension: where its sources lie, and what runs when it cannot."""

    module: str  # its import name
    sources: tuple[str, ...]  # what it is compiled from, in digest order (the .pyx first)
    purpose: str  # what it does, for the warning
    fallback: str  # what runs instead, in words
    compiled: str = "C (Cython)"  # its own name, in words

    @property
    def directory(self) -> Path:
        """The folder of its sources: its package's."""
        package = self.module.rpartition(".")[0]
        return RUNTIME.joinpath(*package.split(".")[1:])

    def source_digest(self, directory: Path | None = None) -> str:
        """The SHA-256 of its sources in `directory` (each name, then its bytes)."""
        directory = self.directory if directory is None else directory
        digest = hashlib.sha256()
        for name in self.sources:
            path = directory / name
            digest.update(name.encode() + b"\0")
            digest.update(path.read_bytes() if path.is_file() else b"missing")
        return digest.hexdigest()

    def choose(self, built_from: str | None, directory: Path | None = None) -> tuple[bool, str]:
        """(whether the extension, built from sources of digest `built_from` (None: not built),
        can run beside the sources in `directory`, the reason in words)."""
        directory = self.directory if directory is None else directory
        if os.environ.get("FLOWRT_PURE") == "1":
            return False, f"{self.fallback} (FLOWRT_PURE=1)"
        if built_from is None:
            return False, f"{self.fallback} (the C extension was not compiled when flowrt was installed)"
        if not all((directory / name).is_file() for name in self.sources):
            return True, self.compiled  # an installed wheel without (all) its sources: the extension is all there is
        if built_from != self.source_digest(directory):
            warnings.warn(
                f"flowrt: the compiled {self.purpose} ({self.module}) is older than its sources "
                f"({', '.join(self.sources)}: one changed since it was built); running {self.fallback} "
                "instead, which is slower. Rebuild it with `make core`, `make install` or `pip install -e .`",
                RuntimeWarning,
                stacklevel=4,
            )
            return False, f"{self.fallback} (the C extension is stale)"
        return True, self.compiled

    def load(self) -> tuple[ModuleType | None, str]:
        """The extension to run (None: the Python implementation) and the reason in words."""
        if os.environ.get("FLOWRT_PURE") == "1":
            return None, self.choose(None)[1]
        try:
            module = importlib.import_module(self.module)
        except ImportError:
            module = None
        compiled, reason = self.choose(None if module is None else getattr(module, "SOURCE_DIGEST", ""))
        return (module if compiled else None), reason


PAGE_HASHING = Extension(
    "flowrt.compute._pagehash",
    ("_pagehash.pyx", "_pagehash.h", "_pagechain.h", "_blake2b.h"),
    purpose="page hashing",
    fallback="hashlib",
)
TRACE_WRITER = Extension(
    "flowrt.observe._tracewriter",
    ("_tracewriter.pyx", "_tracetext.h"),
    purpose="trace recorder and writer",
    fallback="Python",
)
EXTENSIONS = (PAGE_HASHING, TRACE_WRITER)
