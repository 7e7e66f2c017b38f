"""The Tmp Buffer Pool's bookkeeping: which byte ranges of one preallocated slab are handed
out, who holds references on them, and the LRU of finished blocks kept for reuse by key.

It knows nothing of shared memory, sockets or torch (flowrt.memory.slab maps the slab; the
manager answers requests with this): offsets and sizes only, so it can be tested against a
simple model on its own.

Blocks come from a binary buddy allocator: a request gets the smallest power-of-two block of at
least `min_block` bytes holding it, split off a larger free block; a reclaimed block merges
with its buddy while the buddy is free. A slab whose size is not a power of two is covered by
the largest power-of-two top-level blocks that fit (96 KiB: 64 + 32), each its own buddy tree.
Offsets are multiples of `min_block` (page-aligned for mmap).

References are counted per holder, a pair (call, process) with "" for "none", so a call's
end or a process's death drops exactly what it held. A block at 0 refs is reclaimed, unless it
is cached: then it stays allocated, idle, in the LRU, until a hit borrows it again (ref + 1,
still in the LRU) or space is needed (eviction takes idle blocks only, oldest first).
`find_alloc_by_ptr` finds the live block holding any byte offset by binary search over the
sorted block starts.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

Holder = tuple[str, str]  # (call, process)


class PoolError(Exception):
    """A request the pool refuses."""


class TooLarge(PoolError):
    pass


class PoolExhausted(PoolError):
    pass


class UnknownBlock(PoolError):
    pass


@dataclass(slots=True)
class Block:
    id: int
    offset: int
    size: int  # the power-of-two size handed out
    nbytes: int  # what was asked
    refs: dict[Holder, int] = field(default_factory=dict)
    cache_key: str | None = None

    @property
    def ref(self) -> int:
        return sum(self.refs.values())


def _size(n: int) -> str:
    """Bytes for a person: the largest binary unit that leaves at least 1, one decimal at most."""
    value, unit = float(n), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f}".removesuffix(".0") + f" {unit}"


class BufferPool:
    def __init__(self, capacity: int, min_block: int = 4096, first_id: int = 1):
        if min_block <= 0 or min_block & (min_block - 1):
            raise PoolError(f"the smallest block must be a power of two, not {min_block}")
        self.min_block = min_block
        self.capacity = capacity - capacity % min_block
        if self.capacity <= 0:
            raise PoolError(f"a pool of {capacity} bytes holds no block of {min_block}")
        self.free_lists: dict[int, set[int]] = defaultdict(set)  # block size -> free offsets
        self.roots: list[tuple[int, int]] = []  # (offset, size) of each top-level block
        offset, rest = 0, self.capacity
        while rest >= min_block:
            size = 1 << (rest.bit_length() - 1)
            self.roots.append((offset, size))
            self.free_lists[size].add(offset)
            offset += size
            rest -= size
        self.largest = self.roots[0][1]
        self.live: dict[int, Block] = {}  # id -> block
        self.by_offset: dict[int, Block] = {}
        self.starts: list[int] = []  # sorted offsets of live blocks
        self.lru: OrderedDict[str, int] = OrderedDict()  # cache key -> block id, oldest first
        self.next_id = first_id  # (a manager starts at a random id: a late free meant for its predecessor finds nothing)
        self.hits = self.misses = self.evictions = self.stale_frees = 0

    # ── the buddy allocator ──

    def _root_of(self, offset: int) -> tuple[int, int]:
        i = bisect.bisect_right(self.roots, (offset, 1 << 62)) - 1
        return self.roots[i]

    def _take(self, size: int) -> int | None:
        """A free block of `size`, splitting a larger one; None if there is none."""
        have = size
        while have <= self.largest and not self.free_lists.get(have):
            have <<= 1
        if have > self.largest:
            return None
        offset = min(self.free_lists[have])  # lowest first: keeps the high end free for large blocks
        self.free_lists[have].discard(offset)
        while have > size:
            have >>= 1
            self.free_lists[have].add(offset + have)  # the upper half stays free
        return offset

    def _give_back(self, offset: int, size: int) -> None:
        root, root_size = self._root_of(offset)
        while size < root_size:
            buddy = root + ((offset - root) ^ size)
            free = self.free_lists.get(size)
            if not free or buddy not in free:
                break
            free.discard(buddy)
            offset = min(offset, buddy)
            size <<= 1
        self.free_lists[size].add(offset)

    def _block_size(self, nbytes: int) -> int:
        return max(self.min_block, 1 << (nbytes - 1).bit_length())

    # ── blocks ──

    def alloc(self, nbytes: int, holder: Holder) -> Block:
        if nbytes <= 0:
            raise PoolError(f"an allocation needs at least one byte, not {nbytes}")
        size = self._block_size(nbytes)
        if size > self.largest:
            raise TooLarge(
                f"a request of {_size(nbytes)} does not fit the Tmp Buffer Pool, whose largest block is {_size(self.largest)}: "
                "raise the pool size (flowc run --pool-mb / FLOWRT_POOL_MB)"
            )
        offset = self._take(size)
        while offset is None and self._evict_one():
            offset = self._take(size)
        if offset is None:
            # Every idle cached block is gone by now, so what is not free is held by someone.
            stats = self.statistics()
            held = sum(b.size for b in self.live.values() if b.refs)
            raise PoolExhausted(
                f"the Tmp Buffer Pool is exhausted: {_size(nbytes)} asked, {_size(stats['bytes_free'])} free "
                f"(largest free block {_size(stats['largest_free'])}), {_size(held)} held by blocks in use; "
                "raise the pool size (flowc run --pool-mb / FLOWRT_POOL_MB)"
            )
        block = Block(self.next_id, offset, size, nbytes, {holder: 1})
        self.next_id += 1
        self.live[block.id] = block
        self.by_offset[offset] = block
        bisect.insort(self.starts, offset)
        return block

    def block(self, block_id: int) -> Block:
        block = self.live.get(block_id)
        if block is None:
            raise UnknownBlock(f"block {block_id} is not in the pool (released already?)")
        return block

    def blocks(self) -> Iterable[Block]:
        return list(self.live.values())

    def add_ref(self, block_id: int, holder: Holder, n: int = 1) -> None:
        _positive(n)
        block = self.block(block_id)
        block.refs[holder] = block.refs.get(holder, 0) + n

    def free(self, block_id: int, holder: Holder, n: int = 1) -> bool:
        """Drop `n` of `holder`'s refs; True if the block was reclaimed. A free of refs the
        holder does not have is ignored (and counted): a late free must never take another's."""
        _positive(n)
        block = self.live.get(block_id)
        held = block.refs.get(holder, 0) if block is not None else 0
        if held <= 0:
            self.stale_frees += 1
            return False
        if held <= n:
            del block.refs[holder]
            if held < n:
                self.stale_frees += 1
        else:
            block.refs[holder] = held - n
        return self._settle(block)

    def _settle(self, block: Block) -> bool:
        if block.refs or block.cache_key is not None:
            return False
        self._reclaim(block)
        return True

    def _reclaim(self, block: Block) -> None:
        del self.live[block.id]
        del self.by_offset[block.offset]
        i = bisect.bisect_left(self.starts, block.offset)
        del self.starts[i]
        if block.cache_key is not None and self.lru.get(block.cache_key) == block.id:
            del self.lru[block.cache_key]
        self._give_back(block.offset, block.size)

    def release_call(self, call: str) -> int:
        """Drop every ref held under `call`; how many. "" names no call, so it releases nothing
        (rather than every ref taken outside a call)."""
        return self._release(lambda holder: holder[0] == call) if call else 0

    def release_process(self, process: str) -> int:
        """Drop every ref held by `process`; how many ("" releases nothing, as for calls)."""
        return self._release(lambda holder: holder[1] == process) if process else 0

    def _release(self, matches) -> int:
        dropped = 0
        for block in list(self.live.values()):
            mine = [holder for holder in block.refs if matches(holder)]
            if mine:
                for holder in mine:
                    dropped += block.refs.pop(holder)
                self._settle(block)
        return dropped

    # ── the LRU of cached blocks ──

    def cache(self, block_id: int, key: str) -> None:
        block = self.block(block_id)
        old_id = self.lru.pop(key, None)
        if old_id is not None and old_id != block_id:
            old = self.live[old_id]
            old.cache_key = None
            self._settle(old)  # idle: reclaimed; still referenced: it just loses its key
        if block.cache_key is not None and block.cache_key != key:
            self.lru.pop(block.cache_key, None)
        block.cache_key = key
        self.lru[key] = block_id

    def lookup(self, key: str, holder: Holder) -> Block | None:
        block_id = self.lru.get(key)
        if block_id is None:
            self.misses += 1
            return None
        self.hits += 1
        self.lru.move_to_end(key)  # borrowed, not popped: others may borrow it too
        self.add_ref(block_id, holder)
        return self.live[block_id]

    def _evict_one(self) -> int:
        """Reclaim the least recently used idle cached block; its size, 0 if none is idle."""
        for key, block_id in self.lru.items():
            block = self.live[block_id]
            if not block.refs:
                del self.lru[key]  # (the loop ends here: deleting while iterating is safe)
                block.cache_key = None
                self._reclaim(block)
                self.evictions += 1
                return block.size
        return 0

    def evict(self, nbytes_needed: int | None = None) -> int:
        """Evict idle cached blocks, oldest first, until `nbytes_needed` bytes came back (all of
        them if None); the bytes reclaimed."""
        reclaimed = 0
        while nbytes_needed is None or reclaimed < nbytes_needed:
            size = self._evict_one()
            if not size:
                break
            reclaimed += size
        return reclaimed

    # ── lookups and statistics ──

    def find_alloc_by_ptr(self, offset: int) -> Block | None:
        i = bisect.bisect_right(self.starts, offset) - 1
        if i < 0:
            return None
        block = self.by_offset[self.starts[i]]
        return block if offset < block.offset + block.size else None

    def statistics(self) -> dict:
        by_call: dict[str, int] = defaultdict(int)
        by_process: dict[str, int] = defaultdict(int)
        for block in self.live.values():
            for (call, process), n in block.refs.items():
                if call:
                    by_call[call] += n
                if process:
                    by_process[process] += n
        allocated = sum(b.size for b in self.live.values())
        stats = {
            "capacity": self.capacity,
            "blocks": len(self.live),
            "idle_cached": sum(1 for b in self.lru.values() if not self.live[b].refs),
            "bytes_allocated": allocated,
            "bytes_requested": sum(b.nbytes for b in self.live.values()),
            "bytes_free": self.capacity - allocated,
            "largest_free": max((size for size, free in self.free_lists.items() if free), default=0),
            "refs": sum(b.ref for b in self.live.values()),
            "refs_by_call": dict(sorted(by_call.items())),
            "refs_by_process": dict(sorted(by_process.items())),
            "lru_hits": self.hits,
            "lru_misses": self.misses,
            "evictions": self.evictions,
            "stale_frees": self.stale_frees,
        }
        return dict(sorted(stats.items()))

    def free_lists_snapshot(self) -> list[tuple[int, int]]:
        """The free blocks as sorted (offset, size) pairs."""
        return sorted((offset, size) for size, free in self.free_lists.items() for offset in free)

    def check(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (the tests call it after every
        step). Explicit raises rather than `assert`: `python -O` must not make it pass."""
        pieces = [(o, s, "free") for s, free in self.free_lists.items() for o in free]
        pieces += [(b.offset, b.size, f"block {b.id}") for b in self.live.values()]
        pieces.sort()
        at = 0
        for offset, size, what in pieces:
            _expect(offset == at, f"gap or overlap at {at}: the next piece ({what}) starts at {offset}")
            _expect(size >= self.min_block and not size & (size - 1), f"{what} at {offset} has a size of {size}")
            root, root_size = self._root_of(offset)
            _expect((offset - root) % size == 0, f"{what} at {offset} of {size} is misaligned in its root at {root}")
            _expect(offset + size <= root + root_size, f"{what} at {offset} of {size} crosses the end of its root")
            at = offset + size
        _expect(at == self.capacity, f"the pieces cover {at} of {self.capacity} bytes")
        for size, free in self.free_lists.items():
            for offset in free:
                root, root_size = self._root_of(offset)
                if size < root_size:
                    buddy = root + ((offset - root) ^ size)
                    _expect(buddy not in free, f"free buddies at {offset} and {buddy} of {size} were not merged")
        _expect(self.starts == sorted(self.by_offset), "the sorted starts disagree with the live blocks")
        _expect(len(self.by_offset) == len(self.live), "blocks by offset and by id differ in number")
        for block in self.live.values():
            _expect(self.by_offset.get(block.offset) is block, f"block {block.id} is missing from the offset index")
            _expect(0 < block.nbytes <= block.size, f"block {block.id} holds {block.nbytes} bytes in {block.size}")
            _expect(block.id < self.next_id, f"block {block.id} has an id not handed out yet")
            _expect(all(n > 0 for n in block.refs.values()), f"block {block.id} has a count that is not positive")
            _expect(block.refs or block.cache_key is not None, f"block {block.id} is live with no ref and no key")
            if block.cache_key is not None:
                _expect(self.lru.get(block.cache_key) == block.id, f"block {block.id}'s key is not in the LRU")
        for key, block_id in self.lru.items():
            _expect(block_id in self.live, f"LRU key {key} names block {block_id}, which is not live")
            _expect(self.live[block_id].cache_key == key, f"LRU key {key} and block {block_id} disagree")


def _positive(n: int) -> None:
    if n < 1:
        raise PoolError(f"a reference count changes by at least 1, not {n}")


def _expect(condition: object, message: str) -> None:
    if not condition:
        raise AssertionError(message)
