"""A deployment's keys: who may talk to whom between its processes, and the registry's MAC.

Every ZMQ socket between a deployment's processes authenticates its peer in the handshake,
before any message passes: the binding process's ZAP handler (`Guard`, on pyzmq's
ThreadAuthenticator, one per ZMQ context that binds) admits only the clients its sockets
expect, by the key they prove they hold:

- `gateway`: held by the gateway/supervisor alone; the only key a replica's ROUTER admits (so
  only the gateway can start activations there, or send `Cancel` and `Stop`).
- `member`: held by the replicas (and the memory managers, for their own statistics client);
  the key the embedded registry's PULL socket admits.
- the memory manager's ROUTER admits both.

tcp endpoints (`ray=ADDRESS`) speak CURVE (libsodium): the binding side holds the deployment's
server key pair, so a client talks only to the deployment's own sockets, and each client proves
it holds the `gateway` or `member` secret; everything is encrypted. ipc endpoints (one machine:
`local`, a local Ray cluster) speak ZMQ's PLAIN mechanism with the `gateway` or `member` token
as the password, checked by ZAP against its SHA-256 (a replica knows only the gateway token's
digest): the peer is authenticated all the same, but messages are not encrypted, because the
socket's 0700 directory already keeps every other user from them, and CURVE's encryption made
a 4 MiB round trip 5 to 12 times slower here (docs/security.md, "Between processes"). A client
dials an ipc socket only inside a directory of this user's that no one else may enter
(`private_ipc`), so a token is never sent to a socket someone else made.

A peer without the keys never completes the handshake, so no message of its arrives and
nothing it sent is decoded, let alone unpickled. Refusals are counted (`Guard.refused`): a
socket `watch`ed on an event loop counts every failed handshake (a peer speaking another
mechanism, one that does not know the server's key, one whose key ZAP refused); elsewhere,
ZAP's refusals.

`mac` (32 random bytes) signs the records a replica writes to Redis (HMAC-SHA256,
flowrt.registry.stores). Every key is made with the OS's randomness when a deployment starts
and lives only as long as it: a replica gets its keys in its configuration
($FLOWRT_REPLICA_CONFIG, its environment, readable only by its user; under Ray, the actor's
method arguments), never on a command line; the gateway's secrets never leave the gateway.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import itertools
import logging
import os
import secrets
import stat
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger("flowrt.transport")
FAILED_HANDSHAKES = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
_monitors = itertools.count(1)


def available() -> bool:
    """Whether this pyzmq/libzmq build has CURVE (libsodium)."""
    return bool(zmq.has("curve"))


@dataclass(frozen=True)
class Keys:
    """A deployment's keys (z85 text for CURVE, hex tokens for PLAIN); a secret is "" where
    this process must not hold it (a replica has no gateway secret, only its digest)."""

    server_public: str
    server_secret: str
    gateway_public: str
    gateway_secret: str
    member_public: str
    member_secret: str
    gateway_token: str
    member_token: str
    gateway_digest: str  # SHA-256 of the token, what a server checks it against
    member_digest: str
    mac: str  # hex

    @classmethod
    def generate(cls) -> Keys:
        if not available():
            raise RuntimeError("this pyzmq build has no CURVE (libsodium): a deployment's sockets cannot authenticate")
        pairs = [zmq.curve_keypair() for _ in range(3)]
        (sp, ss), (gp, gs), (mp, ms) = ((p.decode(), s.decode()) for p, s in pairs)
        gt, mt = secrets.token_hex(32), secrets.token_hex(32)
        return cls(sp, ss, gp, gs, mp, ms, gt, mt, _digest(gt), _digest(mt), secrets.token_hex(32))

    def for_replica(self) -> dict:
        """What a replica (or a memory manager) is given: all but the gateway's secrets."""
        return {**self.__dict__, "gateway_secret": "", "gateway_token": ""}

    @classmethod
    def from_config(cls, config: dict | None) -> Keys | None:
        if not config:
            return None
        return cls(**{name: config.get(name, "") for name in cls.__dataclass_fields__})

    @property
    def mac_key(self) -> bytes:
        return bytes.fromhex(self.mac)

    def serve(self, sock: zmq.Socket, endpoint: str) -> None:
        """Make `sock` (before it binds `endpoint`) a server that authenticates its clients:
        PLAIN on ipc, CURVE under the deployment's server key elsewhere."""
        if endpoint.startswith("ipc://"):
            sock.plain_server = True
            return
        sock.curve_secretkey = self.server_secret.encode()
        sock.curve_publickey = self.server_public.encode()
        sock.curve_server = True

    def dial(self, sock: zmq.Socket, as_: str, endpoint: str) -> None:
        """Make `sock` (before it connects to `endpoint`) a client with the `as_` key ("gateway"
        or "member"): PLAIN on ipc (only inside a private directory), CURVE elsewhere, accepting
        only the deployment's server. ValueError if this process holds no such key, or the ipc
        socket is not in a directory only this user may enter."""
        if endpoint.startswith("ipc://"):
            token = self.gateway_token if as_ == "gateway" else self.member_token
            if not token:
                raise ValueError(f"this process holds no {as_} key")
            private_ipc(endpoint)
            sock.plain_username = as_.encode()
            sock.plain_password = token.encode()
            return
        secret = self.gateway_secret if as_ == "gateway" else self.member_secret
        public = self.gateway_public if as_ == "gateway" else self.member_public
        if not secret:
            raise ValueError(f"this process holds no {as_} key")
        sock.curve_serverkey = self.server_public.encode()
        sock.curve_publickey = public.encode()
        sock.curve_secretkey = secret.encode()

    def user(self, who: str) -> frozenset[str]:
        """The User-Ids ZAP gives a client authenticated with the `who` key (CURVE, PLAIN)."""
        return frozenset({self.gateway_public if who == "gateway" else self.member_public, who})


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def private_ipc(endpoint: str) -> None:
    """ValueError unless the ipc socket's directory is this user's and no one else may enter
    it (a token sent there reaches only this user's processes)."""
    directory = os.path.dirname(endpoint[len("ipc://") :]) or "."
    try:
        info = os.lstat(directory)
    except OSError as error:
        raise ValueError(f"cannot dial {endpoint}: {error.strerror}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ValueError(f"refused to dial {endpoint}: its directory is not this user's alone (0700)")


class Guard:
    """The ZAP handler of one ZMQ context whose sockets bind: admits the clients holding one of
    the `allowed` keys ("gateway", "member") of `keys`, refuses (and counts) every other. Start
    it before binding; `stop` before the context is destroyed."""

    def __init__(self, context: zmq.Context, keys: Keys, allowed: list[str], what: str):
        from zmq.auth.thread import ThreadAuthenticator

        guard = self

        class Zap(ThreadAuthenticator):
            def _authenticate_plain(self, domain: str, username: str, password: str) -> tuple[bool, bytes]:
                return guard.plain(username, password), b"OK"

        self.keys = keys
        self.allowed = frozenset((keys.gateway_public if who == "gateway" else keys.member_public).encode() for who in allowed)
        self.tokens = {who: keys.gateway_digest if who == "gateway" else keys.member_digest for who in allowed}
        self.what = what
        self.refused = 0
        self.watched: list[tuple] = []  # (socket, monitor, fd, loop)
        self.sync = sync = context if type(context) is zmq.Context else zmq.Context.shadow(context.underlying)
        self.authenticator = Zap(sync, log=logging.getLogger("flowrt.transport.zap"))
        self.authenticator.start()
        self.authenticator.configure_curve_callback("*", self)

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.allowed:
            return True
        if not self.watched:  # (a watched socket counts it as a failed handshake)
            self._refused("its key is not the deployment's")
        return False

    def plain(self, username: str, password: str) -> bool:
        digest = self.tokens.get(username)
        if digest is not None and hmac.compare_digest(digest, _digest(password)):
            return True
        if not self.watched:
            self._refused("it does not hold the deployment's token")
        return False

    def _refused(self, why: str) -> None:
        self.refused += 1
        if self.refused == 1 or self.refused % 100 == 0:
            log.warning("%s: refused a peer (%s; %d refused so far)", self.what, why, self.refused)

    def watch(self, sock: zmq.Socket, loop) -> None:
        """Count every failed handshake on `sock` (bound, CURVE) from `loop`'s reader."""
        address = f"inproc://flowrt-guard-{next(_monitors)}"
        sock.monitor(address, FAILED_HANDSHAKES)
        monitor = self.sync.socket(zmq.PAIR)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
        fd = monitor.getsockopt(zmq.FD)
        loop.add_reader(fd, self._events, monitor)
        loop.call_soon(self._events, monitor)  # (edge-triggered: what came before the reader)
        self.watched.append((sock, monitor, fd, loop))

    def monitor(self, sock: zmq.Socket) -> zmq.Socket:
        """Count every failed handshake on `sock` (bound) for a caller that polls for itself (the
        memory manager's loop, which has no event loop): poll the returned socket with `sock`, and
        call `heard(monitor)` when it is readable."""
        address = f"inproc://flowrt-guard-{next(_monitors)}"
        sock.monitor(address, FAILED_HANDSHAKES)
        monitor = self.sync.socket(zmq.PAIR)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
        self.watched.append((sock, monitor, None, None))
        return monitor

    def heard(self, monitor: zmq.Socket) -> None:
        """Count the failed handshakes `monitor` (from `monitor()`) has heard of."""
        self._events(monitor)

    def _events(self, monitor: zmq.Socket) -> None:
        while not monitor.closed and monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            if event["event"] & FAILED_HANDSHAKES:
                self._refused("its handshake failed: it does not hold the deployment's keys")

    def stop(self) -> None:
        for sock, monitor, fd, loop in self.watched:
            if loop is not None:
                with contextlib.suppress(Exception):
                    loop.remove_reader(fd)
            with contextlib.suppress(Exception):
                sock.disable_monitor()
            monitor.close(0)
        self.watched.clear()
        with contextlib.suppress(Exception):
            self.authenticator.stop()
