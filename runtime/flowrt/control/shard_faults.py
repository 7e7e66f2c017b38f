"""Processes that go down, as the calls spread over processes (flowrt.control.shards) see them:
which calls a lost process takes with it, and which processes a call routes around.

- **The calls a lost process takes with it.** It may have held credit, so the calls that sent it
  work can never be known complete: the gateway asks every other process up which of its calls
  sent it work (TOUCHED_ASK / TOUCHED) and ends exactly those with an error naming the role and
  replica; should a process not answer within a second, every call in flight (none may hang).
- **Routing around it.** The gateway keeps which replica processes are down (its supervisor
  tells it: `down` / `up`). A call admitted while some are down carries that set in every
  message it sends, and every process routes that call's work by it, so all of a call's frames
  of one bucket still meet in one process however late a process hears of a change: an
  `lb session` session pinned to a process that is down goes to another replica of the role
  for as long as it is down, a bucket or a frame that would go there goes to another, and
  where every replica of the role is down the work goes to its own and waits for the restart
  (flowrt.deploy.shard_gateway). A call admitted before the change keeps the set it started
  with (the calls that sent the lost process work are ended, above).

Owned by `Shards` (`shards.faults`); imports only flowrt.control's own modules.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from flowrt.control.envelopes import TOUCHED, TOUCHED_ASK, Envelope

ANSWER_WAIT = 1.0  # seconds the gateway waits for a process to say which calls sent work to a lost one


class Faults:
    def __init__(self, shards: Any):
        self.shards = shards
        self.down: frozenset[int] = frozenset()  # the gateway's: replica processes down now (what new calls route around)
        self.asked: dict[int, tuple[set[int], set[int], asyncio.Future]] = {}  # TOUCHED_ASK: who is to answer, calls
        self.tokens = itertools.count(1)

    # ── routing around processes that are down ──

    def set_down(self, process: int, down: bool) -> None:
        """The gateway's: `process` went down (or is back); calls admitted from now on route so."""
        self.down = self.down | {process} if down else self.down - {process}
        if down:
            self.shards.loads.forget(process)

    @staticmethod
    def pick(hosts: tuple[int, ...], number: int, down: frozenset[int]) -> int:
        """Of `hosts`, the one `number` picks: `hosts[number % len]` while it is up (so nothing
        moves that was not on a process that is down), else one of those up, by the same number;
        where none is up, the first pick (the work waits for its restart)."""
        first = hosts[number % len(hosts)]
        if first not in down:
            return first
        up = [host for host in hosts if host not in down]
        return up[number % len(up)] if up else first

    # ── the calls a lost process takes with it ──

    def touched(self, process: int) -> list[int]:
        """The calls whose shards here (or forgotten ones' notes) sent work to `process`."""
        shards = self.shards
        calls = [call_id for call_id, call in shards.calls.items() if process in call.router.peers]
        return calls + [call_id for call_id, (_, peers) in shards.forwards.items() if process in peers]

    async def lost(self, process: int, role: str, message: str, wait: float = ANSWER_WAIT) -> None:
        """The gateway's: `process` went down with whatever credit it held, so the calls that
        sent it work can never be known complete: end each with an error of `role` saying
        `message` (`touching` finds them)."""
        self.end(await self.touching(process, wait), role, message)

    async def touching(self, process: int, wait: float = ANSWER_WAIT) -> set[int]:
        """The gateway's: the calls that sent `process` work, asked of every other process up;
        should one not answer within `wait` seconds, every call in flight (none may hang)."""
        shards = self.shards
        others = set(shards.placement.processes) - {shards.me, process} - self.down
        waiter = asyncio.get_running_loop().create_future()
        token = next(self.tokens)
        self.asked[token] = (set(others), set(self.touched(process)), waiter)
        for other in sorted(others):
            shards.send(other, Envelope(0, "", "", shards.me, TOUCHED_ASK, (token, process), None))
        if not others:
            waiter.set_result(None)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), wait)
            return self.asked[token][1]
        except TimeoutError:
            return set(shards.calls)
        finally:
            self.asked.pop(token, None)

    def end(self, call_ids: set[int], role: str, message: str) -> None:
        """The gateway's: end the calls `call_ids` still in flight with an error of `role` saying `message`."""
        for call_id in sorted(call_ids):
            call = self.shards.calls.get(call_id)
            if call is not None and call.router.coordinator is not None and not call.ended:
                call.fail(message, "")
                call.errors[-1]["role"] = role
                call.router.coordinator.finish(call)

    def receive(self, envelope: Envelope) -> None:
        """TOUCHED_ASK (answered with the calls here that sent the process work) or TOUCHED (the gateway's)."""
        shards = self.shards
        if envelope.kind == TOUCHED_ASK:
            token, process = envelope.body
            answer = Envelope(0, "", "", shards.me, TOUCHED, (token, self.touched(process)), None)
            shards.send(envelope.sender, answer)
            return
        token, calls = envelope.body
        asked = self.asked.get(token)
        if asked is not None and shards.me == shards.placement.gateway:
            waiting, touched, waiter = asked
            waiting.discard(envelope.sender)
            touched.update(calls)
            if not waiting and not waiter.done():
                waiter.set_result(None)
