"""Prometheus metrics of a whole deployment, gathered from its processes when /metrics is
scraped: replicas (up, in flight, queued, restarts, heartbeat lapses), frames and bytes per
edge of each graph, the Tmp Buffer Pool's bytes, KV pages per tier and the pages refused because
their slot held another page, and prefix-reuse tokens per role (docs/observe.md lists them).

`DeploymentMetrics` owns these families and nothing else: it knows neither the control core
nor the deployment. It is given `gather`, an async callable (flowrt.deploy.observed builds it)
that returns a *snapshot*, plain values only:

    {"replicas": [{"role": str, "replica": int, "up": bool, "in_flight": int,
                   "queue_depth": int, "restarts": int, "heartbeat_lapses": int}, ...],
     "edges": [{"graph": str, "producer": str, "consumer": str, "frames": int, "bytes": int}, ...],
     "tmp_buffer": {process: {state: bytes}},           # state: used, requested, free, capacity
     "kv_pages": {process: {tier: {state: pages}}},      # tier: L1, L2, L3
     "kv_mismatched_pages": {process: pages},            # slots below L1 that held another page
     "prefix_tokens": {role: {kind: tokens}},            # kind: hit, computed, recomputed
     "refused": {process: {kind: count}}}                # kind: forged_records, peers, foreign_messages, mismatched_pages

Any key may be missing (nothing to report). `refresh()` gathers a snapshot (the gateway awaits
it before each scrape), `collect()` turns the last one into metric families, and
`exposition()` is their text. Nothing here runs per call or per activation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

REPLICA_GAUGES = (
    ("up", "flowrt_replica_up", "Whether the replica is up (registered, its heartbeat fresh): 1 or 0."),
    ("in_flight", "flowrt_replica_in_flight", "Activations running on the replica now."),
    (
        "queue_depth",
        "flowrt_replica_queue_depth",
        "Activations handed to the replica that it has not started yet (on their way to it, or queued there).",
    ),
)
REPLICA_COUNTERS = (
    ("restarts", "flowrt_replica_restarts", "Times the replica's process was started again after it went away."),
    ("heartbeat_lapses", "flowrt_heartbeat_lapses", "Times the replica's heartbeat lapsed and it was dropped."),
)
PREFIX_KINDS = ("hit", "computed", "recomputed")

Snapshot = dict[str, Any]


class DeploymentMetrics:
    """The deployment's metric families, from the snapshots `gather()` returns."""

    def __init__(self, gather: Callable[[], Awaitable[Snapshot]]):
        self.gather = gather
        self.snapshot: Snapshot = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    async def refresh(self) -> None:
        """Gather a fresh snapshot (what the next `exposition()` reports)."""
        self.snapshot = await self.gather()

    def exposition(self) -> bytes:
        """The last snapshot's metrics in Prometheus' text format."""
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot
        yield from _replicas(snapshot.get("replicas", ()))
        yield from _edges(snapshot.get("edges", ()))
        tmp = GaugeMetricFamily(
            "flowrt_tmp_buffer_bytes",
            "The Tmp Buffer Pool's bytes by state (used, requested, free, capacity), per memory manager process.",
            labels=["process", "state"],
        )
        for process, states in sorted(snapshot.get("tmp_buffer", {}).items()):
            for state, value in sorted(states.items()):
                tmp.add_metric([process, state], value)
        yield tmp
        kv = GaugeMetricFamily(
            "flowrt_kv_pages",
            "KV pool pages by process, tier (L1 device, L2 host, L3 disk) and state (capacity, used, free, held).",
            labels=["process", "tier", "state"],
        )
        for process, tiers in sorted(snapshot.get("kv_pages", {}).items()):
            for tier, states in sorted(tiers.items()):
                for state, value in sorted(states.items()):
                    kv.add_metric([process, tier, state], value)
        yield kv
        mismatched = CounterMetricFamily(
            "flowrt_kv_mismatched_pages",
            "KV pages a process did not use because the slot it was sent to (in a peer's L2, its own L2 or L3) held "
            "another page; each was recomputed (metadata that lied, or a slot rewritten meanwhile).",
            labels=["process"],
        )
        for process, pages in sorted(snapshot.get("kv_mismatched_pages", {}).items()):
            mismatched.add_metric([process], pages)
        yield mismatched
        prefix = CounterMetricFamily(
            "flowrt_prefix_tokens",
            "Prompt tokens of prefix-reusing roles: hit (K/V from the KV pool), computed (prefilled), "
            "recomputed (of those, history the pool had lost); summed over the role's processes.",
            labels=["role", "kind"],
        )
        for role, kinds in sorted(snapshot.get("prefix_tokens", {}).items()):
            for kind in PREFIX_KINDS:
                prefix.add_metric([role, kind], kinds.get(kind, 0))
        yield prefix
        refused = CounterMetricFamily(
            "flowrt_refused",
            "What a deployment's process refused from other processes, by kind: forged_records (registry records whose "
            "MAC did not verify under the deployment's key), peers (connections without the deployment's keys), "
            "foreign_messages (Cancel, Credit or Stop from a peer that does not own the activation or the replica), "
            "mismatched_pages (KV pages a slot did not hold as the metadata said: recomputed).",
            labels=["process", "kind"],
        )
        for process, kinds in sorted(snapshot.get("refused", {}).items()):
            for kind, count in sorted(kinds.items()):
                refused.add_metric([process, kind], count)
        yield refused


def _replicas(replicas: Any) -> Iterator[Metric]:
    labels = ["role", "replica"]
    rows = sorted(replicas, key=lambda r: (r["role"], r["replica"]))
    for key, name, text in REPLICA_GAUGES:
        family = GaugeMetricFamily(name, text, labels=labels)
        for row in rows:
            family.add_metric([row["role"], str(row["replica"])], int(row.get(key, 0)))
        yield family
    for key, name, text in REPLICA_COUNTERS:
        family = CounterMetricFamily(name, text, labels=labels)
        for row in rows:
            family.add_metric([row["role"], str(row["replica"])], row.get(key, 0))
        yield family


def _edges(edges: Any) -> Iterator[Metric]:
    labels = ["graph", "producer", "consumer"]
    frames = CounterMetricFamily(
        "flowrt_edge_frames",
        "Frames a producer (role.interface, or $ENTRY for an entry value) sent to a consumer (role.interface, or caller).",
        labels=labels,
    )
    sizes = CounterMetricFamily(
        "flowrt_edge_bytes",
        "Bytes of those frames as the data plane moved them out of the producer's process "
        "(pickled payload and shared-memory tensors; 0 where the producer runs in the server process).",
        labels=labels,
    )
    for edge in sorted(edges, key=lambda e: (e["graph"], e["producer"], e["consumer"])):
        key = [edge["graph"], edge["producer"], edge["consumer"]]
        frames.add_metric(key, edge.get("frames", 0))
        sizes.add_metric(key, edge.get("bytes", 0))
    yield from (frames, sizes)
