"""The KV pool's side of the metadata store: a store that fails is remembered, not fatal; the
node kept registered; each session's chain as committed here, published (again, whole, after
the store lost it) when the store answers. A mixin of `KVPool` (flowrt.params.pool)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flowrt.params.meta import MetaError, MetaScriptError, MetaUnavailable

log = logging.getLogger("flowrt.params")

DONE, RETRY, REFUSED = "done", "retry", "refused"  # what publishing a session's chain came to
UNKNOWN = ""  # a page of a session's chain this process does not know (never a page key)
MAX_CHAINS = 4096  # sessions whose chains a pool remembers, to publish them again after a store lost them


class Publishing:
    """Needs of its KVPool: store, node, layout, layout_id, node_ttl, page_ttl, clock, counters,
    l2, last_meta_error, _beat_at, _published, _chains, _unpublished."""

    store: Any
    node: str
    layout: Any
    layout_id: str
    node_ttl: float
    page_ttl: float
    clock: Callable[[], float]
    counters: Any
    l2: Any
    last_meta_error: str | None
    _beat_at: float | None
    _published: set[str]
    _chains: dict[str, list[str]]
    _unpublished: dict[str, int]

    # ── metadata, tolerant of a store that fails ──

    def _meta(self, operation: Callable[[], Any]) -> Any:
        """Run one metadata operation; a MetaError is remembered and None returned."""
        try:
            result = operation()
        except MetaError as error:
            self._meta_failed(error)
            return None
        if self.last_meta_error is not None:
            log.info("KV pool `%s`: the metadata store answers again", self.layout.name)
            self.last_meta_error = None
        return result

    def _meta_failed(self, error: MetaError) -> None:
        self.counters.meta_errors += 1
        if self.last_meta_error is None:
            log.warning(
                "KV pool `%s`: the metadata store failed (%s); serving from this process's tiers", self.layout.name, error
            )
        self.last_meta_error = str(error)

    def keep_alive(self) -> None:
        """Renew this node in the metadata store when a third of its TTL has passed (register it
        again, and republish, if it lapsed); publish what waits. Called by every operation, and
        by the replica's heartbeats so an idle process's pages stay findable."""
        now = self.clock()
        if self._beat_at is not None and now - self._beat_at < self.node_ttl / 3:
            return
        alive = self._meta(lambda: self.store.heartbeat(self.node, self.node_ttl)) if self._beat_at is not None else False
        if alive is None:
            return
        if not alive:
            done = self._meta(  # the layout too: a store that restarted empty forgot it
                lambda: (
                    self.store.register_layout(self.layout)
                    and (self.store.register_node(self.node, [self.layout], self.node_ttl) or True)
                )
            )
            if done is None:
                return
            if self._beat_at is not None:  # it had lapsed: the store forgot what this node provides
                self._published.clear()
                self._unpublished = dict.fromkeys(self._chains, 0)
        self._beat_at = now
        self._flush_pending()

    def _flush_pending(self) -> None:
        for session in list(self._unpublished):
            if self.last_meta_error is not None:
                return
            if self._publish_now(session, self._unpublished[session]) != RETRY:
                self._unpublished.pop(session, None)

    def _publish_now(self, session: str, start: int) -> str:
        """Publish the session's chain from page `start` as far as L2 holds it: DONE, RETRY (the
        store is unreachable) or REFUSED (it refused the whole chain: a failing script, say).
        A store that refuses a tail (it lost the session's earlier pages) gets the whole chain."""
        chain = self._chains.get(session, [])
        if self.l2 is None:
            return DONE
        while True:
            while start < len(chain) and chain[start] == UNKNOWN:  # a gap: from the first page known here
                start += 1
            keys = chain[start:]
            slots = [self.l2.slot_of(key) for key in keys]
            cut = next((i for i, slot in enumerate(slots) if slot is None), len(keys))  # evicted since
            keys, slots = keys[:cut], slots[:cut]
            if not keys:
                return DONE
            try:
                self.store.publish(self.node, session, self.layout_id, keys, self.page_ttl, start, slots=slots)
            except MetaUnavailable as error:
                self._meta_failed(error)
                return RETRY
            except MetaError as error:
                if start == 0 or UNKNOWN in chain[:start]:  # the whole chain, or all of it known here, was refused
                    if isinstance(error, MetaScriptError):
                        self._meta_failed(error)
                    else:  # a refusal (a gap the store does not know), not a failing store
                        self.counters.publish_refused += len(keys)
                        log.info(
                            "KV pool `%s`: the metadata store refused session %s's pages: %s", self.layout.name, session, error
                        )
                    return REFUSED
                start = 0
                continue
            self._meta(lambda: None)  # (it answered: clear a remembered failure)
            self._published.update(keys)
            self.counters.published_pages += len(keys)
            return DONE
