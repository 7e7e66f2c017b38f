"""What /metrics reports of a deployment's processes: the snapshot flowrt.observe.deployment
turns into metric families (its docstring gives the shape), gathered when /metrics is scraped.

- replicas: under `inproc` every replica of every role is in the server process (up, none
  restarted, its activations in flight as the role binding counts them, nothing queued).
  Under `local` and `ray`, every replica the bundle declares: up while the registry has it,
  in flight as its process reports (the gateway's own count where it did not answer), queued
  as the activations the gateway has handed it and it has not started (on their way, or its
  heartbeat's `queued`), restarts and heartbeat lapses as the supervisor and registry count them.
- edges: the frames each node sent to each consumer (the control core counts them per outlet,
  flowrt.control.program.Outlet), and their bytes as the gateway's data plane received them
  from the producer's process (flowrt.deploy.remote.Remote.moved): a frame's bytes count on
  every edge it travels; frames made in the server process (entry values; every role under
  `inproc`) cross no process boundary and count no bytes.
- tmp_buffer: the memory manager's Tmp Buffer Pool (`local` and `ray`; under Ray one per node).
- kv_pages, kv_mismatched_pages and prefix_tokens: each process's KV pools (flowrt.params; the
  server's under `inproc`, each replica's as it answers a probe), pages and mismatched pages
  (slots below L1 that did not hold the page asked for: recomputed) summed over its pools, prefix
  tokens summed per role over every process. A process started again counts from 0.
- refused: what was refused between processes, by process and kind (`local` and `ray`): in the
  server, registry records whose MAC did not verify (`forged_records`) and peers the embedded
  registry's socket refused (`peers`); in each replica, peers its socket refused (`peers`) and
  `Cancel`, `Credit` or `Stop` messages from a peer that does not own the activation or the
  replica (`foreign_messages`), as it answers a probe; in each memory manager, peers its socket
  refused (`peers`); and in every process with KV pools, pages a peer's slot or a tier did not
  hold as the metadata said (`mismatched_pages`, also kv_mismatched_pages above).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

SERVER = "server"  # the `process` label of the process that runs the control core
MANAGER = "memory-manager"  # ... of the machine's memory manager (`memory-manager@NODE` for another node's)
TIERS = {"device": "L1", "host": "L2", "disk": "L3"}
TMP_STATES = {"used": "bytes_allocated", "requested": "bytes_requested", "free": "bytes_free", "capacity": "capacity"}


def gatherer(deployment: Any) -> Callable[[], Awaitable[dict]]:
    """The `gather` of flowrt.observe.deployment.DeploymentMetrics for `deployment`."""

    async def gather() -> dict:
        return await snapshot(deployment)

    return gather


async def snapshot(deployment: Any) -> dict:
    runtime, supervisor = deployment.runtime, deployment.supervisor
    kv_pages: dict[str, dict] = {}
    mismatched: dict[str, int] = {}
    prefix: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    tmp_buffer: dict[str, dict[str, int]] = {}
    refused: dict[str, dict[str, int]] = {}
    if supervisor is None:
        replicas = [
            _replica(role, replica, True, load, 0, 0, 0)
            for role, binding in sorted(runtime.bindings.items())
            for replica, load in enumerate(binding.load)
        ]
        pools = getattr(deployment.memory, "params", None)
        if pools is not None and pools.pools:
            _kv(SERVER, pools.statistics(), kv_pages, prefix, mismatched)
        moved: dict = {}
    else:
        replicas = await _remote_replicas(supervisor, kv_pages, prefix, mismatched, refused)
        security = supervisor.security()
        refused[SERVER] = {"forged_records": security["forged_records"], "peers": security["refused_peers"]}
        if supervisor.memory is not None:
            managers = deployment.memory_statistics()
            tmp_buffer = _tmp_buffer(managers)
            refused.update(_managers_refused(managers))
        moved = supervisor.remote.moved
    for process, pages in mismatched.items():
        refused.setdefault(process, {})["mismatched_pages"] = pages
    return {
        "replicas": replicas,
        "edges": edges(runtime.programs, moved),
        "tmp_buffer": tmp_buffer,
        "kv_pages": kv_pages,
        "kv_mismatched_pages": mismatched,
        "prefix_tokens": {role: dict(kinds) for role, kinds in prefix.items()},
        "refused": refused,
    }


def _replica(role: str, replica: int, up: bool, in_flight: int, queued: int, restarts: int, lapses: int) -> dict:
    return {
        "role": role,
        "replica": replica,
        "up": up,
        "in_flight": in_flight,
        "queue_depth": queued,
        "restarts": restarts,
        "heartbeat_lapses": lapses,
    }


async def _remote_replicas(supervisor: Any, kv_pages: dict, prefix: dict, mismatched: dict, refused: dict) -> list[dict]:
    remote = supervisor.remote
    answers = await remote.probe()
    lapsed = supervisor.directory.lapsed
    replicas = []
    for role, replica in supervisor.expected():
        link = remote.links.get((role, replica))
        process = supervisor.processes.get((role, replica))
        restarts = max(0, process.started - 1) if process is not None else 0
        answer = answers.get(f"{role}/{replica}", {}) if link is not None else {}
        handed = len(link.pending) if link is not None else 0  # (started by the gateway, not yet ended there)
        running = answer.get("running", handed)
        queued = max(0, handed - running) + (link.record.queued if link is not None else 0)
        replicas.append(_replica(role, replica, link is not None, running, queued, restarts, lapsed.get((role, replica), 0)))
        if answer.get("kv"):
            _kv(f"{role}/{replica}", answer["kv"], kv_pages, prefix, mismatched)
        if link is not None:
            refused[f"{role}/{replica}"] = {
                kind: answer.get("refused", {}).get(kind, 0) for kind in ("peers", "foreign_messages")
            }
    return replicas


def _kv(process: str, pools: dict, kv_pages: dict, prefix: dict, mismatched: dict) -> None:
    """One process's KV pools' statistics (flowrt.params.session.KVPools.statistics) into pages
    by tier and state, mismatched pages, and prefix tokens by role."""
    tiers: dict[str, dict[str, int]] = kv_pages.setdefault(process, {})
    mismatched[process] = sum(pool.get("mismatched_pages", 0) for pool in pools.values())
    for pool in pools.values():
        for name, tier in pool.get("tiers", {}).items():
            states = tiers.setdefault(TIERS.get(name, name), defaultdict(int))
            states["capacity"] += tier.get("slots", 0)
            states["used"] += tier.get("used", 0)
            states["free"] += tier.get("free", 0)
            states["held"] += tier.get("held_pages", 0)
        for role, kinds in pool.get("prefix_tokens", {}).items():
            for kind, tokens in kinds.items():
                prefix[role][kind] += tokens
    for name, states in tiers.items():
        tiers[name] = dict(states)


def _tmp_buffer(stats: dict) -> dict[str, dict[str, int]]:
    """The memory managers' statistics (Deployment.memory_statistics) as bytes by state."""
    if "unanswered" in stats:
        return {}
    found = {MANAGER: {state: stats.get(key, 0) for state, key in TMP_STATES.items()}}
    for node, other in sorted(stats.get("nodes", {}).items()):  # (Ray: the other nodes' managers)
        if isinstance(other, dict) and "unanswered" not in other:
            found[f"{MANAGER}@{node}"] = {state: other.get(key, 0) for state, key in TMP_STATES.items()}
    return found


def _managers_refused(stats: dict) -> dict[str, dict[str, int]]:
    """The peers each memory manager's socket refused, by process label (as `_tmp_buffer`'s)."""
    found = {}
    if "unanswered" not in stats:
        found[MANAGER] = {"peers": stats.get("refused", {}).get("peers", 0)}
    for node, other in sorted(stats.get("nodes", {}).items()):
        if isinstance(other, dict) and "unanswered" not in other:
            found[f"{MANAGER}@{node}"] = {"peers": other.get("refused", {}).get("peers", 0)}
    return found


def edges(programs: dict, moved: dict) -> list[dict]:
    """Frames and bytes per edge of every graph: from each node that is not a graph's start
    (whose only consumers are its entry placeholders) to each consumer its outlets count."""
    sizes: dict[tuple, int] = defaultdict(int)
    for ((graph, producer), fields), (_, size) in moved.items():
        program = programs.get(graph)
        node = program.by_id.get(producer) if program is not None else None
        if node is None:
            continue
        reached = {edge.outlet.consumer for route in node.routes if route.field in fields for edge in route.edges}
        for consumer in reached:
            sizes[(graph, producer, consumer)] += size
    found = []
    for graph, program in sorted(programs.items()):
        for node in program.nodes:
            if node is program.start:
                continue
            for outlet in node.outlets:
                key = (graph, node.id, outlet.consumer)
                found.append(
                    {
                        "graph": graph,
                        "producer": node.id,
                        "consumer": outlet.consumer,
                        "frames": outlet.frames,
                        "bytes": sizes[key],
                    }
                )
    return found
