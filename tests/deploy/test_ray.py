"""`--deploy ray` on a real local Ray cluster: the same events as the embedded runtime, the
launch plan's placement groups (GPUs as the custom resource `flowc_gpu` on a CPU machine;
`share gpus with` roles in their owner's bundle with none of their own), a killed actor
restarted, and Ray missing as one clear line. One cluster serves the module (never `ray stop`)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed, wait_for

ray = pytest.importorskip("ray", reason="Ray is in the dev extra; `pip install 'flowc[ray]'` brings it")

FLOW = """
placeholder request: Json

role llm {
    impl "roles:Llm"
    replicas 2
    gpus 1
    interface run { in request  out hidden: Json }
}

role dit {
    impl "roles:Dit"
    replicas 2
    share gpus with llm
    interface run { in hidden  out image: Json }
}

role plain {
    impl "roles:Plain"
    interface run { in request  out note: Json }
}

graph g {
    entry request
    return image, note
}
"""

ROLES = """
import os

class Llm:
    async def run(self, ctx, request):
        return {"hidden": {"n": request, "by": os.getpid()}}

class Dit:
    async def run(self, ctx, hidden):
        return {"image": {"n": hidden["n"], "env": os.environ.get("CUDA_VISIBLE_DEVICES")}}

class Plain:
    async def run(self, ctx, request):
        return {"note": request}
"""


@pytest.fixture(scope="module")
def cluster():
    # (address="local": a cluster of its own, even where another Ray cluster runs on the machine)
    ray.init(address="local", num_cpus=16, resources={"flowc_gpu": 4}, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()


def test_placement_follows_the_launch_plan(cluster, tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)

    async def main():
        async with deployed(bundle, "ray") as deployment:
            where = deployment.supervisor.where
            groups = {where[("llm", r)]["placement_group"] for r in (0, 1)}
            assert None not in groups and len(groups) == 2  # a group per replica of the GPU owner
            for r in (0, 1):
                assert where[("llm", r)]["resources"].get("flowc_gpu") == 1.0
                assert where[("dit", r)]["placement_group"] == where[("llm", r)]["placement_group"]  # in its owner's bundle
                assert "flowc_gpu" not in where[("dit", r)]["resources"]  # with no GPUs of its own
            assert where[("plain", 0)]["placement_group"] is None
            assert "flowc_gpu" not in where[("plain", 0)]["resources"]
            for n in range(4):
                events = await calls(deployment.runtime, "g", {"request": n})
                returned = {e["field"]: e["value"] for e in events if e["event"] == "return"}
                assert events[-1]["status"] == "ok" and returned["image"]["n"] == n and returned["note"] == n
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_a_killed_actor_is_restarted_and_takes_traffic_again(cluster, tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)

    async def main():
        async with deployed(bundle, "ray", heartbeat_ttl=1.0) as deployment:
            supervisor = deployment.supervisor
            victim = supervisor.where[("plain", 0)]["pid"]
            ray.kill(supervisor.actors[("plain", 0)], no_restart=True)
            await wait_for(lambda: supervisor.restarted == 1 and len(supervisor.remote.live["plain"]) == 1, 30, "restart")
            assert supervisor.where[("plain", 0)]["pid"] != victim
            events = await calls(deployment.runtime, "g", {"request": 1})
            assert events[-1]["status"] == "ok"
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_with_the_control_spread_over_the_actors_frames_go_actor_to_actor(cluster, tmp_path, monkeypatch):
    # FLOWRT_CONTROL=shards: llm's frame goes to dit's actor without the gateway; the gateway
    # sends the entry values (to llm's and plain's actors) and receives image, note and credit
    monkeypatch.setenv("FLOWRT_CONTROL", "shards")
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)

    async def main():
        async with deployed(bundle, "ray", heartbeat_ttl=1.0) as deployment:
            supervisor = deployment.supervisor
            peers = supervisor.peers
            for n in range(4):
                events = await calls(deployment.runtime, "g", {"request": n})
                assert events[-1]["status"] == "ok" and {e["field"] for e in events[:-1]} == {"image", "note"}
            remote = supervisor.remote.statistics()
            assert remote["gateway_messages_sent"] == 0  # no activation went through the gateway
            assert peers.sent == 4 * 2 and peers.received <= 4 * 2, (peers.sent, peers.received)
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_a_streaming_entry_feeds_actors_frame_by_frame(cluster, tmp_path):
    # the gateway's control core takes the entry's frames and sends each to a listener actor
    from tests.deploy.test_streaming_local import FLOW as STREAMING
    from tests.deploy.test_streaming_local import ROLES as LISTENING

    bundle = bundle_with_roles(STREAMING, LISTENING, tmp_path)

    async def main():
        async with deployed(bundle, "ray") as deployment:
            call = deployment.runtime.start("g", {}, session="s1")
            async with call:
                for chunk in ("one two", "three"):
                    await call.send("audio_in", chunk)
                await call.end("audio_in")
                events = [event async for event in call]
            await assert_clean_everywhere(deployment)
        return events

    events = asyncio.run(main())
    assert [e["value"] for e in events if e["event"] == "stream"] == ["one", "two", "three"]
    assert [e["value"] for e in events if e["event"] == "return"] == ["one two | three"]


TENSORS = """
placeholder request: Json

role make {
    impl "tensor_roles:Make"
    interface run { in request  out x: Tensor }
}
role use {
    impl "tensor_roles:Use"
    interface run { in x  out total: Json }
}

graph g {
    entry request
    return total
}
"""

TENSOR_ROLES = """
import os
import torch

class Make:
    async def run(self, ctx, request):
        t = ctx.memory.empty((1 << 20,))
        t.fill_(request)
        return {"x": t}

class Use:
    async def run(self, ctx, x):
        return {"total": float(x.sum())}
"""


def test_tensors_between_actors_go_through_the_nodes_manager_actor(cluster, tmp_path):
    pytest.importorskip("torch", reason="tensors need torch (pip install 'flowc[torch]')")
    bundle = bundle_with_roles(TENSORS, TENSOR_ROLES, tmp_path, module="tensor_roles")

    async def main():
        async with deployed(bundle, "ray", pool_mb=64) as deployment:
            manager = deployment.supervisor.manager
            assert type(manager).__name__ == "RayMemory" and manager.pid not in deployment.supervisor.pids().values()
            for n in (1, 2):
                events = await calls(deployment.runtime, "g", {"request": n})
                assert events[0]["value"] == n * (1 << 20)
            stats = deployment.memory_statistics()
            assert stats["requests"] > 0 and set(stats["clients"].values()) >= {"make/0", "use/0", "gateway"}
            await assert_clean_everywhere(deployment)

    asyncio.run(main())


def test_image_chat_under_ray_prints_what_its_readme_says(cluster, tmp_path):
    from tests.deploy.test_local import by_field

    readme = (REPO / "examples/image_chat/README.md").read_text()
    import re

    (expected,) = re.findall(r"```json\n(.*?)\n```", readme, re.DOTALL)
    subprocess.run(
        [sys.executable, "-m", "flowc", "build", "examples/image_chat/pipeline.flow", "-o", str(tmp_path / "b")],
        check=True,
        capture_output=True,
        cwd=REPO,
    )

    async def main():
        from flowrt.values import event_json

        request = json.loads((REPO / "examples/image_chat/request.json").read_text())
        async with deployed(tmp_path / "b", "ray") as deployment:
            return [event_json(e) for e in await calls(deployment.runtime, "chat", request)]

    got = asyncio.run(main())
    assert sorted(got) == sorted(expected.splitlines())
    assert by_field(got, {"token"}) == by_field(expected.splitlines(), {"token"})


def test_without_ray_the_deploy_is_refused_in_one_line(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    hide_ray = "import sys; sys.modules['ray'] = None; from flowc.cli import main; sys.argv[0] = 'flowc'; main()"
    result = subprocess.run(
        [sys.executable, "-c", hide_ray, "run", str(bundle), "--deploy", "ray", "--once", "g", "--input", '{"request": 1}'],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "--deploy ray needs Ray" in line and "pip install 'flowc[ray]'" in line
