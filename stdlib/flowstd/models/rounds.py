"""Rounds of requests made at about the same time, run together: what the model batchers of
flowstd.models (`VocoderBatcher`, `AudioEncoderBatcher`) share.

`LoopRounds(run_round, name=...)`: `await rounds.ask(item)` queues `item` and waits for its answer.
Everything asked while the event loop was busy elsewhere (at most `SETTLE_TURNS` turns of the loop,
no timer, as flowrt's ContinuousBatcher waits for woken requests) becomes one round:
`run_round(asked)` gets the list and sets every member's `future` (a result or an exception). A
member cancelled before its round is dropped; one that `run_round` leaves unanswered, or every
member of a round that raises, fails with a one-line error naming the batcher. One event loop; the
round runs on it, as a role's code does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

SETTLE_TURNS = 8  # at most this many turns of the loop for the other callers to ask

Item = TypeVar("Item")


@dataclass
class Asked(Generic[Item]):
    item: Item
    future: asyncio.Future


@dataclass
class RoundCounters:
    rounds: int = 0  # rounds run
    dropped: int = 0  # callers cancelled before their round


class LoopRounds(Generic[Item]):
    def __init__(self, run_round: Callable[[list[Asked[Item]]], None], *, name: str) -> None:
        self.run_round = run_round
        self.name = name
        self.counters = RoundCounters()
        self._asked: list[Asked[Item]] = []
        self._runner: asyncio.Task | None = None

    async def ask(self, item: Item) -> Any:
        loop = asyncio.get_running_loop()
        asked = Asked(item, loop.create_future())
        self._asked.append(asked)
        if self._runner is None or self._runner.done():
            self._runner = loop.create_task(self._run(), name=f"flowstd-{self.name}")
        return await asked.future

    async def _run(self) -> None:
        try:
            while self._asked:
                for _ in range(SETTLE_TURNS):
                    count = len(self._asked)
                    await asyncio.sleep(0)
                    if len(self._asked) == count:
                        break
                batch, self._asked = self._asked, []
                live = [asked for asked in batch if not asked.future.done()]
                self.counters.dropped += len(batch) - len(live)
                if not live:
                    continue
                self.counters.rounds += 1
                try:
                    self.run_round(live)
                except Exception as error:  # (a model whose output has another shape): this round's callers fail
                    fail(live, RuntimeError(f"the {self.name} could not run this round ({error!r})"))
                fail(live, RuntimeError(f"the {self.name} left this request unanswered (a bug in its round)"))
        except BaseException as error:  # the loop is closing (or a bug): no caller is left waiting
            fail(self._asked, RuntimeError(f"the {self.name} stopped before these requests ran ({error!r})"))
            self._asked.clear()
            raise

    def statistics(self) -> dict[str, int]:
        return {**vars(self.counters), "waiting": len(self._asked)}


def fail(asked: list[Asked[Any]], error: BaseException) -> None:
    """Fail the members not answered yet."""
    for each in asked:
        if not each.future.done():
            each.future.set_exception(error)
