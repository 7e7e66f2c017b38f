"""The gateway's view of the replicas: records kept fresh by heartbeats, lapses found by sweeps.

`seen` takes a Register or Heartbeat (from either store) and reports a new incarnation as up
(and the one it replaces as down); `sweep` drops every replica not heard from within the TTL;
`drop` is for what the supervisor learns first (a process that exited). Events go to the
`on_up(record)` and `on_down(record, reason)` callbacks, once each per incarnation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from flowrt.transport.messages import Heartbeat, Register

DEFAULT_HEARTBEAT_TTL = 3.0  # seconds without a heartbeat before a replica is dropped
TOKENS_PER_ACTIVATION = 256  # in the load score, this many tokens in flight weigh one activation


def load_score(queued: int, running: int, tokens: int) -> float:
    """A replica's load as `load_aware` compares it (docs/deploy.md, "Load balancing"): its
    queued and running activations, plus tokens in flight at TOKENS_PER_ACTIVATION per
    activation, so a replica decoding long answers counts as busier than one with short ones."""
    return queued + running + tokens / TOKENS_PER_ACTIVATION


@dataclass
class Record:
    role: str
    replica: int
    incarnation: str
    address: str
    pid: int
    generators: frozenset[str]
    seen: float
    running: int = 0
    queued: int = 0
    tokens: int = 0
    beats: int = field(default=0)

    @property
    def score(self) -> float:
        return load_score(self.queued, self.running, self.tokens)


class Directory:
    def __init__(
        self,
        ttl: float,
        on_up: Callable[[Record], None],
        on_down: Callable[[Record, str], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.ttl = ttl
        self.on_up = on_up
        self.on_down = on_down
        self.clock = clock
        self.records: dict[tuple[str, int], Record] = {}
        self.gone: set[str] = set()  # incarnations dropped: their late heartbeats are ignored
        self.lapses = 0
        self.lapsed: dict[tuple[str, int], int] = {}  # lapses per (role, replica)

    def seen(self, message: Register | Heartbeat) -> None:
        key = (message.role, message.replica)
        record = self.records.get(key)
        now = self.clock()
        if message.incarnation in self.gone:
            return
        if isinstance(message, Register):
            if record is not None and record.incarnation == message.incarnation:
                record.seen = now
                return
            if record is not None:
                self._down(record, "restarted")
            record = Record(
                message.role,
                message.replica,
                message.incarnation,
                message.address,
                message.pid,
                frozenset(message.generators),
                now,
            )
            self.records[key] = record
            self.on_up(record)
            return
        if record is None or record.incarnation != message.incarnation:
            return  # a heartbeat before its registration was read, or from a replaced process
        record.seen = now
        record.running, record.queued, record.tokens = message.running, message.queued, message.tokens
        record.beats += 1

    def sweep(self) -> None:
        limit = self.clock() - self.ttl
        for record in [r for r in self.records.values() if r.seen < limit]:
            self.lapses += 1
            key = (record.role, record.replica)
            self.lapsed[key] = self.lapsed.get(key, 0) + 1
            self._down(record, f"its heartbeat lapsed (nothing heard for {self.ttl:g}s)")

    def refresh(self) -> None:
        """Count every replica as just heard from (the store lost its records and they are
        re-registering: give them one TTL)."""
        now = self.clock()
        for record in self.records.values():
            record.seen = now

    def drop(self, role: str, replica: int, incarnation: str | None, reason: str) -> Record | None:
        record = self.records.get((role, replica))
        if record is None or (incarnation is not None and record.incarnation != incarnation):
            return None
        self._down(record, reason)
        return record

    def _down(self, record: Record, reason: str) -> None:
        self.records.pop((record.role, record.replica), None)
        self.gone.add(record.incarnation)
        self.on_down(record, reason)
