"""Prometheus metrics of a runtime: calls by graph and status, call latency, activations and
their latency by role and interface, and what is in flight (docs/observe.md lists them).

`Metrics` is an observer (flowrt.observe.hooks): its hooks only count, in plain Python numbers
kept per graph and per (role, interface), because prometheus_client's own Counter and
Histogram take a lock and walk their buckets on every update, which costs more than a no-op
activation. A custom collector turns the counts into metric families when /metrics is
scraped (prometheus_client's documented pattern for exporters with their own bookkeeping).
Each `Metrics` has a registry of its own, so two runtimes in one process never mix.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from flowrt.observe.hooks import Observer, now

# what GET /metrics answers with: the classic text format every Prometheus reads (our names and
# labels are plain, so prometheus_client's newer 1.0.0 output is the same bytes)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# seconds; an inference pipeline's calls and activations span from a no-op's microseconds to a
# long generation's minutes
CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ACTIVATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # fmt: skip


class Latency:
    """A histogram's counts: one per bucket (a value lands in the first bucket it does not
    exceed; the last is +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus' buckets: (upper bound, how many values were at most that)."""
        running, buckets = 0, []
        for bound, count in zip((*map(_bound, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            buckets.append((bound, running))
        return buckets


class InterfaceStats:
    """One (role, interface): activations started, ended by outcome, frames, latency."""

    __slots__ = ("role", "interface", "started", "ended", "errors", "cancelled", "frames", "latency")

    def __init__(self, role: str, interface: str):
        self.role = role
        self.interface = interface
        self.started = 0
        self.ended = 0
        self.errors = 0
        self.cancelled = 0
        self.frames = 0
        self.latency = Latency(ACTIVATION_BUCKETS)


class GraphStats:
    """One graph: calls started, ended by status, latency."""

    __slots__ = ("started", "by_status", "latency")

    def __init__(self) -> None:
        self.started = 0
        self.by_status: dict[str, int] = {}
        self.latency = Latency(CALL_BUCKETS)


class Metrics(Observer):
    """Counts what the runtime does; `exposition()` is the text GET /metrics answers."""

    def __init__(self) -> None:
        self.graphs: dict[str, GraphStats] = {}
        self.interfaces: dict[tuple[str, str], InterfaceStats] = {}
        self._by_node: dict[Any, InterfaceStats] = {}  # the same stats, by the core's node object (one lookup)
        self._call_started: dict[int, float] = {}  # call id -> when it started
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    # ── the hooks (flowrt.observe.hooks) ──

    def call_started(self, call: Any) -> None:
        stats = self.graphs.get(call.graph)
        if stats is None:
            stats = self.graphs[call.graph] = GraphStats()
        stats.started += 1
        self._call_started[call.call_id] = now()

    def call_ended(self, call: Any, status: str) -> None:
        stats = self.graphs[call.graph]
        stats.by_status[status] = stats.by_status.get(status, 0) + 1
        started = self._call_started.pop(call.call_id, None)
        if started is not None:
            stats.latency.observe(now() - started)

    def activation_started(self, call: Any, act: Any) -> None:
        if act.started == 0.0:
            act.started = now()
        stats = self._by_node.get(act.node)
        if stats is None:
            stats = self._stats(act.node)
        stats.started += 1

    def activation_ended(self, call: Any, act: Any, reason: Any) -> None:
        stats = self._by_node[act.node]
        stats.ended += 1
        if reason is not None:
            if reason.value == "error":
                stats.errors += 1
            else:
                stats.cancelled += 1
        stats.frames += act.yielded
        stats.latency.observe(now() - act.started)

    def _stats(self, node: Any) -> InterfaceStats:
        key = (node.role, node.method)
        stats = self.interfaces.get(key)
        if stats is None:
            stats = self.interfaces[key] = InterfaceStats(*key)
        self._by_node[node] = stats
        return stats

    # ── reading ──

    def exposition(self) -> bytes:
        """Every metric in Prometheus' text format."""
        return generate_latest(self.registry)


class _Collector:
    """Builds the metric families from a `Metrics`' counts when the registry is read."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        graphs = sorted(self.metrics.graphs.items())
        interfaces = sorted(self.metrics.interfaces.items())
        calls = CounterMetricFamily("flowrt_calls", "Graph calls that ended, by graph and status.", labels=["graph", "status"])
        in_flight = GaugeMetricFamily("flowrt_calls_in_flight", "Graph calls running now.", labels=["graph"])
        latency = HistogramMetricFamily(
            "flowrt_call_duration_seconds", "From a call's start to its done event.", labels=["graph"]
        )
        for graph, stats in graphs:
            for status, count in sorted(stats.by_status.items()):
                calls.add_metric([graph, status], count)
            in_flight.add_metric([graph], stats.started - sum(stats.by_status.values()))
            latency.add_metric([graph], stats.latency.cumulative(), stats.latency.total)
        yield from (calls, in_flight, latency)
        labels = ["role", "interface"]
        activations = CounterMetricFamily(
            "flowrt_activations", "Activations that ended, by role, interface and outcome.", labels=[*labels, "outcome"]
        )
        running = GaugeMetricFamily("flowrt_activations_in_flight", "Activations running now.", labels=labels)
        frames = CounterMetricFamily("flowrt_frames", "Frames activations produced.", labels=labels)
        duration = HistogramMetricFamily(
            "flowrt_activation_duration_seconds", "From a role's method being invoked to its end.", labels=labels
        )
        for (role, interface), stats in interfaces:
            ok = stats.ended - stats.errors - stats.cancelled
            for outcome, count in (("ok", ok), ("error", stats.errors), ("cancel", stats.cancelled)):
                activations.add_metric([role, interface, outcome], count)
            running.add_metric([role, interface], stats.started - stats.ended)
            frames.add_metric([role, interface], stats.frames)
            duration.add_metric([role, interface], stats.latency.cumulative(), stats.latency.total)
        yield from (activations, running, frames, duration)


def _bound(seconds: float) -> str:
    return repr(float(seconds))
