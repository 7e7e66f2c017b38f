"""The runtime's log on stderr, as `flowc run` and `python -m BUNDLE` show it.

flowrt logs through the `flowrt` logger (role errors, the server's own errors) and gives each
role `ctx.logger`, a child of it (`flowrt.BUNDLE`). `show_log` sends them, and aiohttp's own
warnings, to stderr, so stdout carries only a call's events (`--once`) or the server's banner:
at INFO one line per record, tracebacks left out; with `debug`, DEBUG records too and every
traceback in full.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "flowrt: %(levelname)s %(name)s: %(message)s"


class _Brief(logging.Formatter):
    """A record's message without its traceback, saying where to find it."""

    def format(self, record: logging.LogRecord) -> str:
        if not record.exc_info and not record.exc_text:
            return super().format(record)
        brief = logging.makeLogRecord(record.__dict__)
        brief.exc_info = None
        brief.exc_text = None
        return super().format(brief) + " (--debug shows the traceback)"


def show_log(debug: bool = False) -> logging.Handler:
    """Send the `flowrt` logger's records to stderr (tracebacks only with `debug`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT) if debug else _Brief(FORMAT))
    logger = logging.getLogger("flowrt")
    for old in [h for h in logger.handlers if getattr(h, "_flowrt_stderr", False)]:
        logger.removeHandler(old)
    handler._flowrt_stderr = True  # type: ignore[attr-defined] - so a second call replaces, not doubles, it
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.INFO)
    logger.propagate = False
    # aiohttp logs what it answers itself (a request it cannot parse) with a traceback: one line here too
    server = logging.getLogger("aiohttp")
    for old in [h for h in server.handlers if getattr(h, "_flowrt_stderr", False)]:
        server.removeHandler(old)
    server.addHandler(handler)
    server.setLevel(logging.DEBUG if debug else logging.WARNING)
    server.propagate = False
    return handler
