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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import urlsplit

import msgspec
import zmq
import zmq.asyncio

from flowrt.registry.directory import Directory
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


_record_decoder = msgspec.msgpack.Decoder(RedisRecord)


# ── the gateway's side: sources feeding a Directory ──


class EmbeddedSource:
    def __init__(self, context: zmq.asyncio.Context, endpoint: str, directory: Directory):
        from flowrt.transport.sockets import bind

        self.directory = directory
        self.socket = context.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.endpoint = bind(self.socket, endpoint)
        self.garbage = 0
        self.task: asyncio.Task | None = None

    def start(self) -> None:
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


class RedisSource:
    def __init__(self, client, deployment: str, expected: list[tuple[str, int]], directory: Directory):
        self.client = client
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
        for value in values:
            if value is None:
                continue
            try:
                record = _record_decoder.decode(value)
                self.directory.seen(record.register)
                self.directory.seen(record.heartbeat)
            except Exception as error:  # noqa: BLE001 - whatever a foreign value holds, the registry goes on
                self.garbage += 1
                log.warning("registry: dropped a Redis record that is not a replica's (%s: %s)", type(error).__name__, error)
        if marker is not None:
            self.directory.sweep()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.delete(self.marker)
        await self.client.aclose()


async def open_source(
    registry: str | None, context: zmq.asyncio.Context, endpoint: str, deployment: str, expected, directory: Directory
):
    if registry is None:
        return EmbeddedSource(context, endpoint, directory)
    source = RedisSource(await redis_connection(registry), deployment, expected, directory)
    await source.start_marker()
    return source


# ── the replica's side ──


class EmbeddedClient:
    def __init__(self, context: zmq.asyncio.Context, endpoint: str):
        self.socket = context.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 16)
        self.socket.connect(endpoint)

    async def beat(self, register: Register, heartbeat: Heartbeat) -> None:
        # the registration rides with every heartbeat: a gateway that missed it (or restarted) learns it
        with contextlib.suppress(zmq.Again):
            await self.socket.send(encode(register), flags=zmq.NOBLOCK)
            await self.socket.send(encode(heartbeat), flags=zmq.NOBLOCK)

    async def close(self) -> None:
        self.socket.close(0)


class RedisClient:
    def __init__(self, client, deployment: str, ttl: float):
        self.client = client
        self.deployment = deployment
        self.ttl_ms = max(1, int(ttl * 1000))
        self.reachable = True

    async def beat(self, register: Register, heartbeat: Heartbeat) -> None:
        from redis import exceptions

        key = replica_key(self.deployment, register.role, register.replica)
        try:
            await self.client.set(key, msgspec.msgpack.encode(RedisRecord(register, heartbeat)), px=self.ttl_ms)
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


async def open_client(registry: str | None, context: zmq.asyncio.Context, endpoint: str, deployment: str, ttl: float):
    if registry is None:
        return EmbeddedClient(context, endpoint)
    return RedisClient(await redis_connection(registry), deployment, ttl)
