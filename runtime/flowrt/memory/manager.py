"""The MemoryManager of one machine: `python -m flowrt.memory.manager` (started by a supervisor).

It owns the Tmp Buffer Pool (its slab in shared memory, its bookkeeping in
flowrt.memory.pool), the segments of shared weights and the kv_pool_barrier groups, and
answers its clients' requests on one ROUTER socket (flowrt.memory.protocol). It is one thread
with no blocking waits: a client that must wait (a follower for its weights, a barrier) asks
again later, so no number of waiting clients can tie the manager up. Every half second it
looks for client processes that died and drops what they held (their refs, their calls if
they were a gateway, their weights). Garbage on the socket is logged and dropped.

Started with its configuration in $FLOWRT_MEMORY_CONFIG (JSON: endpoint, pool_bytes,
min_block, prefault, parent, and the deployment's `keys`, with which its socket admits only
the deployment's gateway and replicas: flowrt.transport.keys), it prints READY_LINE with its slab's path once it listens, or
FAILED_LINE saying why it cannot (both on stdout), and exits when its parent goes away.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from flowrt.memory import protocol as p
from flowrt.memory import slab
from flowrt.memory.pool import BufferPool, PoolError, PoolExhausted, TooLarge
from flowrt.transport.sockets import alive, bind

READY_LINE = "flowrt-memory-ready "
FAILED_LINE = "flowrt-memory-failed: "
SWEEP_EVERY = 0.5  # seconds between looks for dead client processes
PID_MAX = 1 << 22  # Linux's largest pid_max: a client claiming a larger PID is lying
CONFIG_ENV = "FLOWRT_MEMORY_CONFIG"
log = logging.getLogger("flowrt.memory")


@dataclass
class Weights:
    """One shared copy of a model's weights (a segment file of its own)."""

    path: str
    nbytes: int
    layout: str
    owner: str
    state: str = "loading"  # loading | ready | failed
    error: str = ""
    users: set[str] = field(default_factory=set)


@dataclass
class Barrier:
    participants: int
    arrived: set[str] = field(default_factory=set)  # phase 1: weights loaded
    proposals: dict[str, int] = field(default_factory=dict)  # phase 2: each one's KV pool proposal
    value: int | None = None


class MemoryManager:
    """The manager's state and its answer to each request (the socket loop is `serve`)."""

    def __init__(self, pool_bytes: int, *, min_block: int = 4096, prefault: bool = False):
        self.pool = BufferPool(pool_bytes, min_block, first_id=1 + secrets.randbits(40))
        self.slab = str(slab.create("slab", max(pool_bytes, slab.PAGE), prefault=prefault))
        self.epoch = secrets.token_hex(6)
        self.reservation = slab.Reservation(self.slab, min_block, reserved=prefault)
        self.clients: dict[str, str] = {}  # pid -> its name
        self.gateways: set[str] = set()
        self.weights: dict[str, Weights] = {}
        self.barriers: dict[str, Barrier] = {}
        self.meta: dict[tuple[int, str], dict] = {}  # (block, cache key) -> what `cache` said of it
        self.requests = 0
        self.garbage = 0
        self.sweeps = 0
        self.guard: Any = None  # the socket's ZAP handler (main's), whose refusals statistics() reports

    def close(self) -> None:
        self.reservation.close()
        slab.remove(self.slab)
        for weights in self.weights.values():
            slab.remove(weights.path)

    def reply(self, request: p.Request, **fields) -> p.Reply:
        return p.Reply(p.VERSION, request.req, slab=self.slab, epoch=self.epoch, **fields)

    def handle(self, r: p.Request) -> p.Reply:
        self.requests += 1
        kind = type(r)
        pool = self.pool
        try:
            if kind is p.Alloc:
                block = pool.alloc(r.nbytes, (r.call, r.process))
                problem = self.reservation.reserve(block.offset, block.size)
                if problem:  # tmpfs has no room for its pages: refused now, not a SIGBUS in whoever writes them
                    pool.free(block.id, (r.call, r.process))
                    return self.reply(r, error=problem, code=p.NO_ROOM)
                if r.cache_key:
                    pool.cache(block.id, r.cache_key)
                return self.reply(r, block=block.id, offset=block.offset, size=block.size)
            if kind is p.RefAt:
                if r.epoch and r.epoch != self.epoch:
                    return self.reply(r, error="the address lies in the slab of an earlier memory manager", code=p.STALE)
                block = pool.find_alloc_by_ptr(r.offset)
                if block is None:
                    return self.reply(
                        r,
                        error=f"byte {r.offset} of the pool is in no live block: a tensor over a block released "
                        "already was sent (keep a .clone() of what you hold past an activation)",
                    )
                pool.add_ref(block.id, (r.call, r.process))
                return self.reply(r, block=block.id, offset=block.offset, size=block.size)
            if kind is p.AddRef:
                pool.add_ref(r.block, (r.call, r.process), r.n)
                return self.reply(r, block=r.block)
            if kind is p.Free:
                pool.free(r.block, (r.call, r.process), r.n)
                return self.reply(r, block=r.block)
            if kind is p.Adopt:
                block = pool.block(r.block)
                if block.refs.get((r.call, ""), 0) <= 0:
                    return self.reply(r, error=f"block {r.block} was released before it was taken")
                pool.add_ref(r.block, ("", r.process))  # first: the block never sees 0 refs on the way
                pool.free(r.block, (r.call, ""))
                return self.reply(r, block=r.block)
            if kind is p.ReleaseCall:
                return self.reply(r, data={"released": pool.release_call(r.call)})
            if kind is p.Lookup:
                block = pool.lookup(r.cache_key, (r.call, r.process))
                if block is None:
                    return self.reply(r)
                meta = self.meta.get((block.id, r.cache_key), {})
                return self.reply(r, block=block.id, offset=block.offset, size=block.size, data=meta)
            if kind is p.Cache:
                pool.cache(r.block, r.cache_key)
                self.meta = {key: m for key, m in self.meta.items() if key[1] != r.cache_key and pool_has(pool, key[0])}
                self.meta[(r.block, r.cache_key)] = r.meta
                return self.reply(r, block=r.block)
            if kind is p.Statistics:
                return self.reply(r, data=self.statistics())
            if kind is p.Hello:
                if not 0 < r.pid < PID_MAX:
                    return self.reply(r, error=f"a client's PID must be between 1 and {PID_MAX - 1}, not {r.pid}")
                self.clients[str(r.pid)] = r.name
                if r.kind == "gateway":
                    self.gateways.add(str(r.pid))
                return self.reply(r)
            if kind is p.Claim:
                return self.claim(r)
            if kind is p.Loaded:
                return self.loaded(r)
            if kind is p.Arrive:
                return self.arrive(r)
            if kind is p.Settled:
                barrier = self.barriers.get(r.group)
                if barrier is None and r.participants >= 1:
                    self.barriers[r.group] = Barrier(r.participants, value=r.value)
                elif barrier is not None and barrier.value is None:
                    barrier.value = r.value  # (a restarted replica arrived before its mates re-announced it)
                return self.reply(r)
        except (PoolExhausted, TooLarge) as error:
            return self.reply(r, error=str(error), code=p.NO_ROOM)
        except PoolError as error:
            return self.reply(r, error=str(error))
        return self.reply(r, error=f"unknown request {kind.__name__}")

    # ── weights ──

    def claim(self, r: p.Claim) -> p.Reply:
        if r.nbytes <= 0:
            return self.reply(r, error=f"weights `{r.key}` need a positive size, not {r.nbytes} bytes")
        entry = self.weights.get(r.key)
        if entry is not None and entry.layout != r.layout:
            return self.reply(
                r,
                error=f"weights `{r.key}` are shared already with another architecture (layout {entry.layout} here, "
                f"{r.layout} asked): give models that differ different names",
            )
        if entry is not None and entry.state == "failed" and entry.owner not in entry.users:
            entry.owner, entry.state, entry.error = r.process, "loading", ""  # its owner died: this one loads
        if entry is None:
            try:  # its pages reserved now (all of them are written by the load): no SIGBUS later
                path = str(slab.create("w", r.nbytes, prefault=True))
            except (OSError, OverflowError) as error:
                return self.reply(
                    r,
                    error=f"cannot make a shared segment of {r.nbytes} bytes for `{r.key}` in {slab.shm_dir()} "
                    f"({getattr(error, 'strerror', None) or error}): free or enlarge it (docker run --shm-size)",
                    code=p.NO_ROOM,
                )
            entry = self.weights[r.key] = Weights(path, r.nbytes, r.layout, r.process)
        entry.users.add(r.process)
        role = "owner" if entry.owner == r.process else "follower"
        return self.reply(
            r, size=entry.nbytes, data={"role": role, "path": entry.path, "state": entry.state, "error": entry.error}
        )

    def loaded(self, r: p.Loaded) -> p.Reply:
        entry = self.weights.get(r.key)
        if entry is None:
            return self.reply(r, error=f"no weights `{r.key}` were claimed")
        entry.state, entry.error = ("failed", r.error) if r.error else ("ready", "")
        if r.error:
            entry.users.discard(entry.owner)  # the next claimant owns them and loads again
        return self.reply(r)

    # ── kv_pool_barrier ──

    def arrive(self, r: p.Arrive) -> p.Reply:
        barrier = self.barriers.get(r.group)
        if barrier is None:
            barrier = self.barriers[r.group] = Barrier(max(1, r.participants))
        if barrier.value is None:
            if r.phase == 1:
                barrier.arrived.add(r.process)
            elif len(barrier.arrived) >= barrier.participants:
                barrier.proposals[r.process] = r.proposal
                if len(barrier.proposals) >= barrier.participants:
                    barrier.value = min(barrier.proposals.values())
        data = {"loaded": len(barrier.arrived), "proposed": len(barrier.proposals), "participants": barrier.participants}
        if barrier.value is not None:
            data["value"] = barrier.value
        return self.reply(r, data=data)

    # ── dead clients ──

    def sweep(self) -> None:
        self.sweeps += 1
        pool = self.pool
        holders = {process for block in pool.blocks() for (_, process) in block.refs if process}
        for pid in sorted(set(self.clients) | holders | {u for w in self.weights.values() for u in w.users}):
            if not pid.isdigit() or alive(int(pid)):
                continue
            name = self.clients.pop(pid, f"process {pid}")
            dropped = pool.release_process(pid)
            if pid in self.gateways:
                self.gateways.discard(pid)
                for call in list(pool.statistics()["refs_by_call"]):
                    if call.split(":", 1)[0] == pid:
                        dropped += pool.release_call(call)
            for key, entry in list(self.weights.items()):
                entry.users.discard(pid)
                if entry.owner == pid and entry.state == "loading":
                    entry.state, entry.error = "failed", f"its owner ({name}) died while loading them"
                if not entry.users:
                    slab.remove(entry.path)
                    del self.weights[key]
            if dropped:
                log.warning("memory: %s died holding %d references; released", name, dropped)

    def statistics(self) -> dict:
        stats = self.pool.statistics()
        stats["slab"] = self.slab
        stats["requests"] = self.requests
        stats["garbage_requests"] = self.garbage
        stats["sweeps"] = self.sweeps
        stats["refused"] = {"peers": self.guard.refused if self.guard is not None else 0}  # peers without the keys
        stats["clients"] = dict(sorted(self.clients.items()))
        stats["weights"] = {
            key: {"bytes": w.nbytes, "state": w.state, "users": len(w.users)} for key, w in sorted(self.weights.items())
        }
        stats["barriers"] = {
            group: {"participants": b.participants, "loaded": len(b.arrived), "value": b.value}
            for group, b in sorted(self.barriers.items())
        }
        return stats


def pool_has(pool: BufferPool, block: int) -> bool:
    try:
        pool.block(block)
    except PoolError:
        return False
    return True


def serve(manager: MemoryManager, socket: zmq.Socket, parent: int | None, stop=lambda: False) -> None:
    """Answer requests until the parent process is gone (or `stop()` says so); with the
    manager's `guard`, count the peers whose handshake on `socket` failed as they fail."""
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    monitor = manager.guard.monitor(socket) if manager.guard is not None else None
    if monitor is not None:
        poller.register(monitor, zmq.POLLIN)
    next_sweep = time.monotonic() + SWEEP_EVERY
    while not stop():
        if poller.poll(int(SWEEP_EVERY * 1000)):
            while True:
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                answer(manager, socket, frames)
            if monitor is not None:
                manager.guard.heard(monitor)
        if time.monotonic() >= next_sweep:
            next_sweep = time.monotonic() + SWEEP_EVERY
            try:
                manager.sweep()
            except Exception:  # noqa: BLE001 - a bug here must not take every client's memory down
                log.exception("memory: the sweep of dead clients failed (a flowrt bug)")
            if parent and not alive(parent):
                return


def answer(manager: MemoryManager, socket: zmq.Socket, frames: list) -> None:
    if len(frames) != 2:
        manager.garbage += 1
        log.warning("memory: dropped a message of %d frames", len(frames))
        return
    try:
        request = p.decode_request(frames[1].buffer)
    except p.Garbage as error:
        manager.garbage += 1
        log.warning("memory: dropped %s", error)
        return
    try:
        reply = manager.handle(request)
    except Exception:  # noqa: BLE001 - a bug here must not take every client's memory down
        log.exception("memory: request %s failed", type(request).__name__)
        reply = manager.reply(request, error=f"the memory manager failed on {type(request).__name__} (a flowrt bug; see its log)")
    if request.req:
        socket.send_multipart([frames[0].bytes, p.encode(reply)])


def secured(context: zmq.Context, keys: dict | None):
    """The ZAP handler admitting the deployment's gateway and replicas to a manager's socket
    (with `.keys` to make the socket a CURVE server), or None without keys (a test's manager)."""
    from flowrt.transport.keys import Guard, Keys

    found = Keys.from_config(keys)
    if found is None:
        return None
    guard = Guard(context, found, ["gateway", "member"], "memory")
    guard.keys = found
    return guard


def main() -> int:
    config = json.loads(os.environ.pop(CONFIG_ENV, "{}") or "{}")
    if not config:
        print("flowrt: this is a deployment's memory manager; `flowc run --deploy local` starts it", file=sys.stderr)
        return 2
    from flowrt.logs import show_log

    show_log(debug=bool(config.get("debug")))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a supervisor's stop: `finally` removes the files
    try:
        manager = MemoryManager(
            config["pool_bytes"], min_block=config.get("min_block", 4096), prefault=config.get("prefault", False)
        )
    except (OSError, PoolError) as error:
        print(
            f"{FAILED_LINE}cannot make the memory pool of {config['pool_bytes']} bytes in {slab.shm_dir()}: {error}", flush=True
        )
        return 3
    context = zmq.Context()
    guard = manager.guard = secured(context, config.get("keys"))
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        if guard is not None:
            guard.keys.serve(socket, config["endpoint"])
        endpoint = bind(socket, config["endpoint"])
    except zmq.ZMQError as error:
        manager.close()
        print(f"{FAILED_LINE}cannot listen on {config['endpoint']}: {error}", flush=True)
        return 3
    print(f"{READY_LINE}{json.dumps({'endpoint': endpoint, 'slab': manager.slab, 'epoch': manager.epoch})}", flush=True)
    try:
        serve(manager, socket, config.get("parent"))
    except KeyboardInterrupt:
        pass
    finally:
        manager.close()
        if guard is not None:
            guard.stop()
        context.destroy(linger=0)
        with contextlib.suppress(OSError):
            if config["endpoint"].startswith("ipc://"):
                Path(config["endpoint"][len("ipc://") :]).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
