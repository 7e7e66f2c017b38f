"""The layout of one global parameter: the contract every layer of the pool shares.

A parameter (a `global NAME: KVCache { ... }` of the .flow file) is paged: a page holds
`page_tokens` tokens, and for each token one item of shape (heads, head_dim) in every
(sub_name, slice_name) pair, e.g. every layer x {k, v}. One (sub, slice) part of one page is a
**chunk** of page_tokens x heads x head_dim elements.

- On L1 (device) the pages are stored as one block stack per (sub, slice): a tensor of shape
  (slots, page_tokens, heads, head_dim), the NHD layout attention kernels read.
- On L2 (host) and L3 (disk) they are stored flat and page-major: slot s is `page_bytes`
  contiguous bytes, its chunks in `chunks()` order (sub-major, then slice), so one page, and one
  run of consecutive slots, is one contiguous segment to copy.

A provider may hold part of a layout only (node A the k slices, node B the v slices): `part`
gives the layout of a subset, with an id of its own. The layout id is the first 16 hex digits
of the SHA-256 of the canonical JSON (`to_json`), the same on every machine.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flowrt.errors import FlowrtError

ITEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3": 1, "int8": 1}
TORCH_DTYPES = {"float8_e4m3": "float8_e4m3fn"}  # the .flow name -> torch's, where they differ
TIERS = ("device", "host", "disk")  # L1, L2, L3


class LayoutError(FlowrtError):
    """A layout that cannot be built, or a coordinate outside it."""


@dataclass(frozen=True)
class KVLayout:
    name: str
    sub_names: tuple[str, ...]
    slice_names: tuple[str, ...]
    page_tokens: int
    heads: int = 1
    head_dim: int = 1
    dtype: str = "float16"

    def __post_init__(self) -> None:
        if not self.sub_names or not self.slice_names:
            raise LayoutError(f"global `{self.name}`: a layout needs at least one sub_name and one slice_name")
        for what, names in (("sub_names", self.sub_names), ("slice_names", self.slice_names)):
            if len(set(names)) != len(names):
                raise LayoutError(f"global `{self.name}`: {what} repeat a name: {list(names)}")
        for what in ("page_tokens", "heads", "head_dim"):
            value = getattr(self, what)
            if not isinstance(value, int) or value < 1:
                raise LayoutError(f"global `{self.name}`: {what} must be a whole number >= 1, not {value!r}")
        if self.dtype not in ITEM_BYTES:
            raise LayoutError(f"global `{self.name}`: dtype {self.dtype!r} is not one of {', '.join(ITEM_BYTES)}")

    # ── sizes ──

    @property
    def item_shape(self) -> tuple[int, int, int]:
        """One chunk's shape: (page_tokens, heads, head_dim)."""
        return (self.page_tokens, self.heads, self.head_dim)

    @property
    def chunk_elements(self) -> int:
        return self.page_tokens * self.heads * self.head_dim

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_elements * ITEM_BYTES[self.dtype]

    @property
    def page_bytes(self) -> int:
        return self.chunk_bytes * len(self.sub_names) * len(self.slice_names)

    @property
    def torch_dtype(self) -> str:
        """The name of the torch dtype (getattr(torch, layout.torch_dtype))."""
        return TORCH_DTYPES.get(self.dtype, self.dtype)

    def pages_in(self, nbytes: int) -> int:
        """How many whole pages `nbytes` hold (a `capacity` setting)."""
        return nbytes // self.page_bytes

    # ── coordinates ──

    def chunks(self) -> list[tuple[str, str]]:
        """Every (sub, slice) pair, in the order of a flat page's chunks."""
        return [(sub, slice_) for sub in self.sub_names for slice_ in self.slice_names]

    def chunk_index(self, sub: str, slice_: str) -> int:
        """Where chunk (sub, slice) lies in a flat page, in chunks."""
        try:
            return self.sub_names.index(sub) * len(self.slice_names) + self.slice_names.index(slice_)
        except ValueError:
            raise LayoutError(
                f"global `{self.name}` has no chunk ({sub!r}, {slice_!r}): its sub_names are {list(self.sub_names)}, "
                f"its slice_names {list(self.slice_names)}"
            ) from None

    def cartesian(
        self, sub_names: Iterable[str] | None = None, slice_names: Iterable[str] | None = None
    ) -> list[tuple[str, str]]:
        """The (sub, slice) pairs of a view, sub-major (None: all of that dimension; one name
        alone: that one), checked."""
        subs = (sub_names,) if isinstance(sub_names, str) else tuple(self.sub_names if sub_names is None else sub_names)
        slices = (
            (slice_names,) if isinstance(slice_names, str) else tuple(self.slice_names if slice_names is None else slice_names)
        )
        pairs = [(sub, slice_) for sub in subs for slice_ in slices]
        for sub, slice_ in pairs:
            self.chunk_index(sub, slice_)
        return pairs

    def part(self, sub_names: Sequence[str] | None = None, slice_names: Sequence[str] | None = None) -> KVLayout:
        """The layout of a provider that holds only these subs and slices (in this layout's order)."""
        subs = tuple(s for s in self.sub_names if sub_names is None or s in sub_names)
        slices = tuple(s for s in self.slice_names if slice_names is None or s in slice_names)
        for given, known, what in ((sub_names, self.sub_names, "sub_names"), (slice_names, self.slice_names, "slice_names")):
            unknown = sorted(set(given or ()) - set(known))
            if unknown:
                raise LayoutError(f"global `{self.name}` has no {what} {unknown}")
        return KVLayout(self.name, subs, slices, self.page_tokens, self.heads, self.head_dim, self.dtype)

    def covers(self, other: KVLayout) -> bool:
        """Whether this layout holds every chunk of `other` (same page shape and dtype)."""
        return (
            self.same_pages(other)
            and set(other.sub_names) <= set(self.sub_names)
            and set(other.slice_names) <= set(self.slice_names)
        )

    def same_pages(self, other: KVLayout) -> bool:
        return (self.name, self.page_tokens, self.heads, self.head_dim, self.dtype) == (
            other.name,
            other.page_tokens,
            other.heads,
            other.head_dim,
            other.dtype,
        )

    # ── identity ──

    def to_json(self) -> str:
        """The canonical JSON of the layout (sorted keys, no spaces): what its id hashes."""
        return json.dumps(
            {
                "name": self.name,
                "sub_names": list(self.sub_names),
                "slice_names": list(self.slice_names),
                "page_tokens": self.page_tokens,
                "heads": self.heads,
                "head_dim": self.head_dim,
                "dtype": self.dtype,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    def layout_id(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, text: str) -> KVLayout:
        data = json.loads(text)
        return cls(
            data["name"],
            tuple(data["sub_names"]),
            tuple(data["slice_names"]),
            data["page_tokens"],
            data["heads"],
            data["head_dim"],
            data["dtype"],
        )

    @classmethod
    def from_global(cls, name: str, settings: Mapping[str, Any]) -> KVLayout:
        """The layout a `global NAME: KVCache { ... }` declares (its settings as the bundle holds
        them: layers, page_tokens, slices, heads, head_dim, dtype). Layers are named "0".."n-1"."""
        layers = int(settings.get("layers", 1))
        return cls(
            name,
            tuple(str(i) for i in range(layers)),
            tuple(settings.get("slices") or ("k", "v")),
            int(settings.get("page_tokens", 16)),
            int(settings.get("heads", 1)),
            int(settings.get("head_dim", 1)),
            str(settings.get("dtype", "float16")),
        )
