"""How the pools of one machine find each other's host pages: a small descriptor per pool.

A pool with a host tier (L2) writes one JSON descriptor into the shared-memory directory beside
its pages: its deployment, node name, layout id, the path and slot count of its L2 file. Another
process of the machine that learns from the metadata store that node N provides a page at slot
S reads N's descriptor, maps N's L2 file (the same physical memory: no copy) and reads slot S.

A reader trusts a descriptor only when it is a regular file of its own user, named by and
naming a live process of that user, whose L2 file is that process's own in the shared-memory
directory. Descriptors are named like the data plane's other shared files (`flowrt-mem-PID-...`), so the
sweep that removes a dead process's files (flowrt.memory.slab.sweep) removes its descriptors
too. A node on another machine has no descriptor here: `find` answers None and the reader
recomputes (moving pages between machines is not this module's job).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from flowrt.memory import slab
from flowrt.params.layout import KVLayout, LayoutError
from flowrt.params.tiers import HostTier

VERSION = 1


def node_digest(deployment: str, node: str) -> str:
    return hashlib.sha256(f"{deployment}\n{node}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Descriptor:
    version: int
    deployment: str
    node: str
    layout_id: str
    host_path: str
    host_slots: int
    pid: int

    @classmethod
    def parse(cls, text: str) -> Descriptor | None:
        """The descriptor in `text`, or None for anything malformed (never trusted blindly)."""
        try:
            data = json.loads(text)
            descriptor = cls(
                int(data["version"]),
                str(data["deployment"]),
                str(data["node"]),
                str(data["layout_id"]),
                str(data["host_path"]),
                int(data["host_slots"]),
                int(data["pid"]),
            )
        except (ValueError, KeyError, TypeError):
            return None
        if descriptor.version != VERSION or descriptor.host_slots < 1:
            return None
        return descriptor


def _read_own_file(path: Path, limit: int = 4096) -> str | None:
    """The text of `path` if it is a small regular file of this user (never blocks on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size > limit:
            return None
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return False  # another user's process (or no valid pid): not a peer of ours
    return pid > 0


def announce(deployment: str, node: str, layout: KVLayout, host: HostTier) -> Path:
    """Write this pool's descriptor (atomically: readers never see half of one); returns its path."""
    directory = slab.shm_dir()
    path = directory / f"{slab.PREFIX}{os.getpid()}-kvnode-{node_digest(deployment, node)}"
    text = json.dumps(
        {
            "version": VERSION,
            "deployment": deployment,
            "node": node,
            "layout_id": layout.layout_id(),
            "host_path": str(host.path),
            "host_slots": host.slots,
            "pid": os.getpid(),
        },
        sort_keys=True,
    )
    scratch = path.with_name(path.name + ".new")
    scratch.write_text(text, encoding="utf-8")
    os.replace(scratch, path)
    return path


def withdraw(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


class Peers:
    """The host tiers of other pools of this machine, mapped on first use and kept mapped."""

    def __init__(self, deployment: str, layout: KVLayout) -> None:
        self.deployment = deployment
        self.layout = layout
        self._mapped: dict[str, HostTier] = {}

    def find(self, node: str) -> HostTier | None:
        """Node `node`'s L2 pages mapped here, or None (another machine, gone, another layout)."""
        tier = self._mapped.get(node)
        if tier is not None:
            if Path(tier.path).exists():
                return tier
            self.forget(node)
        descriptor = self._read(node)
        if descriptor is None:
            return None
        try:
            tier = HostTier.attach(descriptor.host_path, self.layout, descriptor.host_slots)
        except (LayoutError, OSError):
            return None
        self._mapped[node] = tier
        return tier

    def _read(self, node: str) -> Descriptor | None:
        """The live descriptor of `node`: a regular file of this user, naming a live process of
        this user and that process's own L2 file (anything else is ignored, never trusted)."""
        pattern = f"{slab.PREFIX}*-kvnode-{node_digest(self.deployment, node)}"
        for path in sorted(slab.shm_dir().glob(pattern)):
            descriptor = Descriptor.parse(_read_own_file(path) or "")
            if (
                descriptor is None
                or descriptor.deployment != self.deployment
                or descriptor.node != node
                or descriptor.layout_id != self.layout.layout_id()
                or not path.name.startswith(f"{slab.PREFIX}{descriptor.pid}-")
                or not _alive(descriptor.pid)
            ):
                continue
            host = Path(descriptor.host_path)
            if host.parent != slab.shm_dir() or not host.name.startswith(f"{slab.PREFIX}{descriptor.pid}-"):
                continue
            try:
                info = host.lstat()
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
                return descriptor
        return None

    def forget(self, node: str) -> None:
        tier = self._mapped.pop(node, None)
        if tier is not None:
            tier.close()

    def close(self) -> None:
        for node in list(self._mapped):
            self.forget(node)

    def statistics(self) -> dict:
        return {"mapped_peers": len(self._mapped)}
