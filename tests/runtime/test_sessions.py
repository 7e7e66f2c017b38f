"""Sessions: idle state evicted by TTL and by a cap, never under a running or queued call; what
statistics() counts. The clock is the test's own (no sleeping)."""

from __future__ import annotations

import asyncio

import pytest

from flowrt.control import Runtime
from tests.runtime.harness import bundle_of, collect, returned

MEMORY = """
placeholder request: Json

global memory: KVCache {
    layers 1
    page_tokens 16
    slices [k, v]
}

role counter {
    impl "m:Counter"
    uses memory
    interface run { in request  out seen: Json }
}

graph g {
    entry  request
    return seen
}
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Counter:
    """Counts a session's calls in its `memory`; a call with {"hold": true} waits for `gate`."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.holding = asyncio.Event()

    async def run(self, ctx, request):
        state = ctx.globals["memory"]
        state["calls"] = state.get("calls", 0) + 1
        if request.get("hold"):
            self.holding.set()
            await self.gate.wait()
        return {"seen": state["calls"]}


async def open_counter(tmp_path, **limits) -> tuple[Runtime, Counter, Clock]:
    clock = Clock()
    counter = Counter()
    runtime = await Runtime.open(bundle_of(MEMORY, tmp_path), instances={"counter": [counter]}, clock=clock, **limits)
    return runtime, counter, clock


async def seen(runtime: Runtime, session: str | None) -> int:
    return returned(await collect(runtime, "g", {"request": {}}, session=session))["seen"]


def test_an_idle_session_keeps_its_state_until_its_ttl(tmp_path):
    async def main():
        runtime, _, clock = await open_counter(tmp_path, session_ttl=60)
        assert [await seen(runtime, "s1") for _ in range(2)] == [1, 2]
        clock.now += 59
        assert await seen(runtime, "s1") == 3  # used again: its TTL starts over
        clock.now += 59
        assert runtime.statistics()["sessions"] == 1
        clock.now += 2  # 61 s idle
        stats = runtime.statistics()
        assert stats["sessions"] == stats["idle_sessions"] == 0 and not runtime.globals
        assert await seen(runtime, "s1") == 1  # evicted: it starts over, like a new session
        assert runtime.sessions.evicted == 1
        await runtime.close()

    asyncio.run(main())


def test_the_cap_evicts_the_least_recently_used_idle_sessions(tmp_path):
    async def main():
        runtime, _, clock = await open_counter(tmp_path, max_sessions=2)
        for name in ("a", "b", "c"):
            await seen(runtime, name)
            clock.now += 1
        assert sorted(s for s, _ in runtime.globals) == ["b", "c"]
        await seen(runtime, "b")  # b is now the most recently used
        await seen(runtime, "d")
        assert sorted(s for s, _ in runtime.globals) == ["b", "d"]
        assert runtime.statistics()["sessions"] == 2
        await runtime.close()

    asyncio.run(main())


def test_a_session_with_a_running_or_queued_call_is_never_evicted(tmp_path):
    async def main():
        runtime, counter, clock = await open_counter(tmp_path, session_ttl=10, max_sessions=1)
        assert await seen(runtime, "s1") == 1
        running = asyncio.ensure_future(collect(runtime, "g", {"request": {"hold": True}}, session="s1"))
        await asyncio.wait_for(counter.holding.wait(), 10)
        queued = asyncio.ensure_future(collect(runtime, "g", {"request": {}}, session="s1"))
        for _ in range(3):
            await asyncio.sleep(0)  # let the queued call reach its session's queue
        stats = runtime.statistics()
        assert (stats["calls"], stats["queued_calls"], stats["sessions"], stats["idle_sessions"]) == (1, 1, 1, 0)
        clock.now += 3600  # far past the TTL, and other sessions push past the cap
        for name in ("x", "y", "z"):
            await seen(runtime, name)
        assert ("s1", "memory") in runtime.globals
        counter.gate.set()
        assert returned(await running)["seen"] == 2 and returned(await queued)["seen"] == 3  # its state stayed
        stats = runtime.statistics()
        assert (stats["calls"], stats["queued_calls"], stats["sessions"]) == (0, 0, 1)  # s1 idle; the cap evicted z
        clock.now += 11
        assert runtime.statistics()["sessions"] == 0
        await runtime.close()

    asyncio.run(main())


def test_calls_without_a_session_keep_nothing(tmp_path):
    async def main():
        runtime, _, _ = await open_counter(tmp_path)
        assert [await seen(runtime, None) for _ in range(5)] == [1] * 5
        assert not runtime.globals and not any(runtime.statistics().values())
        await runtime.close()

    asyncio.run(main())


@pytest.mark.parametrize(("limits", "words"), [({"session_ttl": 0}, "TTL"), ({"max_sessions": 0}, "1 or more")])
def test_limits_that_cannot_work_are_refused(tmp_path, limits, words):
    async def main():
        with pytest.raises(ValueError, match=words):
            await open_counter(tmp_path, **limits)

    asyncio.run(main())


def test_idle_sessions_expire_without_traffic(tmp_path):
    """The store wakes itself when the oldest idle session's TTL runs out (on the loop's clock)."""

    async def main():
        runtime = await Runtime.open(
            bundle_of(MEMORY, tmp_path), instances={"counter": [Counter()]}, session_ttl=0.05, max_sessions=10
        )
        await seen(runtime, "s1")
        assert len(runtime.sessions.idle) == 1
        expired = asyncio.get_running_loop().create_future()
        timer = runtime.sessions._timer
        assert timer is not None
        asyncio.get_running_loop().call_at(timer.when() + 1e-3, lambda: expired.set_result(len(runtime.sessions.idle)))
        assert await asyncio.wait_for(expired, 10) == 0  # the sweep, due first, ran first
        await runtime.close()

    asyncio.run(main())
