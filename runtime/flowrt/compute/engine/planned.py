"""Multimodal generation on a `KVSession` from a `PrefixMatcher` plan (docs/engines.md, docs/prefix.md):
the `PagedGenerator` of text and media.

`PlannedGenerator(engine, matcher).generate(kv, plan, ...)` takes the `PrefillPlan` the matcher
made for this request (its hit, page keys including media pages, and frames of hidden states) and:

1. places the sequence: the hit pages' L1 slots, freshly allocated pages for `plan.new_keys`,
   scratch pages for the trailing partial page (and, when every page hit, the last page again:
   the last position must run to give logits);
2. prefills each frame from its hidden states (`StepRequest(embeddings=...)`: text rows are the
   LLM's token embeddings, media rows an encoder's output), committing the pages a frame completes
   as soon as it is done, and samples the first token from the last frame;
3. decodes one token a step (`max_new_tokens`, `stop`, `on_token`), capturing each step's final
   hidden state;
4. records the generated tokens in the session's history (`matcher.record_output`) and commits
   the pages they filled (copied from scratch into pages named by their keys, as the driver does).
   A generation cancelled while it decodes (its call interrupted) records what it had generated
   so far the same way; one that fails, or is cancelled before its reply began, leaves the
   history as it was before the plan. A next turn that keeps only part of the reply (the part
   the user received: flowstd's voice thinker) cuts the history there with its `step`.

`place_context(kv, engine, rows, keys)` makes a context's K/V present from its hidden states and
page keys (matched where the pool holds them, recomputed where not): how a DiT in another process
reads the same text K/V.

The result carries what a DiT on the LLM path needs: `hidden`, the final hidden state of the last
position that ran, and `context_slots`, the token slots of every position whose K/V is in the
pool, in order, valid until the `async with ctx.kv(...)` block ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from flowrt.compute.engine.adapter import (
    CAPTURE_HIDDEN_LAST,
    CAPTURE_LOGITS,
    EngineAdapter,
    EngineError,
    StepBatch,
    StepRequest,
)
from flowrt.compute.engine.batcher import ContinuousBatcher
from flowrt.compute.engine.driver import ContextSlots, EngineDriver, ScratchPages, allocate, token_list
from flowrt.compute.engine.sampling import GREEDY, SamplingParams, TokenSampler
from flowrt.compute.prefix import PrefillPlan, PrefixMatcher, Text
from flowrt.params.session import KVSession

_LAST = frozenset({CAPTURE_LOGITS, CAPTURE_HIDDEN_LAST})


@dataclass(frozen=True)
class PlannedGeneration:
    """What one `PlannedGenerator.generate` did."""

    tokens: list[int]  # the generated tokens (the stop token included, when one ended it)
    prompt_tokens: int  # the plan's positions (history, media and new text)
    reused_tokens: int  # positions whose K/V came from the pool (the plan's hit)
    computed_tokens: int  # positions prefilled here
    committed_pages: int  # pages this call wrote and committed (prompt and generated)
    steps: int  # forward steps it took part in
    first_token_seconds: float | None
    published: bool  # whether the metadata store took every commit
    hidden: Any  # (hidden,) the final hidden state of the last position that ran (None: nothing ran)
    context_slots: Any  # (positions,) int64 slots of every position with K/V, in order (valid in the kv block)


class PlannedGenerator(EngineDriver):
    """Generation from prefix-matching plans on one pool with one engine (see the module docstring)."""

    def __init__(self, engine: EngineAdapter, matcher: PrefixMatcher, *, batcher: ContinuousBatcher | None = None):
        super().__init__(engine, batcher)
        if not isinstance(matcher, PrefixMatcher):
            raise EngineError(f"PlannedGenerator takes the PrefixMatcher that makes its plans, not {type(matcher).__name__}")
        self.matcher = matcher

    async def generate(
        self,
        kv: KVSession,
        plan: PrefillPlan,
        *,
        max_new_tokens: int = 16,
        sampling: SamplingParams = GREEDY,
        stop: Collection[int] = (),
        on_token: Callable[[int], None] | None = None,
    ) -> PlannedGeneration:
        """Prefill `plan` (made by this generator's matcher on `kv`) and generate (see the module
        docstring). If it fails, or is cancelled before it decodes, the session's history goes back
        to before the plan; cancelled while it decodes, the history keeps the reply so far."""
        started = time.perf_counter()
        self.bind(kv)
        if not isinstance(plan, PrefillPlan):
            raise EngineError(f"generate() takes the PrefillPlan of matcher.full/incremental, not {type(plan).__name__}")
        if plan.session != kv.session or plan.page_tokens != kv.layout.page_tokens:
            raise EngineError(
                f"the plan is for session {plan.session!r} with {plan.page_tokens}-token pages; this KVSession is "
                f"{kv.session!r} with {kv.layout.page_tokens}: plan on the same `kv`"
            )
        if plan.n_tokens < 1:
            raise EngineError("generate(): the plan has no positions; give the request some input")
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise EngineError(f"generate(): max_new_tokens is a whole number >= 0, not {max_new_tokens!r}")
        stops = frozenset(token_list(stop, allow_empty=True))
        sampler = TokenSampler(sampling)
        decoding: list[bool] = []  # (set once the prefill is done and the reply is being decoded)
        try:
            return await self._generate(kv, plan, max_new_tokens, sampler, stops, on_token, started, decoding)
        except asyncio.CancelledError:
            if not decoding:  # cancelled before the reply began: the turn did not happen
                self.matcher.rollback(plan)
            raise  # (else the history keeps the prompt and the reply so far: `_generate`)
        except BaseException:
            self.matcher.rollback(plan)  # the turn did not happen: the session's next one builds on the last good one
            raise

    async def _generate(
        self,
        kv: KVSession,
        plan: PrefillPlan,
        max_new_tokens: int,
        sampler: TokenSampler,
        stops: frozenset,
        on_token: Callable[[int], None] | None,
        started: float,
        decoding: list[bool],
    ) -> PlannedGeneration:
        torch = _torch()
        size, n = plan.page_tokens, plan.n_tokens
        keys = list(plan.keys)

        # where every position's K/V lives
        allocated = allocate(kv, list(plan.new_keys))
        made = sum(kv.fresh(key) for key in plan.new_keys)
        in_pool = len(keys)
        frames = [(frame.offset, frame.end, frame.hidden, frame.first_page, list(frame.keys)) for frame in plan.frames]
        if not frames and max_new_tokens:
            in_pool = len(keys) - 1  # every page hit: run the last page again (in scratch) to get logits
            frames = [(in_pool * size, n, plan.hidden(in_pool * size, n), in_pool, [])]
        scratch = ScratchPages(kv, in_pool)
        context = ContextSlots(n)
        context.set_pages((list(plan.hit.slots) + allocated)[:in_pool], size)
        for position in range(in_pool * size, n):
            context.set(position, scratch.slot(position))

        # prefill, frame by frame, committing what each completes
        published, steps, result = True, 0, None
        for index, (_, end, rows, first_page, frame_keys) in enumerate(frames):
            last = index == len(frames) - 1
            embeddings = torch.as_tensor(rows, dtype=torch.float32)
            capture = _LAST if last else frozenset()
            step = StepRequest(embeddings=embeddings, slots=context.upto(end), capture=capture)
            result = await self._step(step, sampler if last and max_new_tokens else None)
            steps += 1
            if frame_keys:
                published = kv.commit(frame_keys, start=first_page) and published
        hidden = None if result is None else result.hidden_last

        generated: list[int] = []
        first_seconds = None
        if max_new_tokens and result is not None:
            generated.append(int(result.token))
            first_seconds = time.perf_counter() - started
            if on_token is not None:
                on_token(generated[-1])
        decoding.append(True)
        try:
            while generated and len(generated) < max_new_tokens and generated[-1] not in stops:
                position = n + len(generated) - 1
                context.set(position, scratch.slot(position))
                result = await self._step(
                    StepRequest(token_ids=generated[-1:], slots=context.upto(position + 1), capture=_LAST), sampler
                )
                hidden = result.hidden_last
                generated.append(int(result.token))
                steps += 1
                if on_token is not None:
                    on_token(generated[-1])
        except asyncio.CancelledError:  # (a barge-in): the reply so far joins the history, its full pages committed
            self._record(kv, plan, generated, scratch)
            raise

        extra_made, extra_published = self._record(kv, plan, generated, scratch)
        computed = n + max(len(generated) - 1, 0)  # the last generated token never ran
        return PlannedGeneration(
            tokens=generated,
            prompt_tokens=n,
            reused_tokens=plan.hit_tokens if in_pool == len(keys) else in_pool * size,
            computed_tokens=n - (plan.hit_tokens if in_pool == len(keys) else in_pool * size),
            committed_pages=made + extra_made,
            steps=steps,
            first_token_seconds=first_seconds,
            published=published and extra_published,
            hidden=hidden,
            context_slots=context.upto(computed).clone(),
        )

    def _record(self, kv: KVSession, plan: PrefillPlan, generated: list[int], scratch: ScratchPages) -> tuple[int, bool]:
        """Append the generated tokens to the session's history and commit the pages whose every
        position ran (their K/V are in scratch: copy each into a page named by its key)."""
        if not generated:
            return 0, True
        new = self.matcher.record_output(kv.session, Text(generated))
        size = plan.page_tokens
        computed = plan.n_tokens + len(generated) - 1
        ready = [(new.first_page + i, key) for i, key in enumerate(new.keys) if (new.first_page + i + 1) * size <= computed]
        if not ready:
            return 0, True
        keys = [key for _, key in ready]
        slots = allocate(kv, keys)
        sources: list[int] = []
        targets: list[int] = []
        made = 0
        for (page, key), slot in zip(ready, slots, strict=True):
            if kv.fresh(key):
                sources += [scratch.slot(position) for position in range(page * size, page * size + size)]
                targets += range(slot * size, slot * size + size)
                made += 1
        if sources:
            self.engine.copy_slots(sources, targets)
        return made, kv.commit(keys, start=ready[0][0])


@dataclass(frozen=True)
class PlacedContext:
    """A context's K/V made present in the pool by `place_context`."""

    slots: Any  # (positions,) int64 token slots, in order (valid in the kv block)
    reused_tokens: int  # positions whose K/V the pool held
    computed_tokens: int  # positions recomputed here from their hidden states


async def place_context(
    kv: KVSession, engine: EngineAdapter, rows: Any, keys: Sequence[str], *, batcher: ContinuousBatcher | None = None
) -> PlacedContext:
    """Make the K/V of a context present in the pool and return its slots: the context is given
    by its input hidden states `rows` (positions, hidden) and the page keys of its full pages (as a
    `PlannedGeneration`'s producer committed them). Pages the pool holds are matched; the others,
    and the trailing partial page, are recomputed from `rows` in one step (full pages committed,
    the partial page in scratch held until the kv block ends). A DiT in another process than the
    LLM uses this to read the same text K/V: reused where the pool has them, recomputed where not.
    `engine` must be bound to `kv`'s pool (e.g. by the PlannedGenerator serving it)."""
    torch = _torch()
    rows = torch.as_tensor(rows, dtype=torch.float32)
    size = kv.layout.page_tokens
    if rows.dim() != 2 or rows.shape[0] < 1:
        raise EngineError(f"place_context(): rows are the context's hidden states (positions, hidden), not {tuple(rows.shape)}")
    keys = list(keys)
    if len(keys) != rows.shape[0] // size:
        raise EngineError(
            f"place_context(): {len(keys)} page keys for {rows.shape[0] // size} full pages of {size} positions; "
            f"give one key per full page"
        )
    hit = await kv.match(keys)
    allocated = allocate(kv, keys[hit.pages :])
    context = ContextSlots(rows.shape[0])
    context.set_pages(list(hit.slots) + allocated, size)
    scratch = ScratchPages(kv, len(keys))
    for position in range(len(keys) * size, rows.shape[0]):
        context.set(position, scratch.slot(position))
    begin = hit.pages * size
    if begin < rows.shape[0]:
        request = StepRequest(embeddings=rows[begin:], slots=context.upto(rows.shape[0]), capture=frozenset())
        if batcher is not None:
            await batcher.step(request, None)
        else:
            engine.forward(StepBatch([request]))
        if len(keys) > hit.pages:
            kv.commit(keys[hit.pages :], start=hit.pages)
    return PlacedContext(context.upto(rows.shape[0]).clone(), begin, int(rows.shape[0]) - begin)


def _torch() -> Any:
    import torch

    return torch
