"""Roles that misbehave at run time, on the real embedded runtime.

Each row runs one role that breaks its contract or fails (raises, even `SystemExit`; returns a
field its interface does not declare; yields twice from an interface that does not stream;
never awaits) and asserts the call's `done` event: its status, an error naming the role, the
interface and the fix, the place in the role's code (`where`), that the runtime then runs a good
call, and that `statistics()` is back to zero. A few tests run the same over a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re

import pytest

from tests.robustness.test_http_inputs import post, serving
from tests.runtime.harness import (
    assert_clean,
    bundle_of,
    collect,
    done,
    finishes_within,
    open_runtime,
    returned,
    where_in,
)

FLOW = """
placeholder request: Json

role bad {
    impl "m:Bad"
    interface run { in request  out OUTPUTS  LIMIT }
}

role good {
    impl "m:Good"
    interface run { in request  out fine: Json }
}

graph g {
    entry  request
    FIELD
}

graph ok {
    entry  request
    return fine
}
"""


class Good:
    async def run(self, ctx, request):
        return {"fine": request}


def role(body):
    """A role class whose `run` is `body`."""
    return type("Bad", (), {"run": body})


async def undeclared_field(self, ctx, request):
    return {"answer": 1, "answr": 2}


async def only_undeclared(self, ctx, request):
    return {"reply": 1}


async def not_a_dict(self, ctx, request):
    return ["answer", 1]


async def none_returned(self, ctx, request):
    return None


async def yields_twice(self, ctx, request):
    yield {"answer": 1}
    yield {"answer": 2}


async def streams_undeclared(self, ctx, request):
    yield {"answer": 1}
    yield {"answer": 2, "extra": 3}


async def streams_a_string(self, ctx, request):
    yield "answer"


async def raises_value_error(self, ctx, request):
    raise ValueError("cannot do that")


async def raises_system_exit(self, ctx, request):
    raise SystemExit(3)


async def raises_keyboard_interrupt(self, ctx, request):
    raise KeyboardInterrupt


async def raises_after_awaiting(self, ctx, request):
    await asyncio.sleep(0)
    raise LookupError("no such voice")


async def streams_then_raises(self, ctx, request):
    yield {"answer": 1}
    await asyncio.sleep(0)
    raise SystemExit("stop")


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no")


async def raises_unprintable(self, ctx, request):
    raise Unprintable


async def raises_stop_iteration(self, ctx, request):
    raise StopIteration


async def never_returns(self, ctx, request):
    await asyncio.Event().wait()


async def never_awaits(self, ctx, request):
    while True:
        yield {"answer": 1}


async def key_not_a_string(self, ctx, request):
    return {1: "one"}


async def raises_generator_exit(self, ctx, request):
    raise GeneratorExit


async def raises_timeout_error(self, ctx, request):
    raise TimeoutError("backend")


async def raises_cancelled_error(self, ctx, request):
    raise asyncio.CancelledError


class Interrupting(Exception):
    def __str__(self):
        raise KeyboardInterrupt


async def raises_str_interrupting(self, ctx, request):
    raise Interrupting


async def swallows_timeout_and_streams(self, ctx, request):
    while True:
        with contextlib.suppress(asyncio.CancelledError):  # carries on regardless
            await asyncio.sleep(0)
        yield {"answer": 1}


async def swallows_timeout_and_returns(self, ctx, request):
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.Event().wait()
    return {"answer": 1}


RETURN, STREAM = ("answer: Json", "return answer"), ("stream answer: Json", "stream answer")

# (id, role's run, (out clause, graph field), interface timeout, status, message words, where: text in the role or
# "def"). A frame that reached the caller before the role failed makes the status `ok` (DESIGN §5: `error` only
# where an error left a field unreachable); the error is listed all the same.
ROWS = [
    (
        "returns-an-undeclared-field",
        undeclared_field,
        RETURN,
        "",
        "error",
        r"`bad.run` produced `answr`, which its interface does not declare \(it declares `answer`\); "
        r"add it to the interface's `out` clause",
        "def",
    ),
    ("returns-only-undeclared", only_undeclared, RETURN, "", "error", r"produced `reply`, which", "def"),
    (
        "returns-a-list",
        not_a_dict,
        RETURN,
        "",
        "error",
        r"must yield or return a dict of its out fields \(`answer`\), not list",
        "def",
    ),
    ("returns-none", none_returned, RETURN, "", "ok", None, None),
    (
        "non-stream-yields-twice",
        yields_twice,
        RETURN,
        "",
        "ok",
        r"`bad.run` yielded a second frame, but its interface is not `out stream`.*declare `out stream",
        'yield {"answer": 2}',
    ),
    ("stream-yields-undeclared", streams_undeclared, STREAM, "", "ok", r"produced `extra`, which", '"extra": 3'),
    ("stream-yields-a-string", streams_a_string, STREAM, "", "error", r"not str", 'yield "answer"'),
    ("raises", raises_value_error, RETURN, "", "error", r"^ValueError: cannot do that$", "raise ValueError"),
    ("raises-system-exit", raises_system_exit, RETURN, "", "error", r"^SystemExit: 3$", "raise SystemExit"),
    ("raises-keyboard-interrupt", raises_keyboard_interrupt, RETURN, "", "error", r"^KeyboardInterrupt: $", "raise Keyboard"),
    ("raises-after-awaiting", raises_after_awaiting, RETURN, "", "error", r"^LookupError: no such voice$", "raise LookupError"),
    ("stream-raises-system-exit", streams_then_raises, STREAM, "", "ok", r"^SystemExit: stop$", "raise SystemExit"),
    (
        "exception-str-raises",
        raises_unprintable,
        RETURN,
        "",
        "error",
        r"^Unprintable: \(its message could not be shown",
        "raise Unp",
    ),
    (
        "raises-stop-iteration",
        raises_stop_iteration,
        RETURN,
        "",
        "error",
        r"^RuntimeError: coroutine raised StopIteration",
        "raise Stop",
    ),
    (
        "never-returns-with-timeout",
        never_returns,
        RETURN,
        "timeout 50ms",
        "cancelled",
        r"^timed out after 0.05s$",
        "Event().wait",
    ),
    (
        "never-awaits-with-timeout",
        never_awaits,
        STREAM,
        "timeout 50ms",
        "cancelled",
        r"^timed out after 0.05s$",
        'yield {"answer"',
    ),
    ("key-not-a-string", key_not_a_string, RETURN, "", "error", r"produced `1`, which its interface does not declare", "def"),
    ("raises-generator-exit", raises_generator_exit, RETURN, "", "error", r"^GeneratorExit: $", "raise GeneratorExit"),
    ("raises-its-own-timeout", raises_timeout_error, RETURN, "", "error", r"^TimeoutError: backend$", "raise TimeoutError"),
    (
        "raises-its-own-timeout-under-a-timeout",
        raises_timeout_error,
        RETURN,
        "timeout 10s",
        "error",
        r"^TimeoutError: backend$",
        "raise TimeoutError",
    ),
    ("raises-cancelled-error", raises_cancelled_error, RETURN, "", "error", r"^CancelledError: $", "raise asyncio"),
    (
        "str-raises-keyboard-interrupt",
        raises_str_interrupting,
        RETURN,
        "",
        "error",
        r"could not be shown: KeyboardInt",
        "raise Int",
    ),
    ("swallows-timeout-streams-on", swallows_timeout_and_streams, STREAM, "timeout 50ms", "cancelled", r"^timed out after", None),
    ("swallows-timeout-returns", swallows_timeout_and_returns, RETURN, "timeout 50ms", "cancelled", r"^timed out after", None),
]


@pytest.mark.parametrize(
    ("body", "shape", "timeout", "status", "words", "where"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_a_misbehaving_role_fails_its_call_with_the_place_and_the_fix(tmp_path, body, shape, timeout, status, words, where):
    out, field = shape
    flow = FLOW.replace("OUTPUTS", out).replace("FIELD", field).replace("LIMIT", timeout)

    async def main():
        rt = await open_runtime(flow, tmp_path, {"bad": role(body)(), "good": Good()})
        events = await collect(rt, "g", {"request": 1})
        assert_clean(rt)
        again = await collect(rt, "ok", {"request": 2})  # the runtime is unharmed
        assert returned(again) == {"fine": 2}
        assert_clean(rt)
        return events

    end = done(finishes_within(30, main()))
    assert end["status"] == status
    if words is None:  # returning None is producing nothing: the output is missing, no error
        assert end["errors"] == [] and end["missing"] == ["answer"]
        return
    [error] = end["errors"]
    assert (error["role"], error["interface"]) == ("bad", "run")
    assert re.search(words, error["message"]), error["message"]
    if where is not None:
        assert error["where"] == where_in(body, "" if where == "def" else where)


def test_a_role_failure_is_logged_with_its_place_and_traceback(tmp_path, caplog):
    async def main():
        rt = await open_runtime(
            FLOW.replace("OUTPUTS", RETURN[0]).replace("FIELD", RETURN[1]).replace("LIMIT", ""),
            tmp_path,
            {"bad": role(raises_after_awaiting)(), "good": Good()},
        )
        return await collect(rt, "g", {"request": 1}, session="s1")

    with caplog.at_level(logging.WARNING, logger="flowrt"):
        asyncio.run(main())
    [record] = [r for r in caplog.records if r.name == "flowrt"]
    assert "session s1" in record.getMessage() and "bad.run" in record.getMessage()
    assert where_in(raises_after_awaiting, "raise LookupError") in record.getMessage()
    assert record.exc_info[0] is LookupError


ROLES_FILE = """
import asyncio


class Bad:
    async def run(self, ctx, request):
        if request == "exit":
            raise SystemExit(1)
        if request == "interrupt":
            raise KeyboardInterrupt
        return {"answer": {"undeclared": 1} if request == "shape" else request}


class Good:
    async def run(self, ctx, request):
        return {"fine": request}
"""


@pytest.mark.parametrize("debug", [False, True], ids=["brief-log", "debug-log"])
def test_a_served_role_that_raises_system_exit_fails_the_call_not_the_server(tmp_path, debug):
    (tmp_path / "m.py").write_text(ROLES_FILE)
    bundle = bundle_of(FLOW.replace("OUTPUTS", RETURN[0]).replace("FIELD", RETURN[1]).replace("LIMIT", ""), tmp_path)
    log = tmp_path / "server.log"
    with serving(bundle, log, debug=debug) as server:
        for request in ["exit", "interrupt", "exit"]:
            status, _, body = server.send(post("/graphs/g", json.dumps({"request": request}).encode()))
            assert status == 200
            end = json.loads(body.splitlines()[-1])
            assert end["status"] == "error" and end["errors"][0]["where"].endswith("m.py:8" if request == "exit" else "m.py:10")
        status, _, body = server.send(post("/graphs/ok", b'{"request": 5}'))
        assert status == 200 and json.loads(body.splitlines()[0])["value"] == 5
        assert server.process.poll() is None
        assert not any(server.stats().values())
    text = log.read_text()
    assert "Task exception was never retrieved" not in text
    assert "bad.run on replica 0 failed at" in text and "SystemExit: 1" in text
    assert ("Traceback (most recent call last)" in text) == debug, text


TWO_STAGES = """
placeholder request: Json

role first {
    impl "m:First"
    interface run { in request  out stream part: Json }
}

role second {
    impl "m:Second"
    interface run { in part  out stream piece: Json }
}

graph g {
    entry  request
    stream piece
}
"""


class Second:
    async def run(self, ctx, part):
        yield {"piece": part}


@pytest.mark.parametrize("raised", [GeneratorExit, TimeoutError, asyncio.CancelledError, SystemExit])
def test_a_role_that_fails_while_work_waits_behind_it_still_ends_the_call(tmp_path, raised):
    """The frame `first` yields readies `second`, which waits for first's task; first then
    raises: second must still run and the call end, with the error reported."""

    class First:
        async def run(self, ctx, request):
            yield {"part": 1}
            raise raised("backend")

    async def main():
        rt = await open_runtime(TWO_STAGES, tmp_path, {"first": First(), "second": Second()})
        events = await collect(rt, "g", {"request": 1}, timeout=20)
        assert_clean(rt)
        return events

    events = finishes_within(30, main())
    end = done(events)
    assert [e["value"] for e in events if e["event"] == "stream"] == [1]
    assert [e["message"] for e in end["errors"]] == [f"{raised.__name__}: backend"]
    assert end["status"] == "ok"  # the frame reached the caller (rule 10)


BROADCAST = """
placeholder request: Json

role hose {
    impl "m:Hose"
    replicas 2
    lb broadcast
    interface run { in request  out stream drop: Json  timeout 200ms }
}

graph g {
    entry  request
    stream drop
}
"""


class Hose:
    def __init__(self, forever: bool):
        self.forever = forever

    async def run(self, ctx, request):
        yield {"drop": 1}
        while self.forever:
            yield {"drop": 2}


def test_a_broadcast_replica_that_never_awaits_is_stopped_by_the_timeout(tmp_path):
    async def main():
        rt = await open_runtime(BROADCAST, tmp_path, {"hose": [Hose(False), Hose(True)]})
        events = await collect(rt, "g", {"request": 1})
        assert_clean(rt)
        return events

    end = done(finishes_within(30, main()))
    assert end["status"] == "cancelled" and end["reason"] == "timeout"


def test_a_role_that_swallows_its_calls_cancellation_stops_when_the_caller_goes(tmp_path):
    async def main():
        flow = FLOW.replace("OUTPUTS", STREAM[0]).replace("FIELD", STREAM[1]).replace("LIMIT", "")
        rt = await open_runtime(flow, tmp_path, {"bad": role(swallows_timeout_and_streams)(), "good": Good()})
        events = rt.call("g", {"request": 1})
        async for event in events:
            if event["event"] == "stream":
                break
        await events.aclose()  # cancels the call; the role catches it and yields on
        assert_clean(rt)

    finishes_within(30, main())
