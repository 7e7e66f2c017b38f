"""One graph call executing in this process: delivery, buckets, activations, dispatch, joins,
order, completion (DESIGN §4; docs/runtime.md gives the rules this module implements).

Delivery is synchronous: a signal goes inbound → bucket → fire on one call chain with no await,
so bucket state never interleaves. A fired activation is only queued there (`_ready`); it is
launched when the step that readied it is over (after a frame's dispatch, at a call's start,
at an activation's end), so the user's code never runs inside the state machine. It then runs
in a task (the user's code may await): the finished activation's own task when it became ready
only as that one ended, else a new one. On Python 3.12+ a new task starts eagerly: the role runs
at once and a task that never suspends costs no turn of the event loop. The call ends when its
ActivityTracker counts nothing in flight; then every table of the call is empty, which
`statistics()` lets tests assert.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
from collections import defaultdict, deque
from dataclasses import dataclass, field
from types import AsyncGeneratorType
from typing import TYPE_CHECKING, Any

from flowrt.control.bucket import Bucket, Outcome
from flowrt.control.sequencer import Sequencer
from flowrt.control.signals import Kind, Reason, Signal
from flowrt.tables import NodeTables, Target

if TYPE_CHECKING:
    from flowrt.control.roles import RoleBinding
    from flowrt.control.runtime import Runtime

log = logging.getLogger("flowrt")
CALLER = "caller"
# how an out edge is treated when a frame is dispatched (precomputed per node by the Runtime);
# DIRECT is a one-slot direct group: a frame fires it at once, no bucket needed
PLAIN, DIRECT, STREAM_SLOT, JOIN, TO_CALLER = "plain", "direct", "stream_slot", "join", "caller"
# eager tasks (3.12+) run a role at once, inside the launching task's step; activations that make
# others ready nest, so past this depth new ones are scheduled on the loop instead (loops of
# synchronous roles would otherwise recurse once per round)
EAGER_TASKS = sys.version_info >= (3, 12)
MAX_EAGER_DEPTH = 16


def dispatch_table(tables: dict[str, NodeTables]) -> dict[str, tuple]:
    """Per node: (field, ((target, kind), ...)) for every out field, classified once."""
    result = {}
    for node_id, node in tables.items():
        fields = []
        for name, targets in node.control.items():
            classified = []
            for target in targets:
                if target.node == CALLER:
                    kind = TO_CALLER
                elif target.aid_rule == "join":
                    kind = JOIN
                elif tables[target.node].groups[target.group].slots[target.slot].stream:
                    kind = STREAM_SLOT
                elif _single_direct(tables[target.node].groups[target.group]):
                    kind = DIRECT
                else:
                    kind = PLAIN
                classified.append((target, kind))
            fields.append((name, tuple(classified)))
        result[node_id] = tuple(fields)
    return result


@dataclass(slots=True)
class Activation:
    node: str
    group: int
    aid: int
    inputs: dict[str, Any]
    roots: tuple
    seq: int
    replicas: tuple[int, ...] = ()  # the replicas it runs on (set when it starts)
    yielded: int = 0  # frames produced so far


@dataclass
class JoinState:
    values: dict[str, list] = field(default_factory=dict)
    fired: bool = False


@dataclass
class CallerState:
    """What the caller has seen: streamed frames (reordered where `ordered`), returns, errors."""

    ordered: dict[str, bool]
    expected: dict[str, int] = field(default_factory=dict)
    buffer: dict[str, dict[int, tuple[bool, Any]]] = field(default_factory=lambda: defaultdict(dict))
    returned: set[str] = field(default_factory=set)
    errored: set[str] = field(default_factory=set)


class Call:
    def __init__(self, runtime: Runtime, graph: str, inputs: dict[str, Any], session: str, call_id: int):
        self.runtime = runtime
        self.graph = graph
        self.plan = runtime.bundle.plan["graphs"][graph]
        self.tables: dict[str, NodeTables] = runtime.node_tables[graph]
        self.dispatch = runtime.dispatch[graph]
        self.invokers = runtime.invokers[graph]
        self.inputs = inputs
        self.session = session
        self.call_id = call_id
        self.outbox: deque[dict | None] = deque()  # events for the caller; None ends the call
        self._outbox_waiter: asyncio.Future | None = None
        self.errors: list[dict[str, str]] = []
        self.buckets: dict[tuple, Bucket] = {}
        self.resolved: set[tuple] = set()  # keys of buckets that fired or died, so late signals are dropped
        self.joins: dict[str, JoinState] = {}
        self.joins_done: set[str] = set()
        self.sequencers: dict[str, Sequencer] = {}
        self.seen_unreachable: set[tuple] = set()
        self.in_flight = 0  # activations scheduled, queued at a session node, or running
        self.running = 0  # activations running as tasks
        self.running_by_node: dict[str, int] = defaultdict(int)
        self.tasks: set[asyncio.Task] = set()
        self._ready: list[Activation] = []  # fired, not yet launched (see the module's docstring)
        self._eager_depth = 0
        self.aids = itertools.count(1)
        self.session_counters: dict[str, int] = defaultdict(int)
        self.cancelled = False
        self.finished = asyncio.Event()
        outputs = self.plan["outputs"]
        self.caller = CallerState(ordered={o["field"]: o["ordered"] for o in outputs if o["kind"] == "stream"})
        self.returns = [o["field"] for o in outputs if o["kind"] == "return"]
        self.return_fields = frozenset(self.returns)
        self.activations: list[tuple[str, int]] = []  # (node, group) of every activation, for tests

    # ── start and completion ──

    def start(self) -> None:
        start = self.plan["start"]
        self.in_flight += 1
        act = Activation(start, 0, next(self.aids), dict(self.inputs), (), 0)
        self._dispatch_frame(act, dict(self.inputs), 0, None)
        self._activation_done(act, ran=False)
        self._launch()

    def _activation_done(self, act: Activation, ran: bool) -> None:
        self.in_flight -= 1
        if act.node in self.sequencers:
            self.sequencers[act.node].settle(act.seq, act.group, ran)
        if self.joins:
            self._check_joins()
        if self.running == 0:
            self._quiesce()

    def _quiesce(self) -> None:
        """Nothing is running: release a stalled session queue, settle joins, or finish the call."""
        if self.in_flight > 0:
            for sequencer in self.sequencers.values():
                if sequencer.release_stalled():
                    return
            return
        for node, tables in self.tables.items():
            if tables.join is not None and node not in self.joins_done and self._try_join(node, final=True):
                return
        if self.in_flight == 0 and self.running == 0:
            self._finish()

    def _finish(self) -> None:
        if self.finished.is_set():
            return
        for name in list(self.caller.buffer):
            self._flush_stream(name, final=True)
        missing = [f for f in self.returns if f not in self.caller.returned]
        errored_outputs = self.caller.errored | ({*missing} if self.errors else set())
        status = "cancelled" if self.cancelled else ("error" if self.errors and errored_outputs else "ok")
        self.buckets.clear()
        self.resolved.clear()
        self.sequencers.clear()
        self.joins.clear()
        self.joins_done.clear()
        self.running_by_node.clear()
        self.seen_unreachable.clear()
        self._emit({"event": "done", "status": status, "errors": list(self.errors), "missing": missing})
        self._emit(None)
        self.finished.set()

    def cancel(self) -> None:
        if self.cancelled or self.finished.is_set():
            return
        self.cancelled = True
        for task in list(self.tasks):
            task.cancel()

    # ── inbound ──

    def deliver(self, target: Target, signal: Signal) -> None:
        if target.node == CALLER:
            self._to_caller(signal)
            return
        tables = self.tables[target.node]
        group = tables.groups[target.group]
        if group.routing == "join":
            if signal.kind is Kind.ARRIVED:
                state = self.joins.setdefault(target.node, JoinState())
                if not state.fired:
                    state.values.setdefault(signal.field, []).append(signal.value)
                    self._try_join(target.node, final=False)
            return
        if signal.kind is Kind.UNREACHABLE and tables.in_cycle and signal.origin is not None:
            dedup = (signal.origin, target.node, target.group, target.slot)
            if dedup in self.seen_unreachable:
                return
            self.seen_unreachable.add(dedup)
        if group.routing == "direct" and len(group.slots) == 1:
            # one slot filled by one frame: the bucket would resolve on this very signal
            if signal.kind is Kind.ARRIVED:
                act = Activation(
                    target.node, target.group, next(self.aids), {signal.field: signal.value}, signal.roots, signal.seq
                )
                self._schedule(act)
            else:
                reason = signal.reason or Reason.EMPTY
                self._resolved(target.node, target.group, Outcome(False, {}, reason, signal.roots, signal.seq, signal.origin))
            return
        key = (target.node, target.group, signal.key)
        bucket = self.buckets.get(key)
        if bucket is None:
            if key in self.resolved:
                return  # the bucket already fired or died (a critical slot ended it early)
            bucket = self.buckets[key] = Bucket(group)
        outcome = bucket.offer(signal)
        if outcome is not None:
            del self.buckets[key]
            self.resolved.add(key)
            self._resolved(target.node, target.group, outcome)

    def _resolved(self, node: str, group: int, outcome: Outcome) -> None:
        act = Activation(node, group, next(self.aids), outcome.inputs, outcome.roots, outcome.seq)
        if outcome.fired:
            self._schedule(act)
            return
        self.in_flight += 1
        origin = outcome.origin or (node, act.aid)
        self._dispatch_phantom(act, outcome.reason or Reason.EMPTY, origin)
        self._activation_done(act, ran=False)

    def _try_join(self, node: str, final: bool) -> bool:
        state = self.joins.get(node)
        tables = self.tables[node]
        if state is None:
            if not final:
                return False
            state = self.joins[node] = JoinState()
        if state.fired or node in self.joins_done:
            return False
        # counts first (cheap); `all` fields only then: their upstream must have nothing running or pending
        complete = self._counts_met(tables, state) and (final or self._all_fields_ended(tables))
        if not complete:
            if final:
                del self.joins[node]
                self.joins_done.add(node)
                act = Activation(node, 0, next(self.aids), {}, (), 0)
                self.in_flight += 1
                self._dispatch_phantom(act, Reason.ERROR if self.errors else Reason.EMPTY, (node, act.aid))
                self._activation_done(act, ran=False)
                return True
            return False
        state.fired = True
        self.joins_done.add(node)
        # a counted field passes exactly its first N frames; `all` passes every frame
        inputs = {j.field: list(state.values.get(j.field, []))[: j.threshold] for j in tables.join or ()}
        self._schedule(Activation(node, 0, next(self.aids), inputs, (), 0))
        return True

    @staticmethod
    def _counts_met(tables: NodeTables, state: JoinState) -> bool:
        for join in tables.join or ():
            if join.threshold is not None and len(state.values.get(join.field, ())) < join.threshold:
                return False
        return True

    def _all_fields_ended(self, tables: NodeTables) -> bool:
        for join in tables.join or ():  # noqa: SIM110 - a plain loop: this runs at every activation's end
            if join.threshold is None and not self._upstream_ended(join.upstream_set):
                return False
        return True

    def _upstream_ended(self, nodes: frozenset[str]) -> bool:
        running = self.running_by_node
        for node in nodes:
            if running[node]:
                return False
        return not any(key[0] in nodes for key in self.buckets)

    def _check_joins(self) -> None:
        for node in list(self.joins):
            self._try_join(node, final=False)

    # ── activations ──

    def _schedule(self, act: Activation) -> None:
        self.in_flight += 1
        self.running_by_node[act.node] += 1
        self.activations.append((act.node, act.group))
        tables = self.tables[act.node]
        if tables.kind != "interface":
            self._dispatch_frame(act, dict(act.inputs), 0, None)
            self.running_by_node[act.node] -= 1
            self._activation_done(act, ran=True)
            return
        if tables.session:
            sequencer = self.sequencers.get(act.node)
            if sequencer is None:
                sequencer = self.sequencers[act.node] = Sequencer(
                    groups=len(tables.groups), ordered=self.runtime.session_ordered[self.graph][act.node]
                )
            sequencer.ready(act.seq, act.group, lambda: self._spawn(act))
        else:
            self._spawn(act)

    def _spawn(self, act: Activation) -> None:
        self.running += 1
        self._ready.append(act)

    def _launch(self) -> None:
        """Start every ready activation in a task of its own (the end of a step of the call)."""
        ready, self._ready = self._ready, []
        for act in ready:
            self._start_task(act)

    def _start_task(self, act: Activation) -> None:
        loop = asyncio.get_running_loop()
        if EAGER_TASKS and self._eager_depth < MAX_EAGER_DEPTH:
            self._eager_depth += 1
            try:
                task = asyncio.Task(self._run(act), loop=loop, eager_start=True)
            finally:
                self._eager_depth -= 1
            if task.done():
                return  # it ran to its end without suspending
        else:
            task = loop.create_task(self._run(act))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, act: Activation) -> None:
        """Run an activation, then any its end made ready: the first in this task, the rest in new ones.

        An activation that becomes ready only after its producer's code has finished (the
        producer returned its frame, or its end fired a join or released a session queue) would
        otherwise need a new task while this one ends; running it here saves the task and a
        turn of the event loop. Nothing is deferred across an await, so concurrency is unchanged.
        """
        while True:
            ready = await self._run_one(act)
            if not ready:
                return
            act = ready[0]
            for other in ready[1:]:
                self._start_task(other)

    async def _run_one(self, act: Activation) -> list[Activation]:
        tables = self.tables[act.node]
        binding, interface, timeout = self.invokers[act.node]
        role = binding.name
        streams: dict[tuple, bool] = {}
        reason: Reason | None = None
        try:
            if self.cancelled:
                raise asyncio.CancelledError
            if timeout is None:
                await self._produce(act, binding, interface, streams)
            else:
                async with asyncio.timeout(timeout):
                    await self._produce(act, binding, interface, streams)
        except TimeoutError:
            reason = Reason.CANCEL
            self.errors.append({"role": role, "interface": interface, "message": f"timed out after {timeout:g}s"})
            self.cancel()
        except asyncio.CancelledError:
            reason = Reason.CANCEL
        except Exception as error:  # noqa: BLE001 - a role's exception ends as unreachable(error), never a hang
            reason = Reason.ERROR
            self.errors.append({"role": role, "interface": interface, "message": f"{type(error).__name__}: {error}"})
            log.debug("role %s.%s raised", role, interface, exc_info=True)
        finally:
            # what this activation's end (or its returned frame) readies goes on in this task
            if act.yielded == 0:
                self._dispatch_phantom(act, reason or Reason.EMPTY, (act.node, act.aid))
            if streams:
                self._end_streams(act, tables, streams, reason)
            self.running_by_node[act.node] -= 1
            self.running -= 1
            self._activation_done(act, ran=True)
            ready, self._ready = self._ready, []
        return ready

    async def _produce(self, act: Activation, binding: RoleBinding, interface: str, streams: dict) -> None:
        """Run the user's method and dispatch each frame as it comes (no wrapper generator between)."""
        extras: list = []
        try:
            result, extras = binding.begin(interface, self, act)
            if isinstance(result, AsyncGeneratorType):
                async for frame in result:
                    if type(frame) is not dict:
                        _frame(frame, act.node)
                    self._dispatch_frame(act, frame, act.yielded, streams)
                    act.yielded += 1
                    if self._ready:
                        self._launch()
            else:
                frame = await result
                if frame is not None:
                    # the role has finished: what its frame readies runs in this task once its
                    # bookkeeping is done, unless broadcast replicas are still to be drained
                    self._dispatch_frame(act, _frame(frame, act.node), 0, streams)
                    act.yielded = 1
                    if extras and self._ready:
                        self._launch()
            for extra in extras:  # broadcast: the other replicas run for their side effects
                await binding.drain(extra)
        finally:
            binding.finished(act, extras)

    # ── outbound ──

    def _out_roots(self, act: Activation, tables: NodeTables, yidx: int) -> tuple:
        if not act.roots:
            return ((act.node, act.aid, yidx),) if tables.diamond_root else ()
        carried = tables.carried_roots
        roots = tuple(e for e in act.roots if e[0] in carried and e[0] != act.node)
        if tables.diamond_root:
            roots += ((act.node, act.aid, yidx),)  # one entry per root: the newest frame (loops)
        return roots

    def _out_seq(self, act: Activation, tables: NodeTables, yidx: int) -> int:
        if tables.session:
            seq = self.session_counters[act.node]
            self.session_counters[act.node] = seq + 1
            return seq
        return yidx if tables.stream else act.seq

    def _key(self, act: Activation, target: Target, roots: tuple, yidx: int) -> tuple:
        if target.aid_rule == "C":
            for node, aid, index in roots:
                if node == target.root:
                    return (node, aid, index)
        return (act.node, act.aid, yidx)

    def _dispatch_frame(self, act: Activation, frame: dict, yidx: int, streams: dict | None) -> None:
        tables = self.tables[act.node]
        roots = self._out_roots(act, tables, yidx) if tables.diamond_root or (act.roots and tables.carried_roots) else ()
        if tables.session:  # _out_seq, inline: this runs once per frame
            seq = self.session_counters[act.node]
            self.session_counters[act.node] = seq + 1
        else:
            seq = yidx if tables.stream else act.seq
        own_key = (act.node, act.aid, yidx)  # Rule A: the producing activation and frame
        for name, targets in self.dispatch[act.node]:
            if name in frame:
                value = frame[name]
                for target, kind in targets:
                    if kind is TO_CALLER:
                        self._caller_arrived(name, value, seq)
                        continue
                    if kind is DIRECT:
                        self._schedule(Activation(target.node, target.group, next(self.aids), {name: value}, roots, seq))
                        continue
                    key = own_key if target.aid_rule != "C" else self._key(act, target, roots, yidx)
                    self.deliver(target, Signal(Kind.ARRIVED, name, key, target.slot, value, roots, seq))
                    if kind is STREAM_SLOT and streams is not None:
                        streams[(name, target.node, target.group, target.slot, key)] = True
                continue
            for target, kind in targets:
                if kind is JOIN:
                    continue
                key = own_key if target.aid_rule != "C" else self._key(act, target, roots, yidx)
                if kind is STREAM_SLOT:
                    if streams is not None:
                        streams.setdefault((name, target.node, target.group, target.slot, key), False)
                else:
                    signal = Signal(Kind.UNREACHABLE, name, key, target.slot, None, roots, seq, Reason.EMPTY, own_key)
                    self.deliver(target, signal)

    def _dispatch_phantom(self, act: Activation, reason: Reason, origin: tuple) -> None:
        """An activation (or bucket) that produced nothing: every edge learns it is unreachable."""
        tables = self.tables[act.node]
        roots = self._out_roots(act, tables, 0)
        seq = self._out_seq(act, tables, 0)
        for name, targets in tables.control.items():
            for target in targets:
                if target.aid_rule == "join":
                    continue
                signal = Signal(
                    Kind.UNREACHABLE, name, self._key(act, target, roots, 0), target.slot, None, roots, seq, reason, origin
                )
                self.deliver(target, signal)

    def _end_streams(self, act: Activation, tables: NodeTables, streams: dict, reason: Reason | None) -> None:
        if tables.kind != "interface":
            return
        for (name, node, group, slot, key), delivered in streams.items():
            target = Target(node, group, slot, "C", None)
            if delivered and reason is None:
                self.deliver(target, Signal(Kind.SLOT_EOS, name, key, slot))
            else:
                self.deliver(
                    target, Signal(Kind.UNREACHABLE, name, key, slot, None, (), 0, reason or Reason.EMPTY, (act.node, act.aid))
                )

    # ── the caller ──

    def _emit(self, event: dict | None) -> None:
        self.outbox.append(event)
        if self._outbox_waiter is not None:
            self._wake_caller()

    def _wake_caller(self) -> None:
        waiter, self._outbox_waiter = self._outbox_waiter, None
        if not waiter.done():
            waiter.set_result(None)

    async def wait_for_events(self) -> None:
        """Return once the outbox holds an event (the caller's side of `_emit`)."""
        if not self.outbox:
            self._outbox_waiter = asyncio.get_running_loop().create_future()
            await self._outbox_waiter

    def _caller_arrived(self, name: str, value: Any, seq: int) -> None:
        caller = self.caller
        ordered = caller.ordered.get(name)
        if ordered is not None:
            if not ordered:
                self._emit({"event": "stream", "field": name, "value": value})
            elif seq == caller.expected.get(name, 0) and name not in caller.buffer:
                caller.expected[name] = seq + 1  # the next frame in order: nothing to buffer
                self.outbox.append({"event": "stream", "field": name, "value": value})
                if self._outbox_waiter is not None:
                    self._wake_caller()
            else:
                caller.buffer[name][seq] = (True, value)
                self._flush_stream(name, final=False)
        if name in self.return_fields and name not in caller.returned:
            caller.returned.add(name)
            self._emit({"event": "return", "field": name, "value": value})

    def _to_caller(self, signal: Signal) -> None:
        name = signal.field
        if signal.kind is Kind.ARRIVED:
            self._caller_arrived(name, signal.value, signal.seq)
            return
        if signal.kind is Kind.UNREACHABLE and signal.reason in (Reason.ERROR, Reason.CANCEL):
            self.caller.errored.add(name)
        if self.caller.ordered.get(name):
            self.caller.buffer[name][signal.seq] = (False, None)
            self._flush_stream(name, final=False)

    def _flush_stream(self, name: str, final: bool) -> None:
        buffer = self.caller.buffer[name]
        expected = self.caller.expected.get(name, 0)
        while buffer:
            if expected not in buffer:
                if not final:
                    break
                expected = min(buffer)
            arrived, value = buffer.pop(expected)
            if arrived:
                self._emit({"event": "stream", "field": name, "value": value})
            expected += 1
        self.caller.expected[name] = expected
        if not buffer:
            del self.caller.buffer[name]

    def statistics(self) -> dict[str, int]:
        return {
            "buckets": len(self.buckets),
            "resolved_keys": len(self.resolved),
            "joins": len(self.joins),
            "sequencers": len(self.sequencers),
            "tasks": len(self.tasks),
            "unlaunched": len(self._ready),
            "in_flight": self.in_flight,
            "running": self.running,
            "unreachable_dedup": len(self.seen_unreachable),
            "stream_buffers": len(self.caller.buffer),
            "undelivered_events": len(self.outbox),
        }


def _single_direct(group) -> bool:
    return group.routing == "direct" and len(group.slots) == 1


def _frame(frame: object, node: str) -> dict:
    if not isinstance(frame, dict):
        raise TypeError(f"{node} must yield or return a dict of output fields, not {type(frame).__name__}")
    return frame
