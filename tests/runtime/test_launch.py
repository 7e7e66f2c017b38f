"""How activations are launched: eagerly on Python 3.12+ (a role that never suspends costs no
turn of the event loop), as scheduled tasks otherwise; either way a role's own task is the
current task while it runs, and deep chains of synchronous roles do not recurse without bound."""

from __future__ import annotations

import asyncio

import pytest

from flowrt.control import call as call_module
from tests.runtime.harness import assert_clean, collect, done, open_runtime, returned
from tests.runtime.test_scenarios import LOOP, Agent, Tools

# the launch modes this interpreter has (eager tasks need Python 3.12)
MODES = [False, True] if call_module.EAGER_TASKS else [False]

CHAIN = """
placeholder request: Json

role first {
    impl "m:First"
    interface run { in request  out middle: Json }
}

role second {
    impl "m:Second"
    interface run { in middle  out result: Json }
}

graph g {
    entry  request
    return result
}
"""


class First:
    async def run(self, ctx, request):
        return {"middle": request + 1}


class Second:
    async def run(self, ctx, middle):
        return {"result": middle * 10}


@pytest.mark.parametrize("eager", MODES)
def test_a_call_of_synchronous_roles_is_done_before_the_loop_turns_only_when_eager(tmp_path, monkeypatch, eager):
    monkeypatch.setattr(call_module, "EAGER_TASKS", eager)

    async def main():
        rt = await open_runtime(CHAIN, tmp_path, {"first": First(), "second": Second()})
        events = rt.call("g", {"request": 1})
        loop_turned = []
        asyncio.get_running_loop().call_soon(loop_turned.append, True)  # runs at the loop's next turn
        first = await events.__anext__()  # starts the call; the caller waits only if nothing is out yet
        finished_without_the_loop = not loop_turned and next(iter(rt.calls)).ended
        rest = [event async for event in events]
        assert returned([first, *rest]) == {"result": 20}
        assert done(rest)["status"] == "ok"
        assert finished_without_the_loop == eager
        assert_clean(rt)

    asyncio.run(main())


@pytest.mark.parametrize("eager", MODES)
def test_a_long_loop_of_synchronous_roles_does_not_recurse(tmp_path, monkeypatch, eager):
    """Without a session node to serialise it, each round starts the next while its own
    generator is still open, one eager task inside the other; past MAX_EAGER_DEPTH new tasks
    go back to the loop, so 400 rounds (thousands of Python frames if nested) finish."""
    monkeypatch.setattr(call_module, "EAGER_TASKS", eager)

    async def main():
        rt = await open_runtime(LOOP.replace("    lb session\n", ""), tmp_path, {"agent": Agent(), "tools": Tools()})
        events = await asyncio.wait_for(collect(rt, "ask", {"question": {"rounds": 400}}), 30)
        assert done(events) == {"event": "done", "status": "ok", "errors": [], "missing": []}
        assert returned(events) == {"answer": 401}
        assert_clean(rt)

    asyncio.run(main())


GUARDED = """
placeholder request: Json

role guard {
    impl "m:Guard"
    interface run { in request  out verdict: Json }
}

role peer {
    impl "m:Peer"
    interface run { in request  out note: Json }
}

graph g {
    entry  request
    return verdict, note
}
"""


class Guard:
    """Bounds its own wait with asyncio.timeout, which cancels whatever task is current."""

    async def run(self, ctx, request):
        try:
            async with asyncio.timeout(0.02):
                await asyncio.Event().wait()  # never set
        except TimeoutError:
            return {"verdict": "gave up"}
        return {"verdict": "unreachable"}


class Peer:
    def __init__(self):
        self.release = asyncio.Event()

    async def run(self, ctx, request):
        await self.release.wait()
        return {"note": "finished"}


@pytest.mark.parametrize("eager", MODES)
def test_a_roles_own_timeout_cancels_only_that_role(tmp_path, monkeypatch, eager):
    monkeypatch.setattr(call_module, "EAGER_TASKS", eager)

    async def main():
        peer = Peer()
        rt = await open_runtime(GUARDED, tmp_path, {"guard": Guard(), "peer": peer})
        caller = asyncio.current_task()
        received = []
        async for event in rt.call("g", {"request": 1}):
            received.append(event)
            if event.get("field") == "verdict":
                assert caller.cancelling() == 0  # the guard's timeout did not hit the caller's task
                peer.release.set()
        assert returned(received) == {"verdict": "gave up", "note": "finished"}
        assert done(received)["status"] == "ok"
        assert_clean(rt)

    asyncio.run(main())


STARTED_LATE = """
placeholder request: Json

role source {
    impl "m:Source"
    interface run {
        in  request
        out stream a_shown: Json, x: Json
    }
}

role work {
    impl "m:Work"
    interface run { in x  out done: Json }
}

graph g {
    entry  request
    stream a_shown
    return done
}
"""


class Source:
    async def run(self, ctx, request):
        # a_shown reaches the caller before x readies `work`, so the caller wakes first in the
        # next turn of the loop, ahead of work's new task
        yield {"a_shown": 1, "x": 1}
        await asyncio.Event().wait()  # until the call is cancelled


class Work:
    def __init__(self):
        self.ran = False

    async def run(self, ctx, x):
        self.ran = True
        return {"done": x}


@pytest.mark.parametrize("eager", MODES)
def test_a_call_cancelled_before_a_new_task_has_started_still_ends(tmp_path, monkeypatch, eager):
    """The caller leaves while an activation's task is created but has not run yet: cancelling
    that task would skip its body (and its bookkeeping) entirely, so the call must not."""
    monkeypatch.setattr(call_module, "EAGER_TASKS", eager)

    async def main():
        work = Work()
        rt = await open_runtime(STARTED_LATE, tmp_path, {"source": Source(), "work": work})
        stream = rt.call("g", {"request": 1})
        first = await stream.__anext__()
        assert first == {"event": "stream", "field": "a_shown", "value": 1}
        await stream.aclose()  # the caller goes away in this very step: cancels the call
        assert rt.last_call is not None and rt.last_call.ended
        # scheduled, its task had not started when the call was cancelled; eager, it ran at once
        assert work.ran == eager
        assert_clean(rt)

    asyncio.run(asyncio.wait_for(main(), 10))  # a call that never ends fails here, not by hanging
