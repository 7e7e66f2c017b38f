"""Sessions: the order of a session's calls (GCScheduler) and the state a session keeps between
them (SessionStore: the globals its roles `use`, evicted once the session is idle for too long
or too many idle sessions keep state).

A session is *active* while a call of it runs or waits for its turn; only idle sessions are
evicted, so a call never loses its state under it. Evicting a session drops its globals: its
next call starts from empty state, like a new session.

A call without a session gets one of its own (`anonymous_session`): `~` and 128 random bits, so
nobody can guess it, and no caller can name it: a session id a caller gives may not start with
`~` (`reserved`), so a client's `X-Flow-Session` never joins another's anonymous call.

Prefix scope (docs/security.md, "Prefix privacy"): a server that scopes KV prefix reuse to its
callers' API keys sets `PREFIX_SCOPE` (a context variable) to the caller's principal around the
calls it starts; the runtime writes it into the session's state of every KVCache global as
`SCOPE_KEY` when the call takes its session's turn, so it travels with the session's globals to
whichever process runs a role that `uses` one, where `ctx.kv` salts the page keys with it
(flowrt.params.session.KVSession): two scopes never share a page, one scope shares as before.

Where a role runs in another process than the one keeping its session's globals, it gets a copy
and what it set, changed or deleted goes back (`snapshot_globals`, `globals_changes`,
`apply_globals_changes`): applied key by key, so two activations changing the same key at the
same time leave the one that ended last.
"""

from __future__ import annotations

import asyncio
import pickle
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from flowrt.options import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL

ANONYMOUS = "~"  # the prefix of the sessions the runtime makes; no caller may name one
PREFIX_SCOPE: ContextVar[str | None] = ContextVar("flowrt_prefix_scope", default=None)  # None: reuse is shared
SCOPE_KEY = "~prefix_scope"  # where a KVCache global's session state carries the scope (not a role's key)


def anonymous_session() -> str:
    """A session of one call's own: unguessable, and in a namespace no caller can name."""
    return ANONYMOUS + secrets.token_urlsafe(16)


MAX_SESSION_CHARS = 256


def reserved(session: str) -> str | None:
    """Why a caller may not name `session` (it is in the runtime's own namespace), else None."""
    if session.startswith(ANONYMOUS):
        return (
            f"session ids starting with `{ANONYMOUS}` are the runtime's own (a call without a session gets one); choose another"
        )
    if len(session) > MAX_SESSION_CHARS:  # it names Redis keys and every process's tables
        return f"a session id is at most {MAX_SESSION_CHARS} characters, not {len(session):,}"
    try:
        session.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, or a header byte that is not UTF-8: no process could be told it
        return "a session id is text (UTF-8); this one holds a lone surrogate or a byte that is not UTF-8"
    return None


class GCScheduler:
    """Session FIFO: a session's graph calls run one at a time, in order; sessions are independent."""

    __slots__ = ("queues",)

    def __init__(self) -> None:
        # per session: the running call's turn (None once granted), then the waiting ones
        self.queues: dict[str, deque[asyncio.Future | None]] = {}

    def enter(self, session: str) -> bool:
        """Take the session's turn at once if no call of it is running or queued."""
        if session in self.queues:
            return False
        self.queues[session] = deque([None])  # the running call's turn, already granted
        return True

    async def acquire(self, session: str) -> None:
        """Wait for the session's turn (after `enter` said it is taken)."""
        queue = self.queues.setdefault(session, deque())
        turn = asyncio.get_running_loop().create_future()
        queue.append(turn)
        if len(queue) == 1:
            turn.set_result(None)
        try:
            await turn
        except asyncio.CancelledError:
            self._drop(session, turn)
            raise

    def release(self, session: str) -> None:
        queue = self.queues.get(session)
        if not queue:
            return
        queue.popleft()
        if queue:
            queue[0].set_result(None)
        else:
            del self.queues[session]

    def _drop(self, session: str, turn: asyncio.Future) -> None:
        queue = self.queues.get(session)
        if queue and turn in queue:
            first = queue[0] is turn
            queue.remove(turn)
            if first and queue:
                queue[0].set_result(None)
            if not queue:
                del self.queues[session]

    def statistics(self) -> dict[str, int]:
        # the first turn of each queue is the running call's; the rest wait
        return {"active_sessions": len(self.queues), "queued_calls": sum(len(q) - 1 for q in self.queues.values())}


class SessionStore:
    """The globals of idle sessions: kept for `ttl` seconds after a session's last call ended,
    and for at most `cap` idle sessions (least recently used evicted first).

    `globals` is the runtime's state of each global a role uses, keyed (session, name); `names`
    are the globals any role uses. A session that holds no state is not tracked at all.
    """

    __slots__ = ("globals", "names", "ttl", "cap", "clock", "idle", "evicted", "_timer")

    def __init__(
        self,
        globals_: dict[tuple[str, str], dict[str, Any]],
        names: list[str],
        ttl: float = DEFAULT_SESSION_TTL,
        cap: int = DEFAULT_MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.globals = globals_
        self.names = names
        self.ttl = ttl
        self.cap = cap
        self.clock = clock
        self.idle: OrderedDict[str, float] = OrderedDict()  # session -> when its last call ended, oldest first
        self.evicted = 0
        self._timer: asyncio.TimerHandle | None = None

    def busy(self, session: str) -> None:
        """A call of `session` arrived: it is not idle, so it cannot be evicted."""
        self.idle.pop(session, None)

    def rest(self, session: str) -> None:
        """The last running or queued call of `session` ended: keep its state, if any, as idle."""
        if not any((session, name) in self.globals for name in self.names):
            return
        self.idle[session] = self.clock()
        self.idle.move_to_end(session)
        self.evict()
        if self.idle and self._timer is None:
            self._schedule()

    def drop(self, session: str) -> None:
        """Forget `session`'s state now (an anonymous call's session, when it ends)."""
        self.idle.pop(session, None)
        for name in self.names:
            self.globals.pop((session, name), None)

    def evict(self) -> int:
        """Evict the idle sessions past their TTL or beyond the cap; returns how many went."""
        idle = self.idle
        if not idle:
            return 0
        expired = self.clock() - self.ttl
        gone = 0
        while idle:
            session, since = next(iter(idle.items()))
            if since > expired and len(idle) <= self.cap:
                break
            self.drop(session)
            gone += 1
        self.evicted += gone
        return gone

    def _schedule(self) -> None:
        """Wake when the oldest idle session expires, so idle state goes even without traffic."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: the next call or statistics() evicts
        oldest = next(iter(self.idle.values()))
        self._timer = loop.call_later(max(0.0, oldest + self.ttl - self.clock()), self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        self.evict()
        if self.idle:
            self._schedule()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def snapshot_globals(uses: dict | None) -> dict | None:
    """Each global's entries as pickles, to find what an activation changed."""
    if not uses:
        return None
    return {name: {key: _fingerprint(value) for key, value in state.items()} for name, state in uses.items()}


def globals_changes(before: dict | None, uses: dict | None) -> dict | None:
    """{global: (entries set or changed, keys deleted)} since `before`, or None."""
    if before is None or uses is None:
        return None
    changes = {}
    for name, state in uses.items():
        old = before.get(name, {})
        changed = {key: value for key, value in state.items() if old.get(key) != _fingerprint(value)}
        deleted = [key for key in old if key not in state]
        if changed or deleted:
            changes[name] = (changed, deleted)
    return changes or None


def apply_globals_changes(uses: dict, changes: dict | None) -> None:
    """Apply what `globals_changes` found to the session's own copy (`uses`: global -> its state)."""
    for name, (changed, deleted) in (changes or {}).items():
        state = uses.get(name)
        if state is not None:
            state.update(changed)
            for key in deleted:
                state.pop(key, None)


def _fingerprint(value: Any) -> bytes:
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:  # noqa: BLE001 - unpicklable: always counts as changed (and fails to send, clearly)
        return b""
