"""A MemoryManager serving in a thread of the test, over real ZMQ ipc in a private directory
(the manager tests' fixture; the manager and its socket are the real ones, only the process
is the test's)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import zmq

from flowrt.memory.manager import MemoryManager, serve
from flowrt.transport.sockets import bind, ipc_endpoint, private_dir, remove_dir


@contextlib.contextmanager
def threaded_manager(pool_bytes: int = 1 << 20, endpoint: str | None = None) -> Iterator[MemoryManager]:
    """A manager answering on `manager.endpoint` (a new private one unless given: a successor
    on the endpoint of one that stopped) until the block ends; its files are gone after."""
    directory = private_dir() if endpoint is None else None
    manager = MemoryManager(pool_bytes)
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    manager.endpoint = bind(socket, endpoint if directory is None else ipc_endpoint(directory, "memory"))
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(manager, socket, None, stop.is_set), daemon=True)
    thread.start()
    try:
        yield manager
    finally:
        stop.set()
        thread.join(5)
        context.destroy(linger=0)
        manager.close()
        if directory is not None:
            remove_dir(directory)
    assert not os.path.exists(manager.slab)
