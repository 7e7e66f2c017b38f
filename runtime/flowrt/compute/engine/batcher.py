"""Continuous batching: the steps of concurrent requests, collected across calls, run as one
forward (DESIGN §7; the scheduling idea of Orca and vLLM, written for one asyncio event loop).

Each request runs its own loop (prefill, then one decode step per token) and awaits
`batcher.step(request, sampler)` for every step. The batcher gathers every step submitted while
the event loop is busy elsewhere, runs them as one `engine.forward` (a decode of one request
beside the prefill of another is fine), samples each request's token with its own sampler (one
`engine.sample` call for the batch), and wakes the requests, which submit their next steps while
it waits for the loop to come round again: requests join and leave between any two steps.

- A batch holds at most `max_requests` requests and `max_tokens` new tokens (a single step larger
  than that runs alone). Steps run in the order they were submitted.
- No timer: the batcher lets the loop run until no more steps arrive (a few turns of the loop),
  then runs what it has. `wait` (seconds) makes it wait that long for more when the batch is not
  full: fewer, larger steps for more latency.
- A batch whose forward raises is run again one request at a time, so a bad request fails alone.
- A step whose caller was cancelled before it ran is dropped: nothing is written to its slots
  (the caller may already have released them). The forward runs on the event loop itself, so a
  caller cannot be cancelled while its step is in the engine.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from flowrt.compute.engine.adapter import CAPTURE_LOGITS, EngineAdapter, EngineError, StepBatch, StepRequest, StepResult
from flowrt.compute.engine.sampling import TokenSampler

SETTLE_TURNS = 8  # at most this many turns of the loop to let woken requests submit their next steps


@dataclass
class BatcherStats:
    forwards: int = 0  # engine.forward calls
    steps: int = 0  # requests' steps run (a request's step is in one forward)
    tokens: int = 0  # new tokens run
    largest_batch: int = 0
    split_batches: int = 0  # batches run again one request at a time after a forward raised
    dropped_steps: int = 0  # steps whose caller was cancelled before they ran


@dataclass
class _Pending:
    request: StepRequest
    sampler: TokenSampler | None
    future: asyncio.Future


class ContinuousBatcher:
    def __init__(self, engine: EngineAdapter, *, max_requests: int = 256, max_tokens: int = 8192, wait: float = 0.0):
        if not isinstance(engine, EngineAdapter):
            raise EngineError(f"ContinuousBatcher takes an EngineAdapter, not {type(engine).__name__}")
        if not isinstance(max_requests, int) or max_requests < 1 or not isinstance(max_tokens, int) or max_tokens < 1:
            raise EngineError(
                f"ContinuousBatcher: max_requests and max_tokens are whole numbers >= 1 ({max_requests}, {max_tokens})"
            )
        if not isinstance(wait, int | float) or wait < 0:
            raise EngineError(f"ContinuousBatcher: wait is a number of seconds >= 0, not {wait!r}")
        self.engine = engine
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self.wait = float(wait)
        self.stats = BatcherStats()
        self._pending: list[_Pending] = []
        self._runner: asyncio.Task | None = None

    async def step(self, request: StepRequest, sampler: TokenSampler | None = None) -> StepResult:
        """Run `request` in the next batch; with `sampler`, the result's `token` is sampled."""
        if not isinstance(request, StepRequest):
            raise EngineError(f"batcher.step() takes a StepRequest, not {type(request).__name__}")
        if sampler is not None and CAPTURE_LOGITS not in request.capture:
            raise EngineError("batcher.step(): a step with a sampler must capture 'logits' (the sampler reads them)")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append(_Pending(request, sampler, future))
        if self._runner is None or self._runner.done():
            self._runner = loop.create_task(self._run(), name="flowrt-engine-batcher")
        return await future

    async def _run(self) -> None:
        try:
            while self._pending:
                await self._settle()
                batch = self._take()
                if batch:
                    self._execute(batch)
        except BaseException as error:  # the loop is closing (or a bug): fail the waiting steps, never leave them hanging
            for item in self._pending:
                if not item.future.done():
                    item.future.set_exception(EngineError(f"the batcher stopped before this step ran ({error!r})"))
            self._pending.clear()
            raise

    async def _settle(self) -> None:
        """Let the loop turn until no new step arrives (or the batch is full)."""
        for _ in range(SETTLE_TURNS):
            count = len(self._pending)
            await asyncio.sleep(0)
            if len(self._pending) == count or count >= self.max_requests:
                break
        if self.wait and len(self._pending) < self.max_requests:
            await asyncio.sleep(self.wait)

    def _take(self) -> list[_Pending]:
        taken: list[_Pending] = []
        tokens = 0
        while self._pending and len(taken) < self.max_requests:
            item = self._pending[0]
            if item.future.done():  # its caller was cancelled: never touch its slots
                self._pending.pop(0)
                self.stats.dropped_steps += 1
                continue
            if taken and tokens + item.request.new_tokens > self.max_tokens:
                break
            taken.append(self._pending.pop(0))
            tokens += item.request.new_tokens
        return taken

    def _execute(self, batch: list[_Pending]) -> None:
        self.stats.forwards += 1
        try:
            results = self.engine.forward(StepBatch([item.request for item in batch]))
            if len(results) != len(batch):
                raise EngineError(f"engine returned {len(results)} results for a step of {len(batch)} requests")
            self._sample(batch, results)
        except Exception as error:
            if len(batch) > 1:  # find the request at fault: each alone
                self.stats.split_batches += 1
                for item in batch:
                    self._execute([item])
            elif not batch[0].future.done():
                batch[0].future.set_exception(error)
            return
        self.stats.steps += len(batch)
        self.stats.tokens += sum(item.request.new_tokens for item in batch)
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        for item, result in zip(batch, results, strict=True):
            if not item.future.done():
                item.future.set_result(result)

    def _sample(self, batch: list[_Pending], results: list[StepResult]) -> None:
        wanted = [(item, result) for item, result in zip(batch, results, strict=True) if item.sampler is not None]
        if not wanted:
            return
        tokens = self.engine.sample([result.logits for _, result in wanted], [item.sampler for item, _ in wanted])
        for (_, result), token in zip(wanted, tokens, strict=True):
            result.token = int(token)

    def statistics(self) -> dict[str, Any]:
        return {**vars(self.stats), "pending": len(self._pending)}
