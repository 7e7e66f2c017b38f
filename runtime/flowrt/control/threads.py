"""Role methods written as plain `def` (or as plain generators): they run on their replica's
worker thread, so the event loop stays free and two roles whose work releases the GIL (torch,
numpy, file and socket I/O) compute at the same time (docs/runtime.md, "Plain methods").

Each replica has one worker thread (`ReplicaThread`, made when its first plain method runs):
its plain methods run there one at a time, in the order their activations started, as a model
on one device would, so a role's instance needs no lock for its own state. `bind` turns a
plain method into a callable of the shape the control core calls (`method(ctx, **fields)`)
that returns a coroutine (a plain function) or an async generator (a plain generator, each
frame taken on the thread); an `async def` method is returned as it is and costs nothing more.

A thread cannot be interrupted: a timeout or cancel ends the activation at once, and the
method's thread finishes what it was doing (the frame or result it makes is dropped; a
generator is closed before its next frame). Where it stood when that happened is read from the
thread's stack, so a timeout names the line of the role's code, as for an `async def`.
This module imports nothing of the control core, which calls into it only through `bind`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import sys
import threading
import weakref
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flowrt.control.impls import definition
from flowrt.errors import frame_place

# a wrapper (the coroutine or async generator `bind`'s callable returned) -> its Job, for
# flowrt.control.contract.code_place: the place of a broken frame is in the role's generator
_JOBS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def plain(method: Any) -> bool:
    """Whether `method` is one `bind` runs on a thread: a plain function or generator function
    (not `async def`, not an async generator)."""
    return callable(method) and not (inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method))


def streams(method: Any) -> bool:
    """Whether an interface's method streams its frames (an async or a plain generator)."""
    return inspect.isasyncgenfunction(method) or inspect.isgeneratorfunction(method)


class Job:
    """One plain method's run on a worker thread: what it made, and where its thread stands."""

    __slots__ = ("method", "ident", "generator", "prefer")

    def __init__(self, method: Any, prefer: Iterable[Path]):
        self.method = method
        self.ident: int | None = None  # the worker thread running it, while it runs
        self.generator: Any = None  # a plain generator's object, once made
        self.prefer = prefer

    def call(self, ctx: Any, inputs: dict) -> Any:
        self.ident = threading.get_ident()
        try:
            return self.method(ctx, **inputs)
        finally:
            self.ident = None

    def step(self) -> tuple[bool, Any]:
        """The generator's next frame: (False, frame), or (True, None) once it has ended (a
        StopIteration cannot cross a future)."""
        self.ident = threading.get_ident()
        try:
            return False, next(self.generator)
        except StopIteration:
            return True, None
        finally:
            self.ident = None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.generator.close()

    def where(self) -> str:
        """`file:line` of the role's code: where its thread is running now, else where its
        generator stands (its last `yield`), else where the method is defined."""
        ident = self.ident
        frame = sys._current_frames().get(ident) if ident is not None else None  # noqa: SLF001 - the documented way to read another thread's stack
        if frame is not None:
            return frame_place(frame, self.prefer)
        generator = self.generator
        if generator is not None and generator.gi_frame is not None:
            return frame_place(generator.gi_frame, self.prefer)
        return definition(self.method)


class ReplicaThread:
    """One replica's worker thread, made when its first plain method runs."""

    __slots__ = ("name", "prefer", "executor", "submitted", "completed", "lock", "closed")

    def __init__(self, name: str, prefer: Iterable[Path] = ()):
        self.name = name
        self.prefer = tuple(prefer)
        self.executor: ThreadPoolExecutor | None = None
        self.submitted = 0  # jobs handed to the thread ...
        self.completed = 0  # ... and those it finished or dropped (counted from whichever thread did it)
        self.lock = threading.Lock()
        self.closed = False

    def _submit(self, function: Any, *args: Any) -> asyncio.Future:
        if self.closed:
            raise RuntimeError(f"the worker thread of {self.name} is closed: the runtime is stopping")
        executor = self.executor
        if executor is None:
            executor = self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"flowrt {self.name}")
        # the role sees the context variables of its activation (log scopes), as an `async def` does
        job = executor.submit(contextvars.copy_context().run, function, *args)
        self.submitted += 1
        job.add_done_callback(self._completed)
        return asyncio.wrap_future(job)  # cancelling it drops the job if it has not started

    def _completed(self, _: Any) -> None:
        with self.lock:
            self.completed += 1

    async def call(self, job: Job, ctx: Any, inputs: dict) -> Any:
        try:
            return await self._submit(job.call, ctx, inputs)
        except asyncio.CancelledError as error:
            error.flowrt_where = job.where()  # type: ignore[attr-defined] - read by contract.waiting_place
            raise

    async def stream(self, job: Job, ctx: Any, inputs: dict):
        try:
            job.generator = job.method(ctx, **inputs)  # (a generator's body runs only when stepped)
            while True:
                ended, frame = await self._submit(job.step)
                if ended:
                    return
                yield frame
        except asyncio.CancelledError as error:
            error.flowrt_where = job.where()  # type: ignore[attr-defined] - read by contract.waiting_place
            raise
        finally:
            generator = job.generator
            if generator is not None and generator.gi_frame is not None and self.executor is not None:
                # closed on its thread, after the step it may still be running there
                with contextlib.suppress(RuntimeError):
                    self.executor.submit(job.close)

    def bind(self, method: Any) -> Any:
        """`method` as the control core calls it (see the module's docstring)."""
        if not plain(method):
            return method
        return Caller(self, method, inspect.isgeneratorfunction(method))

    async def setup(self, setup: Any, ctx: Any) -> None:
        """Run a role's `setup`: awaited if `async def`, on this thread if plain."""
        if plain(setup):
            await self._submit(Job(setup, self.prefer).call, ctx, {})
        else:
            await setup(ctx)

    def close(self) -> None:
        """Let the thread go once it has finished what it runs now; queued work is dropped."""
        self.closed = True
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)

    def running(self) -> int:
        """Jobs on the thread or queued for it, a cancelled activation's included until its
        thread has let it go."""
        with self.lock:
            return self.submitted - self.completed


class Caller:
    """A plain method as the control core calls it: `caller(ctx, **fields)` gives a coroutine
    (or an async generator) that runs it on the replica's thread, remembered with its Job so
    that a broken frame's place is the role's own line (`job_of`)."""

    __slots__ = ("thread", "method", "generator")

    def __init__(self, thread: ReplicaThread, method: Any, generator: bool):
        self.thread = thread
        self.method = method
        self.generator = generator

    def __call__(self, ctx: Any, /, **inputs: Any) -> Any:
        job = Job(self.method, self.thread.prefer)
        wrapper = self.thread.stream(job, ctx, inputs) if self.generator else self.thread.call(job, ctx, inputs)
        _JOBS[wrapper] = job
        return wrapper


def job_of(result: Any) -> Job | None:
    """The Job behind a coroutine or async generator a `Caller` made, if `result` is one."""
    try:
        return _JOBS.get(result)
    except TypeError:  # not weakly referable: not one of ours
        return None
