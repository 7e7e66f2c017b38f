"""What roles hold of the Global Params Pool: `ctx.kv(name)` (docs/kv.md).

- `KVPools`: the pools of one process, one per `global NAME: KVCache { ... }` of the bundle,
  made on first use from the global's settings (`capacity` per tier, `tiers`), sharing one
  metadata store (embedded, or Redis when FLOWRT_KV_META names one).
- `KVSession`: one activation's handle on one pool for its session. Every page it matches or
  allocates is held for the activation (its `owner`) until `release`, which `async with` does;
  inside `async with`, the session's run lock tells every node of the deployment not to evict
  the session's pages while it runs.

    async with ctx.kv("kv") as kv:
        keys = kv.keys(tokens)                  # chained page hashes of the full pages
        hit = await kv.match(keys)              # the cached prefix, in L1 slots hit.slots
        slots = kv.allocate(keys[hit.pages:])   # L1 slots for the rest; write K/V there
        ...                                     # kv.stack("0", "k")[slots] = ...
        kv.commit(keys[hit.pages:], start=hit.pages)

A handle with a `scope` (the caller's API key's principal, where the server scopes prefix reuse
to keys: docs/security.md, "Prefix privacy") salts every page key it is given before the pool
sees it: the pool's key is BLAKE2b-128 of the role's key under the scope, so the pages of two
scopes never match, whatever their tokens, and a role's keys mean what they meant within one.

An engine that reuses a prefix says what it reused and computed with `kv.count_prefix(hit=,
computed=, recomputed=)`: the pool keeps the sums per role (its `statistics()`'s
`prefix_tokens`), which /metrics exports as `flowrt_prefix_tokens_total` (docs/observe.md).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flowrt.errors import BadInput, FlowrtError
from flowrt.params.layout import KVLayout
from flowrt.params.meta import MetaError, MetaStore, open_store
from flowrt.params.pool import KVPool, Prefix, SharedPages, default_node
from flowrt.params.slots import PageLoadAbandoned, SlotError, SlotsExhausted

DEFAULT_CAPACITY = 64 << 20  # bytes of each tier of a global that sets no `capacity`
DEFAULT_TIERS = ("device", "host")
META_ENV = "FLOWRT_KV_META"  # the metadata store: unset or "embedded", else a redis:// URL
DIR_ENV = "FLOWRT_KV_DIR"  # where the disk tier's files go (default: TMPDIR/flowrt-kv)
RUN_LOCK_TTL = 300.0  # a run lock outlives a process that died holding it by at most this

Hasher = Callable[[Any, int], list[str]]  # (tokens, page_tokens) -> chained page hashes


class KVError(FlowrtError):
    """A KV pool that cannot be used as asked (an unknown global, no torch, a bad setting)."""


class KVRequestTooLarge(KVError, BadInput):
    """A request whose pages could never fit the device tier at once (a prompt too long)."""


def tier_pages(layout: KVLayout, settings: Mapping[str, Any]) -> dict[str, int]:
    """Pages of each tier a global's settings ask for: `capacity` bytes on each tier of `tiers`."""
    tiers = tuple(settings.get("tiers") or DEFAULT_TIERS)
    if "device" not in tiers:
        raise KVError(f"global `{layout.name}`: `tiers` must include device (L1, where attention reads pages)")
    capacity = int(settings.get("capacity", DEFAULT_CAPACITY))
    pages = layout.pages_in(capacity)
    if pages < 1:
        raise KVError(
            f"global `{layout.name}`: capacity {capacity} bytes holds no page of {layout.page_bytes} bytes; "
            f"raise `capacity` to at least {layout.page_bytes}"
        )
    return {tier: (pages if tier in tiers else 0) for tier in ("device", "host", "disk")}


class KVSession:
    """One activation's handle on one pool for one session (see the module docstring)."""

    def __init__(
        self, pool: KVPool, session: str, owner: str, hasher: Hasher | None = None, role: str = "", scope: str | None = None
    ):
        self.pool = pool
        self.session = session
        self.owner = owner
        self.hasher = hasher
        self.role = role  # the role whose activation holds it (what `count_prefix` counts for)
        self.scope = scope  # prefix reuse only among handles of the same scope (None: shared)
        self._salt = None if scope is None else hashlib.blake2b(scope.encode(), digest_size=32, person=b"flowkv-scope").digest()
        self._run_locked = False
        self._entered = False

    @property
    def layout(self) -> KVLayout:
        return self.pool.layout

    def keys(self, tokens: Any) -> list[str]:
        """The chained hashes of the full pages of `tokens` (a trailing partial page has none)."""
        if self.hasher is None:
            raise KVError("page hashing is not available in this process (flowrt.compute); pass page keys instead")
        return self.hasher(tokens, self.layout.page_tokens)

    async def match(self, keys: Sequence[str]) -> Prefix:
        """The longest cached prefix of `keys`, in L1 and held until the `async with` ends."""
        keys = self._scoped(self._checked("match", keys))
        try:
            return await self.pool.match(self.session, keys, self.owner)
        except SlotsExhausted as error:
            raise self._full(error) from None
        except PageLoadAbandoned as error:
            raise KVError(f"kv.match(): {error}, again and again; try the call again") from None

    def allocate(self, keys: Sequence[str]) -> list[int]:
        """L1 slots for pages `keys`: write the K/V of each `fresh` one there, then `commit`.
        More pages than the device tier has slots at all is the request's size, not the pool's
        load: `KVRequestTooLarge`, a `BadInput` (the caller's answer is a 400)."""
        keys = self._scoped(self._checked("allocate", keys))
        slots = self.pool.l1.slots
        if len(keys) > slots:
            raise KVRequestTooLarge(
                f"the request needs {len(keys)} pages of K/V at once in global `{self.pool.layout.name}`, whose device "
                f"tier holds {slots}: send a shorter request (at most {slots * self.pool.layout.page_tokens} tokens)"
            )
        try:
            return self.pool.allocate(keys, self.owner)
        except SlotsExhausted as error:
            raise self._full(error) from None

    def _checked(self, what: str, keys: Sequence[str]) -> list[str]:
        if not self._entered:
            raise KVError(
                f"kv.{what}() outside `async with ctx.kv({self.pool.layout.name!r}) as kv:`: the pages it holds are "
                f"released when that block ends, so use the handle inside one"
            )
        if isinstance(keys, str | bytes) or not hasattr(keys, "__iter__"):
            raise KVError(f"kv.{what}() takes a list of page keys (from kv.keys(tokens)), not {keys!r:.60}")
        keys = list(keys)
        bad = next((key for key in keys if not isinstance(key, str) or not key or "|" in key or "~" in key), None)
        if bad is not None:
            raise KVError(f"kv.{what}(): page keys are non-empty strings without '|' or '~' (use kv.keys(tokens)), not {bad!r}")
        if len(set(keys)) != len(keys):
            raise KVError(f"kv.{what}(): a page key appears twice; the keys of one history are all different")
        return keys

    def _scoped(self, keys: list[str]) -> list[str]:
        """The pool's keys for the role's `keys`: themselves, or salted with the scope."""
        salt = self._salt
        if salt is None:
            return keys
        return [hashlib.blake2b(key.encode(), digest_size=16, key=salt).hexdigest() for key in keys]

    def committed(self, key: str) -> bool:
        """Whether page `key` is committed in this process's pool (so `allocate` holds it)."""
        return self.pool.committed(self._scoped([key])[0])

    def _full(self, error: SlotsExhausted) -> KVError:
        return KVError(
            f"the device tier of global `{self.pool.layout.name}` is full: every slot holds a page some request is "
            f"using ({error}). Give the global more `capacity`, or let fewer requests run at once"
        )

    def count_prefix(self, hit: int = 0, computed: int = 0, recomputed: int = 0) -> None:
        """Count tokens of a request's prefix for this handle's role: `hit` (their K/V came from
        the pool), `computed` (prefilled here) and, of those, `recomputed` (history the pool had
        lost, rebuilt). Whole numbers >= 0."""
        counts = (hit, computed, recomputed)
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in counts):
            raise KVError(
                f"kv.count_prefix() takes whole numbers of tokens >= 0, not hit={hit!r}, computed={computed!r}, "
                f"recomputed={recomputed!r}"
            )
        tokens = self.pool.prefix_tokens.get(self.role)
        if tokens is None:
            tokens = self.pool.prefix_tokens[self.role] = {"hit": 0, "computed": 0, "recomputed": 0}
        tokens["hit"] += hit
        tokens["computed"] += computed
        tokens["recomputed"] += recomputed

    def fresh(self, key: str) -> bool:
        """Whether `key` was allocated new for this handle (False: another request made it)."""
        return self.pool.fresh(self._scoped([key])[0], self.owner)

    def commit(self, keys: Sequence[str], start: int | None = None) -> bool:
        """Pages `keys` are written: share them as pages start.. of the session's history.
        False when the metadata store could not take them (they stay here; retried later)."""
        try:
            return self.pool.commit(self.session, self._scoped(self._checked("commit", keys)), self.owner, start)
        except SlotError as error:
            raise KVError(str(error)) from None

    def stack(self, sub: str, slice_: str) -> Any:
        """L1 block stack (slots, page_tokens, heads, head_dim) of chunk (sub, slice)."""
        return self.pool.device.stack(sub, slice_)

    def view(self, sub_names: Sequence[str] | None, slot: int, slice_names: Sequence[str] | None = None) -> list:
        return self.pool.device.view(sub_names, slot, slice_names)

    def read_shared(self, keys: Sequence[str]) -> SharedPages:
        """The prefix of `keys` other processes of the machine hold, read in place (no copy)."""
        return self.pool.read_shared(self.session, self._scoped(self._checked("read_shared", keys)))

    def release(self) -> None:
        self.pool.release(self.owner)
        if self._run_locked:
            self._run_locked = False
            self.pool._meta(lambda: self.pool.store.unlock_run(self.session, self.owner))

    async def __aenter__(self) -> KVSession:
        self._entered = True
        done = self.pool._meta(lambda: self.pool.store.lock_run(self.session, self.owner, RUN_LOCK_TTL) or True)
        self._run_locked = done is not None
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._entered = False
        self.release()


class KVPools:
    """The KV pools of one process (see the module docstring)."""

    def __init__(
        self,
        globals_: Mapping[str, Mapping[str, Any]],
        *,
        deployment: str = "default",
        meta_url: str | None = None,
        disk_dir: str | Path | None = None,
        node_prefix: str | None = None,
        hasher: Hasher | None = None,
        device: Any = "cpu",
        store: MetaStore | None = None,
    ) -> None:
        self.globals = {name: dict(spec) for name, spec in globals_.items() if spec.get("kind") == "KVCache"}
        self.deployment = deployment
        self.meta_url = meta_url if meta_url is not None else (os.environ.get(META_ENV) or None)
        self.disk_dir = disk_dir if disk_dir is not None else os.environ.get(DIR_ENV)
        self.node_prefix = node_prefix
        self.hasher = hasher
        self.device = device
        self._store = store
        self.pools: dict[str, KVPool] = {}

    def store(self) -> MetaStore:
        if self._store is None:
            try:
                self._store = open_store(self.meta_url, self.deployment)
            except MetaError as error:
                raise KVError(
                    f"the KV metadata store {self.meta_url} cannot be used ({error}); start it, or unset {META_ENV} "
                    f"to keep KV metadata in this process"
                ) from None
        return self._store

    def pool(self, name: str) -> KVPool:
        pool = self.pools.get(name)
        if pool is not None:
            return pool
        spec = self.globals.get(name)
        if spec is None:
            known = ", ".join(f"`{n}`" for n in sorted(self.globals)) or "none"
            raise KVError(f"no `global {name}: KVCache {{ ... }}` in this flow (its KVCache globals: {known})")
        layout = KVLayout.from_global(name, spec)
        pages = tier_pages(layout, spec)
        node = default_node(name) if self.node_prefix is None else f"{self.node_prefix}:{name}"
        try:
            pool = self._make(name, layout, pages, node)
        except OSError as error:
            raise KVError(
                f"global `{name}`: its tiers cannot be made ({error}); check {DIR_ENV} (the disk tier's directory) and "
                f"the free space of /dev/shm (the host tier)"
            ) from None
        self.pools[name] = pool
        return pool

    def _make(self, name: str, layout: KVLayout, pages: dict[str, int], node: str) -> KVPool:
        return KVPool(
            layout,
            device_pages=pages["device"],
            host_pages=pages["host"],
            disk_pages=pages["disk"],
            disk_dir=self.disk_dir,
            device=self.device,
            store=self.store(),
            deployment=self.deployment,
            node=node,
        )

    def session(self, name: str, session: str, owner: str, role: str = "", scope: str | None = None) -> KVSession:
        return KVSession(self.pool(name), session, owner, self.hasher, role, scope)

    def statistics(self) -> dict:
        return {name: pool.statistics() for name, pool in sorted(self.pools.items())}

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
        if self._store is not None:
            self._store.close()
            self._store = None
