"""Where registrations and heartbeats travel: the embedded store or Redis.

Embedded (the default): the gateway binds a PULL socket in the deployment's private ipc
directory; each replica PUSHes `Register`, then a `Heartbeat` every TTL/3. Lapses are found by
the gateway's sweep.

Redis (`redis://[:PASSWORD@]HOST:PORT/DB`, `rediss://` for TLS): each replica writes its
record under `flowrt:{deployment}:replica:{role}:{replica}` with a PX expiry of the TTL and
renews it every TTL/3; the gateway reads every expected key in one pipelined round trip per
TTL/3, so a key that expired is a lapse. The gateway also keeps a marker key: when it is gone,
Redis lost its data (a restart), and every replica gets one TTL to re-register before any is
dropped. While Redis is unreachable, replicas keep serving and the gateway keeps the records it
has (the data path does not go through Redis); both retry and log once.

Both are authenticated with the deployment's keys (flowrt.transport.keys): the embedded
registry's socket admits only the replicas' `member` key, so a peer
without it never gets a message through; a Redis record is a `SignedRecord`, its MAC an
HMAC-SHA256 under the deployment's MAC key over the protocol version, the record's key name and
its bytes. A record whose MAC does not verify (written by someone without the key, or copied
to another key) is ignored, logged once per key and counted (`forged`): its address is never
dialled, and no replica is dropped or killed because of it. Why a MAC rather than a Redis ACL
user per deployment: Redis may be shared and run by someone else (ACLs need its admin, and
whoever holds that admin's rights, or a `default` user left open, could still write); a MAC
asks nothing of Redis and holds against anyone who can write there.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from urllib.parse import urlsplit

import msgspec
import zmq
import zmq.asyncio

from flowrt.registry.directory import Directory
from flowrt.transport.keys import Guard, Keys
from flowrt.transport.messages import VERSION, Garbage, Heartbeat, Register, decode, encode

log = logging.getLogger("flowrt.registry")


class RegistryError(Exception):
    """The registry cannot be used (a bad URL, Redis unreachable or refusing us)."""


def parse_registry(url: str | None) -> str | None:
    """None for the embedded registry, else the Redis URL, checked; RegistryError naming the
    form (with any password hidden)."""
    if url is None or url == "embedded":
        return None
    parts = urlsplit(url)
    shown = shown_url(url)
    if parts.scheme not in ("redis", "rediss"):
        raise RegistryError(f"--registry takes redis://[:PASSWORD@]HOST:PORT/DB or rediss://..., not {shown!r}")
    try:
        port = parts.port
    except ValueError:
        raise RegistryError(f"--registry {shown!r}: the port must be a number from 1 to 65535") from None
    if port == 0:
        raise RegistryError(f"--registry {shown!r}: the port must be a number from 1 to 65535")
    if not parts.hostname:
        raise RegistryError(f"--registry {shown!r} names no host; e.g. redis://127.0.0.1:6379/0")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise RegistryError(f"--registry {shown!r}: the database must be a number, e.g. redis://127.0.0.1:6379/0")
    if parts.query or parts.fragment:
        raise RegistryError(f"--registry {shown!r}: leave out the ?query; the form is redis://[:PASSWORD@]HOST:PORT/DB")
    return url


def shown_url(url: str) -> str:
    """A Redis URL with its password hidden, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()


async def redis_connection(url: str):
    """A connected redis.asyncio client, or RegistryError saying what is wrong and the fix."""
    import redis.asyncio as aioredis
    from redis import exceptions

    client = aioredis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        await client.ping()
    except (exceptions.AuthenticationError, exceptions.AuthenticationWrongNumberOfArgsError, exceptions.ResponseError) as error:
        await client.aclose()
        text = str(error)
        if urlsplit(url).password is None and ("auth" in text.lower() or isinstance(error, exceptions.AuthenticationError)):
            raise RegistryError(
                f"Redis at {shown_url(url)} requires a password; give it in the URL: redis://:PASSWORD@HOST:PORT/DB"
            ) from None
        if isinstance(error, exceptions.AuthenticationError) or "WRONGPASS" in text or "invalid password" in text:
            raise RegistryError(
                f"Redis at {shown_url(url)} refused the credentials ({text}); put the right password in the URL: redis://:PASSWORD@HOST:PORT/DB"
            ) from None
        raise RegistryError(f"Redis at {shown_url(url)} answered: {text}") from None
    except (exceptions.ConnectionError, exceptions.TimeoutError, OSError) as error:
        await client.aclose()
        raise RegistryError(
            f"cannot reach the registry at {shown_url(url)} ({error}); start Redis there, or leave out --registry to use the embedded one"
        ) from None
    return client


def replica_key(deployment: str, role: str, replica: int) -> str:
    return f"flowrt:{deployment}:replica:{role}:{replica}"


class RedisRecord(msgspec.Struct, array_like=True):
    """What a replica keeps under its key: its registration and its latest load."""

    register: Register
    heartbeat: Heartbeat


class SignedRecord(msgspec.Struct, array_like=True):
    """What a Redis key holds: a RedisRecord's bytes and their MAC (`record_mac`)."""

    version: int
    record: bytes
    mac: bytes


_record_decoder = msgspec.msgpack.Decoder(RedisRecord)
_signed_decoder = msgspec.msgpack.Decoder(SignedRecord)


class Forged(Exception):
    """A Redis record whose MAC does not verify under the deployment's key."""


def record_mac(mac_key: bytes, key: str, record: bytes) -> bytes:
    """HMAC-SHA256 under the deployment's MAC key over the record's canonical bytes: the
    protocol version, the Redis key it is stored under, and the record's msgpack bytes."""
    return hmac.new(mac_key, b"flowrt-registry\0%d\0%s\0" % (VERSION, key.encode()) + record, hashlib.sha256).digest()


def signed(mac_key: bytes, key: str, record: RedisRecord) -> bytes:
    data = msgspec.msgpack.encode(record)
    return msgspec.msgpack.encode(SignedRecord(VERSION, data, record_mac(mac_key, key, data)))


def verified(mac_key: bytes, deployment: str, key: str, value: bytes) -> RedisRecord:
    """The record under `key`, once its MAC verifies: Forged if it does not (or if it names
    another replica than its key's); another exception if the value is no record at all."""
    envelope = _signed_decoder.decode(value)
    if envelope.version != VERSION or not hmac.compare_digest(envelope.mac, record_mac(mac_key, key, envelope.record)):
        raise Forged("its MAC does not verify under the deployment's key")
    record = _record_decoder.decode(envelope.record)
    if replica_key(deployment, record.register.role, record.register.replica) != key:
        raise Forged("it names another replica than its key")
    if (record.heartbeat.role, record.heartbeat.replica, record.heartbeat.incarnation) != (
        record.register.role,
        record.register.replica,
        record.register.incarnation,
    ):
        raise Forged("its heartbeat is another replica's")
    return record


# ── the gateway's side: sources feeding a Directory ──


class EmbeddedSource:
    def __init__(self, context: zmq.asyncio.Context, endpoint: str, directory: Directory, keys: Keys):
        from flowrt.transport.sockets import bind

        self.directory = directory
        self.guard = Guard(context, keys, ["member"], "registry")  # (only replicas may push)
        self.socket = context.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        keys.serve(self.socket, endpoint)
        self.endpoint = bind(self.socket, endpoint)
        self.garbage = 0
        self.forged = 0  # (a peer without the keys never completes the handshake: see guard.refused)
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.guard.watch(self.socket, asyncio.get_running_loop())
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while True:
            data = await self.socket.recv()
            try:
                message = decode("registry", data)
                self.directory.seen(message)
            except Garbage as error:
                self.garbage += 1
                log.warning("registry: dropped a message that is %s", error)
            except Exception:  # noqa: BLE001 - the registry must outlive any one message
                self.garbage += 1
                log.exception("registry: dropped a message it could not take")

    async def poll(self) -> None:
        self.directory.sweep()

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        self.socket.close(0)
        self.guard.stop()

    def refused(self) -> int:
        return self.guard.refused


class RedisSource:
    def __init__(self, client, deployment: str, expected: list[tuple[str, int]], directory: Directory, mac_key: bytes):
        self.client = client
        self.mac_key = mac_key
        self.forged = 0  # records whose MAC did not verify (ignored)
        self.forged_keys: set[str] = set()  # keys holding a forged record now (each logged once)
        self.deployment = deployment
        self.expected = expected
        self.directory = directory
        self.marker = f"flowrt:{deployment}:gateway"
        self.reachable = True
        self.garbage = 0

    async def start_marker(self) -> None:
        await self.client.set(self.marker, VERSION, px=int(max(self.directory.ttl * 10, 60) * 1000))

    def start(self) -> None:
        pass

    async def poll(self) -> None:
        from redis import exceptions

        keys = [replica_key(self.deployment, role, replica) for role, replica in self.expected]
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.get(self.marker)
            pipe.mget(keys)
            pipe.set(self.marker, VERSION, px=int(max(self.directory.ttl * 10, 60) * 1000))
            marker, values, _ = await pipe.execute()
        except (exceptions.ConnectionError, exceptions.TimeoutError, OSError) as error:
            if self.reachable:
                log.warning("registry: Redis is unreachable (%s); keeping the replicas known, retrying", error)
                self.reachable = False
            self.directory.refresh()
            return
        if not self.reachable:
            log.warning("registry: Redis is reachable again")
            self.reachable = True
        if marker is None:  # Redis lost its data: give everyone one TTL to re-register
            self.directory.refresh()
        for key, value in zip(keys, values, strict=True):
            if value is None:
                continue
            try:
                record = verified(self.mac_key, self.deployment, key, value)
            except Forged as error:
                self.forged += 1
                if key not in self.forged_keys:
                    self.forged_keys.add(key)
                    log.warning("registry: ignored the record under %s: %s (not written by this deployment)", key, error)
                continue
            except Exception as error:  # noqa: BLE001 - whatever a foreign value holds, the registry goes on
                self.forged += 1
                if key not in self.forged_keys:
                    self.forged_keys.add(key)
                    log.warning("registry: ignored the record under %s, which is not a replica's (%s)", key, type(error).__name__)
                continue
            self.forged_keys.discard(key)
            try:
                self.directory.seen(record.register)
                self.directory.seen(record.heartbeat)
            except Exception as error:  # noqa: BLE001 - whatever a record holds, the registry goes on
                self.garbage += 1
                log.warning("registry: dropped a Redis record that is not a replica's (%s: %s)", type(error).__name__, error)
        if marker is not None:
            self.directory.sweep()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.delete(self.marker)
        await self.client.aclose()

    def refused(self) -> int:
        return 0


async def open_source(
    registry: str | None,
    context: zmq.asyncio.Context,
    endpoint: str,
    deployment: str,
    expected,
    directory: Directory,
    keys: Keys,
):
    if registry is None:
        return EmbeddedSource(context, endpoint, directory, keys)
    source = RedisSource(await redis_connection(registry), deployment, expected, directory, keys.mac_key)
    await source.start_marker()
    return source


# ── the replica's side ──


class EmbeddedClient:
    def __init__(self, context: zmq.asyncio.Context, endpoint: str, keys: Keys):
        self.socket = context.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 16)
        keys.dial(self.socket, "member", endpoint)
        self.socket.connect(endpoint)

    async def beat(self, register: Register, heartbeat: Heartbeat) -> None:
        # the registration rides with every heartbeat: a gateway that missed it (or restarted) learns it
        with contextlib.suppress(zmq.Again):
            await self.socket.send(encode(register), flags=zmq.NOBLOCK)
            await self.socket.send(encode(heartbeat), flags=zmq.NOBLOCK)

    async def close(self) -> None:
        self.socket.close(0)


class RedisClient:
    def __init__(self, client, deployment: str, ttl: float, mac_key: bytes):
        self.client = client
        self.mac_key = mac_key
        self.deployment = deployment
        self.ttl_ms = max(1, int(ttl * 1000))
        self.reachable = True

    async def beat(self, register: Register, heartbeat: Heartbeat) -> None:
        from redis import exceptions

        key = replica_key(self.deployment, register.role, register.replica)
        try:
            await self.client.set(key, signed(self.mac_key, key, RedisRecord(register, heartbeat)), px=self.ttl_ms)
        except (exceptions.ConnectionError, exceptions.TimeoutError, OSError) as error:
            if self.reachable:
                log.warning("registry: Redis is unreachable (%s); serving on, retrying", error)
                self.reachable = False
            return
        if not self.reachable:
            log.warning("registry: Redis is reachable again; registered anew")
            self.reachable = True

    async def close(self) -> None:
        await self.client.aclose()


async def open_client(registry: str | None, context: zmq.asyncio.Context, endpoint: str, deployment: str, ttl: float, keys: Keys):
    if registry is None:
        return EmbeddedClient(context, endpoint, keys)
    return RedisClient(await redis_connection(registry), deployment, ttl, keys.mac_key)
