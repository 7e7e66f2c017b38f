"""The numbers users hand the runtime (timeouts, waits, session limits), checked in one place so
the CLI, the HTTP server and the Python API accept and refuse the same values.

Each function takes what the user wrote (a string from a command line or a query, or a number
from Python) and returns the value, or raises `ValueError` with a message naming what came and
what is expected; callers add where it came from (`--timeout`, `?timeout=`, ...).
"""

from __future__ import annotations

import math

DEFAULT_SESSION_TTL = 1800.0  # seconds an idle session keeps its state
DEFAULT_MAX_SESSIONS = 10_000  # idle sessions that keep state; the least recently used go first
DEFAULT_MAX_BODY_MB = 16.0  # the largest request body the server reads, in MiB


def _number(value: object, example: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a number of seconds, e.g. {example}, not {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        raise ValueError(f"expected a number of seconds, e.g. {example}, not {value!r}") from None


def timeout_seconds(value: object) -> float:
    """A call's timeout: a finite number of seconds greater than zero (0, negatives, nan and inf
    would cancel at once or never)."""
    seconds = _number(value, "30")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a timeout must be a finite number of seconds greater than 0, e.g. 30, not {value!r}")
    return seconds


def wait_seconds(value: object) -> float:
    """How long to wait for something: a finite number of seconds, 0 (do not wait) or more."""
    seconds = _number(value, "5")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a wait must be a finite number of seconds, 0 or more, e.g. 5, not {value!r}")
    return seconds


def session_ttl_seconds(value: object) -> float:
    """How long an idle session keeps its state: a finite number of seconds greater than zero."""
    seconds = _number(value, "1800")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a session TTL must be a finite number of seconds greater than 0, e.g. 1800, not {value!r}")
    return seconds


def size_mib(value: object) -> float:
    """A size in MiB: a finite number greater than zero."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number of MiB, e.g. 16, not {value!r}")
    try:
        mib = float(value) if isinstance(value, (int, float)) else float(str(value).strip())
    except ValueError:
        raise ValueError(f"expected a number of MiB, e.g. 16, not {value!r}") from None
    if not math.isfinite(mib) or mib <= 0:
        raise ValueError(f"expected a finite number of MiB greater than 0, e.g. 16, not {value!r}")
    return mib


def session_cap(value: object) -> int:
    """How many idle sessions keep their state: a whole number, 1 or more."""
    if isinstance(value, bool):
        raise ValueError(f"expected a whole number of sessions, 1 or more, e.g. 10000, not {value!r}")
    try:
        count = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise ValueError(f"expected a whole number of sessions, 1 or more, e.g. 10000, not {value!r}") from None
    if count < 1:
        raise ValueError(f"expected a whole number of sessions, 1 or more, e.g. 10000, not {value!r}")
    return count


def pool_mib(value: object) -> float:
    """The data plane's pool in MiB: 0 (no pool), or a finite size of at least one 4 KiB block
    (whether the shared-memory file system can hold it is flowrt.memory.keeper.pool_bytes's check)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number of MiB, e.g. 1024, or 0 for no data plane, not {value!r}")
    try:
        mib = float(value) if isinstance(value, (int, float)) else float(str(value).strip())
    except (ValueError, OverflowError):
        raise ValueError(f"expected a number of MiB, e.g. 1024, or 0 for no data plane, not {value!r}") from None
    if mib == 0:
        return 0.0
    if not math.isfinite(mib) or mib < 0:
        raise ValueError(f"expected a finite number of MiB, e.g. 1024, or 0 for no data plane, not {value!r}")
    if mib * (1 << 20) < 4096:
        shown = str(value).strip()
        raise ValueError(f"{shown} MiB is less than one block of the pool (4 KiB): give at least 0.004, or 0 for no data plane")
    return mib
