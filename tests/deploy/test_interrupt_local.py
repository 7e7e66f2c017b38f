"""Interrupting a call under `--deploy local` (docs/runtime.md, "Interrupting a call"): the
gateway's control core cancels the running call of an interruptible graph, whose role runs in
a replica process; the interrupting call's role, in its process, sees `ctx.interrupted` with the
frames the caller took (the record travels with the session's globals); every process ends
with nothing in flight."""

from __future__ import annotations

import asyncio
import json

from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, deployed, wait_for

FLOW = """
placeholder prompt: Text

global history: History {
    max_turns 8
}

role speaker {
    impl "roles:Speaker"
    lb session
    uses history
    interface say {
        in  prompt
        out stream reply: Text
    }
}

graph chat {
    entry  prompt
    stream reply ordered
    interruptible
}
"""

ROLES = """
import asyncio
import json


class Speaker:
    async def say(self, ctx, prompt):
        seen = ctx.interrupted
        if prompt == "report":  # what this call's role learnt of the call it interrupted
            record = None if seen is None else {"call_id": seen.call_id, "graph": seen.graph, "frames": dict(seen.frames)}
            yield {"reply": json.dumps({"call_id": ctx.call_id, "interrupted": record})}
            return
        for word in prompt.split():
            yield {"reply": word}
        await asyncio.sleep(60)  # (keeps talking for ever, as far as the test is concerned)
"""


def test_an_interrupting_call_cancels_a_call_running_in_a_replica_process(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)

    async def main():
        async with deployed(bundle) as deployment:
            runtime = deployment.runtime
            first: list[dict] = []

            async def read():
                async for event in runtime.call("chat", {"prompt": "hello there"}, session="s"):
                    first.append(event)

            reading = asyncio.ensure_future(read())
            await wait_for(lambda: len(first) == 2, 20, "the first call's two frames")
            second = [event async for event in runtime.call("chat", {"prompt": "report"}, session="s", interrupt=True)]
            await asyncio.wait_for(reading, 20)
            await assert_clean_everywhere(deployment)
        return first, second

    first, second = asyncio.run(main())
    assert [e["value"] for e in first if e["event"] == "stream"] == ["hello", "there"]
    assert first[-1] == {"event": "done", "status": "cancelled", "errors": [], "missing": [], "reason": "interrupted"}
    assert second[-1]["status"] == "ok"
    report = json.loads(second[0]["value"])
    assert report["interrupted"] == {"call_id": report["call_id"] - 1, "graph": "chat", "frames": {"reply": 2}}
