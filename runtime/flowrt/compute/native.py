"""Which implementation of page hashing runs: the C extension, or hashlib (the specification).

`flowrt.compute._pagehash` is compiled by Cython from `_pagehash.pyx` and the C headers beside it
(setup.py) with the SHA-256 of those sources built in; flowrt.extensions decides whether it may
run (`FLOWRT_PURE=1`, not compiled, or stale: hashing.py runs hashlib instead). Both
implementations give the same digests.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from flowrt.extensions import PAGE_HASHING

MODULE = PAGE_HASHING.module
SOURCES = PAGE_HASHING.sources  # what the extension is compiled from, in digest order
HERE = PAGE_HASHING.directory


def source_digest(directory: Path = HERE) -> str:
    """The SHA-256 of the extension's sources in `directory` (each name, then its bytes)."""
    return PAGE_HASHING.source_digest(directory)


def choose(built_from: str | None, directory: Path = HERE) -> tuple[bool, str]:
    """(whether an extension built from sources of digest `built_from` (None: no extension)
    can run beside the sources in `directory`, the reason in words)."""
    return PAGE_HASHING.choose(built_from, directory)


def load() -> tuple[ModuleType | None, str]:
    """The extension to run (None: hashlib) and the reason in words; decided once per process."""
    return PAGE_HASHING.load()
