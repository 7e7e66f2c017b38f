"""The gateway's side of a `local` (or local Ray) deployment whose calls are spread over the
replica processes (FLOWRT_CONTROL=shards; flowrt.control.shards, docs/design/decentralised.md):
where every process listens for its peers, the gateway's Shards and sockets, and what it does
when a replica goes down. The calls that had sent it work end at once, naming it; calls
admitted while it is down route around it to the role's other replicas; a call that sends it
work (every replica of the role down) waits, as under the gateway's control, for it to come back
(its messages queue on the socket until the new process binds the same endpoint) and ends once
it has waited the deployment's replica wait (REPLICA_WAIT, $FLOWRT_REPLICA_WAIT) in vain,
saying why. Owned by the supervisor (flowrt.deploy.local, .ray); imports no supervisor."""

from __future__ import annotations

import asyncio
from typing import Any

MIN_SWEEP = 0.1  # seconds between looks at a replica that is down (whether it is back; the calls waiting for it)


class ShardGateway:
    """The gateway's shards of every call and its sockets to the replicas, for `supervisor`
    (which knows the expected processes, their endpoints, the keys and which replicas are up)."""

    def __init__(self, supervisor: Any):
        self.supervisor = supervisor
        self.shards: Any = None  # flowrt.control.shards.Shards, once `open`
        self.peers: Any = None  # flowrt.deploy.peers.Peers
        self.tasks: set[asyncio.Task] = set()  # calls a lost replica took with it, being found
        self.watches: dict[tuple[str, int], asyncio.Task] = {}  # replicas down: the calls waiting for them

    def config(self, role: str, replica: int) -> dict:
        """Where every process of the deployment listens for its peers, and which it is (the
        gateway: `role` empty)."""
        supervisor = self.supervisor
        expected = supervisor.expected()
        hosts: dict[str, list[int]] = {}
        endpoints = {0: supervisor.endpoint("peers-gateway")}
        for number, (name, index) in enumerate(expected, 1):
            hosts.setdefault(name, []).append(number)
            endpoints[number] = supervisor.endpoint(f"peers-{name}-{index}")
        me = 1 + expected.index((role, replica)) if role else 0
        return {"me": me, "replica": replica, "endpoints": endpoints, "hosts": hosts}

    def open(self, runtime: Any) -> None:
        """Make the gateway's runtime spread its calls over the replicas."""
        from flowrt.control.shards import Shards
        from flowrt.deploy.peers import Peers, endpoints_of, placement_of

        supervisor = self.supervisor
        config = self.config("", 0)
        placement = placement_of(config)
        self.peers = Peers(supervisor.keys, "gateway", 0, endpoints_of(config), placement, "the gateway")
        self.shards = runtime.shards = Shards(runtime, 0, placement, self.peers.send, self.peers.encode)
        self.peers.deliver = self.shards.receive
        self.shards.loads.reported = self._reported
        self.peers.decoder = (
            supervisor.remote.decoder
        )  # (a tensor a replica sends the caller: adopted, as under the gateway's control)

    def _reported(self, process: int) -> float:
        """What process `process`'s last heartbeat said it had queued and running (`lb load_aware`)."""
        expected = self.supervisor.expected()
        link = self.supervisor.remote.links.get(expected[process - 1]) if 0 < process <= len(expected) else None
        return 0.0 if link is None else float(link.record.queued + link.record.running)

    def lost(self, role: str, replica: int, reason: str) -> None:
        """Replica `replica` of `role` went down: end the calls that sent it work, and watch the
        ones that send it work until it is back."""
        if self.shards is None or (role, replica) not in self.supervisor.processes:
            return
        message = f"replica {replica} of role `{role}` went away: {reason}"  # (as flowrt.deploy.remote says it)
        number = 1 + self.supervisor.expected().index((role, replica))
        self.shards.faults.set_down(number, True)  # (calls admitted from now on route around it)
        self._spawn(self.shards.faults.lost(number, role, message))
        if (role, replica) not in self.watches:
            watch = self.watches[(role, replica)] = asyncio.ensure_future(self._watch(role, replica, number))
            watch.add_done_callback(lambda _, key=(role, replica): self.watches.pop(key, None))

    async def _watch(self, role: str, replica: int, number: int) -> None:
        """While the replica stays down, end each call that has sent it work and waited at least
        the replica wait for it (seen at two looks that far apart); once it is up, stop."""
        remote = self.supervisor.remote
        loop = asyncio.get_running_loop()
        waiting: set[int] = set()
        looked = loop.time()
        while True:
            await asyncio.sleep(MIN_SWEEP)
            if replica in remote.live.get(role, ()):
                self.shards.faults.set_down(number, False)
                return  # back: what queued for it is delivered to the new process
            wait = remote.wait
            if loop.time() - looked < wait:
                continue
            looked = loop.time()
            touched = set(await self.shards.faults.touching(number))
            overdue = touched if wait <= MIN_SWEEP else touched & waiting
            if overdue:
                self.shards.faults.end(overdue, role, remote.not_up(role))
            waiting = touched - overdue

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def close(self) -> None:
        for task in [*self.tasks, *self.watches.values()]:
            task.cancel()
        if self.peers is not None:
            self.peers.close()
