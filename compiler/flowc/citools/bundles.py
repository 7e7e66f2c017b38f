"""Where `flowc build` writes a bundle without `-o`, and `flowc build --check`: whether the
bundle in a directory is byte for byte what the `.flow` file builds now (docs/ci.md).

The check builds in memory and writes nothing. It reads every file under the directory except
Python's caches (`__pycache__/`, `*.pyc`: a bundle that ran has them) and reports the files
that differ (as unified diffs), the bundle's files missing there and the files there that are
no part of the bundle.
"""

from __future__ import annotations

import difflib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from flowc.codegen import Bundle

BUILD_DIR = "build"
# Appended to the flow's name for the bundle's directory: roles' packages are usually named like
# the flow (`impl "chat.roles:Llm"` in flow `chat`), and a bundle directory of that name, run as
# `python -m chat` in build/, would be imported in place of the package (a regular package wins
# over a directory without `__init__.py` wherever it sits on the path)
SUFFIX = "_bundle"


def default_output(source: Path, flow: str, checking: bool = False) -> Path:
    """`build/<flow name>_bundle/` in the directory of the `.flow` file. For `--check`
    (`checking`), a bundle that flowc 0.1.0 wrote to `build/<flow name>/` is compared there
    while the new place holds nothing, so a committed bundle keeps passing until it is rebuilt."""
    out = source.parent / BUILD_DIR / f"{flow}{SUFFIX}"
    earlier = source.parent / BUILD_DIR / flow
    if checking and not out.exists() and (earlier / "bundle.json").is_file():
        return earlier
    return out


class Unreadable(Exception):
    """The directory (or a file in it) cannot be read: one line naming it and why."""


@dataclass
class Staleness:
    differing: dict[str, str] = field(default_factory=dict)  # path in the bundle -> unified diff
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    @property
    def fresh(self) -> bool:
        return not (self.differing or self.missing or self.extra)

    def summary(self) -> str:
        parts = [
            f"{len(self.differing)} {'file differs' if len(self.differing) == 1 else 'files differ'}" if self.differing else "",
            f"{len(self.missing)} missing" if self.missing else "",
            f"{len(self.extra)} extra" if self.extra else "",
        ]
        return ", ".join(p for p in parts if p)


MAX_EXTRA_BYTES = 1 << 20  # a file this much larger than the bundle's is not read (it differs; /dev/zero never ends)


def compare(bundle: Bundle, out: Path) -> Staleness:
    """How the files under `out` differ from `bundle`; Unreadable when they cannot be read."""
    found = _files(out)
    result = Staleness()
    for relative, text in bundle.files.items():
        path = found.pop(relative, None)
        if path is None:
            result.missing.append(relative)
            continue
        try:
            status = path.stat()  # (a dangling link: cannot be read, below)
            if not stat.S_ISREG(status.st_mode) or status.st_size > len(text.encode("utf-8")) + MAX_EXTRA_BYTES:
                # a FIFO or a device would hang or never end; a file far larger than the bundle's differs anyway
                data = None
            else:
                data = path.read_bytes()
        except OSError as error:
            raise Unreadable(f"cannot read {path}: {error.strerror or error}") from None
        if data is None:
            result.differing[relative] = (
                f"{(out / relative).as_posix()} is not the bundle's file (not a regular file, or far larger)\n"
            )
            continue
        if data != text.encode("utf-8"):
            old = data.decode("utf-8", errors="replace")
            shown = (out / relative).as_posix()
            diff = difflib.unified_diff(
                old.splitlines(True), text.splitlines(True), f"{shown} (in the directory)", f"{shown} (built now)"
            )
            result.differing[relative] = "".join(line if line.endswith("\n") else line + "\n" for line in diff)
    result.extra = sorted(found)
    result.hints = _hints(bundle, out)
    return result


def _files(out: Path) -> dict[str, Path]:
    """Every file under `out` by its path in the bundle (posix), Python's caches left out."""
    try:
        exists, is_dir = out.exists(), out.is_dir()
    except OSError as error:
        raise Unreadable(f"cannot read {out}: {error.strerror or error}") from None
    if not exists:
        return {}
    if not is_dir:
        raise Unreadable(f"{out} is not a directory; pass the bundle's directory with -o")
    found: dict[str, Path] = {}
    problems: list[OSError] = []
    for directory, subdirectories, names in os.walk(out, onerror=problems.append):
        subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
        for name in names:
            if not name.endswith(".pyc"):
                path = Path(directory, name)
                found[path.relative_to(out).as_posix()] = path
    if problems:
        error = problems[0]
        raise Unreadable(f"cannot read {error.filename or out}: {error.strerror or error}")
    return found


def _hints(bundle: Bundle, out: Path) -> list[str]:
    """What a differing bundle.json says about the options the directory's bundle was built with."""
    try:
        there = json.loads((out / "bundle.json").read_text(encoding="utf-8"))
        built = json.loads(bundle.files["bundle.json"])
    except (OSError, ValueError, KeyError):
        return []
    if not isinstance(there, dict):
        return []
    hints = []
    if there.get("targets") != built.get("targets") and isinstance(there.get("targets"), list):
        flags = " ".join(f"--target {t}" for t in there["targets"]) if len(there["targets"]) < 3 else "--target all"
        hints.append(
            f"the bundle in {out} was built for {', '.join(map(str, there['targets']))}: pass `{flags}` to compare like with like"
        )
    vendored_there, vendored_now = there.get("python_path") == ["vendor"], built.get("python_path") == ["vendor"]
    if vendored_there != vendored_now:
        hints.append(f"the bundle in {out} was built {'with' if vendored_there else 'without'} --vendor; pass the same")
    return hints


def report(staleness: Staleness, out: Path, source: str, echo, options: str = "") -> bool:
    """Print the verdict of `flowc build --check` (`echo(text, err=False)`); whether it is fresh.
    `options`: the build's own flags (" --target local --vendor"), repeated in the command to rebuild."""
    if staleness.fresh:
        echo(f"{out} is up to date with {source}")
        return True
    for relative in sorted(staleness.differing):
        echo(staleness.differing[relative], nl=False)
    for relative in staleness.missing:
        echo(f"missing from {out}: {relative}")
    for relative in staleness.extra:
        echo(f"not part of the bundle: {(out / relative).as_posix()}")
    for hint in staleness.hints:
        echo(f"hint: {hint}", err=True)
    remove = " (and remove the files that are not part of it: a rebuild leaves them)" if staleness.extra else ""
    echo(
        f"flowc: the bundle in {out} is stale ({staleness.summary()}); "
        f"rebuild it with `flowc build {source} -o {out}{options}`{remove} and commit the result",
        err=True,
    )
    return False
