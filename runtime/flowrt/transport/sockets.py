"""Endpoints: private ipc directories, binding with the right permissions, tcp addresses.

On one machine the processes of a deployment talk over ipc:// sockets in a directory only its
user can enter (0700), each socket file made 0600 once bound, so another user can neither
connect nor read. Across machines they use tcp:// on the address given.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

import zmq

IPC_MAX = 100  # sun_path is 108 bytes on Linux, with room for the scheme's checks


def private_dir(prefix: str = "flowrt-") -> Path:
    """A new directory for a deployment's ipc sockets, 0700 (mkdtemp's mode), short enough
    for socket paths."""
    base = os.environ.get("FLOWRT_SOCKET_DIR") or ("/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir())
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    os.chmod(path, 0o700)
    return path


def remove_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def ipc_endpoint(directory: Path, name: str) -> str:
    endpoint = f"ipc://{directory}/{name}"
    if len(endpoint) > IPC_MAX:
        raise ValueError(f"socket path {endpoint} is too long for ipc://; set FLOWRT_SOCKET_DIR to a shorter directory")
    return endpoint


def bind(sock: zmq.Socket, endpoint: str) -> str:
    """Bind `sock`; an ipc socket file is made 0600; returns the endpoint peers dial (a tcp
    port 0 becomes the port the system chose)."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        port = sock.bind_to_random_port(endpoint[: -len(":0")])
        return f"{endpoint[: -len(':0')]}:{port}"
    sock.bind(endpoint)
    if endpoint.startswith("ipc://"):
        os.chmod(endpoint[len("ipc://") :], 0o600)
    return endpoint


def host_address() -> str:
    """This machine's address as other machines would dial it (for tcp endpoints)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))  # no packet is sent: this picks the outgoing interface
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
