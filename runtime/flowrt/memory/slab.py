"""Shared-memory files: the Tmp Buffer Pool's slab and the segments of shared weights.

A slab is a file in /dev/shm (tmpfs: RAM, never disk), 0600, named after the manager's PID so
that files of a manager killed with -9 are found and removed by the next one (`sweep`).
Processes map it by path: the whole slab shared (`Mapping`), to write what they send, or one
block at a time privately (`private_view`), to read what they receive: a private mapping is
copy-on-write, so a consumer that writes into a received tensor changes its own pages and
never another consumer's. Pages are backed on first touch; `prefault` touches them up front
when a deployment would rather fail at start than at the first large tensor.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import tempfile
from pathlib import Path

PREFIX = "flowrt-mem-"
PAGE = mmap.PAGESIZE


def shm_dir() -> Path:
    override = os.environ.get("FLOWRT_SHM_DIR")
    if override:
        return Path(override)
    return Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())


def create(kind: str, nbytes: int, *, prefault: bool = False) -> Path:
    """A new shared file of `nbytes` (rounded up to a page) for `kind` ("slab", "w"...)."""
    directory = shm_dir()
    sweep(directory)
    path = directory / f"{PREFIX}{os.getpid()}-{kind}-{secrets.token_hex(6)}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        size = -(-nbytes // PAGE) * PAGE
        if prefault:
            os.posix_fallocate(fd, 0, size)  # tmpfs: reserves the RAM now (ENOSPC here, not later)
        else:
            os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    return path


def remove(path: str | Path) -> None:
    with contextlib.suppress(OSError):
        Path(path).unlink()


def sweep(directory: Path) -> None:
    """Remove this user's shared files whose manager process is gone."""
    from flowrt.transport.sockets import alive

    try:
        entries = list(directory.glob(f"{PREFIX}*"))
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(PREFIX) :].split("-")[0]
        with contextlib.suppress(OSError):
            if pid.isdigit() and entry.stat().st_uid == os.getuid() and not alive(int(pid)):
                entry.unlink()


class Reservation:
    """Which pages of a slab tmpfs has backed. A block's pages are reserved (posix_fallocate)
    when the block is first handed out, so a full /dev/shm (a container's is often 64 MiB) is an
    allocation's error instead of a SIGBUS in the process that writes the page; a range
    reserved once stays reserved (the file is never punched), so reuse costs one lookup."""

    def __init__(self, path: str | Path, granule: int, *, reserved: bool = False):
        self.fd = os.open(path, os.O_RDWR)
        self.granule = granule
        granules = -(-os.fstat(self.fd).st_size // granule)
        self.done = bytearray(b"\x01" if reserved else b"\x00") * granules

    def reserve(self, offset: int, size: int) -> str:
        """Back [offset, offset+size) now; "" when done, else why it cannot be (for the user)."""
        first, end = offset // self.granule, -(-(offset + size) // self.granule)
        if self.done.find(0, first, end) == -1:
            return ""
        try:
            os.posix_fallocate(self.fd, offset, size)
        except OSError as error:
            return (
                f"the shared-memory file system {shm_dir()} has no room for {size} more bytes ({error.strerror}): "
                "free or enlarge it (docker run --shm-size), or give a smaller pool (--pool-mb)"
            )
        self.done[first:end] = b"\x01" * (end - first)
        return ""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class Mapping:
    """One process's shared mapping of a whole file, and the file kept open for private views."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self.fd = os.open(self.path, os.O_RDWR)
        self.size = os.fstat(self.fd).st_size
        self.map = mmap.mmap(self.fd, self.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.address = _address(self.map)

    def private_view(self, offset: int, length: int) -> mmap.mmap:
        """A copy-on-write mapping of [offset, offset+length) (offset page-aligned)."""
        return mmap.mmap(self.fd, length, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # tensors still view it: the OS unmaps at exit
            self.map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def address_of(buffer: mmap.mmap) -> int:
    return _address(buffer)


def _address(buffer: mmap.mmap) -> int:
    import ctypes

    view = (ctypes.c_char * 1).from_buffer(buffer)  # a pointer to its first byte, without copying
    try:
        return ctypes.addressof(view)
    finally:
        del view
