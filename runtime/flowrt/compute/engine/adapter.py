"""The engine adapter contract (DESIGN §7, docs/engines.md): what every model engine behind flowrt
implements, and the small typed values that cross it.

The framework owns the KV memory and decides, every step, where each token's K/V lives; the engine
only computes. A **slot id** is token-granular: slot `page * page_tokens + offset` is row `offset`
of page `page` of the bound block stacks (`token_slots` turns page slots into them). For each
request of a step the framework lists the slots of the request's whole context, in order, the new
tokens' slots last; the engine writes K/V only into those new slots and reads only listed ones.

- `EngineSpec` (`describe()`): the model's shape and the KV layout it needs (layers as sub_names,
  k/v as slice_names, kv heads, head_dim, dtype); `kv_layout` makes the params `KVLayout`.
- `StepRequest` / `StepBatch`: one request's part of one forward step, and the step.
- `StepResult`: what a request asked to capture (last-token logits, hidden states), and the
  token sampled for it when the step carried a sampler.
- `EngineAdapter`: the abstract engine: describe, bind_kv, embed, forward, copy_slots,
  read_pages / write_pages, sample (optional: the framework's sampler by default), close.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flowrt.errors import FlowrtError
from flowrt.params.layout import ITEM_BYTES, KVLayout

if TYPE_CHECKING:
    import torch

    from flowrt.compute.engine.sampling import TokenSampler

KV_SLICES = ("k", "v")
CAPTURE_LOGITS = "logits"  # the logits of the request's last new token, (vocab,)
CAPTURE_HIDDEN_LAST = "hidden_last"  # the final hidden state of its last new token, (hidden,)
CAPTURE_HIDDEN_ALL = "hidden_all"  # the final hidden states of all its new tokens, (new, hidden)
CAPTURES = frozenset({CAPTURE_LOGITS, CAPTURE_HIDDEN_LAST, CAPTURE_HIDDEN_ALL})

# What an engine may or may not do; the conformance suite skips what an engine does not claim.
FEATURE_EMBEDDINGS = "embeddings"  # new inputs given as embeddings instead of token ids
FEATURE_BIDIRECTIONAL = "bidirectional"  # causal=False
FEATURE_NO_WRITE = "no_write"  # write_kv=False: new tokens attend but store no K/V
FEATURE_HIDDEN = "hidden"  # hidden_last / hidden_all captures
ALL_FEATURES = frozenset({FEATURE_EMBEDDINGS, FEATURE_BIDIRECTIONAL, FEATURE_NO_WRITE, FEATURE_HIDDEN})

KVStacks = Mapping[tuple[str, str], "torch.Tensor"]  # (sub_name, slice_name) -> (slots, page_tokens, heads, head_dim)


class EngineError(FlowrtError, ValueError):
    """An engine was used against its contract: a bad step, bad stacks, an unbound engine."""


def token_slots(page_slots: Sequence[int], page_tokens: int, count: int | None = None) -> list[int]:
    """The token-granular slot ids of the first `count` tokens (default: all) stored in pages
    `page_slots`, in order: token i lies in page_slots[i // page_tokens] at row i % page_tokens."""
    pages = list(page_slots)
    total = len(pages) * page_tokens
    count = total if count is None else count
    if not 0 <= count <= total:
        raise EngineError(
            f"token_slots: {count} tokens do not fit in {len(pages)} page(s) of {page_tokens} tokens; give more pages"
        )
    return [pages[i // page_tokens] * page_tokens + i % page_tokens for i in range(count)]


@dataclass(frozen=True)
class EngineSpec:
    """What `describe()` says of a model: its shape, and the KV pages it needs."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: str = "float32"  # one of flowrt.params.layout.ITEM_BYTES
    device: str = "cpu"
    max_positions: int | None = None
    features: frozenset[str] = ALL_FEATURES

    def __post_init__(self) -> None:
        for what in ("vocab_size", "hidden_size", "num_layers", "num_kv_heads", "head_dim"):
            value = getattr(self, what)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise EngineError(f"engine `{self.name}`: {what} must be a whole number >= 1, not {value!r}")
        if self.kv_dtype not in ITEM_BYTES:
            raise EngineError(f"engine `{self.name}`: kv_dtype {self.kv_dtype!r} is not one of {', '.join(ITEM_BYTES)}")
        unknown = sorted(set(self.features) - ALL_FEATURES)
        if unknown:
            raise EngineError(f"engine `{self.name}`: unknown features {unknown}; known: {sorted(ALL_FEATURES)}")

    @property
    def sub_names(self) -> tuple[str, ...]:
        """One sub_name per layer, "0".."layers-1" (the names a `global` with `layers N` gets)."""
        return tuple(str(layer) for layer in range(self.num_layers))

    @property
    def slice_names(self) -> tuple[str, ...]:
        return KV_SLICES

    def kv_layout(self, name: str = "kv", page_tokens: int = 16) -> KVLayout:
        """The params layout of this model's KV cache, pages of `page_tokens` tokens."""
        return KVLayout(name, self.sub_names, self.slice_names, page_tokens, self.num_kv_heads, self.head_dim, self.kv_dtype)

    def global_settings(self, page_tokens: int = 16) -> dict[str, Any]:
        """The settings a `global NAME: KVCache { ... }` needs to hold this model's KV."""
        return {
            "layers": self.num_layers,
            "slices": list(self.slice_names),
            "page_tokens": page_tokens,
            "heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "dtype": self.kv_dtype,
        }

    def check_layout(self, layout: KVLayout) -> None:
        """Raise naming each setting of the global that does not fit this model."""
        wanted = self.kv_layout(layout.name, layout.page_tokens)
        wrong = []
        if tuple(layout.sub_names) != wanted.sub_names:
            wrong.append(f"`layers {self.num_layers}` (it has sub_names {list(layout.sub_names)})")
        if tuple(layout.slice_names) != wanted.slice_names:
            wrong.append(f"`slices [{', '.join(wanted.slice_names)}]` (it has {list(layout.slice_names)})")
        for setting, have, need in (
            ("heads", layout.heads, wanted.heads),
            ("head_dim", layout.head_dim, wanted.head_dim),
            ("dtype", layout.dtype, wanted.dtype),
        ):
            if have != need:
                wrong.append(f"`{setting} {need}` (it has {have})")
        if wrong:
            raise EngineError(
                f"global `{layout.name}` cannot hold the KV of engine `{self.name}`: set " + ", ".join(wrong) + " in the global"
            )


@dataclass(frozen=True)
class StepRequest:
    """One request's part of one forward step.

    - `token_ids` (n new token ids) or `embeddings` (n x hidden_size), exactly one of them.
    - `slots`: token-granular slot ids of the request's whole context in order, the n new tokens'
      slots last (so len(slots) >= n). With `write_kv=False` the new tokens store nothing: `slots`
      lists only the cached context and the new tokens follow it.
    - `positions`: the new tokens' positions (default: their places in the context).
    - `causal`: each new token attends to the context and the new tokens up to itself; False:
      to the whole context and every new token (bidirectional).
    - `capture`: which outputs to return (CAPTURES).
    """

    token_ids: Sequence[int] | torch.Tensor | None = None
    embeddings: torch.Tensor | None = None
    slots: Sequence[int] | torch.Tensor = ()
    positions: Sequence[int] | torch.Tensor | None = None
    causal: bool = True
    write_kv: bool = True
    capture: frozenset[str] = frozenset({CAPTURE_LOGITS})

    @property
    def new_tokens(self) -> int:
        source = self.token_ids if self.token_ids is not None else self.embeddings
        return 0 if source is None else len(source)

    @property
    def context_length(self) -> int:
        """How many tokens the new ones attend over (cached and new)."""
        return len(self.slots) + (0 if self.write_kv else self.new_tokens)


@dataclass(frozen=True)
class StepBatch:
    """One forward step: requests of any lengths, run together."""

    requests: tuple[StepRequest, ...]

    def __init__(self, requests: Sequence[StepRequest]):
        object.__setattr__(self, "requests", tuple(requests))

    def __len__(self) -> int:
        return len(self.requests)


@dataclass
class StepResult:
    """What one request of a step captured (None: not asked for), and its sampled token."""

    logits: torch.Tensor | None = None
    hidden_last: torch.Tensor | None = None
    hidden_all: torch.Tensor | None = None
    token: int | None = None


class EngineAdapter(abc.ABC):
    """A model engine flowrt drives one step at a time on slots it chooses (docs/engines.md).

    Call order: `describe()`, `bind_kv(stacks)` once (the pool's L1 block stacks), then any number
    of `forward` / `embed` / `copy_slots` / `read_pages` / `write_pages`, then `close()`."""

    @abc.abstractmethod
    def describe(self) -> EngineSpec:
        """The model's shape and the KV layout it needs."""

    @abc.abstractmethod
    def bind_kv(self, stacks: KVStacks) -> None:
        """Use these block stacks as the KV cache: (sub_name, slice_name) -> a tensor
        (slots, page_tokens, heads, head_dim) for every layer and k/v, all of one shape."""

    @abc.abstractmethod
    def embed(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """The input embeddings (n, hidden_size) of token ids."""

    @abc.abstractmethod
    def forward(self, batch: StepBatch) -> list[StepResult]:
        """One step over every request of `batch` (see StepRequest); results in batch order.
        Writes K/V only into the new tokens' slots, reads only listed slots, samples nothing."""

    @abc.abstractmethod
    def copy_slots(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy the K/V of token slots src[i] to dst[i] in every layer and slice (a fork of a
        shared, partly filled page; compaction)."""

    @abc.abstractmethod
    def read_pages(self, pages: Sequence[int]) -> torch.Tensor:
        """Pages `pages` of the stacks as (n, chunks, page_tokens, heads, head_dim), chunks in
        `KVLayout.chunks()` order (layer-major, then k, v): the flat pages of L2 and L3."""

    @abc.abstractmethod
    def write_pages(self, pages: Sequence[int], data: torch.Tensor) -> None:
        """The inverse of read_pages."""

    def sample(self, logits: Sequence[torch.Tensor], samplers: Sequence[TokenSampler]) -> list[int]:
        """One token per request from its last-token logits. Engines with a fused sampler may
        override this; it must then give what the framework's samplers give."""
        if len(logits) != len(samplers):
            raise EngineError(f"sample(): {len(logits)} logits rows but {len(samplers)} samplers; give one sampler per row")
        return [sampler(row) for row, sampler in zip(logits, samplers, strict=True)]

    def close(self) -> None:  # noqa: B027 - engines without resources need nothing here
        """Release the engine's resources; the bound stacks stay the pool's."""
