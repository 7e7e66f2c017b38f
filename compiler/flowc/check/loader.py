"""Loading a module and everything it imports.

`import a.b` looks for `a/b.flow` beside the importing file, then in the standard library
(flowstd). Each file is parsed once. Modules come back dependencies first, so a name declared
twice is reported where the user wrote the second one, in their own file.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from flowc.check.model import ModuleInfo
from flowc.diagnostics import Diagnostic, Note
from flowc.sources import read_source
from flowc.syntax import ast, parse

STDLIB_PREFIX = "<stdlib>"


def stdlib_dir() -> Path:
    return Path(str(resources.files("flowstd").joinpath("lib")))


@dataclass
class _Loader:
    modules: list[ModuleInfo] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    done: dict[Path, str] = field(default_factory=dict)  # resolved path -> display path
    active: list[Path] = field(default_factory=list)  # the import chain being loaded
    failed: bool = False

    def load(self, path: Path | None, display: str, text: str, name: str, is_root: bool) -> None:
        self.sources[display] = text
        result = parse(text, display)
        self.diagnostics.extend(result.diagnostics)
        if result.module is None:
            self.failed = True
            return
        module = result.module
        if is_root and module.header is not None:
            name = module.header.name.text
        info = ModuleInfo(name=name, path=display, text=text, ast=module, is_root=is_root)
        key = path.resolve() if path is not None else None
        if key is not None:
            self.active.append(key)
        seen_imports: dict[str, ast.Import] = {}
        for decl in module.decls:
            if not isinstance(decl, ast.Import):
                continue
            if decl.dotted in seen_imports:
                self.diagnostics.append(
                    Diagnostic(
                        "W104",
                        f"`{decl.dotted}` is imported twice",
                        decl.span,
                        "remove the second import",
                        (Note(seen_imports[decl.dotted].span, "first imported here"),),
                    )
                )
                continue
            seen_imports[decl.dotted] = decl
            imported = self._import(decl, path, display)
            if imported is not None:
                info.imports.append((decl, imported))
        if key is not None:
            self.active.pop()
            self.done[key] = display
        self.modules.append(info)

    def _import(self, decl: ast.Import, importer: Path | None, importer_display: str) -> str | None:
        relative = Path(*[p.text for p in decl.path]).with_suffix(".flow")
        beside_dir = importer.parent if importer is not None else Path.cwd()
        candidates = [
            (beside_dir / relative, posixpath.normpath(posixpath.join(posixpath.dirname(importer_display), relative.as_posix()))),
            (stdlib_dir() / relative, f"{STDLIB_PREFIX}/{relative.as_posix()}"),
        ]
        for candidate, display in candidates:
            if not _is_file(candidate):
                continue
            key = candidate.resolve()
            if key in self.active:
                chain = " → ".join(p.stem for p in self.active[self.active.index(key) :]) + f" → {key.stem}"
                self.diagnostics.append(
                    Diagnostic(
                        "E102", f"import cycle: {chain}", decl.span, "move the shared declarations into a module both can import"
                    )
                )
                return None
            if key in self.done:
                return self.done[key]
            try:
                text = read_source(candidate).text
            except UnicodeDecodeError as error:
                message = f"`{display}` is not UTF-8 text ({error.reason} at byte {error.start})"
                self.diagnostics.append(Diagnostic("E103", message, decl.span, f"save `{display}` as UTF-8"))
                return None
            except OSError as error:
                self.diagnostics.append(
                    Diagnostic(
                        "E103", f"cannot read `{display}`: {error.strerror or error}", decl.span, "check the file's permissions"
                    )
                )
                return None
            self.load(candidate, display, text, decl.dotted, is_root=False)
            return display
        beside = posixpath.dirname(importer_display) or "."
        self.diagnostics.append(
            Diagnostic(
                "E101",
                f"cannot find module `{decl.dotted}`",
                decl.span,
                f"looked for `{relative.as_posix()}` in `{beside}` and in the standard library; check the spelling",
            )
        )
        return None


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for the file system, or a path through a non-directory
        return False


@dataclass
class Loaded:
    modules: list[ModuleInfo]
    diagnostics: list[Diagnostic]
    sources: dict[str, str]
    ok: bool  # every module parsed


def load(text: str, display: str, path: Path | None = None) -> Loaded:
    """Parse `text` (the root module, shown as `display`) and all its imports."""
    loader = _Loader()
    stem = Path(display).stem if display else "main"
    loader.load(path, display, text, stem, is_root=True)
    return Loaded(loader.modules, loader.diagnostics, loader.sources, not loader.failed)
