"""Prometheus metrics of a runtime: calls by graph and status, call latency and time to the
first streamed frame, activations and their latency by role and interface, and what is in
flight (docs/observe.md lists them). What the deployment's processes hold (replicas, edges,
pools, prefix reuse) is flowrt.observe.deployment's.

`Metrics` is an observer (flowrt.observe.hooks): its hooks only count, in plain Python numbers
kept per graph and per (role, interface), because prometheus_client's own Counter and
Histogram take a lock and walk their buckets on every update, which costs more than a no-op
activation. Nothing at all runs here per activation (`starts` and `ends` are false): how many
started, ended by outcome, their frames and the histogram of their durations are the control
core's own counts on each node (flowrt.control.program; the histogram's buckets are installed
on the nodes of each graph when this observer sees its first call), read when /metrics is
scraped. Only calls are counted here, a few dictionary updates each. A custom collector turns
the counts into metric families then (prometheus_client's documented pattern for exporters
with their own bookkeeping). Each `Metrics` has a registry of its own, so two runtimes in one
process never mix.
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
    """One (role, interface): its nodes in the graphs seen, whose counts the core keeps."""

    __slots__ = ("role", "interface", "nodes")

    def __init__(self, role: str, interface: str):
        self.role = role
        self.interface = interface
        self.nodes: list[Any] = []

    def count(self, name: str) -> int:
        """The sum of a count the core keeps on each node (acts_started, acts_ended, ...)."""
        return sum(getattr(node, name) for node in self.nodes)

    def latency(self) -> Latency:
        """The histogram of its activations' durations: the sum of its nodes'."""
        latency = Latency(ACTIVATION_BUCKETS)
        for node in self.nodes:
            if node.duration_counts is not None:
                latency.counts = [a + b for a, b in zip(latency.counts, node.duration_counts, strict=True)]
                latency.total += node.duration_sum
        return latency


class GraphStats:
    """One graph: calls started, ended by status, latency, time to the first output event."""

    __slots__ = ("started", "by_status", "latency", "first_frame")

    def __init__(self) -> None:
        self.started = 0
        self.by_status: dict[str, int] = {}
        self.latency = Latency(CALL_BUCKETS)
        self.first_frame = Latency(CALL_BUCKETS)


class Metrics(Observer):
    """Counts what the runtime does; `exposition()` is the text GET /metrics answers."""

    starts = ends = False  # (the core counts and times activations itself: the module docstring)

    def __init__(self) -> None:
        self.graphs: dict[str, GraphStats] = {}
        self.interfaces: dict[tuple[str, str], InterfaceStats] = {}
        self._nodes: set[Any] = set()  # the interface nodes counted (the core's node objects)
        self._programs: set[Any] = set()  # the graph programs whose nodes are registered
        self._call_started: dict[int, tuple[GraphStats, float]] = {}  # call id -> its graph's stats, when it started
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    # ── the hooks (flowrt.observe.hooks) ──

    def call_started(self, call: Any) -> None:
        stats = self.graphs.get(call.graph)
        if stats is None:
            stats = self.graphs[call.graph] = GraphStats()
        stats.started += 1
        self._call_started[call.call_id] = (stats, now())
        if call.program not in self._programs:
            self._register(call.program)

    def first_output(self, call: Any) -> None:
        entry = self._call_started.get(call.call_id)
        if entry is not None:
            seconds = now() - entry[1]
            latency = entry[0].first_frame  # (Latency.observe, inline: once per call)
            latency.counts[bisect_left(latency.bounds, seconds)] += 1
            latency.total += seconds

    def call_ended(self, call: Any, status: str) -> None:
        entry = self._call_started.pop(call.call_id, None)
        if entry is None:  # (a call that started before this observer was installed)
            stats = self.graphs.get(call.graph)
            if stats is None:
                stats = self.graphs[call.graph] = GraphStats()
            stats.started += 1
        else:
            stats = entry[0]
            seconds = now() - entry[1]
            latency = stats.latency
            latency.counts[bisect_left(latency.bounds, seconds)] += 1
            latency.total += seconds
        by_status = stats.by_status
        by_status[status] = by_status.get(status, 0) + 1

    def _register(self, program: Any) -> None:
        """Report the interface nodes of a graph program, and have the core time their
        activations from now on (a histogram another Metrics installed is shared)."""
        self._programs.add(program)
        for node in program.nodes:
            if not node.interface or node in self._nodes:
                continue
            self._nodes.add(node)
            if node.duration_counts is None:
                node.duration_bounds = ACTIVATION_BUCKETS
                node.duration_counts = [0] * (len(ACTIVATION_BUCKETS) + 1)
            key = (node.role, node.method)
            stats = self.interfaces.get(key)
            if stats is None:
                stats = self.interfaces[key] = InterfaceStats(*key)
            stats.nodes.append(node)

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
        first = HistogramMetricFamily(
            "flowrt_first_frame_seconds",
            "From a call's start to its first event carrying a graph output (calls that emit none are not counted).",
            labels=["graph"],
        )
        for graph, stats in graphs:
            for status, count in sorted(stats.by_status.items()):
                calls.add_metric([graph, status], count)
            in_flight.add_metric([graph], stats.started - sum(stats.by_status.values()))
            latency.add_metric([graph], stats.latency.cumulative(), stats.latency.total)
            first.add_metric([graph], stats.first_frame.cumulative(), stats.first_frame.total)
        yield from (calls, in_flight, latency, first)
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
            ended, errors, cancelled = stats.count("acts_ended"), stats.count("acts_failed"), stats.count("acts_cancelled")
            for outcome, count in (("ok", ended - errors - cancelled), ("error", errors), ("cancel", cancelled)):
                activations.add_metric([role, interface, outcome], count)
            running.add_metric([role, interface], stats.count("acts_started") - ended)
            frames.add_metric([role, interface], stats.count("frames_out"))
            latency = stats.latency()
            duration.add_metric([role, interface], latency.cumulative(), latency.total)
        yield from (activations, running, frames, duration)


def _bound(seconds: float) -> str:
    return repr(float(seconds))
