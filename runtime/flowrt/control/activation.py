"""What the control core keeps per activation, and the small awaitables its run loop uses.

`Activation` is one firing of a node (its inputs, roots, order key, replica, frames so far,
and the links rule 13 uses to pause its producer); `JoinState` is a count join's values so far;
`NO_TIMEOUT` is what an activation enters when its interface has no timeout; `Resume` is
`await` for a coroutine whose first step already ran by hand (flowrt.control.call._run).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowrt.control.program import NodeProgram


class Activation:
    __slots__ = (
        "node",
        "group",
        "aid",
        "inputs",
        "roots",
        "order",
        "replica",
        "extras",
        "yielded",
        "finished",
        "parent",
        "children",
        "pause",
        "resume",
        "sources",
        "started",
    )

    def __init__(self, node: NodeProgram, group: int, aid: int, inputs: dict, roots: tuple, order: tuple):
        self.node = node
        self.group = group
        self.aid = aid
        self.inputs = inputs
        self.roots = roots  # diamond-root entries (root index, aid, yield index), outermost first
        self.order = order  # the order key of the frame(s) that activated it
        self.replica = -1  # the replica it runs on, once started
        self.extras: tuple = ()  # lb broadcast: the other replicas' runs
        self.yielded = 0  # frames produced so far
        self.finished = False
        self.parent: Activation | None = None  # whose frame readied it, if that one waits for it (rule 13)
        self.children = 0  # activations its frames readied that have not finished
        self.pause = False  # give the loop a turn, and maybe wait, before its next frame
        self.resume: asyncio.Future | None = None  # set while it waits for its consumers
        # for an observer (flowrt.observe), set only while one is installed: the ids (producer
        # aid, yield index) of the frames it consumes, (0, 0) for the caller's entry values; and
        # when it started, in the observer's clock
        self.sources: tuple = ()
        self.started = 0.0

    def wake(self) -> None:
        """Let it go on if it waits for its consumers (or the caller) to catch up (rule 13)."""
        resume = self.resume
        if resume is not None and not resume.done():
            resume.set_result(None)

    def order_bound(self) -> tuple | None:
        """The smallest order key its frames still to come can have (None: no more frames).
        Only asked of activations of nodes that keep or extend keys (not `lb session` nodes)."""
        if self.finished:
            return None
        if self.node.stream:
            return self.order + (self.yielded,)
        return None if self.yielded else self.order


class Done:
    """An awaitable that is already complete: awaiting it returns None at once."""

    __slots__ = ()

    def __await__(self):
        return iter(())


class NoTimeout:
    """What an activation enters when its interface has no timeout: nothing, at the cost of two
    calls (a coroutine around the role's run would cost an object per activation)."""

    __slots__ = ()

    def __aenter__(self) -> Done:
        return DONE

    def __aexit__(self, *exc_info: object) -> Done:
        return DONE  # None: an exception passes through


DONE = Done()
NO_TIMEOUT = NoTimeout()


class Resume:
    """`await` for a coroutine (or awaitable iterator) whose first step already ran by hand:
    passes what it waits on up to the task and passes back what the task sends (its wake-up)
    or throws (a cancellation), as `await` would; its result is the coroutine's."""

    __slots__ = ("awaitable", "waiting")

    def __init__(self, awaitable: Any, waiting: Any):
        self.awaitable = awaitable
        self.waiting = waiting

    def __await__(self):
        awaitable, waiting = self.awaitable, self.waiting
        while True:
            try:
                sent = yield waiting
            except GeneratorExit:
                awaitable.close()
                raise
            except BaseException as error:  # noqa: BLE001 - thrown in by the task: passed on, as `await` does
                try:
                    waiting = awaitable.throw(error)
                except StopIteration as finished:
                    return finished.value
            else:
                try:
                    waiting = awaitable.send(sent)
                except StopIteration as finished:
                    return finished.value


class JoinState:
    __slots__ = ("values", "frames", "fired")

    def __init__(self) -> None:
        self.values: dict[str, list] = {}
        self.frames: dict[str, list] = {}  # observing: per field, the ids of the frames it may pass on
        self.fired = False
