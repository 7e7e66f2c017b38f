"""GET /metrics on a real server (`flowc run DIR --http`, inproc): prometheus_client's own
parser reads it, and its counts are those of the calls this test made, by graph, status,
role and interface."""

from __future__ import annotations

import http.client
import json
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.observe.helpers import BROKEN_IMAGE, REQUEST, RUNS, TEXT_ONLY, build_image_chat
from tests.runtime.test_serve import lines, serving


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return build_image_chat(tmp_path_factory.mktemp("metrics"))


def scrape(server) -> tuple[http.client.HTTPResponse, dict]:
    """The answer to GET /metrics and its samples: (name, labels as sorted pairs) -> value."""
    connection = server.connect()
    connection.request("GET", "/metrics")
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return response, samples


def test_metrics_count_the_calls_made_by_graph_status_and_role(bundle):
    made = [("request", REQUEST), ("request", REQUEST), ("text_only", TEXT_ONLY), ("broken_image", BROKEN_IMAGE)]
    statuses: Counter = Counter()
    expected: Counter = Counter()
    with serving(bundle) as server:
        _, before = scrape(server)
        assert not [k for k in before if k[0] == "flowrt_calls_total"]  # nothing counted before the first call
        for index, (kind, request) in enumerate(made):
            events = lines(server.post("/graphs/chat", json.dumps(request).encode(), {"X-Flow-Session": f"s{index % 2}"}))
            statuses[events[-1]["status"]] += 1
            expected += RUNS[kind]
        assert server.post("/graphs/draw", b"{}").status == 404  # refused before it runs: not a call
        response, samples = scrape(server)
    assert response.status == 200 and response.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    assert statuses == {"ok": 3, "error": 1}
    calls = {dict(labels)["status"]: value for (name, labels), value in samples.items() if name == "flowrt_calls_total"}
    assert calls == {"ok": 3, "error": 1}
    assert samples[("flowrt_calls_in_flight", (("graph", "chat"),))] == 0
    assert samples[("flowrt_call_duration_seconds_count", (("graph", "chat"),))] == 4
    assert samples[("flowrt_call_duration_seconds_bucket", (("graph", "chat"), ("le", "+Inf")))] == 4
    counted = Counter(
        {
            (labels["role"], labels["interface"], labels["outcome"]): int(value)
            for (name, pairs), value in samples.items()
            if name == "flowrt_activations_total" and value and (labels := dict(pairs))
        }
    )
    assert counted == expected
    for (role, interface, _), _count in expected.items():
        labels = (("interface", interface), ("role", role))
        assert samples[("flowrt_activations_in_flight", labels)] == 0
        ended = sum(v for (r, i, _), v in expected.items() if (r, i) == (role, interface))
        assert samples[("flowrt_activation_duration_seconds_count", labels)] == ended
    # llm streams 3 tokens and a hidden state per segment: 2 + 2 + 1 segments reached it
    assert samples[("flowrt_frames_total", (("interface", "generate"), ("role", "llm")))] == 5 * 4


def test_a_second_server_over_one_runtime_counts_each_call_once(bundle):
    import asyncio

    from flowrt.control import Runtime
    from flowrt.gateway.http import IN_FLIGHT, METRICS, application
    from flowrt.observe import Metrics
    from flowrt.observe.calls import CallsInFlight

    async def scenario():
        runtime = await Runtime.open(bundle)
        try:
            first, second = application(runtime), application(runtime)
            assert first[METRICS] is second[METRICS] and first[IN_FLIGHT] is second[IN_FLIGHT]
            observers = getattr(runtime.observer, "observers", (runtime.observer,))
            assert sum(isinstance(o, Metrics) for o in observers) == 1
            assert sum(isinstance(o, CallsInFlight) for o in observers) == 1
            async for _ in runtime.call("chat", REQUEST):
                pass
            assert first[METRICS].graphs["chat"].started == 1
        finally:
            await runtime.close()

    asyncio.run(scenario())


def test_the_core_counts_every_call_and_times_the_observed_ones(bundle):
    """Calls are counted by the control core from the runtime's start (a call made before
    Metrics was installed too); only calls with an observer are timed into the histograms
    Metrics installed, and only a call that emitted an output has a time to its first one."""
    import asyncio

    from flowrt.control import Runtime
    from flowrt.observe import Metrics

    def parsed(metrics: Metrics) -> dict:
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(metrics.exposition().decode())
            for sample in family.samples
        }

    async def scenario():
        runtime = await Runtime.open(bundle)
        try:
            async for _ in runtime.call("chat", REQUEST):  # unobserved
                pass
            metrics = runtime.observer = Metrics()
            outputs = 0
            for inputs in (REQUEST, BROKEN_IMAGE):
                events = [event async for event in runtime.call("chat", inputs)]
                outputs += any(event["event"] in ("stream", "return") for event in events)
            runtime.observer = None
            async for _ in runtime.call("chat", REQUEST):  # unobserved again
                pass
            return parsed(metrics), outputs
        finally:
            await runtime.close()

    samples, outputs = asyncio.run(scenario())
    chat = (("graph", "chat"),)
    calls = {dict(labels)["status"]: value for (name, labels), value in samples.items() if name == "flowrt_calls_total"}
    assert sum(calls.values()) == 4 and calls["ok"] == 3  # every call, observed or not
    assert samples[("flowrt_calls_in_flight", chat)] == 0
    assert samples[("flowrt_call_duration_seconds_count", chat)] == 2  # the two observed calls only
    assert 0 < samples[("flowrt_call_duration_seconds_sum", chat)] < 60
    assert samples[("flowrt_first_frame_seconds_count", chat)] == outputs >= 1  # observed calls that emitted an output
    assert samples[("flowrt_first_frame_seconds_sum", chat)] <= samples[("flowrt_call_duration_seconds_sum", chat)]
