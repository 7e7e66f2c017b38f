"""flowrt.params.meta: the Global Params Pool's metadata (paper §4.1.3), one interface
(`MetaStore`, in `types`) and two stores: `EmbeddedStore` (one machine, in-process, the
default) and `RedisStore` (many machines; every write a Lua script under lua/, the prefix match
one EVALSHA). `combos` holds the candidate-combination enumeration and the provider choice as
pure functions.

Decisions the stores share (documented once here):

- **Frequency** (the second sort key of candidate combinations): the sum, over a combination's
  layouts, of how many live nodes hold that layout, as of the last registration of the layout;
  higher first. See `combos`.
- **Integrity** (eviction guard 3): evicting this node's part of a page is refused
  (`last_replica`) when, before it, the page had a complete replica of some candidate
  combination among live providers and, after it, it would have none, while a live session
  (one whose chain key has not expired) references the page. `drop=True` waives this guard
  only (the caller drops the page for good); replica and run locks are never waived. A page
  with no complete replica before (a fragment), or one no live session references, may go.
- **Replica locks** (guard 1): a lock names the reader and the provider it reads from; it stops
  that provider (and only it) evicting the page, unless the reader is the provider itself.
- **Run locks** (guard 2): per session; they protect every page whose session set (the sessions
  that published it) holds a run-locked session.
- **Locations**: `publish(..., slots=)` records where the provider keeps each page (its slot,
  an int >= 0), per (page, provider), living and going with that provider of the page
  (eviction, expiry; an unregistered or lapsed node's locations are never answered). Each
  publish replaces them (slots=None: none). `match` returns the chosen providers' slots per
  segment in the same round trip; `locate` answers one provider's slots.
"""

from __future__ import annotations

from flowrt.params.meta.embedded import EmbeddedStore
from flowrt.params.meta.types import (
    EVICTED,
    LAST_REPLICA,
    NOT_PROVIDER,
    REPLICA_LOCK,
    RUN_LOCK,
    Eviction,
    Match,
    MetaError,
    MetaScriptError,
    MetaStore,
    MetaUnavailable,
    Provider,
    Segment,
)

__all__ = [
    "EVICTED",
    "LAST_REPLICA",
    "NOT_PROVIDER",
    "REPLICA_LOCK",
    "RUN_LOCK",
    "EmbeddedStore",
    "Eviction",
    "Match",
    "MetaError",
    "MetaScriptError",
    "MetaStore",
    "MetaUnavailable",
    "Provider",
    "Segment",
    "open_store",
]


def open_store(url: str | None, deployment: str) -> MetaStore:
    """The embedded store for None or "embedded", else the Redis store at `url`."""
    if url is None or url == "embedded":
        return EmbeddedStore(deployment)
    from flowrt.params.meta.redis_store import RedisStore

    return RedisStore.connect(url, deployment)
