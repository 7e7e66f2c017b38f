"""The conversion between the device's NHD block stacks and the flat page-major layout of L2/L3.

On L1 a parameter is one block stack per (sub, slice) chunk: a tensor of shape
(slots, page_tokens, heads, head_dim), the layout attention kernels read. On L2 and L3 a page is
`page_bytes` contiguous bytes, its chunks in `layout.chunks()` order. As tensors here:

- `stacks`: the block stacks in `layout.chunks()` order, all of one shape (S, T, H, D) and dtype;
- `flat`: the flat pages viewed in that dtype, shape (P, chunks, T, H, D) (`FlatTier.typed`).

`stacks_to_flat` gathers pages out of the stacks into flat slots, `flat_to_stacks` scatters flat
slots back into the stacks: for every i and chunk c, flat[flat_slots[i], c] <-> stacks[c][stack_slots[i]].

The PyTorch implementation below is the specification and what runs on a CPU: one vectorised
copy per chunk (a slice when the slots are consecutive, index_select / index_copy_ otherwise),
never a Python loop over pages, on the tensors viewed as integers of the element's size, so
bits move unchanged whatever the dtype. The slots written (flat slots when gathering, stack
slots when scattering) must be distinct. Where the tensors are on CUDA, the kernel of
cuda/kv_layout.cu does the same in one launch for all (page, chunk) pairs, copying bytes
(16-byte vectors where everything is aligned). It is built the first time it is needed, with
torch.utils.cpp_extension, and only where torch.cuda.is_available(); `backend="torch"` forces
the specification, `backend="cuda"` the kernel (an error where it cannot be had).

Where the kernel's sources are: the top-level cuda/ directory of the repository (DESIGN §2),
which flowrt/params/cuda links to, as flowc/grammars links to grammars/, and pyproject.toml
ships as package data of flowrt. So an installed wheel, which has no source tree, finds them
beside this module, and a checkout finds them through the link: one copy of the sources, one
place to look.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowrt.params.layout import LayoutError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SOURCES = Path(__file__).resolve().parent / "cuda"  # -> the repository's cuda/ (see above)
KERNEL_FILES = ("kv_layout.cpp", "kv_layout.cu")
EXTENSION_NAME = "flowrt_kv_layout"
BACKENDS = ("auto", "torch", "cuda")

Slots = Sequence[int] | range


# ── the specification (PyTorch) ──


def stacks_to_flat(
    stacks: Sequence[torch.Tensor], stack_slots: Slots, flat: torch.Tensor, flat_slots: Slots, *, backend: str = "auto"
) -> None:
    """flat[flat_slots[i], c] = stacks[c][stack_slots[i]], for every i and every chunk c."""
    plan = _Plan(stacks, stack_slots, flat, flat_slots)
    _distinct("flat", plan.flat_slots)
    if _use_kernel(plan, backend):
        _kernel().stacks_to_flat(list(stacks), plan.stack_index(), flat, plan.flat_index())
        return
    flat = as_bits(flat)
    for chunk, stack in enumerate(map(as_bits, stacks)):
        source = stack[plan.stack_range] if plan.stack_range is not None else stack.index_select(0, plan.stack_index())
        target = flat[:, chunk]
        if plan.flat_range is not None:
            target[plan.flat_range].copy_(source)
        else:
            target.index_copy_(0, plan.flat_index(), source)


def flat_to_stacks(
    flat: torch.Tensor, flat_slots: Slots, stacks: Sequence[torch.Tensor], stack_slots: Slots, *, backend: str = "auto"
) -> None:
    """stacks[c][stack_slots[i]] = flat[flat_slots[i], c], for every i and every chunk c."""
    plan = _Plan(stacks, stack_slots, flat, flat_slots)
    _distinct("stack", plan.stack_slots)
    if _use_kernel(plan, backend):
        _kernel().flat_to_stacks(flat, plan.flat_index(), list(stacks), plan.stack_index())
        return
    flat = as_bits(flat)
    for chunk, stack in enumerate(map(as_bits, stacks)):
        column = flat[:, chunk]
        source = column[plan.flat_range] if plan.flat_range is not None else column.index_select(0, plan.flat_index())
        if plan.stack_range is not None:
            stack[plan.stack_range].copy_(source)
        else:
            stack.index_copy_(0, plan.stack_index(), source)


def as_bits(tensor: torch.Tensor) -> torch.Tensor:
    """The same memory viewed as integers of the element's size (zero-copy): copies then move
    bits, never values, and work for every dtype (torch has no index_copy_ for float8 on CPU)."""
    import torch

    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor if tensor.dtype == bits else tensor.view(bits)


class _Plan:
    """The checked arguments of one conversion: slot ranges where consecutive, else indices."""

    def __init__(self, stacks: Sequence[torch.Tensor], stack_slots: Slots, flat: torch.Tensor, flat_slots: Slots):
        if not stacks:
            raise LayoutError("a conversion needs at least one block stack")
        first = stacks[0]
        if first.dim() != 4:
            raise LayoutError(f"a block stack is (slots, page_tokens, heads, head_dim), not of shape {tuple(first.shape)}")
        for stack in stacks:
            if stack.shape != first.shape or stack.dtype != first.dtype or stack.device != first.device:
                raise LayoutError(
                    f"the block stacks differ: {tuple(stack.shape)} {stack.dtype} on {stack.device} beside "
                    f"{tuple(first.shape)} {first.dtype} on {first.device}"
                )
        expected = (len(stacks), *first.shape[1:])
        if flat.dim() != 5 or tuple(flat.shape[1:]) != expected or flat.dtype != first.dtype or flat.device != first.device:
            raise LayoutError(
                f"the flat pages must be (slots, {', '.join(map(str, expected))}) of {first.dtype} on {first.device}, "
                f"not {tuple(flat.shape)} of {flat.dtype} on {flat.device}"
            )
        self.stacks, self.flat = stacks, flat
        self.stack_slots = _slot_list("block stacks", stack_slots, first.shape[0])
        self.flat_slots = _slot_list("flat pages", flat_slots, flat.shape[0])
        if len(self.stack_slots) != len(self.flat_slots):
            raise LayoutError(f"{len(self.stack_slots)} stack slots but {len(self.flat_slots)} flat slots: one for one")
        self.stack_range = _as_range(self.stack_slots)
        self.flat_range = _as_range(self.flat_slots)
        self.pages = len(self.stack_slots)
        self._indices: dict[str, torch.Tensor] = {}

    def stack_index(self) -> torch.Tensor:
        return self._index("stack", self.stack_slots, self.stacks[0].device)

    def flat_index(self) -> torch.Tensor:
        return self._index("flat", self.flat_slots, self.flat.device)

    def _index(self, key: str, slots: Sequence[int], device: Any) -> torch.Tensor:
        if key not in self._indices:
            import torch

            self._indices[key] = torch.as_tensor(slots, dtype=torch.int64).to(device, non_blocking=True)
        return self._indices[key]


def _slot_list(what: str, slots: Slots, count: int) -> Sequence[int]:
    """The slots as ints, each checked against 0..count-1 (a range is checked by its ends)."""
    if isinstance(slots, range):
        if len(slots) and (min(slots[0], slots[-1]) < 0 or max(slots[0], slots[-1]) >= count):
            raise LayoutError(f"slots {slots} are outside the {what}' slots 0..{count - 1}")
        return slots
    if hasattr(slots, "tolist"):  # a tensor or an array
        slots = slots.tolist()
    values = [operator.index(s) for s in slots]
    if values and (min(values) < 0 or max(values) >= count):
        bad = next(s for s in values if not 0 <= s < count)
        raise LayoutError(f"slot {bad} is outside the {what}' slots 0..{count - 1}")
    return values


def _distinct(what: str, slots: Sequence[int]) -> None:
    if not isinstance(slots, range) and len(set(slots)) != len(slots):
        raise LayoutError(f"a {what} slot is written twice in one conversion: {list(slots)}")


def _as_range(slots: Sequence[int]) -> slice | None:
    """slice(a, a + n) when the slots are a, a+1, ..., a+n-1 (n >= 1); else None."""
    if isinstance(slots, range):
        return slice(slots.start, slots.stop) if slots.step == 1 and len(slots) else None
    if not slots:
        return None
    start = slots[0]
    if slots[-1] - start != len(slots) - 1:
        return None
    if all(b - a == 1 for a, b in zip(slots, slots[1:], strict=False)):
        return slice(start, start + len(slots))
    return None


# ── the CUDA kernel ──

_lock = threading.Lock()
_loaded: dict[str, Any] = {}  # "module" -> the extension, or "error" -> why there is none


def kernel_sources() -> list[Path]:
    """The kernel's source files (the binding first), wherever this flowrt is installed."""
    return [SOURCES / name for name in KERNEL_FILES]


def kernel_status() -> str:
    """Why the conversion runs where it does: 'built', 'not built yet', or why it cannot be."""
    if "module" in _loaded:
        return "built"
    if "error" in _loaded:
        return _loaded["error"]
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is false)"
    return "not built yet"


def _use_kernel(plan: _Plan, backend: str) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    if backend == "torch" or plan.pages == 0:
        return False
    eligible = plan.flat.is_cuda and plan.flat.is_contiguous() and all(s.is_contiguous() for s in plan.stacks)
    if backend == "cuda":
        if not eligible:
            raise LayoutError("the CUDA conversion needs contiguous stacks and flat pages on one CUDA device")
        if _kernel() is None:
            raise LayoutError(f"the CUDA conversion kernel is not available: {kernel_status()}")
        return True
    return eligible and _kernel() is not None


def _kernel() -> Any:
    """The built extension, building it the first time; None (logged once) where it cannot be."""
    if "module" in _loaded or "error" in _loaded:
        return _loaded.get("module")
    with _lock:
        if "module" in _loaded or "error" in _loaded:
            return _loaded.get("module")
        try:
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError("no CUDA device (torch.cuda.is_available() is false)")
            from torch.utils.cpp_extension import load

            sources = kernel_sources()
            missing = [str(p) for p in sources if not p.is_file()]
            if missing:
                raise RuntimeError(f"the kernel's sources are missing: {', '.join(missing)}")
            _loaded["module"] = load(
                name=EXTENSION_NAME,
                sources=[str(p) for p in sources],
                extra_include_paths=[str(SOURCES)],
                extra_cflags=["-O3"],
                extra_cuda_cflags=["-O3"],
                verbose=False,
            )
        except Exception as error:  # noqa: BLE001 - the specification runs instead, and says why
            _loaded["error"] = f"the CUDA kernel could not be built: {error}"
            log.warning("flowrt.params: %s; KV layout conversion runs in PyTorch", _loaded["error"])
    return _loaded.get("module")
