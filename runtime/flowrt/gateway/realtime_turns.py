"""The records of one /v1/realtime connection's conversation (flowrt.gateway.realtime): a `Turn`
(one call of the graph: the audio of one user turn in, one response out) and its `Response`.
They hold state only; the connection's `Connection` drives them. Imports nothing of the gateway
but the event shapes."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from flowrt.gateway import realtime_events as wire
from flowrt.gateway.openai_request import TokenCounts
from flowrt.observe.audio import AudioClock


class Response:
    """One response: its ids, the settings it was asked under, its text so far, how it stops."""

    def __init__(self, settings: wire.Settings):
        self.id, self.item_id = wire.new_id("resp"), wire.new_id("item")
        self.settings = settings
        self.text: list[str] = []
        self.stopped: str | None = None  # why the client stopped it: `client_cancelled` or `turn_detected`
        self.failure: wire.RealtimeError | None = None  # the graph sent what cannot be an answer
        self.usage: TokenCounts | None = None  # what the graph reported of its generation (response.done's usage)
        self.finished = asyncio.Event()  # its response.done is sent


class Turn:
    """One call of the graph: the audio of one user turn in, one response out."""

    def __init__(self, ahead: Turn | None, settings: wire.Settings, graph: str):
        self.item_id = wire.new_id("item")
        self.clock = AudioClock(graph, time.perf_counter(), streaming=True)  # time to first audio (flowrt.observe.audio)
        self.ahead = ahead
        self.settings = settings  # at its first append: the input's rate, the session entry's value
        self.inbox: asyncio.Queue[tuple[str, Any, int]] = asyncio.Queue()
        self.pending = 0  # bytes of audio in the inbox
        self.committed = False
        self.dropped = False  # cleared, or refused: no response will answer it
        self.response: Response | None = None
        self.held: deque[dict] = deque()  # events made before its response was asked for
        self.out = asyncio.Lock()  # the response's events leave in order, held ones first
        self.handle: Any = None
        self.admitted = False  # its call has started (a call still waiting is stopped, not interrupted)
        self.go = asyncio.Event()  # start now (a barge-in, or the turn is over before it started)
        self.interrupt = False  # start with `interrupt=True`
        self.taking = asyncio.Event()  # clear while a barge-in's call is on its way to interrupt this one
        self.taking.set()
        self.retired = asyncio.Event()
        self.failure: wire.RealtimeError | None = None  # why its call did not run or ended badly
        self.done: dict | None = None
        self.work: asyncio.Task | None = None  # waiting its turn, then its call: what `stop` cancels
        self.task: asyncio.Task | None = None  # `work`, then the turn retired (never cancelled)
