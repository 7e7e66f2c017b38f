"""The MemoryManager on its socket (in a thread of the test, over real ZMQ ipc): garbage is
counted and dropped and it keeps answering; refusals come back as errors; a client that timed out
fails fast but takes a restarted manager at once; a dead client's refs and a dead gateway's calls
are released by the sweep; weights and the barrier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import msgspec
import pytest
import zmq

from flowrt.memory import protocol as p
from flowrt.memory.client import MemoryClient, MemoryRefused
from flowrt.transport.sockets import bind, ipc_endpoint, private_dir, remove_dir
from tests.memory.threaded import threaded_manager


@pytest.fixture
def manager():
    with threaded_manager() as state:
        yield state


@pytest.fixture
def other_manager():
    """A second manager: another machine's, as far as a client of the first can tell."""
    with threaded_manager() as state:
        yield state


def test_a_handle_of_another_manager_is_refused_not_mapped_or_adopted(manager, other_manager):
    pytest.importorskip("numpy", reason="tensors need numpy (pip install 'flowc[torch]')")
    import numpy

    from flowrt.memory.client import MemoryError_
    from flowrt.memory.tensors import Decoder, Encoder
    from flowrt.transport import codec

    there = MemoryClient(other_manager.endpoint, "replica", "far/0")
    here = MemoryClient(manager.endpoint, "gateway", "gateway")
    try:
        frames = codec.dumps({"x": numpy.ones(1 << 15)}, Encoder(there, "9:1"))
        with pytest.raises(MemoryError_, match="no memory manager of this process's machine holds"):
            codec.loads(frames, Decoder(here, adopt=True))
        assert here.statistics()["refs_by_process"] == {}  # nothing adopted from the foreign block
        assert codec.loads(frames, Decoder(there))["x"].sum() == 1 << 15  # its own manager's client maps it
    finally:
        there.close()
        here.close()


def raw(endpoint: str, *messages: bytes) -> zmq.Socket:
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    for message in messages:
        socket.send(message)
    return socket


def test_forged_pids_are_refused_and_the_sweep_survives_them(manager):
    import time

    client = MemoryClient(manager.endpoint, "client", "test")
    try:
        with pytest.raises(MemoryRefused, match="PID must be between 1 and"):
            client.request(p.Hello(p.VERSION, 0, 2**62, "client", "liar"))
        client.alloc(4096, process="9" * 30)  # a holder no process can be
        before = client.statistics()["sweeps"]
        deadline = time.monotonic() + 10
        while client.statistics()["sweeps"] < before + 2:  # two sweeps ran over the forged holder
            assert time.monotonic() < deadline, "the manager stopped sweeping"
            time.sleep(0.05)
        stats = client.statistics()
        assert stats["blocks"] == 0 and "9" * 30 not in stats["refs_by_process"]  # dropped as a dead holder
    finally:
        client.close()


def test_a_client_fails_fast_after_a_timeout_instead_of_waiting_again(manager):
    from flowrt.memory.client import MemoryUnavailable

    directory = private_dir()
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # a manager that hears and never answers
    silent.setsockopt(zmq.LINGER, 0)
    quiet = bind(silent, ipc_endpoint(directory, "silent"))
    client = MemoryClient(manager.endpoint, "client", "test", timeout=0.3)
    try:
        client.socket.disconnect(manager.endpoint)
        client.socket.connect(quiet)
        with pytest.raises(MemoryUnavailable, match="did not answer Statistics within 0.3s"):
            client.statistics()
        with pytest.raises(MemoryUnavailable, match="has not answered since though its connection is open"):
            client.statistics()  # at once: no second wait
        assert silent.poll(1000) and len(silent.recv_multipart()) == 2  # the first one did go out
        assert not silent.poll(100)  # the second never did
    finally:
        client.close()
        silent.close()
        remove_dir(directory)


def test_a_client_says_its_manager_is_down_and_takes_its_successor_at_once():
    """After a request timed out, a client fails fast for a while; but once a manager accepts its
    connection again (the supervisor restarted it on the same endpoint), the next request goes to
    it, and while none does the error says the manager is down (issue 32, item 7)."""
    from flowrt.memory.client import MemoryUnavailable

    directory = private_dir()
    endpoint = ipc_endpoint(directory, "memory")
    client = None
    try:
        with threaded_manager(endpoint=endpoint):
            client = MemoryClient(endpoint, "client", "test", timeout=2.0)
            assert "blocks" in client.statistics()
        with pytest.raises(MemoryUnavailable, match="did not answer Statistics within 2s"):
            client.statistics()  # the manager is gone: this one waits its 2 s
        started = time.monotonic()
        with pytest.raises(MemoryUnavailable, match="no memory manager has accepted this process's connection since"):
            client.statistics()  # what is true now: it is down
        assert time.monotonic() - started < 1.0  # (a moment for a successor to take the connection, not 2 s again)
        with threaded_manager(endpoint=endpoint):  # the successor, within the 2 s the client keeps quiet
            assert "blocks" in client.statistics()
    finally:
        if client is not None:
            client.close()
        remove_dir(directory)


def test_a_block_the_shared_memory_file_system_cannot_back_is_refused_not_a_sigbus(tmp_path):
    """A 2 MiB tmpfs (in a mount namespace of the test's own) under an 8 MiB pool: the slab
    is sparse, so the manager starts; a block tmpfs cannot back is refused when allocated."""
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a small tmpfs in a private mount namespace")
    script = """
import json
from flowrt.memory.manager import MemoryManager
from flowrt.memory import protocol as p

manager = MemoryManager(8 << 20)
small = manager.handle(p.Alloc(p.VERSION, 1, 1 << 20, "c", ""))
big = manager.handle(p.Alloc(p.VERSION, 2, 4 << 20, "c", ""))
again = manager.handle(p.Alloc(p.VERSION, 3, 1 << 20, "c", ""))
print(json.dumps([small.error, big.error, big.code, again.error, manager.pool.statistics()["blocks"]]))
manager.close()
"""
    shm = tmp_path / "shm"
    shm.mkdir()
    command = f"mount -t tmpfs -o size=2m tmpfs {shm} && exec {sys.executable} -c '{script}'"
    env = {**os.environ, "FLOWRT_SHM_DIR": str(shm)}
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    if out.returncode != 0 and "mount" in out.stderr and "permission" in out.stderr.lower():
        pytest.skip(f"this machine does not let a test mount a tmpfs: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    small, big, code, again, blocks = json.loads(out.stdout)
    assert small == "" and again == "" and code == p.NO_ROOM and blocks == 2, out.stdout
    assert "has no room for" in big and "--shm-size" in big and "--pool-mb" in big, big


def test_garbage_is_dropped_and_the_manager_keeps_answering(manager):
    class Alien(msgspec.Struct, tag="alloc", array_like=True, tag_field="t"):
        v: int
        req: int
        nbytes: str

    socket = raw(
        manager.endpoint,
        b"\xff\x00 not msgpack",
        msgspec.msgpack.encode(Alien(p.VERSION, 1, "lots")),
        p.encode(p.Alloc(p.VERSION + 1, 2, 10, "c", "")),
    )
    socket.send_multipart([b"a", b"b"])  # two frames: not a request either
    client = MemoryClient(manager.endpoint, "client", "test")
    stats = client.statistics()
    assert stats["garbage_requests"] == 4 and stats["blocks"] == 0
    socket.close()
    client.close()


def test_refusals_are_errors_that_say_why(manager):
    client = MemoryClient(manager.endpoint, "client", "test")
    with pytest.raises(MemoryRefused, match="does not fit"):
        client.alloc(1 << 40, call="1:1")
    with pytest.raises(MemoryRefused, match="at least one byte"):
        client.alloc(-5, call="1:1")
    with pytest.raises(MemoryRefused, match="not in the pool"):
        client.request(p.AddRef(p.VERSION, 0, 999, "1:1", ""))
    with pytest.raises(MemoryRefused, match="released before"):
        client.request(p.Adopt(p.VERSION, 0, client.alloc(10, call="1:1").block, "other", client.process))
    with pytest.raises(MemoryRefused, match="positive size"):
        client.request(p.Claim(p.VERSION, 0, "w", 0, "layout", client.process))
    client.post(p.Free(p.VERSION, 0, 12345, "1:1", ""))  # a late free of nothing: ignored, counted
    stats = client.statistics()
    assert stats["stale_frees"] == 1 and stats["blocks"] == 1
    client.post(p.ReleaseCall(p.VERSION, 0, "1:1"))
    assert client.statistics()["blocks"] == 0
    client.close()


def test_the_sweep_releases_a_dead_process_and_a_dead_gateways_calls(manager):
    code = (
        "import sys; from flowrt.memory.client import MemoryClient; from flowrt.memory import protocol as p\n"
        "c = MemoryClient(sys.argv[1], 'gateway', 'doomed')\n"
        "c.alloc(4096, process=c.process); c.alloc(4096, call=c.process + ':7')\n"
        "print(c.process)\n"
    )
    pid = subprocess.run(
        [sys.executable, "-c", code, manager.endpoint], capture_output=True, text=True, check=True
    ).stdout.strip()
    client = MemoryClient(manager.endpoint, "client", "test")
    stats = client.statistics()
    assert stats["refs_by_process"] == {pid: 1} and stats["refs_by_call"] == {f"{pid}:7": 1}
    manager.sweep()  # (the serving loop does it every half second; here at once)
    stats = client.statistics()
    assert stats["blocks"] == 0 and pid not in stats["clients"]
    client.close()


def test_weights_have_one_owner_and_a_failed_owner_hands_over(manager):
    owner = MemoryClient(manager.endpoint, "replica", "a/0")
    first = owner.request(p.Claim(p.VERSION, 0, "m|tp1", 4096, "L1", "101"))
    second = owner.request(p.Claim(p.VERSION, 0, "m|tp1", 4096, "L1", "102"))
    assert (first.data["role"], second.data["role"]) == ("owner", "follower")
    assert first.data["path"] == second.data["path"] and second.data["state"] == "loading"
    with pytest.raises(MemoryRefused, match="another architecture"):
        owner.request(p.Claim(p.VERSION, 0, "m|tp1", 4096, "L2", "103"))
    owner.request(p.Loaded(p.VERSION, 0, "m|tp1", "OSError: no checkpoint"))
    again = owner.request(p.Claim(p.VERSION, 0, "m|tp1", 4096, "L1", "102"))
    assert again.data["role"] == "owner" and again.data["state"] == "loading"  # the follower loads now
    owner.request(p.Loaded(p.VERSION, 0, "m|tp1", ""))
    assert owner.request(p.Claim(p.VERSION, 0, "m|tp1", 4096, "L1", "104")).data["state"] == "ready"
    owner.close()


def test_the_barrier_waits_for_every_load_then_gives_the_minimum(manager):
    client = MemoryClient(manager.endpoint, "replica", "a/0")

    def arrive(name: str, phase: int, proposal: int = 0) -> dict:
        return client.request(p.Arrive(p.VERSION, 0, "kv", phase, name, 2, proposal)).data

    assert arrive("a/0", 1)["loaded"] == 1
    assert "value" not in arrive("a/0", 2, 500)  # b/0 has not loaded: a proposal now does not count
    assert arrive("b/0", 1)["loaded"] == 2
    assert "value" not in arrive("a/0", 2, 500)
    assert arrive("b/0", 2, 300)["value"] == 300
    assert arrive("a/0", 2, 900)["value"] == 300  # sized once
    client.close()
