"""Keeping one machine's MemoryManager process running (for a deployment's supervisor).

`ManagerProcess.start` runs `python -m flowrt.memory.manager` and waits for the line saying it
listens (or why it cannot). If it dies, the keeper removes its slab (so no handle into it can
be mapped again: a receiver gets an error naming the manager, not stale bytes), tells the
deployment (`on_down`, which ends the calls in flight with an error naming it) and starts it
again on the same endpoint after a backoff (0.25 s doubling to 5 s); clients reconnect by
themselves and map the new slab at their next request. Whenever a manager process has exited
(stopped, killed with -9, crashed), every shared-memory file it made (its slab and its
segments of shared weights, all named `flowrt-mem-<its pid>-*`) is removed.

`pool_bytes` checks the pool's size (`--pool-mb`, $FLOWRT_POOL_MB) before anything starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from flowrt.errors import FlowrtError
from flowrt.memory import slab
from flowrt.memory.manager import CONFIG_ENV, FAILED_LINE, READY_LINE

START_TIMEOUT = 30.0
FIRST_BACKOFF, MAX_BACKOFF = 0.25, 5.0
DEFAULT_POOL_MB = 1024
POOL_ENV = "FLOWRT_POOL_MB"
MIN_BLOCK = 4096  # bytes: the pool's smallest block (flowrt.memory.pool)
log = logging.getLogger("flowrt.memory")


class MemoryStartError(FlowrtError):
    """The memory manager could not start."""


def pool_bytes(pool_mb: object = None, *, flag: str = "--pool-mb") -> int:
    """The pool's size in bytes, checked: `pool_mb` MiB (given as `flag`), else $FLOWRT_POOL_MB,
    else DEFAULT_POOL_MB, or what the shared-memory file system has free if that is less. 0 means
    no data plane. A size must be a finite number of MiB: 0, or at least one block (4 KiB) and
    no more than the shared-memory file system has free; anything else is a MemoryStartError of
    one line naming where the value came from, the value and the fix."""
    free = shm_free_bytes()
    if pool_mb is None:
        text = os.environ.get(POOL_ENV, "").strip()
        if not text:
            return _default_pool(free)
        return _checked_pool(text, f"{POOL_ENV}={text}", POOL_ENV, free)
    shown = f"{pool_mb:g}" if isinstance(pool_mb, float) else str(pool_mb)
    return _checked_pool(pool_mb, f"{flag} {shown}", flag, free)


def shm_free_bytes() -> int | None:
    """What the shared-memory file system (slab.shm_dir()) has free for this user; None if unknown."""
    try:
        stat = os.statvfs(slab.shm_dir())
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def _size_text(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} bytes"


def _checked_pool(value: object, given: str, name: str, free: int | None) -> int:
    """`value` (MiB, as `given` says it: "--pool-mb 1e+09", "FLOWRT_POOL_MB=abc") as bytes, or
    MemoryStartError naming `given` and what to give instead (`name`: the flag or variable)."""
    off = f"or 0 to turn the data plane off ({name} 0)" if name.startswith("-") else f"or {name}=0 to turn the data plane off"
    example = f"{name} 2048" if name.startswith("-") else f"{name}=2048"
    mib: float | None = None
    if not isinstance(value, bool):
        try:
            mib = float(value) if isinstance(value, (int, float)) else float(str(value).strip())
        except (TypeError, ValueError, OverflowError):
            mib = None
    if mib is None or not math.isfinite(mib):
        raise MemoryStartError(f"{given} is not a finite number of MiB: give a size, e.g. {example}, {off}")
    if mib < 0:
        raise MemoryStartError(f"{given} is negative: give a size in MiB, e.g. {example}, {off}")
    if mib == 0:
        return 0
    nbytes = mib * (1 << 20)
    if nbytes < MIN_BLOCK:
        raise MemoryStartError(f"{given} is less than one block of the pool (4 KiB): give at least 4 KiB (0.004 MiB), {off}")
    if free is not None and -(-nbytes // slab.PAGE) * slab.PAGE > free:
        where = slab.shm_dir()
        raise MemoryStartError(
            f"{given} is more than {where} has free ({_size_text(free)}): lower {name}, "
            f"or enlarge {where} (docker run --shm-size)"
        )
    return int(nbytes)


def _default_pool(free: int | None) -> int:
    """DEFAULT_POOL_MB, or what the shared-memory file system has free if that is less (whole blocks)."""
    nbytes = DEFAULT_POOL_MB << 20
    if free is None or free >= nbytes:
        return nbytes
    if free < MIN_BLOCK:
        where = slab.shm_dir()
        raise MemoryStartError(
            f"{where} has {_size_text(free)} free, less than one block of the memory pool (4 KiB): free or enlarge it "
            f"(docker run --shm-size), or give --pool-mb 0 ({POOL_ENV}=0) to turn the data plane off"
        )
    return free // MIN_BLOCK * MIN_BLOCK


def remove_files_of(pid: int) -> list[str]:
    """Remove every shared-memory file manager process `pid` made (`flowrt-mem-<pid>-*`: its
    slab and its weight segments); call it once that process has exited. The paths removed."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in slab.shm_dir().glob(f"{slab.PREFIX}{pid}-*"):
            with contextlib.suppress(OSError):
                entry.unlink()
                removed.append(str(entry))
    return removed


class ManagerProcess:
    def __init__(
        self,
        endpoint: str,
        nbytes: int,
        *,
        debug: bool = False,
        on_down: Callable[[str], None] = lambda reason: None,
        keys: Any = None,
    ):
        self.endpoint = endpoint
        self.keys = keys  # the deployment's (flowrt.transport.keys.Keys), given to the manager in its environment
        self.nbytes = nbytes
        self.debug = debug
        self.on_down = on_down
        self.proc: asyncio.subprocess.Process | None = None
        self.slab = ""
        self.watcher: asyncio.Task | None = None
        self.stopping = False
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    async def start(self) -> None:
        if self.nbytes <= 0:
            raise MemoryStartError("a memory pool of 0 MiB turns the data plane off: no memory manager is started for it")
        config = {"endpoint": self.endpoint, "pool_bytes": self.nbytes, "parent": os.getpid(), "debug": self.debug}
        if self.keys is not None:
            config["keys"] = self.keys.for_replica()
        proc = self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "flowrt.memory.manager",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, CONFIG_ENV: json.dumps(config)},
            start_new_session=True,
        )
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(START_TIMEOUT):
                line = (await proc.stdout.readline()).decode(errors="replace").strip()
        except TimeoutError:
            line = ""
        if not line.startswith(READY_LINE):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            remove_files_of(proc.pid)
            why = line[len(FAILED_LINE) :] if line.startswith(FAILED_LINE) else f"it did not start within {START_TIMEOUT:g}s"
            raise MemoryStartError(f"the memory manager could not start: {why}")
        ready = json.loads(line[len(READY_LINE) :])
        self.slab, self.endpoint = ready["slab"], ready["endpoint"]
        self.watcher = asyncio.ensure_future(self._watch(proc))

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        await proc.stdout.read()  # (nothing more comes; EOF when it exits)
        code = await proc.wait()
        remove_files_of(proc.pid)  # its slab and its weight segments (no handle into them can be mapped again)
        if self.stopping:
            return
        reason = f"the memory manager (pid {proc.pid}) died ({_exit_text(code)})"
        log.error("%s; restarting it", reason)
        self.on_down(reason)
        backoff = FIRST_BACKOFF
        while not self.stopping:
            await asyncio.sleep(backoff)
            if self.stopping:
                return
            try:
                await self.start()
                self.restarts += 1
                return
            except MemoryStartError as error:
                log.error("%s; trying again", error)
                backoff = min(MAX_BACKOFF, backoff * 2)

    async def close(self) -> None:
        self.stopping = True
        proc = self.proc
        if proc is not None and proc.returncode is None:
            for signum in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(3.0):
                        await proc.wait()
                        break
        if self.watcher is not None:
            self.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.watcher
        slab.remove(self.slab)
        if proc is not None:  # (a manager has no SIGTERM handler: it never removes its own files)
            remove_files_of(proc.pid)


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"
