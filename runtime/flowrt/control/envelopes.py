"""The messages of a call spread over processes (flowrt.control.shards), as the control core
sees them: what each asks (its kind), the envelope, and which process hosts what. The transport
(flowrt.deploy.peers; the tests' fabric) carries them; this module imports nothing of flowrt.
"""

from __future__ import annotations

from typing import Any

# signals, routed to the process hosting their consumer
ARRIVE, END, UNREACHABLE, FIRE, JOIN_FRAME, CALLER_FRAME, ERRORED = range(7)
# the call as a whole: the gateway's decisions at quiescence, credit coming back, aborts
RESOLVE, RELEASE, RETURN, CREDIT, ABORT, CANCEL, CLOSE = range(7, 14)
# the session's globals, which the gateway keeps: a copy asked for, sent, and what changed
GLOBALS_GET, GLOBALS, GLOBALS_PUT = range(14, 17)
# an `lb broadcast` activation's run on another replica (for its side effects), and its end
EXTRA, EXTRA_DONE = range(17, 19)
# a process went down: which calls sent it work, asked of every other process, and the answer
TOUCHED_ASK, TOUCHED = range(19, 21)
# an activation of `lb load_aware` work a process sent has ended (flowrt.control.shard_loads)
LOAD_DONE = 21
KINDS = 22


class Envelope:
    """One message between shards: which call, from whom, what, and the credit it carries (None: it starts no work)."""

    __slots__ = ("call_id", "graph", "session", "sender", "kind", "body", "credit", "down", "wire")

    def __init__(
        self,
        call_id: int,
        graph: str,
        session: str,
        sender: int,
        kind: int,
        body: tuple,
        credit: Any,
        down: frozenset = frozenset(),
    ):
        self.call_id, self.graph, self.session, self.sender = call_id, graph, session, sender
        self.kind, self.body, self.credit = kind, body, credit
        self.down = down  # the processes the call routes around (flowrt.control.shard_faults)
        self.wire: Any = None  # the body as the transport encoded it when it was sent (flowrt.deploy.peers)


class Placement:
    """Which process hosts what: `gateway`, and each role's replicas' processes in replica order."""

    def __init__(self, gateway: int, hosts: dict[str, tuple[int, ...]]):
        self.gateway = gateway
        self.hosts = hosts
        self.processes = frozenset({gateway, *(p for ps in hosts.values() for p in ps)})
