"""The calls in flight, for `GET /stats` (`in_flight`) and `flowc top`: an observer
(flowrt.observe.hooks) that keeps, for each call that has started and not yet ended, its graph,
call id (the control core's, as traces and logs carry it), session and when it started.

It hears only of calls, not of activations, so it costs two dictionary updates per call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from flowrt.observe.hooks import Observer


class CallsInFlight(Observer):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.running: dict[Any, tuple[str, str, float]] = {}  # call id -> (graph, session, started)

    def call_started(self, call: Any) -> None:
        self.running[call.call_id] = (call.graph, call.session, self.clock())

    def call_ended(self, call: Any, status: str) -> None:
        self.running.pop(call.call_id, None)

    def listing(self) -> list[dict[str, Any]]:
        """The calls in flight, oldest first: graph, call_id, session, age_s (seconds since it started)."""
        now = self.clock()
        calls = sorted(self.running.items(), key=lambda item: item[1][2])
        return [
            {"graph": graph, "call_id": call_id, "session": session, "age_s": round(now - started, 3)}
            for call_id, (graph, session, started) in calls
        ]
