"""Endpoints: private ipc directories, binding with the right permissions, tcp addresses.

On one machine the processes of a deployment talk over ipc:// sockets in a directory only its
user can enter (0700), each socket file made 0600 once bound, so another user can neither
connect nor read. Across machines they use tcp:// on the address given.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path

import zmq

log = logging.getLogger("flowrt.transport")

IPC_MAX = 100  # sun_path is 108 bytes on Linux, with room for the scheme's checks


def private_dir() -> Path:
    """A new directory for a deployment's ipc sockets, 0700 (mkdtemp's mode), short enough
    for socket paths, named after this process; directories of this user's deployments whose
    process is gone (killed with -9: nothing could remove them) are removed first."""
    base = os.environ.get("FLOWRT_SOCKET_DIR") or ("/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir())
    _sweep(Path(base))
    path = Path(tempfile.mkdtemp(prefix=f"flowrt-{os.getpid()}-", dir=base))
    os.chmod(path, 0o700)
    return path


def _sweep(base: Path) -> None:
    try:
        entries = list(base.glob("flowrt-*-*"))
    except OSError:
        return
    for entry in entries:
        pid = entry.name.split("-")[1]
        try:
            mine = entry.is_dir() and not entry.is_symlink() and entry.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited but not reaped, does not)."""
    if pid <= 0:  # (kill(0) and kill(-1) would ask about process groups)
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):  # (no such PID can exist: a forged one)
        return False
    except PermissionError:
        return True  # someone else's: it exists
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc here: kill(0) is all we know


def remove_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def ipc_endpoint(directory: Path, name: str) -> str:
    endpoint = f"ipc://{directory}/{name}"
    if len(endpoint) > IPC_MAX:
        raise ValueError(f"socket path {endpoint} is too long for ipc://; set FLOWRT_SOCKET_DIR to a shorter directory")
    return endpoint


def bind(sock: zmq.Socket, endpoint: str) -> str:
    """Bind `sock`; an ipc socket file is made 0600; returns the endpoint peers dial (a tcp
    port 0 becomes the port the system chose; host `auto` becomes this machine's address)."""
    if endpoint.startswith("tcp://auto:"):
        endpoint = f"tcp://{host_address()}:{endpoint[len('tcp://auto:') :]}"
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        port = sock.bind_to_random_port(endpoint[: -len(":0")])
        return f"{endpoint[: -len(':0')]}:{port}"
    sock.bind(endpoint)
    if endpoint.startswith("ipc://"):
        os.chmod(endpoint[len("ipc://") :], 0o600)
    return endpoint


def host_address() -> str:
    """This machine's address as other machines would dial it (for tcp endpoints):
    $FLOWRT_HOST if set (a machine with several networks, or loopback only), else the address
    of the interface that routes outwards."""
    override = os.environ.get("FLOWRT_HOST", "").strip()
    if override:
        return override
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))  # no packet is sent: this picks the outgoing interface
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


class Reader:
    """Reads a (plain, non-asyncio) ZMQ socket from the event loop: when its FD signals, every
    message waiting is handed to `on_message(frames)` at once, with no future or task per
    message (zmq.asyncio's way costs about twice the round trip here; docs/deploy.md).

    ZMQ signals by edges, and any send may consume the edge that says a message is waiting:
    after sending on the socket, call `kick()`, which drains on the loop's next turn if so.
    """

    __slots__ = ("socket", "on_message", "loop", "fd", "scheduled")

    def __init__(self, sock: zmq.Socket, on_message, loop) -> None:
        self.socket = sock
        self.on_message = on_message
        self.loop = loop
        self.fd = sock.getsockopt(zmq.FD)
        self.scheduled = False
        loop.add_reader(self.fd, self.drain)
        self.kick()

    def drain(self) -> None:
        self.scheduled = False
        sock = self.socket
        if sock.closed:
            return
        recv = sock.recv_multipart
        while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                self.on_message(frames)
            except Exception:  # noqa: BLE001 - one message that breaks its handler must not strand the ones behind it
                log.exception("dropped a message its handler could not take")
            if sock.closed:
                return

    def kick(self) -> None:
        if not self.scheduled and not self.socket.closed and self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self.scheduled = True
            self.loop.call_soon(self.drain)

    def close(self) -> None:
        self.loop.remove_reader(self.fd)
        self.socket.close(0)


class Coalescer:
    """Messages to one peer sent in one event-loop turn leave as one ZMQ message (a `Batch`), at
    the end of the turn: a role streaming frames without awaiting, or a burst of activations
    started at once, costs one send and one wake-up of the peer instead of one per message.
    Order is kept. `send(frames)` queues one message (its ZMQ frames, envelope first);
    `prefix` (a ROUTER's peer identity) goes before each ZMQ message sent."""

    __slots__ = ("socket", "reader", "prefix", "queued", "loop", "scheduled")

    def __init__(self, sock: zmq.Socket, reader: Reader, loop, prefix: list | None = None) -> None:
        self.socket = sock
        self.reader = reader
        self.prefix = prefix or []
        self.queued: list[list] = []
        self.loop = loop
        self.scheduled = False

    def send(self, frames: list) -> None:
        self.queued.append(frames)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        queued, self.queued = self.queued, []
        if not queued or self.socket.closed:
            return
        if len(queued) == 1:
            frames = queued[0]
        else:
            from flowrt.transport.messages import VERSION, Batch, encode

            frames = [encode(Batch(VERSION, [len(message) for message in queued]))]
            for message in queued:
                frames += message
        self.socket.send_multipart(self.prefix + frames, zmq.NOBLOCK, copy=False)
        self.reader.kick()


def unbatch(sizes: list[int], frames: list) -> list[list] | None:
    """The messages of a Batch whose envelope said `sizes`; None if the frames do not add up."""
    if any(size < 1 for size in sizes) or sum(sizes) != len(frames):
        return None
    messages, start = [], 0
    for size in sizes:
        messages.append(frames[start : start + size])
        start += size
    return messages
