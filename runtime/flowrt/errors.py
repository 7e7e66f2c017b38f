"""The errors flowrt reports to users, and where in the user's code a failure happened.

Every `FlowrtError` is a problem the user can fix (a bundle that cannot be read, a role that
cannot run, a bad input, an unknown graph); its message names the place and the fix, and the
command line prints it without a traceback. Anything else escaping flowrt is a bug in flowrt.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from typing import Any

FLOWRT_DIR = str(Path(__file__).resolve().parent)
STDLIB_DIR = sysconfig.get_paths()["stdlib"]


class FlowrtError(Exception):
    """A problem a user can fix: a missing impl, a bad input, an unknown graph."""


class BadInput(FlowrtError, ValueError):
    """Raised by a role: the request it was given cannot be served, and it is the caller's to fix
    (a corrupt image, a parameter out of range). The call's error says so (`"bad_input": true`),
    and the HTTP gateway answers 400 with the message, not 500 (docs/runtime.md, "Roles"); the
    message goes to the caller as it is, so it should name the part of the request and the fix."""


class UnknownGraph(FlowrtError):
    """A call named a graph the bundle does not have."""


class BadInputs(FlowrtError):
    """A call's inputs do not match the graph's entry placeholders (names or declared types)."""


class InputClosed(FlowrtError):
    """A frame or an end sent for a streaming entry that has ended, or to a call that is over
    (cancelled, timed out, or closed by its caller): nothing more of its input is taken."""


class BadTimeout(FlowrtError, ValueError):
    """A call's timeout is not a finite number of seconds greater than zero."""


class RoleError(FlowrtError):
    """A role's implementation cannot run its interfaces (found when the runtime opens)."""


def shown(path: str) -> str:
    """A path as messages show it: relative to the working directory when under it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def _library(filename: str) -> bool:
    if filename.startswith((FLOWRT_DIR, "<")):
        return True
    if not os.path.isabs(filename) and Path(filename).parent.parts[-2:] == ("flowrt", "control"):
        return True  # the compiled core: Cython names its frames by the path it was built from
    return filename.startswith(STDLIB_DIR) and "-packages" not in filename


def place(error: BaseException, prefer: Iterable[Path] = (), depth: int = 0) -> str:
    """`file:line` of the innermost frame of user code in `error`'s traceback ("" if none):
    where a role, its import or its setup failed, not where flowrt noticed. Frames under
    `prefer` (the roles' own directories) win over other code (a library the role called)."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{shown(error.filename)}:{error.lineno}"
    preferred = tuple(str(p) for p in prefer)
    found = best = ""
    tb = error.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not _library(filename):
            found = f"{shown(filename)}:{tb.tb_lineno}"
            if preferred and filename.startswith(preferred):
                best = found
        tb = tb.tb_next
    if not (best or found):  # raised for the user's code (a coroutine that raised StopIteration): what it raised
        cause = error.__cause__ or error.__context__
        if cause is not None and cause is not error and depth < 8:
            return place(cause, prefer, depth + 1)
    return best or found


def frame_place(frame: Any, prefer: Iterable[Path] = ()) -> str:
    """`file:line` of the innermost frame of user code on a running stack whose innermost frame
    is `frame` ("" if none), preferring frames under `prefer`, as `place` does for a traceback."""
    preferred = tuple(str(p) for p in prefer)
    found = ""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _library(filename):
            where = f"{shown(filename)}:{frame.f_lineno}"
            if preferred and filename.startswith(preferred):
                return where
            found = found or where
        frame = frame.f_back
    return found
