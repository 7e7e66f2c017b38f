"""The binding of a role's replica in a process that hosts its part of calls spread over
processes (flowrt.control.shards): session globals fetched from the gateway and their changes
sent back, and `lb broadcast` activations run on the role's other replicas too. Imports only
flowrt.control's own modules."""

from __future__ import annotations

import logging
from typing import Any

from flowrt.control.program import NodeProgram
from flowrt.control.roles import Context, RoleBinding
from flowrt.control.sessions import globals_changes, snapshot_globals
from flowrt.control.shards import BROADCAST, NO_GLOBALS, Shards


class ShardBinding(RoleBinding):
    """The binding of a role's one replica in a process hosting its part of calls. A role that
    `uses` session globals gets a copy of the gateway's before it runs, and what it set,
    changed or deleted goes back when it ends (as under --deploy local's gateway control); an
    `lb broadcast` activation runs on the role's other replicas too, and ends once they have;
    the end of an `lb load_aware` activation is told to whoever sent its work (shard_loads)."""

    def __init__(self, spec: Any, instances: list, globals_: dict, log_: logging.Logger, memory: Any, prefer: tuple, **where):
        super().__init__(spec, instances, globals_, log_, memory, prefer)
        self.shards: Shards = where["shards"]
        self.index: int = where["replica"]  # its number among its role's replicas (`ctx.replica`)
        # `lb load_aware` over several replicas: each activation's end is told to whoever sent its work (shard_loads)
        self.load_aware = spec.lb == "load_aware" and len(self.shards.placement.hosts[spec.name]) > 1

    def begin(self, node: NodeProgram, session: str, call_id: Any, graph: str, inputs: dict) -> tuple:
        method = node.methods[0]
        if method is None:
            raise AttributeError(f"{type(self.instances[0]).__name__} has no method `{node.method}`")
        self.load[0] += 1
        if self.uses:
            run = self._stream if node.generator else self._once
            result = run(method, node, session, call_id, graph, inputs)
        else:
            result = method(self.context(node, session, call_id, graph, NO_GLOBALS), **inputs)
        if self.load_aware:  # (its end is told to whoever sent its work)
            result = (self._counted_stream if node.generator else self._counted_once)(result, call_id, node.index)
        if not self.broadcast:
            return 0, result, ()
        shards = self.shards
        call = shards.calls[call_id]
        others = [p for p in shards.placement.hosts[self.name] if p != shards.me and p not in call.router.down]
        return BROADCAST, result, tuple(shards.extra(call, node, p, inputs) for p in others)

    async def _once(self, method: Any, node: NodeProgram, session: str, call_id: Any, graph: str, inputs: dict) -> Any:
        uses = await self.shards.fetch(call_id, self.uses)
        before = snapshot_globals(uses)
        try:
            return await method(self.context(node, session, call_id, graph, uses), **inputs)
        finally:
            self.shards.commit(call_id, globals_changes(before, uses))

    async def _stream(self, method: Any, node: NodeProgram, session: str, call_id: Any, graph: str, inputs: dict):
        uses = await self.shards.fetch(call_id, self.uses)
        before = snapshot_globals(uses)
        try:
            async for frame in method(self.context(node, session, call_id, graph, uses), **inputs):
                yield frame
        finally:
            self.shards.commit(call_id, globals_changes(before, uses))

    async def _counted_once(self, result: Any, call_id: Any, node: int) -> Any:
        try:
            return await result
        finally:
            self.shards.loads.ended(call_id, node)

    async def _counted_stream(self, result: Any, call_id: Any, node: int):
        try:
            async for frame in result:
                yield frame
        finally:
            self.shards.loads.ended(call_id, node)

    def context(self, node: NodeProgram, session: str, call_id: Any, graph: str, uses: Any) -> Context:
        return Context(session, call_id, graph, self.name, node.method, uses, self.log, self.index, self.memory)
