"""Only the roles some graph runs are started (issue 33): a role that no graph of the bundle runs
(an imported library's role the graphs leave out) is neither imported nor started, in process
or in replica processes, and `flowc plan` and the start-up log say which were left out."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

from flowrt.bundle import load_bundle
from flowrt.deploy import open_deployment
from tests.deploy.helpers import bundle_with_roles, calls, deployed
from tests.runtime.harness import bundle_of

FLOW = """
placeholder request: Json

role used {
    impl "unreached_roles:Used"
    replicas 2
    interface run { in request  out result: Json }
}

role unused {
    impl "no_such_module:Nothing"   # never imported: no graph runs it
    replicas 3
    interface run { in request  out other: Json }
}

graph g {
    entry  request
    return result
}
"""

ROLES = """
class Used:
    async def run(self, ctx, request):
        return {"result": request + 1}
"""


def test_a_role_no_graph_runs_is_neither_imported_nor_started(tmp_path, caplog):
    async def main():
        bundle = bundle_with_roles(FLOW, ROLES, tmp_path, module="unreached_roles")  # (imported in this process too: a name of its own)
        assert load_bundle(bundle).unreached == ("unused",)
        with caplog.at_level(logging.INFO, logger="flowrt.deploy"):
            inproc = await open_deployment(bundle, "inproc")
        try:
            assert (await calls(inproc.runtime, "g", {"request": 1}))[-2]["value"] == 2
            assert set(inproc.runtime.bindings) == {"used"}
        finally:
            await inproc.close()
        assert "not started: `unused`" in caplog.text
        async with deployed(bundle, "local") as deployment:
            assert sorted(deployment.supervisor.pids()) == ["used/0", "used/1"]
            events = await calls(deployment.runtime, "g", {"request": 1})
            assert events[-1]["status"] == "ok" and events[-2]["value"] == 2

    asyncio.run(main())


LIBRARIES = """
flow both

import multimodal
import voice

graph chat {
    entry  voice_request
    stream reply ordered
    stream speech ordered
    return turn
}
"""


def test_importing_multimodal_and_voice_runs_only_the_roles_the_graph_uses(tmp_path):
    bundle = load_bundle(bundle_of(LIBRARIES, tmp_path))
    assert sorted(bundle.roles) == ["audio_encoder", "talker", "thinker", "voice_frontend"]
    assert bundle.unreached == ("dit", "embed", "frontend", "mm_llm", "vae", "vit")
    shown = subprocess.run(
        [sys.executable, "-m", "flowc", "plan", str(tmp_path / "pipeline.flow")], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    left_out = [line.split(":")[0].strip() for line in shown.stdout.splitlines() if "no graph runs it" in line]
    assert left_out == ["dit", "embed", "frontend", "mm_llm", "vae", "vit"], shown.stdout
