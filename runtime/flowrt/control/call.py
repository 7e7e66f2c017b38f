"""One graph call executing in this process: activations, the dispatch of their frames,
completion and cancellation (DESIGN §4; docs/runtime.md gives the rules). Signals, buckets,
joins, what reaches the caller and order are its base class's (flowrt.control.delivery).

A fired activation is only queued (`ready`), so the user's code never runs inside the state
machine. Queued activations wait for the task whose step readied them and run in it one after
another; when that task is about to suspend, the ones still waiting get tasks of their own
(`_launch`), so nothing waits across an await and a role that never suspends costs no task
(`_run`). On Python 3.12+ new tasks start eagerly. The call ends when its in-flight count
reaches zero; then every table of the call is empty, which `statistics()` lets tests assert. A
streaming entry's placeholder node runs as an activation the caller feeds (`entry_frame`,
`entry_end`; flowrt.control.inputs), so the call runs until the input ends.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from heapq import heappop, heappush
from types import AsyncGeneratorType, CoroutineType
from typing import Any

from flowrt.control import activation as _activation
from flowrt.control import bounds
from flowrt.control import program as _program
from flowrt.control.activation import Activation, NoTimeout, Resume
from flowrt.control.contract import bad_input, checked_frame, failure, log_failure, reported, second_frame, waiting_place
from flowrt.control.delivery import Delivery
from flowrt.control.program import NodeProgram
from flowrt.control.sequencer import Sequencer
from flowrt.control.signals import Reason

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
EMPTY, ERROR, CANCEL = Reason.EMPTY, Reason.ERROR, Reason.CANCEL
NO_TIMEOUT: NoTimeout = _activation.NO_TIMEOUT
ENTRY_FRAMES = ((0, 0),)  # observing: the id of the caller's entry values (no activation has aid 0)


class Call(Delivery):
    # ── start and completion ──

    def start(self) -> None:
        self.in_flight += 1
        for join in self.program.joins:  # a join not yet resolved is work that can reach what it feeds
            for reset in join.reset_counters:
                self.alive[reset] += 1
        self._call_began()
        act = Activation(self.program.start, 0, self._aid(), self.inputs, (), ())
        if self.observer is not None:
            if self.track_frames:
                act.sources = ENTRY_FRAMES
            self.observer.call_started(self)
        if self.program.entry_nodes:
            self._open_entries(act)
        self._dispatch_frame(act, self.inputs, 0, None)  # frames are only read: the caller's copy will do
        self._activation_done(act.node, None)
        self._launch()

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
                    parent.wake()
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
        """Nothing is running: resolve a join nothing can feed any more, or finish the call.
        A shard of a call spread over processes sees only its part: its router decides."""
        if self.router is not None:
            self.router.idle(self)
            return
        for join in self.program.joins:
            if join.index not in self.joins_done and not self._fed(join) and self._try_join(join, True):
                return
        if self.in_flight == 0:
            self._finish()
        elif self.running == 0 and self.phantoms == 0:  # (a phantom being dispatched ends as the step returns)
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
        """Session queues hold activations while nothing runs and no join can resolve: the order
        bounds make it impossible; should it happen anyway, release the smallest, not hang."""
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
        if self.failed:
            status = "error"
        elif self.cancelled:
            status = "cancelled"
        else:
            status = "error" if self.errors and errored_outputs else "ok"
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
        done = {"event": "done", "status": status, "errors": reported(self.errors), "missing": missing}
        if self.cancelled:
            done["reason"] = self.cancel_reason
        self._call_ending(status)
        if self.observer is not None:
            self.arrivals.clear()
            self.observer.call_ended(self, status)
        self.watch_output = False  # (`done` carries no output)
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
        while self.entries:  # the caller's streaming entries end with the call
            self.entry_end(next(iter(self.entries)), CANCEL)
        if self.router is not None:  # every process holding a part of the call hears of it
            self.router.cancelled(self, reason)

    def fail(self, message: str, where: str) -> None:
        """End the call with status "error": something outside the roles that it needed (`where`,
        e.g. "memory manager") is gone. The error names it; the call's work is cancelled."""
        if self.cancelled or self.ended:
            return
        self.errors.append({"role": "", "interface": "", "message": message, "where": where})
        self.failed = True
        self.cancel(message)

    # ── activations ──

    def _schedule(self, act: Activation) -> None:
        node = act.node
        self.in_flight += 1
        self.running_by_node[node.index] += 1
        if not node.interface:
            # (observing: what the frame being dispatched, if any, goes on with)
            sending, sending_from, sending_index = self.sending, self.sending_from, self.sending_index
            self._dispatch_frame(act, act.inputs, 0, None)
            self.sending, self.sending_from, self.sending_index = sending, sending_from, sending_index
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

    def launch_ready(self) -> None:  # (a signal from another process readied work: flowrt.control.shards)
        self._launch()

    def finish_call(self) -> None:  # (its router found the whole call quiet: flowrt.control.shards)
        self._finish()

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
        wait (`_first_step`, then `await Resume`, which is `await` for a started coroutine); a
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
                self._act_started(act)
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
                                        frame = await Resume(step, frame)
                                except StopAsyncIteration:
                                    break
                                self._yielded(act, frame, streams)
                        elif self.ready and type(result) is CoroutineType:
                            done, frame = _first_step(result)
                            if not done:
                                self._launch()
                                frame = await Resume(result, frame)
                            self._returned(act, frame, streams)
                        else:
                            self._launch()  # nothing waits, or an awaitable that cannot be stepped by hand
                            self._returned(act, await result, streams)
                        if act.extras:  # broadcast: the other replicas run for their side effects
                            self._launch()
                            for extra in act.extras:
                                await bounds.drain(extra)
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
                    self._act_ended(act, reason)
                    self._conclude(act, reason, streams)
                if not self.ready:
                    return
                act = self._next_ready()
        finally:
            self.tasks.discard(task)

    def _conclude(self, act: Activation, reason: Reason | None, streams: dict | None) -> None:
        """`act` ended (`reason` None: as it should): a phantom if it sent nothing, the end of the
        stream slots its frames used, and what its end lets go."""
        node = act.node
        if act.yielded == 0:
            self._dispatch_phantom(node, act.aid, act.roots, reason or EMPTY, (node.index, act.aid))
        if streams:
            self._end_streams(act, streams, reason)
        self.running_by_node[node.index] -= 1
        self.running -= 1
        self._activation_done(node, act)

    # ── streaming entries: their placeholder nodes run as activations the caller feeds ──

    def _open_entries(self, start: Activation) -> None:
        """Start each streaming entry's activation as the start frame's direct edge would (its
        roots, the empty key), running until the input ends: nothing it feeds resolves before."""
        roots = start.node.out_roots(start.aid, (), 0) if start.node.diamond_root else ()
        self.entries = {}
        for name, node in self.program.entry_nodes.items():
            act = Activation(node, 0, self._aid(), {}, roots, ())
            act.sources = start.sources
            self.entries[name] = (act, {} if node.feeds_stream_slots else None)
            self.in_flight += 1
            self.running += 1
            self.running_by_node[node.index] += 1
            for reset in node.reset_counters:
                self.alive[reset] += 1
            for consumer in node.order_feeds:
                heappush(self.order_heaps[consumer.index], (act.order_bound(), self._ticket(), act))

    def entry_frame(self, name: str, value: Any) -> None:
        """The caller sent a frame of open streaming entry `name`: a yield of its activation."""
        act, streams = self.entries[name]
        self._yielded(act, {name: value}, streams)
        self._launch()

    def entry_end(self, name: str, reason: Reason | None = None) -> None:
        """Open streaming entry `name` ends: the caller ended it (None), or the call was cancelled."""
        act, streams = self.entries.pop(name)
        self._conclude(act, reason, streams)
        act.wake()  # (a send waiting for room: there is no more input)
        self._launch()

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
        if not node.plain(frame):  # (else the role contract's check: a copy, or RoleProtocolError)
            frame = checked_frame(frame, node.id, node.out_fields)
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
            if not act.node.plain(frame):
                frame = checked_frame(frame, act.node.id, act.node.out_fields)
            self._dispatch_frame(act, frame, 0, streams)
            act.yielded = 1

    async def _pause(self, act: Activation) -> None:
        """Between two frames of a streaming activation (a role's, or a streaming entry's that
        the caller sends, flowrt.control.inputs): wait while the caller or the activations its
        frames readied are behind (rule 13), else give the loop one turn; an entry's wait ends
        when its input does (the call was cancelled)."""
        act.pause = False
        if asyncio.current_task().cancelling():  # a timeout or cancel the role caught and went on from
            raise asyncio.CancelledError
        waited = False
        while not act.finished and (len(self.outbox) >= OUTBOX_HIGH or act.children >= CHILDREN_HIGH):
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
                act.wake()

    def _role_failed(self, act: Activation, error: BaseException, result: Any) -> None:
        """A role raised (or broke the role protocol): an error event with the place in the
        role's code, and the traceback in the log."""
        node = act.node
        message, where = failure(error, result, self.runtime.bundle.python_path)
        self._error(node, message, where)
        if bad_input(error):  # flowrt.BadInput: the caller's to fix (the gateway answers 400)
            self.errors[-1]["bad_input"] = True
        replica = f"replica {act.replica}" if act.replica >= 0 else "every replica"  # (broadcast)
        line = f"call {self.call_id} (session {self.session}): {node.id} on {replica} failed at {where or '?'}: {message}"
        log_failure(log, line, error)

    # ── outbound ──

    def _out_order(self, node: NodeProgram, order: tuple, yidx: int) -> tuple:
        """The order key of frame `yidx` of an activation of `node` whose own key is `order`."""
        if node.session:  # session nodes re-number their frames 0, 1, ... per call (counted once dispatched)
            return (self.session_counters[node.index],)
        return order + (yidx,) if node.stream else order

    def _dispatch_frame(self, act: Activation, frame: dict, yidx: int, streams: dict | None) -> None:
        node = act.node
        if self.track_frames:  # a node without a role (the entry, a placeholder) passes its frames on
            if node.interface:
                self.sending, self.sending_from, self.sending_index = None, act.aid, yidx
            else:
                self.sending = act.sources
        roots = node.out_roots(act.aid, act.roots, yidx) if node.diamond_root or (act.roots and node.carried) else ()
        order = self._out_order(node, act.order, yidx)
        shared = node.shared_outlets
        counted = None  # (where two edges reach one consumer: the outlets this frame counted on)
        for route in node.routes:
            name = route.field
            if name in frame:
                value = frame[name]
                for edge in route.edges:
                    outlet = edge.outlet  # the frames per edge (flowrt.observe): a plain count
                    if not shared:
                        outlet.frames += 1
                    elif counted is None:
                        counted = [outlet]
                        outlet.frames += 1
                    elif outlet not in counted:
                        counted.append(outlet)
                        outlet.frames += 1
                    kind = edge.kind
                    if kind == CALLER:
                        self._caller_arrived(edge, value, order)
                    elif kind == DIRECT:
                        if self.router is not None and self.router.direct(self, edge, value, roots, order):
                            continue
                        direct = Activation(edge.node, edge.group.index, self._aid(), {name: value}, roots, order)
                        if self.track_frames:
                            direct.sources = self._sent()
                        self._schedule(direct)
                    elif kind == JOIN:
                        self._join_arrived(edge.node, name, value)
                    else:
                        key = edge.key(node, act.aid, roots, yidx)
                        self._arrive(edge, key, value, roots, order)
                        if kind == STREAM_SLOT and streams is not None:
                            opened = streams.get((edge, key))
                            if opened is None or not opened[0]:
                                streams[(edge, key)] = (True, roots)
            else:
                for edge in route.absent:
                    key = edge.key(node, act.aid, roots, yidx)
                    if edge.kind == STREAM_SLOT:
                        if streams is not None and (edge, key) not in streams:
                            streams[(edge, key)] = (False, roots)
                    else:
                        self._unreachable(edge, key, roots, EMPTY, (node.index, act.aid, yidx))
        if node.session:
            # only now may the node's next key be counted: a reorder set off while this frame's
            # routes were dispatched (a phantom's, say) must still see this frame's key as to come
            self.session_counters[node.index] += 1

    def _dispatch_phantom(self, node: NodeProgram, aid: int, roots: tuple, reason: Reason, origin: tuple) -> None:
        """An activation (or group) that produced nothing: every edge learns it is unreachable.
        Absent frames have no order key: nothing waits for them (rule 7)."""
        out_roots = node.out_roots(aid, roots, 0)
        for route in node.routes:
            for edge in route.absent:
                self._unreachable(edge, edge.key(node, aid, out_roots, 0), out_roots, reason, origin)

    def _end_streams(self, act: Activation, streams: dict, reason: Reason | None) -> None:
        """The activation ended: close every stream slot its frames used, as an end of stream
        if it delivered and did not fail, else as unreachable. The signal carries the roots of
        the frames that used the slot: it may be the first its bucket sees."""
        for (edge, key), (delivered, roots) in streams.items():
            if delivered and reason is None:
                self._end(edge, key)
            else:
                self._unreachable(edge, key, roots, reason or EMPTY, (act.node.index, act.aid))


def _first_step(awaitable: Any) -> tuple[bool, Any]:
    """Run an awaitable's first step by hand: (True, its result) if it finished without
    suspending, else (False, what it waits on) for `await Resume(awaitable, that)`."""
    try:
        waiting = awaitable.send(None)
    except StopIteration as finished:
        return True, finished.value
    return False, waiting
