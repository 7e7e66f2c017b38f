"""The IR of one graph: interface nodes, field-level edges, liveness, and dominators.

Node ids: `@GRAPH` is the call's start, `$NAME` a placeholder, `role.interface` an interface.
A streaming placeholder (`placeholder stream NAME: T`) is a node that streams, exactly as an
interface with `out stream`: its frames activate its consumers one by one.
An edge carries one field from a producer into one OR group (`group`) of a consumer; a join is
a single group 0. A node is *live* in a graph when it can ever fire there: an OR group is live
when every field of it has a live producer (a join when every counted field does); liveness is a
fixpoint from the graph's entry placeholders, so loops that start from a live branch are live.
A live node *contributes* when a frame it sends can reach a node that produces one of the
graph's streamed or returned fields (over edges into groups that can fire); a call runs only the
contributing nodes, so calling one graph never runs the roles of another that its entry also
reaches. `contributing_ir()` is that restriction, the IR the plan is built from; the checks read
the full live IR. The start node dominates everything live; `dominates(m, n)` answers "does every
path to n pass m".
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, field

import networkx as nx

from flowc.check.model import GraphInfo, InterfaceInfo, Program
from flowc.spans import Span


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    field: str
    group: int
    span: Span  # the consumer's reference to the field


@dataclass
class Node:
    id: str
    kind: str  # "start" | "placeholder" | "interface"
    groups: list[list[str]] = field(default_factory=list)  # fields of each AND group (a join: one group)
    join: dict[str, int | None] | None = None  # field -> threshold (None = all)
    outputs: list[str] = field(default_factory=list)
    stream: bool = False
    session: bool = False
    info: InterfaceInfo | None = None
    span: Span | None = None

    @property
    def role(self) -> str | None:
        return self.info.role if self.info else None


@dataclass
class GraphIR:
    name: str
    info: GraphInfo
    start: str
    nodes: dict[str, Node]
    edges: list[Edge]
    live: set[str]
    digraph: nx.DiGraph  # live nodes, one arc per producer->consumer pair
    inbound: dict[str, list[Edge]]  # live edges by target
    outbound: dict[str, list[Edge]]  # live edges by source
    contributing: set[str] = field(default_factory=set)  # live nodes on a path to an output (and the start)
    reached: set[str] = field(default_factory=set)  # every live node, also in the contributing view

    def contributing_ir(self) -> GraphIR:
        """This graph restricted to its contributing nodes and the edges that carry frames
        between them. Every producer feeding a contributing node contributes too, so buckets,
        joins' `all` upstream sets and dominators are those of the full IR, except that an edge
        into an OR group that can never fire (which carries nothing) no longer counts as a path."""
        keep = self.contributing
        carrying = [e for e in _carrying_edges(self.nodes, self.edges, self.live) if e.source in keep and e.target in keep]
        return _assemble(self.name, self.info, self.start, self.nodes, self.edges, keep, carrying, self.live)

    @functools.cached_property
    def _all_inbound(self) -> dict[str, list[Edge]]:
        by_target: dict[str, list[Edge]] = defaultdict(list)
        for e in self.edges:
            by_target[e.target].append(e)
        return dict(by_target)

    def inbound_all(self, node: str) -> list[Edge]:
        """Every edge into `node`, from live producers or not."""
        return self._all_inbound.get(node, [])

    def group_edges(self, node: str, group: int) -> list[Edge]:
        return [e for e in self.inbound.get(node, []) if e.group == group]

    @functools.cached_property
    def idom(self) -> dict[str, str]:
        return nx.immediate_dominators(self.digraph, self.start)

    @functools.cached_property
    def dom_tree(self) -> nx.DiGraph:
        """The dominator tree: an arc from each node's immediate dominator to it."""
        tree = nx.DiGraph((parent, child) for child, parent in self.idom.items() if child != parent)
        tree.add_node(self.start)
        return tree

    @functools.cached_property
    def dom_depth(self) -> dict[str, int]:
        depth = {self.start: 0}
        for parent, child in nx.bfs_edges(self.dom_tree, self.start):
            depth[child] = depth[parent] + 1
        return depth

    @functools.cached_property
    def dom_interval(self) -> dict[str, tuple[int, int]]:
        """Pre/post numbers in the dominator tree: a dominates b iff a's interval holds b's."""
        interval: dict[str, list[int]] = {}
        clock = 0
        for _parent, child, kind in nx.dfs_labeled_edges(self.dom_tree, self.start):
            if kind == "forward":
                interval[child] = [clock, 0]
                clock += 1
            elif kind == "reverse":
                interval[child][1] = clock
                clock += 1
        return {n: (a, b) for n, (a, b) in interval.items()}

    def dominates(self, a: str, b: str) -> bool:
        """Whether every path from the start to `b` passes through `a` (a node dominates itself)."""
        ia, ib = self.dom_interval[a], self.dom_interval[b]
        return ia[0] <= ib[0] and ib[1] <= ia[1]

    def common_dominator(self, nodes: list[str]) -> str:
        """The nearest node that every path from the start to each of `nodes` passes through."""
        idom, depth = self.idom, self.dom_depth
        current = nodes[0]
        for other in nodes[1:]:
            a, b = current, other
            while a != b:
                if depth[a] >= depth[b]:
                    a = idom[a]
                else:
                    b = idom[b]
            current = a
        return current


def cycles(digraph: nx.DiGraph) -> list[tuple[str, ...]]:
    """Strongly connected components that contain a loop, each sorted, in sorted order."""
    found = []
    for component in nx.strongly_connected_components(digraph):
        if len(component) > 1 or any(digraph.has_edge(n, n) for n in component):
            found.append(tuple(sorted(component)))
    return sorted(found)


def interface_id(info: InterfaceInfo) -> str:
    return info.qualname


def build_graph_ir(program: Program, graph: GraphInfo) -> GraphIR:
    nodes: dict[str, Node] = {}
    start = f"@{graph.name}"
    nodes[start] = Node(start, "start", outputs=[e.text for e in graph.entries], span=graph.decl.name.span)
    for name, decl in program.placeholders.items():
        # a streaming placeholder is a stream producer of its field: each frame activates its consumers
        nodes[f"${name}"] = Node(
            f"${name}", "placeholder", groups=[[name]], outputs=[name], stream=decl.stream, span=decl.name.span
        )
    for info in program.interfaces():
        nodes[interface_id(info)] = _interface_node(program, info)
    edges = _edges(program, graph, nodes, start)
    live = _liveness(nodes, edges, start)
    live_edges = [e for e in edges if e.source in live and e.target in live]
    ir = _assemble(graph.name, graph, start, nodes, edges, live, live_edges, live)
    outputs = {c.field.name.text for c in graph.streams} | {r.name.text for r in graph.returns}
    ir.contributing = _contributing(nodes, _carrying_edges(nodes, edges, live), live, start, outputs)
    return ir


def _assemble(name, info, start, nodes, edges, members: set[str], member_edges: list[Edge], reached: set[str]) -> GraphIR:
    inbound: dict[str, list[Edge]] = defaultdict(list)
    outbound: dict[str, list[Edge]] = defaultdict(list)
    digraph = nx.DiGraph()
    digraph.add_nodes_from(sorted(members))
    for e in member_edges:
        inbound[e.target].append(e)
        outbound[e.source].append(e)
        digraph.add_edge(e.source, e.target)
    ir = GraphIR(name, info, start, nodes, edges, members, digraph, dict(inbound), dict(outbound))
    ir.contributing, ir.reached = set(members), reached
    return ir


def _interface_node(program: Program, info: InterfaceInfo) -> Node:
    role = program.roles[info.role]
    join = info.join
    if join is not None:
        groups = [[item.field.text for item in join.items]]
        thresholds = {item.field.text: item.count for item in join.items}
    else:
        groups = [[ref.field.text for ref in g.inputs] for g in info.groups]
        thresholds = None
    return Node(
        id=info.qualname,
        kind="interface",
        groups=groups,
        join=thresholds,
        outputs=[o.name.text for o in info.outputs],
        stream=info.stream,
        session=role.config.get("lb") == "session",
        info=info,
        span=info.decl.name.span,
    )


def _edges(program: Program, graph: GraphInfo, nodes: dict[str, Node], start: str) -> list[Edge]:
    edges = [Edge(start, f"${e.text}", e.text, 0, e.span) for e in graph.entries if f"${e.text}" in nodes]
    for info in program.interfaces():
        target = info.qualname
        refs = (
            [(0, item.field, item.source) for item in info.join.items]
            if info.join
            else [(g, ref.field, ref.source) for g, group in enumerate(info.groups) for ref in group.inputs]
        )
        for group, ref, source in refs:
            name = ref.text
            if source is None and name in program.placeholders:
                edges.append(Edge(f"${name}", target, name, group, ref.span))
            for producer in program.field(name).producers:
                if source is None or (producer.role, producer.interface) == (source.role.text, source.interface.text):
                    edges.append(Edge(f"{producer.role}.{producer.interface}", target, name, group, ref.span))
    return edges


def _liveness(nodes: dict[str, Node], edges: list[Edge], start: str) -> set[str]:
    """Nodes that can fire in the graph: a worklist fixpoint, linear in the edges."""
    inbound: dict[str, list[Edge]] = defaultdict(list)
    consumers: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        inbound[e.target].append(e)
        consumers[e.source].add(e.target)
    live = {start}
    work = [start]
    while work:
        node = work.pop()
        for target in sorted(consumers.get(node, ())):
            if target not in live and can_fire(nodes[target], inbound[target], live):
                live.add(target)
                work.append(target)
    return live


def _carrying_edges(nodes: dict[str, Node], edges: list[Edge], live: set[str]) -> list[Edge]:
    """The live edges a frame can travel: an edge into an OR group that can never fire here
    (a field of it has no live producer) carries nothing, so it makes no path."""
    inbound: dict[str, list[Edge]] = defaultdict(list)
    for e in edges:
        inbound[e.target].append(e)
    firing: dict[tuple[str, int], bool] = {}
    carrying = []
    for e in edges:
        if e.source not in live or e.target not in live:
            continue
        node = nodes[e.target]
        if node.kind == "interface" and node.join is None:
            key = (e.target, e.group)
            if key not in firing:
                firing[key] = set(node.groups[e.group]) <= live_fields(node, inbound[e.target], live, e.group)
            if not firing[key]:
                continue
        carrying.append(e)
    return carrying


def _contributing(nodes: dict[str, Node], carrying: list[Edge], live: set[str], start: str, outputs: set[str]) -> set[str]:
    """The start and every live node with a path to a producer of one of `outputs`."""
    producers: dict[str, set[str]] = defaultdict(set)
    for e in carrying:
        producers[e.target].add(e.source)
    found = {start}
    work = sorted(n for n in live if nodes[n].kind == "interface" and outputs.intersection(nodes[n].outputs))
    found.update(work)
    while work:
        for source in producers.get(work.pop(), ()):
            if source not in found:
                found.add(source)
                work.append(source)
    return found


def live_fields(node: Node, inbound: list[Edge], live: set[str], group: int) -> set[str]:
    return {e.field for e in inbound if e.group == group and e.source in live}


def can_fire(node: Node, inbound: list[Edge], live: set[str]) -> bool:
    if node.kind == "placeholder":
        return any(e.source in live for e in inbound)
    if node.join is not None:
        present = live_fields(node, inbound, live, 0)
        counted = {f for f, n in node.join.items() if n is not None}
        return bool(present) and counted <= present
    return any(set(fields) <= live_fields(node, inbound, live, g) for g, fields in enumerate(node.groups))
