"""Gives each process of a deployment its KV pools (flowrt.params.session.KVPools) as
`ctx.memory.params`, which `ctx.kv(name)` reaches.

A bundle without `KVCache` globals, or a process without torch, gets none (`ctx.kv` then says
why). Every process of one deployment uses the same deployment name in the metadata store, so
their pages are found by each other's prefix matches; each process is a node of its own.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("flowrt.deploy")


def wants_pools(plan: Mapping[str, Any]) -> bool:
    return any(spec.get("kind") == "KVCache" for spec in (plan.get("globals") or {}).values())


def attach(memory: Any, plan: Mapping[str, Any], deployment: str, node_prefix: str | None = None) -> Any:
    """Set `memory.params` to this process's pools (made lazily, on first `ctx.kv`); returns them."""
    if memory is None or not wants_pools(plan) or importlib.util.find_spec("torch") is None:
        return None
    from flowrt.compute.hashing import page_hashes
    from flowrt.params.session import KVPools

    memory.params = KVPools(plan["globals"], deployment=deployment, hasher=page_hashes, node_prefix=node_prefix)
    return memory.params


def detach(memory: Any) -> None:
    params = getattr(memory, "params", None)
    if params is not None:
        memory.params = None
        params.close()


def keep_alive(memory: Any) -> None:
    """Renew this process's pools in the metadata store (from the replica's heartbeats)."""
    params = getattr(memory, "params", None)
    if params is not None:
        for pool in list(params.pools.values()):
            pool.keep_alive()
