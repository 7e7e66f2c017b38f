"""Keeping one machine's MemoryManager process running (for a deployment's supervisor).

`ManagerProcess.start` runs `python -m flowrt.memory.manager` and waits for the line saying it
listens (or why it cannot). If it dies, the keeper removes its slab (so no handle into it can
be mapped again: a receiver gets an error naming the manager, not stale bytes), tells the
deployment (`on_down`, which ends the calls in flight with an error naming it) and starts it
again on the same endpoint after a backoff (0.25 s doubling to 5 s); clients reconnect by
themselves and map the new slab at their next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable

from flowrt.errors import FlowrtError
from flowrt.memory import slab
from flowrt.memory.manager import CONFIG_ENV, FAILED_LINE, READY_LINE

START_TIMEOUT = 30.0
FIRST_BACKOFF, MAX_BACKOFF = 0.25, 5.0
DEFAULT_POOL_MB = 1024
log = logging.getLogger("flowrt.memory")


class MemoryStartError(FlowrtError):
    """The memory manager could not start."""


def pool_bytes(pool_mb: float | None) -> int:
    """The pool's size: `pool_mb`, else $FLOWRT_POOL_MB, else DEFAULT_POOL_MB (MiB)."""
    if pool_mb is None:
        text = os.environ.get("FLOWRT_POOL_MB", "")
        try:
            pool_mb = float(text) if text else DEFAULT_POOL_MB
        except ValueError:
            raise MemoryStartError(f"FLOWRT_POOL_MB={text!r}: expected a size in MiB, e.g. 2048") from None
    if pool_mb <= 0:
        raise MemoryStartError(f"the memory pool needs a positive size, not {pool_mb:g} MiB")
    return int(pool_mb * (1 << 20))


class ManagerProcess:
    def __init__(self, endpoint: str, nbytes: int, *, debug: bool = False, on_down: Callable[[str], None] = lambda reason: None):
        self.endpoint = endpoint
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
        config = {"endpoint": self.endpoint, "pool_bytes": self.nbytes, "parent": os.getpid(), "debug": self.debug}
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
            why = line[len(FAILED_LINE) :] if line.startswith(FAILED_LINE) else f"it did not start within {START_TIMEOUT:g}s"
            raise MemoryStartError(f"the memory manager could not start: {why}")
        ready = json.loads(line[len(READY_LINE) :])
        self.slab, self.endpoint = ready["slab"], ready["endpoint"]
        self.watcher = asyncio.ensure_future(self._watch(proc))

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        await proc.stdout.read()  # (nothing more comes; EOF when it exits)
        code = await proc.wait()
        slab.remove(self.slab)
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


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"
