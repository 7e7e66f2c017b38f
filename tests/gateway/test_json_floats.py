"""A float JSON cannot spell (NaN, an infinity) in what a role returns reaches clients as `null`,
never as Python's `NaN`, which JSON parsers refuse: the NDJSON lines of a real `flowc run
--http` server, what `flowc run --once` prints, OpenAI's server-sent events and the Realtime
API's events all parse under a strict parser."""

from __future__ import annotations

import json

import pytest

from flowrt.gateway.openai import _sse
from flowrt.gateway.realtime_events import event
from flowrt.values import event_json, json_text
from tests.deploy.helpers import bundle_with_roles
from tests.runtime.test_serve import flowc, serving

FLOW = """
flow floats

placeholder request: Json

role odd {
    impl "floats_roles:Odd"
    interface run { in request  out stream reading: Json, last: Json }
}

graph g {
    entry request
    stream reading
    return last
}
"""

ROLES = """
class Odd:
    async def run(self, ctx, request):
        yield {"reading": {"nan": float("nan"), "inf": float("inf"), "fine": 1.5}}
        yield {"last": [float("-inf"), (2.5, float("nan")), "é"]}
"""


def strict(text: str):
    def refuse(constant: str):
        raise AssertionError(f"{constant} is not JSON: {text}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("ascii", [False, True])
def test_json_text_writes_null_for_what_json_cannot_spell(ascii):
    value = {"a": float("nan"), "b": [1.5, float("inf"), {"c": -float("inf")}], "d": ("é", 2)}
    text = json_text(value, ascii=ascii)
    assert strict(text) == {"a": None, "b": [1.5, None, {"c": None}], "d": ["é", 2]}
    assert ("\\u00e9" in text) is ascii
    assert json_text({"fine": [0.1, 2]}) == json.dumps({"fine": [0.1, 2]})  # finite values as ever


def test_openai_stream_events_and_realtime_events_are_strict_json():
    assert strict(_sse({"x": float("nan")}).decode().removeprefix("data: ").strip()) == {"x": None}
    assert strict(_sse({"x": float("inf"), "s": "\ud800"}).decode().removeprefix("data: ").strip())["x"] is None
    assert strict(event("response.done", value=float("nan")))["value"] is None
    assert strict(event_json({"event": "return", "value": float("nan")})) == {"event": "return", "value": None}


def test_a_served_call_and_flowc_run_once_write_null(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path, module="floats_roles")
    want = [
        {"event": "stream", "field": "reading", "value": {"nan": None, "inf": None, "fine": 1.5}},
        {"event": "return", "field": "last", "value": [None, [2.5, None], "é"]},
    ]
    with serving(bundle) as server:
        response = server.post("/graphs/g", json.dumps({"request": 1}).encode())
        events = [strict(line) for line in response.read().decode().splitlines()]
    assert response.status == 200 and events[:2] == want and events[-1]["status"] == "ok", events
    once = flowc("run", str(bundle), "--once", "g", "--input", '{"request": 1}')
    assert once.returncode == 0, once.stderr
    assert [strict(line) for line in once.stdout.splitlines()][:2] == want
