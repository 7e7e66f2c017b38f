"""The MemoryManagerClient of one process: requests to its machine's manager, and the maps.

Requests that need an answer (allocate, take a ref on a block being forwarded, claim weights)
are synchronous round trips with a deadline: a manager that does not answer in `timeout`
seconds raises `MemoryUnavailable` naming it, which fails the activation that asked, never
the process. After such a timeout the client does not wait again for a manager that shows no
sign of life: until `timeout` more seconds have passed, a request fails at once, unless the
manager has answered since (a late answer: it was stopped or busy) or a manager has accepted the
socket's connection since (the supervisor restarted it: the socket reconnects by itself, and a
socket monitor tells the client). A request made while the connection is down waits a moment
(RECONNECT_WAIT) for a restarted manager to take it, and the error says what is true now.
Frees and the gateway's refs are sent without waiting, in order on the same socket, so a
block's refs never drop to 0 on the way. The client maps the manager's slab once
(shared, for what this process writes) and each received block on its own (private,
copy-on-write; `views` finds the block behind any address of one, for forwarding).
Given a deployment's `keys`, the socket authenticates (flowrt.transport.keys) with the
`as_` key: it talks only to the deployment's manager, which admits only the deployment.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import threading
import time
import weakref
from collections import deque
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from flowrt.errors import FlowrtError
from flowrt.memory import protocol as p
from flowrt.memory.slab import Mapping, address_of

REQUEST_TIMEOUT = 5.0  # seconds a manager has to answer before it counts as gone
RECONNECT_IVL_MS = 50  # how often the socket tries to reach a manager that went away
RECONNECT_WAIT = 0.2  # seconds a request waits, while the connection is down, for a restarted manager to take it


class MemoryError_(FlowrtError):
    """Base of the data plane's errors (the name avoids Python's own MemoryError)."""


class MemoryUnavailable(MemoryError_):
    """The machine's memory manager did not answer (it died, or is restarting)."""


class MemoryRefused(MemoryError_):
    """The manager answered with a refusal (the pool is exhausted, a block is unknown...);
    `code` says which kind where code acts on it (protocol.NO_ROOM, protocol.STALE)."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code


class View:
    """A received block mapped privately in this process."""

    __slots__ = ("start", "end", "slab", "epoch", "block", "offset")

    def __init__(self, start: int, end: int, slab: str, epoch: str, block: int, offset: int):
        self.start, self.end, self.slab, self.epoch, self.block, self.offset = start, end, slab, epoch, block, offset


class MemoryClient:
    def __init__(
        self,
        endpoint: str,
        kind: str,
        name: str,
        *,
        timeout: float = REQUEST_TIMEOUT,
        participants: int = 1,
        colocated: str = "",
        keys: Any = None,
        as_: str = "member",
    ):
        self.endpoint = endpoint
        self.kind = kind
        self.name = name
        self.timeout = timeout
        self.participants = participants  # processes on this machine a kv_pool_barrier waits for by default
        self.colocated = colocated  # the role whose GPUs this process's role shares (or its own): the default barrier's scope
        self.process = str(os.getpid())
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        if keys is not None:
            keys.dial(self.socket, as_, endpoint)
        # the connection's ups and downs: a manager restarted on the endpoint is taken at once
        self.monitor = self.socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.link_up = True  # whether the connection to a manager is up, as the monitor last told
        self.socket.connect(endpoint)
        self.lock = threading.RLock()
        self.queued: deque[bytes] = deque()  # posted, not sent yet (see `post`)
        self.sending = False
        self.reqs = itertools.count(1)
        self.epoch = ""
        self.epochs: set[str] = set()  # every manager this client has talked to (the current one's and those before)
        self.mapping: Mapping | None = None
        self.mappings: dict[str, Mapping] = {}  # slab path -> its mapping (an old manager's too, while views need it)
        self.starts: list[int] = []  # sorted start addresses of live views
        self.views: dict[int, View] = {}
        self.quiet_until = 0.0  # after a request timed out: fail fast until then (the caller's loop keeps running)
        self.quiet_for = timeout  # how long that request had waited
        self.quiet_since = 0.0  # when it timed out
        self.quiet_what = ""  # what it asked
        self.settled: dict[str, tuple[int, int]] = {}  # kv_pool_barrier groups this process passed: participants, value
        self.request(p.Hello(p.VERSION, 0, int(self.process), kind, name))

    # ── requests ──

    def request(self, message: p.Request, timeout: float | None = None) -> p.Reply:
        """Send `message` and wait for its answer; MemoryUnavailable or MemoryRefused."""
        timeout = self.timeout if timeout is None else timeout
        with self.lock:
            taken, _ = self._watch_link()  # (from here on, news is news of this request's time)
            if time.monotonic() < self.quiet_until and not self._back(taken):
                raise MemoryUnavailable(self._still_quiet())
            self.sending = True
            try:
                self._send_queued()  # what was posted goes first: a request never overtakes a free
                message.req = next(self.reqs)
                self.socket.send(p.encode(message))
                deadline = time.monotonic() + timeout
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self.socket.poll(int(remaining * 1000) + 1):
                        # one wait per `timeout`, not one per request: a process whose loop sends many
                        # requests stays responsive (its heartbeats go out) while the manager is away
                        taken, dropped = self._watch_link()
                        if taken and dropped and self.link_up:  # the manager died and another took the connection
                            raise MemoryUnavailable(  # (no quiet: the new one is there)
                                f"the memory manager at {self.endpoint} was restarted while {type(message).__name__} "
                                f"waited for its answer ({timeout:g}s): the request went to the one that died; "
                                "the next request goes to the new one"
                            )
                        self.quiet_since = time.monotonic()
                        self.quiet_until, self.quiet_for = self.quiet_since + timeout, timeout
                        self.quiet_what = type(message).__name__
                        raise MemoryUnavailable(
                            f"the memory manager at {self.endpoint} did not answer {type(message).__name__} within "
                            f"{timeout:g}s (it died or is restarting; the deployment's supervisor restarts it)"
                        )
                    try:
                        reply = p.decode_reply(self.socket.recv())
                    except p.Garbage:
                        continue
                    if reply.req == message.req:
                        break  # (answers to requests that timed out earlier are skipped)
                self._follow(reply)
            finally:
                self.sending = False
            self._send_queued()  # posted meanwhile (a finalizer that ran inside this request)
        if reply.error:
            raise MemoryRefused(reply.error, reply.code)
        if type(message) is p.Arrive and "value" in reply.data:
            self.settled[message.group] = (message.participants, int(reply.data["value"]))
        return reply

    def _watch_link(self, wait: float = 0.0) -> tuple[bool, bool]:
        """Read what the socket monitor told since the last call (waiting up to `wait` seconds
        for news): whether a manager accepted the connection meanwhile, and whether one dropped
        it. Under `lock`."""
        taken = dropped = False
        deadline = time.monotonic() + wait
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.monitor.poll(int(remaining * 1000) + 1):
                    return taken, dropped
                continue
            except zmq.ZMQError:
                return taken, dropped
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.link_up = taken = True
                deadline = 0.0  # (news came: no more waiting)
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.link_up, dropped = False, True

    def _back(self, taken: bool) -> bool:
        """During the quiet period after a timeout: whether the manager has shown it is there
        since (a late answer waits on the socket, or a manager accepted the connection: `taken`,
        the supervisor restarted it); a connection that is down gets RECONNECT_WAIT to come back.
        Ends the quiet period if so. Under `lock`."""
        if not taken and not self.link_up:
            taken = self._watch_link(RECONNECT_WAIT)[0]
        if taken or self.socket.poll(0):
            self.quiet_until = 0.0
            return True
        return False

    def _still_quiet(self) -> str:
        """What is true now of a manager that timed out a moment ago and has shown no sign since."""
        now = time.monotonic()
        said = (
            f"the memory manager at {self.endpoint} did not answer {self.quiet_what} within {self.quiet_for:g}s "
            f"({now - self.quiet_since:.1f}s ago)"
        )
        if not self.link_up:
            return (
                f"{said}, and no memory manager has accepted this process's connection since: it is down "
                "(the deployment's supervisor restarts it; requests are tried again as soon as one is back)"
            )
        return (
            f"{said}, and has not answered since though its connection is open (it is stopped or overloaded); "
            f"requests fail at once for {self.quiet_until - now:.1f}s more unless it answers"
        )

    def resettle(self) -> None:
        """Tell the manager the kv_pool_barrier sizes this process agreed on (a manager that
        restarted since does not know them; one that does ignores this). Called now and then."""
        for group, (participants, value) in self.settled.items():
            self.post(p.Settled(p.VERSION, 0, group, participants, value))

    def post(self, message: p.Request) -> None:
        """Send `message` without waiting (req 0: no answer comes). Safe from a finalizer that
        runs in the middle of another send: it is queued, and sent once that one is done."""
        message.req = 0
        self.queued.append(p.encode(message))
        if not self.sending:
            with self.lock:
                self._send_queued()

    def _send_queued(self) -> None:
        outer, self.sending = self.sending, True
        try:
            while self.queued:
                data = self.queued.popleft()
                with contextlib.suppress(zmq.ZMQError):  # the manager is gone: what it held died with it
                    self.socket.send(data, zmq.NOBLOCK)
        finally:
            self.sending = outer

    def _follow(self, reply: p.Reply) -> None:
        if reply.epoch and reply.epoch != self.epoch:
            self.epoch = reply.epoch
            self.epochs.add(reply.epoch)
            self.mapping = self.mapped(reply.slab)

    def knows(self, epoch: str) -> bool:
        """Whether `epoch` is a manager this client talks to (or did): after asking the
        manager again, in case it was restarted since this client last heard from it. A
        handle of any other manager (another machine's) must not be mapped or adopted here."""
        if epoch in self.epochs:
            return True
        self.request(p.Hello(p.VERSION, 0, int(self.process), self.kind, self.name))
        return epoch in self.epochs

    def mapped(self, path: str) -> Mapping:
        mapping = self.mappings.get(path)
        if mapping is None:
            try:
                mapping = self.mappings[path] = Mapping(path)
            except FileNotFoundError:
                raise MemoryUnavailable(
                    f"shared memory {path} is gone: the memory manager that held it died (it restarts with a new pool)"
                ) from None
        return mapping

    # ── blocks ──

    def alloc(self, nbytes: int, call: str = "", process: str = "", cache_key: str = "") -> p.Reply:
        return self.request(p.Alloc(p.VERSION, 0, nbytes, call, process or ("" if call else self.process), cache_key))

    def writable(self, reply: p.Reply) -> Any:
        """The shared mapping where block `reply` lies (this process writes into it)."""
        assert self.mapping is not None
        return self.mapping.map

    def view(self, slab: str, epoch: str, block: int, offset: int, size: int) -> Any:
        """Block `block` of slab `slab` mapped privately here (copy-on-write)."""
        mapping = self.mappings.get(slab) if epoch != self.epoch else self.mapping
        if mapping is None or mapping.path != slab:
            mapping = self.mapped(slab)
        buffer = mapping.private_view(offset, size)
        start = address_of(buffer)
        record = View(start, start + size, slab, epoch, block, offset)
        with self.lock:
            bisect.insort(self.starts, start)
            self.views[start] = record
        weakref.finalize(buffer, self._unview, start)
        return buffer

    def _unview(self, start: int) -> None:
        with self.lock:
            self.views.pop(start, None)
            i = bisect.bisect_left(self.starts, start)
            if i < len(self.starts) and self.starts[i] == start:
                del self.starts[i]

    def find_view(self, address: int, nbytes: int) -> View | None:
        """The received view holding [address, address+nbytes), if any."""
        with self.lock:
            i = bisect.bisect_right(self.starts, address) - 1
            if i < 0:
                return None
            view = self.views.get(self.starts[i])
        if view is None or address + nbytes > view.end:
            return None
        return view

    def slab_offset(self, address: int, nbytes: int) -> int | None:
        """Where [address, address+nbytes) lies in this process's shared map of the slab."""
        located = self.locate(address, nbytes)
        return None if located is None else located[0]

    def locate(self, address: int, nbytes: int) -> tuple[int, str] | None:
        """`slab_offset`, and the epoch of the manager whose slab that is (read together: a
        RefAt names it, so that a manager started since refuses instead of answering with
        whatever block of its own lies at that offset)."""
        with self.lock:
            mapping, epoch = self.mapping, self.epoch
        if mapping is None or not mapping.address <= address or address + nbytes > mapping.address + mapping.size:
            return None
        return address - mapping.address, epoch

    def statistics(self, timeout: float | None = None) -> dict:
        return dict(self.request(p.Statistics(p.VERSION, 0), timeout).data)

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.socket.disable_monitor()
        self.context.destroy(linger=0)
        for mapping in self.mappings.values():
            mapping.close()
        self.mappings.clear()
