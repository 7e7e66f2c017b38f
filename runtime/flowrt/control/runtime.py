"""The embedded runtime: a loaded bundle, its roles' implementations, and graph calls.

    runtime = await Runtime.open("build/image_chat")
    async for event in runtime.call("chat", {"request": {...}}, session="s1"):
        ...
    await runtime.close()

Calls of one session run one at a time in arrival order (GCScheduler); calls of different
sessions run concurrently. Every stateful piece reports `statistics()` so tests can assert
that nothing outlives its call.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import itertools
import logging
import sys
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from flowrt.bundle import Bundle, load_bundle
from flowrt.control.call import Call
from flowrt.control.program import GraphProgram
from flowrt.control.roles import Context, RoleBinding
from flowrt.tables import RoleSpec, node_tables


class FlowrtError(Exception):
    """A problem a user can fix: a missing impl, a bad input, an unknown graph."""


class UnknownGraph(FlowrtError):
    """A call named a graph the bundle does not have."""


class BadInputs(FlowrtError):
    """A call's inputs do not match the graph's entry placeholders."""


class GCScheduler:
    """Session FIFO: a session's graph calls run one at a time, in order; sessions are independent."""

    __slots__ = ("queues",)

    def __init__(self) -> None:
        # per session: the running call's turn (None once granted), then the waiting ones
        self.queues: dict[str, deque[asyncio.Future | None]] = {}

    def enter(self, session: str) -> bool:
        """Take the session's turn at once if no call of it is running or queued."""
        if session in self.queues:
            return False
        self.queues[session] = deque([None])  # the running call's turn, already granted
        return True

    async def acquire(self, session: str) -> None:
        """Wait for the session's turn (after `enter` said it is taken)."""
        queue = self.queues.setdefault(session, deque())
        turn = asyncio.get_running_loop().create_future()
        queue.append(turn)
        if len(queue) == 1:
            turn.set_result(None)
        try:
            await turn
        except asyncio.CancelledError:
            self._drop(session, turn)
            raise

    def release(self, session: str) -> None:
        queue = self.queues.get(session)
        if not queue:
            return
        queue.popleft()
        if queue:
            queue[0].set_result(None)
        else:
            del self.queues[session]

    def _drop(self, session: str, turn: asyncio.Future) -> None:
        queue = self.queues.get(session)
        if queue and turn in queue:
            first = queue[0] is turn
            queue.remove(turn)
            if first and queue:
                queue[0].set_result(None)
            if not queue:
                del self.queues[session]

    def statistics(self) -> dict[str, int]:
        return {"sessions": len(self.queues), "queued_calls": sum(len(q) for q in self.queues.values())}


class Runtime:
    def __init__(self, bundle: Bundle):
        self.bundle = bundle
        self.roles: dict[str, RoleSpec] = bundle.roles
        self.programs: dict[str, GraphProgram] = {
            graph: GraphProgram(graph, plan, {node_id: node_tables(node) for node_id, node in plan["nodes"].items()})
            for graph, plan in bundle.plan["graphs"].items()
        }
        self.instances: dict[str, list[Any]] = {}
        self.bindings: dict[str, RoleBinding] = {}
        # the state of each global a role `uses`, per session: (session, name) -> dict
        self.globals: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
        self.global_names = sorted({name for role in self.roles.values() for name in role.uses})
        self.scheduler = GCScheduler()
        self.calls: set[Call] = set()
        self.call_ids = itertools.count(1)
        self.log = logging.getLogger(f"flowrt.{bundle.name}")
        self.last_call: Call | None = None  # the most recent finished call, for inspection
        self._idle_waiters: list[asyncio.Future] = []  # wait_idle() callers, woken when no call is in flight

    @classmethod
    async def open(cls, path: str | Path, instances: dict[str, list[Any]] | None = None) -> Runtime:
        """Load a bundle and instantiate its roles (`instances` overrides impls, e.g. in tests)."""
        runtime = cls(load_bundle(Path(path)))
        await runtime._instantiate(instances or {})
        return runtime

    async def close(self) -> None:
        for call in list(self.calls):
            call.cancel("shutdown")
            await call.wait_ended()

    # ── roles ──

    async def _instantiate(self, overrides: dict[str, list[Any]]) -> None:
        for name, role in sorted(self.roles.items()):
            if name in overrides:
                self.instances[name] = list(overrides[name])
            else:
                cls = self._import_impl(role)
                self.instances[name] = [cls() for _ in range(role.replicas)]
            for replica, instance in enumerate(self.instances[name]):
                setup = getattr(instance, "setup", None)
                if setup is not None:
                    ctx = Context("", 0, "", name, "setup", {}, self.log, replica)
                    await setup(ctx)
            self.bindings[name] = RoleBinding(role, self.instances[name], self.globals, self.log)
        for program in self.programs.values():
            for node in program.nodes:
                if node.interface:
                    binding = node.binding = self.bindings[node.role]
                    node.methods = binding.methods(node.method)
                    node.generator = any(inspect.isasyncgenfunction(m) for m in node.methods if m is not None)
                    node.timeout = self.roles[node.role].interfaces[node.method].timeout_s

    def _import_impl(self, role: RoleSpec) -> type:
        module_name, _, class_name = role.impl.partition(":")
        for path in reversed(self.bundle.python_path):
            if str(path) not in sys.path:
                sys.path.insert(0, str(path))
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            top = sys.modules.get(module_name.split(".")[0])
            if top is not None and Path(getattr(top, "__file__", None) or "/").resolve().parent == self.bundle.path.resolve():
                raise FlowrtError(
                    f"role `{role.name}`: `{module_name}` resolves into the bundle itself, because the bundle's directory "
                    f"is named `{self.bundle.path.name}` like the impl's package; build it into a directory with another name"
                ) from None
            where = ", ".join(str(p) for p in self.bundle.python_path) or "the import path"
            raise FlowrtError(
                f"role `{role.name}`: cannot import `{module_name}` ({error}); flowrt looked in {where}. "
                f"Put `{module_name.replace('.', '/')}.py` beside the .flow file or its parent directory"
            ) from None
        target: Any = module
        for part in class_name.split("."):
            target = getattr(target, part, None)
            if target is None:
                raise FlowrtError(
                    f"role `{role.name}`: module `{module_name}` has no `{class_name}`; check `impl` in the .flow file"
                )
        return target

    # ── calls ──

    async def call(
        self, graph: str, inputs: dict[str, Any], session: str | None = None, timeout: float | None = None
    ) -> AsyncIterator[dict]:
        """Call a graph; yields its events (stream, return, done) as dicts."""
        program = self.validate(graph, inputs)
        call_id = next(self.call_ids)
        anonymous = session is None  # its own session: no later call can share its globals
        session = f"call-{call_id}" if anonymous else session
        if not self.scheduler.enter(session):
            await self.scheduler.acquire(session)
        call = Call(self, program, dict(inputs), session, call_id)
        self.calls.add(call)
        deadline = timeout if timeout is not None else program.timeout
        loop = asyncio.get_running_loop()
        watchdog = loop.call_later(deadline, call.cancel, "timeout") if deadline else None
        try:
            call.start()
            outbox = call.outbox
            while True:
                if not outbox:
                    call.waiter = loop.create_future()
                    await call.waiter
                event = outbox.popleft()
                if event is None:
                    break
                yield event
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if not call.ended:
                call.cancel("client gone")  # the caller went away: cancel the call's work
                await call.wait_ended()
            self.calls.discard(call)
            if not self.calls and self._idle_waiters:
                for waiter in self._idle_waiters:
                    if not waiter.done():
                        waiter.set_result(None)
                self._idle_waiters.clear()
            self.scheduler.release(session)
            if anonymous:
                for name in self.global_names:
                    self.globals.pop((session, name), None)
            self.last_call = call

    def validate(self, graph: str, inputs: dict[str, Any]) -> GraphProgram:
        """The program of `graph` if `inputs` can call it; else UnknownGraph or BadInputs saying why."""
        program = self.programs.get(graph)
        if program is None:
            raise UnknownGraph(f"no graph `{graph}` in bundle `{self.bundle.name}`; it has {', '.join(self.programs)}")
        if isinstance(inputs, dict) and inputs.keys() == program.entry_set:
            return program
        if not isinstance(inputs, Mapping):
            raise BadInputs(
                f"graph `{graph}` takes an object mapping {', '.join(program.entry)} to values, not {type(inputs).__name__}"
            )
        missing = [e for e in program.entry if e not in inputs]
        extra = [k for k in inputs if k not in program.entry]
        raise BadInputs(
            f"graph `{graph}` takes {', '.join(program.entry)}"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; unexpected {', '.join(extra)}" if extra else "")
        )

    async def wait_idle(self) -> None:
        """Return once no call is in flight."""
        if self.calls:
            waiter = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(waiter)
            await waiter

    def statistics(self) -> dict[str, int]:
        totals: dict[str, int] = defaultdict(int)
        for call in self.calls:
            for key, value in call.statistics().items():
                totals[key] += value
        return {
            "calls": len(self.calls),
            **totals,
            **self.scheduler.statistics(),
            "busy_replicas": sum(b.busy_replicas() for b in self.bindings.values()),
        }
