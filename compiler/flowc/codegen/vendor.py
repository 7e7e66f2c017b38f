"""`flowc build --vendor`: copy the roles' impl modules into the bundle so it runs without the
source tree (docs/bundle.md, "Vendoring").

Each `impl "pkg.mod:Class"` is found the way the runtime would import it: under the .flow
file's directory, then its parent. The module is copied with its packages' `__init__.py`, and
so is every module it imports (absolute or relative imports, followed transitively, read with
`ast`) that lives under those same directories; anything else (the standard library,
installed packages) is left to the environment. Copies land under `vendor/` in the bundle,
which becomes the bundle's only `python_path`. Only `.py` files are copied: a role that reads
data files beside its module must find them some other way (a path in its globals, a package).
"""

from __future__ import annotations

import ast
from pathlib import Path


class VendorError(ValueError):
    """An impl module that cannot be found or read where the bundle would import it from."""


def vendored(impls: list[str], roots: list[Path]) -> dict[str, str]:
    """{`vendor/<path>`: text} of the impl modules and the local modules they import."""
    found: dict[Path, Path] = {}  # file -> the root it is under
    queue: list[tuple[str, str]] = []
    for impl in sorted(set(impls)):
        module = impl.partition(":")[0]
        located = _locate(module, roots)
        if located is None:
            looked = ", ".join(str(r) for r in roots)
            raise VendorError(
                f"cannot vendor `{module}` (impl `{impl}`): no {module.replace('.', '/')}.py under {looked}; "
                "put the module beside the .flow file, or build without --vendor"
            )
        queue.append((module, impl))
    seen_modules: set[str] = set()
    while queue:
        module, why = queue.pop()
        if module in seen_modules:
            continue
        seen_modules.add(module)
        located = _locate(module, roots)
        if located is None:
            continue  # not ours: installed or standard
        path, root = located
        for file in _with_packages(path, root):
            found[file] = root
        for imported in _imports(path, module):
            queue.append((imported, module))
    files = {}
    for file, root in sorted(found.items()):
        relative = file.relative_to(root).as_posix()
        try:
            files[f"vendor/{relative}"] = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise VendorError(f"cannot vendor {file}: {error}") from None
    return files


def _locate(module: str, roots: list[Path]) -> tuple[Path, Path] | None:
    parts = module.split(".")
    for root in roots:
        base = root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate, root
    return None


def _with_packages(path: Path, root: Path) -> list[Path]:
    """`path` and the `__init__.py` of every package between it and `root`."""
    files = [path]
    directory = path.parent
    while directory != root and root in directory.parents:
        init = directory / "__init__.py"
        if init.is_file():
            files.append(init)
        directory = directory.parent
    return files


def _imports(path: Path, module: str) -> list[str]:
    """The modules `path` imports (relative imports resolved against `module`'s package)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, SyntaxError):
        return []  # the runtime reports it, with its place, when it imports the module
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                prefix = ".".join([*base, node.module] if node.module else base)
            else:
                prefix = node.module or ""
            names.append(prefix)
            names += [f"{prefix}.{alias.name}" for alias in node.names if alias.name != "*"]
    out = []
    for name in names:
        parts = name.split(".")
        out += [".".join(parts[: i + 1]) for i in range(len(parts))]  # each package on the way
    return [n for n in out if n]
