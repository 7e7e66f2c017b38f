"""Stand-in: the forward modes, the hidden-state capture modes and the batch of one forward."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, auto
from typing import Any


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


class CaptureHiddenMode(IntEnum):
    NULL = 0
    LAST = 1
    FULL = 2


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: Any
    req_pool_indices: Any
    seq_lens: Any
    out_cache_loc: Any
    seq_lens_sum: int
    seq_lens_cpu: Any = None
    positions: Any = None
    input_embeds: Any = None
    capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL
    return_logprob: bool = False
    extend_num_tokens: int | None = None
    extend_seq_lens: Any = None
    extend_prefix_lens: Any = None
    extend_start_loc: Any = None
    extend_prefix_lens_cpu: list[int] | None = None
    extend_seq_lens_cpu: list[int] | None = None
