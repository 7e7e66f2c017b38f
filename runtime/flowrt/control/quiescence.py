"""What the gateway decides when a call spread over processes is quiet (flowrt.control.shards):
every shard's `Summary`, sent with the credit it returns, and the `Coordinator` that, once all
the credit is back (nothing runs anywhere, nothing is in transit), does what the in-process core
does at quiescence: resolves the first join nothing can feed any more (RESOLVE, to its host),
ends the call if nothing is left in flight, or else tells each order consumer holding work the
smallest key that can still reach it (RELEASE).
"""

from __future__ import annotations

import logging
from typing import Any

from flowrt.control.call import Call
from flowrt.control.credit import ONE
from flowrt.control.envelopes import ABORT, CLOSE, RELEASE, RESOLVE
from flowrt.control.program import ORDERED_STREAM, GraphProgram, NodeProgram

log = logging.getLogger("flowrt")
ABORT_GRACE = 1.0  # seconds a cancelled call waits for its work elsewhere (as flowrt.deploy.remote.ACK_WAIT)
BLOCKED = "the call's control found nothing it may run, though work is held (a flowrt bug; the server's log has it)"


class Summary:
    """What a shard holds of a call when it returns its credit: all the gateway needs to decide at quiescence."""

    __slots__ = ("in_flight", "scheduled", "open_buckets", "joins_done", "alive", "counters", "heap", "held")

    def __init__(self, call: Call | None = None):
        self.in_flight = 0
        self.scheduled: dict[int, int] = {}  # node -> activations not ended (quiet: held for order)
        self.open_buckets: dict[int, int] = {}  # node -> open buckets
        self.joins_done: frozenset[int] = frozenset()  # joins resolved here
        self.alive: dict[int, int] = {}  # session reset -> work alive here that can reach it (may be negative)
        self.counters: dict[int, int] = {}  # session node -> its output counter (nonzero only on its host)
        self.heap: dict[int, tuple] = {}  # order consumer -> smallest bound of work here reaching it
        self.held: dict[int, tuple] = {}  # order consumer -> smallest key held here for it
        if call is None:
            return
        self.in_flight = call.in_flight
        self.scheduled = {i: n for i, n in enumerate(call.running_by_node) if n}
        self.open_buckets = {i: n for i, n in enumerate(call.open_buckets) if n}
        self.joins_done = frozenset(call.joins_done)
        self.alive = {i: n for i, n in enumerate(call.alive) if n}
        self.counters = {i: n for i, n in enumerate(call.session_counters) if n}
        for consumer in call.program.consumers:
            bound = call.heap_bound(consumer)
            if bound is not None:
                self.heap[consumer.index] = bound
            if consumer.kind == ORDERED_STREAM:
                held = call.stream_held[consumer.target]
            else:
                sequencer = call.sequencers.get(consumer.target)
                held = sequencer.held if sequencer is not None else ()
            if held:
                self.held[consumer.index] = held[0][0]


class Coordinator:
    """The gateway's side of one call spread over processes: the credit that came back, the
    latest summary of each shard, and the decisions taken when the whole call is quiet."""

    __slots__ = ("router", "summaries", "aborted", "grace")

    def __init__(self, router: Any):  # (flowrt.control.shards.ShardRouter)
        self.router = router
        self.summaries: dict[int, Summary] = {}
        self.aborted = False
        self.grace: Any = None  # after an abort: the timer that ends the call if its work does not

    def returned(self, call: Call, sender: int, summary: Summary, errors: list) -> None:
        self.summaries[sender] = summary
        call.errors.extend(errors)

    def abort(self, call: Call) -> None:
        """The call is cancelled: every process hears it; should its credit not all be back
        within ABORT_GRACE seconds (a role that ignores its cancellation), the call ends anyway."""
        router = self.router
        self.aborted = True
        for process in sorted(router.shards.placement.processes - {router.me}):
            router.send(process, ABORT, (), work=False)
        self.grace = call.loop.call_later(ABORT_GRACE, self._give_up, call)

    def _give_up(self, call: Call) -> None:
        self.grace = None
        if not call.ended:
            log.warning("call %s: cancelled, but its work elsewhere did not end within %gs; ending it", call.call_id, ABORT_GRACE)
            self.finish(call)

    def quiet(self, call: Call) -> None:
        router = self.router
        if router.depth or call.running or call.phantoms or call.ended or router.holding.held != ONE:
            return
        summaries = [*self.summaries.values(), Summary(call)]
        if call.cancelled:
            self.finish(call)
            return
        program = call.program
        done = frozenset().union(*(s.joins_done for s in summaries))
        for join in program.joins:  # in topological order, as the in-process core does
            if join.index not in done and not _fed(program, join, summaries, done):
                host = router._host(join, (join.index,))
                router.send(host, RESOLVE, (join.index, router.shards.globals_for(call, join, host)))
                return
        if sum(s.in_flight for s in summaries) == 0:
            self.finish(call)
            return
        released = False
        for consumer in program.consumers:
            held = min((s.held[consumer.index] for s in summaries if consumer.index in s.held), default=None)
            if held is None:
                continue
            bound = _bound(program, consumer, summaries, done)
            if bound is not None and held > bound:
                continue
            if consumer.kind == ORDERED_STREAM:
                router.send(router.me, RELEASE, (consumer.index, bound, None))
            else:
                node = program.nodes[consumer.target]
                host = router._host(node, None)
                router.send(host, RELEASE, (consumer.index, bound, router.shards.globals_for(call, node, host)))
            released = True
        if not released:
            log.error("call %s: %d activations held and none may run (a flowrt bug)", call.call_id, call.in_flight)
            call.fail(BLOCKED, "flowrt")
            self.finish(call)

    def finish(self, call: Call) -> None:
        router = self.router
        shards = router.shards
        if self.grace is not None:
            self.grace.cancel()
            self.grace = None
        call.finish_call()
        shards.calls.pop(router.call_id, None)
        targets = shards.placement.processes if self.aborted else self.summaries.keys()
        for process in sorted(set(targets) - {router.me}):
            router.send(process, CLOSE, (), work=False)


def floors(program: GraphProgram) -> tuple[tuple, ...]:
    """For each order consumer, a key no frame reaching it can be below, known from the graph
    alone: (0,) where nothing that feeds it directly can send the empty key (what it is fed
    comes out of a stream, keyed (i, ...), or a session node, keyed (n,), or from nodes that
    only ever get such keys), else the empty key. A shard lets through what is at or below it
    without the gateway's word, so the first segment of a stream need not wait for the call
    to be quiet."""
    nodes = program.nodes
    succs: list[set[int]] = [set() for _ in nodes]
    feeds: list[set[int]] = [set() for _ in program.streams]  # stream -> the nodes producing it
    preds: list[set[int]] = [set() for _ in nodes]
    for node in nodes:
        for route in node.routes:
            for edge in route.edges:
                if edge.node is not None:
                    succs[node.index].add(edge.node.index)
                    preds[edge.node.index].add(node.index)
                elif edge.stream >= 0:
                    feeds[edge.stream].add(node.index)

    def renumbers(index: int) -> bool:  # its frames' keys are (i, ...) or (n,) whatever its own
        node = nodes[index]
        return bool(node.interface and (node.stream or node.session))

    # nodes that can send the empty key: a role-less node (the entry), a join (its activation
    # has the empty key), and what they reach through nodes that keep keys
    empty: set[int] = set()
    stack = [n.index for n in nodes if not n.interface or n.join is not None]
    while stack:
        index = stack.pop()
        if index in empty or renumbers(index):
            continue
        empty.add(index)
        stack.extend(succs[index])
    result = []
    for consumer in program.consumers:
        fed_by = feeds[consumer.target] if consumer.kind == ORDERED_STREAM else preds[consumer.target]
        result.append(() if consumer.join_resets or fed_by & empty else (0,))
    return tuple(result)


def trivial(call: Call, summary: Summary) -> bool:
    """Whether a quiet shard holds nothing the call still needs (so it may be forgotten)."""
    return not (
        call.buckets
        or call.resolved
        or call.joins
        or call.joins_done
        or call.sequencers
        or call.seen_unreachable
        or summary.in_flight
        or summary.scheduled
        or summary.open_buckets
        or summary.alive
        or summary.counters
        or summary.heap
        or summary.held
    )


def _fed(program: GraphProgram, join: NodeProgram, summaries: list[Summary], done: frozenset) -> bool:
    """Whether work anywhere (a held activation, an open bucket, an unresolved join) can still feed `join`."""
    nodes = program.nodes
    for index in join.ancestors:
        if any(s.open_buckets.get(index) or s.scheduled.get(index) for s in summaries):
            return True
        if nodes[index].join is not None and index not in done:
            return True
    return False


def _bound(program: GraphProgram, consumer: Any, summaries: list[Summary], done: frozenset) -> tuple | None:
    """The smallest key that can still reach `consumer`, over every shard (as Delivery._lower_bound in one process)."""
    for join in consumer.join_resets:
        if join not in done:
            return ()
    bound = None
    for reset in consumer.session_resets:
        if sum(s.alive.get(reset, 0) for s in summaries) > 0:
            node = program.resets[reset]
            key = (max(s.counters.get(node, 0) for s in summaries),)
            if bound is None or key < bound:
                bound = key
    for s in summaries:
        key = s.heap.get(consumer.index)
        if key is not None and (bound is None or key < bound):
            bound = key
    return bound
