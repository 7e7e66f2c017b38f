"""A graph's tables as the objects a call walks: built once when the runtime opens, never
changed by a call.

Every node of the static plan becomes a `NodeProgram` with an index (calls keep their
per-node counters in lists), its input groups as `GroupProgram`s and its out fields as
`Route`s: for each field, the control edges a present frame travels (`edges`) and those an
absent one must resolve (`absent`). Each `Edge` is classified once by what happens at its end
(to the caller, a one-slot direct group, a bucket, a stream slot, a join), so dispatching a
frame is a walk over prebuilt objects, not a reading of the plan. Which joins a node's end can
complete (`join_watchers`) is also computed here, so a finished activation rechecks only those.

Each node also has an `Outlet` per consumer its edges reach (another node, or the caller): the
call's dispatch counts there, in plain integers, the frames the node sent to that consumer. An
interface node counts its activations too (started, ended, failed, cancelled, and the frames
they produced), and, where an observer installed a histogram on it (`duration_bounds`,
`duration_counts`), times the activations of observed calls into it. flowrt.observe reads these
counts when metrics are scraped.

Order (docs/runtime.md, rule 7) is prepared here too. Every place that must see frames in the
order of their keys is an `OrderConsumer`: a stream the graph marks `ordered`, and the input of
an `lb session` node outside loops. A consumer may let a frame (or an activation) through once
no work still in flight can send it one with a smaller key; `OrderConsumer` lists the work that
can: the nodes whose activations and buckets reach it with their keys unchanged or extended
(`heap_nodes`), and the nodes that give the frames reaching it new keys: `lb session` nodes
(keys restart at their output counter) and joins (a join's activation has the empty key).

A streaming entry (`placeholder stream`, the plan's `entry_stream`) is not in the start node's
routes: its placeholder node (`entry_nodes`) runs as an activation that the caller feeds frame
by frame (flowrt.control.call, `open_entries`; flowrt.control.inputs).
"""

from __future__ import annotations

from typing import Any

from flowrt.tables import NodeTables

# what a frame does at the end of an edge
CALLER, DIRECT, BUCKET, STREAM_SLOT, JOIN = 0, 1, 2, 3, 4
# what an order consumer orders: the frames of a caller's stream, or a session node's activations
ORDERED_STREAM, ORDERED_SESSION = 0, 1


class GroupProgram:
    """One OR group of a node: its slots, and which slot indices carry each field."""

    __slots__ = ("index", "size", "fields", "stream_slots", "slots_by_field", "single")

    def __init__(self, index: int, routing: str, fields: tuple[str, ...], stream_slots: tuple[bool, ...]):
        self.index = index
        self.size = len(fields)
        self.fields = fields  # the field of each slot
        self.stream_slots = stream_slots
        by_field: dict[str, list[int]] = {}
        for i, name in enumerate(fields):
            by_field.setdefault(name, []).append(i)
        self.slots_by_field = tuple(tuple(v) for v in by_field.values())
        # one slot filled by one frame: the frame fires it at once, no bucket needed
        self.single = routing == "direct" and self.size == 1


class Outlet:
    """The frames a node sent on to one consumer (a node, or the caller): a frame counts once
    however many of its fields reach the consumer. Counted by every call's dispatch."""

    __slots__ = ("consumer", "frames")

    def __init__(self, consumer: str):
        self.consumer = consumer  # the consumer's node id, or "caller"
        self.frames = 0


class Edge:
    """One control edge: where a field goes and what happens there."""

    __slots__ = ("kind", "field", "node", "group", "slot", "rule_c", "root", "stream", "ordered", "returned", "outlet", "index")

    def __init__(self, kind: int, field: str, node: NodeProgram | None, group: GroupProgram | None, slot: int):
        self.kind = kind
        self.field = field
        self.node = node  # None for the caller
        self.group = group
        self.slot = slot
        self.rule_c = False  # keyed by the diamond root's entry (else by the sending frame)
        self.root = -1  # index of that root
        self.stream = -1  # for the caller: index of the streamed output, if the field is one
        self.ordered = False  # for the caller: the stream reaches it in SeqId order
        self.returned = False  # for the caller: the field is also returned
        self.outlet: Outlet | None = None  # what counts the frames sent on it (set with the node's routes)
        self.index = -1  # its place in GraphProgram.edges: how another process names it (flowrt.control.shards)

    def key(self, node: NodeProgram, aid: int, roots: tuple, yidx: int) -> tuple:
        """The key of the bucket a frame (frame `yidx` of activation `aid` of `node`, carrying
        `roots`) opens or fills at this edge's end. Rule C: the entry of the diamond root the
        frame carries; Rule A: the sending frame."""
        if self.rule_c:
            root = self.root
            for entry in roots:
                if entry[0] == root:
                    return entry
        return (node.index, aid, yidx)


class Route:
    """One out field of a node and its edges."""

    __slots__ = ("field", "edges", "absent")

    def __init__(self, field: str, edges: tuple[Edge, ...]):
        self.field = field
        self.edges = edges
        # a join ignores absent frames; every other edge is resolved by one
        self.absent = tuple(e for e in edges if e.kind != JOIN)


class JoinField:
    __slots__ = ("field", "threshold", "upstream")

    def __init__(self, field: str, threshold: int | None, upstream: tuple[int, ...]):
        self.field = field
        self.threshold = threshold  # None: every frame, once the upstream set has ended
        self.upstream = upstream  # node indices


class OrderConsumer:
    """A place that takes frames in key order, and the work in flight that can still reach it."""

    __slots__ = ("index", "kind", "target", "heap_nodes", "session_resets", "join_resets")

    def __init__(self, index: int, kind: int, target: int):
        self.index = index
        self.kind = kind
        self.target = target  # the stream's index, or the session node's
        # nodes whose activations and open buckets reach it with their keys kept or extended
        self.heap_nodes: frozenset[int] = frozenset()
        # session nodes (indices into GraphProgram.resets) whose output counter keys what reaches it
        self.session_resets: tuple[int, ...] = ()
        # joins whose activation (the empty key) can reach it; they hold it back until they resolve
        self.join_resets: tuple[int, ...] = ()


class NodeProgram:
    """One node of one graph: tables, routes, and (for interfaces) how to invoke its role."""

    __slots__ = (
        "index",
        "id",
        "interface",
        "role",
        "method",
        "groups",
        "routes",
        "session",
        "ordered",
        "stream",
        "diamond_root",
        "carried",
        "in_cycle",
        "join",
        "join_watchers",
        "feeds_stream_slots",
        "out_fields",
        "order_feeds",
        "bucket_feeds",
        "reset_counters",
        "ancestors",
        "consumer",
        "generator",
        "binding",
        "methods",
        "timeout",
        "outlets",
        "shared_outlets",
        "acts_started",
        "acts_ended",
        "acts_failed",
        "acts_cancelled",
        "frames_out",
        "duration_bounds",
        "duration_counts",
        "duration_sum",
    )

    def __init__(self, index: int, tables: NodeTables):
        self.index = index
        self.id = tables.id
        self.interface = tables.kind == "interface"
        self.role = tables.role
        self.method = tables.id.split(".", 1)[1] if self.interface else ""
        self.groups: tuple[GroupProgram, ...] = ()
        self.routes: tuple[Route, ...] = ()
        self.session = tables.session
        self.ordered = False  # a session node releasing activations in SeqId order (else FIFO)
        self.stream = tables.stream
        self.diamond_root = tables.diamond_root
        self.carried: frozenset[int] = frozenset()  # roots whose entries outgoing frames carry
        self.in_cycle = tables.in_cycle
        self.join: tuple[JoinField, ...] | None = None
        self.join_watchers: tuple[NodeProgram, ...] = ()  # joins whose `all` fields this node feeds
        self.feeds_stream_slots = False  # some out edge ends at a stream slot (closed when an activation ends)
        self.out_fields: frozenset[str] = frozenset()  # the interface's declared out fields
        self.order_feeds: tuple[OrderConsumer, ...] = ()  # consumers whose heap_nodes hold this node
        # the consumers its open buckets bound: order_feeds, and its own input's if it is an
        # ordered session node (what fills its bucket may come before what it holds)
        self.bucket_feeds: tuple[OrderConsumer, ...] = ()
        self.reset_counters: tuple[int, ...] = ()  # session resets this node's work keeps alive
        self.ancestors: tuple[int, ...] = ()  # for joins: every node that can feed it
        self.consumer: OrderConsumer | None = None  # for an ordered session node: its input's consumer
        self.binding: Any = None  # the role's RoleBinding (set when the runtime binds its roles)
        self.methods: list[Any] = []  # the interface's bound method on each replica
        self.generator = False  # the method is an async generator (streams its frames)
        self.timeout: float | None = None
        self.outlets: tuple[Outlet, ...] = ()  # one per consumer its edges reach, in order
        self.shared_outlets = False  # some consumer is reached by two edges (a frame must count once)
        # its activations since the runtime opened (flowrt.observe.metrics): started, ended (of
        # which failed and cancelled), and the frames they produced
        self.acts_started = self.acts_ended = self.acts_failed = self.acts_cancelled = self.frames_out = 0
        # a histogram of its activations' durations, installed by an observer (flowrt.observe.metrics):
        # seconds land in the first bucket whose bound they do not exceed (the last is +Inf); None: not timed
        self.duration_bounds: tuple[float, ...] = ()
        self.duration_counts: list[int] | None = None
        self.duration_sum = 0.0

    def plain(self, frame: object) -> bool:
        """Whether a frame of this node's role is a plain dict of its declared out fields, which
        is dispatched as it is (a plain loop, which the compiled core runs in C: `all(...)` would
        build a generator per frame)."""
        if type(frame) is not dict:
            return False
        fields = self.out_fields
        for name in frame:  # noqa: SIM110 - (the docstring: no generator)
            if name not in fields:
                return False
        return True

    def out_roots(self, aid: int, roots: tuple, yidx: int) -> tuple:
        """The diamond-root entries frame `yidx` of activation `aid` of this node carries, when
        the frames that activated it carried `roots`."""
        if not roots:
            return ((self.index, aid, yidx),) if self.diamond_root else ()
        carried = self.carried
        index = self.index
        out = tuple(e for e in roots if e[0] in carried and e[0] != index)
        if self.diamond_root:
            out += ((index, aid, yidx),)  # one entry per root: the newest frame (loops)
        return out

    def __repr__(self) -> str:
        return f"<node {self.id}>"


class GraphProgram:
    __slots__ = (
        "name",
        "nodes",
        "edges",
        "by_id",
        "start",
        "entry",
        "entry_set",
        "entry_stream",
        "entry_nodes",
        "streams",
        "returns",
        "timeout",
        "joins",
        "consumers",
        "stream_consumers",
        "resets",
        "_stream_index",
        "calls_started",
        "calls_ended",
        "call_bounds",
        "call_counts",
        "call_sum",
        "first_counts",
        "first_sum",
    )

    def __init__(self, name: str, plan: dict, tables: dict[str, NodeTables]):
        self.name = name
        ids = sorted(tables)
        self.nodes = tuple(NodeProgram(i, tables[node_id]) for i, node_id in enumerate(ids))
        self.by_id = {node.id: node for node in self.nodes}
        self.start = self.by_id[plan["start"]]
        self.entry = tuple(plan["entry"])
        self.entry_set = frozenset(self.entry)
        self.entry_stream: tuple[str, ...] = tuple(plan.get("entry_stream", ()))  # entries whose frames the caller sends
        self.entry_nodes = _entry_nodes(self.entry_stream, tables[self.start.id], self.by_id)
        outputs = plan["outputs"]
        self.streams = tuple((o["field"], o["ordered"]) for o in outputs if o["kind"] == "stream")
        self.returns = tuple(o["field"] for o in outputs if o["kind"] == "return")
        self._stream_index = {name: i for i, (name, _) in enumerate(self.streams)}
        self.timeout: float | None = plan.get("timeout_s")
        # its calls since the runtime opened (flowrt.observe.metrics): started, and ended by status
        self.calls_started = 0
        self.calls_ended: dict[str, int] = {}
        # histograms of its calls' durations and times to their first output, installed by an
        # observer as on a node (`call_bounds` for both); None: not timed
        self.call_bounds: tuple[float, ...] = ()
        self.call_counts: list[int] | None = None
        self.call_sum = 0.0
        self.first_counts: list[int] | None = None
        self.first_sum = 0.0
        for node in self.nodes:
            t = tables[node.id]
            node.groups = tuple(
                GroupProgram(g.index, g.routing, tuple(s.field for s in g.slots), tuple(s.stream for s in g.slots))
                for g in t.groups
            )
            node.carried = frozenset(self.by_id[r].index for r in t.carried_roots if r in self.by_id)
            if t.join is not None:
                node.join = tuple(
                    JoinField(j.field, j.threshold, tuple(self.by_id[u].index for u in j.upstream if u in self.by_id))
                    for j in t.join
                )
        for node in self.nodes:
            node.routes = tuple(
                Route(name, self._edges(name, targets, tables))
                for name, targets in tables[node.id].control.items()
                if node is not self.start or name not in self.entry_nodes  # (fed by the caller: `entry_nodes`)
            )
            node.feeds_stream_slots = any(e.kind == STREAM_SLOT for route in node.routes for e in route.edges)
            _outlets(node)
            node.out_fields = frozenset(route.field for route in node.routes)
        self.edges = tuple(edge for node in self.nodes for route in node.routes for edge in route.edges)
        for index, edge in enumerate(self.edges):
            edge.index = index  # (the same in every process: nodes are sorted by id, routes and edges in table order)
        self.joins = tuple(node for node in self.nodes if node.join is not None)
        watchers: dict[int, list[NodeProgram]] = {}
        for join in self.joins:
            upstream = {u for j in join.join or () if j.threshold is None for u in j.upstream}
            for u in sorted(upstream):
                watchers.setdefault(u, []).append(join)
        for node in self.nodes:
            node.join_watchers = tuple(watchers.get(node.index, ()))
            node.ordered = node.session and not node.in_cycle  # in a loop, a session node goes FIFO
        self._order_tables()

    def _edges(self, name: str, targets, tables: dict[str, NodeTables]) -> tuple[Edge, ...]:
        edges = []
        for target in targets:
            if target.node == "caller":
                edge = Edge(CALLER, name, None, None, 0)
                edge.stream = self._stream_index.get(name, -1)
                edge.ordered = edge.stream >= 0 and self.streams[edge.stream][1]
                edge.returned = name in self.returns
            else:
                node = self.by_id[target.node]
                group = node.groups[target.group]
                if target.aid_rule == "join":
                    kind = JOIN
                elif group.stream_slots[target.slot]:
                    kind = STREAM_SLOT
                elif group.single:
                    kind = DIRECT
                else:
                    kind = BUCKET
                edge = Edge(kind, name, node, group, target.slot)
                if target.aid_rule == "C" and target.root in self.by_id:
                    edge.rule_c = True
                    edge.root = self.by_id[target.root].index
            edges.append(edge)
        return tuple(edges)

    def _order_tables(self) -> None:
        """The order consumers, and what each node's work in flight means to them (module docstring)."""
        nodes = self.nodes
        preds: list[set[int]] = [set() for _ in nodes]
        producers: list[set[int]] = [set() for _ in self.streams]
        for node in nodes:
            for route in node.routes:
                for edge in route.edges:
                    if edge.node is not None:
                        preds[edge.node.index].add(node.index)
                    elif edge.stream >= 0:
                        producers[edge.stream].add(node.index)
        consumers: list[OrderConsumer] = []
        stream_consumers: list[OrderConsumer | None] = [None] * len(self.streams)
        for stream, (_, ordered) in enumerate(self.streams):
            if ordered:
                consumer = stream_consumers[stream] = OrderConsumer(len(consumers), ORDERED_STREAM, stream)
                consumers.append(consumer)
        for node in nodes:
            if node.ordered:
                consumer = node.consumer = OrderConsumer(len(consumers), ORDERED_SESSION, node.index)
                consumers.append(consumer)
        resets: list[int] = []  # session nodes some consumer's keys restart at
        for consumer in consumers:
            starts = producers[consumer.target] if consumer.kind == ORDERED_STREAM else preds[consumer.target]
            heap, sessions, joins = set(), set(), set()
            seen: set[int] = set()
            stack = sorted(starts)
            while stack:
                index = stack.pop()
                if index in seen:
                    continue
                seen.add(index)
                node = nodes[index]
                if node.session:
                    sessions.add(index)
                    continue  # what reaches it from upstream leaves with the session node's own keys
                heap.add(index)
                if node.join is not None:
                    joins.add(index)
                    continue  # a join's activation starts from the empty key, whatever fed it
                stack.extend(preds[index])
            consumer.heap_nodes = frozenset(heap)
            for index in sorted(sessions):
                if index not in resets:
                    resets.append(index)
            consumer.session_resets = tuple(resets.index(i) for i in sorted(sessions))
            consumer.join_resets = tuple(sorted(joins))
        for node in nodes:
            node.order_feeds = tuple(c for c in consumers if node.index in c.heap_nodes)
            node.bucket_feeds = node.order_feeds + ((node.consumer,) if node.consumer is not None else ())
        counters: list[list[int]] = [[] for _ in nodes]
        for reset, index in enumerate(resets):
            for member in _ancestors(index, preds) | {index}:
                counters[member].append(reset)
        for node in nodes:
            node.reset_counters = tuple(counters[node.index])
            if node.join is not None:
                node.ancestors = tuple(sorted(_ancestors(node.index, preds)))
        self.consumers = tuple(consumers)
        self.stream_consumers = tuple(stream_consumers)
        self.resets = tuple(resets)


def _entry_nodes(names: tuple[str, ...], start: NodeTables, by_id: dict[str, NodeProgram]) -> dict[str, NodeProgram]:
    """The placeholder node each streaming entry feeds (the start node's one target for it, a
    streaming placeholder); an entry nothing consumes has none. ValueError for any other shape."""
    nodes: dict[str, NodeProgram] = {}
    for name in names:
        fed = [by_id[target.node] for target in start.control.get(name, ())]
        if len(fed) > 1 or any(node.interface or not node.stream for node in fed):
            raise ValueError(f"streaming entry `{name}` must feed one streaming placeholder node, not {fed}")
        if fed:
            nodes[name] = fed[0]
    return nodes


def _outlets(node: NodeProgram) -> None:
    """Give each of the node's edges the outlet of its consumer, one outlet per consumer."""
    outlets: dict[str, Outlet] = {}
    edges = 0
    for route in node.routes:
        for edge in route.edges:
            consumer = "caller" if edge.node is None else edge.node.id
            outlet = outlets.get(consumer)
            if outlet is None:
                outlet = outlets[consumer] = Outlet(consumer)
            edge.outlet = outlet
            edges += 1
    node.outlets = tuple(outlets.values())
    node.shared_outlets = edges > len(outlets)


def _ancestors(index: int, preds: list[set[int]]) -> set[int]:
    """Every node with a path to `index` (itself only if on a loop through it)."""
    found: set[int] = set()
    stack = list(preds[index])
    while stack:
        node = stack.pop()
        if node not in found:
            found.add(node)
            stack.extend(preds[node])
    return found
