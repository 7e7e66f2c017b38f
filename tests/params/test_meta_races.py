"""Eviction races on the real Redis: two processes evict (and publish again) the pages of a
session while a third reads them under a session run lock, then under replica locks; no page
is ever taken from a provider while the lock protecting it is held."""

from __future__ import annotations

import multiprocessing
import shutil
import time

import pytest

from flowrt.params.meta.redis_store import RedisStore
from tests.params.test_meta_helpers import FID, FULL, MACHINE_REDIS, fresh_deployment

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (the CI machine has it)")
PAGES = [f"r{i:03d}" for i in range(24)]
LONG = 60.0
SECONDS = 20.0  # every loop also stops at this deadline


def evictor(deployment: str, node: str, stop, counts) -> None:
    store = RedisStore.connect(MACHINE_REDIS, deployment)
    deadline = time.monotonic() + SECONDS
    evicted = refused = 0
    while not stop.is_set() and time.monotonic() < deadline:
        for answer in store.evict(node, FID, PAGES, drop=True):
            if answer.evicted:
                evicted += 1
            elif answer.reason != "not_provider":
                refused += 1
        store.publish(node, "s", FID, PAGES, LONG, start=0)
    counts[node] = (evicted, refused)
    store.close()


def providers(store, pages):
    replies = store._read(lambda pipe: [pipe.hkeys(store.prefix + f"page:{FID}:{page}") for page in pages])
    return {page: set(reply) for page, reply in zip(pages, replies, strict=True)}


def reader(deployment: str, mode: str, rounds: int, stop, out) -> None:
    """Hold the lock, read the providers again and again; any provider gone while held is a violation."""
    store = RedisStore.connect(MACHINE_REDIS, deployment)
    violations, held = [], 0
    deadline = time.monotonic() + SECONDS
    for round_ in range(rounds):
        if time.monotonic() > deadline:
            break
        if mode == "run":
            store.lock_run("s", "reader", LONG)
        else:
            store.lock_replica("R", "A", FID, PAGES, LONG)
            store.lock_replica("R", "B", FID, PAGES, LONG)
        first = providers(store, PAGES)
        for _ in range(5):
            now = providers(store, PAGES)
            lost = {page: first[page] - now[page] for page in PAGES if first[page] - now[page]}
            if lost:
                violations.append((round_, lost))
        held += sum(map(len, first.values()))
        if mode == "run":
            store.unlock_run("s", "reader")
        else:
            store.unlock_replica("R", "A", FID, PAGES)
            store.unlock_replica("R", "B", FID, PAGES)
        time.sleep(0.002)  # let the evictors in between the locks
    out["violations"] = violations
    out["held"] = held
    stop.set()
    store.close()


@pytest.mark.parametrize("mode", ["run", "replica"])
def test_no_page_is_evicted_while_a_lock_protects_it(mode):
    deployment = fresh_deployment()
    store = RedisStore.connect(MACHINE_REDIS, deployment)
    try:
        store.register_layout(FULL)
        for node in ("A", "B"):
            store.register_node(node, [FULL], LONG)
            store.publish(node, "s", FID, PAGES, LONG, start=0)
        context = multiprocessing.get_context("spawn")
        with context.Manager() as manager:
            stop, counts, out = manager.Event(), manager.dict(), manager.dict()
            processes = [context.Process(target=evictor, args=(deployment, node, stop, counts)) for node in ("A", "B")]
            processes.append(context.Process(target=reader, args=(deployment, mode, 150, stop, out)))
            for process in processes:
                process.start()
            for process in processes:
                process.join(SECONDS + 30)
                assert process.exitcode == 0, f"{process} ended with {process.exitcode}"
            assert out["violations"] == []
            assert out["held"] > 0
            evicted = sum(e for e, _ in counts.values())
            refused = sum(r for _, r in counts.values())
            assert evicted > 0 and refused > 0, dict(counts)  # both paths ran under load
    finally:
        store.forget()
        store.close()
