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
import itertools
import logging
import sys
from collections import defaultdict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrt.bundle import Bundle, load_bundle
from flowrt.control.call import Call, dispatch_table
from flowrt.control.roles import Context, RoleBinding
from flowrt.tables import NodeTables, RoleSpec, node_tables


class FlowrtError(Exception):
    """A problem a user can fix: a missing impl, a bad input, an unknown graph."""


class UnknownGraph(FlowrtError):
    """A call named a graph the bundle does not have."""


class BadInputs(FlowrtError):
    """A call's inputs do not match the graph's entry placeholders."""


@dataclass
class GCScheduler:
    """Session FIFO: a session's graph calls run one at a time, in order; sessions are independent."""

    queues: dict[str, deque[asyncio.Future]] = field(default_factory=dict)

    async def acquire(self, session: str) -> None:
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
        self.node_tables: dict[str, dict[str, NodeTables]] = {
            graph: {node_id: node_tables(node) for node_id, node in plan["nodes"].items()}
            for graph, plan in bundle.plan["graphs"].items()
        }
        self.session_ordered = {graph: self._ordered_sessions(tables) for graph, tables in self.node_tables.items()}
        self.dispatch = {graph: dispatch_table(tables) for graph, tables in self.node_tables.items()}
        self.instances: dict[str, list[Any]] = {}
        self.bindings: dict[str, RoleBinding] = {}
        # per graph, per interface node: (its role's binding, interface name, timeout in seconds)
        self.invokers: dict[str, dict[str, tuple[RoleBinding, str, float | None]]] = {}
        self.globals: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
        self.scheduler = GCScheduler()
        self.calls: set[Call] = set()
        self.call_ids = itertools.count(1)
        self.log = logging.getLogger(f"flowrt.{bundle.name}")
        self.last_call: Call | None = None  # the most recent finished call, for inspection
        self._idle = asyncio.Event()  # set while no call is in flight
        self._idle.set()

    @classmethod
    async def open(cls, path: str | Path, instances: dict[str, list[Any]] | None = None) -> Runtime:
        """Load a bundle and instantiate its roles (`instances` overrides impls, e.g. in tests)."""
        runtime = cls(load_bundle(Path(path)))
        await runtime._instantiate(instances or {})
        return runtime

    async def close(self) -> None:
        for call in list(self.calls):
            call.cancel()
            await call.finished.wait()

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
        for graph, tables in self.node_tables.items():
            self.invokers[graph] = {
                node_id: (self.bindings[node.role], node_id.split(".", 1)[1], self._timeout(node_id))
                for node_id, node in tables.items()
                if node.kind == "interface"
            }

    def _timeout(self, node_id: str) -> float | None:
        role, interface = node_id.split(".", 1)
        return self.roles[role].interfaces[interface].timeout_s

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

    def _ordered_sessions(self, tables: dict[str, NodeTables]) -> dict[str, bool]:
        """Session nodes whose inputs share one order source use SeqIds; the others go FIFO."""
        ordered = {}
        for node_id, node in tables.items():
            if not node.session:
                continue
            sources = {tables[s.producer].order_source for g in node.groups for s in g.slots if s.producer in tables}
            ordered[node_id] = not node.in_cycle and len(sources) == 1 and None not in sources
        return ordered

    # ── calls ──

    async def call(
        self, graph: str, inputs: dict[str, Any], session: str | None = None, timeout: float | None = None
    ) -> AsyncIterator[dict]:
        """Call a graph; yields its events (stream, return, done) as dicts."""
        plan = self.validate(graph, inputs)
        call_id = next(self.call_ids)
        session = session if session is not None else f"call-{call_id}"
        await self.scheduler.acquire(session)
        call = Call(self, graph, dict(inputs), session, call_id)
        self.calls.add(call)
        self._idle.clear()
        deadline = timeout if timeout is not None else plan.get("timeout_s")
        watchdog = asyncio.get_running_loop().call_later(deadline, call.cancel) if deadline else None
        try:
            call.start()
            outbox = call.outbox
            while True:
                if not outbox:
                    await call.wait_for_events()
                event = outbox.popleft()
                if event is None:
                    break
                yield event
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if not call.finished.is_set():
                call.cancel()  # the caller went away: cancel the call's work
                await call.finished.wait()
            self.calls.discard(call)
            if not self.calls:
                self._idle.set()
            self.scheduler.release(session)
            self.last_call = call

    def validate(self, graph: str, inputs: dict[str, Any]) -> dict:
        """The plan of `graph` if `inputs` can call it; else UnknownGraph or BadInputs saying why."""
        plan = self.bundle.plan["graphs"].get(graph)
        if plan is None:
            raise UnknownGraph(
                f"no graph `{graph}` in bundle `{self.bundle.name}`; it has {', '.join(self.bundle.plan['graphs'])}"
            )
        missing = [e for e in plan["entry"] if e not in inputs]
        extra = [k for k in inputs if k not in plan["entry"]]
        if missing or extra:
            raise BadInputs(
                f"graph `{graph}` takes {', '.join(plan['entry'])}"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; unexpected {', '.join(extra)}" if extra else "")
            )
        return plan

    async def wait_idle(self) -> None:
        """Return once no call is in flight."""
        await self._idle.wait()

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
