"""Multimodal prefix matching (DESIGN §7, Omni-Flow §5.1, docs/prefix.md): what a request must
compute, given what the session's history and the KV pool already hold.

`PrefixMatcher` owns, per process, the sessions' histories (`prefix_history`: segments and their
hidden states `emb` on the CPU, layer 1 of reuse) and one encoder cache per modality
(`encoder_cache`). For a request it builds the session's sequence, computes its chained page keys
(`prefix_segments`: a page holding media positions mixes in the payload's content hash), matches
them against the pool in one `KVSession.match` call (layer 2: KV hits, best-effort) and returns a
`PrefillPlan`: the hit prefix (pages, L1 slots), the keys of the pages to compute, and the frames
to prefill (`prefix_frames`: a recomputation frame for history that missed, then one frame per
new segment).

Two modes:
- `full(kv, inputs)`: the request holds the whole conversation; every media input goes through
  its encoder (a cache hit skips the forward), the whole sequence is matched page by page, and it
  becomes the session's history.
- `incremental(kv, inputs, step=None)`: the request holds only new data. `step` is the position
  the client already holds: the history is cut there and the inputs appended; absent or negative,
  the inputs are appended to the whole history. Only the inputs are encoded.

It decides WHAT to compute, never how: no engine is called. A driver allocates `plan.new_keys`,
prefills the frames in order (committing each frame's `keys` as they complete), and records what
the model generated with `record_output`, so the next turn's `step` can count it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flowrt.compute.encoder_cache import DEFAULT_CACHE_BYTES, DEFAULT_CACHE_ENTRIES, EncoderCache
from flowrt.compute.hashing import ROOT, chain_root, content_hash
from flowrt.compute.prefix_frames import Frame, RecomputeFrame, SegmentFrame, check_cover, cut_frames
from flowrt.compute.prefix_history import History, HistoryStore, nbytes, on_cpu, rows
from flowrt.compute.prefix_segments import (
    MediaSegment,
    PrefixError,
    Segment,
    StepError,
    TextSegment,
    media_segment,
    text_segment,
)
from flowrt.params.pool import Prefix
from flowrt.params.session import KVSession

__all__ = [
    "EncoderCache",
    "Frame",
    "HistoryStore",
    "Media",
    "MediaSegment",
    "NewPages",
    "PrefillPlan",
    "PrefixError",
    "PrefixMatcher",
    "RecomputeFrame",
    "SegmentFrame",
    "Text",
    "TextSegment",
    "hidden_content",
]

EmbedTokens = Callable[[Sequence[int]], Any]  # token ids -> their hidden states (rows)
Encoder = Callable[[Any], Awaitable[Any] | Any]  # a payload -> its hidden states (rows)


@dataclass(frozen=True)
class Text:
    """A request's text: token ids, and their hidden states when an upstream role computed them
    (else the matcher's `embed_tokens` does)."""

    tokens: Any
    hidden: Any = None


@dataclass(frozen=True)
class Media:
    """A request's media item. Give `payload` (raw bytes, a URL or base64 text: hashed, and
    encoded by the modality's encoder unless cached) or `content` (its content hash) with
    `hidden` (its encoding, made upstream)."""

    modality: str
    payload: Any = None
    content: bytes | str | None = None
    hidden: Any = None


Input = Text | Media


@dataclass(frozen=True)
class PrefillPlan:
    """What one request must compute (see the module docstring and prefix_frames)."""

    session: str
    mode: str  # "full" or "incremental"
    step: int | None  # incremental: the position the history was cut at (None in full mode)
    history_tokens: int  # positions 0.. that were the session's history; the rest is new data
    n_tokens: int
    page_tokens: int
    segments: tuple[Segment, ...]  # the whole sequence
    offsets: tuple[int, ...]  # where each segment starts
    keys: tuple[str, ...]  # every full page of the sequence
    hit: Prefix  # KVSession.match's answer: pages, their L1 slots (held), sources
    frames: tuple[Frame, ...]
    encoded: int = 0  # media inputs whose encoder ran for this plan
    encoder_hits: int = 0  # media inputs an encoder cache gave (forward skipped)
    history: History | None = field(default=None, repr=False)
    previous: History | None = field(default=None, repr=False)  # the session's history before it (matcher.rollback)

    @property
    def hit_pages(self) -> int:
        return self.hit.pages

    @property
    def hit_tokens(self) -> int:
        return self.hit.pages * self.page_tokens

    @property
    def new_keys(self) -> tuple[str, ...]:
        """The keys of the full pages to compute: pages hit_pages.. (allocate, then commit them)."""
        return self.keys[self.hit.pages :]

    @property
    def prefill_tokens(self) -> int:
        return self.n_tokens - self.hit_tokens

    def hidden(self, start: int = 0, stop: int | None = None) -> Any:
        """The hidden states of positions start..stop-1 of the sequence."""
        assert self.history is not None
        return self.history.rows_between(start, self.n_tokens if stop is None else stop)


@dataclass(frozen=True)
class NewPages:
    """Pages completed by appending to a history: pages first_page.. with keys `keys` (commit them
    with `kv.commit(keys, start=first_page)` once their K/V is written)."""

    first_page: int
    keys: tuple[str, ...]
    n_tokens: int  # the history's length after the append


@dataclass
class MatcherCounters:
    full: int = 0
    incremental: int = 0
    hit_tokens: int = 0  # positions the KV pool served
    prefill_tokens: int = 0  # positions planned for prefill (recomputed or new)
    recomputed_tokens: int = 0  # of which history that missed the pool (rebuilt from emb)
    rollbacks: int = 0  # plans whose turn failed: the history went back to before them


class PrefixMatcher:
    """Prefix matching for one model in one process (see the module docstring).

    `embed_tokens(ids)`: the hidden states of text tokens (the model's embedding lookup).
    `encoders`: modality -> encoder(payload) (sync or async) giving a payload's hidden states.
    `namespace`: roots the page chains (hashing.chain_root), e.g. per model; None keeps
    hashing.ROOT, so text-only keys equal KVSession.keys(tokens).
    `placeholder`: the token id of media positions in the hashed ids.
    """

    def __init__(
        self,
        *,
        embed_tokens: EmbedTokens | None = None,
        encoders: Mapping[str, Encoder] | None = None,
        histories: HistoryStore | None = None,
        encoder_caches: Mapping[str, EncoderCache] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        namespace: str | bytes | None = None,
        placeholder: int = 0,
    ) -> None:
        self.embed_tokens = embed_tokens
        self.encoders = dict(encoders or {})
        self.histories = histories if histories is not None else HistoryStore()
        self.caches = dict(encoder_caches or {})
        for modality in self.encoders:
            self.caches.setdefault(modality, EncoderCache(cache_bytes, cache_entries, name=modality))
        self.root = ROOT if namespace is None else chain_root(namespace)
        if isinstance(placeholder, bool) or not isinstance(placeholder, int) or not 0 <= placeholder < 2**32:
            raise PrefixError(f"placeholder must be a token id (an int in [0, 2**32)), not {placeholder!r}")
        self.placeholder = placeholder
        self.counters = MatcherCounters()

    # ── the two modes ──

    async def full(self, kv: KVSession, inputs: Sequence[Input]) -> PrefillPlan:
        """Full matching: `inputs` is the whole conversation (see the module docstring)."""
        inputs = _checked_inputs(inputs)
        if not inputs:
            raise PrefixError("full matching needs the whole conversation, and the request holds no segment")
        segments, hidden, encoded, hits = await self._resolve(inputs)
        old = self.histories.get(kv.session)
        history = self._new_history(kv.layout.page_tokens)
        history.append(segments, hidden)
        kept = _common_prefix(old.placed if old is not None else [], history.placed)
        plan = await self._plan(kv, "full", None, history, kept, encoded, hits, old)
        self.counters.full += 1
        return plan

    async def incremental(self, kv: KVSession, inputs: Sequence[Input], step: int | None = None) -> PrefillPlan:
        """Incremental matching: `inputs` is new data after position `step` of the session's
        history (None or negative: after all of it). See the module docstring."""
        inputs = _checked_inputs(inputs)
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise StepError(f"step must be an int (the position the client holds) or None, not {step!r}")
        old = self.histories.get(kv.session)
        page_tokens = kv.layout.page_tokens
        if old is None:
            if step is not None and step > 0:
                raise StepError(
                    f"session {kv.session!r} has no history in this process (new, ended, moved to another replica, or "
                    f"dropped when the history store was full: {self.histories.max_sessions} sessions / "
                    f"{self.histories.max_bytes} bytes), so step={step!r} cannot be honoured: send the whole conversation "
                    f"with full matching, or step 0"
                )
            history = self._new_history(page_tokens)
        else:
            history = old.copy() if old.page_tokens == page_tokens else old.rekeyed(page_tokens)
        cut = history.n_tokens if step is None or step < 0 else step  # the paper's append semantic
        history.check_step(cut, kv.session)  # before any encoder runs: a bad step wastes no forward
        history.truncate(cut)
        segments, hidden, encoded, hits = await self._resolve(inputs)
        history.append(segments, hidden)
        plan = await self._plan(kv, "incremental", cut, history, cut, encoded, hits, old)
        self.counters.incremental += 1
        return plan

    async def _plan(
        self,
        kv: KVSession,
        mode: str,
        step: int | None,
        history: History,
        kept: int,
        encoded: int,
        hits: int,
        previous: History | None,
    ) -> PrefillPlan:
        self.histories.check_fits(kv.session, history.nbytes)
        hit = await kv.match(history.keys)
        frames = cut_frames(history, hit.pages * history.page_tokens, kept)
        check_cover(frames, hit.pages * history.page_tokens, history.n_tokens)
        self.histories.put(kv.session, history)
        hit_tokens = hit.pages * history.page_tokens
        recomputed = max(0, kept - hit_tokens)
        self.counters.hit_tokens += hit_tokens
        self.counters.prefill_tokens += history.n_tokens - hit_tokens
        self.counters.recomputed_tokens += recomputed
        computed = history.n_tokens - hit_tokens
        kv.count_prefix(hit=hit_tokens, computed=computed, recomputed=recomputed)  # (the role's, for /metrics)
        return PrefillPlan(
            session=kv.session,
            mode=mode,
            step=step,
            history_tokens=kept,
            n_tokens=history.n_tokens,
            page_tokens=history.page_tokens,
            segments=tuple(history.segments),
            offsets=tuple(item.offset for item in history.placed),
            keys=tuple(history.keys),
            hit=hit,
            frames=tuple(frames),
            encoded=encoded,
            encoder_hits=hits,
            history=history,
            previous=previous,
        )

    def rollback(self, plan: PrefillPlan) -> bool:
        """Put the session's history back as it was before `plan`, whose turn failed (or was
        cancelled): a turn that never completed is not part of the conversation, and the next
        one must not grow on it. False (nothing done) if another plan has replaced it since."""
        if self.histories.get(plan.session) is not plan.history:
            return False
        if plan.previous is None:
            self.histories.forget(plan.session)
        else:
            self.histories.put(plan.session, plan.previous)
        self.counters.rollbacks += 1
        return True

    # ── after generation ──

    def record_output(self, session: str, output: Input, page_tokens: int | None = None) -> NewPages:
        """Append what the model generated to the session's history (text ids, or a generated
        media item with its hidden states; `content` defaults to the hash of those), so the next
        turn's `step` counts it. Returns the pages it completed, to commit once written."""
        history = self.histories.get(session)
        if history is None:
            if page_tokens is None:
                raise PrefixError(
                    f"session {session!r} has no history here to record an output into: plan the request first "
                    f"(full or incremental), or give page_tokens to start one"
                )
            history = self._new_history(page_tokens)
        else:
            history = history.copy()
        if isinstance(output, Media) and output.hidden is not None and output.content is None and output.payload is None:
            output = Media(output.modality, content=hidden_content(output.hidden), hidden=output.hidden)
        (segment,), (hidden,) = self._resolve_sync(_checked_inputs([output]))
        first_page, keys = history.append([segment], [hidden])
        self.histories.put(session, history)
        return NewPages(first_page, tuple(keys), history.n_tokens)

    def history(self, session: str) -> History | None:
        """The session's history as this process holds it (None: none)."""
        return self.histories.get(session)

    def forget(self, session: str) -> bool:
        """Drop a session's history (it ended)."""
        return self.histories.forget(session)

    def statistics(self) -> dict:
        return {
            "plans": {"full": self.counters.full, "incremental": self.counters.incremental},
            "hit_tokens": self.counters.hit_tokens,
            "prefill_tokens": self.counters.prefill_tokens,
            "recomputed_tokens": self.counters.recomputed_tokens,
            "histories": self.histories.statistics(),
            "encoders": {modality: cache.statistics() for modality, cache in sorted(self.caches.items())},
        }

    # ── inputs to segments and hidden states ──

    def _new_history(self, page_tokens: int) -> History:
        return History(page_tokens, self.placeholder, self.root)

    async def _resolve(self, inputs: list[Input]) -> tuple[list[Segment], list[Any], int, int]:
        """(segments, their hidden states, forwards this request started, cache hits): media
        inputs are encoded concurrently, each through its modality's cache."""
        jobs = [self._media(item) if isinstance(item, Media) else self._text(item) for item in inputs]
        results = await asyncio.gather(*jobs)
        encoded = sum(1 for _, _, how in results if how == "miss")
        hits = sum(1 for _, _, how in results if how == "hit")
        return [segment for segment, _, _ in results], [hidden for _, hidden, _ in results], encoded, hits

    def _resolve_sync(self, inputs: list[Input]) -> tuple[list[Segment], list[Any]]:
        pairs = []
        for item in inputs:
            if isinstance(item, Media):
                if item.hidden is None:
                    raise PrefixError(f"a recorded {item.modality} output needs its hidden states (Media(..., hidden=...))")
                pairs.append(self._given_media(item))
            else:
                pairs.append(self._text_now(item))
        return [segment for segment, _ in pairs], [hidden for _, hidden in pairs]

    async def _text(self, item: Text) -> tuple[Segment, Any, str]:
        return (*self._text_now(item), "text")

    def _text_now(self, item: Text) -> tuple[Segment, Any]:
        segment = text_segment(item.tokens)
        hidden = item.hidden
        if hidden is None:
            if self.embed_tokens is None:
                raise PrefixError(
                    "a text segment came without hidden states and this PrefixMatcher has no embed_tokens: "
                    "give PrefixMatcher(embed_tokens=...) or Text(tokens, hidden=...)"
                )
            hidden = self.embed_tokens(list(segment.tokens))
        return segment, _rows_for(on_cpu(hidden, "text"), segment.length, "text")

    async def _media(self, item: Media) -> tuple[Segment, Any, str]:
        """(segment, hidden states, how the cache served it: "hit", "join", "miss"; "given" when
        the item came with its hidden states)."""
        if item.hidden is not None:
            return (*self._given_media(item), "given")
        if item.payload is None:
            raise PrefixError(
                f"a {item.modality} segment came with neither a payload to encode nor hidden states: give "
                f"Media({item.modality!r}, payload=...) or Media({item.modality!r}, content=..., hidden=...)"
            )
        encoder = self.encoders.get(item.modality)
        if encoder is None:
            known = ", ".join(sorted(self.encoders)) or "none"
            raise PrefixError(
                f"no encoder for modality {item.modality!r} (this PrefixMatcher's encoders: {known}): give "
                f"PrefixMatcher(encoders={{{item.modality!r}: ...}}) or the segment's hidden states"
            )
        content = _content_of(item)
        cache = self.caches[item.modality]
        how = cache.state(content)  # (exact: nothing runs between this and get's own lookup)
        hidden = await cache.get(content, lambda: _encode(encoder, item.payload, item.modality))
        return media_segment(item.modality, content, rows(hidden)), hidden, how

    def _given_media(self, item: Media) -> tuple[Segment, Any]:
        hidden = on_cpu(item.hidden, item.modality)
        content = _content_of(item)
        return media_segment(item.modality, content, rows(hidden)), hidden


# ── helpers ──


def _checked_inputs(inputs: Any) -> list[Input]:
    if isinstance(inputs, Text | Media):
        inputs = [inputs]
    if isinstance(inputs, str | bytes) or not hasattr(inputs, "__iter__"):
        raise PrefixError(f"a request's inputs are a list of Text and Media items, not {inputs!r:.60}")
    inputs = list(inputs)
    bad = next((item for item in inputs if not isinstance(item, Text | Media)), None)
    if bad is not None:
        raise PrefixError(
            f"a request's inputs are Text(tokens) and Media(modality, payload) items, not {bad!r:.60}: wrap each segment"
        )
    return inputs


def _content_of(item: Media) -> bytes:
    """The content hash of a media item: given, or hashed from its payload."""
    if item.content is not None:
        return media_segment(item.modality, item.content, 1).content
    payload = item.payload
    if payload is None:
        raise PrefixError(
            f"the {item.modality} segment has no content hash: give its payload or "
            f"content=flowrt.compute.hashing.content_hash(payload_bytes)"
        )
    if isinstance(payload, str):
        payload = payload.encode()
    try:
        return content_hash(payload)
    except Exception:
        raise PrefixError(
            f"the {item.modality} payload is a {type(payload).__name__}: give bytes, or a str (a URL, base64), "
            f"or its content hash"
        ) from None


async def _encode(encoder: Encoder, payload: Any, modality: str) -> Any:
    hidden = encoder(payload)
    if inspect.isawaitable(hidden):
        hidden = await hidden
    hidden = on_cpu(hidden, f"the {modality} encoder's output")
    if rows(hidden) < 1:
        raise PrefixError(f"the {modality} encoder gave no rows for a payload: a media segment holds at least one position")
    return hidden


def _rows_for(hidden: Any, length: int, what: str) -> Any:
    if rows(hidden) != length:
        raise PrefixError(
            f"a {what} segment of {length} positions came with {rows(hidden)} rows of hidden states: give one per position"
        )
    return hidden


def hidden_content(hidden: Any) -> bytes:
    """A content hash for generated hidden states (a generated image has no payload): their
    shape, dtype and bytes, hashed."""
    hidden = on_cpu(hidden, "a generated output")
    if hasattr(hidden, "element_size"):
        import torch

        raw = hidden.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    else:
        raw = hidden.tobytes()
    header = f"{tuple(hidden.shape)}|{hidden.dtype}|".encode()
    assert len(raw) == nbytes(hidden)
    return content_hash(header + raw)


def _common_prefix(old: Sequence[Any], new: Sequence[Any]) -> int:
    """Positions of the longest run of leading segments `old` and `new` share (full matching's
    history: what the session held that this request repeats)."""
    kept = 0
    for a, b in zip(old, new, strict=False):
        if a.segment != b.segment:
            break
        kept = b.end
    return kept
