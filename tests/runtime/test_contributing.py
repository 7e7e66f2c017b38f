"""A graph runs only the roles its outputs need (issue 12, item 3): two graphs entered by the
same placeholder, where calling one must not start the other's roles."""

from __future__ import annotations

import asyncio

from tests.runtime.harness import assert_clean, collect, done, open_runtime, returned

TWO_GRAPHS = """
placeholder request: Json

role echo {
    impl "m:Echo"
    interface run { in request  out reply: Json }
}

role listen {
    impl "m:Listen"
    interface run { in request  out heard: Json }
}

graph talk {
    entry  request
    return reply
}

graph wait {
    entry  request
    return heard
}
"""


class Echo:
    def __init__(self):
        self.calls = 0

    async def run(self, ctx, request):
        self.calls += 1
        return {"reply": request}


class Listen:
    """Never ends until released: a call that starts it cannot finish on its own."""

    def __init__(self):
        self.calls = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def run(self, ctx, request):
        self.calls += 1
        self.started.set()
        await self.release.wait()
        return {"heard": request}


def test_calling_one_graph_does_not_run_another_graphs_role(tmp_path):
    async def scenario():
        echo, listen = Echo(), Listen()
        runtime = await open_runtime(TWO_GRAPHS, tmp_path, {"echo": echo, "listen": listen})
        try:
            events = await asyncio.wait_for(collect(runtime, "talk", {"request": 7}), timeout=10)
            assert returned(events) == {"reply": 7}
            assert done(events)["status"] == "ok"
            assert (echo.calls, listen.calls) == (1, 0)
            assert_clean(runtime)
            # the other graph still runs its role (and only it)
            waiting = asyncio.ensure_future(collect(runtime, "wait", {"request": 8}))
            await asyncio.wait_for(listen.started.wait(), timeout=10)
            assert not waiting.done()
            listen.release.set()
            events = await asyncio.wait_for(waiting, timeout=10)
            assert returned(events) == {"heard": 8}
            assert (echo.calls, listen.calls) == (1, 1)
            assert_clean(runtime)
        finally:
            await runtime.close()

    asyncio.run(scenario())
