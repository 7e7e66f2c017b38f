"""Plain `def` and generator methods in replica processes (`--deploy local`): they run on the
replica's worker thread as in process, stream as generators, and a timeout names the line the
thread was on; afterwards nothing is left running in any process."""

from __future__ import annotations

import asyncio

from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed

FLOW = """
placeholder request: Json

role count {
    impl "roles:Count"
    interface run { in request  out stream n: Json }
}

role square {
    impl "roles:Square"
    interface run {
        in  n
        out sq: Json
        timeout 200ms
    }
}

graph g {
    entry  request
    stream n ordered
    stream sq
}
"""

ROLES = """
import threading
import time


class Count:
    def setup(self, ctx):
        self.setup_thread = threading.get_ident()

    def run(self, ctx, request):
        for n in range(request):
            yield {"n": n, "off_loop": threading.get_ident() == self.setup_thread}


class Square:
    def run(self, ctx, n):
        if n < 0:
            time.sleep(1.5)  # the timeout ends the activation at 0.2 s; the thread goes on
        return {"sq": n * n}
"""


def test_plain_methods_run_in_replica_processes_as_in_process(tmp_path):
    async def main():
        bundle = bundle_with_roles(FLOW.replace("n: Json", "n: Json, off_loop: Json"), ROLES, tmp_path)
        async with deployed(bundle, "local") as deployment:
            events = await asyncio.wait_for(calls(deployment.runtime, "g", {"request": 5}), 60)
            assert events[-1]["status"] == "ok", events
            assert [e["value"] for e in events if e.get("field") == "n"] == [0, 1, 2, 3, 4]
            assert sorted(e["value"] for e in events if e.get("field") == "sq") == [0, 1, 4, 9, 16]
            # the generator's steps ran on the thread that ran the plain setup: the replica's worker thread
            assert all(e["value"] for e in events if e.get("field") == "off_loop")
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


NEGATIVE = ROLES.replace("range(request)", "range(-1, -1 - request, -1)")


async def threads_idle(deployment, seconds: float) -> None:
    """Wait until no replica process has work on its threads (a timed-out method's thread
    finishes what it was doing)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        stats = await deployment.statistics()
        if all(p.get("running") == 0 for p in stats.get("processes", {}).values()):
            return
        assert loop.time() < deadline, stats
        await asyncio.sleep(0.05)


def test_a_plain_methods_timeout_in_a_replica_names_its_line(tmp_path):
    async def main():
        bundle = bundle_with_roles(FLOW.replace("n: Json", "n: Json, off_loop: Json"), NEGATIVE, tmp_path)
        async with deployed(bundle, "local") as deployment:
            events = await asyncio.wait_for(calls(deployment.runtime, "g", {"request": 1}), 60)
            end = events[-1]
            assert end["status"] == "cancelled", events
            (error,) = end["errors"]
            assert error["message"] == "timed out after 0.2s"
            line = (
                NEGATIVE.splitlines().index(
                    "            time.sleep(1.5)  # the timeout ends the activation at 0.2 s; the thread goes on"
                )
                + 1
            )
            assert error["where"].endswith(f"roles.py:{line}"), error  # on the replica's thread, in the role's code
            await threads_idle(deployment, 30)
            await assert_clean_everywhere(deployment)

    asyncio.run(main())
