"""What a role's frames must be, and how a role's failure is described (docs/runtime.md, Roles).

The compiled core calls into this plain module only off its hot path: when a frame is not a
plain dict of declared fields (`checked_frame`), when an activation fails (`failure`,
`waiting_place`), and when a call ends (`reported`: the errors `done` lists). It must not
import `flowrt.control.call`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from flowrt.control.threads import job_of
from flowrt.errors import BadInput, place, shown


class RoleProtocolError(Exception):
    """A role broke the contract of its interface: a frame that is not a dict of its declared
    out fields, or a second frame from an interface that does not stream."""


def checked_frame(frame: object, node_id: str, declared: frozenset) -> dict:
    """A frame that is not a plain dict of declared fields: a dict subclass is copied, anything
    else, or a field the interface does not declare, breaks the role's contract."""
    if not isinstance(frame, dict):
        raise RoleProtocolError(
            f"`{node_id}` must yield or return a dict of its out fields ({_listed(declared)}), not {type(frame).__name__}"
        )
    extra = sorted(str(name) for name in frame if name not in declared)
    if extra:
        names = ", ".join(f"`{name}`" for name in extra)
        raise RoleProtocolError(
            f"`{node_id}` produced {names}, which its interface does not declare (it declares {_listed(declared)}); "
            "add it to the interface's `out` clause in the .flow file, or leave it out of the frame"
        )
    return dict(frame)


class RemoteFailure(Exception):
    """A role failed in another process (or its process went away): the message and the place
    as that process described them (docs/deploy.md); the embedded runtime reports it as is."""

    def __init__(self, message: str, where: str = "", bad_input: bool = False):
        super().__init__(message)
        self.message = message
        self.where = where
        self.bad_input = bad_input  # it was a BadInput there: the caller's to fix


def second_frame(node_id: str) -> RoleProtocolError:
    return RoleProtocolError(
        f"`{node_id}` yielded a second frame, but its interface is not `out stream` (one frame per activation); "
        "declare `out stream ...` in the .flow file, or yield once"
    )


def failure(error: BaseException, result: Any, prefer: list[Path]) -> tuple[str, str]:
    """(message, where) of a role's failure: for a broken contract, flowrt's message and where
    the role stood; else the exception and the innermost frame of the role's own code."""
    if isinstance(error, RoleProtocolError):
        return str(error), code_place(result)
    if isinstance(error, RemoteFailure):
        return error.message, error.where
    return f"{type(error).__name__}: {_text(error)}", place(error, prefer)


def bad_input(error: BaseException) -> bool:
    """Whether a role's failure is the caller's to fix: it raised flowrt.BadInput (here or in
    another process)."""
    return isinstance(error, BadInput) or (isinstance(error, RemoteFailure) and error.bad_input)


def waiting_place(error: BaseException, result: Any, prefer: list[Path]) -> str:
    """Where a role was when its timeout expired: the cancellation the timeout threw into it
    (in another process: where that process said it was)."""
    remote = getattr(error.__context__ or error, "flowrt_where", None)
    if remote is not None:
        return remote
    return place(error.__context__ or error, prefer) or code_place(result)


def log_failure(log: logging.Logger, line: str, error: BaseException) -> None:
    """Log a role's failure with its traceback, even when formatting that runs the role's code
    again (its `__str__`) and that raises. A failure in another process was logged there: here
    the line is enough."""
    if isinstance(error, RemoteFailure):
        log.warning("%s", line)
        return
    try:
        log.warning("%s", line, exc_info=error)
    except BaseException:  # noqa: BLE001 - the role's failure is reported, not a second one
        log.warning("%s (its traceback could not be shown)", line)


def code_place(result: Any) -> str:
    """`file:line` where a role's generator stands (its last `yield`), or where its coroutine
    was defined (it has returned): the place of a frame that broke the role's contract. For a
    plain method run on its replica's thread, the same places in the role's own code."""
    job = job_of(result)
    if job is not None:
        return job.where()
    frame = getattr(result, "ag_frame", None)
    if frame is not None:
        return f"{shown(frame.f_code.co_filename)}:{frame.f_lineno}"
    code = getattr(result, "ag_code", None) or getattr(result, "cr_code", None)
    return f"{shown(code.co_filename)}:{code.co_firstlineno}" if code is not None else ""


def _text(error: BaseException) -> str:
    """What a role's exception says, even when its `__str__` itself fails."""
    try:
        return str(error)
    except BaseException as broken:  # noqa: BLE001 - the role's failure is reported, not a second one
        return f"(its message could not be shown: {type(broken).__name__})"


def _listed(declared: frozenset) -> str:
    return ", ".join(f"`{name}`" for name in sorted(declared)) or "no fields"


MAX_REPORTED_ERRORS = 16  # errors a `done` event lists one by one


def reported(errors: list) -> list:
    """The errors `done` lists: the first MAX_REPORTED_ERRORS and one line counting the rest
    (a role that fails on every frame of a long stream would make `done` megabytes long)."""
    if len(errors) <= MAX_REPORTED_ERRORS:
        return list(errors)
    rest = errors[MAX_REPORTED_ERRORS:]
    told = {"role": "", "interface": "", "where": "", "message": f"and {len(rest)} more error(s); the server's log has each"}
    if all(e.get("bad_input") for e in rest):
        told["bad_input"] = True
    return [*errors[:MAX_REPORTED_ERRORS], told]
