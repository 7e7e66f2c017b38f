"""Attacks between a deployment's processes, scripted against real `local` deployments on
loopback (docs/security.md, "Between processes"): a forged Redis record pointing at an
attacker's socket, a forged embedded-registry message, a crafted pickle sent to a replica's
socket and to the memory manager's, a forged `Cancel` and a forged `Stop` (a rewritten KV page
location: tests/params/test_ctx_kv.py). Each time: nothing executes, the attacker
receives nothing, calls complete, the real replicas keep serving (same processes), and the
attempt is counted (/stats, /metrics' flowrt_refused_total)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import shutil

import msgspec
import pytest
import redis
import zmq

from flowrt.deploy.observed import gatherer
from flowrt.observe.deployment import DeploymentMetrics
from flowrt.registry.stores import RedisRecord, SignedRecord, record_mac, replica_key
from flowrt.transport import messages as m
from tests.deploy.helpers import assert_clean_everywhere, bundle_with_roles, calls, deployed, wait_for
from tests.deploy.test_faults import FLOW, ROLES

MACHINE_REDIS = "redis://127.0.0.1:6379/0"


class Attacker:
    """A ROUTER of the attacker's on loopback (no keys), which counts the connections it
    accepts and the messages it receives: a gateway that dialled it would show in both."""

    def __init__(self):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.monitor = self.socket.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_CONNECTED)
        self.accepted = 0
        self.received = 0

    def drain(self) -> None:
        while self.socket.poll(0):
            self.socket.recv_multipart()
            self.received += 1
        while self.monitor.poll(0):
            self.monitor.recv_multipart()
            self.accepted += 1

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(0)
        self.context.destroy(linger=0)


def intruder(
    context: zmq.Context, address: str, kind: int = zmq.DEALER, curve: tuple | None = None, plain: tuple | None = None
) -> zmq.Socket:
    """A socket dialling `address` without the deployment's keys (`curve`: its own CURVE key
    pair and the server key it believes in; `plain`: a user name and a password)."""
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        public, secret, server = curve
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server
    if plain is not None:
        sock.plain_username, sock.plain_password = plain[0].encode(), plain[1].encode()
    sock.connect(address)
    return sock


def offer(sock: zmq.Socket, frames: list[bytes]) -> None:
    """Send `frames` if the socket will take them now. A peer whose handshake was refused has no
    pipe to queue on once the refusal lands, so zmq may answer Again: that is the defence working."""
    with contextlib.suppress(zmq.Again):
        sock.send_multipart(frames, zmq.NOBLOCK)


async def scrape(deployment) -> dict:
    """/metrics' snapshot now (its `refused` part, by process and kind)."""
    metrics = DeploymentMetrics(gatherer(deployment))
    await metrics.refresh()
    assert b"flowrt_refused_total" in metrics.exposition()
    return metrics.snapshot["refused"]


class Boom:
    """A pickle that creates a file when it is loaded."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the machine's Redis")
def test_a_forged_redis_record_is_never_dialled_and_gets_no_replica_killed(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    client = redis.Redis.from_url(MACHINE_REDIS)
    attacker = Attacker()

    async def main():
        async with deployed(bundle, registry=MACHINE_REDIS, heartbeat_ttl=1.0) as deployment:
            supervisor = deployment.supervisor
            victim = supervisor.pids()["worker/0"]
            key = replica_key(supervisor.deployment, "worker", 0)
            before = supervisor.remote.links[("worker", 0)].record.incarnation
            # the attack: a record with a new incarnation at the attacker's address, carrying
            # the real replica's PID, that then stops heartbeating; unsigned, then signed with a wrong key
            register = m.Register(m.VERSION, "worker", 0, "f0f0f0f0f0f0", attacker.address, victim, ["run"])
            beat = m.Heartbeat(m.VERSION, "worker", 0, "f0f0f0f0f0f0", 0, 0, 0)
            data = msgspec.msgpack.encode(RedisRecord(register, beat))
            forged = [
                data,
                msgspec.msgpack.encode(SignedRecord(m.VERSION, data, record_mac(b"x" * 32, key, data))),
                msgspec.msgpack.encode(SignedRecord(m.VERSION, data, b"\0" * 32)),
            ]
            for value in forged:
                # the real replica rewrites its key every TTL/3, just before the gateway's own reads: the
                # gateway is made to read right after the forger wrote (its real poll, from this loop)
                seen = supervisor.source.forged
                for _ in range(20):
                    client.set(key, value, px=1000)
                    await supervisor.source.poll()
                    if supervisor.source.forged > seen:
                        break
                assert supervisor.source.forged > seen, "the forged record was never read"
            # two TTLs later the real replica was never dropped, nor killed, and keeps serving
            beats = supervisor.directory.records[("worker", 0)].beats
            await wait_for(lambda: supervisor.directory.records[("worker", 0)].beats >= beats + 6, 10, "six more heartbeats")
            for n in range(6):
                events = await calls(deployment.runtime, "g", {"request": {"n": n}})
                assert events[-1]["status"] == "ok", events[-1]
            assert supervisor.pids()["worker/0"] == victim and supervisor.restarted == 0
            assert supervisor.directory.lapses == 0
            assert supervisor.remote.links[("worker", 0)].record.incarnation == before
            attacker.drain()
            assert attacker.accepted == 0 and attacker.received == 0  # never dialled
            counts = await scrape(deployment)
            assert counts["server"]["forged_records"] >= len(forged)
            assert (await deployment.statistics())["forged_records"] >= len(forged)
            await assert_clean_everywhere(deployment)

    try:
        asyncio.run(main())
    finally:
        attacker.close()


def test_a_forged_embedded_registry_message_never_arrives(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    attacker = Attacker()
    context = zmq.Context()

    async def main():
        async with deployed(bundle, heartbeat_ttl=1.0) as deployment:
            supervisor = deployment.supervisor
            victim = supervisor.pids()["worker/0"]
            before = supervisor.remote.links[("worker", 0)].record.incarnation
            register = m.Register(m.VERSION, "worker", 0, "f0f0f0f0f0f0", attacker.address, victim, ["run"])
            endpoint = supervisor.registry_endpoint  # (ipc: PLAIN and a token; flowrt.transport.keys)
            pushers = [
                intruder(context, endpoint, zmq.PUSH),  # no authentication at all
                intruder(context, endpoint, zmq.PUSH, plain=("member", "0" * 64)),  # a wrong token
                intruder(context, endpoint, zmq.PUSH, plain=("gateway", supervisor.keys.member_token)),  # another's
            ]
            for pusher in pushers:
                offer(pusher, [m.encode(register)])
            await wait_for(lambda: supervisor.security()["refused_peers"] >= 3, 10, "the pushers refused")
            for n in range(4):
                events = await calls(deployment.runtime, "g", {"request": {"n": n}})
                assert events[-1]["status"] == "ok", events[-1]
            assert supervisor.remote.links[("worker", 0)].record.incarnation == before
            assert supervisor.pids()["worker/0"] == victim and supervisor.restarted == 0
            assert supervisor.source.garbage == 0  # nothing of theirs was even decoded
            attacker.drain()
            assert attacker.accepted == 0 and attacker.received == 0
            assert (await scrape(deployment))["server"]["peers"] >= 3
            await assert_clean_everywhere(deployment)

    try:
        asyncio.run(main())
    finally:
        context.destroy(linger=0)
        attacker.close()


def test_a_crafted_pickle_a_forged_cancel_and_a_forged_stop_change_nothing(tmp_path):
    bundle = bundle_with_roles(FLOW, ROLES, tmp_path)
    context = zmq.Context()
    planted = tmp_path / "pwned"

    async def main():
        async with deployed(bundle, heartbeat_ttl=1.0) as deployment:
            supervisor, runtime = deployment.supervisor, deployment.runtime
            pids = supervisor.pids()
            address = supervisor.remote.links[("worker", 0)].record.address
            keys = supervisor.keys
            crafted = [m.encode(m.Start(m.VERSION, 1, 1, "s", "g", "run", False)), pickle.dumps(Boom(str(planted)))]
            # a slow call on worker/0 and worker/1 (round robin), whose activations forged Cancels aim at
            slow = [asyncio.ensure_future(calls(runtime, "g", {"request": {"n": n, "sleep": 1.5}})) for n in range(2)]
            await wait_for(lambda: runtime.statistics()["busy_replicas"] == 2, 10, "both replicas busy")
            peers = [  # (an ipc socket: PLAIN with the gateway's token; flowrt.transport.keys)
                intruder(context, address),  # no authentication at all
                intruder(context, address, plain=("gateway", "0" * 64)),  # a wrong token
                intruder(context, address, plain=("member", keys.member_token)),  # a replica's (not the gateway's)
                intruder(context, address, curve=(*zmq.curve_keypair(), keys.server_public.encode())),  # CURVE
            ]
            for peer in peers:
                offer(peer, crafted)
                for act in range(1, 20):
                    offer(peer, [m.encode(m.Cancel(m.VERSION, act))])
                offer(peer, [m.encode(m.Stop(m.VERSION))])
            # another connection holding the gateway's key (as a second gateway would): its Cancels
            # name activations it did not start, and are ignored
            other = intruder(context, address, plain=("gateway", keys.gateway_token))
            for act in range(1, 20):
                other.send(m.encode(m.Cancel(m.VERSION, act)), zmq.NOBLOCK)
            # the memory manager's ROUTER: the same pickle from peers without the deployment's keys
            manager = supervisor.memory.endpoint
            before = deployment.memory_statistics()
            managers = [
                intruder(context, manager),  # no authentication at all
                intruder(context, manager, plain=("member", "0" * 64)),  # a wrong token
                intruder(context, manager, curve=(*zmq.curve_keypair(), keys.server_public.encode())),  # CURVE, no key
            ]
            for peer in managers:
                offer(peer, [pickle.dumps(Boom(str(planted)))])

            loop = asyncio.get_running_loop()
            deadline, counts = loop.time() + 10, {}
            while not (
                counts.get("worker/0", {}).get("peers", 0) >= 3
                and counts.get("worker/0", {}).get("foreign_messages", 0) >= 1
                and counts.get("memory-manager", {}).get("peers", 0) >= len(managers)
            ):
                assert loop.time() < deadline, counts
                counts = await scrape(deployment)
            for events in await asyncio.gather(*slow):
                assert events[-1]["status"] == "ok", events[-1]  # neither Cancel nor Stop reached them
            for n in range(4):
                events = await calls(runtime, "g", {"request": {"n": n}})
                assert events[-1]["status"] == "ok", events[-1]
            assert not planted.exists()  # nothing was unpickled
            assert supervisor.pids() == pids and supervisor.restarted == 0
            assert (await deployment.statistics())["processes"]["worker/0"]["refused"]["peers"] >= 3
            after = deployment.memory_statistics()  # nothing of theirs reached the manager's decoder
            assert after["refused"]["peers"] >= len(managers) and after["garbage_requests"] == before["garbage_requests"]
            for peer in [*peers, other, *managers]:
                peer.close(0)
            await assert_clean_everywhere(deployment)

    try:
        asyncio.run(main())
    finally:
        context.destroy(linger=0)
