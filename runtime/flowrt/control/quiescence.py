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
        if call.ended:  # (its end, just now, told every process: the caller's open inputs ended with it)
            return
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
        """Decide what the in-process core decides at quiescence, once all the credit is back.
        While the caller still feeds streaming entries, their activations are all that runs:
        what they will send has keys past what they sent, so held work below that may go
        (RELEASE), but no join they feed resolves and the call does not end."""
        router = self.router
        feeding = len(call.entries) if call.entries else 0
        if router.depth or call.running != feeding or call.phantoms or call.ended or router.holding.held != ONE:
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
        if not released and not feeding:
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
        # (a cancelled call may end before its abort went out: every process may hold some of it)
        targets = shards.placement.processes if self.aborted or call.cancelled else self.summaries.keys()
        for process in sorted(set(targets) - {router.me}):
            router.send(process, CLOSE, (), work=False)


def floors(program: GraphProgram) -> tuple[tuple, ...]:
    """For each order consumer, a key no frame reaching it can be below, known from the graph
    alone: keys are tuples of counts (from 0) compared in order, so where every frame that can
    reach the consumer has a key of at least L parts, none is below (0,) * L. What a node sends
    is keyed: the empty key from the entry and from a join; (j,) from a streaming entry; (n,)
    from a session node; its activation's key and (i,) from a node that streams; its
    activation's key otherwise. A shard lets through what is at or below the floor without
    the gateway's word, so the first segment of a stream (and the first frames a stream makes
    of it) need not wait for the call to be quiet."""
    nodes = program.nodes
    feeds: list[set[int]] = [set() for _ in program.streams]  # stream -> the nodes producing it
    preds: list[set[int]] = [set() for _ in nodes]
    for node in nodes:
        for route in node.routes:
            for edge in route.edges:
                if edge.node is not None:
                    preds[edge.node.index].add(node.index)
                elif edge.stream >= 0:
                    feeds[edge.stream].add(node.index)
    entries = {node.index for node in program.entry_nodes.values()}
    unknown = len(nodes) + 1  # (more parts than any key has: not reached yet)
    parts = [unknown] * len(nodes)  # node -> the fewest parts a key of what it sends can have
    changed = True
    while changed:  # (only ever lowered, at most to 0: ends, loops included)
        changed = False
        for node in nodes:
            index = node.index
            if not node.interface:
                least = 1 if index in entries else 0
            elif node.join is not None:
                least = 0
            elif node.session:
                least = 1
            else:
                fed = min((parts[p] for p in preds[index]), default=unknown)
                least = min(unknown, fed + 1) if node.stream else fed
            if least < parts[index]:
                parts[index] = least
                changed = True
    result = []
    for consumer in program.consumers:
        fed_by = feeds[consumer.target] if consumer.kind == ORDERED_STREAM else preds[consumer.target]
        least = min((parts[p] for p in fed_by), default=0)
        result.append(() if consumer.join_resets or least >= unknown else (0,) * least)
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
