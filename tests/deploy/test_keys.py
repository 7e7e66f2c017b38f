"""A deployment's keys on their own (flowrt.transport.keys, flowrt.registry.stores): CURVE on
tcp admits only the keys a socket expects and talks only to the deployment's server, PLAIN on
ipc only inside a private directory, and a Redis record verifies only as its replica wrote it."""

from __future__ import annotations

import asyncio
import os

import msgspec
import pytest
import zmq

from flowrt.registry.stores import Forged, RedisRecord, replica_key, signed, verified
from flowrt.transport import messages as m
from flowrt.transport.keys import Guard, Keys
from tests.deploy.helpers import wait_for


def received(sock: zmq.Socket, deadline: float) -> list[bytes]:
    """Whatever `sock` receives before `deadline` seconds pass (a negative test's window)."""
    found = []
    while sock.poll(int(deadline * 1000)):
        found.append(sock.recv_multipart()[-1])
        deadline = 0.05
    return found


def test_a_tcp_socket_admits_only_the_key_it_expects_and_counts_the_others():
    keys = Keys.generate()
    context = zmq.Context()

    async def main():
        guard = Guard(context, keys, ["gateway"], "test")
        server = context.socket(zmq.ROUTER)
        server.setsockopt(zmq.LINGER, 0)
        keys.serve(server, "tcp://127.0.0.1:0")
        port = server.bind_to_random_port("tcp://127.0.0.1")
        guard.watch(server, asyncio.get_running_loop())
        address = f"tcp://127.0.0.1:{port}"
        clients = {}
        for who in ("none", "stranger", "member", "gateway"):
            sock = clients[who] = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if who in ("member", "gateway"):
                keys.dial(sock, who, address)
            elif who == "stranger":  # its own key pair, and the server's public key
                sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
                sock.curve_serverkey = keys.server_public.encode()
            sock.connect(address)
            sock.send(who.encode())
        await wait_for(lambda: guard.refused >= 3, 10, "three peers refused")
        got = server.recv_multipart(copy=False)  # the gateway's, and only it
        assert got[1].bytes == b"gateway" and got[1].get("User-Id") in keys.user("gateway")
        assert not server.poll(100)
        for sock in clients.values():
            sock.close(0)
        guard.stop()
        server.close(0)

    try:
        asyncio.run(main())
    finally:
        context.destroy(linger=0)


def test_the_gateway_never_talks_to_a_tcp_socket_without_the_deployments_server_key():
    keys, other = Keys.generate(), Keys.generate()
    context = zmq.Context()
    try:
        for fake in (None, other):  # a plain socket; one with another deployment's server key
            attacker = context.socket(zmq.ROUTER)
            attacker.setsockopt(zmq.LINGER, 0)
            if fake is not None:
                fake.serve(attacker, "tcp://127.0.0.1:0")
            port = attacker.bind_to_random_port("tcp://127.0.0.1")
            gateway = context.socket(zmq.DEALER)
            gateway.setsockopt(zmq.LINGER, 0)
            keys.dial(gateway, "gateway", f"tcp://127.0.0.1:{port}")
            gateway.connect(f"tcp://127.0.0.1:{port}")
            gateway.send(b"inputs of another session")
            assert received(attacker, 0.5) == []
            gateway.close(0)
            attacker.close(0)
    finally:
        context.destroy(linger=0)


def test_an_ipc_token_is_sent_only_into_a_private_directory(tmp_path):
    keys = Keys.generate()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        with pytest.raises(ValueError, match="not this user's alone"):
            keys.dial(sock, "gateway", f"ipc://{shared}/replica")
        private = tmp_path / "private"
        private.mkdir(mode=0o700)
        keys.dial(sock, "gateway", f"ipc://{private}/replica")
        replica = Keys.from_config(keys.for_replica())
        assert replica.gateway_secret == "" and replica.gateway_token == ""
        with pytest.raises(ValueError, match="holds no gateway key"):
            replica.dial(sock, "gateway", f"ipc://{private}/replica")
    finally:
        sock.close(0)


def test_a_redis_record_verifies_only_as_its_replica_wrote_it():
    keys = Keys.generate()
    key = replica_key("dep", "worker", 0)
    register = m.Register(m.VERSION, "worker", 0, "abc", "tcp://10.0.0.1:5000", 42, ["run"])
    record = RedisRecord(register, m.Heartbeat(m.VERSION, "worker", 0, "abc", 0, 0, 0))
    value = signed(keys.mac_key, key, record)
    assert verified(keys.mac_key, "dep", key, value) == record
    with pytest.raises(Forged):  # another deployment's key
        verified(Keys.generate().mac_key, "dep", key, value)
    with pytest.raises(Forged):  # copied under another replica's key
        verified(keys.mac_key, "dep", replica_key("dep", "worker", 1), value)
    envelope = msgspec.msgpack.decode(value)
    tampered = envelope[1].replace(b"10.0.0.1", b"10.6.6.6")
    with pytest.raises(Forged):  # its address changed
        verified(keys.mac_key, "dep", key, msgspec.msgpack.encode([envelope[0], tampered, envelope[2]]))
    with pytest.raises(msgspec.DecodeError):  # not a signed record at all (the old, unsigned form)
        verified(keys.mac_key, "dep", key, msgspec.msgpack.encode(record))
