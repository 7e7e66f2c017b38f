"""A role's replicas as the runtime invokes them: replica choice (`lb`), the `ctx` each method
receives, and the count of activations running on each replica.

Everything an activation needs from its role is looked up once, when the runtime opens (each
node program holds its interface's bound method on every replica), so starting an activation
is a replica choice, a `Context` and a call.
"""

from __future__ import annotations

import inspect
import logging
import zlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from flowrt.control.interrupts import Interrupted, seen
from flowrt.control.sessions import SCOPE_KEY
from flowrt.control.threads import ReplicaThread
from flowrt.tables import RoleSpec

BROADCAST = -2  # an activation's replica when it runs on every replica of its role
NO_GLOBALS: Mapping[str, Any] = MappingProxyType({})  # `ctx.globals` of a role that `uses` none

if TYPE_CHECKING:
    from flowrt.control.program import NodeProgram


class Context:
    """What a role's method receives as `ctx`."""

    __slots__ = ("session", "call_id", "graph", "role", "interface", "globals", "logger", "replica", "memory")

    def __init__(
        self,
        session: str,
        call_id: int,
        graph: str,
        role: str,
        interface: str,
        globals: dict[str, Any],  # noqa: A002 - the name roles read
        logger: logging.Logger,
        replica: int,
        memory: Any = None,  # the data plane (flowrt.memory.api), where the deployment gives one
    ):
        self.session = session
        self.call_id = call_id
        self.graph = graph
        self.role = role
        self.interface = interface
        self.globals = globals
        self.logger = logger
        self.replica = replica
        self.memory = memory

    @property
    def interrupted(self) -> Interrupted | None:
        """What the user received of the session's call this call interrupted (its id, graph and
        the frames of each streamed field its caller took), for a role that keeps a history in its
        session's globals; None where this call interrupted none (flowrt.control.interrupts)."""
        return seen(self.globals)

    def kv(self, name: str = "kv") -> Any:
        """This session's handle on the KV pool of global `name` (flowrt.params.session.KVSession):
        the role must `uses` it, and the deployment gives pools where torch is installed."""
        params = getattr(self.memory, "params", None)
        if params is not None and name not in params.globals:
            known = ", ".join(f"`{n}`" for n in sorted(params.globals)) or "none"
            raise LookupError(f"ctx.kv({name!r}): the flow declares no `global {name}: KVCache`; its KVCache globals: {known}")
        if name not in self.globals:
            raise LookupError(f"role `{self.role}` does not use global `{name}`: add `uses {name}` to the role in the .flow file")
        if params is None:
            raise RuntimeError(
                f"ctx.kv({name!r}): this process has no KV pools. Deployments give them (flowc run, "
                f"flowrt.deploy.open_deployment(path, 'inproc'), python -m BUNDLE), not a bare Runtime.open; "
                f"and only where torch is installed (pip install 'flowc[torch]')"
            )
        owner = f"{self.session}/{self.call_id}/{self.role}.{self.interface}#{self.replica}"
        state = self.globals[name]
        scope = state.get(SCOPE_KEY) if isinstance(state, dict) else None  # the caller's prefix scope (control.sessions)
        return params.session(name, self.session, owner, role=self.role, scope=scope)

    def __repr__(self) -> str:
        return f"Context(role={self.role!r}, interface={self.interface!r}, session={self.session!r}, call_id={self.call_id})"


class RoleBinding:
    """One role's instances: `begin` starts an activation on its replica(s), `finished` ends it."""

    __slots__ = ("name", "lb", "uses", "instances", "count", "rr", "load", "globals", "log", "broadcast", "memory", "threads")

    def __init__(
        self,
        spec: RoleSpec,
        instances: list[Any],
        globals_: dict,
        log: logging.Logger,
        memory: Any = None,
        prefer: tuple = (),
    ):
        self.name = spec.name
        self.lb = spec.lb
        self.broadcast = spec.lb == "broadcast"
        self.uses = spec.uses
        self.instances = instances
        self.count = len(instances)
        self.rr = 0
        self.load = [0] * self.count  # activations running on each replica
        self.globals = globals_  # the runtime's session globals: (session, name) -> dict
        self.log = log
        self.memory = memory  # each Context's `memory`
        # each replica's worker thread for its plain `def` methods (flowrt.control.threads); `prefer`: the roles' directories
        self.threads = [ReplicaThread(f"{spec.name}/{replica}", prefer) for replica in range(self.count)]

    def methods(self, interface: str) -> list[Any]:
        """The method of `interface` on each replica as the core calls it (None where the
        instance lacks it): plain `def` methods run on the replica's thread."""
        return [
            None if method is None else thread.bind(method)
            for method, thread in zip((getattr(i, interface, None) for i in self.instances), self.threads, strict=True)
        ]

    def close(self) -> None:
        """Let the replicas' worker threads go (the runtime is closing)."""
        for thread in self.threads:
            thread.close()

    def replica(self, session: str) -> int:
        if self.count == 1:
            return 0
        if self.lb == "session":
            return zlib.crc32(session.encode()) % self.count
        if self.lb == "load_aware":
            return min(range(self.count), key=self.load.__getitem__)  # the first of the least loaded
        index = self.rr % self.count
        self.rr += 1
        return index

    def begin(self, node: NodeProgram, session: str, call_id: int, graph: str, inputs: dict) -> tuple:
        """Start an activation of `node` on its replica(s): (the replica, or BROADCAST for all of
        them; the chosen replica's result, an async generator or an awaitable; for `lb broadcast`,
        the other replicas' results). Pair with `finished`."""
        uses = {name: self.globals[(session, name)] for name in self.uses} if self.uses else NO_GLOBALS
        if not self.broadcast:
            replica = self.replica(session)
            method = node.methods[replica]
            if method is None:
                raise AttributeError(f"{type(self.instances[replica]).__name__} has no method `{node.method}`")
            result = method(
                Context(session, call_id, graph, self.name, node.method, uses, self.log, replica, self.memory), **inputs
            )
            self.load[replica] += 1
            return replica, result, ()
        for replica, method in enumerate(node.methods):
            if method is None:
                raise AttributeError(f"{type(self.instances[replica]).__name__} has no method `{node.method}`")
        results: list = []
        try:
            for replica, method in enumerate(node.methods):
                results.append(
                    method(
                        Context(session, call_id, graph, self.name, node.method, uses, self.log, replica, self.memory), **inputs
                    )
                )
        except BaseException:
            self._discard(results)  # a replica refused its inputs: none of them runs
            raise
        for replica in range(self.count):
            self.load[replica] += 1
        return BROADCAST, results[0], tuple(results[1:])

    def finished(self, replica: int, extras: tuple) -> None:
        """The activation `begin` started on `replica` has ended."""
        if replica >= 0:
            self.load[replica] -= 1
        elif replica == BROADCAST:
            for other in range(self.count):
                self.load[other] -= 1
        self._discard(extras)

    @staticmethod
    def _discard(results: list | tuple) -> None:
        for result in results:
            if inspect.iscoroutine(result) and result.cr_frame is not None and not result.cr_running:
                result.close()  # a broadcast replica never awaited (the chosen one raised): no warning

    def busy_replicas(self) -> int:
        return sum(1 for n in self.load if n)
