"""The Redis registry: replicas found through the machine's Redis (127.0.0.1:6379), a Redis
of the test's own killed and restarted under load, AUTH, keys that expire with a deployment."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess

import pytest
import redis

from flowrt.deploy import DeployError, open_deployment
from flowrt.registry.stores import replica_key
from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed, free_port, wait_for
from tests.deploy.test_faults import FLOW, ROLES

MACHINE_REDIS = "redis://127.0.0.1:6379/0"

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (the CI machine has it)")


@contextlib.contextmanager
def redis_server(port: int, *extra: str):
    """A redis-server of the test's own on `port`, keeping nothing on disk; stopped by its PID."""
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *extra],
        stdout=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port, password=_password(extra))
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError):
                client.ping()
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(0.02)
        yield process
    finally:
        process.kill()
        process.wait()


def _password(extra: tuple[str, ...]) -> str | None:
    return extra[extra.index("--requirepass") + 1] if "--requirepass" in extra else None


def test_replicas_register_in_the_machines_redis_and_their_keys_expire(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    client = redis.Redis.from_url(MACHINE_REDIS)

    async def main():
        async with deployed(bundle, registry=MACHINE_REDIS, heartbeat_ttl=1.0) as deployment:
            supervisor = deployment.supervisor
            keys = [replica_key(supervisor.deployment, role, r) for role, r in (("front", 0), ("worker", 0), ("worker", 1))]
            assert all(client.pttl(key) > 0 for key in keys)  # each with an expiry
            events = await calls(deployment.runtime, "g", {"request": {"n": 1}})
            assert events[-1]["status"] == "ok"
            await assert_clean_everywhere(deployment)
        return keys

    keys = asyncio.run(main())
    for key in keys:  # gone with the deployment: nobody renews them
        for _ in range(150):
            if not client.exists(key):
                break
            subprocess.run(["sleep", "0.02"], check=True)
        assert not client.exists(key)


def test_redis_killed_and_restarted_under_load(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"

    async def main(server):
        async with deployed(bundle, registry=url, heartbeat_ttl=1.0) as deployment:
            supervisor, runtime = deployment.supervisor, deployment.runtime
            statuses: list[str] = []
            stop = asyncio.Event()

            async def load():
                n = 0
                while not stop.is_set() and n < 2000:
                    events = await asyncio.wait_for(calls(runtime, "g", {"request": {"n": n, "sleep": 0.01}}), 10)
                    statuses.append(events[-1]["status"])
                    n += 1

            loader = asyncio.ensure_future(load())
            await wait_for(lambda: len(statuses) >= 5, 10, "calls before the kill")
            server.kill()
            server.wait()
            during = len(statuses)
            await wait_for(lambda: len(statuses) >= during + 20, 15, "calls while Redis is down")
            with redis_server(port):
                client = redis.Redis(port=port)
                keys = [replica_key(supervisor.deployment, role, r) for role, r in (("front", 0), ("worker", 0), ("worker", 1))]
                await wait_for(lambda: all(client.exists(k) for k in keys), 10, "replicas re-registered")
                after = len(statuses)
                await wait_for(lambda: len(statuses) >= after + 20, 15, "calls after the restart")
                stop.set()
                await loader
                assert set(statuses) == {"ok"}  # the data path never went through Redis
                assert len(supervisor.remote.links) == 3
                await assert_clean_everywhere(deployment)

    with redis_server(port) as server:
        asyncio.run(main(server))


def test_redis_auth_is_honoured(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    port = free_port()

    async def main():
        with pytest.raises(DeployError, match="requires a password; give it in the URL"):
            await open_deployment(bundle, "local", registry=f"redis://127.0.0.1:{port}/0")
        with pytest.raises(DeployError, match="refused the credentials"):
            await open_deployment(bundle, "local", registry=f"redis://:wrong@127.0.0.1:{port}/0")
        async with deployed(bundle, registry=f"redis://:s3cret@127.0.0.1:{port}/0") as deployment:
            events = await calls(deployment.runtime, "g", {"request": {"n": 1}})
            assert events[-1]["status"] == "ok"

    with redis_server(port, "--requirepass", "s3cret"):
        asyncio.run(main())


def test_an_unreachable_registry_is_one_clear_error(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    port = free_port()

    async def main():
        with pytest.raises(DeployError, match=rf"cannot reach the registry at redis://127.0.0.1:{port}/0 .*start Redis there"):
            await open_deployment(bundle, "local", registry=f"redis://127.0.0.1:{port}/0")

    asyncio.run(main())
