"""A graph call's state and the half of its state machine that involves no role: the three
signals (ARRIVED, SLOT_EOS and UNREACHABLE are the methods `_arrive`, `_end` and
`_unreachable`, taking the edge, the key and what the signal carries), buckets, count joins,
what reaches the caller, and order (DESIGN §4; docs/runtime.md, rules 1-7).

Delivery is synchronous: a signal goes inbound → bucket → fire on one call chain with no await,
so bucket state never interleaves. Firing only hands the activation to `_schedule`, which the
subclass `flowrt.control.call.Call` implements with everything that runs roles (activations,
dispatch of their frames, completion, cancellation); so do `_spawn`, `_dispatch_phantom` and
`_activation_done`, which this half calls.

Order (docs/runtime.md, rule 7): every present frame carries an order key, a tuple that gains
one level per streaming hop. Ordered streams and ordered session nodes hold what arrives early
and let it through once no work in flight can still send them a smaller key (`_lower_bound`,
over the work the plan says can reach them: program.OrderConsumer); nothing is ever dropped.

Observing (flowrt.observe): `observer` is None unless the caller installed one, and each place
that reports to it costs one `is None` check when none is. Where the observer asks for it (its
`frames` attribute is true: a trace), the call also tracks which frames each activation consumes
(`track_frames`, `sending`, `arrivals`; `Activation.sources`), so a trace can draw an arrow from
every frame's producer to its consumer; metrics do not pay for that. The observer hears of the
call's first output event if it asks (`hear_first_output`), and of activations starting and
ending (`_act_started`, `_act_ended`) unless it says it needs neither (`watch_starts`,
`watch_ends`). Whether or not a call is observed, its graph counts its calls by status and each
node its activations and the frames it sends to each consumer (flowrt.control.program); where an
observer installed histograms, the calls and activations of observed calls are timed into them
(the call's first output event too: `watch_output`, one flag checked per event).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from heapq import heappop, heappush, heapreplace
from typing import TYPE_CHECKING, Any

from flowrt.control import bucket as _bucket
from flowrt.control import program as _program
from flowrt.control.activation import Activation, JoinState
from flowrt.control.bucket import Bucket
from flowrt.control.program import Edge, GraphProgram, NodeProgram, OrderConsumer
from flowrt.control.sequencer import Sequencer
from flowrt.control.signals import Reason

if TYPE_CHECKING:
    from flowrt.control.runtime import Runtime

# what the hot path compares with (the compiled core holds them as C values: delivery.pxd)
CALLER, DIRECT, JOIN = _program.CALLER, _program.DIRECT, _program.JOIN
ORDERED_STREAM = _program.ORDERED_STREAM
WAITING, FIRED = _bucket.WAITING, _bucket.FIRED
EMPTY, ERROR, CANCEL = Reason.EMPTY, Reason.ERROR, Reason.CANCEL
CLOCK = time.perf_counter  # observing: when an activation starts and ends (flowrt.observe.hooks.now)


class Delivery:
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
        self.phantoms = 0  # phantoms being dispatched now (nested: one's dispatch may kill the next group)
        self.running_by_node = [0] * len(program.nodes)
        self.session_counters = [0] * len(program.nodes)
        self.tasks: set[asyncio.Task] = set()
        self.ready: list[Activation] = []  # fired, not yet launched (see the module's docstring)
        self.eager_depth = 0
        self.last_aid = 0
        self.aid_source: Any = None  # a shard's: its process's counter, so no two shards make the same aid
        # None in one process; a shard of a call spread over processes has the router that
        # sends signals for nodes hosted elsewhere and takes over completion and order there
        # (flowrt.control.shards): each hook below is one `is None` check where there is none
        self.router: Any = None
        self.cancelled = False
        self.failed = False  # cancelled because the deployment lost something the call needed (fail)
        self.cancel_reason = ""  # why it was cancelled: "timeout", "client gone", "shutdown"
        self.ended = False  # the `done` event is out; every table of the call is empty
        self.end_waiters: list[asyncio.Future] | None = None
        # per streaming entry not yet ended: (the activation the caller feeds, its stream slots)
        self.entries: dict[str, tuple] | None = None
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
        self.observer: Any = None  # flowrt.observe's hooks for this call, or None (set before `start`)
        self.track_frames = False  # the observer wants each activation's `sources` (set with it)
        self.started = 0.0  # with an observer: when the call started, in CLOCK's time
        self.watch_output = False  # with an observer: the call's first output event is timed or heard (set with it)
        self.hear_first_output = False  # ... and the observer hears of it (set with it)
        self.watch_starts = False  # the observer hears of each activation's start (set with it)
        self.watch_ends = False  # ... and of each one's end
        # observing: the ids of the frame being dispatched (Activation.sources); None: the one
        # frame (sending_from, sending_index), whose tuple `_sent` makes if a consumer needs it
        self.sending: tuple | None = ()
        self.sending_from = 0
        self.sending_index = 0
        self.arrivals: dict = {}  # observing: per open bucket, the ids of the frames per slot (a join keeps its own)

    def _sent(self) -> tuple:
        """The ids of the frame being dispatched (observing): made on first use, as most frames
        go only to the caller, whose events carry no ids."""
        sending = self.sending
        if sending is None:
            sending = self.sending = ((self.sending_from, self.sending_index),)
        return sending

    def _aid(self) -> int:
        if self.aid_source is not None:
            return self.aid_source()
        self.last_aid += 1
        return self.last_aid

    def _ticket(self) -> int:
        self.tickets += 1
        return self.tickets

    # ── inbound: the three signals ──

    def _arrive(self, edge: Edge, key: tuple, value: Any, roots: tuple, order: tuple) -> None:
        """ARRIVED at a bucket or stream slot."""
        if self.router is not None and self.router.arrive(self, edge, key, value, roots, order):
            return
        bucket_key = (edge.node.index, edge.group.index, key)
        bucket = self._bucket(edge, bucket_key, roots)
        if bucket is None:
            return
        if self.track_frames:
            self.arrivals.setdefault(bucket_key, {}).setdefault(edge.slot, []).extend(self._sent())
        before = bucket.order
        outcome = bucket.arrived(edge.slot, value, order)
        if bucket.order is not before:  # its activation's key can now be this small
            for consumer in edge.node.bucket_feeds:
                heappush(self.order_heaps[consumer.index], (bucket.order, self._ticket(), bucket))
        if outcome != WAITING:
            self._close_bucket(edge, bucket_key, bucket, outcome)

    def _end(self, edge: Edge, key: tuple) -> None:
        """SLOT_EOS: the stream feeding a stream slot ended after delivering frames."""
        if self.router is not None and self.router.end(self, edge, key):
            return
        bucket_key = (edge.node.index, edge.group.index, key)
        bucket = self.buckets.get(bucket_key)
        if bucket is None:
            return  # frames came, so the bucket existed: it has resolved since
        outcome = bucket.ended(edge.slot)
        if outcome != WAITING:
            self._close_bucket(edge, bucket_key, bucket, outcome)

    def _unreachable(self, edge: Edge, key: tuple, roots: tuple, reason: Reason, origin: tuple | None) -> None:
        if self.router is not None and self.router.unreachable(self, edge, key, roots, reason, origin):
            return
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
            act = Activation(node, edge.group.index, self._aid(), bucket.inputs(), bucket.roots, bucket.order)
            if self.track_frames:
                act.sources = _consumed(bucket, self.arrivals.pop(bucket_key, {}))
            self._schedule(act)
        else:
            if self.track_frames:
                self.arrivals.pop(bucket_key, None)
            self._dead(node, bucket.roots, bucket.reason or EMPTY, bucket.origin)

    def _dead(self, node: NodeProgram, roots: tuple, reason: Reason, origin: tuple | None) -> None:
        """A group that will not fire for this key: its activation becomes a phantom."""
        self.in_flight += 1
        self.phantoms += 1  # while it dispatches, the call is not idle, whatever `running` says
        aid = self._aid()
        self._dispatch_phantom(node, aid, roots, reason, origin or (node.index, aid))
        self.phantoms -= 1
        self._activation_done(node, None)

    # ── joins ──

    def _join_arrived(self, node: NodeProgram, name: str, value: Any) -> None:
        if self.router is not None and self.router.join(self, node, name, value):
            return
        state = self.joins.get(node.index)
        if state is None:
            state = self.joins[node.index] = JoinState()
        if not state.fired:
            values = state.values.get(name)
            if values is None:
                state.values[name] = [value]
            else:
                values.append(value)
            if self.track_frames:
                frames = state.frames.get(name)
                if frames is None:
                    state.frames[name] = list(self._sent())
                elif len(frames) < _threshold(node, name):  # (the frames past it are never passed on)
                    frames.extend(self._sent())
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
        complete = counts_met(node, state) and (final or self._all_fields_ended(node))
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
        act = Activation(node, 0, self._aid(), inputs, (), ())  # one per call: the empty key
        if self.track_frames:
            frames = state.frames
            act.sources = tuple(f for j in node.join or () for f in frames.get(j.field, [])[: j.threshold])
        self._schedule(act)
        return True

    def _join_resolved(self, node: NodeProgram) -> None:
        self.joins_done.add(node.index)
        for reset in node.reset_counters:
            self.alive[reset] -= 1

    def _all_fields_ended(self, node: NodeProgram) -> bool:
        if self.router is not None:
            return False  # upstream work may be anywhere: such a join resolves when the whole call is quiet
        running = self.running_by_node
        buckets = self.open_buckets
        for join in node.join or ():
            if join.threshold is None:
                for upstream in join.upstream:
                    if running[upstream] or buckets[upstream]:
                        return False
        return True

    # ── the caller and order ──

    def _emit(self, event: dict | None) -> None:
        self.outbox.append(event)
        if self.watch_output:  # observing: the first event that carries an output (`_finish` clears it before `done`)
            self.watch_output = False
            program = self.program
            if program.first_counts is not None:
                seconds = CLOCK() - self.started
                program.first_sum += seconds
                _histogram_add(program.first_counts, program.call_bounds, seconds)
            if self.hear_first_output:
                self.observer.first_output(self)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _caller_arrived(self, edge: Edge, value: Any, order: tuple) -> None:
        if self.router is not None and self.router.caller(self, edge, value, order):
            return
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

    def _lower_bound(self, consumer: OrderConsumer) -> tuple | None:
        """The smallest order key a frame can still reach `consumer` with; None if none can.

        A join not yet resolved can (its activation has the empty key); so can a session node
        some alive work can reach (its next output counter), and the activations and open
        buckets of the nodes that keep or extend keys on the way (their `order_bound`, kept in
        a heap refreshed lazily: a bound only grows, but an entry may be stale). A shard of a
        call spread over processes sees only its own part: its router says what may go."""
        if self.router is not None:
            return self.router.bound(consumer)
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
        current = self.heap_bound(consumer)
        if current is not None and (bound is None or current < bound):
            bound = current
        return bound

    def heap_bound(self, consumer: OrderConsumer) -> tuple | None:
        """The smallest order bound of this process's activations and open buckets that reach
        `consumer` with their keys kept or extended; None if none do."""
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
                return current
        return None

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

    # ── a signal another process routed here (flowrt.control.shards): the local methods ──

    def remote_arrive(self, edge: Edge, key: tuple, value: Any, roots: tuple, order: tuple) -> None:
        self._arrive(edge, key, value, roots, order)

    def remote_end(self, edge: Edge, key: tuple) -> None:
        self._end(edge, key)

    def remote_unreachable(self, edge: Edge, key: tuple, roots: tuple, reason: Reason, origin: tuple | None) -> None:
        self._unreachable(edge, key, roots, reason, origin)

    def remote_join(self, node: NodeProgram, name: str, value: Any) -> None:
        self._join_arrived(node, name, value)

    def remote_direct(self, edge: Edge, value: Any, roots: tuple, order: tuple) -> None:
        self._schedule(Activation(edge.node, edge.group.index, self._aid(), {edge.field: value}, roots, order))

    def remote_caller(self, edge: Edge, value: Any, order: tuple) -> None:
        self._caller_arrived(edge, value, order)

    def remote_resolve(self, node: NodeProgram) -> None:
        """The whole call is quiet and nothing can feed join `node` any more: resolve it."""
        self._try_join(node, True)

    def remote_release(self, consumer: OrderConsumer) -> None:
        """Let through what waits at `consumer` and its router's bound allows."""
        if consumer.kind == ORDERED_STREAM:
            self._release_stream(consumer)
        elif consumer.target in self.sequencers:
            self._release_session(consumer)

    # ── observing: a call's start and end, an activation's start and end ──

    def _call_began(self) -> None:
        """The call starts: count it; with an observer, stamp its start (its graph's histograms,
        where an observer installed them, measure from it)."""
        self.program.calls_started += 1
        if self.observer is not None:
            self.started = CLOCK()

    def _call_ending(self, status: str) -> None:
        """The call ends with `status`: count it; with an observer, time it into its graph's
        histogram (where one is installed)."""
        program = self.program
        ended = program.calls_ended
        ended[status] = ended.get(status, 0) + 1
        if self.observer is not None and program.call_counts is not None:
            seconds = CLOCK() - self.started
            program.call_sum += seconds
            _histogram_add(program.call_counts, program.call_bounds, seconds)

    def _act_started(self, act: Activation) -> None:
        """An activation is about to run: count it; with an observer, stamp its start (observers
        measure from it) and tell the observer if it asks (`watch_starts`)."""
        node = act.node
        node.acts_started += 1
        if self.observer is not None:
            act.started = CLOCK()
            if self.watch_starts:
                self.observer.activation_started(self, act)

    def _act_ended(self, act: Activation, reason: Reason | None) -> None:
        """An activation has ended: count it and its frames; with an observer, time it into its
        node's histogram (where one is installed) and tell the observer if it asks."""
        node = act.node
        node.acts_ended += 1
        node.frames_out += act.yielded
        if reason is not None:
            if reason is ERROR:
                node.acts_failed += 1
            else:
                node.acts_cancelled += 1
        if self.observer is None:
            return
        if node.duration_counts is not None:
            seconds = CLOCK() - act.started
            node.duration_sum += seconds
            _histogram_add(node.duration_counts, node.duration_bounds, seconds)
        if self.watch_ends:
            self.observer.activation_ended(self, act, reason)

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

    # ── what the subclass (flowrt.control.call.Call) implements ──

    def _schedule(self, act: Activation) -> None:
        raise NotImplementedError

    def _spawn(self, act: Activation | None) -> None:
        raise NotImplementedError

    def _dispatch_phantom(self, node: NodeProgram, aid: int, roots: tuple, reason: Reason, origin: tuple) -> None:
        raise NotImplementedError

    def _activation_done(self, node: NodeProgram, act: Activation | None) -> None:
        raise NotImplementedError


def _consumed(bucket: Bucket, frames: dict) -> tuple:
    """The ids of the frames a fired bucket passes on (observing): per field, those of the first
    slot that received one, as `Bucket.inputs` picks its values."""
    consumed: list = []
    fields = bucket.group.fields
    seen = set()
    for i in range(len(fields)):
        if bucket.received(i) and fields[i] not in seen:
            seen.add(fields[i])
            consumed += frames.get(i, ())
    return tuple(consumed)


def _threshold(node: NodeProgram, name: str) -> float:
    """How many frames of join field `name` its activation takes (observing): its count, or
    every one (`all`)."""
    for join in node.join or ():
        if join.field == name:
            return float("inf") if join.threshold is None else join.threshold
    return float("inf")


def counts_met(node: NodeProgram, state: JoinState) -> bool:
    for join in node.join or ():
        if join.threshold is not None and len(state.values.get(join.field, ())) < join.threshold:
            return False
    return True


def _histogram_add(counts: list, bounds: tuple, seconds: float) -> None:
    """Count `seconds` in the histogram `counts` of `bounds`: in the first bucket whose bound it
    does not exceed (as bisect_left, over a few floats), else in the last (+Inf)."""
    n = len(bounds)
    i = 0
    while i < n:
        bound = bounds[i]
        if bound >= seconds:
            break
        i += 1
    counts[i] += 1
