"""How activations are launched: eagerly on Python 3.12+ (a role that never suspends costs no
turn of the event loop), as scheduled tasks otherwise; either way a role's own task is the
current task while it runs, and deep chains of synchronous roles do not recurse without bound."""

from __future__ import annotations

import asyncio

import pytest

from flowrt.control import call as call_module
from tests.runtime.harness import assert_clean, collect, done, open_runtime, returned, where_in
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


SIBLINGS = """
placeholder request: Json

role src {
    impl "m:Src"
    interface run {
        in  request
        out stream a: Json, b: Json
    }
}

role waiter {
    impl "m:Waiter"
    interface run {
        in  a
        out got: Json
        timeout {timeout}
    }
}

role helper {
    impl "m:Helper"
    interface run { in b  out helped: Json }
}

graph g {
    entry  request
    return got, helped
}
"""


class Handshake:
    """Shared by the roles of one test: the helper opens the gate the others wait on."""

    def __init__(self):
        self.gate = asyncio.Event()
        self.log: list[str] = []
        self.tasks: dict[str, asyncio.Task] = {}


class Src:
    def __init__(self, shake: Handshake, wait_after_frame: bool):
        self.shake, self.wait_after_frame = shake, wait_after_frame

    async def run(self, ctx, request):
        self.shake.tasks["src"] = asyncio.current_task()
        yield {"a": 1, "b": 2}
        if self.wait_after_frame:  # the next step suspends: the frame's activations must be running by then
            await self.shake.gate.wait()
            self.shake.log.append("src resumed")


class Waiter:
    def __init__(self, shake: Handshake, forever: bool = False):
        self.shake, self.forever = shake, forever
        self.cancelled = False

    async def run(self, ctx, a):
        self.shake.tasks["waiter"] = asyncio.current_task()
        try:
            if self.forever:
                await asyncio.Event().wait()
            await self.shake.gate.wait()  # helper, readied with this one, must run while this waits
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.shake.log.append("waiter resumed")
        return {"got": a}


class Helper:
    def __init__(self, shake: Handshake):
        self.shake = shake

    async def run(self, ctx, b):
        self.shake.tasks["helper"] = asyncio.current_task()
        self.shake.log.append("helper ran")
        self.shake.gate.set()
        return {"helped": b}


def siblings(timeout: str = "10s") -> str:
    return SIBLINGS.replace("{timeout}", timeout)


@pytest.mark.parametrize("eager", MODES)
def test_a_role_that_suspends_hands_the_waiting_activations_to_tasks_of_their_own(tmp_path, monkeypatch, eager):
    """waiter and helper are readied together; waiter runs first (in src's task, once src has
    ended) and awaits what helper does. helper must get a task of its own when waiter
    suspends, or the call deadlocks; waiter stays in the task it started in."""
    monkeypatch.setattr(call_module, "EAGER_TASKS", eager)

    async def main():
        shake = Handshake()
        rt = await open_runtime(
            siblings(), tmp_path, {"src": Src(shake, False), "waiter": Waiter(shake), "helper": Helper(shake)}
        )
        events = await collect(rt, "g", {"request": 1})
        assert returned(events) == {"got": 1, "helped": 2}
        assert done(events)["status"] == "ok"
        assert shake.log == ["helper ran", "waiter resumed"]
        assert shake.tasks["waiter"] is shake.tasks["src"] and shake.tasks["helper"] is not shake.tasks["src"]
        assert_clean(rt)

    asyncio.run(asyncio.wait_for(main(), 10))


@pytest.mark.parametrize("eager", MODES)
def test_a_stream_that_suspends_after_a_frame_hands_that_frames_activations_on(tmp_path, monkeypatch, eager):
    """src's frame readies waiter and helper, then src's next step awaits what helper does."""
    monkeypatch.setattr(call_module, "EAGER_TASKS", eager)

    async def main():
        shake = Handshake()
        rt = await open_runtime(siblings(), tmp_path, {"src": Src(shake, True), "waiter": Waiter(shake), "helper": Helper(shake)})
        events = await collect(rt, "g", {"request": 1})
        assert returned(events) == {"got": 1, "helped": 2}
        assert shake.log[0] == "helper ran" and sorted(shake.log[1:]) == ["src resumed", "waiter resumed"]
        assert_clean(rt)

    asyncio.run(asyncio.wait_for(main(), 10))


@pytest.mark.parametrize("eager", MODES)
def test_a_timeout_cancels_a_role_stepped_by_hand(tmp_path, monkeypatch, eager):
    """waiter suspends with helper waiting behind it, so it runs stepped by hand; its interface
    timeout must reach it as a cancellation, as through a plain await."""
    monkeypatch.setattr(call_module, "EAGER_TASKS", eager)

    async def main():
        shake = Handshake()
        waiter = Waiter(shake, forever=True)
        rt = await open_runtime(siblings("50ms"), tmp_path, {"src": Src(shake, False), "waiter": waiter, "helper": Helper(shake)})
        events = await collect(rt, "g", {"request": 1})
        end = done(events)
        assert waiter.cancelled and end["status"] == "cancelled"
        where = where_in(Waiter.run, "await asyncio.Event().wait()")  # where the timeout found it
        assert end["errors"] == [{"role": "waiter", "interface": "run", "message": "timed out after 0.05s", "where": where}]
        assert returned(events) == {"helped": 2}
        assert_clean(rt)

    asyncio.run(asyncio.wait_for(main(), 10))
