"""Shared pieces of the metadata-store tests (no tests of its own): layouts, stores over a fresh
namespace, waits, a private redis-server, a connection counting round trips."""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid

import redis

from flowrt.params.layout import KVLayout
from flowrt.params.meta import EmbeddedStore
from flowrt.params.meta.redis_store import RedisStore

MACHINE_REDIS = "redis://127.0.0.1:6379/0"
FULL = KVLayout("kv", ("0", "1"), ("k", "v"), page_tokens=16, heads=2, head_dim=8)
K = FULL.part(slice_names=["k"])
V = FULL.part(slice_names=["v"])
FID, KID, VID = FULL.layout_id(), K.layout_id(), V.layout_id()


def fresh_deployment() -> str:
    return f"test-meta-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def open_kind(kind: str, url: str = MACHINE_REDIS, **options):
    """A store of `kind` ("embedded" or "redis") over a namespace of its own, its keys deleted after."""
    deployment = fresh_deployment()
    if kind == "embedded":
        yield EmbeddedStore(deployment)
        return
    store = RedisStore.connect(url, deployment, **options)
    try:
        yield store
    finally:
        store.forget()
        store.close()


def wait_until(condition, seconds: float, what: str):
    """Poll `condition()` until it returns something truthy (returned); fail naming `what`."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g}s")
        time.sleep(0.01)


@contextlib.contextmanager
def redis_server(port: int, *extra: str):
    """A redis-server of the test's own on `port`, keeping nothing on disk; stopped by its PID."""
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *extra],
        stdout=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port, password=extra[extra.index("--requirepass") + 1] if "--requirepass" in extra else None)

        def up():
            with contextlib.suppress(redis.ConnectionError):
                return client.ping()
            return False

        wait_until(up, 10, f"redis-server on port {port} up")
        yield process
    finally:
        process.kill()
        process.wait()


class CountingConnection(redis.connection.Connection):
    """A redis-py connection that counts what it sends: one send is one round trip (a pipeline
    is packed into one send)."""

    sends = 0

    def send_packed_command(self, command, check_health=True):
        CountingConnection.sends += 1
        return super().send_packed_command(command, check_health)
