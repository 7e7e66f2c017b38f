"""Builds flowrt's compiled control core; everything else about the package is in pyproject.toml.

Cython compiles the core's modules (flowrt.control.native.MODULES) from their own .py files,
typed by the .pxd beside each, and this build records the SHA-256 of the sources of every
extension it writes, so flowrt can tell a fresh extension from a stale one. Without Cython or
a C compiler the package still installs: flowrt then runs the same modules as Python, slower
(docs/runtime.md, "The compiled core").

It also compiles flowrt's other C extensions (flowrt.extensions: page hashing, the trace
writer) from their .pyx files and headers; each carries the digest of its sources inside it
instead of in the manifest.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
CORE = HERE / "runtime" / "flowrt" / "control"
RUNTIME = HERE / "runtime" / "flowrt"


def _native(name: str = "_flowrt_native", path: Path = CORE / "native.py"):
    """A module that stands alone (flowrt.control.native by default), loaded by path: flowrt is
    not importable while it is being built."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses look their module up while it runs)
    spec.loader.exec_module(module)
    return module


native = _native()
extensions_native = _native("_flowrt_extensions", RUNTIME / "extensions.py")


class BuildCore(build_ext):
    """build_ext that never fails the install and records what each extension was built from."""

    def run(self) -> None:
        self.failed: set[str] = set()
        super().run()  # builds, then copies the extensions into the source tree if in place
        self._record_sources()

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as error:  # noqa: BLE001 - no compiler: the Python sources run instead
            self.warn(f"flowrt: could not compile {ext.name} ({error}); flowrt will run its Python sources")
            self.failed.add(ext.name)

    def _record_sources(self) -> None:
        """Write, beside the extensions where they finally lie, the digest of each one's sources."""
        for ext in self.extensions:
            if ext.name.rpartition(".")[0] != native.PACKAGE:
                continue  # the other extensions carry their sources' digest inside them (c_extension)
            path = Path(self.get_ext_fullpath(ext.name))
            manifest = path.parent / native.MANIFEST
            try:
                built = json.loads(manifest.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                built = {}
            if ext.name in self.failed or not path.is_file():
                built.pop(path.name, None)  # an older extension left in place is not vouched for
            else:
                built[path.name] = native.source_digest(ext.name.rpartition(".")[2], CORE)
            path.parent.mkdir(parents=True, exist_ok=True)
            manifest.write_text(json.dumps(built, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("flowrt: Cython is not installed; the control core will run as Python")
        return []
    modules = [Extension(f"{native.PACKAGE}.{m}", [str((CORE / f"{m}.py").relative_to(HERE))]) for m in native.MODULES]
    core = cythonize(
        modules,
        build_dir="build/cython",
        quiet=True,
        compiler_directives={
            "language_level": 3,
            "annotation_typing": False,  # the .pxd files are the only source of C types
            "nonecheck": True,  # a None where an object is expected raises, as in Python
        },
    )
    others = [c_extension(each) for each in extensions_native.EXTENSIONS]
    return core + cythonize(others, build_dir="build/cython", quiet=True, compiler_directives={"language_level": 3})


def c_extension(spec) -> Extension:
    """One of flowrt.extensions.EXTENSIONS (page hashing, the trace writer), built with its sources' digest."""
    sources = [str((spec.directory / name).relative_to(HERE)) for name in spec.sources]
    return Extension(
        spec.module,
        sources[:1],
        depends=sources[1:],
        define_macros=[("FLOWRT_SOURCE_DIGEST", f'"{spec.source_digest()}"')],
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildCore})
