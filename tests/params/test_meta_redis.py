"""The Redis metadata store on its own: a 1,000-page prefix match, slots included, is one round
trip; Redis down, killed mid-use and restarted (scripts loaded again), AUTH; a failing script
named; locations kept in the page keys (their TTL, nothing left behind)."""

from __future__ import annotations

import shutil

import pytest
import redis

from flowrt.params.meta import MetaError, MetaScriptError, MetaUnavailable
from flowrt.params.meta.redis_store import RedisStore
from tests.deploy.helpers import free_port
from tests.params.test_meta_helpers import (
    FID,
    FULL,
    KID,
    VID,
    CountingConnection,
    K,
    V,
    open_kind,
    redis_server,
    wait_until,
)

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (the CI machine has it)")
LONG = 60.0


def test_a_1000_page_prefix_match_is_one_round_trip_and_one_evalsha():
    port = free_port()
    pages = [f"{i:016x}" for i in range(1000)]
    with redis_server(port), open_kind("redis", f"redis://127.0.0.1:{port}/0", connection_class=CountingConnection) as store:
        store.register_layout(FULL)
        store.register_node("A", [K], LONG)
        store.register_node("B", [V], LONG)
        store.register_node("C", [V], LONG)
        store.publish("A", "s", KID, pages, LONG, slots=range(1000))
        store.publish("B", "s", VID, pages[:400], LONG, start=0, slots=range(5000, 5400))
        store.publish("C", "s", VID, pages[300:], LONG, start=300)  # C records no locations
        server = redis.Redis(port=port)
        before = server.info("commandstats")
        sends = CountingConnection.sends
        found = store.match("s", FID, pages)
        assert CountingConnection.sends - sends == 1
        after = server.info("commandstats")
        calls = {name: after[name]["calls"] - before.get(name, {"calls": 0})["calls"] for name in after}
        assert calls.pop("cmdstat_evalsha") == 1
        assert calls.pop("cmdstat_info") == 1  # ours
        assert calls.get("cmdstat_hgetall") == 1000  # (commandstats counts the script's own calls too)
        assert found.length == 1000
        # B for [0, 400) then C (the longest run from page 400): two segments, not one per page
        assert [(s.start, s.stop) for s in found.segments] == [(0, 400), (400, 1000)]
        first, second = ({p.node: slots for p, slots in zip(s.providers, s.slots, strict=True)} for s in found.segments)
        assert first == {"A": tuple(range(400)), "B": tuple(range(5000, 5400))}
        assert second == {"A": tuple(range(400, 1000)), "C": (None,) * 600}


def test_a_closed_port_is_one_clear_error():
    port = free_port()
    with pytest.raises(
        MetaUnavailable, match=rf"cannot reach the KV metadata store at redis://127.0.0.1:{port}/0 .*start Redis there"
    ):
        RedisStore.connect(f"redis://127.0.0.1:{port}/0", "d")
    with pytest.raises(MetaUnavailable, match="takes redis://"):
        RedisStore.connect("http://127.0.0.1:1/0", "d")


def test_redis_killed_mid_use_is_a_clear_error_and_a_restart_works_again():
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with redis_server(port) as server:
        store = RedisStore.connect(url, "restart")
        store.register_layout(FULL)
        store.register_node("F", [FULL], LONG)
        store.publish("F", "s", FID, ["p0", "p1"], LONG)
        assert store.match("s", FID, ["p0", "p1"]).length == 2
        server.kill()
        server.wait()
        with pytest.raises(MetaUnavailable, match=rf"cannot reach the KV metadata store at {url}"):
            store.match("s", FID, ["p0", "p1"])
        with pytest.raises(MetaUnavailable):
            store.publish("F", "s", FID, ["p2"], LONG)
    with redis_server(port):  # a fresh Redis: no scripts, no data; nodes register again
        assert store.match("s", FID, ["p0"]).length == 0  # NOSCRIPT -> loaded again
        store.register_layout(FULL)
        store.register_node("F", [FULL], LONG)
        store.publish("F", "s", FID, ["p0", "p1"], LONG)
        assert store.match("s", FID, ["p0", "p1"]).length == 2
        store.close()


def test_auth_is_honoured():
    port = free_port()
    with redis_server(port, "--requirepass", "s3cret"):
        with pytest.raises(MetaUnavailable, match="requires a password; give it in the URL"):
            RedisStore.connect(f"redis://127.0.0.1:{port}/0", "d")
        with pytest.raises(MetaUnavailable, match=r"at redis://:\*\*\*@127.0.0.1:\d+/0 refused the credentials"):
            RedisStore.connect(f"redis://:wrong@127.0.0.1:{port}/0", "d")
        store = RedisStore.connect(f"redis://:s3cret@127.0.0.1:{port}/0", "d")
        store.register_layout(FULL)
        assert store.layout(FID) == FULL
        store.close()


def test_a_failing_script_is_named_with_its_message():
    with open_kind("redis") as store:
        store.register_layout(FULL)
        store.register_node("F", [FULL], LONG)
        store.publish("F", "s", FID, ["p0"], LONG)
        store.client.set(store.prefix + f"combos:{FID}", "not json")
        with pytest.raises(MetaScriptError, match=r"script match\.lua failed on Redis at redis://127.0.0.1:6379/0: .*"):
            store.match("s", FID, ["p0"])
        with pytest.raises(MetaError, match="layout 0000000000000000 was never registered by a node"):
            store.evict("F", "0" * 16, ["p0"])


def test_keys_are_namespaced_and_expire_with_the_deployment():
    with open_kind("redis", deployment_ttl=30) as store:
        store.register_layout(FULL)
        store.register_node("F", [FULL], 5)
        store.publish("F", "s", FID, ["p0"], 10)
        store.lock_run("s", "h", 10)
        store.lock_replica("X", "F", FID, ["p0"], 10)
        keys = store.keys()
        assert len(keys) >= 10 and all(key.startswith(f"flowkv:{{{store.deployment}}}:") for key in keys)
        assert all(0 < store.client.pttl(key) <= 30_000 for key in keys), {k: store.client.pttl(k) for k in keys}


def test_a_location_is_a_field_of_the_page_key_and_leaves_nothing_behind():
    with open_kind("redis") as store:
        store.register_layout(FULL)
        store.register_node("A", [K], LONG)
        store.register_node("B", [V], LONG)
        before = set(store.keys())
        store.publish("A", "s", KID, ["p0", "p1"], LONG, slots=[7, 2**60])
        store.publish("B", "s", VID, ["p0", "p1"], 10, start=0)
        page = store.prefix + f"page:{FID}:p0"
        assert store.client.hgetall(page) == {f"A|{KID}": "@7", f"B|{VID}": "1"}
        assert store.locate("A", KID, ["p0", "p1"]) == [7, 2**60]  # exact beyond a Lua double's 2**53 too
        added = set(store.keys()) - before
        assert added == {
            store.prefix + name
            for name in (f"chain:{FID}:s", *(f"{k}:{FID}:{p}" for k in ("page", "psess") for p in ("p0", "p1")))
        }
        assert all(0 < store.client.pttl(key) <= LONG * 1000 for key in added)
        assert [e.reason for e in store.evict("A", KID, ["p0", "p1"], drop=True)] == ["evicted", "evicted"]
        assert store.client.hgetall(page) == {f"B|{VID}": "1"}
        assert [e.reason for e in store.evict("B", VID, ["p0", "p1"], drop=True)] == ["evicted", "evicted"]
        assert set(store.keys()) - before == {store.prefix + f"chain:{FID}:s"}  # pages gone, locations with them
        assert store.match("s", FID, ["p0", "p1"]).length == 0  # the match cuts the chain at the gone page
        assert set(store.keys()) == before


def test_locations_expire_with_their_pages():
    with open_kind("redis") as store:
        store.register_layout(FULL)
        store.register_node("F", [FULL], LONG)
        before = set(store.keys())
        store.publish("F", "s", FID, [f"p{i}" for i in range(4)], 0.3, slots=range(4))
        assert store.locate("F", FID, ["p0", "p3"]) == [0, 3]
        wait_until(lambda: set(store.keys()) == before, 5, "the pages, their locations and the chain expiring")
        assert store.locate("F", FID, ["p0", "p3"]) == [None, None]


def test_locate_is_one_round_trip():
    port = free_port()
    with redis_server(port), open_kind("redis", f"redis://127.0.0.1:{port}/0", connection_class=CountingConnection) as store:
        store.register_layout(FULL)
        store.register_node("F", [FULL], LONG)
        pages = [f"{i:016x}" for i in range(500)]
        store.publish("F", "s", FID, pages, LONG, slots=range(500, 1000))
        sends = CountingConnection.sends
        assert store.locate("F", FID, pages) == list(range(500, 1000))
        assert CountingConnection.sends - sends == 1
