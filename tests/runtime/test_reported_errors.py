"""A call's `done` lists at most MAX_REPORTED_ERRORS errors one by one and counts the rest in one
more line (flowrt.control.contract.reported): a role that fails on every frame of a long stream
(found by a fault trial: a talker replica killed mid-reply made a 540 kB error) gives a short
`done`, still `error`, still flagged `bad_input` only when every error is the caller's."""

from __future__ import annotations

import asyncio

import flowrt
from flowrt.control.contract import MAX_REPORTED_ERRORS
from tests.runtime.harness import assert_clean, collect, done, open_runtime

FLOW = """flow t

placeholder request: Json

role source {
    impl "m:Source"
    interface emit { in request  out stream item: Json }
}

role sink {
    impl "m:Sink"
    interface take { in item  out stream kept: Json }
}

graph g {
    entry  request
    stream kept
}
"""


class Source:
    async def emit(self, ctx, request):
        for index in range(request["items"]):
            yield {"item": {"index": index, "bad": request["bad"]}}


class Sink:
    async def take(self, ctx, item):
        if item["bad"]:
            raise flowrt.BadInput(f"item {item['index']} is bad")
        raise RuntimeError(f"item {item['index']} broke the sink")
        yield {}  # (a generator)


def test_a_long_run_of_failures_is_listed_in_part_and_counted(tmp_path):
    async def run():
        runtime = await open_runtime(FLOW, tmp_path, {"source": Source(), "sink": Sink()})
        try:
            many = done(await collect(runtime, "g", {"request": {"items": 40, "bad": False}}))
            bad = done(await collect(runtime, "g", {"request": {"items": 40, "bad": True}}))
            few = done(await collect(runtime, "g", {"request": {"items": MAX_REPORTED_ERRORS, "bad": False}}))
            assert_clean(runtime)
            return many, bad, few
        finally:
            await runtime.close()

    many, bad, few = asyncio.run(run())
    assert many["status"] == "error" and len(many["errors"]) == MAX_REPORTED_ERRORS + 1
    assert many["errors"][-1]["message"] == f"and {40 - MAX_REPORTED_ERRORS} more error(s); the server's log has each"
    assert "bad_input" not in many["errors"][-1] and all("broke the sink" in e["message"] for e in many["errors"][:-1])
    assert bad["errors"][-1].get("bad_input") is True and all(e.get("bad_input") for e in bad["errors"])
    assert len(few["errors"]) == MAX_REPORTED_ERRORS and "more error" not in few["errors"][-1]["message"]
