"""The frames prefix matching yields (Omni-Flow §5.1, docs/prefix.md): what a driver prefills.

After the KV hit (positions 0..hit_tokens-1, already in the pool), the rest of the sequence is
cut into frames that cover it exactly once, in order:

1. a `RecomputeFrame` first, when part of the history (positions the session held before this
   request) missed the KV cache: those positions are prefilled again from their kept `emb`;
2. then one `SegmentFrame` per segment of the request's new data (clipped to start at the hit,
   when the hit reaches into it: a segment wholly in the hit yields no frame).

Every frame carries its positions (`offset`, `length`), their hidden states (`hidden`: rows
offset..end-1 of the sequence's `emb`, on the CPU), their ids (`tokens`: text ids, and the
placeholder at media positions), and the pages it completes: after the frames up to and including
this one are prefilled, pages `first_page ..` (keys `keys`) are whole and can be committed. The
frames' `keys`, joined, are the plan's `new_keys`; the trailing partial page has no key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from flowrt.compute.prefix_history import History
from flowrt.compute.prefix_segments import MediaSegment


@dataclass(frozen=True, slots=True)
class Frame:
    """Positions offset..offset+length-1 to prefill (see the module docstring)."""

    kind: ClassVar[str] = "frame"
    offset: int
    length: int
    hidden: Any  # (length, hidden...) rows of emb, CPU
    tokens: tuple[int, ...]  # the id of every position (the placeholder at media positions)
    first_page: int  # the first page this frame completes (when keys is empty: the next page to complete)
    keys: tuple[str, ...]  # the keys of the pages it completes, pages first_page..

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True, slots=True)
class RecomputeFrame(Frame):
    """History whose KV was not found (evicted, or never computed here): prefill it from emb."""

    kind: ClassVar[str] = "recompute"


@dataclass(frozen=True, slots=True)
class SegmentFrame(Frame):
    """One segment of the new data (or its part past the hit)."""

    kind: ClassVar[str] = "segment"
    segment: int = 0  # its index in the plan's segments
    modality: str = "text"  # "text", or the media segment's modality
    content: bytes | None = None  # a media segment's content hash (None for text)
    segment_offset: int = 0  # where the whole segment starts (offset > segment_offset when clipped by the hit)


def cut_frames(history: History, hit_tokens: int, history_tokens: int) -> list[Frame]:
    """The frames that prefill positions hit_tokens.. of `history` (the whole sequence), where
    positions 0..history_tokens-1 are the session's history and the rest the new data."""
    frames: list[Frame] = []
    if hit_tokens < history_tokens:
        frames.append(_frame(RecomputeFrame, history, hit_tokens, history_tokens))
    for index, item in enumerate(history.placed):
        start = max(item.offset, hit_tokens)
        if item.offset < history_tokens or start >= item.end:
            continue
        segment = item.segment
        content = segment.content if isinstance(segment, MediaSegment) else None
        extra = {"segment": index, "modality": segment.modality, "content": content, "segment_offset": item.offset}
        frames.append(_frame(SegmentFrame, history, start, item.end, extra))
    return frames


def _frame(kind: type[Frame], history: History, start: int, stop: int, extra: dict | None = None) -> Frame:
    page_tokens = history.page_tokens
    first, stop_page = start // page_tokens, min(stop // page_tokens, len(history.keys))
    return kind(
        offset=start,
        length=stop - start,
        hidden=history.rows_between(start, stop),
        tokens=tuple(history.ids[start:stop]),
        first_page=first,
        keys=tuple(history.keys[first:stop_page]),
        **(extra or {}),
    )


def check_cover(frames: Sequence[Frame], hit_tokens: int, n_tokens: int) -> None:
    """Assert that `frames` cover hit_tokens..n_tokens-1 exactly once, in order (a self-check)."""
    position = hit_tokens
    for frame in frames:
        assert frame.offset == position and frame.length > 0, (frame.offset, frame.length, position)
        position = frame.end
    assert position == n_tokens, (position, n_tokens)
