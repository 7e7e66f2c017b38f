"""Prometheus metrics of a runtime: calls by graph and status, call latency and time to the
first streamed frame, activations and their latency by role and interface, what is in flight,
and the time to first audio and real-time factor the front doors record (flowrt.observe.audio;
docs/observe.md lists them all). What the deployment's processes hold (replicas, edges,
pools, prefix reuse) is flowrt.observe.deployment's.

`Metrics` is an observer (flowrt.observe.hooks) that counts nothing itself: prometheus_client's
own Counter and Histogram take a lock and walk their buckets on every update, and even a Python
hook per call costs more than the counting. The control core keeps the counts (flowrt.control.
program): each graph program its calls started and ended by status, each node its activations
started and ended by outcome and their frames; and, on the programs and nodes where this observer
installed histograms (when it sees a graph's first call: `call_started` is its only hook), the
core times each observed call, its first output and its activations into them. They are read
when /metrics is scraped: a custom collector turns them into metric families then
(prometheus_client's documented pattern for exporters with their own bookkeeping). A graph's
calls are counted from the runtime's start, observed or not. Each `Metrics` has a registry of
its own, so two runtimes in one process never mix.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from flowrt.observe.audio import AudioFigures
from flowrt.observe.hooks import Observer

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
        return summed(self.nodes, ACTIVATION_BUCKETS, "duration_counts", "duration_sum")


class GraphStats:
    """One graph: the programs of it that ran (one per runtime), whose counts the core keeps."""

    __slots__ = ("programs",)

    def __init__(self) -> None:
        self.programs: list[Any] = []

    @property
    def started(self) -> int:
        return sum(program.calls_started for program in self.programs)

    def by_status(self) -> dict[str, int]:
        """Calls ended, by status."""
        counts: dict[str, int] = {}
        for program in self.programs:
            for status, count in program.calls_ended.items():
                counts[status] = counts.get(status, 0) + count
        return counts

    def latency(self, counts: str, total: str) -> Latency:
        """A histogram the core keeps on each program (`call_counts` and `call_sum`, say), summed."""
        return summed(self.programs, CALL_BUCKETS, counts, total)


def summed(holders: list[Any], bounds: tuple[float, ...], counts: str, total: str) -> Latency:
    """The sum of the histograms the core keeps on `holders` (nodes or graph programs) in their
    attributes `counts` and `total`; a holder whose histogram is not installed adds nothing."""
    latency = Latency(bounds)
    for holder in holders:
        if getattr(holder, counts) is not None:
            latency.counts = [a + b for a, b in zip(latency.counts, getattr(holder, counts), strict=True)]
            latency.total += getattr(holder, total)
    return latency


class Metrics(Observer):
    """Counts what the runtime does; `exposition()` is the text GET /metrics answers."""

    starts = ends = False  # (the core counts and times calls and activations itself: the module docstring)
    first_output = None

    def __init__(self) -> None:
        self.graphs: dict[str, GraphStats] = {}
        self.interfaces: dict[tuple[str, str], InterfaceStats] = {}
        self._nodes: set[Any] = set()  # the interface nodes counted (the core's node objects)
        self._programs: set[Any] = set()  # the graph programs whose counts are reported
        self.audio = AudioFigures()  # time to first audio and real-time factor, as front doors record them
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    # ── the hook (flowrt.observe.hooks) ──

    def call_started(self, call: Any) -> None:
        if call.program not in self._programs:
            self._register(call.program)

    def _register(self, program: Any) -> None:
        """Report a graph program and its interface nodes, and have the core time their calls
        and activations from now on (histograms another Metrics installed are shared)."""
        self._programs.add(program)
        stats = self.graphs.get(program.name)
        if stats is None:
            stats = self.graphs[program.name] = GraphStats()
        stats.programs.append(program)
        if program.call_counts is None:
            program.call_bounds = CALL_BUCKETS
            program.call_counts = [0] * (len(CALL_BUCKETS) + 1)
            program.first_counts = [0] * (len(CALL_BUCKETS) + 1)
        for node in program.nodes:
            if not node.interface or node in self._nodes:
                continue
            self._nodes.add(node)
            if node.duration_counts is None:
                node.duration_bounds = ACTIVATION_BUCKETS
                node.duration_counts = [0] * (len(ACTIVATION_BUCKETS) + 1)
            key = (node.role, node.method)
            interface = self.interfaces.get(key)
            if interface is None:
                interface = self.interfaces[key] = InterfaceStats(*key)
            interface.nodes.append(node)

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
            by_status = stats.by_status()
            for status, count in sorted(by_status.items()):
                calls.add_metric([graph, status], count)
            in_flight.add_metric([graph], stats.started - sum(by_status.values()))
            durations, firsts = stats.latency("call_counts", "call_sum"), stats.latency("first_counts", "first_sum")
            latency.add_metric([graph], durations.cumulative(), durations.total)
            first.add_metric([graph], firsts.cumulative(), firsts.total)
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
        yield from self.metrics.audio.families()


def _bound(seconds: float) -> str:
    return repr(float(seconds))
