"""Calls spread over several shard hosts in one test process (flowrt.control.shards): each host
is a Runtime of its own over the same bundle, hosting one replica of one role (process 0, the
gateway, hosts none), and the fabric carries their messages over FIFO channels, one per pair
of hosts, each delivering after a random number of loop turns: every interleaving the real
transport allows (ordered per pair, anything across pairs), without sleeping."""

from __future__ import annotations

import asyncio
import functools
import pickle
import random
from collections import deque
from pathlib import Path

from flowrt.bundle import load_bundle
from flowrt.control import Runtime
from flowrt.control.envelopes import Placement
from flowrt.control.shard_binding import ShardBinding
from flowrt.control.shards import Shards
from flowrt.control.threads import ReplicaThread
from tests.runtime.harness import bundle_of, jitter


class Fabric:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.hosts: dict[int, Shards] = {}
        self.runtimes: dict[int, Runtime] = {}
        self.channels: dict[tuple[int, int], deque] = {}
        self.pumps: dict[tuple[int, int], asyncio.Task] = {}
        self.failures: list[BaseException] = []
        self.messages: dict[tuple[int, int], int] = {}
        self.kinds: dict[int, int] = {}  # messages by kind (flowrt.control.envelopes)

    def sender(self, src: int):
        def send(dst: int, envelope) -> None:
            channel = (src, dst)
            self.messages[channel] = self.messages.get(channel, 0) + 1
            self.kinds[envelope.kind] = self.kinds.get(envelope.kind, 0) + 1
            if src != dst:  # (as the real transport, flowrt.deploy.peers: the receiver gets its own copy)
                envelope.body = pickle.loads(pickle.dumps(envelope.body))
            self.channels.setdefault(channel, deque()).append(envelope)
            if channel not in self.pumps:
                self.pumps[channel] = asyncio.ensure_future(self._pump(channel))

        return send

    async def _pump(self, channel: tuple[int, int]) -> None:
        queue = self.channels[channel]
        try:
            while queue:
                await jitter(self.rng, 3)
                self.hosts[channel[1]].receive(queue.popleft())
        except BaseException as error:  # noqa: BLE001 - the test reports it
            self.failures.append(error)
            raise
        finally:
            del self.pumps[channel]

    async def drained(self) -> None:
        """Return once no message is on its way (the calls' CLOSE messages included), nor
        waiting in a host's outbox for the end of its loop turn."""
        while self.pumps or any(host.outbox for host in self.hosts.values()):
            if self.pumps:
                await asyncio.gather(*self.pumps.values(), return_exceptions=True)
            else:
                await asyncio.sleep(0)  # (an outbox is flushed by a callback of the next turn)

    def gateway_messages(self) -> tuple[int, int]:
        """(messages the gateway sent, messages it received), to other hosts."""
        sent = sum(n for (src, dst), n in self.messages.items() if src == 0 and dst != 0)
        received = sum(n for (src, dst), n in self.messages.items() if dst == 0 and src != 0)
        return sent, received

    def statistics(self) -> dict[int, dict[str, int]]:
        return {host: shards.statistics() for host, shards in self.hosts.items()}

    async def close(self) -> None:
        for runtime in self.runtimes.values():
            await runtime.close()


async def open_fabric(text: str, directory: Path, roles: dict[str, list[object]], rng: random.Random) -> Fabric:
    """A gateway (host 0) and one host per replica in `roles` (role -> its replicas' instances)."""
    bundle = bundle_of(text, directory)
    fabric = Fabric(rng)
    hosts: dict[str, list[int]] = {}
    layout: list[tuple[int, str, object]] = []
    for role in sorted(roles):
        for instance in roles[role]:
            number = len(layout) + 1
            layout.append((number, role, instance))
            hosts.setdefault(role, []).append(number)
    placement = Placement(0, {role: tuple(numbers) for role, numbers in hosts.items()})
    gateway = Runtime(load_bundle(bundle))
    gateway.shards = fabric.hosts[0] = Shards(gateway, 0, placement, fabric.sender(0))
    fabric.runtimes[0] = gateway
    for number, role, instance in layout:  # (as flowrt.deploy.peers.host_process makes a replica process's)
        runtime = Runtime(load_bundle(bundle))
        shards = fabric.hosts[number] = Shards(runtime, number, placement, fabric.sender(number))
        replica = hosts[role].index(number)
        binding = functools.partial(ShardBinding, shards=shards, replica=replica)
        runtime.host(role, instance, ReplicaThread(f"{role}/{replica}"), binding)
        fabric.runtimes[number] = runtime
    return fabric
