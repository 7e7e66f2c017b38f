"""When the language server checks a document, where the check runs, and which results count.

Checking a large file takes a large part of a second, so the server must neither check every
keystroke nor make the editor wait for a check. `CheckScheduler` owns that policy:

- an edit (`changed`) starts a check after a short quiet delay; further edits within the delay
  restart it, so a burst of edits is checked once, on the text of the last one;
- opening and saving (`now`) check at once;
- checks run on one worker thread, off the event loop, so hover and completion are answered
  while a check runs; each check reads a snapshot (the text and version taken on the loop when
  it starts), so edits arriving meanwhile cannot change what it sees;
- a document has at most one check in flight; a check asked for while one runs is started when
  that one ends, on the text current then;
- a result is delivered only if its version is still the document's current one and not older
  than the last delivered one; otherwise it is dropped (stale), and so is any result for a
  document closed (or closed and reopened) while it was checked.

The scheduler knows nothing of LSP: the server gives it how to read a snapshot, how to check
one and what to do with a result, so its rules can be tested with plain functions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)

Result = TypeVar("Result")

DEFAULT_DEBOUNCE_S = 0.15


@dataclass(frozen=True)
class Snapshot:
    """The text of one version of a document, as a check reads it."""

    uri: str
    version: int | None
    text: str


class _Document:
    """What the scheduler tracks for one open document."""

    __slots__ = ("delivered", "rerun", "running", "timer")

    def __init__(self) -> None:
        self.timer: asyncio.TimerHandle | None = None  # the pending debounced check
        self.running: asyncio.Future | None = None  # the check in flight
        self.rerun = False  # a check was asked for while one ran
        self.delivered: int | None = None  # the version of the last delivered result


class CheckScheduler(Generic[Result]):
    """Debounced, coalesced checks of open documents on one worker thread (see the module doc)."""

    def __init__(
        self,
        read: Callable[[str], Snapshot | None],
        check: Callable[[Snapshot], Result],
        deliver: Callable[[Snapshot, Result], None],
        debounce_s: float = DEFAULT_DEBOUNCE_S,
    ) -> None:
        self.read = read
        self.check = check
        self.deliver = deliver
        self.debounce_s = debounce_s
        # one thread: checks of every document run one after another, so a burst in one file
        # cannot start several checks competing for the interpreter
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowc-check")
        self._documents: dict[str, _Document] = {}
        self._counts = {"started": 0, "delivered": 0, "stale": 0, "failed": 0}
        self._running = 0  # checks in flight, also those of documents closed since
        self._idle_waiters: list[asyncio.Future] = []
        self._closed = False

    @property
    def debounce_s(self) -> float:
        """Seconds without edits before an edited document is checked (0: at the next turn of the loop)."""
        return self._debounce_s

    @debounce_s.setter
    def debounce_s(self, seconds: float) -> None:
        if not 0 <= seconds < float("inf"):  # also rejects NaN
            raise ValueError(f"the debounce delay must be a finite number of seconds >= 0, not {seconds!r}")
        self._debounce_s = seconds

    # ── what the server calls ──

    def changed(self, uri: str) -> None:
        """The document was edited: check it once edits have paused for the debounce delay."""
        if self._closed:
            return
        document = self._document(uri)
        if document.timer is not None:
            document.timer.cancel()
        document.timer = asyncio.get_running_loop().call_later(self.debounce_s, self._start, uri, document)

    def now(self, uri: str) -> None:
        """The document was opened or saved: check it at once (after the check in flight, if any)."""
        if self._closed:
            return
        document = self._document(uri)
        if document.timer is not None:
            document.timer.cancel()
            document.timer = None
        self._start(uri, document)

    def forget(self, uri: str) -> None:
        """The document was closed: no check starts for it and no result of it is delivered."""
        document = self._documents.pop(uri, None)
        if document is not None and document.timer is not None:
            document.timer.cancel()
            document.timer = None
        self._wake_if_idle()

    def run(self, snapshot: Snapshot) -> Awaitable[Result]:
        """Check `snapshot` on the worker and return its result to the caller only (nothing is delivered)."""
        return asyncio.get_running_loop().run_in_executor(self._worker, self.check, snapshot)

    def close(self) -> None:
        """Stop: pending checks are cancelled; the one running (if any) finishes and is dropped."""
        self._closed = True
        for uri in list(self._documents):
            self.forget(uri)
        self._worker.shutdown(wait=False, cancel_futures=True)
        self._wake_if_idle()

    async def idle(self) -> None:
        """Return once no check is running or waiting for its delay (tests and benchmarks wait on this)."""
        while self._busy():
            waiter = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(waiter)
            await waiter

    def statistics(self) -> dict[str, Any]:
        """Counts since start (`started`, `delivered`, `stale`, `failed`) and what is under way now."""
        return {
            **self._counts,
            "documents": len(self._documents),
            "waiting": self._waiting(),
            "running": self._running,
            "debounce_ms": round(self.debounce_s * 1000, 3),
        }

    # ── the rules ──

    def _document(self, uri: str) -> _Document:
        document = self._documents.get(uri)
        if document is None:
            document = self._documents[uri] = _Document()
        return document

    def _waiting(self) -> int:
        return sum(d.timer is not None for d in self._documents.values())

    def _busy(self) -> bool:
        return self._running > 0 or self._waiting() > 0

    def _wake_if_idle(self) -> None:
        if not self._busy():
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _start(self, uri: str, document: _Document) -> None:
        document.timer = None
        self._launch(uri, document)
        self._wake_if_idle()  # when nothing was launched, this was the last thing under way

    def _launch(self, uri: str, document: _Document) -> None:
        if self._closed or self._documents.get(uri) is not document:
            return
        if document.running is not None:
            document.rerun = True
            return
        snapshot = self.read(uri)
        if snapshot is None:
            return
        self._counts["started"] += 1
        self._running += 1
        running = asyncio.get_running_loop().run_in_executor(self._worker, self.check, snapshot)
        document.running = running
        running.add_done_callback(lambda future: self._finished(uri, document, snapshot, future))

    def _finished(self, uri: str, document: _Document, snapshot: Snapshot, future: asyncio.Future) -> None:
        self._running -= 1
        document.running = None
        try:
            self._settle(uri, document, snapshot, future)
        finally:
            if document.rerun:
                document.rerun = False
                self._launch(uri, document)
            self._wake_if_idle()

    def _settle(self, uri: str, document: _Document, snapshot: Snapshot, future: asyncio.Future) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            # a bug in a check must not take the server down; the next edit checks again
            self._counts["failed"] += 1
            logger.error("checking %s failed", uri, exc_info=error)
        elif self._is_current(uri, document, snapshot):
            self._counts["delivered"] += 1
            document.delivered = snapshot.version
            self.deliver(snapshot, future.result())
        else:
            self._counts["stale"] += 1

    def _is_current(self, uri: str, document: _Document, snapshot: Snapshot) -> bool:
        if self._closed or self._documents.get(uri) is not document:
            return False  # closed, or closed and opened again, while it was checked
        latest = self.read(uri)
        if latest is None or latest.version != snapshot.version:
            return False
        if snapshot.version is None and latest.text != snapshot.text:
            return False  # no versions to compare (not sent by the client): the text decides
        return document.delivered is None or snapshot.version is None or snapshot.version >= document.delivered
