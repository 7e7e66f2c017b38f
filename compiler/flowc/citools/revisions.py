"""The two sides of `flowc diff`: a `.flow` file, or `git:REV:PATH`, the file as it was at a
git revision, read with the modules it imports as they were at that revision.

For a revision, PATH is relative to the working directory (as for the file itself), which
must be inside the git repository. Every `.flow` file under the file's directory at REV is
written to a temporary directory (imports are found beside the importing file, so they lie
there or below), and the file is checked from there; diagnostics and places name it
`git:REV:PATH`. Problems (no git, not a repository, an unknown revision, a path that did not
exist then) are one line naming the fix.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from flowc.check import CheckResult, check_source
from flowc.sources import read_source

PREFIX = "git:"


class CannotRead(Exception):
    """A side of the diff that cannot be read: one line naming it and the fix (exit 2)."""


@contextlib.contextmanager
def checked(spec: str) -> Iterator[CheckResult]:
    """The check of one side: a path, or `git:REV:PATH`."""
    if not spec.startswith(PREFIX):
        yield _check_file(Path(spec), spec)
        return
    revision, separator, path = spec[len(PREFIX) :].partition(":")  # (a git ref cannot hold a colon: a path can)
    if not separator or not revision or not path:
        raise CannotRead(
            f"{spec}: write a revision as git:REV:PATH, for example git:HEAD:pipeline.flow or git:origin/main:pipeline.flow"
        )
    # imports are named after the importer's directory: `git:REV:./x.flow` keeps the prefix on theirs
    display = spec if "/" in path else f"{PREFIX}{revision}:./{path}"
    with tempfile.TemporaryDirectory(prefix="flowc-diff-") as scratch:
        yield _check_file(_materialize(revision, path, Path(scratch)), display)


def _check_file(path: Path, display: str) -> CheckResult:
    try:
        text = read_source(path).text
    except FileNotFoundError:
        raise CannotRead(f"no such file: {display}") from None
    except IsADirectoryError:
        raise CannotRead(f"{display} is a directory; pass a .flow file") from None
    except UnicodeDecodeError as error:
        raise CannotRead(f"{display} is not UTF-8 text ({error.reason} at byte {error.start}); pass a .flow file") from None
    except OSError as error:
        raise CannotRead(f"cannot read {display}: {error.strerror or error}") from None
    return check_source(text, display, path)


def _git(*args: str, data: bytes | None = None, cwd: str | None = None) -> bytes:
    if shutil.which("git") is None:
        raise CannotRead("git is not installed; install it, or pass the old version as a file")
    try:
        result = subprocess.run(["git", *args], input=data, capture_output=True, timeout=120, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CannotRead(f"git {args[0]} failed: {error}") from None
    if result.returncode != 0:
        message = result.stderr.decode("utf-8", errors="replace").strip().splitlines()
        raise _GitFailed(message[-1] if message else f"git {args[0]} exited {result.returncode}")
    return result.stdout


class _GitFailed(CannotRead):
    pass


def _materialize(revision: str, path: str, scratch: Path) -> Path:
    """Write the `.flow` files of PATH's directory at `revision` under `scratch`; PATH's copy."""
    try:
        prefix = _git("rev-parse", "--show-prefix").decode().strip()
    except _GitFailed:
        raise CannotRead(
            f"git:{revision}:{path}: {Path.cwd()} is not inside a git repository; run flowc diff from the repository"
        ) from None
    try:
        commit = _git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}").decode().strip()
    except _GitFailed:
        raise CannotRead(
            f"git:{revision}:{path}: no revision `{revision}` in this repository; check the name (git log, git branch -a)"
        ) from None
    top = _git("rev-parse", "--show-toplevel").decode().strip()
    absolute = Path(path) if Path(path).is_absolute() else Path(top, prefix, path)
    relative = Path(os.path.relpath(absolute, top)).as_posix()
    if relative == ".." or relative.startswith("../"):
        raise CannotRead(f"git:{revision}:{path}: the path is outside the repository at {top}")
    folder = posixpath.dirname(relative)
    listed = _git("ls-tree", "-r", "-z", "--name-only", commit, "--", folder or ".", cwd=top).decode("utf-8", errors="replace")
    names = [n for n in listed.split("\0") if n.endswith(".flow")]
    if relative not in names:
        raise CannotRead(
            f"git:{revision}:{path}: {relative} does not exist at {revision}; check the path (git ls-tree {revision})"
        )
    blobs = _git("cat-file", "--batch", data="".join(f"{commit}:{n}\n" for n in names).encode(), cwd=top)
    for name in names:
        header, _, blobs = blobs.partition(b"\n")
        size = int(header.split()[2])
        target = scratch.joinpath(*PurePosixPath(name).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blobs[:size])
        blobs = blobs[size + 1 :]
    return scratch.joinpath(*PurePosixPath(relative).parts)
