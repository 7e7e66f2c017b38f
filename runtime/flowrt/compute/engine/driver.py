"""Paged generation on a `KVSession` (docs/engines.md, docs/kv.md): reuse what the pool holds of a
session's history, compute the rest, decode, and leave every full page behind for the next turn.

`PagedGenerator.generate(kv, tokens, ...)` takes the token ids of the session's whole history and:

1. keys its full pages (chained page hashes, or `keys` the caller worked out, e.g. with media
   hashes mixed in) and matches them (`kv.match`): the cached prefix, held in L1 slots;
2. allocates L1 pages for the other full pages (`kv.allocate`; a page another request committed
   meanwhile comes back filled and counts as reused when it continues the prefix);
3. prefills only the tokens after the reused prefix (in chunks of `prefill_chunk`, each a step of
   its own), commits the new full pages (`kv.commit`), and samples the first token;
4. decodes one token a step until `max_new_tokens` or a `stop` token;
5. commits the pages the generated tokens filled: their K/V were computed into scratch pages (a
   page is named by the hash of its tokens, unknown until it is full), so each is copied into a
   page named by its key (`engine.copy_slots`), unless another request committed it first. A
   generation cancelled while it decodes (its call interrupted) commits the full pages of what it
   had generated too: a next turn whose history holds the part of the reply the user received
   reuses exactly those of its pages, as pages are named by their tokens (docs/stdlib.md).

It works with any `EngineAdapter`, through a `ContinuousBatcher` when given one (concurrent
sessions then share forward steps). A page evicted since the last turn is simply recomputed: the
match is shorter, the counts in `Generation` say so. Scratch pages (the history's trailing partial
page, the generated tokens) are held until the `async with ctx.kv(...)` block ends.

`ScratchPages`, `ContextSlots`, `allocate` and `token_list` are shared with `planned`, the driver
of multimodal plans.
"""

from __future__ import annotations

import operator
import secrets
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from flowrt.compute.engine.adapter import CAPTURE_LOGITS, EngineAdapter, EngineError, StepBatch, StepRequest, StepResult
from flowrt.compute.engine.batcher import ContinuousBatcher
from flowrt.compute.engine.kvbinding import kv_stacks
from flowrt.compute.engine.sampling import GREEDY, SamplingParams, TokenSampler
from flowrt.compute.hashing import page_hashes
from flowrt.params.pool import KVPool
from flowrt.params.session import KVSession

SCRATCH = "engine-scratch"  # page keys of scratch pages start so (never committed, never matched)


@dataclass(frozen=True)
class Generation:
    """What one `generate` did."""

    tokens: list[int]  # the generated tokens (the stop token included, when one ended it)
    prompt_tokens: int  # the history given
    reused_tokens: int  # history tokens whose K/V came from the pool
    computed_tokens: int  # history tokens prefilled here
    committed_pages: int  # pages this call wrote and committed (history and generated)
    steps: int  # forward steps it took part in
    first_token_seconds: float | None  # from the call to the first token (None: nothing generated)
    published: bool  # whether the metadata store took every commit (False: kept here, retried later)


@dataclass
class _Placement:
    """Where a history's K/V live (see `PagedGenerator._place`)."""

    hit_pages: int  # pages the match found
    reused_pages: int  # leading pages not computed here (the match, then pages others committed)
    made_pages: int  # pages allocated fresh for this call
    context: ContextSlots
    scratch: ScratchPages


class ScratchPages:
    """Scratch pages for tokens from logical page `base` on, allocated as they are needed."""

    def __init__(self, kv: KVSession, base: int):
        self.kv = kv
        self.base = base
        self.page_tokens = kv.layout.page_tokens
        self.prefix = f"{SCRATCH}-{secrets.token_hex(8)}"
        self.pages: list[int] = []

    def slot(self, token: int) -> int:
        """The token slot of history position `token` (>= base * page_tokens)."""
        index, offset = divmod(token - self.base * self.page_tokens, self.page_tokens)
        while len(self.pages) <= index:
            self.pages += self.kv.allocate([f"{self.prefix}-{len(self.pages)}"])
        return self.pages[index] * self.page_tokens + offset


class EngineDriver:
    """What the generators share: one engine, and the batcher that drives it if any, bound to one
    pool's block stacks on first use; one step at a time through the batcher or alone."""

    def __init__(self, engine: EngineAdapter, batcher: ContinuousBatcher | None):
        name = type(self).__name__
        if not isinstance(engine, EngineAdapter):
            raise EngineError(f"{name} takes an EngineAdapter, not {type(engine).__name__}")
        if batcher is not None and batcher.engine is not engine:
            raise EngineError(f"{name}: the batcher drives another engine; give the generator the batcher's engine")
        self.engine = engine
        self.batcher = batcher
        self.spec = engine.describe()
        self._pool: KVPool | None = None

    def bind(self, kv: KVSession) -> None:
        """Bind the engine to `kv`'s pool (once; one generator serves one pool)."""
        if not isinstance(kv, KVSession):
            raise EngineError(f"generate() takes the KVSession of `async with ctx.kv(NAME) as kv:`, not {type(kv).__name__}")
        if self._pool is kv.pool:
            return
        if self._pool is not None:
            raise EngineError(
                f"this generator's engine is bound to the pool of global `{self._pool.layout.name}`; make one "
                f"{type(self).__name__} (and engine) per pool"
            )
        self.spec.check_layout(kv.layout)
        self.engine.bind_kv(kv_stacks(kv))
        self._pool = kv.pool

    async def _step(self, request: StepRequest, sampler: TokenSampler | None) -> StepResult:
        if self.batcher is not None:
            return await self.batcher.step(request, sampler)
        result = self.engine.forward(StepBatch([request]))[0]
        if sampler is not None:
            result.token = int(self.engine.sample([result.logits], [sampler])[0])
        return result


class PagedGenerator(EngineDriver):
    """Generation on KV pages of one pool with one engine (see the module docstring)."""

    def __init__(self, engine: EngineAdapter, *, batcher: ContinuousBatcher | None = None, prefill_chunk: int | None = None):
        super().__init__(engine, batcher)
        if prefill_chunk is not None and (not isinstance(prefill_chunk, int) or prefill_chunk < 1):
            raise EngineError(f"PagedGenerator: prefill_chunk is a number of tokens >= 1 or None, not {prefill_chunk!r}")
        self.prefill_chunk = prefill_chunk

    async def generate(
        self,
        kv: KVSession,
        tokens: Sequence[int],
        *,
        max_new_tokens: int = 16,
        sampling: SamplingParams = GREEDY,
        keys: Sequence[str] | None = None,
        parent: bytes | str | None = None,
        stop: Collection[int] = (),
        on_token: Callable[[int], None] | None = None,
    ) -> Generation:
        """Generate after the history `tokens` (see the module docstring). `keys`: the page keys
        of the full pages of `tokens`, if the caller has them; `parent`: the chain's root when it
        is not the default (`hashing.chain_root`)."""
        started = time.perf_counter()
        self.bind(kv)
        history = token_list(tokens)
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise EngineError(f"generate(): max_new_tokens is a whole number >= 0, not {max_new_tokens!r}")
        stops = frozenset(token_list(stop, allow_empty=True))
        sampler = TokenSampler(sampling)
        size = kv.layout.page_tokens
        full = len(history) // size
        keys = list(keys) if keys is not None else page_hashes(history, size, parent=parent)
        if len(keys) != full:
            raise EngineError(
                f"generate(): {len(keys)} page keys for {full} full pages of {size} tokens; give one key per full page"
            )

        place = await self._place(kv, history, keys, logits_needed=max_new_tokens > 0)
        kv.count_prefix(hit=place.reused_pages * size, computed=len(history) - place.reused_pages * size)  # (for /metrics)
        first, steps = await self._prefill(history, place, sampler if max_new_tokens else None)
        hit_pages = place.hit_pages
        published = kv.commit(keys[hit_pages:], start=hit_pages) if len(keys) > hit_pages else True

        generated: list[int] = []
        first_seconds = None
        if max_new_tokens:
            assert first is not None  # the last prefill step always runs when logits are needed
            generated.append(first)
            first_seconds = time.perf_counter() - started
            if on_token is not None:
                on_token(first)
        try:
            while generated and len(generated) < max_new_tokens and generated[-1] not in stops:
                position = len(history) + len(generated) - 1
                place.context.set(position, place.scratch.slot(position))
                step = StepRequest(token_ids=generated[-1:], slots=place.context.upto(position + 1))
                generated.append(int((await self._step(step, sampler)).token))
                steps += 1
                if on_token is not None:
                    on_token(generated[-1])
        except BaseException:  # cancelled (a barge-in, say): what was generated stays cached for the next turn
            self._commit_generated(kv, history, generated, keys, parent, place.scratch)
            raise

        extra_made, extra_published = self._commit_generated(kv, history, generated, keys, parent, place.scratch)
        return Generation(
            tokens=generated,
            prompt_tokens=len(history),
            reused_tokens=place.reused_pages * size,
            computed_tokens=len(history) - place.reused_pages * size,
            committed_pages=place.made_pages + extra_made,
            steps=steps,
            first_token_seconds=first_seconds,
            published=published and extra_published,
        )

    async def _place(self, kv: KVSession, history: list[int], keys: list[str], logits_needed: bool) -> _Placement:
        """Where every history token's K/V lives: matched pages, pages allocated for the other
        full pages, scratch for the trailing partial page."""
        size = kv.layout.page_tokens
        full = len(keys)
        hit = await kv.match(keys)
        allocated = allocate(kv, keys[hit.pages :])
        fresh = [kv.fresh(key) for key in keys[hit.pages :]]
        reused = hit.pages + next((i for i, made in enumerate(fresh) if made), len(fresh))
        in_pool = full  # pages whose K/V live in their own pool page
        if logits_needed and reused * size == len(history):
            reused = in_pool = full - 1  # the last token must run to give logits: its page is recomputed in scratch
        scratch = ScratchPages(kv, in_pool)
        context = ContextSlots(len(history))
        context.set_pages((list(hit.slots) + allocated)[:in_pool], size)
        for token in range(in_pool * size, len(history)):
            context.set(token, scratch.slot(token))
        return _Placement(hit.pages, reused, sum(fresh), context, scratch)

    async def _prefill(self, history: list[int], place: _Placement, sampler: TokenSampler | None) -> tuple[int | None, int]:
        """Run the history after the reused prefix, `prefill_chunk` tokens a step; the first
        token (sampled from the last step, when `sampler`) and the steps taken."""
        size = place.scratch.page_tokens
        begin, steps, token = place.reused_pages * size, 0, None
        while begin < len(history):
            end = min(begin + (self.prefill_chunk or len(history)), len(history))
            last = end == len(history)
            capture = frozenset({CAPTURE_LOGITS}) if last and sampler is not None else frozenset()
            step = StepRequest(token_ids=history[begin:end], slots=place.context.upto(end), capture=capture)
            result = await self._step(step, sampler if capture else None)
            token = result.token
            steps += 1
            begin = end
        return token, steps

    def _commit_generated(
        self, kv: KVSession, history: list[int], generated: list[int], keys: list[str], parent: Any, scratch: ScratchPages
    ) -> tuple[int, bool]:
        """Commit the pages after the history's full pages whose every token's K/V was computed
        (the last generated token never ran); returns (pages written, published)."""
        size = kv.layout.page_tokens
        full = len(keys)
        computed = len(history) + max(len(generated) - 1, 0)
        extra = computed // size - full
        if extra <= 0:
            return 0, True
        sequence = history + generated
        extra_keys = page_hashes(sequence[full * size : (full + extra) * size], size, parent=keys[-1] if keys else parent)
        slots = allocate(kv, extra_keys)
        sources: list[int] = []
        targets: list[int] = []
        made = 0
        for page, (key, slot) in enumerate(zip(extra_keys, slots, strict=True)):
            if kv.fresh(key):
                first = (full + page) * size
                sources += [scratch.slot(token) for token in range(first, first + size)]
                targets += range(slot * size, slot * size + size)
                made += 1
        if sources:
            self.engine.copy_slots(sources, targets)
        return made, kv.commit(extra_keys, start=full)


def allocate(kv: KVSession, keys: list[str]) -> list[int]:
    """`kv.allocate(keys)`, the pages already committed first: held, they cannot be evicted to make
    room for the new ones (KVPool.allocate given both at once may evict an idle listed page for a
    new one, then fail to hold it)."""
    resident = [key for key in keys if kv.committed(key)]
    slots = dict(zip(resident, kv.allocate(resident), strict=True)) if resident else {}
    others = [key for key in keys if key not in slots]
    if others:
        slots.update(zip(others, kv.allocate(others), strict=True))
    return [slots[key] for key in keys]


class ContextSlots:
    """A request's context slot list, grown in place (no list copy per decode step)."""

    def __init__(self, length: int):
        import torch

        self.slots = torch.zeros(max(length, 16), dtype=torch.int64)

    def set(self, token: int, slot: int) -> None:
        if token >= len(self.slots):  # doubling: amortised, one step in many copies
            import torch

            self.slots = torch.cat([self.slots, torch.zeros_like(self.slots)])
        self.slots[token] = slot

    def set_pages(self, pages: list[int], page_tokens: int) -> None:
        """Tokens 0.. lie in `pages`, page after page."""
        import torch

        if pages:
            rows = torch.tensor(pages, dtype=torch.int64)[:, None] * page_tokens + torch.arange(page_tokens)
            self.slots[: len(pages) * page_tokens] = rows.flatten()

    def upto(self, end: int) -> Any:
        return self.slots[:end]


def token_list(tokens: Any, allow_empty: bool = False) -> list[int]:
    """Token ids as a list of ints (a list, numpy or torch integers), or an EngineError."""
    if hasattr(tokens, "tolist"):
        tokens = tokens.tolist()
    if isinstance(tokens, str | bytes) or not hasattr(tokens, "__iter__"):
        raise EngineError(f"token ids are a list of ints, not {type(tokens).__name__}")
    try:
        values = [operator.index(token) for token in tokens]
    except TypeError:
        raise EngineError("token ids are a list of ints; one of them is not an int") from None
    if not values and not allow_empty:
        raise EngineError("generate() needs at least one token of history")
    return values
