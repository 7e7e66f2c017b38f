"""One graph call executing in this process: delivery, buckets, activations, dispatch, joins,
order, completion (DESIGN §4; docs/runtime.md gives the rules this module implements).

Delivery is synchronous: a signal goes inbound → bucket → fire on one call chain with no await,
so bucket state never interleaves. A fired activation is only queued there (`ready`), so the
user's code never runs inside the state machine. Queued activations wait for the task whose
step readied them and run in it one after another; when that task is about to suspend, the
ones still waiting get tasks of their own (`_launch`), so nothing waits across an await and a
role that never suspends costs no task (`_run`). On Python 3.12+ new tasks start eagerly. The
call ends when its in-flight count reaches zero; then every table of the call is empty, which
`statistics()` lets tests assert.

Signals are not objects: ARRIVED, SLOT_EOS and UNREACHABLE are the methods `_arrive`, `_end`
and `_unreachable`, taking the edge, the key and what the signal carries.

Order (docs/runtime.md, rule 7): every present frame carries an order key, a tuple that gains
one level per streaming hop. Ordered streams and ordered session nodes hold what arrives early
and let it through once no work in flight can still send them a smaller key (`_lower_bound`,
over the work the plan says can reach them: program.OrderConsumer); nothing is ever dropped.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import deque
from heapq import heappop, heappush, heapreplace
from types import AsyncGeneratorType, CoroutineType
from typing import TYPE_CHECKING, Any

from flowrt.control import bounds
from flowrt.control import bucket as _bucket
from flowrt.control import program as _program
from flowrt.control.bucket import Bucket
from flowrt.control.contract import checked_frame, failure, log_failure, second_frame, waiting_place
from flowrt.control.program import Edge, GraphProgram, NodeProgram, OrderConsumer
from flowrt.control.sequencer import Sequencer
from flowrt.control.signals import Reason

if TYPE_CHECKING:
    from flowrt.control.runtime import Runtime

log = logging.getLogger("flowrt")
# eager tasks (3.12+) run a role at once, inside the launching task's step; activations that make
# others ready nest, so past this depth new ones are scheduled on the loop instead (loops of
# synchronous roles would otherwise recurse once per round)
EAGER_TASKS = sys.version_info >= (3, 12)
MAX_EAGER_DEPTH = 16
# streams are bounded (docs/runtime.md, rule 13; flowrt.control.bounds)
PAUSE_EVERY, OUTBOX_HIGH, CHILDREN_HIGH = bounds.PAUSE_EVERY, bounds.OUTBOX_HIGH, bounds.CHILDREN_HIGH
# what the hot path compares with (the compiled core holds them as C values: call.pxd)
CALLER, DIRECT, JOIN, STREAM_SLOT = _program.CALLER, _program.DIRECT, _program.JOIN, _program.STREAM_SLOT
ORDERED_STREAM = _program.ORDERED_STREAM
WAITING, FIRED = _bucket.WAITING, _bucket.FIRED
EMPTY, ERROR, CANCEL = Reason.EMPTY, Reason.ERROR, Reason.CANCEL


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

    def order_bound(self) -> tuple | None:
        """The smallest order key its frames still to come can have (None: no more frames).
        Only asked of activations of nodes that keep or extend keys (not `lb session` nodes)."""
        if self.finished:
            return None
        if self.node.stream:
            return self.order + (self.yielded,)
        return None if self.yielded else self.order


class _Done:
    """An awaitable that is already complete: awaiting it returns None at once."""

    __slots__ = ()

    def __await__(self):
        return iter(())


class _NoTimeout:
    """What an activation enters when its interface has no timeout: nothing, at the cost of two
    calls (a coroutine around the role's run would cost an object per activation)."""

    __slots__ = ()

    def __aenter__(self) -> _Done:
        return DONE

    def __aexit__(self, *exc_info: object) -> _Done:
        return DONE  # None: an exception passes through


DONE = _Done()
NO_TIMEOUT = _NoTimeout()


class _Resume:
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
    __slots__ = ("values", "fired")

    def __init__(self) -> None:
        self.values: dict[str, list] = {}
        self.fired = False


class Call:
    def __init__(self, runtime: Runtime, program: GraphProgram, inputs: dict[str, Any], session: str, call_id: int):
        self.runtime = runtime
        self.program = program
        self.graph = program.name
        self.inputs = inputs
        self.session = session
        self.call_id = call_id
        self.loop = asyncio.get_running_loop()
        self.custom_tasks = self.loop.get_task_factory() is not None
        self.outbox: deque[dict | None] = deque()  # events for the caller; None ends the call
        self.waiter: asyncio.Future | None = None  # the caller, waiting for an event
        self.errors: list[dict[str, str]] = []
        self.buckets: dict[tuple, Bucket] = {}
        self.resolved: set[tuple] = set()  # keys of buckets that fired or died, so late signals are dropped
        self.open_buckets = [0] * len(program.nodes)  # open buckets per node (join completion)
        self.joins: dict[int, JoinState] = {}
        self.joins_done: set[int] = set()
        self.sequencers: dict[int, Sequencer] = {}
        self.seen_unreachable: set[tuple] = set()
        self.in_flight = 0  # activations scheduled, queued at a session node, or running
        self.running = 0  # activations launched or waiting to be
        self.running_by_node = [0] * len(program.nodes)
        self.session_counters = [0] * len(program.nodes)
        self.tasks: set[asyncio.Task] = set()
        self.ready: list[Activation] = []  # fired, not yet launched (see the module's docstring)
        self.eager_depth = 0
        self.last_aid = 0
        self.cancelled = False
        self.cancel_reason = ""  # why it was cancelled: "timeout", "client gone", "shutdown"
        self.ended = False  # the `done` event is out; every table of the call is empty
        self.end_waiters: list[asyncio.Future] | None = None
        # order: per ordered stream, the frames that came early (a heap by key); per order
        # consumer, its work in flight (a heap by order bound, refreshed lazily); per session
        # node some consumer's keys restart at, how much work that can reach it is alive
        self.stream_held: list[list] = [[] for _ in program.streams]
        self.order_heaps: list[list] = [[] for _ in program.consumers]
        self.order_waiting: set[OrderConsumer] = set()  # consumers holding frames or activations
        self.alive = [0] * len(program.resets)
        self.tickets = 0  # tie-breaks in the heaps: equal keys go in arrival order
        self.producer: Activation | None = None  # the activation whose frame is being dispatched
        self.outbox_waiters: list[Activation] = []  # activations waiting for the caller to take events
        self.returned: set[str] = set()
        self.errored: set[str] = set()

    # ── start and completion ──

    def start(self) -> None:
        self.in_flight += 1
        for join in self.program.joins:  # a join not yet resolved is work that can reach what it feeds
            for reset in join.reset_counters:
                self.alive[reset] += 1
        act = Activation(self.program.start, 0, self._aid(), self.inputs, (), ())
        self._dispatch_frame(act, self.inputs, 0, None)  # frames are only read: the caller's copy will do
        self._activation_done(act.node, None)
        self._launch()

    def _aid(self) -> int:
        self.last_aid += 1
        return self.last_aid

    def _ticket(self) -> int:
        self.tickets += 1
        return self.tickets

    def _activation_done(self, node: NodeProgram, act: Activation | None) -> None:
        """An activation of `node` ended, or (`act` None) a group of it died or it ran inline."""
        self.in_flight -= 1
        if act is not None:
            act.finished = True
            parent = act.parent
            if parent is not None:
                act.parent = None
                parent.children -= 1
                if parent.resume is not None and parent.children <= CHILDREN_HIGH // 2:
                    _wake(parent)
            for reset in node.reset_counters:
                self.alive[reset] -= 1
            if node.session:
                sequencer = self.sequencers[node.index]
                sequencer.finished()
                if not node.ordered:
                    self._spawn(sequencer.release(None))
        for join in node.join_watchers:
            if join.index in self.joins:
                self._try_join(join, False)
        if self.order_waiting:
            self._reorder()
        if self.running == 0:
            self._quiesce()

    def _quiesce(self) -> None:
        """Nothing is running: resolve a join nothing can feed any more, or finish the call."""
        for join in self.program.joins:
            if join.index not in self.joins_done and not self._fed(join) and self._try_join(join, True):
                return
        if self.in_flight == 0:
            self._finish()
        elif self.running == 0:
            self._unblock()

    def _fed(self, join: NodeProgram) -> bool:
        """Whether work in flight (an activation, an open bucket, a join) can still feed `join`."""
        running = self.running_by_node
        buckets = self.open_buckets
        nodes = self.program.nodes
        for index in join.ancestors:
            if running[index] or buckets[index]:
                return True
            upstream: NodeProgram = nodes[index]
            if upstream.join is not None and index not in self.joins_done:
                return True
        return False

    def _unblock(self) -> None:
        """Session queues hold activations while nothing runs and no join can resolve. The
        order bounds make this impossible (the held work that nothing else can reach may always
        go); should it happen anyway, a hang is the worst outcome: release the smallest."""
        held = [s for s in self.sequencers.values() if s.waiting() and not s.busy]
        if not held:
            log.error("call %s: %d activations in flight but none running or held (a flowrt bug)", self.call_id, self.in_flight)
            return
        sequencer = min(held, key=lambda s: s.held[0][:2] if s.held else ((), 0))
        log.error("call %s: the session queues are blocked; releasing one out of order (a flowrt bug)", self.call_id)
        self._spawn(sequencer.release(None))

    async def wait_ended(self) -> None:
        """Return once the call has ended."""
        if not self.ended:
            waiter = asyncio.get_running_loop().create_future()
            if self.end_waiters is None:
                self.end_waiters = []
            self.end_waiters.append(waiter)
            await waiter

    def _finish(self) -> None:
        if self.ended:
            return
        for stream, held in enumerate(self.stream_held):
            while held:  # nothing is in flight: whatever came early goes, in key order
                self._emit({"event": "stream", "field": self.program.streams[stream][0], "value": heappop(held)[2]})
        missing = [f for f in self.program.returns if f not in self.returned]
        errored_outputs = self.errored | ({*missing} if self.errors else set())
        status = "cancelled" if self.cancelled else ("error" if self.errors and errored_outputs else "ok")
        self.buckets.clear()
        self.resolved.clear()
        self.sequencers.clear()
        self.joins.clear()
        self.joins_done.clear()
        self.seen_unreachable.clear()
        self.order_waiting.clear()
        self.outbox_waiters.clear()
        for heap in self.order_heaps:
            heap.clear()
        done = {"event": "done", "status": status, "errors": list(self.errors), "missing": missing}
        if self.cancelled:
            done["reason"] = self.cancel_reason
        self._emit(done)
        self._emit(None)
        self.ended = True
        for waiter in self.end_waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def cancel(self, reason: str = "cancelled") -> None:
        """Cancel the call's work; `reason` ("timeout", "client gone", "shutdown") goes in its `done` event."""
        if self.cancelled or self.ended:
            return
        self.cancelled = True
        self.cancel_reason = reason
        for task in list(self.tasks):
            task.cancel()

    # ── inbound: the three signals ──

    def _arrive(self, edge: Edge, key: tuple, value: Any, roots: tuple, order: tuple) -> None:
        """ARRIVED at a bucket or stream slot."""
        bucket_key = (edge.node.index, edge.group.index, key)
        bucket = self._bucket(edge, bucket_key, roots)
        if bucket is None:
            return
        before = bucket.order
        outcome = bucket.arrived(edge.slot, value, order)
        if bucket.order is not before:  # its activation's key can now be this small
            for consumer in edge.node.bucket_feeds:
                heappush(self.order_heaps[consumer.index], (bucket.order, self._ticket(), bucket))
        if outcome != WAITING:
            self._close_bucket(edge, bucket_key, bucket, outcome)

    def _end(self, edge: Edge, key: tuple) -> None:
        """SLOT_EOS: the stream feeding a stream slot ended after delivering frames."""
        bucket_key = (edge.node.index, edge.group.index, key)
        bucket = self.buckets.get(bucket_key)
        if bucket is None:
            return  # frames came, so the bucket existed: it has resolved since
        outcome = bucket.ended(edge.slot)
        if outcome != WAITING:
            self._close_bucket(edge, bucket_key, bucket, outcome)

    def _unreachable(self, edge: Edge, key: tuple, roots: tuple, reason: Reason, origin: tuple | None) -> None:
        kind = edge.kind
        if kind == CALLER:
            if reason is ERROR or reason is CANCEL:
                self.errored.add(edge.field)
            return
        if kind == JOIN:
            return  # a join counts arrivals only; `all` fields end with their upstream
        node = edge.node
        group = edge.group
        if node.in_cycle and origin is not None:
            dedup = (origin, node.index, group.index, edge.slot)
            if dedup in self.seen_unreachable:
                return
            self.seen_unreachable.add(dedup)
        if kind == DIRECT:
            # one slot filled by one frame: the bucket would die on this very signal
            self._dead(node, roots, reason, origin)
            return
        bucket_key = (node.index, group.index, key)
        bucket = self._bucket(edge, bucket_key, roots)
        if bucket is None:
            return
        outcome = bucket.unreachable(edge.slot, reason, origin)
        if outcome != WAITING:
            self._close_bucket(edge, bucket_key, bucket, outcome)

    def _bucket(self, edge: Edge, bucket_key: tuple, roots: tuple) -> Bucket | None:
        """The open bucket of `bucket_key`, opened by this signal if need be; None once it fired
        or died (a critical slot can end it early), so late signals are dropped."""
        bucket = self.buckets.get(bucket_key)
        if bucket is None and bucket_key not in self.resolved:
            node = edge.node
            bucket = self.buckets[bucket_key] = Bucket(edge.group, roots)
            self.open_buckets[node.index] += 1
            for reset in node.reset_counters:
                self.alive[reset] += 1
        return bucket

    def _close_bucket(self, edge: Edge, bucket_key: tuple, bucket: Bucket, outcome: int) -> None:
        del self.buckets[bucket_key]
        self.resolved.add(bucket_key)
        bucket.closed = True
        node = edge.node
        self.open_buckets[node.index] -= 1
        for reset in node.reset_counters:
            self.alive[reset] -= 1
        if outcome == FIRED:
            self._schedule(Activation(node, edge.group.index, self._aid(), bucket.inputs(), bucket.roots, bucket.order))
        else:
            self._dead(node, bucket.roots, bucket.reason or EMPTY, bucket.origin)

    def _dead(self, node: NodeProgram, roots: tuple, reason: Reason, origin: tuple | None) -> None:
        """A group that will not fire for this key: its activation becomes a phantom."""
        self.in_flight += 1
        aid = self._aid()
        self._dispatch_phantom(node, aid, roots, reason, origin or (node.index, aid))
        self._activation_done(node, None)

    # ── joins ──

    def _join_arrived(self, node: NodeProgram, name: str, value: Any) -> None:
        state = self.joins.get(node.index)
        if state is None:
            state = self.joins[node.index] = JoinState()
        if not state.fired:
            values = state.values.get(name)
            if values is None:
                state.values[name] = [value]
            else:
                values.append(value)
            self._try_join(node, False)

    def _try_join(self, node: NodeProgram, final: bool) -> bool:
        state = self.joins.get(node.index)
        if state is None:
            if not final:
                return False
            state = self.joins[node.index] = JoinState()
        if state.fired or node.index in self.joins_done:
            return False
        # counts first (cheap); `all` fields only then: their upstream must have nothing running or pending
        complete = _counts_met(node, state) and (final or self._all_fields_ended(node))
        if not complete:
            if final:
                del self.joins[node.index]
                self._join_resolved(node)
                self._dead(node, (), ERROR if self.errors else EMPTY, None)
                return True
            return False
        state.fired = True
        self._join_resolved(node)
        # a counted field passes exactly its first N frames; `all` passes every frame
        inputs = {j.field: list(state.values.get(j.field, ()))[: j.threshold] for j in node.join or ()}
        self._schedule(Activation(node, 0, self._aid(), inputs, (), ()))  # one per call: the empty key
        return True

    def _join_resolved(self, node: NodeProgram) -> None:
        self.joins_done.add(node.index)
        for reset in node.reset_counters:
            self.alive[reset] -= 1

    def _all_fields_ended(self, node: NodeProgram) -> bool:
        running = self.running_by_node
        buckets = self.open_buckets
        for join in node.join or ():
            if join.threshold is None:
                for upstream in join.upstream:
                    if running[upstream] or buckets[upstream]:
                        return False
        return True

    # ── activations ──

    def _schedule(self, act: Activation) -> None:
        node = act.node
        self.in_flight += 1
        self.running_by_node[node.index] += 1
        if not node.interface:
            self._dispatch_frame(act, act.inputs, 0, None)
            self.running_by_node[node.index] -= 1
            self._activation_done(node, None)
            return
        for reset in node.reset_counters:
            self.alive[reset] += 1
        for consumer in node.order_feeds:
            heappush(self.order_heaps[consumer.index], (act.order_bound(), self._ticket(), act))
        producer = self.producer
        if producer is not None and not node.in_cycle:  # (a loop could wait on itself)
            act.parent = producer
            producer.children += 1
            if producer.children >= CHILDREN_HIGH:
                producer.pause = True
        if not node.session:
            self._spawn(act)
            return
        sequencer = self.sequencers.get(node.index)
        if sequencer is None:
            sequencer = self.sequencers[node.index] = Sequencer(node.ordered)
        sequencer.hold(act, act.order, self._ticket())
        if node.ordered:
            self.order_waiting.add(node.consumer)
            self._release_session(node.consumer)
        else:
            self._spawn(sequencer.release(None))

    def _spawn(self, act: Activation | None) -> None:
        if act is not None:
            self.running += 1
            self.ready.append(act)

    def _launch(self) -> None:
        """Start every ready activation in a task of its own: the current step is about to
        suspend, or it is the caller's (which runs no roles)."""
        if not self.ready:
            return
        ready, self.ready = self.ready, []
        for act in ready:
            self._start_task(act)

    def _start_task(self, act: Activation) -> None:
        loop = self.loop
        if self.custom_tasks:
            loop.create_task(self._run(act))  # the loop's task factory decides
        elif EAGER_TASKS and self.eager_depth < MAX_EAGER_DEPTH:
            self.eager_depth += 1
            try:
                asyncio.Task(self._run(act), loop=loop, eager_start=True)
            finally:
                self.eager_depth -= 1
        else:
            asyncio.Task(self._run(act), loop=loop)  # what loop.create_task does without a factory

    async def _run(self, act: Activation) -> None:
        """Run an activation, then the ones ready by then, one after another in this task.

        Activations readied by a step of this task (`ready`) wait for it, not for a task of
        their own: the first is run here once the current one ends. If the current one is
        about to suspend, every waiting activation is handed to a task of its own first
        (`_launch`), so nothing waits across an await and concurrency is as if each had had its
        own task from the start. To see that moment the role is stepped by hand while others
        wait (`_first_step`, then `await _Resume`, which is `await` for a started coroutine); a
        role that never suspends then costs no task and no turn of the event loop.

        The task is in `tasks` (what `cancel` cancels) only while this body runs: a task
        cancelled before its first step would never run it, and its activation would never end.
        Created but not started, it starts, finds the call cancelled and ends as cancelled.
        """
        task = asyncio.current_task()
        self.tasks.add(task)
        try:
            while True:
                node = act.node
                streams: dict | None = {} if node.feeds_stream_slots else None
                reason: Reason | None = None
                result = limit = None
                try:
                    if self.cancelled:
                        raise asyncio.CancelledError
                    result = self._begin(act)
                    if node.timeout is not None:
                        limit = asyncio.timeout(node.timeout)
                    async with NO_TIMEOUT if limit is None else limit:
                        if type(result) is AsyncGeneratorType:
                            while True:
                                if act.pause:  # every PAUSE_EVERY frames, or its consumers are behind
                                    self._launch()
                                    await self._pause(act)
                                if not self.ready:
                                    async for frame in result:
                                        self._yielded(act, frame, streams)
                                        if self.ready or act.pause:
                                            break
                                    else:
                                        break  # the stream has ended
                                    if act.pause:
                                        continue
                                # others wait for this task: step by hand to see whether it suspends
                                step = result.__anext__()
                                try:
                                    done, frame = _first_step(step)
                                    if not done:
                                        self._launch()
                                        frame = await _Resume(step, frame)
                                except StopAsyncIteration:
                                    break
                                self._yielded(act, frame, streams)
                        elif self.ready and type(result) is CoroutineType:
                            done, frame = _first_step(result)
                            if not done:
                                self._launch()
                                frame = await _Resume(result, frame)
                            self._returned(act, frame, streams)
                        else:
                            self._launch()  # nothing waits, or an awaitable that cannot be stepped by hand
                            self._returned(act, await result, streams)
                        if act.extras:  # broadcast: the other replicas run for their side effects
                            self._launch()
                            for extra in act.extras:
                                await _drain(extra)
                    if limit is not None and limit.expired():  # the role swallowed the cancellation and returned
                        raise TimeoutError
                except TimeoutError as error:
                    if limit is not None and limit.expired():
                        reason = CANCEL
                        # where the role was waiting: the cancellation the timeout threw into it
                        where = waiting_place(error, result, self.runtime.bundle.python_path)
                        self._error(node, f"timed out after {node.timeout:g}s", where)
                        self.cancel("timeout")
                    else:  # the role's own (a backend it waited for timed out)
                        reason = ERROR
                        self._role_failed(act, error, result)
                except asyncio.CancelledError as error:
                    if self.cancelled or task.cancelling():
                        reason = CANCEL
                    else:  # raised by the role itself, nobody cancelled it
                        reason = ERROR
                        self._role_failed(act, error, result)
                except BaseException as error:  # noqa: BLE001 - even SystemExit from a role fails the call, not the process
                    if type(error) is GeneratorExit and (error.__traceback__ is None or error.__traceback__.tb_next is None):
                        raise  # thrown into this coroutine as it is closed (the loop is going away): not the role's doing
                    reason = ERROR
                    self._role_failed(act, error, result)
                finally:
                    self._finished(act)
                    if act.yielded == 0:
                        self._dispatch_phantom(node, act.aid, act.roots, reason or EMPTY, (node.index, act.aid))
                    if streams:
                        self._end_streams(act, streams, reason)
                    self.running_by_node[node.index] -= 1
                    self.running -= 1
                    self._activation_done(node, act)
                if not self.ready:
                    return
                act = self._next_ready()
        finally:
            self.tasks.discard(task)

    def _next_ready(self) -> Activation:
        """The waiting activation to run next in this task: one whose role returns if there is
        one, else the first. A streaming role run while others wait is stepped by hand frame by
        frame; run last, it usually has nothing waiting and streams through `async for`."""
        ready = self.ready
        for i in range(len(ready)):
            act = ready[i]
            if not act.node.generator:
                return ready.pop(i)
        return ready.pop(0)

    def _error(self, node: NodeProgram, message: str, where: str = "") -> None:
        self.errors.append({"role": node.role or "", "interface": node.method, "message": message, "where": where})

    def _begin(self, act: Activation) -> Any:
        """Invoke the role on its replica(s): the chosen replica's async generator or awaitable."""
        node = act.node
        binding = node.binding
        act.replica, result, act.extras = binding.begin(node, self.session, self.call_id, self.graph, act.inputs)
        return result

    def _finished(self, act: Activation) -> None:
        binding = act.node.binding
        binding.finished(act.replica, act.extras)

    def _yielded(self, act: Activation, frame: Any, streams: dict | None) -> None:
        """A frame the role yielded: dispatch it (what it readies waits for this task)."""
        if self.cancelled:  # the role caught the call's cancellation and went on yielding
            raise asyncio.CancelledError
        node = act.node
        frame = _as_frame(frame, node)
        if act.yielded and not node.stream:
            raise second_frame(node.id)
        self.producer = act
        self._dispatch_frame(act, frame, act.yielded, streams)
        self.producer = None
        yielded = act.yielded = act.yielded + 1
        if yielded % PAUSE_EVERY == 0 or len(self.outbox) >= OUTBOX_HIGH:
            act.pause = True
        if self.order_waiting:  # its next frame's key is larger: what waited for this one may go
            self._reorder()

    def _returned(self, act: Activation, frame: Any, streams: dict | None) -> None:
        """The role returned: dispatch its frame (None is none)."""
        if frame is not None:
            self._dispatch_frame(act, _as_frame(frame, act.node), 0, streams)
            act.yielded = 1

    async def _pause(self, act: Activation) -> None:
        """Between two frames of a streaming activation: wait while the caller or the
        activations its frames readied are behind (rule 13), else give the loop one turn."""
        act.pause = False
        if asyncio.current_task().cancelling():  # a timeout or cancel the role caught and went on from
            raise asyncio.CancelledError
        waited = False
        while len(self.outbox) >= OUTBOX_HIGH or act.children >= CHILDREN_HIGH:
            if len(self.outbox) >= OUTBOX_HIGH and act not in self.outbox_waiters:
                self.outbox_waiters.append(act)
            act.resume = self.loop.create_future()
            try:
                await act.resume
            finally:
                act.resume = None
            waited = True
        if not waited:
            await asyncio.sleep(0)

    def taken(self) -> None:
        """The caller took events: wake the activations waiting for room (rule 13)."""
        if len(self.outbox) <= OUTBOX_HIGH // 2:
            waiters, self.outbox_waiters = self.outbox_waiters, []
            for act in waiters:
                _wake(act)

    def _role_failed(self, act: Activation, error: BaseException, result: Any) -> None:
        """A role raised (or broke the role protocol): an error event with the place in the
        role's code, and the traceback in the log."""
        node = act.node
        message, where = failure(error, result, self.runtime.bundle.python_path)
        self._error(node, message, where)
        replica = f"replica {act.replica}" if act.replica >= 0 else "every replica"  # (broadcast)
        line = f"call {self.call_id} (session {self.session}): {node.id} on {replica} failed at {where or '?'}: {message}"
        log_failure(log, line, error)

    # ── outbound ──

    def _out_order(self, node: NodeProgram, order: tuple, yidx: int) -> tuple:
        """The order key of frame `yidx` of an activation of `node` whose own key is `order`."""
        if node.session:  # session nodes re-number their frames 0, 1, ... per call
            out = self.session_counters[node.index]
            self.session_counters[node.index] = out + 1
            return (out,)
        return order + (yidx,) if node.stream else order

    def _dispatch_frame(self, act: Activation, frame: dict, yidx: int, streams: dict | None) -> None:
        node = act.node
        roots = _out_roots(node, act.aid, act.roots, yidx) if node.diamond_root or (act.roots and node.carried) else ()
        order = self._out_order(node, act.order, yidx)
        for route in node.routes:
            name = route.field
            if name in frame:
                value = frame[name]
                for edge in route.edges:
                    kind = edge.kind
                    if kind == CALLER:
                        self._caller_arrived(edge, value, order)
                    elif kind == DIRECT:
                        self._schedule(Activation(edge.node, edge.group.index, self._aid(), {name: value}, roots, order))
                    elif kind == JOIN:
                        self._join_arrived(edge.node, name, value)
                    else:
                        key = _key(node, act.aid, edge, roots, yidx)
                        self._arrive(edge, key, value, roots, order)
                        if kind == STREAM_SLOT and streams is not None:
                            opened = streams.get((edge, key))
                            if opened is None or not opened[0]:
                                streams[(edge, key)] = (True, roots)
            else:
                for edge in route.absent:
                    key = _key(node, act.aid, edge, roots, yidx)
                    if edge.kind == STREAM_SLOT:
                        if streams is not None and (edge, key) not in streams:
                            streams[(edge, key)] = (False, roots)
                    else:
                        self._unreachable(edge, key, roots, EMPTY, (node.index, act.aid, yidx))

    def _dispatch_phantom(self, node: NodeProgram, aid: int, roots: tuple, reason: Reason, origin: tuple) -> None:
        """An activation (or group) that produced nothing: every edge learns it is unreachable.
        Absent frames have no order key: nothing waits for them (rule 7)."""
        out_roots = _out_roots(node, aid, roots, 0)
        for route in node.routes:
            for edge in route.absent:
                self._unreachable(edge, _key(node, aid, edge, out_roots, 0), out_roots, reason, origin)

    def _end_streams(self, act: Activation, streams: dict, reason: Reason | None) -> None:
        """The activation ended: close every stream slot its frames used, as an end of stream
        if it delivered and did not fail, else as unreachable. The signal carries the roots of
        the frames that used the slot: it may be the first its bucket sees."""
        for (edge, key), (delivered, roots) in streams.items():
            if delivered and reason is None:
                self._end(edge, key)
            else:
                self._unreachable(edge, key, roots, reason or EMPTY, (act.node.index, act.aid))

    # ── the caller ──

    def _emit(self, event: dict | None) -> None:
        self.outbox.append(event)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _caller_arrived(self, edge: Edge, value: Any, order: tuple) -> None:
        stream = edge.stream
        if stream >= 0:
            if not edge.ordered:
                self._emit({"event": "stream", "field": edge.field, "value": value})
            else:
                consumer = self.program.stream_consumers[stream]
                held = self.stream_held[stream]
                if held:
                    self._hold(consumer, held, order, value)
                else:  # usually the frame is next: nothing in flight can bring a smaller key
                    bound = self._lower_bound(consumer)
                    if bound is None or order <= bound:
                        self._emit({"event": "stream", "field": edge.field, "value": value})
                    else:
                        self._hold(consumer, held, order, value)
        if edge.returned and edge.field not in self.returned:
            self.returned.add(edge.field)
            self._emit({"event": "return", "field": edge.field, "value": value})

    # ── order ──

    def _lower_bound(self, consumer: OrderConsumer) -> tuple | None:
        """The smallest order key a frame can still reach `consumer` with; None if none can.

        A join not yet resolved can (its activation has the empty key); so can a session node
        some alive work can reach (its next output counter), and the activations and open
        buckets of the nodes that keep or extend keys on the way (their `order_bound`, kept in
        a heap refreshed lazily: a bound only grows, but an entry may be stale)."""
        done = self.joins_done
        for join in consumer.join_resets:
            if join not in done:
                return ()
        bound = None
        counters = self.session_counters
        resets = self.program.resets
        for reset in consumer.session_resets:
            if self.alive[reset]:
                key = (counters[resets[reset]],)
                if bound is None or key < bound:
                    bound = key
        heap = self.order_heaps[consumer.index]
        while heap:
            entry = heap[0]
            unit = entry[2]
            current = unit.order_bound()
            if current is None:
                heappop(heap)
            elif current != entry[0]:
                heapreplace(heap, (current, self._ticket(), unit))
            else:
                if bound is None or current < bound:
                    bound = current
                break
        return bound

    def _reorder(self) -> None:
        """Let through whatever waits for order and may go now."""
        for consumer in list(self.order_waiting):
            if consumer.kind == ORDERED_STREAM:
                self._release_stream(consumer)
            else:
                self._release_session(consumer)

    def _hold(self, consumer: OrderConsumer, held: list, order: tuple, value: Any) -> None:
        heappush(held, (order, self._ticket(), value))
        self.order_waiting.add(consumer)
        self._release_stream(consumer)

    def _release_stream(self, consumer: OrderConsumer) -> None:
        held = self.stream_held[consumer.target]
        bound = self._lower_bound(consumer)
        name = self.program.streams[consumer.target][0]
        while held and (bound is None or held[0][0] <= bound):
            self._emit({"event": "stream", "field": name, "value": heappop(held)[2]})
        if not held:
            self.order_waiting.discard(consumer)

    def _release_session(self, consumer: OrderConsumer) -> None:
        sequencer = self.sequencers[consumer.target]
        if not sequencer.busy:
            self._spawn(sequencer.release(self._lower_bound(consumer)))
        if not sequencer.held:
            self.order_waiting.discard(consumer)

    def statistics(self) -> dict[str, int]:
        return {
            "buckets": len(self.buckets),
            "resolved_keys": len(self.resolved),
            "joins": len(self.joins),
            "sequencers": len(self.sequencers),
            "tasks": len(self.tasks),
            "unlaunched": len(self.ready),
            "in_flight": self.in_flight,
            "running": self.running,
            "unreachable_dedup": len(self.seen_unreachable),
            "held_for_order": sum(map(len, self.stream_held)) + sum(s.waiting() for s in self.sequencers.values()),
            "undelivered_events": len(self.outbox),
            "waiting_for_room": len(self.outbox_waiters),
        }


def _out_roots(node: NodeProgram, aid: int, roots: tuple, yidx: int) -> tuple:
    """The diamond-root entries frame `yidx` of activation `aid` of `node` carries."""
    if not roots:
        return ((node.index, aid, yidx),) if node.diamond_root else ()
    carried = node.carried
    out = tuple(e for e in roots if e[0] in carried and e[0] != node.index)
    if node.diamond_root:
        out += ((node.index, aid, yidx),)  # one entry per root: the newest frame (loops)
    return out


def _first_step(awaitable: Any) -> tuple[bool, Any]:
    """Run an awaitable's first step by hand: (True, its result) if it finished without
    suspending, else (False, what it waits on) for `await _Resume(awaitable, that)`."""
    try:
        waiting = awaitable.send(None)
    except StopIteration as finished:
        return True, finished.value
    return False, waiting


def _key(node: NodeProgram, aid: int, edge: Edge, roots: tuple, yidx: int) -> tuple:
    """Rule C: the diamond root's entry carried by the frame; Rule A: the sending frame."""
    if edge.rule_c:
        root = edge.root
        for entry in roots:
            if entry[0] == root:
                return entry
    return (node.index, aid, yidx)


def _counts_met(node: NodeProgram, state: JoinState) -> bool:
    for join in node.join or ():
        if join.threshold is not None and len(state.values.get(join.field, ())) < join.threshold:
            return False
    return True


def _wake(act: Activation) -> None:
    resume = act.resume
    if resume is not None and not resume.done():
        resume.set_result(None)


async def _drain(result: Any) -> None:
    """Run a broadcast replica's activation to its end (only the chosen replica's frames count),
    giving the loop a turn every PAUSE_EVERY frames as rule 13 does for any stream."""
    if type(result) is AsyncGeneratorType:
        frames = 0
        async for _ in result:
            frames += 1
            if frames % PAUSE_EVERY == 0:
                await asyncio.sleep(0)
    else:
        await result


def _as_frame(frame: object, node: NodeProgram) -> dict:
    """A role's frame as dispatched: a plain dict of declared fields as it is (a plain loop,
    which the compiled core runs in C; `all(...)` would build a generator per frame), anything
    else through the role contract's check (a copy, or RoleProtocolError)."""
    if type(frame) is dict:
        fields = node.out_fields
        for name in frame:
            if name not in fields:
                break
        else:
            return frame
    return checked_frame(frame, node.id, node.out_fields)
