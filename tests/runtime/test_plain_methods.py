"""Role methods written as plain `def` or plain generators run on their replica's worker thread
(flowrt.control.threads; docs/runtime.md, "Plain methods"): the loop stays free, two roles'
blocking work overlaps, a replica's plain methods run one at a time, and failures, broken frames
and timeouts name the role's own lines as for `async def`. No test sleeps to see it: threads
meet at barriers with deadlines, and events are waited on."""

from __future__ import annotations

import asyncio
import threading

import pytest

from flowrt.control import RoleError
from tests.runtime.harness import assert_clean, collect, done, open_runtime, returned, streamed, where_in

FORK = """
placeholder request: Json

role left {
    impl "m:Left"
    interface run { in request  out l: Json }
}

role right {
    impl "m:Right"
    interface run { in request  out r: Json }
}

graph g {
    entry  request
    return l, r
}
"""

STREAM = """
placeholder request: Json

role count {
    impl "m:Count"
    interface run { in request  out stream n: Json }
}

role square {
    impl "m:Square"
    interface run { in n  out sq: Json }
}

graph g {
    entry  request
    stream n ordered
    stream sq
}
"""

SLOW = """
placeholder request: Json

role slow {
    impl "m:Slow"
    interface run {
        in  request
        out result: Json
        timeout 100ms
    }
}

graph g {
    entry  request
    return result
}
"""


class Meeting:
    """Two plain roles that can only both finish if they run at the same time: each waits at
    one barrier (a thread blocked there releases the GIL, as torch or numpy work does)."""

    def __init__(self):
        self.barrier = threading.Barrier(2, timeout=10)
        self.threads: list[int] = []


class Left:
    def __init__(self, meeting: Meeting):
        self.meeting = meeting

    def run(self, ctx, request):
        self.meeting.threads.append(threading.get_ident())
        self.meeting.barrier.wait()  # BrokenBarrierError after 10 s if the other never comes
        return {"l": request + 1}


class Right(Left):
    def run(self, ctx, request):
        self.meeting.threads.append(threading.get_ident())
        self.meeting.barrier.wait()
        return {"r": request * 2}


def test_two_plain_roles_fed_by_one_frame_run_at_the_same_time(tmp_path):
    async def main():
        meeting = Meeting()
        runtime = await open_runtime(FORK, tmp_path, {"left": Left(meeting), "right": Right(meeting)})
        events = await asyncio.wait_for(collect(runtime, "g", {"request": 5}), 30)
        assert done(events)["status"] == "ok", events
        assert returned(events) == {"l": 6, "r": 10}
        loop_thread = threading.get_ident()
        assert len(set(meeting.threads)) == 2 and loop_thread not in meeting.threads  # each on its replica's thread
        assert_clean(runtime)
        await runtime.close()

    asyncio.run(main())


class Count:
    def __init__(self):
        self.closed = threading.Event()

    def setup(self, ctx):
        self.setup_thread = threading.get_ident()  # plain setup: on the replica's thread too

    def run(self, ctx, request):
        try:
            for n in range(request):
                yield {"n": n}
        finally:
            self.closed.set()


class Square:
    def __init__(self):
        self.active = 0
        self.most = 0
        self.lock = threading.Lock()
        self.threads: set[int] = set()

    def run(self, ctx, n):
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        self.threads.add(threading.get_ident())
        with self.lock:
            self.active -= 1
        return {"sq": n * n}


def test_plain_generators_stream_and_a_replicas_methods_run_one_at_a_time(tmp_path):
    async def main():
        count, square = Count(), Square()
        runtime = await open_runtime(STREAM, tmp_path, {"count": count, "square": square})
        events = await asyncio.wait_for(collect(runtime, "g", {"request": 40}), 30)
        assert done(events)["status"] == "ok", events
        assert streamed(events, "n") == list(range(40))
        assert sorted(streamed(events, "sq")) == [n * n for n in range(40)]
        assert count.setup_thread != threading.get_ident() and count.closed.is_set()
        assert square.most == 1 and len(square.threads) == 1  # one replica: one thread, one method at a time
        assert_clean(runtime)
        await runtime.close()

    asyncio.run(main())


async def let_go(runtime, finished: threading.Event) -> None:
    """Wait (with deadlines) until a role's thread has set `finished`, then until the runtime
    has let its job go (it does as the thread returns)."""
    await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, finished.wait, 10), 15)
    for _ in range(1000):
        if runtime.statistics()["thread_jobs"] == 0:
            return
        await asyncio.sleep(0.01)


class Slow:
    def __init__(self):
        self.release = threading.Event()
        self.finished = threading.Event()

    def run(self, ctx, request):
        self.release.wait(30)  # a blocking wait the timeout cannot interrupt
        self.finished.set()
        return {"result": 1}


def test_a_timeout_ends_a_plain_method_at_once_and_names_the_line_its_thread_was_on(tmp_path):
    async def main():
        slow = Slow()
        runtime = await open_runtime(SLOW, tmp_path, {"slow": slow})
        events = await asyncio.wait_for(collect(runtime, "g", {"request": 1}), 10)
        end = done(events)
        assert end["status"] == "cancelled" and end["missing"] == ["result"]
        (error,) = end["errors"]
        assert error["message"] == "timed out after 0.1s"
        assert error["where"] == where_in(Slow.run, "self.release.wait(30)")
        assert not slow.finished.is_set()  # the call ended while the thread still waits ...
        assert runtime.statistics()["thread_jobs"] == 1  # ... and statistics() says so
        slow.release.set()
        await let_go(runtime, slow.finished)
        assert_clean(runtime)
        await runtime.close()

    asyncio.run(main())


class Raises:
    def run(self, ctx, request):
        raise ValueError(f"no {request}")


class BadFrame:
    def run(self, ctx, request):
        yield {"n": 1}
        yield ["not", "a", "dict"]


def test_failures_and_broken_frames_of_plain_methods_name_the_roles_lines(tmp_path):
    async def main():
        runtime = await open_runtime(SLOW.replace("timeout 100ms", ""), tmp_path, {"slow": Raises()})
        end = done(await collect(runtime, "g", {"request": 3}))
        assert end["status"] == "error"
        assert end["errors"][0]["message"] == "ValueError: no 3"
        assert end["errors"][0]["where"] == where_in(Raises.run, "raise ValueError")
        await runtime.close()
        runtime = await open_runtime(STREAM, tmp_path / "stream", {"count": BadFrame(), "square": Square()})
        events = await collect(runtime, "g", {"request": 1})
        (error,) = done(events)["errors"]
        assert "must yield or return a dict" in error["message"]
        assert error["where"] == where_in(BadFrame.run, 'yield ["not"')
        assert_clean(runtime)
        await runtime.close()

    (tmp_path / "stream").mkdir()
    asyncio.run(main())


def test_a_cancelled_call_closes_a_plain_generator_on_its_thread(tmp_path):
    async def main():
        count = Count()
        runtime = await open_runtime(STREAM, tmp_path, {"count": count, "square": Square()})
        stream = runtime.call("g", {"request": 10**9})  # streams until the client goes away
        async for event in stream:
            if event["event"] == "stream":
                break
        await stream.aclose()
        await let_go(runtime, count.closed)
        assert_clean(runtime)
        await runtime.close()

    asyncio.run(main())


class NotAMethod:
    run = 42


def test_an_interface_that_is_not_callable_is_refused_at_open(tmp_path):
    async def main():
        await open_runtime(SLOW, tmp_path, {"slow": NotAMethod()})

    with pytest.raises(RoleError, match=r"`NotAMethod.run` is not a method but a value of type `int`"):
        asyncio.run(main())
