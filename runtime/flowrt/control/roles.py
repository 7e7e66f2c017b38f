"""A role's replicas as the runtime invokes them: replica choice (`lb`), the `ctx` each method
receives, and the count of activations running on each replica.

Everything an activation needs from its role is looked up once, when the runtime opens (the
bound method of every interface on every replica), so starting an activation is a list index
and a call.
"""

from __future__ import annotations

import inspect
import logging
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flowrt.tables import RoleSpec

if TYPE_CHECKING:
    from flowrt.control.call import Activation, Call


@dataclass(slots=True)
class Context:
    """What a role's method receives as `ctx`."""

    session: str
    call_id: int
    graph: str
    role: str
    interface: str
    globals: dict[str, Any]
    logger: logging.Logger
    replica: int


class RoleBinding:
    """One role's instances, bound: `begin` starts an activation, `finished` ends it."""

    __slots__ = ("name", "lb", "uses", "instances", "count", "methods", "rr", "load", "globals", "log")

    def __init__(self, spec: RoleSpec, instances: list[Any], globals_: dict, log: logging.Logger):
        self.name = spec.name
        self.lb = spec.lb
        self.uses = spec.uses
        self.instances = instances
        self.count = len(instances)
        # interface -> the bound method on each replica (None where the instance lacks it)
        self.methods = {iface: [getattr(inst, iface, None) for inst in instances] for iface in spec.interfaces}
        self.rr = 0
        self.load = [0] * self.count  # activations running on each replica
        self.globals = globals_  # the runtime's session globals: (session, name) -> dict
        self.log = log

    def replica(self, session: str) -> int:
        if self.count == 1:
            return 0
        if self.lb == "session":
            return zlib.crc32(session.encode()) % self.count
        if self.lb == "load_aware":
            load = self.load
            return min(range(self.count), key=lambda r: (load[r], r))
        index = self.rr % self.count
        self.rr += 1
        return index

    def begin(self, interface: str, call: Call, act: Activation) -> tuple[Any, list[tuple[int, Any]]]:
        """Start `act` on its replica(s): the chosen replica's result (an async generator or an
        awaitable) and, for `lb broadcast`, the other replicas' results. Pair with `finished`."""
        replicas = range(self.count) if self.lb == "broadcast" else (self.replica(call.session),)
        methods = self.methods[interface]
        uses = {name: self.globals[(call.session, name)] for name in self.uses} if self.uses else {}
        results = []
        for replica in replicas:
            method = methods[replica]
            if method is None:
                raise AttributeError(f"{type(self.instances[replica]).__name__} has no method `{interface}`")
            ctx = Context(call.session, call.call_id, call.graph, self.name, interface, uses, self.log, replica)
            results.append((replica, method(ctx, **act.inputs)))
            self.load[replica] += 1
            act.replicas += (replica,)
        return results[0][1], results[1:]

    def finished(self, act: Activation, extras: list) -> None:
        for replica in act.replicas:
            self.load[replica] -= 1
        for _, result in extras:
            if inspect.iscoroutine(result) and result.cr_frame is not None and not result.cr_running:
                result.close()  # a broadcast replica never awaited (the chosen one raised): no warning

    @staticmethod
    async def drain(extra: tuple[int, Any]) -> None:
        """Run a broadcast replica's activation to its end; only the chosen replica's frames count."""
        result = extra[1]
        if inspect.isasyncgen(result):
            async for _ in result:
                pass
        else:
            await result

    def busy_replicas(self) -> int:
        return sum(1 for n in self.load if n)
