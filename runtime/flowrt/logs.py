"""The runtime's log on stderr, as `flowc run` and `python -m BUNDLE` show it: text lines for
people, or JSON lines for log collectors (`--log-format json`).

flowrt logs through the `flowrt` logger (role errors, the server's own errors) and gives each
role `ctx.logger`, a child of it (`flowrt.BUNDLE`). `show_log` sends them, and aiohttp's own
warnings, to stderr, so stdout carries only a call's events (`--once`) or the server's banner.

Text: at INFO one line per record, tracebacks left out; with `debug`, DEBUG records too and
every traceback in full. The events below that are not warnings (a call started, a replica up)
are JSON's alone unless `debug`: the text log says what went wrong, as it always has.

JSON: one object per line per record, always with `ts` (ISO 8601, UTC), `level`, `event`,
`msg`, and `call_id`, `session`, `role`, `replica` (null where they do not apply), then the
event's own fields (`logger`; `traceback` with `debug`). Events: `server_started`,
`server_stopping`, `call_started`, `call_ended` (`status`, `graph`, `duration_s`), `role_error`,
`replica_started`, `replica_ready`, `replica_down`, `heartbeat_lapse`, `replica_restarting`,
`replica_output` (a replica's own stderr line); anything else logged (a role's own
`ctx.logger` lines, Python's warnings) is `log`. docs/observe.md has the table. A record logged while an activation runs
(the core's line for a role's failure, a role's own lines) carries that activation's call id,
session, role and replica: `CallLog`, the observer that logs calls, keeps them in a context
variable (`SCOPE`) for the activation's task, and a replica process does the same for the
activations it runs. The call ids are the control core's, the ones traces carry (`call_id`
in flowrt.observe.trace).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

FORMAT = "flowrt: %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")
KEYS = ("call_id", "session", "role", "replica")  # in every JSON line, null where they do not apply
FIELDS = "flowrt"  # the LogRecord attribute holding an event's fields (`extra=event(...)`)
log = logging.getLogger("flowrt.calls")


class Scope:
    """Whose work runs now, for the records logged meanwhile: a call's activation (its replica
    read when a record is written: it is chosen once the activation starts) or a replica's."""

    __slots__ = ("act", "call_id", "replica", "role", "session")

    def __init__(self, call_id: Any, session: Any, role: Any, replica: Any = None, act: Any = None):
        self.call_id, self.session, self.role, self.replica, self.act = call_id, session, role, replica, act

    def fields(self) -> dict[str, Any]:
        replica = self.act.replica if self.act is not None else self.replica
        return {
            "call_id": self.call_id,
            "session": self.session,
            "role": self.role,
            "replica": replica if isinstance(replica, int) and replica >= 0 else None,  # (-2: broadcast, every replica)
        }


SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("flowrt_log_scope", default=None)


def event(name: str, **fields: Any) -> dict[str, Any]:
    """What to pass as a logging call's `extra` for a structured event: its name and fields,
    `call_id`, `session`, `role` and `replica` always among them (None unless given)."""
    return {FIELDS: {"event": name, **dict.fromkeys(KEYS), **fields}}


def dropped(record: Any, reason: str) -> dict[str, Any]:
    """The event of a replica the registry dropped (`record`: its flowrt.registry.Record)."""
    name = "heartbeat_lapse" if "lapsed" in reason else "replica_down"
    return event(name, role=record.role, replica=record.replica, reason=reason)


class JsonLines(logging.Formatter):
    """One JSON object per record (the module docstring lists its keys)."""

    def __init__(self, debug: bool = False, defaults: dict[str, Any] | None = None):
        super().__init__()
        self.debug = debug
        self.defaults = defaults or {}  # a replica process's role and replica

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": "role_error" if record.funcName == "log_failure" else "log",  # (flowrt.control.contract)
            "msg": _message(record),
            **dict.fromkeys(KEYS),
            **self.defaults,
        }
        scope = SCOPE.get()
        if scope is not None:
            data.update(scope.fields())
        data.update(getattr(record, FIELDS, None) or {})
        data["logger"] = record.name
        if self.debug and record.exc_info:
            data["traceback"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str, ensure_ascii=False)


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # noqa: BLE001 - a record whose arguments do not format: say so, do not lose the line
        return f"{record.msg!r} (its arguments could not be formatted)"


class _Brief(logging.Formatter):
    """A record's message without its traceback, saying where to find it."""

    def format(self, record: logging.LogRecord) -> str:
        if not record.exc_info and not record.exc_text:
            return super().format(record)
        brief = logging.makeLogRecord(record.__dict__)
        brief.exc_info = None
        brief.exc_text = None
        return super().format(brief) + " (--debug shows the traceback)"


class _Stderr(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record comes (a progress display that
    redirects it while it draws, say, prints the record above itself)."""

    @property
    def stream(self) -> Any:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _not_quiet_events(record: logging.LogRecord) -> bool:
    """Text log: the events that are not warnings are JSON's (and --debug's) alone."""
    return record.levelno >= logging.WARNING or not hasattr(record, FIELDS)


FOREIGN_LOGGERS = ("aiohttp", "opentelemetry", "urllib3")


class _MalformedRequests(logging.Filter):
    """aiohttp logs an ERROR for every request it cannot parse (a header too large, a smuggling
    attempt), which it has already answered 400: anyone could fill the log with them. Without
    --debug the first is logged and then one in MALFORMED_EVERY, each saying how many went unlogged."""

    MALFORMED_EVERY = 1000

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import BadHttpMessage  # (only aiohttp's server logs here)

        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, BadHttpMessage):
            return True
        self.seen += 1
        if self.seen != 1 and self.seen % self.MALFORMED_EVERY:
            return False
        record.msg = f"{record.msg} (malformed requests so far: {self.seen}; each was answered 400; --debug logs every one)"
        return True


def show_log(debug: bool = False, log_format: str = "text", defaults: dict[str, Any] | None = None) -> logging.Handler:
    """Send the `flowrt` logger's records to stderr as text (tracebacks only with `debug`) or
    JSON lines (`log_format`; `defaults`: fields of every line, a replica's role and replica)."""
    if log_format not in FORMATS:
        raise ValueError(f"the log format is text or json, not {log_format!r}")
    handler = _Stderr()
    if log_format == "json":
        handler.setFormatter(JsonLines(debug, defaults))
    else:
        handler.setFormatter(logging.Formatter(FORMAT) if debug else _Brief(FORMAT))
        if not debug:
            handler.addFilter(_not_quiet_events)
    handler._flowrt_stderr = True  # type: ignore[attr-defined] - so a second call replaces, not doubles, it
    logger = logging.getLogger("flowrt")
    for old in [h for h in logger.handlers if getattr(h, "_flowrt_stderr", False)]:
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.INFO)
    logger.propagate = False
    # libraries that log on their own go through the same handler (JSON lines stay JSON): aiohttp
    # (a request it cannot parse, with a traceback: one line here too) and OpenTelemetry's OTLP
    # exporter (a collector it cannot reach, over urllib3)
    for name in FOREIGN_LOGGERS:
        foreign = logging.getLogger(name)
        for old in [h for h in foreign.handlers if getattr(h, "_flowrt_stderr", False)]:
            foreign.removeHandler(old)
        foreign.addHandler(handler)
        foreign.setLevel(logging.DEBUG if debug else logging.WARNING)
        foreign.propagate = False
    server_log = logging.getLogger("aiohttp.server")
    for old in [f for f in server_log.filters if isinstance(f, _MalformedRequests)]:
        server_log.removeFilter(old)
    if not debug:
        server_log.addFilter(_MalformedRequests())
    # Python's warnings (a stale compiled core, say): JSON lines too, where stderr holds only those
    logging.captureWarnings(log_format == "json")
    warnings_log = logging.getLogger("py.warnings")
    for old in [h for h in warnings_log.handlers if getattr(h, "_flowrt_stderr", False)]:
        warnings_log.removeHandler(old)
    if log_format == "json":
        warnings_log.addHandler(handler)
        warnings_log.propagate = False
    return handler


def log_format() -> str:
    """How `show_log` last set the log up: "json" or "text" (what a deployment tells the
    replica processes it starts, and whether calls are logged)."""
    for handler in logging.getLogger("flowrt").handlers:
        if getattr(handler, "_flowrt_stderr", False):
            return "json" if isinstance(handler.formatter, JsonLines) else "text"
    return "text"


class CallLog:
    """An observer that logs each call's start and end, and scopes the records logged while an
    activation runs to it (`SCOPE`). It has flowrt.observe.hooks' four hooks without deriving
    from its Observer: a base module imports no flowrt package (tests/runtime/test_layout.py)."""

    frames = False  # (the frames activations consumed are not wanted)

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.started: dict[Any, float] = {}

    def call_started(self, call: Any) -> None:
        self.started[call.call_id] = self.clock()
        log.info(
            "call %s of graph `%s` started (session %s)",
            call.call_id,
            call.graph,
            call.session,
            extra=event("call_started", call_id=call.call_id, session=call.session, graph=call.graph),
        )

    def activation_started(self, call: Any, act: Any) -> None:
        SCOPE.set(Scope(call.call_id, call.session, act.node.role, act=act))

    def activation_ended(self, call: Any, act: Any, reason: Any) -> None:
        SCOPE.set(None)

    def call_ended(self, call: Any, status: str) -> None:
        began = self.started.pop(call.call_id, None)
        duration = None if began is None else round(self.clock() - began, 6)
        log.info(
            "call %s of graph `%s` ended: %s",
            call.call_id,
            call.graph,
            status,
            extra=event(
                "call_ended",
                call_id=call.call_id,
                session=call.session,
                graph=call.graph,
                status=status,
                errors=len(call.errors),
                duration_s=duration,
            ),
        )
