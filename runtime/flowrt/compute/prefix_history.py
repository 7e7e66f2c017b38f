"""Sessions' histories for prefix matching (docs/prefix.md): layer 1 of the two layers of reuse.

A `History` is one session's sequence as this process last saw it: its segments, the hidden
states (`emb`) of every position, kept on the CPU, and the chained page keys of its full pages.
`emb` is enough to recompute the KV of any position, so KV pages can be evicted from the pool at
any time: what misses is prefilled again from here.

A history is cut at a position (`truncate`, incremental matching's `step`) and grows at its end
(`append`); the page keys follow without rehashing the part kept: a page's key covers only its
prefix, so the keys of the pages before the cut stay, and hashing goes on from the last of them.

`HistoryStore` bounds what the process keeps: at most `max_sessions` histories and `max_bytes`
bytes of `emb` in all; the least recently used sessions go first (their next incremental
request with a `step` > 0 is refused with a message saying to resend the whole conversation).
Hidden states shared with an encoder cache are counted in both.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flowrt.compute.hashing import ROOT
from flowrt.compute.prefix_segments import (
    MediaSegment,
    Placed,
    PrefixError,
    Segment,
    StepError,
    TextSegment,
    chain_keys,
    token_ids,
)

DEFAULT_HISTORY_BYTES = 512 << 20
DEFAULT_HISTORY_SESSIONS = 4096


# ── hidden states: torch tensors or numpy arrays of shape (positions, ...) ──


def nbytes(hidden: Any) -> int:
    """Bytes a hidden-state array holds (torch tensors and numpy arrays)."""
    if hasattr(hidden, "element_size"):
        return hidden.element_size() * hidden.numel()
    return int(hidden.nbytes)


def rows(hidden: Any) -> int:
    return int(hidden.shape[0])


def on_cpu(hidden: Any, what: str) -> Any:
    """`hidden` as a CPU array of at least one dimension, checked (a device tensor is copied down:
    layer 1 lives on the CPU)."""
    shape = getattr(hidden, "shape", None)
    if shape is None:
        raise PrefixError(f"{what}: hidden states are a torch tensor or numpy array, not {type(hidden).__name__}")
    if len(shape) < 1:
        raise PrefixError(f"{what}: hidden states have one row per position, not a scalar")
    device = getattr(hidden, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        hidden = hidden.detach().cpu()
    elif hasattr(hidden, "detach"):
        hidden = hidden.detach()
    return hidden


def concat(parts: Sequence[Any]) -> Any:
    """The rows of `parts` one after the other (a view when there is one part). Parts may mix
    numpy arrays and torch tensors (a token embedder giving one, an encoder the other): then the
    result is a tensor."""
    if len(parts) == 1:
        return parts[0]
    if any(type(part).__module__.partition(".")[0] == "torch" for part in parts):
        import torch

        return torch.cat([torch.as_tensor(part) for part in parts])
    import numpy

    return numpy.concatenate(list(parts))


def copy_rows(hidden: Any, stop: int) -> Any:
    """The first `stop` rows, as an array of their own (so the rows cut off are freed)."""
    head = hidden[:stop]
    return head.clone() if hasattr(head, "clone") else head.copy()


@dataclass
class History:
    """One session's sequence: segments, their hidden states (one array per segment) and the
    keys of its full pages (see the module docstring)."""

    page_tokens: int
    placeholder: int = 0
    root: bytes = ROOT
    placed: list[Placed] = field(default_factory=list)
    hidden: list[Any] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    ids: array = field(default_factory=lambda: array("I"))

    @property
    def n_tokens(self) -> int:
        return len(self.ids)

    @property
    def segments(self) -> list[Segment]:
        return [item.segment for item in self.placed]

    @property
    def nbytes(self) -> int:
        return sum(nbytes(part) for part in self.hidden)

    def copy(self) -> History:
        """A history that can change without changing this one (the arrays are shared, read-only)."""
        return History(
            self.page_tokens,
            self.placeholder,
            self.root,
            list(self.placed),
            list(self.hidden),
            list(self.keys),
            array("I", self.ids),
        )

    def check_step(self, step: int, session: str) -> None:
        """Refuse a cut that is not a position of this history or falls inside a media segment."""
        if isinstance(step, bool) or not isinstance(step, int):
            raise StepError(f"step must be an int (a position in the history of session {session!r}), not {step!r}")
        if step > self.n_tokens:
            raise StepError(
                f"step {step} is beyond the history of session {session!r}, which holds {self.n_tokens} positions: send the "
                f"position the client holds (0..{self.n_tokens}), or leave step out (or make it negative) to append"
            )
        for item in self.placed:
            if item.offset < step < item.end and isinstance(item.segment, MediaSegment):
                raise StepError(
                    f"step {step} falls inside the {item.segment.modality} segment at positions {item.offset}..{item.end} of "
                    f"the history of session {session!r}: a media segment is kept whole or not at all, so send step={item.offset} "
                    f"(drop it) or step={item.end} (keep it)"
                )

    def truncate(self, step: int) -> None:
        """Keep positions 0..step-1 (a text segment may be cut; `check_step` refuses a media one)."""
        if step >= self.n_tokens:
            return
        keep = next(i for i, item in enumerate(self.placed) if item.end > step)
        cut = self.placed[keep]
        del self.placed[keep:]
        kept_hidden = self.hidden[:keep]
        if cut.offset < step:
            assert isinstance(cut.segment, TextSegment)
            length = step - cut.offset
            self.placed.append(Placed(TextSegment(cut.segment.tokens[:length]), cut.offset))
            kept_hidden.append(copy_rows(self.hidden[keep], length))
        self.hidden = kept_hidden
        del self.ids[step:]
        del self.keys[step // self.page_tokens :]

    def append(self, segments: Sequence[Segment], hidden: Sequence[Any]) -> tuple[int, list[str]]:
        """Add segments (with their hidden states, one array each) at the end; returns (the index
        of the first page they complete, the keys of the pages they complete)."""
        width = tuple(self.hidden[0].shape[1:]) if self.hidden else None
        for segment, part in zip(segments, hidden, strict=True):
            if rows(part) != segment.length:
                raise PrefixError(
                    f"a {segment.modality} segment of {segment.length} positions came with {rows(part)} rows of hidden "
                    f"states: give one row per position"
                )
            if width is not None and tuple(part.shape[1:]) != width:
                raise PrefixError(
                    f"a {segment.modality} segment's hidden states have rows of shape {tuple(part.shape[1:])}, the "
                    f"history's {width}: every segment's hidden states must have the model's hidden size"
                )
            width = tuple(part.shape[1:])
        first_page = len(self.keys)
        start = self.n_tokens
        for segment, part in zip(segments, hidden, strict=True):
            self.placed.append(Placed(segment, start))
            self.hidden.append(part)
            start += segment.length
        self.ids.extend(token_ids(segments, self.placeholder))
        parent = self.keys[-1] if self.keys else self.root
        media = [
            item for item in self.placed if isinstance(item.segment, MediaSegment) and item.end > first_page * self.page_tokens
        ]
        new = chain_keys(self.ids, media, self.page_tokens, first_page=first_page, parent=parent)
        self.keys.extend(new)
        return first_page, new

    def rows_between(self, start: int, stop: int) -> Any:
        """The hidden states of positions start..stop-1 (a view when they lie in one segment)."""
        parts = []
        for item, part in zip(self.placed, self.hidden, strict=True):
            if item.end <= start or item.offset >= stop:
                continue
            parts.append(part[max(start, item.offset) - item.offset : min(stop, item.end) - item.offset])
        if not parts:
            raise PrefixError(f"no hidden states for positions {start}..{stop} of a history of {self.n_tokens}")
        return concat(parts)

    def rekeyed(self, page_tokens: int) -> History:
        """This history keyed for another page size (a pool of another layout)."""
        fresh = History(page_tokens, self.placeholder, self.root)
        fresh.append(self.segments, self.hidden)
        return fresh


@dataclass
class HistoryCounters:
    stored: int = 0
    dropped_sessions: int = 0  # least recently used sessions dropped to stay within the bounds
    forgotten: int = 0


class HistoryStore:
    """The histories of this process's sessions, bounded (see the module docstring)."""

    def __init__(self, max_bytes: int = DEFAULT_HISTORY_BYTES, max_sessions: int = DEFAULT_HISTORY_SESSIONS):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise PrefixError(f"HistoryStore(max_bytes={max_bytes!r}): the bound on hidden-state bytes is an int >= 1")
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise PrefixError(f"HistoryStore(max_sessions={max_sessions!r}): the bound on sessions is an int >= 1")
        self.max_bytes = max_bytes
        self.max_sessions = max_sessions
        self._histories: OrderedDict[str, History] = OrderedDict()
        self._bytes: dict[str, int] = {}
        self.bytes = 0
        self.counters = HistoryCounters()

    def get(self, session: str) -> History | None:
        history = self._histories.get(session)
        if history is not None:
            self._histories.move_to_end(session)
        return history

    def check_fits(self, session: str, size: int) -> None:
        if size > self.max_bytes:
            raise PrefixError(
                f"the history of session {session!r} would hold {size} bytes of hidden states, more than this process keeps "
                f"for all sessions (max_bytes={self.max_bytes}): raise the history store's max_bytes, or start a new session"
            )

    def put(self, session: str, history: History) -> None:
        """Store `history` as the session's (most recently used), dropping the least recently used
        other sessions while the bounds are exceeded."""
        size = history.nbytes
        self.check_fits(session, size)
        self.bytes -= self._bytes.pop(session, 0)
        self._histories.pop(session, None)
        self._histories[session] = history
        self._bytes[session] = size
        self.bytes += size
        self.counters.stored += 1
        while len(self._histories) > self.max_sessions or self.bytes > self.max_bytes:
            oldest = next(iter(self._histories))
            self._drop(oldest)
            self.counters.dropped_sessions += 1

    def forget(self, session: str) -> bool:
        """Drop a session's history (it ended); whether there was one."""
        if session not in self._histories:
            return False
        self._drop(session)
        self.counters.forgotten += 1
        return True

    def _drop(self, session: str) -> None:
        del self._histories[session]
        self.bytes -= self._bytes.pop(session)

    def __contains__(self, session: object) -> bool:
        return session in self._histories

    def __len__(self) -> int:
        return len(self._histories)

    def statistics(self) -> dict:
        return {
            "sessions": len(self._histories),
            "bytes": self.bytes,
            "max_sessions": self.max_sessions,
            "max_bytes": self.max_bytes,
            "stored": self.counters.stored,
            "dropped_sessions": self.counters.dropped_sessions,
            "forgotten": self.counters.forgotten,
        }
