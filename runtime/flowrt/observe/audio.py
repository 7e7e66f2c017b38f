"""Time to first audio (TTFA) and the real-time factor (RTF) of calls that stream audio to their
caller, as the front door that delivers their events sees them (docs/observe.md, "Audio").

An audio value is one whose `summary()` is `{"audio": {"samples": N, "sample_rate": HZ, ...}}`
(flowstd's speech chunks); a `stream` event carrying one is an audio frame. For one call:

- **TTFA**: from the moment its input was complete to its first audio frame leaving the server.
  The input is complete when the call starts, or, for a graph with streaming entries, when its
  caller ended them (the WebSocket's `end`, the Realtime endpoint's commit). Where audio comes
  before that (a graph that answers while the input still streams, such as a voice graph whose
  end-of-turn detector decides on its own), it is measured from the caller's latest input
  before the first audio: the moment the answer could have started.
- **RTF**: the time from the first audio frame to the last, over the duration of the audio
  before the last frame (what a player had to play while waiting for the rest). Below 1,
  playback never waits. A call with one audio frame has no RTF.

`AudioClock` follows one call (the front door calls `input(now)` for each input it passes on,
`ended(now)` when the input is complete, `saw(event, now)` for each event it sends; `now` is the
observers' clock, flowrt.observe.hooks.now); `AudioFigures` keeps per-graph histograms of both,
read into /metrics (flowrt.observe.metrics adds its families) and by `flowc top`; `traced` puts
one call's figures into its Chrome trace (`?trace=1`): an instant event "first audio" on the
caller's lane and both figures in `otherData`. Nothing here touches the control core: a call
whose events never leave through a front door is not timed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
from prometheus_client.core import HistogramMetricFamily, Metric

TTFA_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
RTF_BUCKETS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0)


def audio_seconds(value: Any) -> float | None:
    """The duration of an audio value, else None (including a value whose summary() raises)."""
    summary = getattr(value, "summary", None)
    if summary is None:
        return None
    try:
        audio = summary().get("audio")
        return audio["samples"] / audio["sample_rate"]
    except Exception:  # (a value's own summary() failing is not the clock's business)
        return None


class AudioClock:
    """One call's audio times (see the module)."""

    __slots__ = ("graph", "since", "complete", "first", "last", "frames")

    def __init__(self, graph: str, started: float, streaming: bool = False):
        self.graph = graph
        self.since = started  # the latest input before the first audio frame
        self.complete = not streaming  # whether the input is complete
        self.first: float | None = None
        self.last = 0.0
        self.frames: list[float] = []  # each audio frame's seconds

    def input(self, now: float) -> None:
        if self.first is None and not self.complete:
            self.since = now

    def ended(self, now: float) -> None:
        if self.first is None and not self.complete:
            self.since, self.complete = now, True

    def saw(self, event: dict, now: float) -> None:
        if event.get("event") != "stream":
            return
        seconds = audio_seconds(event.get("value"))
        if seconds is None:
            return
        if self.first is None:
            self.first = now
        self.last = now
        self.frames.append(seconds)

    @property
    def ttfa(self) -> float | None:
        return None if self.first is None else max(0.0, self.first - self.since)

    @property
    def rtf(self) -> float | None:
        played = sum(self.frames[:-1])
        if self.first is None or played <= 0:
            return None
        return (self.last - self.first) / played


class _Histogram:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds, self.counts, self.total = bounds, [0] * (len(bounds) + 1), 0.0

    def add(self, value: float) -> None:
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))
        self.counts[index] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        running, buckets = 0, []
        for bound, count in zip((*(repr(float(b)) for b in self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            buckets.append((bound, running))
        return buckets


class AudioFigures:
    """Per graph: a histogram of TTFA and one of RTF over the calls recorded."""

    def __init__(self) -> None:
        self.ttfa: dict[str, _Histogram] = {}
        self.rtf: dict[str, _Histogram] = {}

    def record(self, clock: AudioClock) -> None:
        """Add a call that has ended (one with no audio frame adds nothing)."""
        if clock.ttfa is not None:
            self.ttfa.setdefault(clock.graph, _Histogram(TTFA_BUCKETS)).add(clock.ttfa)
        if clock.rtf is not None:
            self.rtf.setdefault(clock.graph, _Histogram(RTF_BUCKETS)).add(clock.rtf)

    def statistics(self) -> dict[str, int]:
        return {"graphs_timed": len(self.ttfa), "calls_timed": sum(sum(h.counts) for h in self.ttfa.values())}

    def families(self) -> Iterator[Metric]:
        ttfa = HistogramMetricFamily(
            "flowrt_time_to_first_audio_seconds",
            "From a call's input being complete (or its latest input before the audio) to its first audio frame sent.",
            labels=["graph"],
        )
        rtf = HistogramMetricFamily(
            "flowrt_audio_real_time_factor",
            "A call's time from first to last audio frame over the seconds of audio before the last (below 1: no stall).",
            labels=["graph"],
        )
        for family, histograms in ((ttfa, self.ttfa), (rtf, self.rtf)):
            for graph, histogram in sorted(histograms.items()):
                family.add_metric([graph], histogram.cumulative(), histogram.total)
            yield family


def traced(trace_json: bytes, clock: AudioClock, origin: float, pid: int) -> bytes:
    """A call's Chrome trace JSON (flowrt.observe.trace, which starts at `origin`, in process
    `pid`) with the call's audio figures, or as it was if the call sent no audio."""
    if clock.first is None:
        return trace_json
    trace = msgspec.json.decode(trace_json)
    figures = {"time_to_first_audio_ms": round(clock.ttfa * 1e3, 3)}
    if clock.rtf is not None:
        figures["audio_real_time_factor"] = round(clock.rtf, 4)
    at = round((clock.first - origin) * 1e6, 3)
    trace["traceEvents"].append(
        {"name": "first audio", "cat": "audio", "ph": "i", "s": "p", "ts": at, "pid": pid, "tid": 1, "args": figures}
    )
    trace.setdefault("otherData", {}).update(figures)
    return msgspec.json.encode(trace)
