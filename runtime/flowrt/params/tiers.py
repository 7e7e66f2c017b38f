"""The physical pages of one parameter layout on each tier, and the copies between tiers.

- `DeviceTier` (L1): one block stack per (sub, slice) chunk, a tensor of shape
  (slots, page_tokens, heads, head_dim) on the role's device (the NHD layout attention reads).
- `HostTier` (L2): `slots * page_bytes` flat page-major bytes in a shared-memory file of
  /dev/shm (flowrt.memory.slab): the creator makes it, any process of the machine attaches to
  it by path and maps the same pages (no copy), the creator removes it.
- `DiskTier` (L3): the same flat page-major bytes in a file on local disk, memory-mapped;
  its pages persist across close and reopen.

Every tier gives zero-copy views (`view`) over the Cartesian product of sub and slice names for
one slot, bounds-checked. The mapped tiers (L2, L3) also say which page each slot holds: a
*label* per slot after the pages (`mapped_bytes`), the page's hash and a sequence number, odd
while the owner rewrites the slot (a seqlock). The owner `unlabel`s slots before writing them and
`label`s them after; a reader, in this process or another, asks `holds(slot, key)` before using a
slot and `version(slot)` after copying it, so a slot that holds another page (metadata that lied,
a slot reused meanwhile) is a miss, never a wrong page. `copy_slots` copies pages between any two tiers (or within one): with
`coalesce`, each run where the source slots and the destination slots are both consecutive
moves as one segment (FlowKV): one copy of contiguous bytes between flat tiers, one call of the
layout conversion (flowrt.params.convert) between L1 and a flat tier. `CopyStats.segments`
counts those copies: the copies per transfer.

torch is needed to build a tier (the `torch` extra); this module imports it when first used.
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowrt.memory import slab
from flowrt.params import convert
from flowrt.params.layout import KVLayout, LayoutError

if TYPE_CHECKING:
    import torch

DISK_SUFFIX = ".kvpages"
LABEL_BYTES = 32  # per slot: the sequence number (int64), the page's 16-byte hash, 8 spare bytes
LABEL_ALIGN = 64


def labels_offset(layout: KVLayout, slots: int) -> int:
    """Where the labels of a mapped tier of `slots` pages begin (after the pages, aligned)."""
    return -(-slots * layout.page_bytes // LABEL_ALIGN) * LABEL_ALIGN


def mapped_bytes(layout: KVLayout, slots: int) -> int:
    """The size of a mapped tier's file: its pages, then one label per slot."""
    return labels_offset(layout, slots) + slots * LABEL_BYTES


def page_label(key: str) -> bytes:
    """The 16 bytes a slot holding page `key` is labelled with: the page hash itself (32 hex
    digits, flowrt.compute.hashing), or a BLAKE2b digest of any other key."""
    if len(key) == 32:
        with contextlib.suppress(ValueError):
            return bytes.fromhex(key)
    return hashlib.blake2b(key.encode(), digest_size=16).digest()


def _torch() -> Any:
    try:
        import torch
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ImportError("flowrt.params tiers need torch: pip install 'flowc[torch]'") from error
    return torch


def _dtype(layout: KVLayout) -> torch.dtype:
    return getattr(_torch(), layout.torch_dtype)


@dataclass(frozen=True)
class CopyStats:
    """What one `copy_slots` moved: how many copies (segments) and how many bytes."""

    segments: int = 0
    bytes: int = 0

    def __add__(self, other: CopyStats) -> CopyStats:
        return CopyStats(self.segments + other.segments, self.bytes + other.bytes)


def check_slot_count(kind: str, layout: KVLayout, slots: object) -> None:
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        raise LayoutError(f"the {kind} tier of `{layout.name}` needs a whole number of slots >= 1, not {slots!r}")


class Tier:
    """What every tier has: its layout, its number of slots, checked coordinates and views."""

    kind = ""  # one of layout.TIERS

    def __init__(self, layout: KVLayout, slots: int):
        check_slot_count(self.kind, layout, slots)
        self.layout = layout
        self.slots = slots
        self._chunk_index = {pair: i for i, pair in enumerate(layout.chunks())}

    @property
    def nbytes(self) -> int:
        return self.slots * self.layout.page_bytes

    def describe(self) -> str:
        return f"the {self.kind} tier of `{self.layout.name}` (slots 0..{self.slots - 1})"

    def check_slot(self, slot: int) -> int:
        if isinstance(slot, bool):
            raise LayoutError(f"{self.describe()}: a slot is a whole number, not {slot!r}")
        try:
            value = operator.index(slot)
        except TypeError:
            raise LayoutError(f"{self.describe()}: a slot is a whole number, not {slot!r}") from None
        if not 0 <= value < self.slots:
            raise LayoutError(f"{self.describe()}: slot {value} is outside the range 0..{self.slots - 1}")
        return value

    def check_slots(self, slots: Iterable[int]) -> list[int]:
        if hasattr(slots, "tolist"):
            slots = slots.tolist()
        values = list(slots) if isinstance(slots, range) else [operator.index(s) for s in slots]
        if values and (min(values) < 0 or max(values) >= self.slots):
            bad = next(s for s in values if not 0 <= s < self.slots)
            raise LayoutError(f"{self.describe()}: slot {bad} is outside the range 0..{self.slots - 1}")
        return values

    def view(self, sub_names: Iterable[str] | None, slot: int, slice_names: Iterable[str] | None = None) -> list[torch.Tensor]:
        """Zero-copy views of shape (page_tokens, heads, head_dim), one per (sub, slice) of the
        Cartesian product, sub-major (None: every sub, every slice): writes show in the tier."""
        slot = self.check_slot(slot)
        pairs = self.layout.cartesian(sub_names, slice_names)
        return [self._chunk(self._chunk_index[pair], slot) for pair in pairs]

    def _chunk(self, chunk: int, slot: int) -> torch.Tensor:
        raise NotImplementedError


class DeviceTier(Tier):
    """L1: one block stack (slots, page_tokens, heads, head_dim) per chunk, on `device`."""

    kind = "device"

    def __init__(self, layout: KVLayout, slots: int, device: Any = "cpu"):
        super().__init__(layout, slots)
        torch = _torch()
        self.device = torch.device(device)
        dtype = _dtype(layout)
        self.stacks: list[torch.Tensor] = [
            torch.zeros((slots, *layout.item_shape), dtype=dtype, device=self.device) for _ in layout.chunks()
        ]

    def stack(self, sub: str, slice_: str) -> torch.Tensor:
        """The block stack of one chunk: what an attention kernel indexes by slot."""
        return self.stacks[self.layout.chunk_index(sub, slice_)]

    def _chunk(self, chunk: int, slot: int) -> torch.Tensor:
        return self.stacks[chunk][slot]

    def close(self) -> None:
        self.stacks = []


class FlatTier(Tier):
    """L2 and L3: `slots * page_bytes` flat page-major bytes (a memory-mapped file for both)."""

    kind = "flat"

    def __init__(self, layout: KVLayout, slots: int, whole: torch.Tensor):
        super().__init__(layout, slots)
        self.bytes: torch.Tensor = whole.view(slots, layout.page_bytes)  # (slots, page_bytes), the pages' bytes
        self.typed: torch.Tensor = whole.view(_dtype(layout)).view(slots, len(layout.chunks()), *layout.item_shape)

    def page(self, slot: int) -> torch.Tensor:
        """The bytes of one page (page_bytes uint8, zero-copy): what goes on the wire or disk."""
        return self.bytes[self.check_slot(slot)]

    def pages(self, start: int, stop: int) -> torch.Tensor:
        """The bytes of slots start..stop-1, one contiguous segment (zero-copy)."""
        if not 0 <= start < stop <= self.slots:
            raise LayoutError(f"{self.describe()}: slots {start}..{stop - 1} are not a run inside 0..{self.slots - 1}")
        return self.bytes[start:stop]

    def _chunk(self, chunk: int, slot: int) -> torch.Tensor:
        return self.typed[slot, chunk]

    def close(self) -> None:
        self.bytes = self.typed = None  # type: ignore[assignment]

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MappedTier(FlatTier):
    """A flat tier over a file mapped shared: every process that maps it sees the same pages,
    and the same labels (which page each slot holds, see the module's docstring)."""

    def __init__(self, layout: KVLayout, slots: int, path: str | Path):
        check_slot_count(self.kind, layout, slots)  # before the file is touched
        self.path = Path(path)
        self._mapping: slab.Mapping | None = slab.Mapping(self.path)
        needed = mapped_bytes(layout, slots)
        if self._mapping.size < needed:
            size = self._mapping.size
            self._unmap()
            raise LayoutError(
                f"the {self.kind} tier of `{layout.name}` (slots 0..{slots - 1}): {self.path} holds {size} bytes, "
                f"{needed} are needed"
            )
        torch = _torch()
        super().__init__(layout, slots, torch.frombuffer(self._mapping.map, dtype=torch.uint8, count=slots * layout.page_bytes))
        start = labels_offset(layout, slots)
        self._labels: memoryview | None = memoryview(self._mapping.map)[start : start + slots * LABEL_BYTES]
        self._sequence: memoryview | None = self._labels.cast("q")  # slot s's number at [s * LABEL_BYTES // 8]

    def unlabel(self, slots: Iterable[int]) -> None:
        """The owner is about to write `slots`: until `label`, they hold no page for any reader."""
        assert self._sequence is not None
        step = LABEL_BYTES // 8
        for slot in self.check_slots(slots):
            number = self._sequence[slot * step]
            if not number & 1:
                self._sequence[slot * step] = number + 1

    def label(self, slots: Iterable[int], keys: Sequence[str]) -> None:
        """The owner wrote page keys[i] into slots[i] (after `unlabel`): readers may use them."""
        assert self._labels is not None and self._sequence is not None
        step = LABEL_BYTES // 8
        for slot, key in zip(self.check_slots(slots), keys, strict=True):
            at = slot * LABEL_BYTES
            self._labels[at + 8 : at + 24] = page_label(key)
            number = self._sequence[slot * step]
            self._sequence[slot * step] = number + 1 if number & 1 else number + 2

    def holds(self, slot: int, key: str) -> int | None:
        """The slot's version if it holds page `key`, written whole (not being rewritten), else
        None. A reader that copies the slot compares `version(slot)` with it afterwards."""
        if self._sequence is None or self._labels is None:
            return None
        slot = self.check_slot(slot)
        number = self._sequence[slot * (LABEL_BYTES // 8)]
        if number == 0 or number & 1:
            return None  # never labelled, or being written
        at = slot * LABEL_BYTES
        if self._labels[at + 8 : at + 24] != page_label(key):
            return None
        return number if self._sequence[slot * (LABEL_BYTES // 8)] == number else None

    def version(self, slot: int) -> int | None:
        """The slot's sequence number now (None once unmapped)."""
        if self._sequence is None:
            return None
        return self._sequence[self.check_slot(slot) * (LABEL_BYTES // 8)]

    def _unmap(self) -> None:
        self.bytes = self.typed = None  # type: ignore[assignment]
        for view in (getattr(self, "_sequence", None), getattr(self, "_labels", None)):
            if view is not None:
                view.release()
        self._sequence = self._labels = None
        if self._mapping is not None:
            self._mapping.close()  # views still held keep their pages mapped until they go
            self._mapping = None

    def close(self) -> None:
        self._unmap()


class HostTier(MappedTier):
    """L2: flat pages in a shared-memory file; `create` in one process, `attach` in the others."""

    kind = "host"

    def __init__(self, layout: KVLayout, slots: int, path: str | Path, *, owner: bool):
        super().__init__(layout, slots, path)
        self.owner = owner

    @classmethod
    def create(cls, layout: KVLayout, slots: int, *, prefault: bool = False) -> HostTier:
        """A new shared file (/dev/shm/flowrt-mem-PID-kv-LAYOUTID-...) of `slots` pages, zeroed."""
        check_slot_count(cls.kind, layout, slots)
        path = slab.create(f"kv-{layout.layout_id()}", mapped_bytes(layout, slots), prefault=prefault)
        try:
            return cls(layout, slots, path, owner=True)
        except BaseException:
            slab.remove(path)
            raise

    @classmethod
    def attach(cls, path: str | Path, layout: KVLayout, slots: int) -> HostTier:
        """Map the pages another process created (the same physical memory: no copy)."""
        if not Path(path).is_file():
            raise LayoutError(f"the host tier of `{layout.name}`: no shared file {path}")
        return cls(layout, slots, path, owner=False)

    def close(self) -> None:
        """Unmap; the creator also removes the file (processes still attached keep their pages)."""
        self._unmap()
        if self.owner:
            slab.remove(self.path)
            self.owner = False


class DiskTier(MappedTier):
    """L3: flat pages in DIRECTORY/NAME-LAYOUTID.kvpages, memory-mapped; reopening keeps them
    (and their labels)."""

    kind = "disk"

    def __init__(self, directory: str | Path, layout: KVLayout, slots: int):
        check_slot_count(self.kind, layout, slots)
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{layout.name}-{layout.layout_id()}{DISK_SUFFIX}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < mapped_bytes(layout, slots):
                os.ftruncate(fd, mapped_bytes(layout, slots))  # sparse: a page costs disk once written
        finally:
            os.close(fd)
        super().__init__(layout, slots, path)

    def flush(self) -> None:
        """Write the dirty pages to the disk now (msync), rather than when the kernel chooses."""
        if self._mapping is not None:
            self._mapping.map.flush()

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self.flush()
        self._unmap()


# ── copies ──


def runs(src_slots: Sequence[int], dst_slots: Sequence[int]) -> list[tuple[int, int, int]]:
    """(src_start, dst_start, length) of each maximal run where both sides are consecutive."""
    found: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(src_slots) + 1):
        if i == len(src_slots) or src_slots[i] != src_slots[i - 1] + 1 or dst_slots[i] != dst_slots[i - 1] + 1:
            found.append((src_slots[start], dst_slots[start], i - start))
            start = i
    return found


def copy_slots(src: Tier, src_slots: Iterable[int], dst: Tier, dst_slots: Iterable[int], *, coalesce: bool = True) -> CopyStats:
    """Copy page src_slots[i] of `src` to page dst_slots[i] of `dst`, for every i, as if every
    page were read before any is written. With `coalesce`, a run of slots consecutive on both
    sides is one segment; without, every page is one. Returns the segments and bytes moved."""
    if src.layout.chunks() != dst.layout.chunks() or not src.layout.same_pages(dst.layout):
        raise LayoutError(
            f"cannot copy pages of layout {src.layout.layout_id()} into layout {dst.layout.layout_id()}: "
            f"the chunks or the page shape differ ({src.describe()}, {dst.describe()})"
        )
    sources, targets = src.check_slots(src_slots), dst.check_slots(dst_slots)
    if len(sources) != len(targets):
        raise LayoutError(f"{len(sources)} source slots but {len(targets)} destination slots: one for one")
    if len(set(targets)) != len(targets):
        raise LayoutError(f"{dst.describe()}: a destination slot appears twice in one copy")
    if not sources:
        return CopyStats()
    segments = runs(sources, targets) if coalesce else list(zip(sources, targets, [1] * len(sources), strict=True))
    if src is dst and set(sources) & set(targets):  # read every page before writing any
        aside, position = _snapshot(src, sources), 0
        for _, dst_start, length in segments:  # a run of sources is a run of positions there
            _copy_run(aside, position, dst, dst_start, length)
            position += length
    else:
        for src_start, dst_start, length in segments:
            _copy_run(src, src_start, dst, dst_start, length)
    return CopyStats(len(segments), len(sources) * src.layout.page_bytes)


def _snapshot(tier: Tier, sources: list[int]) -> Tier:
    """A private tier whose slot i holds page sources[i] of `tier` (a copy, on its device)."""
    torch = _torch()
    if isinstance(tier, DeviceTier):
        aside = DeviceTier(tier.layout, len(sources), tier.device)
        index = torch.as_tensor(sources, dtype=torch.int64, device=tier.device)
        for mine, theirs in zip(aside.stacks, tier.stacks, strict=True):
            torch.index_select(convert.as_bits(theirs), 0, index, out=convert.as_bits(mine))
        return aside
    assert isinstance(tier, FlatTier)
    pages = tier.bytes.index_select(0, torch.as_tensor(sources, dtype=torch.int64))
    return FlatTier(tier.layout, len(sources), pages.view(-1))


def _copy_run(src: Tier, src_start: int, dst: Tier, dst_start: int, length: int) -> None:
    """One segment: `length` consecutive pages from src_start to dst_start."""
    src_range, dst_range = range(src_start, src_start + length), range(dst_start, dst_start + length)
    if isinstance(src, FlatTier) and isinstance(dst, FlatTier):
        dst.bytes[dst_start : dst_start + length].copy_(src.bytes[src_start : src_start + length])
    elif isinstance(src, DeviceTier) and isinstance(dst, FlatTier):
        if src.device.type == "cpu":
            convert.stacks_to_flat(src.stacks, src_range, dst.typed, dst_range)
        else:  # gather on the device, then one copy of the run to the host
            staging = _torch().empty((length, *dst.typed.shape[1:]), dtype=dst.typed.dtype, device=src.device)
            convert.stacks_to_flat(src.stacks, src_range, staging, range(length))
            convert.as_bits(dst.typed[dst_range.start : dst_range.stop]).copy_(convert.as_bits(staging))
    elif isinstance(src, FlatTier) and isinstance(dst, DeviceTier):
        if dst.device.type == "cpu":
            convert.flat_to_stacks(src.typed, src_range, dst.stacks, dst_range)
        else:  # one copy of the run to the device, then scatter there
            run = src.typed[src_range.start : src_range.stop].to(dst.device, non_blocking=True)
            convert.flat_to_stacks(run, range(length), dst.stacks, dst_range)
    else:
        assert isinstance(src, DeviceTier) and isinstance(dst, DeviceTier)
        for theirs, mine in zip(src.stacks, dst.stacks, strict=True):
            convert.as_bits(mine[dst_start : dst_start + length]).copy_(convert.as_bits(theirs[src_start : src_start + length]))
