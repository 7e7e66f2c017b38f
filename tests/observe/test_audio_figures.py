"""Time to first audio and the real-time factor (flowrt.observe.audio): the clock's rules on a
virtual clock, and the histograms GET /metrics shows for calls a real server answered, whose
role streams audio values (a `summary()` of {"audio": {"samples", "sample_rate"}})."""

from __future__ import annotations

import json

import pytest

from flowrt.observe.audio import AudioClock, AudioFigures, audio_seconds
from tests.deploy.helpers import bundle_with_roles
from tests.observe.test_metrics import scrape
from tests.runtime.test_serve import lines, serving


class Chunk:
    def __init__(self, samples: int, rate: int = 16000):
        self.samples, self.rate = samples, rate

    def summary(self) -> dict:
        return {"audio": {"samples": self.samples, "sample_rate": self.rate}}


def audio(seconds: float) -> dict:
    return {"event": "stream", "field": "speech", "value": Chunk(int(seconds * 16000))}


def test_a_call_without_streaming_input_is_timed_from_its_start():
    clock = AudioClock("g", started=10.0)
    clock.saw({"event": "stream", "field": "reply", "value": "hi"}, 10.1)  # text: not audio
    clock.saw(audio(0.08), 10.25)
    clock.saw(audio(0.08), 10.30)
    clock.saw(audio(0.08), 10.40)
    clock.saw({"event": "done", "status": "ok"}, 10.5)
    assert clock.ttfa == pytest.approx(0.25)
    assert clock.rtf == pytest.approx(0.15 / 0.16)  # first to last, over the audio before the last


def test_streaming_input_is_timed_from_its_end_or_from_the_latest_input_before_the_audio():
    ended = AudioClock("g", started=0.0, streaming=True)
    for t in (0.1, 0.2, 0.3):
        ended.input(t)
    ended.ended(0.35)
    ended.saw(audio(0.1), 0.5)
    assert ended.ttfa == pytest.approx(0.15)
    answered_early = AudioClock("g", started=0.0, streaming=True)
    for t in (0.1, 0.2, 0.3):
        answered_early.input(t)
    answered_early.saw(audio(0.1), 0.42)
    answered_early.input(0.5)  # (after the first audio: no longer moves the clock)
    answered_early.ended(0.6)
    assert answered_early.ttfa == pytest.approx(0.12)


def test_no_audio_no_figures_and_one_frame_no_rtf():
    silent, single = AudioClock("g", 0.0), AudioClock("g", 0.0)
    single.saw(audio(0.1), 0.2)
    assert (silent.ttfa, silent.rtf) == (None, None)
    assert single.ttfa == pytest.approx(0.2) and single.rtf is None
    figures = AudioFigures()
    for clock in (silent, single):
        figures.record(clock)
    assert figures.statistics() == {"graphs_timed": 1, "calls_timed": 1}


def test_audio_values_are_told_by_their_summary():
    assert audio_seconds(Chunk(8000)) == pytest.approx(0.5)

    class Broken:
        def summary(self):
            raise RuntimeError("no")

    for other in ("text", {"audio": 1}, Broken(), Chunk.__new__(Chunk)):
        assert audio_seconds(other) is None


FLOW = """
placeholder request: Json

role speaker {
    impl "roles:Speaker"
    interface speak { in request  out stream speech: Audio, note: Json }
}

graph talk {
    entry  request
    stream speech ordered
    stream note
}
"""

ROLES = """
class Chunk:
    def __init__(self, samples):
        self.samples = samples

    def summary(self):
        return {"audio": {"samples": self.samples, "sample_rate": 16000}}


class Speaker:
    async def speak(self, ctx, request):
        yield {"note": "starting"}
        for _ in range(request["chunks"]):
            yield {"speech": Chunk(1280)}
"""


def test_metrics_show_the_audio_figures_of_calls_served_over_http(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    with serving(bundle) as server:
        for chunks in (3, 4, 0):  # (the last sends no audio: not timed)
            events = lines(server.post("/graphs/talk?summary=1", json.dumps({"request": {"chunks": chunks}}).encode()))
            assert events[-1]["status"] == "ok"
            assert sum(e.get("field") == "speech" for e in events) == chunks
        _, samples = scrape(server)
    graph = (("graph", "talk"),)
    assert samples[("flowrt_time_to_first_audio_seconds_count", graph)] == 2
    assert samples[("flowrt_audio_real_time_factor_count", graph)] == 2
    assert 0 <= samples[("flowrt_time_to_first_audio_seconds_sum", graph)] < 10


def test_a_traced_call_carries_its_audio_figures_in_its_trace(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    with serving(bundle) as server:
        (done,) = [e for e in lines(server.post("/graphs/talk?trace=1", b'{"request": {"chunks": 3}}')) if e["event"] == "done"]
        (quiet,) = [e for e in lines(server.post("/graphs/talk?trace=1", b'{"request": {"chunks": 0}}')) if e["event"] == "done"]
    trace = done["trace"]
    (first,) = [e for e in trace["traceEvents"] if e.get("name") == "first audio"]
    assert first["ph"] == "i" and first["ts"] >= 0 and first["args"]["time_to_first_audio_ms"] >= 0
    assert trace["otherData"]["time_to_first_audio_ms"] == first["args"]["time_to_first_audio_ms"]
    assert trace["otherData"]["audio_real_time_factor"] >= 0
    # (on the caller's lane, when the frame left the server: a quick call's events may all leave after its end)
    assert first["tid"] == 1 and first["pid"] == next(e for e in trace["traceEvents"] if e.get("cat") == "call")["pid"]
    assert "time_to_first_audio_ms" not in quiet["trace"]["otherData"]  # no audio, no figures
    assert not [e for e in quiet["trace"]["traceEvents"] if e.get("name") == "first audio"]
