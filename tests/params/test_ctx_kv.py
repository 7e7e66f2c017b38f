"""`ctx.kv(name)` in a real flow: a role that `uses kv` reuses its session's pages on turn 2
(counted), under inproc and local; with two replicas and Redis metadata, turn 2 on the other
replica process finds turn 1's pages in the first one's L2, and page locations rewritten in that
Redis (pointing at another session's slots) change no answer: counted misses, recomputed."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the KV pool's tiers are torch tensors (the torch extra)")

import redis  # noqa: E402

from tests.deploy.helpers import bundle_with_roles, calls, deployed, free_port  # noqa: E402
from tests.params.test_meta_helpers import redis_server  # noqa: E402

FLOW = """
placeholder request: Json

global kv: KVCache {
    layers 2
    page_tokens 16
    slices [k, v]
    heads 2
    head_dim 4
    capacity 1MiB
}

role llm {
    impl "kv_roles:Llm"
    replicas REPLICAS
    lb round_robin
    uses kv
    interface generate { in request  out reply: Json }
}

role plain {
    impl "kv_roles:Plain"
    interface look { in reply  out seen: Json }
}

graph chat {
    entry request
    return reply
}

graph probe {
    entry request
    return seen
}
"""

ROLES = """
import os


class Llm:
    async def generate(self, ctx, request):
        tokens = request["tokens"]
        async with ctx.kv("kv") as kv:
            keys = kv.keys(tokens)
            hit = await kv.match(keys)
            new = keys[hit.pages:]
            slots = kv.allocate(new)
            T = kv.layout.page_tokens
            for i, slot in enumerate(slots):  # "prefill": page p's K/V is a function of its tokens
                page = hit.pages + i
                for sub in kv.layout.sub_names:
                    for name in kv.layout.slice_names:
                        kv.stack(sub, name)[slot] = float(sum(tokens[page * T:(page + 1) * T]) % 1000)
            kv.commit(new, start=hit.pages)
            values = [float(kv.stack("1", "v")[slot][3, 1, 2]) for slot in (*hit.slots, *slots)]
        return {"reply": {"reused": hit.pages, "computed": len(new), "sources": list(hit.sources), "values": values,
                          "pid": os.getpid()}}


class Plain:
    async def look(self, ctx, reply):
        try:
            ctx.kv("kv")
        except LookupError as error:
            return {"seen": str(error)}
        return {"seen": "no error"}
"""


def expected(tokens: list[int]) -> list[float]:
    return [float(sum(tokens[p * 16 : (p + 1) * 16]) % 1000) for p in range(len(tokens) // 16)]


def build(tmp_path, replicas: int):
    return bundle_with_roles(FLOW.replace("REPLICAS", str(replicas)), ROLES, tmp_path, module="kv_roles")


async def two_turns(deployment) -> tuple[dict, dict]:
    history = list(range(1, 70))  # 4 full pages and a partial one
    first = await calls(deployment.runtime, "chat", {"request": {"tokens": history}}, session="u1")
    longer = history + list(range(200, 240))  # 6 full pages
    second = await calls(deployment.runtime, "chat", {"request": {"tokens": longer}}, session="u1")
    one = next(e for e in first if e.get("field") == "reply")["value"]
    two = next(e for e in second if e.get("field") == "reply")["value"]
    assert one["values"] == expected(history) and two["values"] == expected(longer)
    return one, two


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_turn_two_computes_only_the_new_pages(tmp_path, deploy):
    async def scenario():
        async with deployed(build(tmp_path, 1), deploy) as deployment:
            one, two = await two_turns(deployment)
            assert (one["reused"], one["computed"]) == (0, 4)
            assert (two["reused"], two["computed"]) == (4, 2)
            assert set(two["sources"]) == {"device"}
            # the pool's figures are in the deployment's statistics (a replica process's under
            # `processes`), with nothing left held
            stats = await deployment.statistics()
            if deploy == "inproc":
                kv = stats["kv"]["kv"]
            else:
                (kv,) = [process["kv"]["kv"] for process in stats["processes"].values() if "kv" in process]
            assert kv["committed_pages"] == 6 and kv["tiers"]["device"]["held_pages"] == 0

    asyncio.run(scenario())


def test_a_role_that_does_not_use_the_global_is_told_how_to(tmp_path):
    async def scenario():
        async with deployed(build(tmp_path, 1), "inproc") as deployment:
            events = await calls(deployment.runtime, "probe", {"request": {"tokens": [1]}})
            seen = next(e for e in events if e.get("field") == "seen")["value"]
            assert "does not use global `kv`" in seen and "uses kv" in seen

    asyncio.run(scenario())


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (the CI machine has it)")
def test_turn_two_on_the_other_replica_reads_turn_ones_pages_from_its_l2(tmp_path, monkeypatch):
    port = free_port()
    monkeypatch.setenv("FLOWRT_KV_META", f"redis://127.0.0.1:{port}/0")

    async def scenario():
        async with deployed(build(tmp_path, 2), "local") as deployment:
            one, two = await two_turns(deployment)
            assert one["pid"] != two["pid"]  # round robin: turn 2 ran in the other process
            assert (two["reused"], two["computed"]) == (4, 2)
            assert set(two["sources"]) == {"peer"}
            # turn 3, back on the first process: its own 4 pages, and the 2 the other one made from a peer's prefix
            tokens = list(range(1, 70)) + list(range(200, 240)) + list(range(300, 340))
            third = await calls(deployment.runtime, "chat", {"request": {"tokens": tokens}}, session="u1")
            three = next(e for e in third if e.get("field") == "reply")["value"]
            assert three["pid"] == one["pid"] and three["values"] == expected(tokens)
            assert (three["reused"], three["computed"]) == (6, 3)
            assert three["sources"] == ["device"] * 4 + ["peer"] * 2

    with redis_server(port):
        asyncio.run(scenario())


async def reply(deployment, tokens: list[int], session: str) -> dict:
    events = await calls(deployment.runtime, "chat", {"request": {"tokens": tokens}}, session=session)
    return next(e for e in events if e.get("field") == "reply")["value"]


def point_pages_at_other_pages(server: redis.Redis, victim: str, other: str) -> int:
    """Rewrite, in the store's own key layout (flowrt.params.meta.redis_store), where the provider
    of session `victim`'s pages keeps them: at the slots of session `other`'s pages. How many."""
    (victim_chain,) = [key for key in server.scan_iter("flowkv:*:chain:*") if key.endswith(f":{victim}")]
    prefix, _, rest = victim_chain.partition(":chain:")
    full = rest.rsplit(":", 1)[0]
    mine, theirs = server.lrange(victim_chain, 0, -1), server.lrange(f"{prefix}:chain:{full}:{other}", 0, -1)
    rewritten = 0
    for page, their_page in zip(mine, theirs, strict=False):
        fields, their_fields = (
            server.hgetall(f"{prefix}:page:{full}:{page}"),
            server.hgetall(f"{prefix}:page:{full}:{their_page}"),
        )
        for member in fields:
            if member in their_fields:
                server.hset(f"{prefix}:page:{full}:{page}", member, their_fields[member])
                rewritten += 1
    return rewritten


GARBAGE = ("@not-a-slot", "@-3", "@99999999999", "@1,2", "@", "@ 7")


def garble_locations(server: redis.Redis, session: str) -> int:
    """Set every location field of session `session`'s pages to a value that names no slot. How many."""
    (chain,) = [key for key in server.scan_iter("flowkv:*:chain:*") if key.endswith(f":{session}")]
    prefix, _, rest = chain.partition(":chain:")
    full = rest.rsplit(":", 1)[0]
    rewritten = 0
    for n, page in enumerate(server.lrange(chain, 0, -1)):
        for member in server.hgetall(f"{prefix}:page:{full}:{page}"):
            server.hset(f"{prefix}:page:{full}:{page}", member, GARBAGE[(n + rewritten) % len(GARBAGE)])
            rewritten += 1
    return rewritten


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (the CI machine has it)")
def test_page_locations_rewritten_in_redis_change_no_answer_and_are_counted(tmp_path, monkeypatch):
    """Issue 32's attack on real processes: session `victim`'s page locations in the metadata Redis
    are made to point at the slots of session `other`'s pages (same provider). Turn 2 of victim on
    the other replica answers as without tampering (recomputed, not read), the mismatches are
    counted (pool statistics and /metrics, `flowrt_refused_total{kind="mismatched_pages"}` too), a
    fresh session on that replica answers right, and locations that name no slot at all (garbage
    a Redis writer left) are misses on either replica, never a failed call."""
    port = free_port()
    monkeypatch.setenv("FLOWRT_KV_META", f"redis://127.0.0.1:{port}/0")
    history, others = list(range(1, 70)), list(range(500, 569))  # 4 full pages each, other values
    longer = history + list(range(200, 240))

    async def scenario():
        from flowrt.deploy.observed import gatherer
        from flowrt.observe.deployment import DeploymentMetrics

        async with deployed(build(tmp_path, 2), "local") as deployment:
            one = await reply(deployment, history, "victim")  # round robin: replica A
            await reply(deployment, [1], "filler")  # replica B (no full page: nothing stored)
            three = await reply(deployment, others, "other")  # replica A again: both sessions' pages there
            assert three["pid"] == one["pid"] and three["values"] == expected(others)
            server = redis.Redis(port=port, decode_responses=True)
            try:
                assert point_pages_at_other_pages(server, "victim", "other") == 4
            finally:
                server.close()
            two = await reply(deployment, longer, "victim")  # replica B: reads A's L2 through the store
            assert two["pid"] != one["pid"]
            assert two["values"] == expected(longer)  # the answer without tampering
            assert (two["reused"], two["computed"]) == (0, 6)  # recomputed: nothing of `other`'s was used
            await reply(deployment, [1], "filler")  # replica A
            fresh = await reply(deployment, longer, "fresh")  # replica B: a session that was never tampered with
            assert fresh["pid"] == two["pid"] and fresh["values"] == expected(longer)
            assert (fresh["reused"], fresh["sources"]) == (6, ["device"] * 6)
            stats = await deployment.statistics()
            mismatched = {pid: p["kv"]["kv"]["mismatched_pages"] for pid, p in stats["processes"].items() if "kv" in p}
            assert sorted(mismatched.values()) == [0, 4], mismatched
            metrics = DeploymentMetrics(gatherer(deployment))
            await metrics.refresh()
            text = metrics.exposition().decode()
            assert any(
                line.startswith("flowrt_kv_mismatched_pages_total{") and line.endswith(" 4.0") for line in text.splitlines()
            ), text
            refused = [line for line in text.splitlines() if line.startswith("flowrt_refused_total{")]
            assert any('kind="mismatched_pages"' in line and line.endswith(" 4.0") for line in refused), refused
            # locations that are not slots at all (a Redis writer's garbage): a miss, never a failed call
            server = redis.Redis(port=port, decode_responses=True)
            try:
                assert garble_locations(server, "victim") >= 4
            finally:
                server.close()
            for _ in range(2):  # victim's next turns (the store matches within a session's chain), one on each replica
                after = await reply(deployment, longer, "victim")
                assert after["values"] == expected(longer), after

    with redis_server(port):
        asyncio.run(scenario())


def flowc(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowc", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_kv_meta_refuses_what_is_not_a_store_url(tmp_path):
    build(tmp_path, 1)
    result = flowc(
        "run", "pipeline.flow", "--once", "chat", "--input", '{"request": {"tokens": [1]}}', "--kv-meta", "http://x", cwd=tmp_path
    )
    assert result.returncode == 2 and "--kv-meta 'http://x'" in result.stderr and "redis://" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (the CI machine has it)")
def test_kv_meta_reaches_the_replica_processes(tmp_path):
    build(tmp_path, 1)
    port = free_port()
    with redis_server(port):
        url = f"redis://127.0.0.1:{port}/0"
        tokens = json.dumps({"request": {"tokens": list(range(40))}})
        result = flowc(
            "run", "pipeline.flow", "--once", "chat", "--input", tokens, "--deploy", "local", "--kv-meta", url, cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
        keys = redis.Redis(port=port).keys("*")
        assert any(b"chain" in key for key in keys), keys  # the replica published its two pages there


MISUSE = """
import os


class Llm:
    async def generate(self, ctx, request):
        kv = ctx.kv("kv")
        problems = []
        for attempt in (lambda: kv.allocate(["a"]), lambda: ctx.kv("nope")):
            try:
                attempt()
            except Exception as error:  # noqa: BLE001
                problems.append(f"{type(error).__name__}: {error}")
        async with kv:
            for bad in ("abc", ["a", "a"], ["a|b"], [1], [f"p{i}" for i in range(100000)]):
                try:
                    kv.allocate(bad)
                except Exception as error:  # noqa: BLE001
                    problems.append(f"{type(error).__name__}: {error}")
                    if len(problems) == 7:  # (too many pages: the request's size, the caller's to fix)
                        from flowrt import BadInput

                        problems[-1] += f" bad_input={isinstance(error, BadInput)}"
            with kv.read_shared(kv.keys(list(range(32)))) as shared:
                try:
                    shared.view(0)
                except Exception as error:  # noqa: BLE001
                    problems.append(f"{type(error).__name__}: {error} ({len(shared)} found)")
        return {"reply": problems}


class Plain:
    async def look(self, ctx, reply):
        return {"seen": None}
"""


def test_misuse_of_the_handle_is_one_clear_error_each(tmp_path):
    async def scenario():
        flow = FLOW.replace("REPLICAS", "1").replace("kv_roles:", "kv_misuse:")  # (inproc imports it here: a name of its own)
        bundle = bundle_with_roles(flow, MISUSE, tmp_path, module="kv_misuse")
        async with deployed(bundle, "inproc") as deployment:
            events = await calls(deployment.runtime, "chat", {"request": {}})
            problems = next(e for e in events if e.get("field") == "reply")["value"]
            assert len(problems) == 8, problems
            outside, unknown, one_string, twice, pipe, not_str, too_long, shared = problems
            assert too_long.startswith("KVRequestTooLarge: the request needs 100000 pages of K/V at once in global `kv`")
            assert "send a shorter request" in too_long and too_long.endswith("bad_input=True")
            assert outside.startswith("KVError") and "async with ctx.kv('kv') as kv" in outside
            assert unknown.startswith("LookupError") and "declares no `global nope: KVCache`" in unknown and "`kv`" in unknown
            assert "not 'abc'" in one_string and "appears twice" in twice
            assert "'a|b'" in pipe and "not 1" in not_str
            assert "is not one of the 0 found" in shared and "(0 found)" in shared
            stats = (await deployment.statistics())["kv"]["kv"]
            assert stats["tiers"]["device"]["held_pages"] == 0 and stats["tiers"]["device"]["owners"] == 0

    asyncio.run(scenario())
