"""The encoder cache (flowrt.compute.encoder_cache): hits skip the forward, the LRU keeps within
its entry and byte bounds, concurrent requests for one payload run one forward (even when one of
them is cancelled), a failed forward is not cached, and bad bounds are refused."""

from __future__ import annotations

import asyncio

import pytest

from flowrt.compute.encoder_cache import EncoderCache, EncoderCacheError
from flowrt.compute.hashing import content_hash


class Encoder:
    """Encodes a payload to bytes of a chosen size, counting forwards; `gate` holds them."""

    def __init__(self, size: int = 10, gate: asyncio.Event | None = None):
        self.size = size
        self.gate = gate
        self.started = asyncio.Event()
        self.forwards: list[bytes] = []

    def job(self, payload: bytes):
        async def forward():
            self.forwards.append(payload)
            self.started.set()
            if self.gate is not None:
                await self.gate.wait()
            return payload[:1] * self.size

        return forward


def key(payload: bytes) -> bytes:
    return content_hash(payload)


def test_a_hit_skips_the_forward_and_the_counters_say_so():
    async def body():
        cache, encoder = EncoderCache(max_bytes=100, max_entries=10), Encoder()
        first = await cache.get(key(b"a"), encoder.job(b"a"))
        again = await cache.get(key(b"a"), encoder.job(b"a"))
        other = await cache.get(key(b"b"), encoder.job(b"b"))
        assert again is first and other == b"b" * 10 and encoder.forwards == [b"a", b"b"]
        stats = cache.statistics()
        assert (stats["hits"], stats["misses"], stats["joins"], stats["entries"], stats["bytes"]) == (1, 2, 0, 2, 20)

    asyncio.run(body())


def test_a_sync_encoder_works_too():
    async def body():
        cache = EncoderCache()
        assert await cache.get("k", lambda: b"xyz") == b"xyz"
        assert cache.statistics()["bytes"] == 3

    asyncio.run(body())


def test_the_lru_keeps_within_max_entries_dropping_the_least_recently_used():
    async def body():
        cache, encoder = EncoderCache(max_bytes=1000, max_entries=2), Encoder()
        for payload in (b"a", b"b"):
            await cache.get(key(payload), encoder.job(payload))
        await cache.get(key(b"a"), encoder.job(b"a"))  # a is now the most recently used
        await cache.get(key(b"c"), encoder.job(b"c"))
        assert key(b"b") not in cache and key(b"a") in cache and key(b"c") in cache
        assert cache.statistics()["evictions"] == 1
        await cache.get(key(b"b"), encoder.job(b"b"))  # dropped: encoded again
        assert encoder.forwards == [b"a", b"b", b"c", b"b"]

    asyncio.run(body())


def test_the_lru_keeps_within_max_bytes_and_never_keeps_an_output_larger_than_that():
    async def body():
        cache = EncoderCache(max_bytes=25, max_entries=100)
        small = Encoder(size=10)
        for payload in (b"a", b"b", b"c"):  # 30 bytes > 25: a goes
            await cache.get(key(payload), small.job(payload))
        assert key(b"a") not in cache and len(cache) == 2 and cache.bytes == 20
        huge = Encoder(size=26)
        value = await cache.get(key(b"h"), huge.job(b"h"))
        assert len(value) == 26 and key(b"h") not in cache and len(cache) == 2  # returned, not kept; nothing evicted for it
        stats = cache.statistics()
        assert (stats["oversized"], stats["evictions"]) == (1, 1)

    asyncio.run(body())


def test_concurrent_requests_for_one_payload_run_one_forward():
    async def body():
        gate = asyncio.Event()
        cache, encoder = EncoderCache(), Encoder(gate=gate)
        leader = asyncio.ensure_future(cache.get(key(b"a"), encoder.job(b"a")))
        await encoder.started.wait()  # the forward runs, held by the gate
        assert cache.state(key(b"a")) == "join"
        followers = [asyncio.ensure_future(cache.get(key(b"a"), encoder.job(b"a"))) for _ in range(3)]
        await asyncio.wait(followers, timeout=0)  # one turn of the loop (no timing): each follower reaches get()
        gate.set()
        values = await asyncio.gather(leader, *followers)
        assert encoder.forwards == [b"a"] and all(value is values[0] for value in values)
        stats = cache.statistics()
        assert (stats["misses"], stats["joins"], stats["hits"], stats["in_flight"]) == (1, 3, 0, 0)
        assert cache.state(key(b"a")) == "hit"

    asyncio.run(body())


def test_a_cancelled_requester_does_not_cancel_the_forward_for_the_others():
    async def body():
        gate = asyncio.Event()
        cache, encoder = EncoderCache(), Encoder(gate=gate)
        first = asyncio.ensure_future(cache.get(key(b"a"), encoder.job(b"a")))
        await encoder.started.wait()
        second = asyncio.ensure_future(cache.get(key(b"a"), encoder.job(b"a")))
        await asyncio.wait([second], timeout=0)
        first.cancel()
        gate.set()
        assert await second == b"a" * 10
        assert first.cancelled() and encoder.forwards == [b"a"] and key(b"a") in cache

    asyncio.run(body())


def test_a_failed_forward_reaches_every_waiter_and_is_not_cached():
    async def body():
        gate = asyncio.Event()
        started = asyncio.Event()
        calls = []

        async def broken():
            calls.append(1)
            started.set()
            await gate.wait()
            raise RuntimeError("the encoder broke")

        cache = EncoderCache()
        waiters = [asyncio.ensure_future(cache.get("k", broken))]
        await started.wait()
        waiters.append(asyncio.ensure_future(cache.get("k", broken)))
        await asyncio.wait(waiters[1:], timeout=0)
        gate.set()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(result, RuntimeError) for result in results) and len(calls) == 1
        assert "k" not in cache and cache.statistics()["failures"] == 1
        assert await cache.get("k", lambda: b"fixed") == b"fixed"  # the next request tries again
        assert cache.statistics()["misses"] == 2

    asyncio.run(body())


def test_bad_bounds_and_unsized_values_are_refused():
    with pytest.raises(EncoderCacheError, match="max_bytes=-1"):
        EncoderCache(max_bytes=-1)
    with pytest.raises(EncoderCacheError, match="max_entries='3'"):
        EncoderCache(max_entries="3")

    async def body():
        with pytest.raises(EncoderCacheError, match="cannot tell the size of a object.*sizeof"):
            await EncoderCache().get("k", object)
        assert await EncoderCache(sizeof=lambda value: 1).get("k", object) is not None

    asyncio.run(body())


def test_a_zero_bound_keeps_nothing():
    async def body():
        cache, encoder = EncoderCache(max_entries=0), Encoder()
        await cache.get("k", encoder.job(b"a"))
        await cache.get("k", encoder.job(b"a"))
        assert encoder.forwards == [b"a", b"a"] and len(cache) == 0

    asyncio.run(body())
