"""Only the roles some graph runs are started (issue 33): a role that no graph of the bundle runs
(an imported library's role the graphs leave out) is neither imported nor started, in process
or in replica processes, and `flowc plan` and the start-up log say which were left out. A graph
importing `multimodal` and `voice` that uses 7 of its bundle's 12 roles starts 7 replica
processes under `--deploy local` (real processes, setting up flowstd's tiny models)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys

import pytest

from flowrt.bundle import load_bundle
from flowrt.deploy import open_deployment
from flowrt.transport.sockets import alive
from tests.conftest import HAVE_MODELS, NO_MODELS
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
        bundle = bundle_with_roles(
            FLOW, ROLES, tmp_path, module="unreached_roles"
        )  # (imported in this process too: a name of its own)
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


SEVEN_OF_TWELVE = """
flow hear_and_see

import multimodal                            # frontend, embed, vit, vae, mm_llm, dit
import voice                                 # voice_frontend, audio_encoder, thinker, talker

role critic {
    impl "no_such_module:Critic"             # never imported: no graph runs it
    interface judge { in reply  out verdict: Json }
}

role archivist {
    impl "no_such_module:Archivist"
    interface keep { in token  out kept: Json }
}

graph hear_and_see {                         # a voice chat, and the image's features beside it
    entry  voice_request, request
    stream reply ordered
    stream speech ordered
    return turn
    stream vit_emb
    stream vae_lat
}
"""

SEVEN = ["audio_encoder", "frontend", "talker", "thinker", "vae", "vit", "voice_frontend"]


@pytest.mark.skipif(not HAVE_MODELS, reason=NO_MODELS)
def test_a_graph_of_multimodal_and_voice_using_7_of_12_roles_starts_7_replica_processes(tmp_path, caplog):
    bundle = load_bundle(bundle_of(SEVEN_OF_TWELVE, tmp_path))
    assert sorted(bundle.roles) == SEVEN
    assert bundle.unreached == ("archivist", "critic", "dit", "embed", "mm_llm")  # 7 + 5 = the 12 roles

    async def main():
        with caplog.at_level(logging.INFO, logger="flowrt.deploy"):
            async with deployed(bundle.path, "local") as deployment:  # (on exit: every process it started is gone)
                pids = deployment.supervisor.pids()
                assert sorted(pids) == [f"{role}/0" for role in SEVEN]  # one replica process per reached role
                assert len(set(pids.values())) == 7 and os.getpid() not in pids.values()
                assert all(alive(pid) for pid in pids.values()), pids
                # each of them set up its role and answers the gateway: 7 links up, 7 processes' own statistics
                assert deployment.supervisor.remote.statistics()["replicas_up"] == 7
                answered = await deployment.supervisor.remote.probe(timeout=60)
                assert answered == {name: {"running": 0, "tracked": 0} for name in pids}, answered
        assert "not started: `archivist`, `critic`, `dit`, `embed`, `mm_llm`" in caplog.text, caplog.text

    asyncio.run(main())
